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
 * The conversions here are the only ones: the host executor and the kernels call the same code,
 * so both give the same bits.
 */
#ifndef GCOMM_REDUCE_H
#define GCOMM_REDUCE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gcomm_sched.h" /* GCOMM_HD */

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

/* The operator code PreMulSum takes inside gcomm, past gcomm.h's (gcommNumOps): an operation's
 * created operator is replaced by it and its scalar when it is called. */
#define GCOMM_OP_PREMULSUM 5

/* Bytes per element of each gcommDataType_t. */
GCOMM_HD size_t gcommTypeSize(int type) {
  switch (type) {
    case 0:
    case 1:
    case 10:
    case 11:
      return 1; /* Int8, Uint8, Float8e4m3, Float8e5m2 */
    case 6:
    case 9:
      return 2; /* Float16, Bfloat16 */
    case 4:
    case 5:
    case 8:
      return 8; /* Int64, Uint64, Float64 */
    default:
      return 4;
  }
}

#endif /* GCOMM_REDUCE_H */
