/* Optimizer kernels against a float64 reference, on random data of odd
 * sizes, every dtype combination, 1..4 threads, under whatever SIMD level
 * ZSPEED_SIMD selects (ctest runs this binary once per level; a level the
 * CPU lacks skips, except the test that checks it is refused). Each step is
 * checked against the reference computed from the kernel's own previous
 * state, so the tolerance stays one step's worth (stated per dtype at
 * tol_for()); several steps are run per case. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim_internal.h"
#include "zs_internal.h"
#include "zt.h"

static const int kFloat[] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F16};
static const size_t kSizes[] = {0, 1, 7, 15, 16, 17, 1023, 40000};

static zs_pool *test_pool(void) {
  static zs_pool *pool;
  if (!pool && zs_pool_create(&pool, 3) != 0) return NULL;
  return pool;
}

/* Skips the test unless the SIMD level forced for this run is usable. */
#define REQUIRE_LEVEL()                                                      \
  do {                                                                       \
    int lvl_ = zs_simd_level();                                              \
    if (lvl_ < 0)                                                            \
      ZT_SKIP("ZSPEED_SIMD level not usable on this CPU: %s", zs_last_error()); \
  } while (0)

/* Data comes from a generator the tests can re-seed, so that determinism
 * tests can build identical inputs for several runs. */
static uint64_t g_state = 88172645463325252ull;
static double det_rand(void) {
  g_state ^= g_state >> 12, g_state ^= g_state << 25, g_state ^= g_state >> 27;
  return (double)((g_state * 2685821657736338717ull) >> 11) *
         (1.0 / 9007199254740992.0);
}
static double urand(double lo, double hi) { return lo + (hi - lo) * det_rand(); }

static double get(const void *b, int dt, size_t i) { return zs__load(b, dt, i); }
static void put(void *b, int dt, size_t i, double x) {
  zs__store(b, dt, i, (float)x);
}

/* Relative rounding error a stored value may carry on top of the fp32
 * computation: one rounding to the storage type (half an ulp, doubled to
 * cover a computed value lying right at a rounding boundary). */
static double store_rel(int dt) {
  return dt == ZS_DTYPE_BF16 ? 1.0 / 256 : dt == ZS_DTYPE_F16 ? 1.0 / 2048 : 0;
}

/* |got - want| <= tol, where tol = storage rounding of want + 2e-6 times
 * the magnitude of the terms that produced it (fp32 arithmetic: a few ulps
 * of the largest intermediate) + the f16 subnormal spacing. */
static int close_to(double got, double want, int dt, double terms) {
  double tol = store_rel(dt) * fabs(want) + 2e-6 * terms +
               (dt == ZS_DTYPE_F16 ? 6e-8 : 0) + 1e-30;
  return fabs(got - want) <= tol || (isnan(got) && isnan(want));
}

typedef struct {
  size_t n;
  int pd, gd, sd, od;
  void *p, *g, *m, *v, *out;
  float *ms, *vs;
} bufs;

static size_t esz(int dt) { return dt == ZS_DTYPE_Q8 ? 1 : zs__dtype_size(dt); }

static void bufs_free(bufs *b) {
  free(b->p);
  free(b->g);
  free(b->m);
  free(b->v);
  free(b->out);
  free(b->ms);
  free(b->vs);
  memset(b, 0, sizeof *b);
}

/* Random params in [-1, 1], grads in [-2, 2], states of the size a few
 * steps produce (m in [-0.3, 0.3], v in [0, 0.5]). */
static int bufs_alloc(bufs *b, size_t n, int pd, int gd, int sd, int od,
                      int need_m, int need_v) {
  size_t i, nb = zs_optim_qblocks(n) + 1;
  memset(b, 0, sizeof *b);
  b->n = n;
  b->pd = pd, b->gd = gd, b->sd = sd, b->od = od;
  b->p = malloc(n * 4 + 4);
  b->g = malloc(n * 4 + 4);
  if (need_m) b->m = malloc(n * 4 + 4);
  if (need_v) b->v = malloc(n * 4 + 4);
  if (od != ZS_DTYPE_NONE) b->out = calloc(n + 2, 2);
  if (sd == ZS_DTYPE_Q8) {
    b->ms = calloc(nb, 4);
    b->vs = calloc(nb, 4);
  }
  if (!b->p || !b->g || (need_m && !b->m) || (need_v && !b->v) ||
      (od != ZS_DTYPE_NONE && !b->out) ||
      (sd == ZS_DTYPE_Q8 && (!b->ms || !b->vs)))
    return -1;
  for (i = 0; i < n; i++) {
    put(b->p, pd, i, urand(-1, 1));
    put(b->g, gd, i, urand(-2, 2));
  }
  if (sd == ZS_DTYPE_Q8) {
    float *mf = malloc(n * 4 + 4), *vf = malloc(n * 4 + 4);
    if (!mf || !vf) return -1;
    for (i = 0; i < n; i++) {
      mf[i] = (float)urand(-0.3, 0.3);
      vf[i] = (float)urand(0, 0.5);
    }
    zs_adam_q8_quantize(mf, vf, n, b->m, b->ms, b->v, b->vs);
    free(mf);
    free(vf);
  } else {
    for (i = 0; i < n; i++) {
      if (need_m) put(b->m, sd, i, urand(-0.3, 0.3));
      if (need_v) put(b->v, sd, i, urand(0, 0.5));
    }
  }
  return 0;
}

static void bufs_tensors(const bufs *b, zs_optim_tensors *t) {
  zs_optim_tensors_init(t);
  t->n = b->n;
  t->param = b->p;
  t->param_dtype = b->pd;
  t->grad = b->g;
  t->grad_dtype = b->gd;
  t->m = b->m;
  t->v = b->v;
  t->state_dtype = b->sd;
  t->m_scale = b->ms;
  t->v_scale = b->vs;
  t->out = b->out;
  t->out_dtype = b->od;
}

/* States as doubles (dequantized for Q8). */
static int states_f64(const bufs *b, double *m, double *v) {
  size_t i, n = b->n;
  if (b->sd == ZS_DTYPE_Q8) {
    float *mf = malloc(n * 4 + 4), *vf = malloc(n * 4 + 4);
    if (!mf || !vf) return -1;
    zs_adam_q8_dequantize(b->m, b->ms, b->v, b->vs, n, mf, vf);
    for (i = 0; i < n; i++) m[i] = mf[i], v[i] = vf[i];
    free(mf);
    free(vf);
    return 0;
  }
  for (i = 0; i < n; i++) {
    if (m) m[i] = b->m ? get(b->m, b->sd, i) : 0;
    if (v) v[i] = b->v ? get(b->v, b->sd, i) : 0;
  }
  return 0;
}

/* ------------------------------------------------------------------ Adam */

/* One Adam step in float64 from the kernel's current state; checks it. */
static int adam_check_step(bufs *b, const zs_adam_config *c, char *why,
                           size_t whylen) {
  size_t n = b->n, i;
  double *m0 = malloc(n * 8 + 8), *v0 = malloc(n * 8 + 8);
  double *p0 = malloc(n * 8 + 8), *m1 = malloc(n * 8 + 8), *v1 = malloc(n * 8 + 8);
  double bc1 = 1, bc2 = 1, cl = INFINITY, qm[ZS_OPTIM_QBLOCK / 1] = {0};
  zs_optim_tensors t;
  int rc = -1;
  (void)qm;
  if (!m0 || !v0 || !p0 || !m1 || !v1) goto done;
  states_f64(b, m0, v0);
  for (i = 0; i < n; i++) p0[i] = get(b->p, b->pd, i);
  bufs_tensors(b, &t);
  if ((rc = zs_adam_step(c, &t)) != 0) {
    snprintf(why, whylen, "zs_adam_step: %s", zs_last_error());
    goto done;
  }
  rc = -1;
  states_f64(b, m1, v1);
  if (c->bias_correction) {
    bc1 = 1 - pow(c->beta1, (double)c->step);
    bc2 = 1 - pow(c->beta2, (double)c->step);
  }
  if (b->sd == ZS_DTYPE_Q8 && c->beta1 * c->beta1 < c->beta2)
    cl = (1 - c->beta1) /
         sqrt((1 - c->beta2) * (1 - c->beta1 * c->beta1 / c->beta2));
  for (i = 0; i < n; i++) {
    double g = get(b->g, b->gd, i) * c->grad_scale, p = p0[i], m, v, s, up;
    double terms;
    if (!c->adamw_mode) g += c->weight_decay * p;
    m = c->beta1 * m0[i] + (1 - c->beta1) * g;
    v = c->beta2 * v0[i] + (1 - c->beta2) * g * g;
    s = sqrt(v);
    if (m > cl * s) m = cl * s;
    if (m < -cl * s) m = -cl * s;
    if (c->adamw_mode) p *= 1 - c->lr * c->weight_decay;
    up = c->lr / bc1 * m / (s / sqrt(bc2) + c->eps);
    p -= up;
    /* m may be a small difference of large terms: its fp32 error scales
     * with |beta1 m0| + |(1-beta1) g|, and reaches p through lr/bc1/den. */
    terms = fabs(p0[i]) + fabs(up) +
            c->lr / bc1 * (fabs(m0[i]) + fabs(g)) / (s / sqrt(bc2) + c->eps);
    if (!close_to(get(b->p, b->pd, i), p, b->pd, terms)) {
      snprintf(why, whylen, "param[%zu] = %.9g, reference %.9g (was %.9g)", i,
               get(b->p, b->pd, i), p, p0[i]);
      goto done;
    }
    if (b->out && !close_to(get(b->out, b->od, i), p, b->od, terms)) {
      snprintf(why, whylen, "out[%zu] = %.9g, reference %.9g", i,
               get(b->out, b->od, i), p);
      goto done;
    }
    if (b->sd != ZS_DTYPE_Q8) {
      if (!close_to(m1[i], m, b->sd, fabs(m0[i]) + fabs(g)) ||
          !close_to(v1[i], v, b->sd, v0[i] + g * g)) {
        snprintf(why, whylen, "state[%zu]: m %.9g v %.9g, reference %.9g %.9g",
                 i, m1[i], v1[i], m, v);
        goto done;
      }
    } else {
      /* 8-bit: the error bound of the square maps (header of optim.h):
       * with d = 0.5/127 (m) or 0.5/255 (sqrt v) the code error, x = M t^2
       * moves by at most M (2 t d + d^2); M is the block maximum. */
      size_t b0 = i / ZS_OPTIM_QBLOCK * ZS_OPTIM_QBLOCK;
      double mm = b->ms[i / ZS_OPTIM_QBLOCK] * 1.0001;
      double sm = b->vs[i / ZS_OPTIM_QBLOCK] * 1.0001;
      double dm = 0.5 / 127, dv = 0.5 / 255, tm, tv, em, es;
      (void)b0;
      tm = sqrt(fabs(m) / (mm > 0 ? mm : 1));
      tv = sqrt(s / (sm > 0 ? sm : 1));
      em = mm * (2 * tm * dm + dm * dm) + 1e-6 * mm;
      es = sm * (2 * tv * dv + dv * dv) + 1e-6 * sm;
      if (fabs(m1[i] - m) > em || fabs(sqrt(v1[i]) - s) > es) {
        snprintf(why, whylen, "q8 state[%zu]: m %.9g v %.9g, reference %.9g "
                 "%.9g (bounds %.3g %.3g)", i, m1[i], v1[i], m, v, em, es);
        goto done;
      }
    }
  }
  rc = 0;
done:
  free(m0), free(v0), free(p0), free(m1), free(v1);
  return rc;
}

static void adam_reference_matrix(void) {
  int a, b, c, d, si, step;
  char why[256];
  REQUIRE_LEVEL();
  for (a = 0; a < 3; a++)
    for (b = 0; b < 3; b++)
      for (c = 0; c < 3; c++)
        for (d = 0; d < 3; d++)
          for (si = 0; si < (int)ZS_ARRAY_SIZE(kSizes); si++) {
            static const int sds[] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_Q8};
            static const int ods[] = {ZS_DTYPE_NONE, ZS_DTYPE_BF16, ZS_DTYPE_F16};
            bufs bf;
            zs_adam_config cfg;
            int variant = a + b + c + d + si;
            ZT_CHECK(bufs_alloc(&bf, kSizes[si], kFloat[a], kFloat[b], sds[c],
                                ods[d], 1, 1) == 0);
            zs_adam_config_init(&cfg);
            cfg.lr = 1e-2;
            cfg.weight_decay = variant % 3 == 0 ? 0 : 0.1;
            cfg.adamw_mode = variant % 2;
            cfg.bias_correction = variant % 4 != 1;
            cfg.grad_scale = variant % 5 == 0 ? 0.25 : 1.0;
            cfg.num_threads = 1 + variant % 4;
            cfg.pool = test_pool();
            for (step = 1; step <= 3; step++) {
              cfg.step = step;
              if (adam_check_step(&bf, &cfg, why, sizeof why) != 0) {
                bufs_free(&bf);
                ZT_CHECKF(0, "p=%d g=%d s=%d o=%d n=%zu step %d: %s", kFloat[a],
                          kFloat[b], sds[c], ods[d], kSizes[si], step, why);
              }
            }
            bufs_free(&bf);
          }
}

/* The largest size from the issue, a few representative combinations. */
static void adam_large(void) {
  static const int combos[][4] = {
      {ZS_DTYPE_F32, ZS_DTYPE_F32, ZS_DTYPE_F32, ZS_DTYPE_NONE},
      {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F32, ZS_DTYPE_BF16},
      {ZS_DTYPE_F32, ZS_DTYPE_F16, ZS_DTYPE_Q8, ZS_DTYPE_F16},
      {ZS_DTYPE_BF16, ZS_DTYPE_BF16, ZS_DTYPE_BF16, ZS_DTYPE_NONE}};
  size_t k;
  char why[256];
  REQUIRE_LEVEL();
  for (k = 0; k < ZS_ARRAY_SIZE(combos); k++) {
    bufs bf;
    zs_adam_config cfg;
    ZT_CHECK(bufs_alloc(&bf, 1000003, combos[k][0], combos[k][1], combos[k][2],
                        combos[k][3], 1, 1) == 0);
    zs_adam_config_init(&cfg);
    cfg.lr = 3e-3;
    cfg.weight_decay = 0.01;
    cfg.pool = test_pool();
    cfg.num_threads = 4;
    for (cfg.step = 1; cfg.step <= 2; cfg.step++)
      if (adam_check_step(&bf, &cfg, why, sizeof why) != 0) {
        bufs_free(&bf);
        ZT_CHECKF(0, "combo %zu step %lld: %s", k, (long long)cfg.step, why);
      }
    bufs_free(&bf);
  }
}

/* ----------------------------------------------------- Adagrad and Lion */

static void adagrad_lion_reference(void) {
  int a, b, c, d, si, which, step;
  REQUIRE_LEVEL();
  for (which = 0; which < 2; which++)
    for (a = 0; a < 3; a++)
      for (b = 0; b < 3; b++)
        for (c = 0; c < 2; c++)
          for (d = 0; d < 3; d++)
            for (si = 0; si < (int)ZS_ARRAY_SIZE(kSizes); si++) {
              static const int ods[] = {ZS_DTYPE_NONE, ZS_DTYPE_BF16,
                                        ZS_DTYPE_F16};
              int variant = a + b + c + d + si;
              size_t n = kSizes[si], i;
              bufs bf;
              double *s0, *p0;
              zs_optim_tensors t;
              ZT_CHECK(bufs_alloc(&bf, n, kFloat[a], kFloat[b], kFloat[c],
                                  ods[d], which == 1, which == 0) == 0);
              s0 = malloc(n * 8 + 8);
              p0 = malloc(n * 8 + 8);
              ZT_CHECK(s0 && p0);
              for (step = 1; step <= 3; step++) {
                zs_adagrad_config ac;
                zs_lion_config lc;
                double lr = which == 0 ? 1e-2 : 1e-3;
                double wd = variant % 3 == 0 ? 0 : 0.05, gs = 0.5;
                states_f64(&bf, which ? s0 : NULL, which ? NULL : s0);
                for (i = 0; i < n; i++) p0[i] = get(bf.p, bf.pd, i);
                bufs_tensors(&bf, &t);
                if (which == 0) {
                  zs_adagrad_config_init(&ac);
                  ac.lr = lr, ac.weight_decay = wd, ac.grad_scale = gs;
                  ac.num_threads = 1 + variant % 4, ac.pool = test_pool();
                  ZT_OK(zs_adagrad_step(&ac, &t));
                } else {
                  zs_lion_config_init(&lc);
                  lc.lr = lr, lc.weight_decay = wd, lc.grad_scale = gs;
                  lc.num_threads = 1 + variant % 4, lc.pool = test_pool();
                  ZT_OK(zs_lion_step(&lc, &t));
                }
                for (i = 0; i < n; i++) {
                  double g = get(bf.g, bf.gd, i) * gs, p = p0[i], s, want_s;
                  double got_s = which ? get(bf.m, bf.sd, i) : get(bf.v, bf.sd, i);
                  double terms;
                  if (which == 0) {
                    g += wd * p;
                    want_s = s0[i] + g * g;
                    p -= lr * g / (sqrt(want_s) + 1e-10);
                    terms = s0[i] + g * g;
                  } else {
                    double cc = 0.9 * s0[i] + 0.1 * g;
                    p = p * (1 - lr * wd) - lr * (cc > 0 ? 1 : cc < 0 ? -1 : 0);
                    want_s = 0.99 * s0[i] + 0.01 * g;
                    terms = fabs(s0[i]) + fabs(g);
                    /* sign() of a value within fp32 error of 0 may differ. */
                    if (fabs(cc) < 1e-6 * (fabs(s0[i]) + fabs(g))) continue;
                  }
                  s = get(bf.p, bf.pd, i);
                  ZT_CHECKF(close_to(s, p, bf.pd, fabs(p0[i]) + lr),
                            "%s p=%d g=%d s=%d n=%zu step %d: param[%zu] = "
                            "%.9g, reference %.9g", which ? "lion" : "adagrad",
                            bf.pd, bf.gd, bf.sd, n, step, i, s, p);
                  if (bf.out)
                    ZT_CHECKF(close_to(get(bf.out, bf.od, i), p, bf.od,
                                       fabs(p0[i]) + lr), "out[%zu]", i);
                  ZT_CHECKF(close_to(got_s, want_s, bf.sd, terms),
                            "%s state[%zu] = %.9g, reference %.9g",
                            which ? "lion" : "adagrad", i, got_s, want_s);
                }
              }
              free(s0);
              free(p0);
              bufs_free(&bf);
            }
}

/* ------------------------------------------------------------ grad stats */

static void grad_stats_reference(void) {
  size_t si, k;
  REQUIRE_LEVEL();
  for (k = 0; k < 3; k++)
    for (si = 0; si < ZS_ARRAY_SIZE(kSizes) + 1; si++) {
      size_t n = si < ZS_ARRAY_SIZE(kSizes) ? kSizes[si] : 1000003, i;
      void *g = malloc(n * 4 + 4);
      double want = 0, got = -1, scale = 0.375;
      int nf = -1, th;
      ZT_CHECK(g);
      for (i = 0; i < n; i++) {
        double x;
        put(g, kFloat[k], i, urand(-3, 3));
        x = (float)(get(g, kFloat[k], i) * scale); /* rounded as documented */
        want += x * x;
      }
      for (th = 1; th <= 4; th++) {
        ZT_OK(zs_grad_stats(g, kFloat[k], n, scale, test_pool(), th, &got, &nf));
        /* Exact squares summed in float64: relative error <= n * 2^-53. */
        ZT_CHECKF(fabs(got - want) <= 1e-15 * (double)(n + 1) * want + 1e-300,
                  "dtype %d n=%zu: %.17g vs %.17g", kFloat[k], n, got, want);
        ZT_CHECK(nf == 0);
      }
      if (n > 0) {
        /* One inf, then one NaN, anywhere (including the tail), is seen. */
        size_t at = n - 1 - (size_t)(zt_rand() % n);
        double keep = get(g, kFloat[k], at);
        put(g, kFloat[k], at, INFINITY);
        ZT_OK(zs_grad_stats(g, kFloat[k], n, scale, test_pool(), 3, &got, &nf));
        ZT_CHECK(nf == 1 && isinf(got));
        put(g, kFloat[k], at, NAN);
        ZT_OK(zs_grad_stats(g, kFloat[k], n, 1.0, test_pool(), 2, &got, &nf));
        ZT_CHECK(nf == 1 && isnan(got));
        put(g, kFloat[k], at, keep);
      }
      free(g);
    }
}

/* ---------------------------------------------------------- determinism */

/* Runs one optimizer step (0 Adam f32, 1 Adam q8 + bf16 grads + bf16 out,
 * 2 Adagrad, 3 Lion) on fresh copies of the same data; returns a checksum
 * of every output byte. */
static uint64_t fnv(uint64_t h, const void *p, size_t len) {
  const unsigned char *c = p;
  size_t i;
  for (i = 0; i < len; i++) h = (h ^ c[i]) * 1099511628211ull;
  return h;
}

static int run_kind(int kind, size_t n, int threads, uint64_t *sum) {
  static const int sds[] = {ZS_DTYPE_F32, ZS_DTYPE_Q8, ZS_DTYPE_F32,
                            ZS_DTYPE_BF16};
  bufs b;
  zs_optim_tensors t;
  uint64_t h = 1469598103934665603ull;
  int rc, step;
  if (bufs_alloc(&b, n, ZS_DTYPE_F32, kind == 1 ? ZS_DTYPE_BF16 : ZS_DTYPE_F32,
                 sds[kind], kind == 1 ? ZS_DTYPE_BF16 : ZS_DTYPE_NONE,
                 kind != 2, kind < 3) != 0)
    return -1;
  bufs_tensors(&b, &t);
  for (step = 1; step <= 2; step++) {
    if (kind <= 1) {
      zs_adam_config c;
      zs_adam_config_init(&c);
      c.step = step, c.num_threads = threads, c.pool = test_pool();
      c.weight_decay = 0.01;
      rc = zs_adam_step(&c, &t);
    } else if (kind == 2) {
      zs_adagrad_config c;
      zs_adagrad_config_init(&c);
      c.num_threads = threads, c.pool = test_pool();
      rc = zs_adagrad_step(&c, &t);
    } else {
      zs_lion_config c;
      zs_lion_config_init(&c);
      c.num_threads = threads, c.pool = test_pool(), c.weight_decay = 0.1;
      rc = zs_lion_step(&c, &t);
    }
    if (rc != 0) {
      bufs_free(&b);
      return rc;
    }
  }
  h = fnv(h, b.p, n * 4);
  if (b.m) h = fnv(h, b.m, n * esz(b.sd));
  if (b.v) h = fnv(h, b.v, n * esz(b.sd));
  if (b.ms) h = fnv(fnv(h, b.ms, zs_optim_qblocks(n) * 4), b.vs,
                    zs_optim_qblocks(n) * 4);
  if (b.out) h = fnv(h, b.out, n * 2);
  bufs_free(&b);
  *sum = h;
  return 0;
}

static void thread_count_determinism(void) {
  int kind, th;
  REQUIRE_LEVEL();
  for (kind = 0; kind < 4; kind++) {
    uint64_t ref = 0, got = 0, seed = zt_rand() | 1;
    for (th = 1; th <= 4; th++) {
      g_state = seed;
      ZT_OK(run_kind(kind, 1000003, th, &got));
      if (th == 1) ref = got;
      ZT_CHECKF(got == ref, "kind %d: %d threads differ from 1 thread", kind,
                th);
    }
  }
}

static void isa_bit_identical(void) {
  static const char *levels[] = {"scalar", "avx2", "avx512", "neon"};
  const char *env = zs__getenv("ZSPEED_SIMD");
  int kind, li;
  REQUIRE_LEVEL();
  for (kind = 0; kind < 4; kind++) {
    uint64_t ref = 0, got = 0, seed = zt_rand() | 1;
    for (li = 0; li < 4; li++) {
      if (zs_simd_force(levels[li]) != 0) continue; /* CPU lacks it */
      g_state = seed;
      ZT_OK(run_kind(kind, 40003, 2, li == 0 ? &ref : &got));
      if (li > 0)
        ZT_CHECKF(got == ref, "kind %d: %s differs from scalar", kind,
                  levels[li]);
    }
  }
  ZT_OK(zs_simd_force(env ? env : "auto"));
}

/* out = grad (the same pointer and dtype: ZeRO-3's gradients landed in the
 * parameter shards) gives the same params, states and weights as a separate
 * out buffer, on every ISA, for odd sizes (vector and 8-bit block tails) and
 * each optimizer; a partial overlap of out and grad is still refused. */
static int step_kind(int kind, zs_optim_tensors *t, int step) {
  if (kind <= 1) {
    zs_adam_config c;
    zs_adam_config_init(&c);
    c.step = step, c.num_threads = 2, c.pool = test_pool();
    c.weight_decay = 0.01;
    return zs_adam_step(&c, t);
  }
  if (kind == 2) {
    zs_adagrad_config c;
    zs_adagrad_config_init(&c);
    c.num_threads = 2, c.pool = test_pool();
    return zs_adagrad_step(&c, t);
  }
  {
    zs_lion_config c;
    zs_lion_config_init(&c);
    c.num_threads = 2, c.pool = test_pool(), c.weight_decay = 0.1;
    return zs_lion_step(&c, t);
  }
}

static void out_over_grad_in_place(void) {
  static const char *levels[] = {"scalar", "avx2", "avx512", "neon"};
  static const int sds[] = {ZS_DTYPE_F32, ZS_DTYPE_Q8, ZS_DTYPE_F32,
                            ZS_DTYPE_BF16};
  static const size_t sizes[] = {77, 40003};
  const char *env = zs__getenv("ZSPEED_SIMD");
  int kind, li, od, k;
  REQUIRE_LEVEL();
  for (li = 0; li < 4; li++) {
    if (zs_simd_force(levels[li]) != 0) continue; /* CPU lacks it */
    for (kind = 0; kind < 4; kind++)
      for (od = ZS_DTYPE_BF16; od <= ZS_DTYPE_F16; od++)
        for (k = 0; k < 2; k++) {
          size_t n = sizes[k], sb = kind == 1 ? 1 : esz(sds[kind]);
          uint64_t seed = zt_rand() | 1;
          bufs a, b;
          zs_optim_tensors ta, tb;
          g_state = seed;
          ZT_OK(bufs_alloc(&a, n, ZS_DTYPE_F32, od, sds[kind], od, kind != 2,
                           kind < 3));
          g_state = seed;
          ZT_OK(bufs_alloc(&b, n, ZS_DTYPE_F32, od, sds[kind], od, kind != 2,
                           kind < 3));
          bufs_tensors(&a, &ta);
          bufs_tensors(&b, &tb);
          tb.out = b.g; /* the gradients become the weights */
          ZT_OK(step_kind(kind, &ta, 1));
          ZT_OK(step_kind(kind, &tb, 1));
          ZT_CHECKF(!memcmp(a.p, b.p, n * 4) && !memcmp(a.out, b.g, n * 2) &&
                        (!a.m || !memcmp(a.m, b.m, n * sb)) &&
                        (!a.v || !memcmp(a.v, b.v, n * sb)) &&
                        (!a.ms || (!memcmp(a.ms, b.ms, zs_optim_qblocks(n) * 4) &&
                                   !memcmp(a.vs, b.vs, zs_optim_qblocks(n) * 4))),
                    "%s, kind %d, out dtype %d, n %zu: out = grad differs from "
                    "a separate out buffer", levels[li], kind, od, n);
          /* Half a buffer off: refused, nothing written. */
          tb.out = (char *)b.g + 2 * (n / 2);
          ZT_ERR(step_kind(kind, &tb, 2), ZS_EOVERLAP);
          ZT_CHECK(strstr(zs_last_error(), "grad and out overlap") != NULL);
          ZT_CHECK(!memcmp(a.p, b.p, n * 4) && !memcmp(a.out, b.g, n * 2));
          /* The same pointer with another dtype is an overlap too. */
          tb.out = b.g;
          tb.out_dtype = od == ZS_DTYPE_BF16 ? ZS_DTYPE_F16 : ZS_DTYPE_BF16;
          ZT_ERR(step_kind(kind, &tb, 2), ZS_EOVERLAP);
          bufs_free(&a);
          bufs_free(&b);
        }
  }
  ZT_OK(zs_simd_force(env ? env : "auto"));
}

/* Special values through every ISA: NaN, +-inf, +-0, subnormal and huge
 * gradients and params (and blocks whose maxima are tiny or huge) must give
 * the same bits as the scalar reference, for fp32 and 8-bit states. The
 * step is not skipped here, as it would be after an overflow check. */
static uint64_t special_run(int sd, size_t n, uint64_t seed) {
  static const float specials[] = {0.0f, -0.0f, 1e-40f, -1e-42f, 1e30f,
                                   -3e38f, 1e-20f, 7.0f};
  bufs b;
  zs_optim_tensors t;
  zs_adam_config c;
  uint64_t h = 1469598103934665603ull;
  size_t i;
  int step;
  g_state = seed;
  if (bufs_alloc(&b, n, ZS_DTYPE_F32, ZS_DTYPE_F32, sd, ZS_DTYPE_BF16, 1, 1) != 0)
    return 0;
  for (i = 0; i < n; i++) {
    float *g = b.g, *p = b.p;
    int r = (int)urand(0, 23); /* the seeded generator: same data per ISA */
    if (r < (int)ZS_ARRAY_SIZE(specials)) g[i] = specials[r];
    else if (r == 8) g[i] = NAN;
    else if (r == 9) g[i] = -INFINITY;
    else if (r == 10) g[i] = INFINITY;
    else if (r == 11) p[i] = 1e-41f;
    else if (r == 12) p[i] = -0.0f;
    /* A block of tiny gradients next to blocks of normal ones. */
    if (i / ZS_OPTIM_QBLOCK == 3) g[i] = (float)(urand(-1, 1) * 1e-30);
  }
  bufs_tensors(&b, &t);
  for (step = 1; step <= 3; step++) {
    zs_adam_config_init(&c);
    c.step = step, c.num_threads = 2, c.pool = test_pool();
    c.weight_decay = 0.01;
    c.adamw_mode = step != 2; /* also Adam's L2 term */
    if (zs_adam_step(&c, &t) != 0) {
      bufs_free(&b);
      return 0;
    }
  }
  h = fnv(h, b.p, n * 4);
  h = fnv(h, b.m, n * esz(sd));
  h = fnv(h, b.v, n * esz(sd));
  if (b.ms) h = fnv(fnv(h, b.ms, zs_optim_qblocks(n) * 4), b.vs,
                    zs_optim_qblocks(n) * 4);
  h = fnv(h, b.out, n * 2);
  bufs_free(&b);
  return h;
}

static void special_values_bit_identical(void) {
  static const char *levels[] = {"scalar", "avx2", "avx512", "neon"};
  static const int sds[] = {ZS_DTYPE_F32, ZS_DTYPE_Q8};
  const char *env = zs__getenv("ZSPEED_SIMD");
  int k, li;
  REQUIRE_LEVEL();
  for (k = 0; k < 2; k++) {
    uint64_t seed = zt_rand() | 1, ref = 0, got;
    for (li = 0; li < 4; li++) {
      if (zs_simd_force(levels[li]) != 0) continue; /* CPU lacks it */
      got = special_run(sds[k], 3001, seed);
      ZT_CHECKF(got != 0, "%s: the step failed: %s", levels[li], zs_last_error());
      if (li == 0) ref = got;
      else
        ZT_CHECKF(got == ref, "state dtype %d: %s differs from scalar on "
                  "special values", sds[k], levels[li]);
    }
  }
  ZT_OK(zs_simd_force(env ? env : "auto"));
}

/* --------------------------------------------------------------- 8-bit */

/* Quantize/dequantize round trip: the error bound of the maps, zero codes
 * for a zero state, and a block of constants reproduced exactly at its
 * maximum. */
static void q8_roundtrip(void) {
  size_t n = 1000, i, nb = zs_optim_qblocks(1000);
  float m[1000], v[1000], m2[1000], v2[1000], ms[4], vs[4];
  int8_t mq[1000];
  uint8_t vq[1000];
  ZT_CHECK(nb == 4 && zs_optim_qblocks(0) == 0 && zs_optim_qblocks(256) == 1);
  for (i = 0; i < n; i++) {
    m[i] = (float)(urand(-1, 1) * pow(10, -4 * urand(0, 1)));
    v[i] = (float)(urand(0, 1) * pow(10, -8 * urand(0, 1)));
  }
  m[3] = 0.0f, v[3] = 0.0f;
  ZT_OK(zs_adam_q8_quantize(m, v, n, mq, ms, vq, vs));
  ZT_OK(zs_adam_q8_dequantize(mq, ms, vq, vs, n, m2, v2));
  for (i = 0; i < n; i++) {
    double mm = ms[i / 256], sm = vs[i / 256], d = 0.5 / 127, e = 0.5 / 255;
    double tm = sqrt(fabs(m[i]) / mm), tv = sqrt(sqrt(v[i]) / sm);
    /* Code error <= half a step (plus fp32 rounding of the map). */
    ZT_CHECKF(fabs(m2[i] - m[i]) <= mm * (2 * tm * d + d * d) * 1.001 + 1e-7 * mm,
              "m[%zu] %g -> %g", i, m[i], m2[i]);
    ZT_CHECKF(fabs(sqrt(v2[i]) - sqrt(v[i])) <=
                  sm * (2 * tv * e + e * e) * 1.001 + 1e-7 * sm,
              "v[%zu] %g -> %g", i, v[i], v2[i]);
  }
  ZT_CHECK(mq[3] == 0 && vq[3] == 0 && m2[3] == 0.0f && v2[3] == 0.0f);
  for (i = 0; i < n; i++) m[i] = -0.5f, v[i] = 0.25f;
  ZT_OK(zs_adam_q8_quantize(m, v, n, mq, ms, vq, vs));
  ZT_OK(zs_adam_q8_dequantize(mq, ms, vq, vs, n, m2, v2));
  ZT_CHECK(mq[0] == -127 && vq[999] == 255 && ms[0] == 0.5f && vs[3] == 0.5f);
  ZT_CHECK(m2[0] == -0.5f && v2[999] == 0.25f);
  v[5] = -1.0f;
  ZT_ERR(zs_adam_q8_quantize(m, v, n, mq, ms, vq, vs), ZS_EINVAL);
  /* The rounding rule at every tie: with the block maximum 127^2, t = |m|
   * exactly, and the code of (q + 1/2)^2 is q + 1 (ties up) while the float
   * just below it gets q. */
  {
    int q;
    for (q = 0; q < 127; q++) {
      float tie = (float)((q + 0.5) * (q + 0.5));
      for (i = 0; i < 256; i++) m[i] = 0.0f, v[i] = 0.0f;
      m[0] = 16129.0f;
      m[1] = tie;
      m[2] = -nextafterf(tie, 0.0f);
      m[3] = -tie;
      ZT_OK(zs_adam_q8_quantize(m, v, 256, mq, ms, vq, vs));
      ZT_CHECKF(mq[0] == 127 && mq[1] == q + 1 && mq[2] == -q &&
                    mq[3] == -(q + 1) && mq[4] == 0,
                "tie %d: codes %d %d %d %d", q, mq[0], mq[1], mq[2], mq[3]);
    }
  }
}

/* Train the same quadratic with fp32 and 8-bit states: the 8-bit run must
 * converge as well (final loss within 10% of fp32's, both far below the
 * start). A real multi-step run, complementing the Python MLP test. */
static void q8_converges(void) {
  enum { N = 5000, STEPS = 300 };
  static float p32[N], pq[N], g[N], m32[N], v32[N], target[N], scale_[N];
  static int8_t mq[N];
  static uint8_t vq[N];
  static float ms[N / 256 + 1], vs[N / 256 + 1];
  double l0 = 0, l32 = 0, lq = 0;
  int step, k;
  size_t i;
  REQUIRE_LEVEL();
  for (i = 0; i < N; i++) {
    target[i] = (float)urand(-1, 1);
    scale_[i] = (float)pow(10, urand(-2, 1)); /* curvatures over 3 decades */
    p32[i] = pq[i] = 0;
    m32[i] = v32[i] = 0;
    mq[i] = 0, vq[i] = 0;
  }
  memset(ms, 0, sizeof ms);
  memset(vs, 0, sizeof vs);
  for (i = 0; i < N; i++) l0 += scale_[i] * target[i] * target[i];
  for (step = 1; step <= STEPS; step++)
    for (k = 0; k < 2; k++) {
      float *p = k ? pq : p32;
      zs_optim_tensors t;
      zs_adam_config c;
      for (i = 0; i < N; i++) /* noisy gradient of sum scale (p - target)^2 */
        g[i] = (float)(2 * scale_[i] * (p[i] - target[i]) + 0.05 * urand(-1, 1));
      zs_optim_tensors_init(&t);
      t.n = N, t.param = p, t.grad = g;
      if (k) {
        t.state_dtype = ZS_DTYPE_Q8;
        t.m = mq, t.v = vq, t.m_scale = ms, t.v_scale = vs;
      } else {
        t.m = m32, t.v = v32;
      }
      zs_adam_config_init(&c);
      c.lr = 0.02, c.step = step;
      ZT_OK(zs_adam_step(&c, &t));
    }
  for (i = 0; i < N; i++) {
    l32 += scale_[i] * (p32[i] - target[i]) * (p32[i] - target[i]);
    lq += scale_[i] * (pq[i] - target[i]) * (pq[i] - target[i]);
  }
  ZT_CHECKF(l32 < 0.01 * l0, "fp32 did not converge: %g of %g", l32, l0);
  ZT_CHECKF(lq <= 1.10 * l32 + 1e-3 * l0, "q8 loss %g vs fp32 %g (start %g)", lq,
            l32, l0);
}

/* ------------------------------------------------------------- errors */

/* Every refused call must leave every buffer as it was. */
static void errors_modify_nothing(void) {
  enum { N = 100 };
  float p[N], g[N], m[N], v[N], p0[N], m0[N], v0[N];
  uint16_t out[N], out0[N];
  float ms[1], vs[1];
  zs_optim_tensors t;
  zs_adam_config c;
  zs_adagrad_config ac;
  zs_lion_config lc;
  size_t i;
  REQUIRE_LEVEL();
  for (i = 0; i < N; i++) {
    p[i] = (float)urand(-1, 1), g[i] = (float)urand(-1, 1);
    m[i] = (float)urand(-1, 1), v[i] = (float)urand(0, 1);
    out[i] = (uint16_t)i;
  }
  memcpy(p0, p, sizeof p), memcpy(m0, m, sizeof m), memcpy(v0, v, sizeof v);
  memcpy(out0, out, sizeof out);
#define RESET()                                                   \
  do {                                                            \
    zs_optim_tensors_init(&t);                                    \
    t.n = N, t.param = p, t.grad = g, t.m = m, t.v = v, t.out = out; \
    t.out_dtype = ZS_DTYPE_BF16;                                  \
    zs_adam_config_init(&c);                                      \
  } while (0)
#define UNCHANGED()                                                     \
  ZT_CHECK(!memcmp(p, p0, sizeof p) && !memcmp(m, m0, sizeof m) &&      \
           !memcmp(v, v0, sizeof v) && !memcmp(out, out0, sizeof out))
  RESET();
  ZT_ERR(zs_adam_step(NULL, &t), ZS_EINVAL);
  ZT_ERR(zs_adam_step(&c, NULL), ZS_EINVAL);
  t.grad = NULL;
  ZT_ERR(zs_adam_step(&c, &t), ZS_EINVAL);
  ZT_CHECK(strstr(zs_last_error(), "grad is NULL") != NULL);
  RESET();
  t.param = (char *)p + 1; /* misaligned fp32 */
  ZT_ERR(zs_adam_step(&c, &t), ZS_EALIGN);
  RESET();
  t.v = m; /* m and v the same memory */
  ZT_ERR(zs_adam_step(&c, &t), ZS_EOVERLAP);
  RESET();
  t.out = (uint16_t *)(void *)(p + N / 2); /* out inside param */
  ZT_ERR(zs_adam_step(&c, &t), ZS_EOVERLAP);
  ZT_CHECK(strstr(zs_last_error(), "param and out overlap") != NULL);
  RESET();
  t.grad = p + 10; /* grad overlapping param */
  ZT_ERR(zs_adam_step(&c, &t), ZS_EOVERLAP);
  RESET();
  t.state_dtype = ZS_DTYPE_F16;
  ZT_ERR(zs_adam_step(&c, &t), ZS_EDTYPE);
  RESET();
  t.out_dtype = ZS_DTYPE_F32;
  ZT_ERR(zs_adam_step(&c, &t), ZS_EDTYPE);
  RESET();
  t.param_dtype = ZS_DTYPE_Q8;
  ZT_ERR(zs_adam_step(&c, &t), ZS_EDTYPE);
  RESET();
  t.grad_dtype = 7;
  ZT_ERR(zs_adam_step(&c, &t), ZS_EDTYPE);
  RESET();
  t.state_dtype = ZS_DTYPE_Q8; /* scales missing */
  ZT_ERR(zs_adam_step(&c, &t), ZS_EINVAL);
  RESET();
  t.m_scale = ms, t.v_scale = vs; /* scales without q8 */
  ZT_ERR(zs_adam_step(&c, &t), ZS_EINVAL);
  RESET();
  t.state_dtype = ZS_DTYPE_Q8, t.m_scale = ms, t.v_scale = ms; /* shared */
  ZT_ERR(zs_adam_step(&c, &t), ZS_EOVERLAP);
  RESET();
  c.amsgrad = 1;
  ZT_ERR(zs_adam_step(&c, &t), ZS_ENOTSUP);
  ZT_CHECK(strstr(zs_last_error(), "amsgrad") != NULL);
  RESET();
  c.lr = -1;
  ZT_ERR(zs_adam_step(&c, &t), ZS_EINVAL);
  RESET();
  c.beta2 = NAN;
  ZT_ERR(zs_adam_step(&c, &t), ZS_EINVAL);
  RESET();
  c.beta1 = 1.0;
  ZT_ERR(zs_adam_step(&c, &t), ZS_EINVAL);
  RESET();
  c.step = 0;
  ZT_ERR(zs_adam_step(&c, &t), ZS_EINVAL);
  RESET();
  c.grad_scale = INFINITY;
  ZT_ERR(zs_adam_step(&c, &t), ZS_EINVAL);
  RESET();
  c.num_threads = -2;
  ZT_ERR(zs_adam_step(&c, &t), ZS_EINVAL);
  UNCHANGED();

  RESET();
  zs_adagrad_config_init(&ac);
  ZT_ERR(zs_adagrad_step(&ac, &t), ZS_EINVAL); /* m given to Adagrad */
  t.m = NULL;
  ac.lr_decay = 0.1;
  ZT_ERR(zs_adagrad_step(&ac, &t), ZS_ENOTSUP);
  ac.lr_decay = 0;
  t.state_dtype = ZS_DTYPE_Q8, t.m_scale = ms, t.v_scale = vs;
  ZT_ERR(zs_adagrad_step(&ac, &t), ZS_EDTYPE);
  RESET();
  zs_lion_config_init(&lc);
  ZT_ERR(zs_lion_step(&lc, &t), ZS_EINVAL); /* v given to Lion */
  t.v = NULL;
  lc.beta1 = 1.5;
  ZT_ERR(zs_lion_step(&lc, &t), ZS_EINVAL);
  UNCHANGED();

  /* Length 0 is a valid no-op, even with NULL buffers. */
  zs_optim_tensors_init(&t);
  zs_adam_config_init(&c);
  ZT_OK(zs_adam_step(&c, &t));
#undef RESET
#undef UNCHANGED
}

static void grad_stats_errors_and_faults(void) {
  float g[10] = {1, 2, 3};
  double s = -7;
  int nf = -7;
  size_t n = (size_t)ZS_OPTIM_CHUNK * 65;
  float *big;
  REQUIRE_LEVEL();
  ZT_ERR(zs_grad_stats(g, ZS_DTYPE_F32, 10, 1.0, NULL, 0, NULL, &nf), ZS_EINVAL);
  ZT_ERR(zs_grad_stats(NULL, ZS_DTYPE_F32, 10, 1.0, NULL, 0, &s, &nf), ZS_EINVAL);
  ZT_ERR(zs_grad_stats(g, ZS_DTYPE_Q8, 10, 1.0, NULL, 0, &s, &nf), ZS_EDTYPE);
  ZT_ERR(zs_grad_stats((char *)g + 1, ZS_DTYPE_F32, 3, 1.0, NULL, 0, &s, &nf),
         ZS_EALIGN);
  ZT_ERR(zs_grad_stats(g, ZS_DTYPE_F32, 10, NAN, NULL, 0, &s, &nf), ZS_EINVAL);
  ZT_CHECK(s == -7 && nf == -7);
  ZT_OK(zs_grad_stats(g, ZS_DTYPE_F32, 3, 2.0, NULL, 0, &s, &nf));
  ZT_CHECK(s == 56.0 && nf == 0);
  /* More than 64 chunks needs a heap buffer: an injected failure there is
   * reported and leaves the outputs alone. */
  big = calloc(n, 4);
  ZT_CHECK(big);
  s = -7, nf = -7;
  ZT_OK(zs_fault_set("optim.stats_alloc", 1, 1, ZS_ENOMEM));
  ZT_ERR(zs_grad_stats(big, ZS_DTYPE_F32, n, 1.0, NULL, 0, &s, &nf), ZS_ENOMEM);
  ZT_CHECK(s == -7 && nf == -7);
  big[n - 1] = 3;
  ZT_OK(zs_grad_stats(big, ZS_DTYPE_F32, n, 1.0, NULL, 0, &s, &nf));
  ZT_CHECK(s == 9.0 && nf == 0);
  free(big);
}

/* ZSPEED_SIMD naming a level this CPU lacks: every entry point refuses with
 * ZS_ESIMD and writes nothing. On a CPU that has the level this is a skip. */
static void simd_unusable_refused(void) {
  float p[20], g[20], m[20], v[20], p0[20];
  zs_optim_tensors t;
  zs_adam_config c;
  double s = -1;
  int i;
  if (zs_simd_level() >= 0)
    ZT_SKIP("the forced SIMD level (%s) is usable here; nothing to refuse",
            zs_simd_name(zs_simd_level()));
  for (i = 0; i < 20; i++) p[i] = p0[i] = (float)i, g[i] = 1, m[i] = v[i] = 0;
  zs_optim_tensors_init(&t);
  t.n = 20, t.param = p, t.grad = g, t.m = m, t.v = v;
  zs_adam_config_init(&c);
  ZT_ERR(zs_adam_step(&c, &t), ZS_ESIMD);
  ZT_CHECK(strstr(zs_last_error(), "zs_adam_step") != NULL);
  ZT_ERR(zs_grad_stats(g, ZS_DTYPE_F32, 20, 1.0, NULL, 0, &s, NULL), ZS_ESIMD);
  ZT_CHECK(!memcmp(p, p0, sizeof p) && m[3] == 0 && s == -1);
}

/* Distance from f of the f16/bf16 value with bits h; infinite for NaN
 * codes, so a neighbour that is not a number never wins. */
static double dist16(int bf, uint16_t h, float f) {
  double x = bf ? zs__bf16_to_f32(h) : zs__f16_to_f32(h);
  return x != x ? INFINITY : fabs(x - f);
}

/* The scalar conversions (shared by every ISA's tails and the tests) round
 * to nearest even: every f16 survives f16 -> f32 -> f16, and random floats
 * land on the nearer neighbour. */
static void conversions_round_to_nearest_even(void) {
  uint32_t h;
  int k;
  for (h = 0; h < 65536; h++) {
    float f = zs__f16_to_f32((uint16_t)h);
    if (f != f) continue;
    ZT_CHECKF(zs__f32_to_f16(f) == h, "f16 %04x -> %g -> %04x", h, f,
              zs__f32_to_f16(f));
    ZT_CHECK(zs__f32_to_bf16(zs__bf16_to_f32((uint16_t)h)) == h ||
             zs__bf16_to_f32((uint16_t)h) != zs__bf16_to_f32((uint16_t)h));
  }
  for (k = 0; k < 200000; k++) {
    double x = urand(-1, 1) * pow(2, urand(-26, 17));
    float f = (float)x;
    uint16_t a = zs__f32_to_f16(f), b = zs__f32_to_bf16(f);
    double ea = dist16(0, a, f), eb = dist16(1, b, f);
    if (fabs(f) < 65504) {
      ZT_CHECKF(ea <= dist16(0, (uint16_t)(a + 1), f) &&
                    ea <= dist16(0, (uint16_t)(a - 1), f) &&
                    ea <= dist16(0, (uint16_t)(a ^ 0x8000), f),
                "f16 of %.9g is %04x", f, a);
    }
    ZT_CHECKF(eb <= dist16(1, (uint16_t)(b + 1), f) &&
                  eb <= dist16(1, (uint16_t)(b - 1), f),
              "bf16 of %.9g is %04x", f, b);
  }
  ZT_CHECK(zs__f32_to_f16(65520.0f) == 0x7c00 && zs__f32_to_f16(65519.0f) == 0x7bff);
  ZT_CHECK(zs__f32_to_bf16(1.0f + 1.0f / 256) == 0x3f80); /* tie to even */
  ZT_CHECK(zs__f32_to_bf16(1.0f + 3.0f / 256) == 0x3f82);
}

/* zs__fmaf must be correctly rounded (the scalar kernels rely on it to
 * match hardware FMA). Checked against glibc's fmaf, which is, on random
 * triples and on triples built so that a*b + c lands near a float midpoint
 * (c cancels the rounded product, leaving only the low bits). */
static void fmaf_correctly_rounded(void) {
#ifdef __GLIBC__
  int k;
  for (k = 0; k < 2000000; k++) {
    float a = (float)(urand(-1, 1) * pow(2, urand(-20, 20)));
    float b = (float)(urand(-1, 1) * pow(2, urand(-20, 20)));
    float c = (float)(urand(-1, 1) * pow(2, urand(-40, 40)));
    if (k % 2) c = -(a * b) * (float)(1 + urand(-1, 1) * 1e-6);
    if (k % 7 == 0) c = (float)ldexp(1.0, (int)urand(-150, 0)) * (k % 3 ? 1 : -1);
    ZT_CHECKF(zs__f32_bits(zs__fmaf(a, b, c)) == zs__f32_bits(fmaf(a, b, c)),
              "fma(%a, %a, %a): %a vs libc %a", a, b, c, zs__fmaf(a, b, c),
              fmaf(a, b, c));
  }
#else
  ZT_SKIP("needs glibc's correctly rounded fmaf as the reference");
#endif
}

ZT_MAIN(ZT_CASE(conversions_round_to_nearest_even), ZT_CASE(fmaf_correctly_rounded), ZT_CASE(adam_reference_matrix),
        ZT_CASE(adam_large), ZT_CASE(adagrad_lion_reference),
        ZT_CASE(grad_stats_reference), ZT_CASE(thread_count_determinism),
        ZT_CASE(isa_bit_identical), ZT_CASE(out_over_grad_in_place),
        ZT_CASE(special_values_bit_identical),
        ZT_CASE(q8_roundtrip), ZT_CASE(q8_converges),
        ZT_CASE(errors_modify_nothing), ZT_CASE(grad_stats_errors_and_faults),
        ZT_CASE(simd_unusable_refused))
