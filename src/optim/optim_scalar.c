/* optim_scalar.c - the scalar reference kernels. Every operation here is
 * mirrored one for one by the vector kernels (optim_body.h): fmaf exactly
 * where they use a fused multiply-add, plain multiplies, divides and square
 * roots elsewhere, so all ISAs produce the same bits. Written element by
 * element for clarity; speed comes from the vector kernels. Adam's
 * arithmetic is the one copy in optim_adam.h, which the vector kernels run
 * too, here over the one-lane layer optim_vec_scalar.h. zs__fmaf
 * (optim_internal.h) is used instead of the C library's fmaf, which is not
 * always correctly rounded. This file defines only the zs__optim_scalar
 * table and calls nothing of the driver (optim.c). */

/* fmaf must stay fmaf and a*b+c must stay two roundings: forbid contraction
 * where the compiler supports the standard pragma (GCC ignores it, but GCC
 * does not contract in ISO C mode). Before the includes, so that it covers
 * the arithmetic of optim_adam.h too. */
#if defined(__clang__)
#  pragma STDC FP_CONTRACT OFF
#endif

#include "optim/optim_vec_scalar.h"

#include "optim/optim_adam.h"

static void scalar_adam(const zs__optim_args *a0, size_t n) {
  zs__optim_args own = *a0; /* private: stores through the buffers cannot alias it */
  const zs__optim_args *a = &own;
  size_t i;
  for (i = 0; i < n; i++) {
    float g = zs__load(a->grad, a->gd, i) * a->gs;
    float p = zs__load(a->param, a->pd, i);
    float m = zs__load(a->m, a->sd, i);
    float v = zs__load(a->v, a->sd, i);
    float s = adam_moments(a, g, p, &m, &v);
    p = adam_param(a, p, m, s);
    zs__store(a->param, a->pd, i, p);
    zs__store(a->m, a->sd, i, m);
    zs__store(a->v, a->sd, i, v);
    if (a->out) zs__store(a->out, a->od, i, p);
  }
}

static void scalar_q8_moments(const zs__optim_args *a, const int8_t *mq,
                              float ms, const uint8_t *vq, float vs,
                              float *mt, float *st, float *mmax,
                              float *smax) {
  float mx = 0.0f, sx = 0.0f;
  int i;
  for (i = 0; i < ZS_OPTIM_QBLOCK; i++) {
    float g = zs__load(a->grad, a->gd, (size_t)i) * a->gs;
    float p = a->l2 ? zs__load(a->param, a->pd, (size_t)i) : 0.0f;
    float m, v, s;
    zs__q8_dequant1(mq[i], ms, vq[i], vs, &m, &v);
    s = adam_moments(a, g, p, &m, &v);
    mt[i] = m;
    st[i] = s;
    mx = zs__maxps(fabsf(m), mx);
    sx = zs__maxps(s, sx);
  }
  *mmax = mx;
  *smax = sx;
}

static void scalar_q8_finish(const zs__optim_args *a, const float *mt,
                             const float *st, float mmax, float smax,
                             int8_t *mq, uint8_t *vq) {
  int i;
  for (i = 0; i < ZS_OPTIM_QBLOCK; i++) {
    float p = adam_param(a, zs__load(a->param, a->pd, (size_t)i), mt[i], st[i]);
    zs__store(a->param, a->pd, (size_t)i, p);
    if (a->out) zs__store(a->out, a->od, (size_t)i, p);
  }
  zs__q8_quant_block(mt, st, mmax, smax, mq, vq);
}

static void scalar_adagrad(const zs__optim_args *a0, size_t n) {
  zs__optim_args own = *a0; /* private (see scalar_adam) */
  const zs__optim_args *a = &own;
  size_t i;
  for (i = 0; i < n; i++) {
    float g = zs__load(a->grad, a->gd, i) * a->gs;
    float p = zs__load(a->param, a->pd, i);
    float v = zs__load(a->v, a->sd, i);
    float den;
    if (a->l2) g = zs__fmaf(a->wd, p, g);
    v = zs__fmaf(g, g, v);
    den = sqrtf(v) + a->eps;
    p = zs__fmaf(a->neg_step, g / den, p);
    zs__store(a->param, a->pd, i, p);
    zs__store(a->v, a->sd, i, v);
    if (a->out) zs__store(a->out, a->od, i, p);
  }
}

static void scalar_lion(const zs__optim_args *a0, size_t n) {
  zs__optim_args own = *a0; /* private (see scalar_adam) */
  const zs__optim_args *a = &own;
  size_t i;
  for (i = 0; i < n; i++) {
    float g = zs__load(a->grad, a->gd, i) * a->gs;
    float p = zs__load(a->param, a->pd, i);
    float m = zs__load(a->m, a->sd, i);
    float c = zs__fmaf(a->b1, m, a->omb1 * g);
    /* sign(c), 0 for 0 and NaN (as the vector compare-and-mask gives). */
    float sg = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
    p = p * a->decay;
    p = zs__fmaf(a->neg_step, sg, p);
    m = zs__fmaf(a->b2, m, a->omb2 * g);
    zs__store(a->param, a->pd, i, p);
    zs__store(a->m, a->sd, i, m);
    if (a->out) zs__store(a->out, a->od, i, p);
  }
}

static double scalar_sumsq(const void *g, int dt, float scale, size_t begin,
                           size_t end) {
  double lane[16] = {0}, total = 0.0;
  size_t i;
  int l;
  for (i = begin; i < end; i++) {
    double x = (double)(zs__load(g, dt, i) * scale);
    lane[(i - begin) % 16] += x * x; /* x*x is exact in float64 */
  }
  for (l = 0; l < 16; l++) total += lane[l];
  return total;
}

const zs__optim_kernels zs__optim_scalar = {
    "scalar", scalar_adam, {scalar_q8_moments, scalar_q8_finish},
    scalar_adagrad, scalar_lion, scalar_sumsq};
