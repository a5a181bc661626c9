/* optim_vec_scalar.h - the one-lane layer of the scalar reference
 * (optim_scalar.c): zv_f32 is a float and each operation the plain C one,
 * with zs__fmaf (correctly rounded, optim_internal.h) as the fused
 * multiply-add and the MAXPS/MINPS rule for max/min. It defines only the
 * operations optim_adam.h uses, so that the scalar reference runs the very
 * Adam arithmetic the vector kernels run; the rest of the scalar reference
 * is written element by element in optim_scalar.c. Included only by
 * optim_scalar.c. */
#ifndef ZS_OPTIM_VEC_SCALAR_H
#define ZS_OPTIM_VEC_SCALAR_H

#include <math.h>

#include "optim/optim_internal.h"

#define ZS__VW 1

typedef float zv_f32;

ZS__FORCE_INLINE zv_f32 zv_set1(float x) { return x; }
ZS__FORCE_INLINE zv_f32 zv_mul(zv_f32 a, zv_f32 b) { return a * b; }
ZS__FORCE_INLINE zv_f32 zv_div(zv_f32 a, zv_f32 b) { return a / b; }
ZS__FORCE_INLINE zv_f32 zv_fma(zv_f32 a, zv_f32 b, zv_f32 c) {
  return zs__fmaf(a, b, c);
}
ZS__FORCE_INLINE zv_f32 zv_sqrt(zv_f32 x) { return sqrtf(x); }
ZS__FORCE_INLINE zv_f32 zv_max(zv_f32 a, zv_f32 b) { return zs__maxps(a, b); }
ZS__FORCE_INLINE zv_f32 zv_min(zv_f32 a, zv_f32 b) { return zs__minps(a, b); }
ZS__FORCE_INLINE zv_f32 zv_neg(zv_f32 x) { return -x; }

#endif
