/* optim_vec_neon.h - the vector layer of optim_body.h for AArch64 Advanced
 * SIMD: 4 fp32 lanes in a float32x4_t, compare results as all-ones lanes.
 * NEON's own max/min return NaN for a NaN operand, so the x86 MAXPS/MINPS
 * rule the body relies on is a compare and a select here; NEON has a full
 * square root, which serves as the estimate the 8-bit rounding needs. The
 * operations and their exact meaning are listed in optim_body.h. Included
 * only by optim_neon.c (built for arm64 only). */
#ifndef ZS_OPTIM_VEC_NEON_H
#define ZS_OPTIM_VEC_NEON_H

#include <arm_neon.h>

#include "optim/optim_internal.h"

#define ZS__VW 4

typedef float32x4_t zv_f32;
typedef int32x4_t zv_i32;
typedef uint32x4_t zv_mask;
typedef float64x2_t zv_f64;

ZS__FORCE_INLINE zv_f32 zv_set1(float x) { return vdupq_n_f32(x); }
ZS__FORCE_INLINE zv_f32 zv_add(zv_f32 a, zv_f32 b) { return vaddq_f32(a, b); }
ZS__FORCE_INLINE zv_f32 zv_mul(zv_f32 a, zv_f32 b) { return vmulq_f32(a, b); }
ZS__FORCE_INLINE zv_f32 zv_div(zv_f32 a, zv_f32 b) { return vdivq_f32(a, b); }
/* vfmaq_f32(c, a, b) is c + a * b with one rounding. */
ZS__FORCE_INLINE zv_f32 zv_fma(zv_f32 a, zv_f32 b, zv_f32 c) {
  return vfmaq_f32(c, a, b);
}
ZS__FORCE_INLINE zv_f32 zv_sqrt(zv_f32 x) { return vsqrtq_f32(x); }
ZS__FORCE_INLINE zv_f32 zv_max(zv_f32 a, zv_f32 b) {
  return vbslq_f32(vcgtq_f32(a, b), a, b);
}
ZS__FORCE_INLINE zv_f32 zv_min(zv_f32 a, zv_f32 b) {
  return vbslq_f32(vcltq_f32(a, b), a, b);
}
ZS__FORCE_INLINE zv_f32 zv_abs(zv_f32 x) { return vabsq_f32(x); }
ZS__FORCE_INLINE zv_f32 zv_neg(zv_f32 x) { return vnegq_f32(x); }
ZS__FORCE_INLINE zv_mask zv_ge(zv_f32 a, zv_f32 b) { return vcgeq_f32(a, b); }
ZS__FORCE_INLINE zv_f32 zv_sign(zv_f32 x) {
  float32x4_t z = vdupq_n_f32(0.0f);
  float32x4_t neg = vbslq_f32(vcltq_f32(x, z), vdupq_n_f32(-1.0f), z);
  return vbslq_f32(vcgtq_f32(x, z), vdupq_n_f32(1.0f), neg);
}

ZS__FORCE_INLINE zv_f32 zv_load(const void *base, int dt, size_t i) {
  uint16x4_t h;
  if (dt == ZS_DTYPE_F32) return vld1q_f32((const float *)base + i);
  h = vld1_u16((const uint16_t *)base + i);
  if (dt == ZS_DTYPE_BF16) return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
  return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

ZS__FORCE_INLINE void zv_store(void *base, int dt, size_t i, zv_f32 x) {
  uint16x4_t o;
  if (dt == ZS_DTYPE_F32) {
    vst1q_f32((float *)base + i, x);
    return;
  }
  if (dt == ZS_DTYPE_BF16) {
    /* zs__f32_to_bf16 on the bits: round to nearest even, NaN quieted. */
    uint32x4_t b = vreinterpretq_u32_f32(x);
    uint32x4_t hi = vshrq_n_u32(b, 16);
    uint32x4_t r = vshrq_n_u32(
        vaddq_u32(vaddq_u32(b, vdupq_n_u32(0x7fff)), vandq_u32(hi, vdupq_n_u32(1))),
        16);
    uint32x4_t q = vorrq_u32(hi, vdupq_n_u32(0x40));
    uint32x4_t ord = vceqq_f32(x, x); /* all ones unless NaN */
    o = vmovn_u32(vbslq_u32(ord, r, q));
  } else {
    o = vreinterpret_u16_f16(vcvt_f16_f32(x));
  }
  vst1_u16((uint16_t *)base + i, o);
}

/* FMAXV would return NaN for a NaN lane, but the lanes here never are. */
ZS__FORCE_INLINE float zv_hmax(zv_f32 x) { return vmaxvq_f32(x); }

/* ------------------------------------------------------ 8-bit codes */

/* Four codes in the low lanes, read through memcpy as p has no
 * alignment. */
ZS__FORCE_INLINE uint8x8_t zv_load_codes(const void *p) {
  uint32_t w;
  memcpy(&w, p, 4);
  return vreinterpret_u8_u32(vdup_n_u32(w));
}
ZS__FORCE_INLINE zv_f32 zv_load_i8(const int8_t *p) {
  int16x8_t h = vmovl_s8(vreinterpret_s8_u8(zv_load_codes(p)));
  return vcvtq_f32_s32(vmovl_s16(vget_low_s16(h)));
}
ZS__FORCE_INLINE zv_f32 zv_load_u8(const uint8_t *p) {
  uint16x8_t h = vmovl_u8(zv_load_codes(p));
  return vcvtq_f32_u32(vmovl_u16(vget_low_u16(h)));
}

/* The square root is correctly rounded: within 2^-15 of sqrt(t). */
ZS__FORCE_INLINE zv_f32 zv_sqrt_est_add(zv_f32 t, zv_f32 c) {
  return vaddq_f32(vsqrtq_f32(t), c);
}
ZS__FORCE_INLINE zv_i32 zv_cvtt(zv_f32 x) { return vcvtq_s32_f32(x); }
ZS__FORCE_INLINE zv_f32 zv_i32_f32(zv_i32 q) { return vcvtq_f32_s32(q); }
/* A true compare lane is all ones, which is -1. */
ZS__FORCE_INLINE zv_i32 zv_inc_where(zv_i32 q, zv_mask k) {
  return vsubq_s32(q, vreinterpretq_s32_u32(k));
}
ZS__FORCE_INLINE zv_i32 zv_sign_code(zv_i32 q, zv_f32 x) {
  return vbslq_s32(vcltq_f32(x, vdupq_n_f32(0.0f)), vnegq_s32(q), q);
}
/* The low byte of each lane (codes are in range already), written through
 * memcpy as p has no alignment. */
ZS__FORCE_INLINE void zv_store_i8(int8_t *p, zv_i32 q) {
  int16x4_t h = vmovn_s32(q);
  int32_t w = vget_lane_s32(vreinterpret_s32_s8(vmovn_s16(vcombine_s16(h, h))), 0);
  memcpy(p, &w, 4);
}
ZS__FORCE_INLINE void zv_store_u8(uint8_t *p, zv_i32 q) {
  zv_store_i8((int8_t *)p, q);
}

/* ------------------------------------------------ float64 lanes (2) */

ZS__FORCE_INLINE zv_f64 zv_f64_zero(void) { return vdupq_n_f64(0.0); }
ZS__FORCE_INLINE zv_f64 zv_f64_lo(zv_f32 x) { return vcvt_f64_f32(vget_low_f32(x)); }
ZS__FORCE_INLINE zv_f64 zv_f64_hi(zv_f32 x) { return vcvt_high_f64_f32(x); }
ZS__FORCE_INLINE zv_f64 zv_f64_fma(zv_f64 a, zv_f64 b, zv_f64 c) {
  return vfmaq_f64(c, a, b);
}
ZS__FORCE_INLINE void zv_f64_store(double *p, zv_f64 x) { vst1q_f64(p, x); }

#endif
