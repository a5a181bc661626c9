/* optim_adam.h - the Adam arithmetic of one lane group, written once for
 * the scalar reference and every vector ISA. It is spelled in the zv_
 * operations of a vector layer (listed in optim_body.h), which the file
 * including it has included first: optim_vec_scalar.h (zv_f32 is a float;
 * optim_scalar.c) or one of optim_vec_avx2.h, optim_vec_avx512.h,
 * optim_vec_neon.h (through optim_body.h). Each zv_fma is one fused
 * multiply-add (zs__fmaf in the scalar layer), every other operation one
 * IEEE fp32 rounding, so all ISAs compute the same bits; the fp32/bf16 span
 * runs both parts per element, the 8-bit blocks one per pass. Includes
 * nothing of the kernels, and no kernel file is included here: the
 * dependencies run layer -> this file -> kernel file. */
#ifndef ZS_OPTIM_ADAM_H
#define ZS_OPTIM_ADAM_H

#ifndef ZS__VW
#  error "include a vector layer (optim_vec_<isa>.h) before optim_adam.h"
#endif

#include "optim/optim_internal.h"

/* The moments: g (the scaled gradient) and p in, m and v updated (Adam's
 * L2 term when a->l2; 8-bit Adam's clamp |m| <= clampc * sqrt(v) when
 * a->clamp); returns s = sqrt(v). */
ZS__FORCE_INLINE zv_f32 adam_moments(const zs__optim_args *a, zv_f32 g,
                                     zv_f32 p, zv_f32 *m, zv_f32 *v) {
  zv_f32 s;
  if (a->l2) g = zv_fma(zv_set1(a->wd), p, g);
  *m = zv_fma(zv_set1(a->b1), *m, zv_mul(zv_set1(a->omb1), g));
  *v = zv_fma(zv_mul(zv_set1(a->omb2), g), g, zv_mul(zv_set1(a->b2), *v));
  s = zv_sqrt(*v);
  if (a->clamp) {
    zv_f32 lim = zv_mul(zv_set1(a->clampc), s);
    *m = zv_max(*m, zv_neg(lim));
    *m = zv_min(*m, lim);
  }
  return s;
}

/* The parameter from the updated m and s = sqrt(v): decoupled decay, then
 * p + neg_step * m / (s / sqrt(bc2) + eps). */
ZS__FORCE_INLINE zv_f32 adam_param(const zs__optim_args *a, zv_f32 p,
                                   zv_f32 m, zv_f32 s) {
  zv_f32 den = zv_fma(s, zv_set1(a->rbc2), zv_set1(a->eps));
  p = zv_mul(p, zv_set1(a->decay));
  return zv_fma(zv_set1(a->neg_step), zv_div(m, den), p);
}

#endif
