/* optim_vec_x86.h - the x86 vector layer of optim_body.h for AVX2 (8 lanes,
 * __m256) and AVX-512 (16 lanes, __m512): everything the two spell alike
 * but for the width in the names of the intrinsics and register types.
 * The width header (optim_vec_avx2.h, optim_vec_avx512.h) defines, before
 * it includes this file,
 *   ZS__VW         the fp32 lanes, 8 or 16;
 *   ZS__MM(op)     the intrinsic op of that width: _mm256_op, _mm512_op;
 *   ZS__MMSI(op)   integer intrinsics that end in the width:
 *                  _mm256_op_si256, _mm512_op_si512;
 *   ZS__MMHSI(op)  the same for half a register (ZS__VW 16-bit lanes):
 *                  _mm_op_si128, _mm256_op_si256;
 *   ZS__MMT(t)     the register types: __m256t, __m512t (t empty, i or d);
 *   ZS__MM_CMP     the fp32 compare (with a _CMP_ predicate) to a zv_mask;
 *   zv_mask        a compare result; zv_half, half the fp32 lanes; zv_i16,
 *                  ZS__VW 16-bit lanes (half a register);
 * and after it the functions declared below, which the widths spell
 * differently, and the rest of the layer that has no common spelling
 * (zv_sign, zv_inc_where, zv_sign_code, zv_store_i8, zv_store_u8). */
#ifndef ZS_OPTIM_VEC_X86_H
#define ZS_OPTIM_VEC_X86_H

typedef ZS__MMT() zv_f32;
typedef ZS__MMT(i) zv_i32;
typedef ZS__MMT(d) zv_f64;

/* The bits of b as fp32. */
ZS__FORCE_INLINE zv_f32 zv_as_f32(zv_i32 b);
/* The low 16 bits of each lane, for lanes 0..65535. */
ZS__FORCE_INLINE zv_i16 zv_narrow16(zv_i32 x);
/* a where k, else b. */
ZS__FORCE_INLINE zv_i32 zv_select_i32(zv_mask k, zv_i32 a, zv_i32 b);
/* The low and the high half of the lanes of x. */
ZS__FORCE_INLINE zv_half zv_lo(zv_f32 x);
ZS__FORCE_INLINE zv_half zv_hi(zv_f32 x);
/* The lane-wise maximum of the 128-bit quarters of x, as a tree. */
ZS__FORCE_INLINE __m128 zv_max128(zv_f32 x);
/* ZS__VW bytes at p in the low bytes of a register. */
ZS__FORCE_INLINE __m128i zv_load_codes(const void *p);
/* An estimate of 1 / sqrt(t) good enough for zv_sqrt_est_add. */
ZS__FORCE_INLINE zv_f32 zv_rsqrt_est(zv_f32 t);

ZS__FORCE_INLINE zv_f32 zv_set1(float x) { return ZS__MM(set1_ps)(x); }
ZS__FORCE_INLINE zv_f32 zv_add(zv_f32 a, zv_f32 b) { return ZS__MM(add_ps)(a, b); }
ZS__FORCE_INLINE zv_f32 zv_mul(zv_f32 a, zv_f32 b) { return ZS__MM(mul_ps)(a, b); }
ZS__FORCE_INLINE zv_f32 zv_div(zv_f32 a, zv_f32 b) { return ZS__MM(div_ps)(a, b); }
ZS__FORCE_INLINE zv_f32 zv_fma(zv_f32 a, zv_f32 b, zv_f32 c) {
  return ZS__MM(fmadd_ps)(a, b, c);
}
ZS__FORCE_INLINE zv_f32 zv_sqrt(zv_f32 x) { return ZS__MM(sqrt_ps)(x); }
/* MAXPS/MINPS return the second operand when either is NaN. */
ZS__FORCE_INLINE zv_f32 zv_max(zv_f32 a, zv_f32 b) { return ZS__MM(max_ps)(a, b); }
ZS__FORCE_INLINE zv_f32 zv_min(zv_f32 a, zv_f32 b) { return ZS__MM(min_ps)(a, b); }
ZS__FORCE_INLINE zv_f32 zv_abs(zv_f32 x) {
  return ZS__MM(andnot_ps)(ZS__MM(set1_ps)(-0.0f), x);
}
ZS__FORCE_INLINE zv_f32 zv_neg(zv_f32 x) {
  return ZS__MM(xor_ps)(x, ZS__MM(set1_ps)(-0.0f));
}
ZS__FORCE_INLINE zv_mask zv_ge(zv_f32 a, zv_f32 b) { return ZS__MM_CMP(a, b, _CMP_GE_OQ); }

/* ZS__VW 16-bit elements at p. */
ZS__FORCE_INLINE zv_i16 zv_load16(const uint16_t *p) {
  return ZS__MMHSI(loadu)((const zv_i16 *)p);
}
ZS__FORCE_INLINE void zv_store16(uint16_t *p, zv_i16 h) {
  ZS__MMHSI(storeu)((zv_i16 *)p, h);
}

ZS__FORCE_INLINE zv_f32 zv_load(const void *base, int dt, size_t i) {
  zv_i16 h;
  if (dt == ZS_DTYPE_F32) return ZS__MM(loadu_ps)((const float *)base + i);
  h = zv_load16((const uint16_t *)base + i);
  if (dt == ZS_DTYPE_BF16)
    return zv_as_f32(ZS__MM(slli_epi32)(ZS__MM(cvtepu16_epi32)(h), 16));
  return ZS__MM(cvtph_ps)(h);
}

ZS__FORCE_INLINE void zv_store(void *base, int dt, size_t i, zv_f32 x) {
  zv_i16 h;
  if (dt == ZS_DTYPE_F32) {
    ZS__MM(storeu_ps)((float *)base + i, x);
    return;
  }
  if (dt == ZS_DTYPE_BF16) {
    /* zs__f32_to_bf16 on the bits: round to nearest even, NaN quieted. */
    zv_i32 b = ZS__MMSI(castps)(x);
    zv_i32 hi = ZS__MM(srli_epi32)(b, 16);
    zv_i32 lsb = ZS__MMSI(and)(hi, ZS__MM(set1_epi32)(1));
    zv_i32 up = ZS__MM(add_epi32)(b, ZS__MM(set1_epi32)(0x7fff));
    zv_i32 r = ZS__MM(srli_epi32)(ZS__MM(add_epi32)(up, lsb), 16);
    zv_i32 q = ZS__MMSI(or)(hi, ZS__MM(set1_epi32)(0x40));
    h = zv_narrow16(zv_select_i32(ZS__MM_CMP(x, x, _CMP_UNORD_Q), q, r));
  } else {
    h = ZS__MM(cvtps_ph)(x, _MM_FROUND_TO_NEAREST_INT);
  }
  zv_store16((uint16_t *)base + i, h);
}

/* A tree, not a loop over the lanes: the requantization waits for it. */
ZS__FORCE_INLINE float zv_hmax(zv_f32 x) {
  __m128 y = zv_max128(x);
  y = _mm_max_ps(y, _mm_movehl_ps(y, y));
  y = _mm_max_ss(y, _mm_shuffle_ps(y, y, 1));
  return _mm_cvtss_f32(y);
}

ZS__FORCE_INLINE zv_f32 zv_load_i8(const int8_t *p) {
  return ZS__MM(cvtepi32_ps)(ZS__MM(cvtepi8_epi32)(zv_load_codes(p)));
}
ZS__FORCE_INLINE zv_f32 zv_load_u8(const uint8_t *p) {
  return ZS__MM(cvtepi32_ps)(ZS__MM(cvtepu8_epi32)(zv_load_codes(p)));
}
ZS__FORCE_INLINE zv_f32 zv_sqrt_est_add(zv_f32 t, zv_f32 c) {
  return ZS__MM(fmadd_ps)(t, zv_rsqrt_est(t), c);
}
ZS__FORCE_INLINE zv_i32 zv_cvtt(zv_f32 x) { return ZS__MM(cvttps_epi32)(x); }
ZS__FORCE_INLINE zv_f32 zv_i32_f32(zv_i32 q) { return ZS__MM(cvtepi32_ps)(q); }

ZS__FORCE_INLINE zv_f64 zv_f64_zero(void) { return ZS__MM(setzero_pd)(); }
ZS__FORCE_INLINE zv_f64 zv_f64_lo(zv_f32 x) { return ZS__MM(cvtps_pd)(zv_lo(x)); }
ZS__FORCE_INLINE zv_f64 zv_f64_hi(zv_f32 x) { return ZS__MM(cvtps_pd)(zv_hi(x)); }
ZS__FORCE_INLINE zv_f64 zv_f64_fma(zv_f64 a, zv_f64 b, zv_f64 c) {
  return ZS__MM(fmadd_pd)(a, b, c);
}
ZS__FORCE_INLINE void zv_f64_store(double *p, zv_f64 x) { ZS__MM(storeu_pd)(p, x); }

#endif
