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

ZS__FORCE_INLINE void adam_body(const zs__optim_args *a, size_t i) {
  float32x4_t g = vmulq_f32(ld(a->grad, a->gd, i), DUP(a->gs));
  float32x4_t p = ld(a->param, a->pd, i);
  float32x4_t m = ld(a->m, a->sd, i);
  float32x4_t v = ld(a->v, a->sd, i);
  float32x4_t s, den;
  if (a->l2) g = vfmaq_f32(g, DUP(a->wd), p);
  m = vfmaq_f32(vmulq_f32(DUP(a->omb1), g), DUP(a->b1), m);
  v = vfmaq_f32(vmulq_f32(DUP(a->b2), v), vmulq_f32(DUP(a->omb2), g), g);
  s = vsqrtq_f32(v);
  if (a->clamp) {
    float32x4_t lim = vmulq_f32(DUP(a->clampc), s);
    m = vmaxps(m, vnegq_f32(lim));
    m = vminps(m, lim);
  }
  den = vfmaq_f32(DUP(a->eps), s, DUP(a->rbc2));
  p = vmulq_f32(p, DUP(a->decay));
  p = vfmaq_f32(p, DUP(a->neg_step), vdivq_f32(m, den));
  st(a->param, a->pd, i, p);
  st(a->m, a->sd, i, m);
  st(a->v, a->sd, i, a->store_s ? s : v);
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

static void dequant(const int8_t *mq, float ms, const uint8_t *vq, float vs,
                    float *m, float *v) {
  int j;
  for (j = 0; j < ZS_OPTIM_QBLOCK; j += W) {
    int32_t cm[4] = {mq[j], mq[j + 1], mq[j + 2], mq[j + 3]};
    uint32_t cv[4] = {vq[j], vq[j + 1], vq[j + 2], vq[j + 3]};
    float32x4_t t = vmulq_f32(vcvtq_f32_s32(vld1q_s32(cm)), DUP(ZS__Q_INV127));
    float32x4_t u = vmulq_f32(vcvtq_f32_u32(vld1q_u32(cv)), DUP(ZS__Q_INV255));
    float32x4_t s = vmulq_f32(vmulq_f32(u, u), DUP(vs));
    vst1q_f32(m + j, vmulq_f32(vmulq_f32(t, vabsq_f32(t)), DUP(ms)));
    vst1q_f32(v + j, vmulq_f32(s, s));
  }
}

static float hmax(float32x4_t x) {
  float l[W], r = 0.0f;
  int k;
  vst1q_f32(l, x);
  for (k = 0; k < W; k++) r = zs__maxps(l[k], r);
  return r;
}

static void quant(const float *m, const float *v_sqrt, int8_t *mq, float *ms,
                  uint8_t *vq, float *vs) {
  float32x4_t mx = DUP(0.0f), sx = DUP(0.0f), minv, sinv;
  float mmax, smax;
  int j, k;
  for (j = 0; j < ZS_OPTIM_QBLOCK; j += W) {
    mx = vmaxps(vabsq_f32(vld1q_f32(m + j)), mx);
    sx = vmaxps(vld1q_f32(v_sqrt + j), sx);
  }
  mmax = hmax(mx);
  smax = hmax(sx);
  minv = DUP(mmax > 0.0f ? 1.0f / mmax : 0.0f);
  sinv = DUP(smax > 0.0f ? 1.0f / smax : 0.0f);
  for (j = 0; j < ZS_OPTIM_QBLOCK; j += W) {
    float32x4_t x = vld1q_f32(m + j);
    float32x4_t qm = vmulq_f32(vsqrtq_f32(vmulq_f32(vabsq_f32(x), minv)), DUP(127.0f));
    float32x4_t qv = vmulq_f32(vsqrtq_f32(vmulq_f32(vld1q_f32(v_sqrt + j), sinv)),
                               DUP(255.0f));
    int32_t im[4];
    int32_t iv[4];
    qm = vminps(vrndnq_f32(qm), DUP(127.0f));
    qv = vminps(vrndnq_f32(qv), DUP(255.0f));
    vst1q_s32(im, vbslq_s32(vcltq_f32(x, DUP(0.0f)), vnegq_s32(vcvtq_s32_f32(qm)),
                            vcvtq_s32_f32(qm)));
    vst1q_s32(iv, vcvtq_s32_f32(qv));
    for (k = 0; k < W; k++) {
      mq[j + k] = (int8_t)im[k];
      vq[j + k] = (uint8_t)iv[k];
    }
  }
  *ms = mmax;
  *vs = smax;
}

static const zs__q8_ops q8_ops = {adam_span, dequant, quant};

static void adam(const zs__optim_args *a, size_t begin, size_t end) {
  zs__optim_args s;
  if (a->sd == ZS_DTYPE_Q8) {
    zs__adam_q8_run(&q8_ops, a, begin, end);
    return;
  }
  s = zs__optim_offset(a, begin);
  adam_span(&s, end - begin);
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

static void adagrad(const zs__optim_args *a0, size_t begin, size_t end) {
  const zs__optim_args t = zs__optim_offset(a0, begin);
  size_t i = 0, n = end - begin;
  {
    zs__optim_args s = t;
    for (; i + W <= n; i += W) adagrad_body(&s, i);
  }
  if (i < n) zs__optim_tail(&t, i, n - i, adagrad_body);
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

static void lion(const zs__optim_args *a0, size_t begin, size_t end) {
  const zs__optim_args t = zs__optim_offset(a0, begin);
  size_t i = 0, n = end - begin;
  {
    zs__optim_args s = t;
    for (; i + W <= n; i += W) lion_body(&s, i);
  }
  if (i < n) zs__optim_tail(&t, i, n - i, lion_body);
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

const zs__optim_kernels zs__optim_neon = {"neon", adam, adagrad, lion, sumsq};
