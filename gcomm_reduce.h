/*
 * gcomm_reduce.h - element types and reduction operators, for the host executor and the kernels.
 *
 * Float16, Bfloat16 and the fp8 types are widened to float, combined, and rounded once (to nearest
 * even; fp8 saturates to its largest finite value and turns NaN into the canonical 0x7f, as CUDA's
 * __NV_SATFINITE conversions do). Integer Sum and Prod wrap (computed in the unsigned type, so
 * signed overflow is defined). Avg is Sum followed, on the final value only, by a division by the
 * number of ranks (the post-operation). PreMulSum is Sum whose local inputs are first multiplied
 * by the rank's scalar and rounded to the type (the pre-operation), as NCCL's.
 *
 * Written once for both executors: the host executor (gcomm.c) runs the array loops at the end of
 * this file, the kernels (gcomm_kernels.cu) the same element operators through gcommElem<datatype>.
 * One difference, which changes no bit: in a kernel the narrow floats convert with the GPU's
 * own instructions where it has them (gcomm_gpu.h), which give the same bits as the conversions
 * here for every value.
 */
#ifndef GCOMM_REDUCE_H
#define GCOMM_REDUCE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
#include <type_traits> /* gcommByDatatype */
#endif

#include "gcomm_sched.h" /* GCOMM_HD */
#include "gcomm_types.h"

/* In a kernel (the device pass of nvcc or hipcc), gcomm_gpu.h says which conversions the GPU has;
 * elsewhere (the host executor, the host pass) none is used. */
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define GCOMM_GPU_CODE 1
#include "gcomm_gpu.h"
#endif

GCOMM_HD float gcommHalfToFloat(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  float f;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13); /* inf, nan */
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else { /* subnormal: value = man * 2^-24 */
    f = (float)man * (1.0f / 16777216.0f);
    return sign ? -f : f;
  }
  memcpy(&f, &bits, 4);
  return f;
}

GCOMM_HD uint16_t gcommFloatToHalf(float f) {
  uint32_t x, sign, mag;
  memcpy(&x, &f, 4);
  sign = (x >> 16) & 0x8000;
  mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) return (uint16_t)(sign | 0x7c00 | (mag > 0x7f800000u ? 0x200 : 0));
  if (mag >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to >= 65520: inf */
  if (mag >= 0x38800000u) {                                 /* normal half */
    uint32_t r = mag - 0x38000000u;                         /* rebias exponent 127 -> 15 */
    r = (r + 0xfff + ((r >> 13) & 1)) >> 13;                /* round to nearest even */
    return (uint16_t)(sign | r);
  }
  if (mag < 0x33000000u) return (uint16_t)sign; /* below half the smallest subnormal */
  {                                             /* subnormal half */
    uint32_t e = mag >> 23, m = (mag & 0x7fffff) | 0x800000, shift = 126 - e;
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1))) r++;
    return (uint16_t)(sign | r);
  }
}

GCOMM_HD float gcommBf16ToFloat(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

GCOMM_HD uint16_t gcommFloatToBf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet nan */
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

/* fp8 -> float, exactly. E5M2 is the high byte of a Float16; E4M3 has no infinity, and its
 * 0x7f/0xff are NaN. */
GCOMM_HD float gcommFp8e5m2ToFloat(uint8_t x) {
  return gcommHalfToFloat((uint16_t)(x << 8));
}

GCOMM_HD float gcommFp8e4m3ToFloat(uint8_t x) {
  uint32_t sign = (uint32_t)(x & 0x80) << 24, exp = (x >> 3) & 0xf, man = x & 7, bits;
  float f;
  if ((x & 0x7f) == 0x7f) {
    bits = sign | 0x7fc00000u; /* nan */
  } else if (exp != 0) {
    bits = sign | ((exp + 120) << 23) | (man << 20);
  } else { /* zero or subnormal: value = man * 2^-9 */
    f = (float)man * (1.0f / 512.0f);
    return sign ? -f : f;
  }
  memcpy(&f, &bits, 4);
  return f;
}

/* float -> fp8, rounded to nearest even, saturating: what CUDA's __nv_cvt_float_to_fp8 gives with
 * __NV_SATFINITE (infinities and values past the largest finite one become it, with their sign;
 * NaN becomes 0x7f; magnitudes up to half the smallest subnormal become a signed zero). e5m2
 * selects E5M2 (2 mantissa bits, bias 15) over E4M3 (3 bits, bias 7). */
GCOMM_HD uint8_t gcommFloatToFp8(float f, int e5m2) {
  const uint32_t manBits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
  /* float bit patterns: the first magnitude that saturates (E4M3: above 464 = 448 + half an ulp;
   * E5M2: 61440 = 57344 + half an ulp, which rounds up to the infinity it replaces), the largest
   * magnitude that rounds to zero (half the smallest subnormal: 2^-10, 2^-17), the smallest
   * normal (2^-6, 2^-14) */
  const uint32_t saturate = e5m2 ? 0x47700000u : 0x43e80001u;
  const uint32_t zero = e5m2 ? 0x37000000u : 0x3a800000u;
  const uint32_t normal = e5m2 ? 0x38800000u : 0x3c800000u;
  const uint8_t maxFinite = e5m2 ? 0x7b : 0x7e;
  uint32_t x, sign, mag, shift, r;
  memcpy(&x, &f, 4);
  sign = (x >> 24) & 0x80;
  mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return 0x7f; /* nan */
  if (mag >= saturate) return (uint8_t)(sign | maxFinite);
  if (mag <= zero) return (uint8_t)sign;
  if (mag >= normal) {
    r = mag - ((127 - bias) << 23); /* rebias the exponent */
    shift = 23 - manBits;
  } else { /* subnormal: the significand with its leading bit, shifted to units of 2^(1-bias-M) */
    r = (mag & 0x7fffffu) | 0x800000u;
    shift = 151 - bias - manBits - (mag >> 23);
  }
  r = (r + (1u << (shift - 1)) - 1 + ((r >> shift) & 1)) >> shift; /* round to nearest even */
  return (uint8_t)(sign | r);
}

/* ---- A narrow float widened to float, and a float rounded back: in a kernel, the GPU's own
 * conversions where it has them (one instruction each, where the ones above would be dozens in
 * every unrolled step; they give the same bits for every value), else the ones above. ---- */
GCOMM_HD float gcommWidenF16(uint16_t x) {
#if defined(GCOMM_GPU_CODE) && defined(GCOMM_GPU_HALF)
  return gcommGpuHalfToF(x);
#else
  return gcommHalfToFloat(x);
#endif
}
GCOMM_HD uint16_t gcommRoundF16(float f) {
#if defined(GCOMM_GPU_CODE) && defined(GCOMM_GPU_HALF)
  return gcommGpuFToHalf(f);
#else
  return gcommFloatToHalf(f);
#endif
}
GCOMM_HD float gcommWidenBf16(uint16_t x) {
#if defined(GCOMM_GPU_CODE) && defined(GCOMM_GPU_BF16)
  return gcommGpuBf16ToF(x);
#else
  return gcommBf16ToFloat(x);
#endif
}
GCOMM_HD uint16_t gcommRoundBf16(float f) {
#if defined(GCOMM_GPU_CODE) && defined(GCOMM_GPU_BF16)
  return gcommGpuFToBf16(f);
#else
  return gcommFloatToBf16(f);
#endif
}
GCOMM_HD float gcommWidenFp8(uint8_t x, int e5m2) {
#if defined(GCOMM_GPU_CODE) && defined(GCOMM_GPU_FP8)
  return gcommGpuFp8ToF(x, e5m2);
#else
  return e5m2 ? gcommFp8e5m2ToFloat(x) : gcommFp8e4m3ToFloat(x);
#endif
}
GCOMM_HD uint8_t gcommRoundFp8(float f, int e5m2) {
#if defined(GCOMM_GPU_CODE) && defined(GCOMM_GPU_FP8)
  return gcommGpuFToFp8(f, e5m2);
#else
  return gcommFloatToFp8(f, e5m2);
#endif
}
GCOMM_HD float gcommWidenE4m3(uint8_t x) {
  return gcommWidenFp8(x, 0);
}
GCOMM_HD uint8_t gcommRoundE4m3(float f) {
  return gcommRoundFp8(f, 0);
}
GCOMM_HD float gcommWidenE5m2(uint8_t x) {
  return gcommWidenFp8(x, 1);
}
GCOMM_HD uint8_t gcommRoundE5m2(float f) {
  return gcommRoundFp8(f, 1);
}

/* A product rounded to the type on its own: a kernel's compiler could otherwise fuse it into the
 * sum that follows (one rounding instead of two, other bits than the host executor's). */
GCOMM_HD float gcommMulRnF32(float a, float b) {
#ifdef GCOMM_GPU_CODE
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
GCOMM_HD double gcommMulRnF64(double a, double b) {
#ifdef GCOMM_GPU_CODE
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

/* ---- The operators on one element, for every datatype t (i8 u8 i32 u32 i64 u64 f16 f32 f64 bf16
 * e4m3 e5m2, held in type T): gcommSum_t, gcommProd_t, gcommMax_t, gcommMin_t; gcommReduce_t(op,
 * a, b), one of those by op (Avg and PreMulSum combine by Sum); gcommPreMul_t(a, s), PreMulSum's
 * pre-operation, a times the scalar rounded to the type; gcommDiv_t(a, n), Avg's
 * post-operation, a divided by the number of ranks. ---- */
#if defined(__CUDACC__) || defined(__HIPCC__)
#define GCOMM_HDI static __forceinline__ __host__ __device__
#else
#define GCOMM_HDI static inline
#endif

#define GCOMM_REDUCE_BY_OP(t, T)                         \
  GCOMM_HDI T gcommReduce_##t(int op, T a, T b) {        \
    if (op == gcommProd) return gcommProd_##t(a, b);     \
    if (op == gcommMax) return gcommMax_##t(a, b);       \
    if (op == gcommMin) return gcommMin_##t(a, b);       \
    return gcommSum_##t(a, b); /* Sum, Avg, PreMulSum */ \
  }

/* Integers: Sum, Prod and PreMul in the unsigned type U, so that overflow wraps (signed overflow
 * would be undefined); Avg's division truncates. */
#define GCOMM_OPS_INT(t, T, U)            \
  GCOMM_HDI T gcommSum_##t(T a, T b) {    \
    return (T)((U)a + (U)b);              \
  }                                       \
  GCOMM_HDI T gcommProd_##t(T a, T b) {   \
    return (T)((U)a * (U)b);              \
  }                                       \
  GCOMM_HDI T gcommMax_##t(T a, T b) {    \
    return a > b ? a : b;                 \
  }                                       \
  GCOMM_HDI T gcommMin_##t(T a, T b) {    \
    return a < b ? a : b;                 \
  }                                       \
  GCOMM_HDI T gcommPreMul_##t(T a, T s) { \
    return (T)((U)a * (U)s);              \
  }                                       \
  GCOMM_HDI T gcommDiv_##t(T a, int n) {  \
    return (T)(a / (T)n);                 \
  }                                       \
  GCOMM_REDUCE_BY_OP(t, T)

/* float and double: IEEE arithmetic in the type, the pre-operation rounded on its own (P: F32 or
 * F64, gcommMulRn's). */
#define GCOMM_OPS_FLOAT(t, T, P)          \
  GCOMM_HDI T gcommSum_##t(T a, T b) {    \
    return a + b;                         \
  }                                       \
  GCOMM_HDI T gcommProd_##t(T a, T b) {   \
    return a * b;                         \
  }                                       \
  GCOMM_HDI T gcommMax_##t(T a, T b) {    \
    return a > b ? a : b;                 \
  }                                       \
  GCOMM_HDI T gcommMin_##t(T a, T b) {    \
    return a < b ? a : b;                 \
  }                                       \
  GCOMM_HDI T gcommPreMul_##t(T a, T s) { \
    return gcommMulRn##P(a, s);           \
  }                                       \
  GCOMM_HDI T gcommDiv_##t(T a, int n) {  \
    return a / (T)n;                      \
  }                                       \
  GCOMM_REDUCE_BY_OP(t, T)

/* 16- and 8-bit floats (their bits in T): widened to float, combined, rounded once (P: F16,
 * Bf16, E4m3, E5m2, gcommWiden's and gcommRound's). Max and Min return an operand as it is. */
#define GCOMM_OPS_NARROW(t, T, P)                              \
  GCOMM_HDI T gcommSum_##t(T a, T b) {                         \
    return gcommRound##P(gcommWiden##P(a) + gcommWiden##P(b)); \
  }                                                            \
  GCOMM_HDI T gcommProd_##t(T a, T b) {                        \
    return gcommRound##P(gcommWiden##P(a) * gcommWiden##P(b)); \
  }                                                            \
  GCOMM_HDI T gcommMax_##t(T a, T b) {                         \
    return gcommWiden##P(a) > gcommWiden##P(b) ? a : b;        \
  }                                                            \
  GCOMM_HDI T gcommMin_##t(T a, T b) {                         \
    return gcommWiden##P(a) < gcommWiden##P(b) ? a : b;        \
  }                                                            \
  GCOMM_HDI T gcommPreMul_##t(T a, T s) {                      \
    return gcommRound##P(gcommWiden##P(a) * gcommWiden##P(s)); \
  }                                                            \
  GCOMM_HDI T gcommDiv_##t(T a, int n) {                       \
    return gcommRound##P(gcommWiden##P(a) / (float)n);         \
  }                                                            \
  GCOMM_REDUCE_BY_OP(t, T)

/* Every datatype: X(gcommDataType_t, t, T, its kind of arithmetic, that kind's parameter). */
#define GCOMM_DATATYPES(X)                        \
  X(gcommInt8, i8, int8_t, INT, uint8_t)          \
  X(gcommUint8, u8, uint8_t, INT, uint8_t)        \
  X(gcommInt32, i32, int32_t, INT, uint32_t)      \
  X(gcommUint32, u32, uint32_t, INT, uint32_t)    \
  X(gcommInt64, i64, int64_t, INT, uint64_t)      \
  X(gcommUint64, u64, uint64_t, INT, uint64_t)    \
  X(gcommFloat16, f16, uint16_t, NARROW, F16)     \
  X(gcommFloat32, f32, float, FLOAT, F32)         \
  X(gcommFloat64, f64, double, FLOAT, F64)        \
  X(gcommBfloat16, bf16, uint16_t, NARROW, Bf16)  \
  X(gcommFloat8e4m3, e4m3, uint8_t, NARROW, E4m3) \
  X(gcommFloat8e5m2, e5m2, uint8_t, NARROW, E5m2)

#define GCOMM_DEFINE_OPS(TYPE, t, T, KIND, P) GCOMM_OPS_##KIND(t, T, P)
GCOMM_DATATYPES(GCOMM_DEFINE_OPS)
#undef GCOMM_DEFINE_OPS

/* The operator code PreMulSum takes inside gcomm, past gcomm.h's (gcommNumOps): an operation's
 * created operator is replaced by it and its scalar when it is called. */
#define GCOMM_OP_PREMULSUM 5

/* Bytes per element of each gcommDataType_t: a shift of one constant, log2 of each size in two
 * bits (datatype d at bits 2d, 2d+1), with no branches: the kernels ask it at every step of an
 * operation, and a switch over the twelve datatypes compiles to a branch tree on the critical
 * path of a small one. */
#define GCOMM_LOG2_SIZE(n) (((n) >= 2) + ((n) >= 4) + ((n) >= 8))
#define GCOMM_TYPE_LOG2_SIZE(TYPE, t, T, KIND, P) | (GCOMM_LOG2_SIZE(sizeof(T)) << (2 * (TYPE)))
GCOMM_HD size_t gcommTypeSize(int type) {
  const unsigned log2Sizes = 0u GCOMM_DATATYPES(GCOMM_TYPE_LOG2_SIZE);
  return (unsigned)type < gcommNumTypes ? (size_t)1 << ((log2Sizes >> (2 * type)) & 3) : 4;
}
#undef GCOMM_TYPE_LOG2_SIZE
#undef GCOMM_LOG2_SIZE

#if defined(__CUDACC__) || defined(__HIPCC__)
/* ---- The kernels' view: gcommElem<datatype>::T and its operators, the op a constant there.
 * ---- */
template <int TYPE>
struct gcommElem;
#define GCOMM_ELEM(TYPE, t, T_, KIND, P)                                                           \
  template <>                                                                                      \
  struct gcommElem<TYPE> {                                                                         \
    typedef T_ T;                                                                                  \
    static __forceinline__ __host__ __device__ T reduce(int op, T a, T b) {                        \
      return gcommReduce_##t(op, a, b);                                                            \
    }                                                                                              \
    static __forceinline__ __host__ __device__ T preMul(T a, T s) {                                \
      return gcommPreMul_##t(a, s);                                                                \
    }                                                                                              \
    static __forceinline__ __host__ __device__ T divide(T a, int n) { return gcommDiv_##t(a, n); } \
  };
GCOMM_DATATYPES(GCOMM_ELEM)
#undef GCOMM_ELEM

/* Calls f(std::integral_constant<int, TYPE>()) for datatype's TYPE, the datatype a constant in f;
 * false for a value that is no datatype. */
template <typename F>
static inline bool gcommByDatatype(int datatype, F f) {
  switch (datatype) {
#define GCOMM_CASE(TYPE, t, T, KIND, P)     \
  case TYPE:                                \
    f(std::integral_constant<int, TYPE>()); \
    return true;
    GCOMM_DATATYPES(GCOMM_CASE)
#undef GCOMM_CASE
    default:
      return false;
  }
}

#else
/* ---- The host executor's loops over n elements at any byte address (a double at +1 is legal C
 * data in a char buffer, where a plain T access is undefined): loads and stores through memcpy,
 * which the compiler turns into one (vectorised, unaligned) access. ---- */
#define GCOMM_LOAD(T, p, i)                                     \
  ({                                                            \
    T v_;                                                       \
    memcpy(&v_, (const char*)(p) + (i) * sizeof(T), sizeof(T)); \
    v_;                                                         \
  })
#define GCOMM_STORE(T, p, i, v)                           \
  do {                                                    \
    T v_ = (v);                                           \
    memcpy((char*)(p) + (i) * sizeof(T), &v_, sizeof(T)); \
  } while (0)
#define GCOMM_REDUCE_LOOP(T, FN)                        \
  for (size_t i = 0; i < n; i++) {                      \
    T A = GCOMM_LOAD(T, a, i), B = GCOMM_LOAD(T, b, i); \
    GCOMM_STORE(T, dst, i, FN(A, B));                   \
  }

/* dst[i] = a[i] op b[i] (dst may be a), dst[i] = a[i] * scalar (PreMulSum; dst may be a), and
 * buf[i] /= nranks (Avg), for datatype t */
#define GCOMM_HOST_LOOPS(TYPE, t, T, KIND, P)                                                  \
  static inline void gcommReduceArray_##t(int op, void* dst, const void* a, const void* b,     \
                                          size_t n) {                                          \
    if (op == gcommProd) {                                                                     \
      GCOMM_REDUCE_LOOP(T, gcommProd_##t)                                                      \
    } else if (op == gcommMax) {                                                               \
      GCOMM_REDUCE_LOOP(T, gcommMax_##t)                                                       \
    } else if (op == gcommMin) {                                                               \
      GCOMM_REDUCE_LOOP(T, gcommMin_##t)                                                       \
    } else { /* Sum, Avg, PreMulSum */                                                         \
      GCOMM_REDUCE_LOOP(T, gcommSum_##t)                                                       \
    }                                                                                          \
  }                                                                                            \
  static inline void gcommPreMulArray_##t(void* dst, const void* a, size_t n, const void* s) { \
    T S;                                                                                       \
    memcpy(&S, s, sizeof(T));                                                                  \
    for (size_t i = 0; i < n; i++)                                                             \
      GCOMM_STORE(T, dst, i, gcommPreMul_##t(GCOMM_LOAD(T, a, i), S));                         \
  }                                                                                            \
  static inline void gcommDivideArray_##t(void* buf, size_t n, int nranks) {                   \
    for (size_t i = 0; i < n; i++)                                                             \
      GCOMM_STORE(T, buf, i, gcommDiv_##t(GCOMM_LOAD(T, buf, i), nranks));                     \
  }
GCOMM_DATATYPES(GCOMM_HOST_LOOPS)
#undef GCOMM_HOST_LOOPS

/* The loops above for a datatype (an operation's, checked when it was posted). */
static inline void gcommReduceArray(int type, int op, void* dst, const void* a, const void* b,
                                    size_t n) {
  switch (type) {
#define GCOMM_CASE(TYPE, t, T, KIND, P)     \
  case TYPE:                                \
    gcommReduceArray_##t(op, dst, a, b, n); \
    return;
    GCOMM_DATATYPES(GCOMM_CASE)
#undef GCOMM_CASE
  }
}
static inline void gcommPreMulArray(int type, void* dst, const void* a, size_t n, const void* s) {
  switch (type) {
#define GCOMM_CASE(TYPE, t, T, KIND, P) \
  case TYPE:                            \
    gcommPreMulArray_##t(dst, a, n, s); \
    return;
    GCOMM_DATATYPES(GCOMM_CASE)
#undef GCOMM_CASE
  }
}
static inline void gcommDivideArray(int type, void* buf, size_t n, int nranks) {
  switch (type) {
#define GCOMM_CASE(TYPE, t, T, KIND, P)   \
  case TYPE:                              \
    gcommDivideArray_##t(buf, n, nranks); \
    return;
    GCOMM_DATATYPES(GCOMM_CASE)
#undef GCOMM_CASE
  }
}
#endif /* the host executor's loops */

#endif /* GCOMM_REDUCE_H */
