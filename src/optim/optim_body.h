/* optim_body.h - the vector kernels, written once for every ISA. Each
 * per-ISA file (optim_avx2.c, optim_avx512.c, optim_neon.c) includes its
 * vector layer (optim_vec_<isa>.h) and then this body, which defines the
 * static kernels its zs__optim_kernels table points at; nothing else
 * includes it. Each kernel does exactly the operations of the scalar
 * reference (optim_scalar.c) in the same order: one zv_fma for each
 * zs__fmaf, plain multiplies, divides and square roots elsewhere, so every
 * ISA gives the scalar reference's bits. Adam's arithmetic is not repeated
 * here: both run the one copy in optim_adam.h. Tails run the same vector
 * body on zero-padded copies.
 *
 * The vector layer (optim_vec_neon.h; optim_vec_avx2.h and
 * optim_vec_avx512.h, which share optim_vec_x86.h) defines ZS__VW (fp32
 * lanes: 4, 8 or 16), the types zv_f32 (ZS__VW floats), zv_i32 (ZS__VW
 * int32), zv_mask (a compare result) and zv_f64 (ZS__VW / 2 doubles), and
 * these operations, each giving the same bits on every ISA:
 *   zv_set1(x), zv_add, zv_mul, zv_div, zv_sqrt   IEEE fp32, one rounding;
 *   zv_fma(a, b, c)        a * b + c with one rounding;
 *   zv_max(a, b), zv_min   the x86 MAXPS/MINPS rule: a if a > b (a < b),
 *                          else b (b when either is NaN);
 *   zv_abs, zv_neg         clear, flip the sign bit;
 *   zv_ge(a, b)            a >= b, false for NaN;
 *   zv_sign(x)             1 where x > 0, -1 where x < 0, 0 for +-0 and NaN;
 *   zv_load(base, dt, i), zv_store(base, dt, i, x)
 *                          ZS__VW elements of dtype dt at element i,
 *                          rounded to bf16/f16 as zs__store does;
 *   zv_hmax(x)             the largest lane, for lanes >= +0, never NaN;
 * for the 8-bit states:
 *   zv_load_i8(p), zv_load_u8(p)  ZS__VW codes as floats;
 *   zv_sqrt_est_add(t, c)  e + c for an estimate e of sqrt(t) within 0.1
 *                          for FLT_MIN <= t <= 65025 (1 + 2^-22);
 *   zv_cvtt(x), zv_i32_f32(q)     fp32 to int32 (truncating) and back;
 *   zv_inc_where(q, k)     q + 1 where k;
 *   zv_sign_code(q, x)     -q where x < 0, q where x > 0; lanes where x is
 *                          +-0 or NaN carry q = 0, whatever the rule;
 *   zv_store_i8(p, q), zv_store_u8(p, q)  the ZS__VW codes (in range);
 * and for the sum of squares in float64:
 *   zv_f64_zero(), zv_f64_lo(x), zv_f64_hi(x)  the low and high halves of
 *                          the lanes of x, widened; zv_f64_fma, zv_f64_store.
 * Everything an ISA needs to get those bits its own way (masks on AVX-512,
 * compare-and-select max on NEON) stays in its layer. */
#ifndef ZS_OPTIM_BODY_H
#define ZS_OPTIM_BODY_H

#ifndef ZS__VW
#  error "include a vector layer (optim_vec_<isa>.h) before optim_body.h"
#endif
#if 16 % ZS__VW != 0 || ZS_OPTIM_QBLOCK % ZS__VW != 0
#  error "ZS__VW must divide 16 and ZS_OPTIM_QBLOCK"
#endif

#include "optim/optim_adam.h"

/* ------------------------------------------------------------ spans */

/* A vector body: updates the ZS__VW elements starting at i. */
typedef void (*vec_body)(const zs__optim_args *a, size_t i);

/* Runs body once on zero-padded copies of the rem (< ZS__VW) elements at
 * i and copies the results back, so a tail gets exactly the body's
 * arithmetic. */
static void vec_tail(const zs__optim_args *a, size_t i, size_t rem,
                     vec_body body) {
  /* ZS__VW elements of up to 4 bytes each. */
  float pb[ZS__VW], gb[ZS__VW], mb[ZS__VW], vb[ZS__VW], ob[ZS__VW];
  size_t ps = zs__dtype_size(a->pd), gsz = zs__dtype_size(a->gd);
  size_t ssz = zs__dtype_size(a->sd);
  zs__optim_args t = *a;
  memset(pb, 0, sizeof pb);
  memset(gb, 0, sizeof gb);
  memset(mb, 0, sizeof mb);
  memset(vb, 0, sizeof vb);
  memcpy(pb, a->param + i * ps, rem * ps);
  memcpy(gb, a->grad + i * gsz, rem * gsz);
  t.param = (char *)pb;
  t.grad = (const char *)gb;
  if (a->m) {
    memcpy(mb, a->m + i * ssz, rem * ssz);
    t.m = (char *)mb;
  }
  if (a->v) {
    memcpy(vb, a->v + i * ssz, rem * ssz);
    t.v = (char *)vb;
  }
  if (a->out) t.out = (char *)ob;
  body(&t, 0);
  memcpy(a->param + i * ps, pb, rem * ps);
  if (a->m) memcpy(a->m + i * ssz, mb, rem * ssz);
  if (a->v) memcpy(a->v + i * ssz, vb, rem * ssz);
  if (a->out)
    memcpy(a->out + i * zs__dtype_size(a->od), ob,
           rem * zs__dtype_size(a->od));
}

/* Runs body over [0, n) with the dtypes fixed to pd, gd, sd, od: the full
 * vectors on a private copy of *a that never escapes (stores through the
 * buffer pointers cannot alias it, so the constants stay in registers),
 * then the tail. Inlined with a constant body and constant dtypes, the body
 * inlines into the loop without its per-vector dtype branches. */
ZS__FORCE_INLINE void vec_span_fixed(const zs__optim_args *a, size_t n,
                                     vec_body body, int pd, int gd, int sd,
                                     int od) {
  zs__optim_args s = *a;
  size_t i = 0;
  s.pd = pd, s.gd = gd, s.sd = sd, s.od = od;
  if (od == ZS_DTYPE_NONE) s.out = NULL;
  for (; i + ZS__VW <= n; i += ZS__VW) body(&s, i);
  if (i < n) vec_tail(a, i, n - i, body);
}

/* Runs body over [0, n), specialized for the common master-weight cases:
 * everything fp32; bf16 gradients in and bf16 weights out (offload); bf16
 * states. Other combinations keep the dtype branches. */
ZS__FORCE_INLINE void vec_span(const zs__optim_args *a, size_t n,
                               vec_body body) {
  int pd = a->pd, gd = a->gd, sd = a->sd, od = a->out ? a->od : ZS_DTYPE_NONE;
  if (pd == ZS_DTYPE_F32 && gd == ZS_DTYPE_F32 && sd == ZS_DTYPE_F32 &&
      od == ZS_DTYPE_NONE)
    vec_span_fixed(a, n, body, ZS_DTYPE_F32, ZS_DTYPE_F32, ZS_DTYPE_F32,
                   ZS_DTYPE_NONE);
  else if (pd == ZS_DTYPE_F32 && gd == ZS_DTYPE_BF16 && sd == ZS_DTYPE_F32 &&
           od == ZS_DTYPE_BF16)
    vec_span_fixed(a, n, body, ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F32,
                   ZS_DTYPE_BF16);
  else if (pd == ZS_DTYPE_F32 && gd == ZS_DTYPE_F32 && sd == ZS_DTYPE_BF16 &&
           od == ZS_DTYPE_NONE)
    vec_span_fixed(a, n, body, ZS_DTYPE_F32, ZS_DTYPE_F32, ZS_DTYPE_BF16,
                   ZS_DTYPE_NONE);
  else
    vec_span_fixed(a, n, body, pd, gd, sd, od);
}

/* ------------------------------------------------------------------ Adam */

/* The Adam update of one vector: adam_moments, then adam_param
 * (optim_adam.h, the arithmetic the scalar reference runs too). */
ZS__FORCE_INLINE void adam_body(const zs__optim_args *a, size_t i) {
  zv_f32 g = zv_mul(zv_load(a->grad, a->gd, i), zv_set1(a->gs));
  zv_f32 p = zv_load(a->param, a->pd, i);
  zv_f32 m = zv_load(a->m, a->sd, i);
  zv_f32 v = zv_load(a->v, a->sd, i);
  zv_f32 s = adam_moments(a, g, p, &m, &v); /* before m is read below */
  p = adam_param(a, p, m, s);
  zv_store(a->param, a->pd, i, p);
  zv_store(a->m, a->sd, i, m);
  zv_store(a->v, a->sd, i, v);
  if (a->out) zv_store(a->out, a->od, i, p);
}

static void adam(const zs__optim_args *a, size_t n) {
  vec_span(a, n, adam_body);
}

/* ------------------------------------------------------- 8-bit Adam */

/* Pass 1 of a block (zs__q8_ops.moments): dequantize in registers, update
 * the moments, keep the maxima; the gradient dtype fixed as in
 * vec_span. */
ZS__FORCE_INLINE void q8_moments_fixed(const zs__optim_args *a,
                                       const int8_t *mq, float ms,
                                       const uint8_t *vq, float vs,
                                       float *mt, float *st, float *mmax,
                                       float *smax, int gd) {
  zs__optim_args s = *a; /* private, never escapes (see vec_span) */
  const zv_f32 i127 = zv_set1(ZS__Q_INV127), i255 = zv_set1(ZS__Q_INV255);
  const zv_f32 vms = zv_set1(ms), vvs = zv_set1(vs);
  zv_f32 mx = zv_set1(0.0f), sx = zv_set1(0.0f);
  size_t j;
  s.gd = gd;
  for (j = 0; j < ZS_OPTIM_QBLOCK; j += ZS__VW) {
    zv_f32 t = zv_mul(zv_load_i8(mq + j), i127);
    zv_f32 u = zv_mul(zv_load_u8(vq + j), i255);
    zv_f32 sq = zv_mul(zv_mul(u, u), vvs);
    zv_f32 m = zv_mul(zv_mul(t, zv_abs(t)), vms);
    zv_f32 v = zv_mul(sq, sq);
    /* g * 1 is g bit for bit (a NaN stays NaN), so skip the multiply */
    zv_f32 g = s.gs == 1.0f ? zv_load(s.grad, gd, j)
                            : zv_mul(zv_load(s.grad, gd, j), zv_set1(s.gs));
    zv_f32 p = s.l2 ? zv_load(s.param, s.pd, j) : zv_set1(0.0f);
    sq = adam_moments(&s, g, p, &m, &v);
    zv_store(mt, ZS_DTYPE_F32, j, m);
    zv_store(st, ZS_DTYPE_F32, j, sq);
    mx = zv_max(zv_abs(m), mx);
    sx = zv_max(sq, sx);
  }
  *mmax = zv_hmax(mx);
  *smax = zv_hmax(sx);
}

static void q8_moments(const zs__optim_args *a, const int8_t *mq, float ms,
                       const uint8_t *vq, float vs, float *mt, float *st,
                       float *mmax, float *smax) {
  if (a->gd == ZS_DTYPE_F32)
    q8_moments_fixed(a, mq, ms, vq, vs, mt, st, mmax, smax, ZS_DTYPE_F32);
  else if (a->gd == ZS_DTYPE_BF16)
    q8_moments_fixed(a, mq, ms, vq, vs, mt, st, mmax, smax, ZS_DTYPE_BF16);
  else
    q8_moments_fixed(a, mq, ms, vq, vs, mt, st, mmax, smax, a->gd);
}

/* Q(t) of optim_internal.h for FLT_MIN <= t <= 65025 * (1 + 2^-22):
 * floor(estimate + ZS__Q_OFF) is q or q - 1, and one exact compare
 * against (q + 1/2)^2 decides. */
ZS__FORCE_INLINE zv_i32 q8_round(zv_f32 t) {
  zv_i32 q = zv_cvtt(zv_sqrt_est_add(t, zv_set1(ZS__Q_OFF)));
  zv_f32 h = zv_add(zv_i32_f32(q), zv_set1(0.5f));
  return zv_inc_where(q, zv_ge(t, zv_mul(h, h)));
}

/* Pass 2 (zs__q8_ops.finish): the parameter update and the codes of one
 * block in one loop; param and out dtypes fixed. */
ZS__FORCE_INLINE void q8_finish_fixed(const zs__optim_args *a,
                                      const float *m, const float *s,
                                      float mmax, float smax, int8_t *mq,
                                      uint8_t *vq, int pd, int od) {
  zs__optim_args c = *a; /* private, never escapes (see vec_span) */
  const zv_f32 cm = zv_set1(zs__q8_coef(mmax, 16129.0f));
  const zv_f32 cs = zv_set1(zs__q8_coef(smax, 65025.0f));
  const zv_f32 tmin = zv_set1(ZS__Q_TMIN);
  size_t j;
  for (j = 0; j < ZS_OPTIM_QBLOCK; j += ZS__VW) {
    zv_f32 x = zv_load(m, ZS_DTYPE_F32, j), y = zv_load(s, ZS_DTYPE_F32, j);
    zv_f32 p = adam_param(&c, zv_load(c.param, pd, j), x, y);
    zv_i32 im = q8_round(zv_max(zv_mul(zv_abs(x), cm), tmin));
    zv_i32 iv = q8_round(zv_max(zv_mul(y, cs), tmin));
    zv_store(c.param, pd, j, p);
    if (od != ZS_DTYPE_NONE) zv_store(c.out, od, j, p);
    zv_store_i8(mq + j, zv_sign_code(im, x));
    zv_store_u8(vq + j, iv);
  }
}

static void q8_finish(const zs__optim_args *a, const float *m, const float *s,
                      float mmax, float smax, int8_t *mq, uint8_t *vq) {
  int pd = a->pd, od = a->out ? a->od : ZS_DTYPE_NONE;
  if (pd == ZS_DTYPE_F32 && od == ZS_DTYPE_NONE)
    q8_finish_fixed(a, m, s, mmax, smax, mq, vq, ZS_DTYPE_F32, ZS_DTYPE_NONE);
  else if (pd == ZS_DTYPE_F32 && od == ZS_DTYPE_BF16)
    q8_finish_fixed(a, m, s, mmax, smax, mq, vq, ZS_DTYPE_F32, ZS_DTYPE_BF16);
  else
    q8_finish_fixed(a, m, s, mmax, smax, mq, vq, pd, od);
}

/* --------------------------------------------------------------- Adagrad */

ZS__FORCE_INLINE void adagrad_body(const zs__optim_args *a, size_t i) {
  zv_f32 g = zv_mul(zv_load(a->grad, a->gd, i), zv_set1(a->gs));
  zv_f32 p = zv_load(a->param, a->pd, i);
  zv_f32 v = zv_load(a->v, a->sd, i);
  zv_f32 den;
  if (a->l2) g = zv_fma(zv_set1(a->wd), p, g);
  v = zv_fma(g, g, v);
  den = zv_add(zv_sqrt(v), zv_set1(a->eps));
  p = zv_fma(zv_set1(a->neg_step), zv_div(g, den), p);
  zv_store(a->param, a->pd, i, p);
  zv_store(a->v, a->sd, i, v);
  if (a->out) zv_store(a->out, a->od, i, p);
}

static void adagrad(const zs__optim_args *a, size_t n) {
  vec_span(a, n, adagrad_body);
}

/* ------------------------------------------------------------------ Lion */

ZS__FORCE_INLINE void lion_body(const zs__optim_args *a, size_t i) {
  zv_f32 g = zv_mul(zv_load(a->grad, a->gd, i), zv_set1(a->gs));
  zv_f32 p = zv_load(a->param, a->pd, i);
  zv_f32 m = zv_load(a->m, a->sd, i);
  zv_f32 c = zv_fma(zv_set1(a->b1), m, zv_mul(zv_set1(a->omb1), g));
  zv_f32 sg = zv_sign(c);
  p = zv_mul(p, zv_set1(a->decay));
  p = zv_fma(zv_set1(a->neg_step), sg, p);
  m = zv_fma(zv_set1(a->b2), m, zv_mul(zv_set1(a->omb2), g));
  zv_store(a->param, a->pd, i, p);
  zv_store(a->m, a->sd, i, m);
  if (a->out) zv_store(a->out, a->od, i, p);
}

static void lion(const zs__optim_args *a, size_t n) {
  vec_span(a, n, lion_body);
}

/* ------------------------------------------------------------ grad stats */

/* The 16 elements at i into the 16 float64 lanes of acc (32 / ZS__VW
 * vectors of ZS__VW / 2 doubles): element i + k in lane k. */
ZS__FORCE_INLINE void sq16(const void *g, int dt, size_t i, zv_f32 sc,
                           zv_f64 *acc) {
  int k;
  for (k = 0; k < 16 / ZS__VW; k++) {
    zv_f32 x = zv_mul(zv_load(g, dt, i + (size_t)k * ZS__VW), sc);
    zv_f64 lo = zv_f64_lo(x), hi = zv_f64_hi(x);
    /* The products are exact, so FMA equals the scalar x*x + lane. */
    acc[2 * k] = zv_f64_fma(lo, lo, acc[2 * k]);
    acc[2 * k + 1] = zv_f64_fma(hi, hi, acc[2 * k + 1]);
  }
}

static double sumsq(const void *g, int dt, float scale, size_t begin,
                    size_t end) {
  zv_f64 acc[32 / ZS__VW];
  zv_f32 sc = zv_set1(scale);
  double lane[16], total = 0.0;
  size_t i = begin, es = zs__dtype_size(dt);
  int k;
  for (k = 0; k < 32 / ZS__VW; k++) acc[k] = zv_f64_zero();
  for (; i + 16 <= end; i += 16) sq16(g, dt, i, sc, acc);
  if (i < end) {
    float pad[16];
    memset(pad, 0, sizeof pad);
    memcpy(pad, (const char *)g + i * es, (end - i) * es);
    sq16(pad, dt, 0, sc, acc);
  }
  for (k = 0; k < 32 / ZS__VW; k++) zv_f64_store(lane + k * ZS__VW / 2, acc[k]);
  for (k = 0; k < 16; k++) total += lane[k];
  return total;
}

#endif
