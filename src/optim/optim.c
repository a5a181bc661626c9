/* optim.c - the optimizer driver: validates every argument before anything
 * is written, derives the fp32 constants of the step once, picks the kernel
 * table of the current SIMD level and runs it over fixed ZS_OPTIM_CHUNK
 * chunks on the thread pool. Also the 8-bit block loop around the kernels'
 * block passes and the grad-stats reduction. Of the kernel files it uses
 * their tables only (declared in optim_internal.h); they call nothing
 * here. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim_internal.h"
#include "zs_internal.h"

void zs_optim_tensors_init(zs_optim_tensors *t) {
  if (!t) return;
  memset(t, 0, sizeof *t);
  t->param_dtype = t->grad_dtype = t->state_dtype = ZS_DTYPE_F32;
  t->out_dtype = ZS_DTYPE_NONE;
}

size_t zs_optim_qblocks(size_t n) {
  return n / ZS_OPTIM_QBLOCK + (n % ZS_OPTIM_QBLOCK != 0);
}

static const char *dtype_name(int dt) {
  switch (dt) {
    case ZS_DTYPE_F32: return "f32";
    case ZS_DTYPE_BF16: return "bf16";
    case ZS_DTYPE_F16: return "f16";
    case ZS_DTYPE_Q8: return "q8";
    case ZS_DTYPE_NONE: return "none";
    default: return "unknown";
  }
}

static int is_float_dtype(int dt) {
  return dt == ZS_DTYPE_F32 || dt == ZS_DTYPE_BF16 || dt == ZS_DTYPE_F16;
}

/* ------------------------------------------------------------ validation */

typedef struct {
  const char *name;
  uintptr_t lo;
  size_t bytes;
} zs__span;

/* Checks one buffer and records its byte range for the overlap check. */
static int add_span(const char *fn, zs__span *spans, int *ns, const char *name,
                    const void *p, size_t bytes, size_t align) {
  if (!p)
    return zs__fail(ZS_EINVAL, "%s: %s is NULL; pass a buffer of %zu bytes",
                    fn, name, bytes);
  if ((uintptr_t)p % align != 0)
    return zs__fail(ZS_EALIGN,
                    "%s: %s (%p) is not aligned to its element size %zu; "
                    "use a buffer from a normal allocator or zs_alloc_aligned",
                    fn, name, p, align);
  spans[*ns].name = name;
  spans[*ns].lo = (uintptr_t)p;
  spans[*ns].bytes = bytes;
  (*ns)++;
  return 0;
}

/* Validates t for an optimizer needing state m and/or v. */
static int check_tensors(const char *fn, const zs_optim_tensors *t,
                         int need_m, int need_v, int allow_q8) {
  zs__span spans[8];
  int ns = 0, i, j, rc;
  size_t n, ssz;
  if (!t) return zs__fail(ZS_EINVAL, "%s: tensors is NULL", fn);
  n = t->n;
  if (!is_float_dtype(t->param_dtype))
    return zs__fail(ZS_EDTYPE, "%s: param_dtype %d (%s) is not f32, bf16 or f16",
                    fn, t->param_dtype, dtype_name(t->param_dtype));
  if (!is_float_dtype(t->grad_dtype))
    return zs__fail(ZS_EDTYPE, "%s: grad_dtype %d (%s) is not f32, bf16 or f16",
                    fn, t->grad_dtype, dtype_name(t->grad_dtype));
  if (t->state_dtype == ZS_DTYPE_Q8 && !allow_q8)
    return zs__fail(ZS_EDTYPE,
                    "%s: 8-bit states are implemented for Adam only; use "
                    "f32 or bf16 states", fn);
  if (!is_float_dtype(t->state_dtype) && t->state_dtype != ZS_DTYPE_Q8)
    return zs__fail(ZS_EDTYPE, "%s: state_dtype %d (%s) is not f32, bf16 or q8",
                    fn, t->state_dtype, dtype_name(t->state_dtype));
  if (t->state_dtype == ZS_DTYPE_F16)
    return zs__fail(ZS_EDTYPE,
                    "%s: f16 states are not supported (their range is too "
                    "small for second moments); use f32, bf16 or q8", fn);
  if (t->out && t->out_dtype != ZS_DTYPE_BF16 && t->out_dtype != ZS_DTYPE_F16)
    return zs__fail(ZS_EDTYPE,
                    "%s: out_dtype %d (%s) must be bf16 or f16 (an f32 copy "
                    "of f32 params is the params themselves)", fn,
                    t->out_dtype, dtype_name(t->out_dtype));
  if (!need_m && t->m)
    return zs__fail(ZS_EINVAL, "%s: m must be NULL (this optimizer keeps "
                    "its state in v)", fn);
  if (!need_v && t->v)
    return zs__fail(ZS_EINVAL, "%s: v must be NULL (this optimizer keeps "
                    "its state in m)", fn);
  if (t->state_dtype != ZS_DTYPE_Q8 && (t->m_scale || t->v_scale))
    return zs__fail(ZS_EINVAL, "%s: m_scale/v_scale are for q8 states only; "
                    "set them to NULL", fn);
  if (n > SIZE_MAX / 8)
    return zs__fail(ZS_ERANGE, "%s: n = %zu is too large", fn, n);
  if (n == 0) return 0;
  if ((rc = add_span(fn, spans, &ns, "param", t->param,
                     n * zs__dtype_size(t->param_dtype),
                     zs__dtype_size(t->param_dtype))) < 0)
    return rc;
  if ((rc = add_span(fn, spans, &ns, "grad", t->grad,
                     n * zs__dtype_size(t->grad_dtype),
                     zs__dtype_size(t->grad_dtype))) < 0)
    return rc;
  ssz = t->state_dtype == ZS_DTYPE_Q8 ? 1 : zs__dtype_size(t->state_dtype);
  if (need_m && (rc = add_span(fn, spans, &ns, "m", t->m, n * ssz, ssz)) < 0)
    return rc;
  if (need_v && (rc = add_span(fn, spans, &ns, "v", t->v, n * ssz, ssz)) < 0)
    return rc;
  if (t->state_dtype == ZS_DTYPE_Q8) {
    size_t nb = zs_optim_qblocks(n) * sizeof(float);
    if ((rc = add_span(fn, spans, &ns, "m_scale", t->m_scale, nb, 4)) < 0 ||
        (rc = add_span(fn, spans, &ns, "v_scale", t->v_scale, nb, 4)) < 0)
      return rc;
  }
  /* out may be grad itself (same pointer, same dtype): every kernel reads an
   * element's gradient before it writes that element's new weight, so the
   * step consumes the gradient buffer in place. Any other overlap is
   * refused. */
  if (t->out && !(t->out == t->grad && t->out_dtype == t->grad_dtype) &&
      (rc = add_span(fn, spans, &ns, "out", t->out,
                     n * zs__dtype_size(t->out_dtype),
                     zs__dtype_size(t->out_dtype))) < 0)
    return rc;
  for (i = 0; i < ns; i++)
    for (j = i + 1; j < ns; j++)
      if (spans[i].lo < spans[j].lo + spans[j].bytes &&
          spans[j].lo < spans[i].lo + spans[i].bytes)
        return zs__fail(ZS_EOVERLAP,
                        "%s: %s and %s overlap; every buffer of a step must "
                        "be separate memory", fn, spans[i].name,
                        spans[j].name);
  return 0;
}

static int check_real(const char *fn, const char *name, double x, double lo,
                      double hi, int hi_open) {
  if (!isfinite(x) || x < lo || (hi_open ? x >= hi : x > hi))
    return zs__fail(ZS_EINVAL, "%s: %s = %g is out of range; it must be in "
                    "[%g, %g%s", fn, name, x, lo, hi, hi_open ? ")" : "]");
  return 0;
}

/* The kernel table of the current SIMD level, or ZS_ESIMD. */
static int pick(const char *fn, const zs__optim_kernels **k) {
  int level = zs_simd_level();
  if (level < 0) return zs__fail_prefix(level, "%s", fn);
#ifdef ZS__OPTIM_X86
  if (level == ZS_SIMD_AVX512) {
    *k = &zs__optim_avx512;
    return 0;
  }
  if (level == ZS_SIMD_AVX2) {
    *k = &zs__optim_avx2;
    return 0;
  }
#endif
#ifdef ZS__OPTIM_NEON
  if (level == ZS_SIMD_NEON) {
    *k = &zs__optim_neon;
    return 0;
  }
#endif
  *k = &zs__optim_scalar;
  return 0;
}

/* ------------------------------------------------------------- execution */

/* A copy of a with every per-element pointer advanced to element `begin`
 * (states too, unless they are 8-bit codes, which the Q8 path offsets). */
static zs__optim_args offset_args(const zs__optim_args *a, size_t begin) {
  zs__optim_args s = *a;
  s.param = a->param + begin * zs__dtype_size(a->pd);
  s.grad = a->grad + begin * zs__dtype_size(a->gd);
  if (a->out) s.out = a->out + begin * zs__dtype_size(a->od);
  if (a->sd != ZS_DTYPE_Q8) {
    if (a->m) s.m = a->m + begin * zs__dtype_size(a->sd);
    if (a->v) s.v = a->v + begin * zs__dtype_size(a->sd);
  }
  return s;
}

/* The 8-bit block loop, with its helpers below. */
static void adam_q8_range(const zs__q8_ops *ops, const zs__optim_args *a,
                          size_t begin, size_t end);

typedef struct {
  zs__optim_fn fn;         /* the kernel, or NULL for 8-bit Adam */
  const zs__q8_ops *q8;    /* the block passes of 8-bit Adam */
  const zs__optim_args *a;
} zs__run_ctx;

static void run_range(void *ctx, size_t begin, size_t end, int worker) {
  zs__run_ctx *c = ctx;
  (void)worker;
  if (c->fn) {
    zs__optim_args s = offset_args(c->a, begin);
    c->fn(&s, end - begin);
  } else {
    adam_q8_range(c->q8, c->a, begin, end);
  }
}

/* Runs fn over [0, n) in chunks; fn NULL runs the 8-bit block loop over
 * q8 instead. */
static int run(zs_pool *pool, int threads, size_t n, zs__optim_fn fn,
               const zs__q8_ops *q8, const zs__optim_args *a) {
  zs__run_ctx c;
  c.fn = fn;
  c.q8 = q8;
  c.a = a;
  if (!pool) pool = zs_pool_default();
  return zs_pool_parallel_for(pool, n, ZS_OPTIM_CHUNK, threads, run_range, &c);
}

static void base_args(zs__optim_args *a, const zs_optim_tensors *t,
                      double grad_scale) {
  memset(a, 0, sizeof *a);
  a->param = t->param;
  a->grad = t->grad;
  a->m = t->m;
  a->v = t->v;
  a->m_scale = t->m_scale;
  a->v_scale = t->v_scale;
  a->out = t->out;
  a->pd = t->param_dtype;
  a->gd = t->grad_dtype;
  a->sd = t->state_dtype;
  a->od = t->out ? t->out_dtype : ZS_DTYPE_NONE;
  a->gs = (float)grad_scale;
  a->decay = 1.0f;
}

static int check_common(const char *fn, double grad_scale, int threads) {
  if (!isfinite(grad_scale) || fabs(grad_scale) > FLT_MAX)
    return zs__fail(ZS_EINVAL, "%s: grad_scale = %g must be a finite fp32 "
                    "value", fn, grad_scale);
  if (threads < 0)
    return zs__fail(ZS_EINVAL, "%s: num_threads = %d must be >= 0 (0 = all)",
                    fn, threads);
  return 0;
}

void zs_adam_config_init(zs_adam_config *c) {
  if (!c) return;
  memset(c, 0, sizeof *c);
  c->lr = 1e-3;
  c->beta1 = 0.9;
  c->beta2 = 0.999;
  c->eps = 1e-8;
  c->grad_scale = 1.0;
  c->step = 1;
  c->adamw_mode = 1;
  c->bias_correction = 1;
}

int zs_adam_step(const zs_adam_config *c, const zs_optim_tensors *t) {
  static const char fn[] = "zs_adam_step";
  const zs__optim_kernels *k = NULL;
  zs__optim_args a;
  double bc1 = 1.0, bc2 = 1.0;
  int rc;
  if (!c) return zs__fail(ZS_EINVAL, "%s: cfg is NULL", fn);
  if (c->amsgrad)
    return zs__fail(ZS_ENOTSUP, "%s: amsgrad is not supported; set amsgrad "
                    "to 0 (False)", fn);
  if ((rc = check_real(fn, "lr", c->lr, 0, FLT_MAX, 0)) < 0 ||
      (rc = check_real(fn, "beta1", c->beta1, 0, 1, 1)) < 0 ||
      (rc = check_real(fn, "beta2", c->beta2, 0, 1, 1)) < 0 ||
      (rc = check_real(fn, "eps", c->eps, 0, FLT_MAX, 0)) < 0 ||
      (rc = check_real(fn, "weight_decay", c->weight_decay, 0, FLT_MAX, 0)) < 0 ||
      (rc = check_common(fn, c->grad_scale, c->num_threads)) < 0)
    return rc;
  if (c->step < 1)
    return zs__fail(ZS_EINVAL, "%s: step = %lld must be >= 1 (the number of "
                    "this update, counting from 1)", fn, (long long)c->step);
  if ((rc = check_tensors(fn, t, 1, 1, 1)) < 0) return rc;
  if ((rc = pick(fn, &k)) < 0) return rc;
  if (t->n == 0) return 0;
  base_args(&a, t, c->grad_scale);
  if (c->bias_correction) {
    bc1 = 1.0 - pow(c->beta1, (double)c->step);
    bc2 = 1.0 - pow(c->beta2, (double)c->step);
  }
  a.b1 = (float)c->beta1;
  a.omb1 = (float)(1.0 - c->beta1);
  a.b2 = (float)c->beta2;
  a.omb2 = (float)(1.0 - c->beta2);
  a.eps = (float)c->eps;
  a.wd = (float)c->weight_decay;
  a.l2 = !c->adamw_mode && c->weight_decay != 0;
  a.decay = c->adamw_mode ? (float)(1.0 - c->lr * c->weight_decay) : 1.0f;
  a.neg_step = (float)(-c->lr / bc1);
  a.rbc2 = (float)(1.0 / sqrt(bc2));
  if (t->state_dtype == ZS_DTYPE_Q8 && c->beta1 * c->beta1 < c->beta2) {
    a.clamp = 1;
    a.clampc = (float)((1.0 - c->beta1) /
                       sqrt((1.0 - c->beta2) *
                            (1.0 - c->beta1 * c->beta1 / c->beta2)));
  }
  if (t->state_dtype == ZS_DTYPE_Q8)
    return run(c->pool, c->num_threads, t->n, NULL, &k->adam_q8, &a);
  return run(c->pool, c->num_threads, t->n, k->adam, NULL, &a);
}

void zs_adagrad_config_init(zs_adagrad_config *c) {
  if (!c) return;
  memset(c, 0, sizeof *c);
  c->lr = 1e-2;
  c->eps = 1e-10;
  c->grad_scale = 1.0;
}

int zs_adagrad_step(const zs_adagrad_config *c, const zs_optim_tensors *t) {
  static const char fn[] = "zs_adagrad_step";
  const zs__optim_kernels *k = NULL;
  zs__optim_args a;
  int rc;
  if (!c) return zs__fail(ZS_EINVAL, "%s: cfg is NULL", fn);
  if (c->lr_decay != 0)
    return zs__fail(ZS_ENOTSUP, "%s: lr_decay = %g is not supported; use 0 "
                    "and an LR scheduler instead", fn, c->lr_decay);
  if ((rc = check_real(fn, "lr", c->lr, 0, FLT_MAX, 0)) < 0 ||
      (rc = check_real(fn, "eps", c->eps, 0, FLT_MAX, 0)) < 0 ||
      (rc = check_real(fn, "weight_decay", c->weight_decay, 0, FLT_MAX, 0)) < 0 ||
      (rc = check_common(fn, c->grad_scale, c->num_threads)) < 0)
    return rc;
  if ((rc = check_tensors(fn, t, 0, 1, 0)) < 0) return rc;
  if ((rc = pick(fn, &k)) < 0) return rc;
  if (t->n == 0) return 0;
  base_args(&a, t, c->grad_scale);
  a.eps = (float)c->eps;
  a.wd = (float)c->weight_decay;
  a.l2 = c->weight_decay != 0;
  a.neg_step = (float)-c->lr;
  return run(c->pool, c->num_threads, t->n, k->adagrad, NULL, &a);
}

void zs_lion_config_init(zs_lion_config *c) {
  if (!c) return;
  memset(c, 0, sizeof *c);
  c->lr = 1e-4;
  c->beta1 = 0.9;
  c->beta2 = 0.99;
  c->grad_scale = 1.0;
}

int zs_lion_step(const zs_lion_config *c, const zs_optim_tensors *t) {
  static const char fn[] = "zs_lion_step";
  const zs__optim_kernels *k = NULL;
  zs__optim_args a;
  int rc;
  if (!c) return zs__fail(ZS_EINVAL, "%s: cfg is NULL", fn);
  if ((rc = check_real(fn, "lr", c->lr, 0, FLT_MAX, 0)) < 0 ||
      (rc = check_real(fn, "beta1", c->beta1, 0, 1, 0)) < 0 ||
      (rc = check_real(fn, "beta2", c->beta2, 0, 1, 0)) < 0 ||
      (rc = check_real(fn, "weight_decay", c->weight_decay, 0, FLT_MAX, 0)) < 0 ||
      (rc = check_common(fn, c->grad_scale, c->num_threads)) < 0)
    return rc;
  if ((rc = check_tensors(fn, t, 1, 0, 0)) < 0) return rc;
  if ((rc = pick(fn, &k)) < 0) return rc;
  if (t->n == 0) return 0;
  base_args(&a, t, c->grad_scale);
  a.b1 = (float)c->beta1;
  a.omb1 = (float)(1.0 - c->beta1);
  a.b2 = (float)c->beta2;
  a.omb2 = (float)(1.0 - c->beta2);
  a.decay = (float)(1.0 - c->lr * c->weight_decay);
  a.neg_step = (float)-c->lr;
  return run(c->pool, c->num_threads, t->n, k->lion, NULL, &a);
}

/* ----------------------------------------------------------- 8-bit Adam */

/* The last, short block of a range runs on zero-padded copies: zero
 * params, gradients and codes stay exactly zero through the update, so
 * they cannot change the block maxima. */
static void q8_short_block(const zs__q8_ops *ops, const zs__optim_args *a,
                           size_t b, size_t len) {
  float mt[ZS_OPTIM_QBLOCK], st[ZS_OPTIM_QBLOCK];
  float pb[ZS_OPTIM_QBLOCK], gb[ZS_OPTIM_QBLOCK], ob[ZS_OPTIM_QBLOCK];
  int8_t mq[ZS_OPTIM_QBLOCK];
  uint8_t vq[ZS_OPTIM_QBLOCK];
  size_t ps = zs__dtype_size(a->pd), gsz = zs__dtype_size(a->gd);
  size_t blk = b / ZS_OPTIM_QBLOCK;
  zs__optim_args s = offset_args(a, b);
  float mmax, smax;
  memset(pb, 0, sizeof pb);
  memset(gb, 0, sizeof gb);
  memset(mq, 0, sizeof mq);
  memset(vq, 0, sizeof vq);
  memcpy(pb, s.param, len * ps);
  memcpy(gb, s.grad, len * gsz);
  memcpy(mq, (int8_t *)a->m + b, len);
  memcpy(vq, (uint8_t *)a->v + b, len);
  s.param = (char *)pb;
  s.grad = (const char *)gb;
  if (a->out) s.out = (char *)ob;
  ops->moments(&s, mq, a->m_scale[blk], vq, a->v_scale[blk], mt, st, &mmax,
               &smax);
  ops->finish(&s, mt, st, mmax, smax, mq, vq);
  memcpy(a->param + b * ps, pb, len * ps);
  if (a->out)
    memcpy(a->out + b * zs__dtype_size(a->od), ob,
           len * zs__dtype_size(a->od));
  memcpy((int8_t *)a->m + b, mq, len);
  memcpy((uint8_t *)a->v + b, vq, len);
  a->m_scale[blk] = mmax;
  a->v_scale[blk] = smax;
}

/* Blocks ahead whose lines the 8-bit step asks for (bench/RESULTS.md:
 * 0, 8 and 24 measured, 8 kept). */
#define ZS__Q8_AHEAD 8

/* Asks for the cache lines of the block at element b (params, gradients,
 * codes; out is written only). */
static void q8_prefetch(const zs__optim_args *a, size_t b) {
  size_t k, ps = zs__dtype_size(a->pd), gsz = zs__dtype_size(a->gd);
  for (k = 0; k < ZS_OPTIM_QBLOCK * ps; k += 64)
    ZS__PREFETCH(a->param + b * ps + k);
  for (k = 0; k < ZS_OPTIM_QBLOCK * gsz; k += 64)
    ZS__PREFETCH(a->grad + b * gsz + k);
  for (k = 0; k < ZS_OPTIM_QBLOCK; k += 64) {
    ZS__PREFETCH(a->m + b + k);
    ZS__PREFETCH(a->v + b + k);
  }
}

/* 8-bit Adam over [begin, end): the kernels' two passes per block. */
static void adam_q8_range(const zs__q8_ops *ops, const zs__optim_args *a,
                          size_t begin, size_t end) {
  /* Two sets of scratch: a software pipeline over the full blocks runs the
   * moments of block k, then the finish of block k - 1, so the wait for a
   * block's maxima (the horizontal reduction, the scale division) overlaps
   * with the next block's work instead of stalling it. The two blocks share
   * no element, code or scale. */
  float mt[2][ZS_OPTIM_QBLOCK], st[2][ZS_OPTIM_QBLOCK], mx[2], sx[2];
  zs__optim_args s[2];
  size_t nfull = (end - begin) / ZS_OPTIM_QBLOCK, k;
  for (k = 0; k <= nfull; k++) {
    if (k < nfull) {
      size_t b = begin + k * ZS_OPTIM_QBLOCK, blk = b / ZS_OPTIM_QBLOCK;
      int i = (int)(k & 1);
      if (k + ZS__Q8_AHEAD < nfull)
        q8_prefetch(a, b + ZS__Q8_AHEAD * ZS_OPTIM_QBLOCK);
      s[i] = offset_args(a, b);
      ops->moments(&s[i], (int8_t *)a->m + b, a->m_scale[blk],
                   (uint8_t *)a->v + b, a->v_scale[blk], mt[i], st[i], &mx[i],
                   &sx[i]);
    }
    if (k > 0) {
      size_t b = begin + (k - 1) * ZS_OPTIM_QBLOCK, blk = b / ZS_OPTIM_QBLOCK;
      int i = (int)((k - 1) & 1);
      ops->finish(&s[i], mt[i], st[i], mx[i], sx[i], (int8_t *)a->m + b,
                  (uint8_t *)a->v + b);
      a->m_scale[blk] = mx[i];
      a->v_scale[blk] = sx[i];
    }
  }
  if (begin + nfull * ZS_OPTIM_QBLOCK < end)
    q8_short_block(ops, a, begin + nfull * ZS_OPTIM_QBLOCK,
                   end - begin - nfull * ZS_OPTIM_QBLOCK);
}

int zs_adam_q8_dequantize(const int8_t *m, const float *m_scale,
                          const uint8_t *v, const float *v_scale, size_t n,
                          float *m_out, float *v_out) {
  static const char fn[] = "zs_adam_q8_dequantize";
  float mt[ZS_OPTIM_QBLOCK], vt[ZS_OPTIM_QBLOCK];
  int8_t mq[ZS_OPTIM_QBLOCK];
  uint8_t vq[ZS_OPTIM_QBLOCK];
  size_t b;
  if ((m_out && (!m || !m_scale)) || (v_out && (!v || !v_scale)))
    return zs__fail(ZS_EINVAL, "%s: an output was given without its codes "
                    "or scales", fn);
  for (b = 0; b < n; b += ZS_OPTIM_QBLOCK) {
    size_t len = ZS_MIN((size_t)ZS_OPTIM_QBLOCK, n - b);
    size_t blk = b / ZS_OPTIM_QBLOCK;
    memset(mq, 0, sizeof mq);
    memset(vq, 0, sizeof vq);
    if (m_out) memcpy(mq, m + b, len);
    if (v_out) memcpy(vq, v + b, len);
    zs__q8_dequant_block(mq, m_out ? m_scale[blk] : 0.0f, vq,
                         v_out ? v_scale[blk] : 0.0f, mt, vt);
    if (m_out) memcpy(m_out + b, mt, len * sizeof(float));
    if (v_out) memcpy(v_out + b, vt, len * sizeof(float));
  }
  return 0;
}

int zs_adam_q8_quantize(const float *m, const float *v, size_t n, int8_t *m_q,
                        float *m_scale, uint8_t *v_q, float *v_scale) {
  static const char fn[] = "zs_adam_q8_quantize";
  float mt[ZS_OPTIM_QBLOCK], vt[ZS_OPTIM_QBLOCK];
  int8_t mq[ZS_OPTIM_QBLOCK];
  uint8_t vq[ZS_OPTIM_QBLOCK];
  size_t b, i;
  if (n && (!m || !v || !m_q || !m_scale || !v_q || !v_scale))
    return zs__fail(ZS_EINVAL, "%s: every pointer must be non-NULL", fn);
  for (i = 0; i < n; i++)
    if (!(v[i] >= 0.0f) || !isfinite(v[i]) || !isfinite(m[i]))
      return zs__fail(ZS_EINVAL, "%s: element %zu has m = %g, v = %g; m must "
                      "be finite and v finite and >= 0", fn, i, (double)m[i],
                      (double)v[i]);
  for (b = 0; b < n; b += ZS_OPTIM_QBLOCK) {
    size_t len = ZS_MIN((size_t)ZS_OPTIM_QBLOCK, n - b);
    size_t blk = b / ZS_OPTIM_QBLOCK;
    memset(mt, 0, sizeof mt);
    memset(vt, 0, sizeof vt);
    memcpy(mt, m + b, len * sizeof(float));
    for (i = 0; i < len; i++) vt[i] = sqrtf(v[b + i]);
    m_scale[blk] = v_scale[blk] = 0.0f;
    for (i = 0; i < len; i++) {
      m_scale[blk] = zs__maxps(fabsf(mt[i]), m_scale[blk]);
      v_scale[blk] = zs__maxps(vt[i], v_scale[blk]);
    }
    zs__q8_quant_block(mt, vt, m_scale[blk], v_scale[blk], mq, vq);
    memcpy(m_q + b, mq, len);
    memcpy(v_q + b, vq, len);
  }
  return 0;
}

/* ------------------------------------------------------------ grad stats */

typedef struct {
  zs__sumsq_fn fn;
  const void *g;
  int dtype;
  float scale;
  double *partial;
} zs__stats_ctx;

static void stats_range(void *ctx, size_t begin, size_t end, int worker) {
  zs__stats_ctx *c = ctx;
  (void)worker;
  c->partial[begin / ZS_OPTIM_CHUNK] =
      c->fn(c->g, c->dtype, c->scale, begin, end);
}

int zs_grad_stats(const void *g, int dtype, size_t n, double scale,
                  zs_pool *pool, int num_threads, double *sumsq,
                  int *nonfinite) {
  static const char fn[] = "zs_grad_stats";
  const zs__optim_kernels *k = NULL;
  zs__stats_ctx c;
  double local[64], total = 0.0;
  size_t nchunks = n / ZS_OPTIM_CHUNK + (n % ZS_OPTIM_CHUNK != 0), i;
  int rc;
  if (!sumsq) return zs__fail(ZS_EINVAL, "%s: sumsq is NULL", fn);
  if (!is_float_dtype(dtype))
    return zs__fail(ZS_EDTYPE, "%s: dtype %d (%s) is not f32, bf16 or f16",
                    fn, dtype, dtype_name(dtype));
  if (n && !g) return zs__fail(ZS_EINVAL, "%s: g is NULL", fn);
  if (n && (uintptr_t)g % zs__dtype_size(dtype))
    return zs__fail(ZS_EALIGN, "%s: g (%p) is not aligned to its element "
                    "size %zu", fn, g, zs__dtype_size(dtype));
  if ((rc = check_common(fn, scale, num_threads)) < 0) return rc;
  if ((rc = pick(fn, &k)) < 0) return rc;
  c.partial = local;
  if (nchunks > ZS_ARRAY_SIZE(local)) {
    if ((rc = zs__fault_check("optim.stats_alloc")) < 0) return rc;
    c.partial = malloc(nchunks * sizeof(double));
    if (!c.partial)
      return zs__fail(ZS_ENOMEM, "%s: cannot allocate %zu partial sums", fn,
                      nchunks);
  }
  c.fn = k->sumsq;
  c.g = g;
  c.dtype = dtype;
  c.scale = (float)scale;
  rc = zs_pool_parallel_for(pool ? pool : zs_pool_default(), n,
                            ZS_OPTIM_CHUNK, num_threads, stats_range, &c);
  if (rc == 0) {
    /* In chunk order, whatever thread computed each partial. */
    for (i = 0; i < nchunks; i++) total += c.partial[i];
    *sumsq = total;
    if (nonfinite) *nonfinite = !isfinite(total);
  }
  if (c.partial != local) free(c.partial);
  return rc;
}
