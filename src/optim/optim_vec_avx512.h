/* optim_vec_avx512.h - the vector layer of optim_body.h for AVX-512
 * (F+BW+VL+DQ): 16 fp32 lanes in a __m512, compare results in a mask
 * register, so selects and conditional adds are masked operations. What
 * both x86 widths spell alike is in optim_vec_x86.h; this file names the
 * width and defines what AVX-512 does its own way. Included only by
 * optim_avx512.c, which the build compiles with the AVX-512 flags and the
 * driver calls only when zs_simd_level() reports AVX512. */
#ifndef ZS_OPTIM_VEC_AVX512_H
#define ZS_OPTIM_VEC_AVX512_H

#include <immintrin.h>

#include "optim/optim_internal.h"

#define ZS__VW 16
#define ZS__MM(op) _mm512_##op
#define ZS__MMSI(op) _mm512_##op##_si512
#define ZS__MMHSI(op) _mm256_##op##_si256
#define ZS__MMT(t) __m512##t
#define ZS__MM_CMP _mm512_cmp_ps_mask
typedef __mmask16 zv_mask;
typedef __m256 zv_half;
typedef __m256i zv_i16;

#include "optim/optim_vec_x86.h"

ZS__FORCE_INLINE zv_f32 zv_as_f32(zv_i32 b) { return _mm512_castsi512_ps(b); }
/* VPMOVDW keeps the low 16 bits of each lane. */
ZS__FORCE_INLINE zv_i16 zv_narrow16(zv_i32 x) { return _mm512_cvtepi32_epi16(x); }
ZS__FORCE_INLINE zv_i32 zv_select_i32(zv_mask k, zv_i32 a, zv_i32 b) {
  return _mm512_mask_blend_epi32(k, b, a);
}
/* -1 under the x < 0 mask (zero elsewhere), then 1 blended in under x > 0. */
ZS__FORCE_INLINE zv_f32 zv_sign(zv_f32 x) {
  __m512 z = _mm512_setzero_ps();
  __m512 neg = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, z, _CMP_LT_OQ), _mm512_set1_ps(-1.0f));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, z, _CMP_GT_OQ), neg, _mm512_set1_ps(1.0f));
}
ZS__FORCE_INLINE zv_half zv_lo(zv_f32 x) { return _mm512_castps512_ps256(x); }
ZS__FORCE_INLINE zv_half zv_hi(zv_f32 x) { return _mm512_extractf32x8_ps(x, 1); }
ZS__FORCE_INLINE __m128 zv_max128(zv_f32 x) {
  __m256 h = _mm256_max_ps(zv_lo(x), zv_hi(x));
  return _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* ------------------------------------------------------ 8-bit codes */

ZS__FORCE_INLINE __m128i zv_load_codes(const void *p) {
  return _mm_loadu_si128((const __m128i *)p);
}
/* RSQRT14PS: t * rsqrt14(t) is within 0.016 of sqrt(t). */
ZS__FORCE_INLINE zv_f32 zv_rsqrt_est(zv_f32 t) { return _mm512_rsqrt14_ps(t); }
ZS__FORCE_INLINE zv_i32 zv_inc_where(zv_i32 q, zv_mask k) {
  return _mm512_mask_add_epi32(q, k, q, _mm512_set1_epi32(1));
}
ZS__FORCE_INLINE zv_i32 zv_sign_code(zv_i32 q, zv_f32 x) {
  zv_mask neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mask_sub_epi32(q, neg, _mm512_setzero_si512(), q);
}
/* VPMOVDB keeps the low byte of each lane; codes are in range already. */
ZS__FORCE_INLINE void zv_store_i8(int8_t *p, zv_i32 q) {
  _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(q));
}
ZS__FORCE_INLINE void zv_store_u8(uint8_t *p, zv_i32 q) {
  _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(q));
}

#endif
