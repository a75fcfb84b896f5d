/*
 * gcomm_host_reduce.c - the host's reduction operators: dst[i] = a[i] op b[i] (dst may be a),
 * Avg's final division, and PreMulSum's pre-operation dst[i] = a[i] * scalar (rounded to the
 * type; dst may be a), as tables by datatype and operator for the host executor.
 */
#define _GNU_SOURCE
#include <string.h>

#include "gcomm_core.h"

/* Loads and stores through memcpy: the caller's buffers may sit at any byte address (a double
 * at +1 is legal C data in a char buffer), where a plain T access is undefined; the compiler
 * turns a fixed-size memcpy into one (vectorised, unaligned) load or store. */
#define LOAD(T, p, i)                                           \
  ({                                                            \
    T v_;                                                       \
    memcpy(&v_, (const char*)(p) + (i) * sizeof(T), sizeof(T)); \
    v_;                                                         \
  })
#define STORE(T, p, i, v)                                 \
  do {                                                    \
    T v_ = (v);                                           \
    memcpy((char*)(p) + (i) * sizeof(T), &v_, sizeof(T)); \
  } while (0)
#define DEFINE_REDUCE(NAME, T, EXPR)                                    \
  static void NAME(void* dst, const void* a, const void* b, size_t n) { \
    for (size_t i = 0; i < n; i++) {                                    \
      T A = LOAD(T, a, i), B = LOAD(T, b, i);                           \
      STORE(T, dst, i, (EXPR));                                         \
    }                                                                   \
  }
#define DEFINE_PREMUL(NAME, T, EXPR)                                                 \
  static void NAME##PreMul(void* dst, const void* a, size_t n, const void* scalar) { \
    T S;                                                                             \
    memcpy(&S, scalar, sizeof(T));                                                   \
    for (size_t i = 0; i < n; i++) {                                                 \
      T A = LOAD(T, a, i), B = S;                                                    \
      STORE(T, dst, i, (EXPR));                                                      \
    }                                                                                \
  }
#define DEFINE_INT(NAME, T, UT)                                                        \
  DEFINE_REDUCE(NAME##Sum, T, (T)((UT)A + (UT)B))                                      \
  DEFINE_REDUCE(NAME##Prod, T, (T)((UT)A * (UT)B))                                     \
  DEFINE_REDUCE(NAME##Max, T, A > B ? A : B)                                           \
  DEFINE_REDUCE(NAME##Min, T, A < B ? A : B)                                           \
  DEFINE_PREMUL(NAME, T, (T)((UT)A * (UT)B))                                           \
  static void NAME##Div(void* buf, size_t n, int nranks) {                             \
    for (size_t i = 0; i < n; i++) STORE(T, buf, i, (T)(LOAD(T, buf, i) / (T)nranks)); \
  }
#define DEFINE_FLOAT(NAME, T)                                                     \
  DEFINE_REDUCE(NAME##Sum, T, A + B)                                              \
  DEFINE_REDUCE(NAME##Prod, T, A* B)                                              \
  DEFINE_REDUCE(NAME##Max, T, A > B ? A : B)                                      \
  DEFINE_REDUCE(NAME##Min, T, A < B ? A : B)                                      \
  DEFINE_PREMUL(NAME, T, A* B)                                                    \
  static void NAME##Div(void* buf, size_t n, int nranks) {                        \
    for (size_t i = 0; i < n; i++) STORE(T, buf, i, LOAD(T, buf, i) / (T)nranks); \
  }
/* 16- and 8-bit floats (stored as T): widen to float, combine, round once. */
#define DEFINE_NARROW(NAME, T, TOF, FROMF)                                                        \
  DEFINE_REDUCE(NAME##Sum, T, FROMF(TOF(A) + TOF(B)))                                             \
  DEFINE_REDUCE(NAME##Prod, T, FROMF(TOF(A) * TOF(B)))                                            \
  DEFINE_REDUCE(NAME##Max, T, TOF(A) > TOF(B) ? A : B)                                            \
  DEFINE_REDUCE(NAME##Min, T, TOF(A) < TOF(B) ? A : B)                                            \
  DEFINE_PREMUL(NAME, T, FROMF(TOF(A) * TOF(B)))                                                  \
  static void NAME##Div(void* buf, size_t n, int nranks) {                                        \
    for (size_t i = 0; i < n; i++) STORE(T, buf, i, FROMF(TOF(LOAD(T, buf, i)) / (float)nranks)); \
  }

static uint8_t floatToE4m3(float f) {
  return gcommFloatToFp8(f, 0);
}
static uint8_t floatToE5m2(float f) {
  return gcommFloatToFp8(f, 1);
}

DEFINE_INT(i8, int8_t, uint8_t)
DEFINE_INT(u8, uint8_t, uint8_t)
DEFINE_INT(i32, int32_t, uint32_t)
DEFINE_INT(u32, uint32_t, uint32_t)
DEFINE_INT(i64, int64_t, uint64_t)
DEFINE_INT(u64, uint64_t, uint64_t)
DEFINE_NARROW(f16, uint16_t, gcommHalfToFloat, gcommFloatToHalf)
DEFINE_FLOAT(f32, float)
DEFINE_FLOAT(f64, double)
DEFINE_NARROW(bf16, uint16_t, gcommBf16ToFloat, gcommFloatToBf16)
DEFINE_NARROW(e4m3, uint8_t, gcommFp8e4m3ToFloat, floatToE4m3)
DEFINE_NARROW(e5m2, uint8_t, gcommFp8e5m2ToFloat, floatToE5m2)

/* [type][op]: Avg and PreMulSum reduce by Sum (their other parts: gcommDivideTable,
 * gcommPreMulTable) */
#define REDUCE_ROW(NAME) \
  { NAME##Sum, NAME##Prod, NAME##Max, NAME##Min, NAME##Sum, NAME##Sum }
const reduceFn_t gcommReduceTable[gcommNumTypes][GCOMM_OP_PREMULSUM + 1] = {
    REDUCE_ROW(i8),  REDUCE_ROW(u8),   REDUCE_ROW(i32),  REDUCE_ROW(u32),
    REDUCE_ROW(i64), REDUCE_ROW(u64),  REDUCE_ROW(f16),  REDUCE_ROW(f32),
    REDUCE_ROW(f64), REDUCE_ROW(bf16), REDUCE_ROW(e4m3), REDUCE_ROW(e5m2)};
const divideFn_t gcommDivideTable[gcommNumTypes] = {i8Div,  u8Div,   i32Div,  u32Div,
                                                    i64Div, u64Div,  f16Div,  f32Div,
                                                    f64Div, bf16Div, e4m3Div, e5m2Div};
const preMulFn_t gcommPreMulTable[gcommNumTypes] = {i8PreMul,  u8PreMul,   i32PreMul,  u32PreMul,
                                                    i64PreMul, u64PreMul,  f16PreMul,  f32PreMul,
                                                    f64PreMul, bf16PreMul, e4m3PreMul, e5m2PreMul};
