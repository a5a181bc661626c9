/* optim_avx512.c - AVX-512 (F+BW+VL+DQ) kernels, 16 floats per vector. The
 * same operations in the same order as optim_scalar.c and optim_avx2.c, so
 * all three agree bit for bit; tails run the body on zero-padded copies.
 * Compiled with the AVX-512 flags by the build; called only when
 * zs_simd_level() reports AVX512. */
#include <immintrin.h>

#include "optim/optim_internal.h"

#define W 16

ZS__FORCE_INLINE __m512 ld(const void *base, int dt, size_t i) {
  __m256i h;
  if (dt == ZS_DTYPE_F32) return _mm512_loadu_ps((const float *)base + i);
  h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i));
  if (dt == ZS_DTYPE_BF16)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  return _mm512_cvtph_ps(h);
}

ZS__FORCE_INLINE void st(void *base, int dt, size_t i, __m512 x) {
  __m256i o;
  if (dt == ZS_DTYPE_F32) {
    _mm512_storeu_ps((float *)base + i, x);
    return;
  }
  if (dt == ZS_DTYPE_BF16) {
    /* Round to nearest even on the bits; NaN becomes a quiet NaN. */
    __m512i b = _mm512_castps_si512(x);
    __m512i hi = _mm512_srli_epi32(b, 16);
    __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), lsb),
        16);
    __m512i q = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_blend_epi32(nan, r, q);
    o = _mm512_cvtepi32_epi16(r);
  } else {
    o = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
  }
  _mm256_storeu_si256((__m256i *)((uint16_t *)base + i), o);
}

static inline __m512 vabs(__m512 x) {
  return _mm512_andnot_ps(_mm512_set1_ps(-0.0f), x);
}

/* ------------------------------------------------------------------ Adam */

/* The Adam update of one vector, in two parts: the moments (g, p in; m,
 * v updated; returns s = sqrt(v)), then the parameter from m and s (see
 * optim_scalar.c). */
ZS__FORCE_INLINE __m512 adam_moments(const zs__optim_args *a, __m512 g,
                                     __m512 p, __m512 *m, __m512 *v) {
  __m512 s;
  if (a->l2) g = _mm512_fmadd_ps(_mm512_set1_ps(a->wd), p, g);
  *m = _mm512_fmadd_ps(_mm512_set1_ps(a->b1), *m,
                       _mm512_mul_ps(_mm512_set1_ps(a->omb1), g));
  *v = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(a->omb2), g), g,
                       _mm512_mul_ps(_mm512_set1_ps(a->b2), *v));
  s = _mm512_sqrt_ps(*v);
  if (a->clamp) {
    __m512 lim = _mm512_mul_ps(_mm512_set1_ps(a->clampc), s);
    *m = _mm512_max_ps(*m, _mm512_xor_ps(lim, _mm512_set1_ps(-0.0f)));
    *m = _mm512_min_ps(*m, lim);
  }
  return s;
}

ZS__FORCE_INLINE __m512 adam_param(const zs__optim_args *a, __m512 p,
                                   __m512 m, __m512 s) {
  __m512 den =
      _mm512_fmadd_ps(s, _mm512_set1_ps(a->rbc2), _mm512_set1_ps(a->eps));
  p = _mm512_mul_ps(p, _mm512_set1_ps(a->decay));
  return _mm512_fmadd_ps(_mm512_set1_ps(a->neg_step), _mm512_div_ps(m, den),
                         p);
}

ZS__FORCE_INLINE void adam_body(const zs__optim_args *a, size_t i) {
  __m512 g = _mm512_mul_ps(ld(a->grad, a->gd, i), _mm512_set1_ps(a->gs));
  __m512 p = ld(a->param, a->pd, i);
  __m512 m = ld(a->m, a->sd, i);
  __m512 v = ld(a->v, a->sd, i);
  __m512 s = adam_moments(a, g, p, &m, &v); /* before m is read below */
  p = adam_param(a, p, m, s);
  st(a->param, a->pd, i, p);
  st(a->m, a->sd, i, m);
  st(a->v, a->sd, i, v);
  if (a->out) st(a->out, a->od, i, p);
}

/* The full vectors of a span with the dtypes fixed: a private copy that
 * never escapes (stores through the buffer pointers cannot alias it, so the
 * constants stay in registers), and with constant dtypes the compiler drops
 * the per-vector dtype branches. Returns the number of elements done. */
ZS__FORCE_INLINE size_t adam_vectors(const zs__optim_args *a, size_t n,
                                     int pd, int gd, int sd, int od) {
  zs__optim_args s = *a;
  size_t i = 0;
  s.pd = pd, s.gd = gd, s.sd = sd, s.od = od;
  if (od == ZS_DTYPE_NONE) s.out = NULL;
  for (; i + W <= n; i += W) adam_body(&s, i);
  return i;
}

static void adam_span(const zs__optim_args *a, size_t n) {
  size_t i;
  int pd = a->pd, gd = a->gd, sd = a->sd, od = a->out ? a->od : ZS_DTYPE_NONE;
  /* Specialized: the common master-weight cases. */
  if (pd == ZS_DTYPE_F32 && gd == ZS_DTYPE_F32 && sd == ZS_DTYPE_F32 &&
      od == ZS_DTYPE_NONE)
    i = adam_vectors(a, n, ZS_DTYPE_F32, ZS_DTYPE_F32, ZS_DTYPE_F32, ZS_DTYPE_NONE);
  else if (pd == ZS_DTYPE_F32 && gd == ZS_DTYPE_BF16 && sd == ZS_DTYPE_F32 &&
           od == ZS_DTYPE_BF16)
    i = adam_vectors(a, n, ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F32, ZS_DTYPE_BF16);
  else if (pd == ZS_DTYPE_F32 && gd == ZS_DTYPE_F32 && sd == ZS_DTYPE_BF16 &&
           od == ZS_DTYPE_NONE)
    i = adam_vectors(a, n, ZS_DTYPE_F32, ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_NONE);
  else
    i = adam_vectors(a, n, pd, gd, sd, od);
  if (i < n) zs__optim_tail(a, i, n - i, adam_body);
}

/* ------------------------------------------------------- 8-bit Adam */

/* The largest lane of x, whose lanes are >= +0 and never NaN (so the order
 * of the maxima does not matter). A tree, not a loop over the lanes: the
 * requantization waits for it. */
static float hmax(__m512 x) {
  __m256 h = _mm256_max_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1));
  __m128 y = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  y = _mm_max_ps(y, _mm_movehl_ps(y, y));
  y = _mm_max_ss(y, _mm_shuffle_ps(y, y, 1));
  return _mm_cvtss_f32(y);
}

/* Pass 1 of a block (zs__q8_ops.moments): dequantize in registers, update
 * the moments, keep the maxima; the gradient dtype fixed as in
 * adam_vectors. */
ZS__FORCE_INLINE void q8_moments_vectors(const zs__optim_args *a,
                                         const int8_t *mq, float ms,
                                         const uint8_t *vq, float vs,
                                         float *mt, float *st_, float *mmax,
                                         float *smax, int gd) {
  zs__optim_args s = *a;
  const __m512 i127 = _mm512_set1_ps(ZS__Q_INV127);
  const __m512 i255 = _mm512_set1_ps(ZS__Q_INV255);
  const __m512 vms = _mm512_set1_ps(ms), vvs = _mm512_set1_ps(vs);
  __m512 mx = _mm512_setzero_ps(), sx = _mm512_setzero_ps();
  size_t j;
  s.gd = gd;
  for (j = 0; j < ZS_OPTIM_QBLOCK; j += W) {
    __m128i cm = _mm_loadu_si128((const __m128i *)(mq + j));
    __m128i cv = _mm_loadu_si128((const __m128i *)(vq + j));
    __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(cm)), i127);
    __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(cv)), i255);
    __m512 sq = _mm512_mul_ps(_mm512_mul_ps(u, u), vvs);
    __m512 m = _mm512_mul_ps(_mm512_mul_ps(t, vabs(t)), vms);
    __m512 v = _mm512_mul_ps(sq, sq);
    /* g * 1 is g bit for bit (a NaN stays NaN), so skip the multiply */
    __m512 g = s.gs == 1.0f ? ld(s.grad, gd, j)
                            : _mm512_mul_ps(ld(s.grad, gd, j), _mm512_set1_ps(s.gs));
    __m512 p = s.l2 ? ld(s.param, s.pd, j) : _mm512_setzero_ps();
    sq = adam_moments(&s, g, p, &m, &v);
    _mm512_storeu_ps(mt + j, m);
    _mm512_storeu_ps(st_ + j, sq);
    mx = _mm512_max_ps(vabs(m), mx);
    sx = _mm512_max_ps(sq, sx);
  }
  *mmax = hmax(mx);
  *smax = hmax(sx);
}

static void q8_moments(const zs__optim_args *a, const int8_t *mq, float ms,
                       const uint8_t *vq, float vs, float *mt, float *st_,
                       float *mmax, float *smax) {
  if (a->gd == ZS_DTYPE_F32)
    q8_moments_vectors(a, mq, ms, vq, vs, mt, st_, mmax, smax, ZS_DTYPE_F32);
  else if (a->gd == ZS_DTYPE_BF16)
    q8_moments_vectors(a, mq, ms, vq, vs, mt, st_, mmax, smax, ZS_DTYPE_BF16);
  else
    q8_moments_vectors(a, mq, ms, vq, vs, mt, st_, mmax, smax, a->gd);
}

/* Q(t) of zs__q8_ops for FLT_MIN <= t <= 65025 * (1 + 2^-22): as in
 * optim_avx2.c, with RSQRT14 (relative error < 2^-14) for the estimate. */
ZS__FORCE_INLINE __m512i q8_round(__m512 t) {
  __m512i q = _mm512_cvttps_epi32(
      _mm512_fmadd_ps(t, _mm512_rsqrt14_ps(t), _mm512_set1_ps(ZS__Q_OFF)));
  __m512 h = _mm512_add_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(0.5f));
  return _mm512_mask_add_epi32(
      q, _mm512_cmp_ps_mask(t, _mm512_mul_ps(h, h), _CMP_GE_OQ), q,
      _mm512_set1_epi32(1));
}

/* Pass 2 (zs__q8_ops.finish): the parameter update and the codes of one
 * block in one loop; param and out dtypes fixed. */
ZS__FORCE_INLINE void q8_finish_vectors(const zs__optim_args *a,
                                        const float *m, const float *s,
                                        float mmax, float smax, int8_t *mq,
                                        uint8_t *vq, int pd, int od) {
  zs__optim_args c = *a;
  const __m512 cm = _mm512_set1_ps(zs__q8_coef(mmax, 16129.0f));
  const __m512 cs = _mm512_set1_ps(zs__q8_coef(smax, 65025.0f));
  const __m512 tmin = _mm512_set1_ps(ZS__Q_TMIN);
  size_t j;
  for (j = 0; j < ZS_OPTIM_QBLOCK; j += W) {
    __m512 x = _mm512_loadu_ps(m + j), y = _mm512_loadu_ps(s + j);
    __m512 p = adam_param(&c, ld(c.param, pd, j), x, y);
    __m512i im = q8_round(_mm512_max_ps(_mm512_mul_ps(vabs(x), cm), tmin));
    __m512i iv = q8_round(_mm512_max_ps(_mm512_mul_ps(y, cs), tmin));
    st(c.param, pd, j, p);
    if (od != ZS_DTYPE_NONE) st(c.out, od, j, p);
    im = _mm512_mask_sub_epi32(
        im, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ),
        _mm512_setzero_si512(), im);
    _mm_storeu_si128((__m128i *)(mq + j), _mm512_cvtepi32_epi8(im));
    _mm_storeu_si128((__m128i *)(vq + j), _mm512_cvtepi32_epi8(iv));
  }
}

static void q8_finish(const zs__optim_args *a, const float *m, const float *s,
                      float mmax, float smax, int8_t *mq, uint8_t *vq) {
  int pd = a->pd, od = a->out ? a->od : ZS_DTYPE_NONE;
  if (pd == ZS_DTYPE_F32 && od == ZS_DTYPE_NONE)
    q8_finish_vectors(a, m, s, mmax, smax, mq, vq, ZS_DTYPE_F32, ZS_DTYPE_NONE);
  else if (pd == ZS_DTYPE_F32 && od == ZS_DTYPE_BF16)
    q8_finish_vectors(a, m, s, mmax, smax, mq, vq, ZS_DTYPE_F32, ZS_DTYPE_BF16);
  else
    q8_finish_vectors(a, m, s, mmax, smax, mq, vq, pd, od);
}

/* --------------------------------------------------------------- Adagrad */

ZS__FORCE_INLINE void adagrad_body(const zs__optim_args *a, size_t i) {
  __m512 g = _mm512_mul_ps(ld(a->grad, a->gd, i), _mm512_set1_ps(a->gs));
  __m512 p = ld(a->param, a->pd, i);
  __m512 v = ld(a->v, a->sd, i);
  __m512 den;
  if (a->l2) g = _mm512_fmadd_ps(_mm512_set1_ps(a->wd), p, g);
  v = _mm512_fmadd_ps(g, g, v);
  den = _mm512_add_ps(_mm512_sqrt_ps(v), _mm512_set1_ps(a->eps));
  p = _mm512_fmadd_ps(_mm512_set1_ps(a->neg_step), _mm512_div_ps(g, den), p);
  st(a->param, a->pd, i, p);
  st(a->v, a->sd, i, v);
  if (a->out) st(a->out, a->od, i, p);
}

static void adagrad(const zs__optim_args *a, size_t n) {
  size_t i = 0;
  {
    zs__optim_args s = *a; /* private, never escapes (see adam_span) */
    for (; i + W <= n; i += W) adagrad_body(&s, i);
  }
  if (i < n) zs__optim_tail(a, i, n - i, adagrad_body);
}

/* ------------------------------------------------------------------ Lion */

ZS__FORCE_INLINE void lion_body(const zs__optim_args *a, size_t i) {
  __m512 g = _mm512_mul_ps(ld(a->grad, a->gd, i), _mm512_set1_ps(a->gs));
  __m512 p = ld(a->param, a->pd, i);
  __m512 m = ld(a->m, a->sd, i);
  __m512 zero = _mm512_setzero_ps();
  __m512 c = _mm512_fmadd_ps(_mm512_set1_ps(a->b1), m,
                             _mm512_mul_ps(_mm512_set1_ps(a->omb1), g));
  __m512 sg = _mm512_mask_blend_ps(
      _mm512_cmp_ps_mask(c, zero, _CMP_GT_OQ),
      _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(c, zero, _CMP_LT_OQ),
                          _mm512_set1_ps(-1.0f)),
      _mm512_set1_ps(1.0f));
  p = _mm512_mul_ps(p, _mm512_set1_ps(a->decay));
  p = _mm512_fmadd_ps(_mm512_set1_ps(a->neg_step), sg, p);
  m = _mm512_fmadd_ps(_mm512_set1_ps(a->b2), m,
                      _mm512_mul_ps(_mm512_set1_ps(a->omb2), g));
  st(a->param, a->pd, i, p);
  st(a->m, a->sd, i, m);
  if (a->out) st(a->out, a->od, i, p);
}

static void lion(const zs__optim_args *a, size_t n) {
  size_t i = 0;
  {
    zs__optim_args s = *a; /* private, never escapes (see adam_span) */
    for (; i + W <= n; i += W) lion_body(&s, i);
  }
  if (i < n) zs__optim_tail(a, i, n - i, lion_body);
}

/* ------------------------------------------------------------ grad stats */

static inline void sq16(const void *g, int dt, size_t i, __m512 sc,
                        __m512d acc[2]) {
  __m512 x = _mm512_mul_ps(ld(g, dt, i), sc);
  __m512d d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  __m512d d1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
  /* The products are exact, so FMA equals the scalar x*x + lane. */
  acc[0] = _mm512_fmadd_pd(d0, d0, acc[0]);
  acc[1] = _mm512_fmadd_pd(d1, d1, acc[1]);
}

static double sumsq(const void *g, int dt, float scale, size_t begin,
                    size_t end) {
  __m512d acc[2];
  __m512 sc = _mm512_set1_ps(scale);
  double lane[16], total = 0.0;
  size_t i = begin, es = zs__dtype_size(dt);
  int k;
  acc[0] = acc[1] = _mm512_setzero_pd();
  for (; i + 16 <= end; i += 16) sq16(g, dt, i, sc, acc);
  if (i < end) {
    float pad[16];
    memset(pad, 0, sizeof pad);
    memcpy(pad, (const char *)g + i * es, (end - i) * es);
    sq16(pad, dt, 0, sc, acc);
  }
  _mm512_storeu_pd(lane, acc[0]);
  _mm512_storeu_pd(lane + 8, acc[1]);
  for (k = 0; k < 16; k++) total += lane[k];
  return total;
}

const zs__optim_kernels zs__optim_avx512 = {
    "avx512", adam_span, {q8_moments, q8_finish}, adagrad, lion, sumsq};
