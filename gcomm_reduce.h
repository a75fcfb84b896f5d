/*
 * gcomm_reduce.h - element types and reduction operators, for the host executor and the kernels.
 *
 * Float16 and Bfloat16 are widened to float, combined, and rounded once (to nearest even). Integer
 * Sum and Prod wrap (computed in the unsigned type, so signed overflow is defined). Avg is Sum
 * followed, on the final value only, by a division by the number of ranks (the post-operation).
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

/* Bytes per element of each gcommDataType_t. */
GCOMM_HD size_t gcommTypeSize(int type) {
  switch (type) {
    case 0:
    case 1:
      return 1; /* Int8, Uint8 */
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
