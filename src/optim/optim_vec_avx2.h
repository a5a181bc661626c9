/* optim_vec_avx2.h - the vector layer of optim_body.h for AVX2 + FMA +
 * F16C: 8 fp32 lanes in a __m256, compare results as all-ones lanes. What
 * both x86 widths spell alike is in optim_vec_x86.h; this file names the
 * width and defines what AVX2 does its own way. Included only by
 * optim_avx2.c, which the build compiles with -mavx2 -mfma -mf16c and the
 * driver calls only when zs_simd_level() says the CPU has them. */
#ifndef ZS_OPTIM_VEC_AVX2_H
#define ZS_OPTIM_VEC_AVX2_H

#include <immintrin.h>

#include "optim/optim_internal.h"

#define ZS__VW 8
#define ZS__MM(op) _mm256_##op
#define ZS__MMSI(op) _mm256_##op##_si256
#define ZS__MMHSI(op) _mm_##op##_si128
#define ZS__MMT(t) __m256##t
#define ZS__MM_CMP _mm256_cmp_ps
typedef __m256 zv_mask;
typedef __m128 zv_half;
typedef __m128i zv_i16;

#include "optim/optim_vec_x86.h"

ZS__FORCE_INLINE zv_f32 zv_as_f32(zv_i32 b) { return _mm256_castsi256_ps(b); }
/* The unsigned saturation keeps lanes that are in range. */
ZS__FORCE_INLINE zv_i16 zv_narrow16(zv_i32 x) {
  return _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
}
ZS__FORCE_INLINE zv_i32 zv_select_i32(zv_mask k, zv_i32 a, zv_i32 b) {
  return _mm256_blendv_epi8(b, a, _mm256_castps_si256(k));
}
/* The two compares give all-ones lanes that pick 1 and -1 independently. */
ZS__FORCE_INLINE zv_f32 zv_sign(zv_f32 x) {
  __m256 z = _mm256_setzero_ps();
  __m256 pos = _mm256_and_ps(_mm256_cmp_ps(x, z, _CMP_GT_OQ), _mm256_set1_ps(1.0f));
  __m256 neg = _mm256_and_ps(_mm256_cmp_ps(x, z, _CMP_LT_OQ), _mm256_set1_ps(-1.0f));
  return _mm256_or_ps(pos, neg);
}
ZS__FORCE_INLINE zv_half zv_lo(zv_f32 x) { return _mm256_castps256_ps128(x); }
ZS__FORCE_INLINE zv_half zv_hi(zv_f32 x) { return _mm256_extractf128_ps(x, 1); }
ZS__FORCE_INLINE __m128 zv_max128(zv_f32 x) { return _mm_max_ps(zv_lo(x), zv_hi(x)); }

/* ------------------------------------------------------ 8-bit codes */

ZS__FORCE_INLINE __m128i zv_load_codes(const void *p) {
  return _mm_loadl_epi64((const __m128i *)p);
}
/* RSQRTPS: t * rsqrt(t) is within 0.094 of sqrt(t) (optim_internal.h). */
ZS__FORCE_INLINE zv_f32 zv_rsqrt_est(zv_f32 t) { return _mm256_rsqrt_ps(t); }
/* A true compare lane is all ones, which is -1. */
ZS__FORCE_INLINE zv_i32 zv_inc_where(zv_i32 q, zv_mask k) {
  return _mm256_sub_epi32(q, _mm256_castps_si256(k));
}
/* VPSIGND negates q where the bits of x read as a negative integer (sign
 * bit set: x < 0, and -0 and negative NaN, whose codes are 0), keeps q
 * where they are positive and zeroes it where x is +0 (whose code is 0). */
ZS__FORCE_INLINE zv_i32 zv_sign_code(zv_i32 q, zv_f32 x) {
  return _mm256_sign_epi32(q, _mm256_castps_si256(x));
}
/* Saturating packs, which keep codes in range as they are. */
ZS__FORCE_INLINE void zv_store_i8(int8_t *p, zv_i32 q) {
  __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
  _mm_storel_epi64((__m128i *)p, _mm_packs_epi16(w, w));
}
ZS__FORCE_INLINE void zv_store_u8(uint8_t *p, zv_i32 q) {
  __m128i w = zv_narrow16(q);
  _mm_storel_epi64((__m128i *)p, _mm_packus_epi16(w, w));
}

#endif
