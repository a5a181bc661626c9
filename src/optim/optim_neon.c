/* optim_neon.c - AArch64 Advanced SIMD kernels, 4 floats per vector. The
 * same operations in the same order as optim_scalar.c (vfmaq_f32 where it
 * calls zs__fmaf), so results match the scalar reference and the x86 paths
 * bit for bit; max/min follow the x86 MAXPS/MINPS rule via compare+select.
 * Built only for arm64 (the build drops *_neon.c elsewhere). */
#include <arm_neon.h>

#include "optim/optim_internal.h"

#define W 4

ZS__FORCE_INLINE float32x4_t ld(const void *base, int dt, size_t i) {
  if (dt == ZS_DTYPE_F32) return vld1q_f32((const float *)base + i);
  if (dt == ZS_DTYPE_BF16)
    return vreinterpretq_f32_u32(
        vshll_n_u16(vld1_u16((const uint16_t *)base + i), 16));
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)base + i)));
}

ZS__FORCE_INLINE void st(void *base, int dt, size_t i, float32x4_t x) {
  uint16x4_t o;
  if (dt == ZS_DTYPE_F32) {
    vst1q_f32((float *)base + i, x);
    return;
  }
  if (dt == ZS_DTYPE_BF16) {
    /* Round to nearest even on the bits; NaN becomes a quiet NaN. */
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

/* x86 MAXPS/MINPS: a if a > b (a < b), else b. */
ZS__FORCE_INLINE float32x4_t vmaxps(float32x4_t a, float32x4_t b) {
  return vbslq_f32(vcgtq_f32(a, b), a, b);
}
ZS__FORCE_INLINE float32x4_t vminps(float32x4_t a, float32x4_t b) {
  return vbslq_f32(vcltq_f32(a, b), a, b);
}
#define DUP vdupq_n_f32

/* ------------------------------------------------------------------ Adam */

/* The Adam update of one vector, in two parts: the moments (g, p in; m,
 * v updated; returns s = sqrt(v)), then the parameter from m and s (see
 * optim_scalar.c). */
ZS__FORCE_INLINE float32x4_t adam_moments(const zs__optim_args *a,
                                          float32x4_t g, float32x4_t p,
                                          float32x4_t *m, float32x4_t *v) {
  float32x4_t s;
  if (a->l2) g = vfmaq_f32(g, DUP(a->wd), p);
  *m = vfmaq_f32(vmulq_f32(DUP(a->omb1), g), DUP(a->b1), *m);
  *v = vfmaq_f32(vmulq_f32(DUP(a->b2), *v), vmulq_f32(DUP(a->omb2), g), g);
  s = vsqrtq_f32(*v);
  if (a->clamp) {
    float32x4_t lim = vmulq_f32(DUP(a->clampc), s);
    *m = vmaxps(*m, vnegq_f32(lim));
    *m = vminps(*m, lim);
  }
  return s;
}

ZS__FORCE_INLINE float32x4_t adam_param(const zs__optim_args *a,
                                        float32x4_t p, float32x4_t m,
                                        float32x4_t s) {
  float32x4_t den = vfmaq_f32(DUP(a->eps), s, DUP(a->rbc2));
  p = vmulq_f32(p, DUP(a->decay));
  return vfmaq_f32(p, DUP(a->neg_step), vdivq_f32(m, den));
}

ZS__FORCE_INLINE void adam_body(const zs__optim_args *a, size_t i) {
  float32x4_t g = vmulq_f32(ld(a->grad, a->gd, i), DUP(a->gs));
  float32x4_t p = ld(a->param, a->pd, i);
  float32x4_t m = ld(a->m, a->sd, i);
  float32x4_t v = ld(a->v, a->sd, i);
  float32x4_t s = adam_moments(a, g, p, &m, &v); /* before m is read below */
  p = adam_param(a, p, m, s);
  st(a->param, a->pd, i, p);
  st(a->m, a->sd, i, m);
  st(a->v, a->sd, i, v);
  if (a->out) st(a->out, a->od, i, p);
}

static void adam_span(const zs__optim_args *a, size_t n) {
  size_t i = 0;
  {
    zs__optim_args s = *a; /* private, never escapes: see optim_avx2.c */
    for (; i + W <= n; i += W) adam_body(&s, i);
  }
  if (i < n) zs__optim_tail(a, i, n - i, adam_body);
}

/* ------------------------------------------------------- 8-bit Adam */

static float hmax(float32x4_t x) {
  float l[W], r = 0.0f;
  int k;
  vst1q_f32(l, x);
  for (k = 0; k < W; k++) r = zs__maxps(l[k], r);
  return r;
}

/* Pass 1 of a block (zs__q8_ops.moments): dequantize in registers, update
 * the moments, keep the maxima. */
static void q8_moments(const zs__optim_args *a, const int8_t *mq, float ms,
                       const uint8_t *vq, float vs, float *mt, float *st_,
                       float *mmax, float *smax) {
  zs__optim_args s = *a; /* private, never escapes: see optim_avx2.c */
  float32x4_t mx = DUP(0.0f), sx = DUP(0.0f);
  size_t j;
  for (j = 0; j < ZS_OPTIM_QBLOCK; j += W) {
    int32_t cm[4] = {mq[j], mq[j + 1], mq[j + 2], mq[j + 3]};
    uint32_t cv[4] = {vq[j], vq[j + 1], vq[j + 2], vq[j + 3]};
    float32x4_t t = vmulq_f32(vcvtq_f32_s32(vld1q_s32(cm)), DUP(ZS__Q_INV127));
    float32x4_t u = vmulq_f32(vcvtq_f32_u32(vld1q_u32(cv)), DUP(ZS__Q_INV255));
    float32x4_t sq = vmulq_f32(vmulq_f32(u, u), DUP(vs));
    float32x4_t m = vmulq_f32(vmulq_f32(t, vabsq_f32(t)), DUP(ms));
    float32x4_t v = vmulq_f32(sq, sq);
    float32x4_t g = vmulq_f32(ld(s.grad, s.gd, j), DUP(s.gs));
    float32x4_t p = s.l2 ? ld(s.param, s.pd, j) : DUP(0.0f);
    sq = adam_moments(&s, g, p, &m, &v);
    vst1q_f32(mt + j, m);
    vst1q_f32(st_ + j, sq);
    mx = vmaxps(vabsq_f32(m), mx);
    sx = vmaxps(sq, sx);
  }
  *mmax = hmax(mx);
  *smax = hmax(sx);
}

/* Q(t) of zs__q8_ops for FLT_MIN <= t <= 65025 * (1 + 2^-22): the square
 * root (exact here) as the estimate, then as optim_avx2.c. */
ZS__FORCE_INLINE int32x4_t q8_round(float32x4_t t) {
  int32x4_t q = vcvtq_s32_f32(vaddq_f32(vsqrtq_f32(t), DUP(ZS__Q_OFF)));
  float32x4_t h = vaddq_f32(vcvtq_f32_s32(q), DUP(0.5f));
  uint32x4_t up = vcgeq_f32(t, vmulq_f32(h, h)); /* all ones = -1 */
  return vsubq_s32(q, vreinterpretq_s32_u32(up));
}

/* Pass 2 (zs__q8_ops.finish): the parameter update and the codes of one
 * block in one loop. */
static void q8_finish(const zs__optim_args *a, const float *m, const float *s,
                      float mmax, float smax, int8_t *mq, uint8_t *vq) {
  zs__optim_args c = *a; /* private, never escapes: see optim_avx2.c */
  const float32x4_t cm = DUP(zs__q8_coef(mmax, 16129.0f));
  const float32x4_t cs = DUP(zs__q8_coef(smax, 65025.0f));
  size_t j;
  int k;
  for (j = 0; j < ZS_OPTIM_QBLOCK; j += W) {
    float32x4_t x = vld1q_f32(m + j), y = vld1q_f32(s + j);
    float32x4_t p = adam_param(&c, ld(c.param, c.pd, j), x, y);
    float32x4_t tm = vmaxps(vmulq_f32(vabsq_f32(x), cm), DUP(ZS__Q_TMIN));
    float32x4_t ts = vmaxps(vmulq_f32(y, cs), DUP(ZS__Q_TMIN));
    int32x4_t qm = q8_round(tm), qv = q8_round(ts);
    int32_t im[4];
    int32_t iv[4];
    st(c.param, c.pd, j, p);
    if (c.out) st(c.out, c.od, j, p);
    vst1q_s32(im, vbslq_s32(vcltq_f32(x, DUP(0.0f)), vnegq_s32(qm), qm));
    vst1q_s32(iv, qv);
    for (k = 0; k < W; k++) {
      mq[j + k] = (int8_t)im[k];
      vq[j + k] = (uint8_t)iv[k];
    }
  }
}

/* --------------------------------------------------------------- Adagrad */

ZS__FORCE_INLINE void adagrad_body(const zs__optim_args *a, size_t i) {
  float32x4_t g = vmulq_f32(ld(a->grad, a->gd, i), DUP(a->gs));
  float32x4_t p = ld(a->param, a->pd, i);
  float32x4_t v = ld(a->v, a->sd, i);
  float32x4_t den;
  if (a->l2) g = vfmaq_f32(g, DUP(a->wd), p);
  v = vfmaq_f32(v, g, g);
  den = vaddq_f32(vsqrtq_f32(v), DUP(a->eps));
  p = vfmaq_f32(p, DUP(a->neg_step), vdivq_f32(g, den));
  st(a->param, a->pd, i, p);
  st(a->v, a->sd, i, v);
  if (a->out) st(a->out, a->od, i, p);
}

static void adagrad(const zs__optim_args *a, size_t n) {
  size_t i = 0;
  {
    zs__optim_args s = *a;
    for (; i + W <= n; i += W) adagrad_body(&s, i);
  }
  if (i < n) zs__optim_tail(a, i, n - i, adagrad_body);
}

/* ------------------------------------------------------------------ Lion */

ZS__FORCE_INLINE void lion_body(const zs__optim_args *a, size_t i) {
  float32x4_t g = vmulq_f32(ld(a->grad, a->gd, i), DUP(a->gs));
  float32x4_t p = ld(a->param, a->pd, i);
  float32x4_t m = ld(a->m, a->sd, i);
  float32x4_t c = vfmaq_f32(vmulq_f32(DUP(a->omb1), g), DUP(a->b1), m);
  float32x4_t sg = vbslq_f32(vcgtq_f32(c, DUP(0.0f)), DUP(1.0f),
                             vbslq_f32(vcltq_f32(c, DUP(0.0f)), DUP(-1.0f), DUP(0.0f)));
  p = vmulq_f32(p, DUP(a->decay));
  p = vfmaq_f32(p, DUP(a->neg_step), sg);
  m = vfmaq_f32(vmulq_f32(DUP(a->omb2), g), DUP(a->b2), m);
  st(a->param, a->pd, i, p);
  st(a->m, a->sd, i, m);
  if (a->out) st(a->out, a->od, i, p);
}

static void lion(const zs__optim_args *a, size_t n) {
  size_t i = 0;
  {
    zs__optim_args s = *a;
    for (; i + W <= n; i += W) lion_body(&s, i);
  }
  if (i < n) zs__optim_tail(a, i, n - i, lion_body);
}

/* ------------------------------------------------------------ grad stats */

ZS__FORCE_INLINE void sq16(const void *g, int dt, size_t i, float32x4_t sc,
                           float64x2_t acc[8]) {
  int k;
  for (k = 0; k < 4; k++) {
    float32x4_t x = vmulq_f32(ld(g, dt, i + 4 * (size_t)k), sc);
    float64x2_t lo = vcvt_f64_f32(vget_low_f32(x));
    float64x2_t hi = vcvt_high_f64_f32(x);
    /* The products are exact, so FMA equals the scalar x*x + lane. */
    acc[2 * k] = vfmaq_f64(acc[2 * k], lo, lo);
    acc[2 * k + 1] = vfmaq_f64(acc[2 * k + 1], hi, hi);
  }
}

static double sumsq(const void *g, int dt, float scale, size_t begin,
                    size_t end) {
  float64x2_t acc[8];
  float32x4_t sc = DUP(scale);
  double lane[16], total = 0.0;
  size_t i = begin, es = zs__dtype_size(dt);
  int k;
  for (k = 0; k < 8; k++) acc[k] = vdupq_n_f64(0.0);
  for (; i + 16 <= end; i += 16) sq16(g, dt, i, sc, acc);
  if (i < end) {
    float pad[16];
    memset(pad, 0, sizeof pad);
    memcpy(pad, (const char *)g + i * es, (end - i) * es);
    sq16(pad, dt, 0, sc, acc);
  }
  for (k = 0; k < 8; k++) vst1q_f64(lane + 2 * k, acc[k]);
  for (k = 0; k < 16; k++) total += lane[k];
  return total;
}

const zs__optim_kernels zs__optim_neon = {
    "neon", adam_span, {q8_moments, q8_finish}, adagrad, lion, sumsq};
