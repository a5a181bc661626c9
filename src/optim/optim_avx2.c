/* optim_avx2.c - AVX2 + FMA + F16C kernels, 8 floats per vector. Each
 * body performs exactly the operations of optim_scalar.c in the same order
 * (one _mm256_fmadd_ps per fmaf), so results match the scalar reference bit
 * for bit; tails run the same body on zero-padded copies. Compiled with
 * -mavx2 -mfma -mf16c by the build; called only when zs_simd_level() says
 * the CPU has them. */
#include <immintrin.h>

#include "optim/optim_internal.h"

#define W 8

ZS__FORCE_INLINE __m256 ld(const void *base, int dt, size_t i) {
  __m128i h;
  if (dt == ZS_DTYPE_F32) return _mm256_loadu_ps((const float *)base + i);
  h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + i));
  if (dt == ZS_DTYPE_BF16)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

ZS__FORCE_INLINE void st(void *base, int dt, size_t i, __m256 x) {
  __m128i o;
  if (dt == ZS_DTYPE_F32) {
    _mm256_storeu_ps((float *)base + i, x);
    return;
  }
  if (dt == ZS_DTYPE_BF16) {
    /* Round to nearest even on the bits; NaN becomes a quiet NaN. */
    __m256i b = _mm256_castps_si256(x);
    __m256i hi = _mm256_srli_epi32(b, 16);
    __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb),
        16);
    __m256i q = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    r = _mm256_blendv_epi8(r, q, _mm256_castps_si256(nan));
    o = _mm_packus_epi32(_mm256_castsi256_si128(r),
                         _mm256_extracti128_si256(r, 1));
  } else {
    o = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
  }
  _mm_storeu_si128((__m128i *)((uint16_t *)base + i), o);
}

static inline __m256 vabs(__m256 x) {
  return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
}

/* ------------------------------------------------------------------ Adam */

/* The Adam update of one vector, in two parts: the moments (g, p in; m,
 * v updated; returns s = sqrt(v)), then the parameter from m and s (see
 * optim_scalar.c). */
ZS__FORCE_INLINE __m256 adam_moments(const zs__optim_args *a, __m256 g,
                                     __m256 p, __m256 *m, __m256 *v) {
  __m256 s;
  if (a->l2) g = _mm256_fmadd_ps(_mm256_set1_ps(a->wd), p, g);
  *m = _mm256_fmadd_ps(_mm256_set1_ps(a->b1), *m,
                       _mm256_mul_ps(_mm256_set1_ps(a->omb1), g));
  *v = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(a->omb2), g), g,
                       _mm256_mul_ps(_mm256_set1_ps(a->b2), *v));
  s = _mm256_sqrt_ps(*v);
  if (a->clamp) {
    __m256 lim = _mm256_mul_ps(_mm256_set1_ps(a->clampc), s);
    *m = _mm256_max_ps(*m, _mm256_xor_ps(lim, _mm256_set1_ps(-0.0f)));
    *m = _mm256_min_ps(*m, lim);
  }
  return s;
}

ZS__FORCE_INLINE __m256 adam_param(const zs__optim_args *a, __m256 p,
                                   __m256 m, __m256 s) {
  __m256 den =
      _mm256_fmadd_ps(s, _mm256_set1_ps(a->rbc2), _mm256_set1_ps(a->eps));
  p = _mm256_mul_ps(p, _mm256_set1_ps(a->decay));
  return _mm256_fmadd_ps(_mm256_set1_ps(a->neg_step), _mm256_div_ps(m, den),
                         p);
}

ZS__FORCE_INLINE void adam_body(const zs__optim_args *a, size_t i) {
  __m256 g = _mm256_mul_ps(ld(a->grad, a->gd, i), _mm256_set1_ps(a->gs));
  __m256 p = ld(a->param, a->pd, i);
  __m256 m = ld(a->m, a->sd, i);
  __m256 v = ld(a->v, a->sd, i);
  __m256 s = adam_moments(a, g, p, &m, &v); /* before m is read below */
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
static float hmax(__m256 x) {
  __m128 y = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
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
  const __m256 i127 = _mm256_set1_ps(ZS__Q_INV127);
  const __m256 i255 = _mm256_set1_ps(ZS__Q_INV255);
  const __m256 vms = _mm256_set1_ps(ms), vvs = _mm256_set1_ps(vs);
  __m256 mx = _mm256_setzero_ps(), sx = _mm256_setzero_ps();
  size_t j;
  s.gd = gd;
  for (j = 0; j < ZS_OPTIM_QBLOCK; j += W) {
    __m128i cm = _mm_loadl_epi64((const __m128i *)(mq + j));
    __m128i cv = _mm_loadl_epi64((const __m128i *)(vq + j));
    __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(cm)), i127);
    __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(cv)), i255);
    __m256 sq = _mm256_mul_ps(_mm256_mul_ps(u, u), vvs);
    __m256 m = _mm256_mul_ps(_mm256_mul_ps(t, vabs(t)), vms);
    __m256 v = _mm256_mul_ps(sq, sq);
    /* g * 1 is g bit for bit (a NaN stays NaN), so skip the multiply */
    __m256 g = s.gs == 1.0f ? ld(s.grad, gd, j)
                            : _mm256_mul_ps(ld(s.grad, gd, j), _mm256_set1_ps(s.gs));
    __m256 p = s.l2 ? ld(s.param, s.pd, j) : _mm256_setzero_ps();
    sq = adam_moments(&s, g, p, &m, &v);
    _mm256_storeu_ps(mt + j, m);
    _mm256_storeu_ps(st_ + j, sq);
    mx = _mm256_max_ps(vabs(m), mx);
    sx = _mm256_max_ps(sq, sx);
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

/* Q(t) of zs__q8_ops for FLT_MIN <= t <= 65025 * (1 + 2^-22): the
 * estimate t * rsqrt(t), floor(estimate + ZS__Q_OFF) (q or q - 1), and one
 * exact compare against (q + 1/2)^2 (see optim_internal.h). */
ZS__FORCE_INLINE __m256i q8_round(__m256 t) {
  __m256i q = _mm256_cvttps_epi32(
      _mm256_fmadd_ps(t, _mm256_rsqrt_ps(t), _mm256_set1_ps(ZS__Q_OFF)));
  __m256 h = _mm256_add_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(0.5f));
  /* the compare's all-ones mask is -1 */
  return _mm256_sub_epi32(
      q, _mm256_castps_si256(_mm256_cmp_ps(t, _mm256_mul_ps(h, h), _CMP_GE_OQ)));
}

/* Pass 2 (zs__q8_ops.finish): the parameter update and the codes of one
 * block in one loop; param and out dtypes fixed. */
ZS__FORCE_INLINE void q8_finish_vectors(const zs__optim_args *a,
                                        const float *m, const float *s,
                                        float mmax, float smax, int8_t *mq,
                                        uint8_t *vq, int pd, int od) {
  zs__optim_args c = *a;
  const __m256 cm = _mm256_set1_ps(zs__q8_coef(mmax, 16129.0f));
  const __m256 cs = _mm256_set1_ps(zs__q8_coef(smax, 65025.0f));
  const __m256 tmin = _mm256_set1_ps(ZS__Q_TMIN);
  size_t j;
  for (j = 0; j < ZS_OPTIM_QBLOCK; j += W) {
    __m256 x = _mm256_loadu_ps(m + j), y = _mm256_loadu_ps(s + j);
    __m256 p = adam_param(&c, ld(c.param, pd, j), x, y);
    __m256i im = q8_round(_mm256_max_ps(_mm256_mul_ps(vabs(x), cm), tmin));
    __m256i iv = q8_round(_mm256_max_ps(_mm256_mul_ps(y, cs), tmin));
    __m128i w;
    st(c.param, pd, j, p);
    if (od != ZS_DTYPE_NONE) st(c.out, od, j, p);
    /* The sign of m onto the code: VPSIGND negates where the bits of x read
     * as a negative integer (sign bit set: m < 0, -0 and negative NaN,
     * whose codes are 0), keeps positive codes, and zeroes where x = +0
     * (whose code is 0 too). */
    im = _mm256_sign_epi32(im, _mm256_castps_si256(x));
    w = _mm_packs_epi32(_mm256_castsi256_si128(im), _mm256_extracti128_si256(im, 1));
    _mm_storel_epi64((__m128i *)(mq + j), _mm_packs_epi16(w, w));
    w = _mm_packus_epi32(_mm256_castsi256_si128(iv), _mm256_extracti128_si256(iv, 1));
    _mm_storel_epi64((__m128i *)(vq + j), _mm_packus_epi16(w, w));
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
  __m256 g = _mm256_mul_ps(ld(a->grad, a->gd, i), _mm256_set1_ps(a->gs));
  __m256 p = ld(a->param, a->pd, i);
  __m256 v = ld(a->v, a->sd, i);
  __m256 den;
  if (a->l2) g = _mm256_fmadd_ps(_mm256_set1_ps(a->wd), p, g);
  v = _mm256_fmadd_ps(g, g, v);
  den = _mm256_add_ps(_mm256_sqrt_ps(v), _mm256_set1_ps(a->eps));
  p = _mm256_fmadd_ps(_mm256_set1_ps(a->neg_step), _mm256_div_ps(g, den), p);
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
  __m256 g = _mm256_mul_ps(ld(a->grad, a->gd, i), _mm256_set1_ps(a->gs));
  __m256 p = ld(a->param, a->pd, i);
  __m256 m = ld(a->m, a->sd, i);
  __m256 zero = _mm256_setzero_ps();
  __m256 c = _mm256_fmadd_ps(_mm256_set1_ps(a->b1), m,
                             _mm256_mul_ps(_mm256_set1_ps(a->omb1), g));
  __m256 sg = _mm256_or_ps(
      _mm256_and_ps(_mm256_cmp_ps(c, zero, _CMP_GT_OQ), _mm256_set1_ps(1.0f)),
      _mm256_and_ps(_mm256_cmp_ps(c, zero, _CMP_LT_OQ), _mm256_set1_ps(-1.0f)));
  p = _mm256_mul_ps(p, _mm256_set1_ps(a->decay));
  p = _mm256_fmadd_ps(_mm256_set1_ps(a->neg_step), sg, p);
  m = _mm256_fmadd_ps(_mm256_set1_ps(a->b2), m,
                      _mm256_mul_ps(_mm256_set1_ps(a->omb2), g));
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

static inline void sq16(const void *g, int dt, size_t i, __m256 sc,
                        __m256d acc[4]) {
  __m256 x0 = _mm256_mul_ps(ld(g, dt, i), sc);
  __m256 x1 = _mm256_mul_ps(ld(g, dt, i + 8), sc);
  __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x0));
  __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x0, 1));
  __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(x1));
  __m256d d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(x1, 1));
  /* The products are exact, so FMA equals the scalar x*x + lane. */
  acc[0] = _mm256_fmadd_pd(d0, d0, acc[0]);
  acc[1] = _mm256_fmadd_pd(d1, d1, acc[1]);
  acc[2] = _mm256_fmadd_pd(d2, d2, acc[2]);
  acc[3] = _mm256_fmadd_pd(d3, d3, acc[3]);
}

static double sumsq(const void *g, int dt, float scale, size_t begin,
                    size_t end) {
  __m256d acc[4];
  __m256 sc = _mm256_set1_ps(scale);
  double lane[16], total = 0.0;
  size_t i = begin, es = zs__dtype_size(dt);
  int k;
  for (k = 0; k < 4; k++) acc[k] = _mm256_setzero_pd();
  for (; i + 16 <= end; i += 16) sq16(g, dt, i, sc, acc);
  if (i < end) {
    float pad[16];
    memset(pad, 0, sizeof pad);
    memcpy(pad, (const char *)g + i * es, (end - i) * es);
    sq16(pad, dt, 0, sc, acc);
  }
  for (k = 0; k < 4; k++) _mm256_storeu_pd(lane + 4 * k, acc[k]);
  for (k = 0; k < 16; k++) total += lane[k];
  return total;
}

const zs__optim_kernels zs__optim_avx2 = {
    "avx2", adam_span, {q8_moments, q8_finish}, adagrad, lion, sumsq};
