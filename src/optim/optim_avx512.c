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

ZS__FORCE_INLINE void adam_body(const zs__optim_args *a, size_t i) {
  __m512 g = _mm512_mul_ps(ld(a->grad, a->gd, i), _mm512_set1_ps(a->gs));
  __m512 p = ld(a->param, a->pd, i);
  __m512 m = ld(a->m, a->sd, i);
  __m512 v = ld(a->v, a->sd, i);
  __m512 s, den;
  if (a->l2) g = _mm512_fmadd_ps(_mm512_set1_ps(a->wd), p, g);
  m = _mm512_fmadd_ps(_mm512_set1_ps(a->b1), m,
                      _mm512_mul_ps(_mm512_set1_ps(a->omb1), g));
  v = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(a->omb2), g), g,
                      _mm512_mul_ps(_mm512_set1_ps(a->b2), v));
  s = _mm512_sqrt_ps(v);
  if (a->clamp) {
    __m512 lim = _mm512_mul_ps(_mm512_set1_ps(a->clampc), s);
    m = _mm512_max_ps(m, _mm512_xor_ps(lim, _mm512_set1_ps(-0.0f)));
    m = _mm512_min_ps(m, lim);
  }
  den = _mm512_fmadd_ps(s, _mm512_set1_ps(a->rbc2), _mm512_set1_ps(a->eps));
  p = _mm512_mul_ps(p, _mm512_set1_ps(a->decay));
  p = _mm512_fmadd_ps(_mm512_set1_ps(a->neg_step), _mm512_div_ps(m, den), p);
  st(a->param, a->pd, i, p);
  st(a->m, a->sd, i, m);
  st(a->v, a->sd, i, a->store_s ? s : v);
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
  /* Specialized: the common master-weight cases (also the 8-bit scratch). */
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

static void dequant(const int8_t *mq, float ms, const uint8_t *vq, float vs,
                    float *m, float *v) {
  const __m512 i127 = _mm512_set1_ps(ZS__Q_INV127);
  const __m512 i255 = _mm512_set1_ps(ZS__Q_INV255);
  const __m512 vms = _mm512_set1_ps(ms), vvs = _mm512_set1_ps(vs);
  int j;
  for (j = 0; j < ZS_OPTIM_QBLOCK; j += W) {
    __m128i cm = _mm_loadu_si128((const __m128i *)(mq + j));
    __m128i cv = _mm_loadu_si128((const __m128i *)(vq + j));
    __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(cm)), i127);
    __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(cv)), i255);
    __m512 s = _mm512_mul_ps(_mm512_mul_ps(u, u), vvs);
    _mm512_storeu_ps(m + j, _mm512_mul_ps(_mm512_mul_ps(t, vabs(t)), vms));
    _mm512_storeu_ps(v + j, _mm512_mul_ps(s, s));
  }
}

static float hmax(__m512 x) {
  float l[W], r = 0.0f;
  int k;
  _mm512_storeu_ps(l, x);
  for (k = 0; k < W; k++) r = zs__maxps(l[k], r);
  return r;
}

static void quant(const float *m, const float *v_sqrt, int8_t *mq, float *ms,
                  uint8_t *vq, float *vs) {
  __m512 mx = _mm512_setzero_ps(), sx = _mm512_setzero_ps();
  __m512 minv, sinv;
  const __m512 c127 = _mm512_set1_ps(127.0f), c255 = _mm512_set1_ps(255.0f);
  float mmax, smax;
  int j;
  for (j = 0; j < ZS_OPTIM_QBLOCK; j += W) {
    mx = _mm512_max_ps(vabs(_mm512_loadu_ps(m + j)), mx);
    sx = _mm512_max_ps(_mm512_loadu_ps(v_sqrt + j), sx);
  }
  mmax = hmax(mx);
  smax = hmax(sx);
  minv = _mm512_set1_ps(mmax > 0.0f ? 1.0f / mmax : 0.0f);
  sinv = _mm512_set1_ps(smax > 0.0f ? 1.0f / smax : 0.0f);
  for (j = 0; j < ZS_OPTIM_QBLOCK; j += W) {
    __m512 x = _mm512_loadu_ps(m + j);
    __m512 y = _mm512_loadu_ps(v_sqrt + j);
    __m512 qm = _mm512_mul_ps(_mm512_sqrt_ps(_mm512_mul_ps(vabs(x), minv)), c127);
    __m512 qv = _mm512_mul_ps(
        _mm512_sqrt_ps(_mm512_mul_ps(y, sinv)), c255);
    __m512i im, iv;
    qm = _mm512_min_ps(_mm512_roundscale_ps(qm, _MM_FROUND_TO_NEAREST_INT |
                                                    _MM_FROUND_NO_EXC), c127);
    qv = _mm512_min_ps(_mm512_roundscale_ps(qv, _MM_FROUND_TO_NEAREST_INT |
                                                    _MM_FROUND_NO_EXC), c255);
    im = _mm512_cvttps_epi32(qm);
    im = _mm512_mask_sub_epi32(
        im, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ),
        _mm512_setzero_si512(), im);
    iv = _mm512_cvttps_epi32(qv);
    _mm_storeu_si128((__m128i *)(mq + j), _mm512_cvtepi32_epi8(im));
    _mm_storeu_si128((__m128i *)(vq + j), _mm512_cvtepi32_epi8(iv));
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

static void adagrad(const zs__optim_args *a0, size_t begin, size_t end) {
  const zs__optim_args t = zs__optim_offset(a0, begin);
  size_t i = 0, n = end - begin;
  {
    zs__optim_args s = t; /* private, never escapes (see adam_span) */
    for (; i + W <= n; i += W) adagrad_body(&s, i);
  }
  if (i < n) zs__optim_tail(&t, i, n - i, adagrad_body);
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

static void lion(const zs__optim_args *a0, size_t begin, size_t end) {
  const zs__optim_args t = zs__optim_offset(a0, begin);
  size_t i = 0, n = end - begin;
  {
    zs__optim_args s = t; /* private, never escapes (see adam_span) */
    for (; i + W <= n; i += W) lion_body(&s, i);
  }
  if (i < n) zs__optim_tail(&t, i, n - i, lion_body);
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

const zs__optim_kernels zs__optim_avx512 = {"avx512", adam, adagrad, lion,
                                            sumsq};
