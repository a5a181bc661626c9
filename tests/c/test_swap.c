/* The NVMe optimizer swapper. Every case runs under the aio backend the
 * environment selects (ctest registers one variant per backend); a backend
 * this machine lacks makes the cases SKIP with the reason.
 *
 * The reference is the same optimizer kernel called directly on in-RAM
 * images laid out as zs_swap_layout says; the swapper must match it bit for
 * bit (it calls the same kernels, sliced at ZS_OPTIM_CHUNK multiples, which
 * optim.h guarantees changes no bits), so every comparison is memcmp. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_internal.h"
#include "zspeed/aio.h"
#include "zspeed/optim.h"
#include "swap/swap_internal.h"
#include "zt.h"

#define MAXP 8

typedef struct setup {
  int opt, sd, gd, od, bufs, nparts;
  uint64_t sizes[MAXP];
  int compact; /* the compact layout (one slot per partition + spares) */
} setup;

typedef struct harness {
  setup su;
  zs_swap *s;
  char dir[512];
  unsigned char *ref[MAXP];
  int64_t img[MAXP], po[MAXP], mo[MAXP], vo[MAXP], mso[MAXP], vso[MAXP];
  void *grads[MAXP], *outs[MAXP], *routs[MAXP];
} harness;


/* Random finite values of each dtype, built from bit fields so no
 * conversion routine is involved. */
static void fill_random(void *p, int dt, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) {
    uint64_t r = zt_rand();
    if (dt == ZS_DTYPE_F32) {
      ((float *)p)[i] = (float)(zt_randf() * 2 - 1);
    } else if (dt == ZS_DTYPE_BF16) {
      ((uint16_t *)p)[i] = (uint16_t)((r & 0x807F) | ((100 + (r >> 20) % 30) << 7));
    } else {
      ((uint16_t *)p)[i] = (uint16_t)((r & 0x83FF) | ((1 + (r >> 20) % 29) << 10));
    }
  }
}

static void h_free(harness *h) {
  int i;
  if (h->s) zs_swap_destroy(h->s);
  for (i = 0; i < MAXP; i++) {
    free(h->ref[i]);
    free(h->grads[i]);
    free(h->outs[i]);
    free(h->routs[i]);
  }
  if (h->dir[0]) zt_rmtree(h->dir);
  memset(h, 0, sizeof *h);
}

static void base_config(zs_swap_config *c, const harness *h) {
  zs_swap_config_init(c);
  c->path = h->dir;
  c->partitions = h->su.nparts;
  c->sizes = h->su.sizes;
  c->buffer_count = h->su.bufs;
  c->optimizer = h->su.opt;
  c->state_dtype = h->su.sd;
  c->weight_decay = 0.01;
  c->num_threads = 1; /* smaller compute slices: more pipeline rounds */
  c->compact = h->su.compact;
}

/* Creates a swapper for su with random initial weights and the matching
 * reference images. Returns 1, or 0 after recording a skip or failure. */
static int h_open(harness *h, const setup *su) {
  zs_swap_config c;
  int i, rc;
  memset(h, 0, sizeof *h);
  h->su = *su;
  snprintf(h->dir, sizeof h->dir, "%s", zt_tmpdir());
  base_config(&c, h);
  rc = zs_swap_create(&h->s, &c);
  if (rc == ZS_ENOTSUP) {
    zt__skip("aio backend not usable here: %s", zs_last_error());
    h_free(h);
    return 0;
  }
  if (rc) {
    zt__fail(__FILE__, __LINE__, "zs_swap_create: %s", zs_last_error());
    h_free(h);
    return 0;
  }
  for (i = 0; i < su->nparts; i++) {
    size_t n = (size_t)su->sizes[i];
    zs_swap_layout(h->s, i, &h->po[i], &h->mo[i], &h->vo[i], &h->mso[i],
                   &h->vso[i], &h->img[i]);
    h->ref[i] = calloc(1, (size_t)h->img[i]);
    h->grads[i] = malloc(n * 4);
    h->outs[i] = malloc(n * 2);
    h->routs[i] = malloc(n * 2);
    if (!h->ref[i] || !h->grads[i] || !h->outs[i] || !h->routs[i]) {
      zt__fail(__FILE__, __LINE__, "out of memory");
      h_free(h);
      return 0;
    }
    fill_random(h->ref[i] + h->po[i], ZS_DTYPE_F32, n);
    rc = zs_swap_init_partition(h->s, i, (const float *)(h->ref[i] + h->po[i]));
    if (rc) {
      zt__fail(__FILE__, __LINE__, "init_partition: %s", zs_last_error());
      h_free(h);
      return 0;
    }
  }
  return 1;
}

static void h_new_grads(harness *h) {
  int i;
  for (i = 0; i < h->su.nparts; i++)
    fill_random(h->grads[i], h->su.gd, (size_t)h->su.sizes[i]);
}

/* One reference step on the in-RAM images, with the swapper's current
 * hyperparameters. */
static int h_ref_step(harness *h, double lr, double scale, int64_t step) {
  double b1, b2, eps, wd;
  int i, rc = 0;
  zs_swap_get_hparams(h->s, NULL, &b1, &b2, &eps, &wd);
  for (i = 0; i < h->su.nparts && rc == 0; i++) {
    zs_optim_tensors t;
    unsigned char *b = h->ref[i];
    zs_optim_tensors_init(&t);
    t.n = (size_t)h->su.sizes[i];
    t.param = b + h->po[i];
    t.grad = h->grads[i];
    t.grad_dtype = h->su.gd;
    t.state_dtype = h->su.sd;
    if (h->mo[i] >= 0) t.m = b + h->mo[i];
    if (h->vo[i] >= 0) t.v = b + h->vo[i];
    if (h->su.sd == ZS_DTYPE_Q8) {
      t.m_scale = (float *)(b + h->mso[i]);
      t.v_scale = (float *)(b + h->vso[i]);
    }
    if (h->su.od != ZS_DTYPE_NONE) {
      t.out = h->routs[i];
      t.out_dtype = h->su.od;
    }
    if (h->su.opt == ZS_SWAP_ADAM) {
      zs_adam_config c;
      zs_adam_config_init(&c);
      c.lr = lr, c.beta1 = b1, c.beta2 = b2, c.eps = eps, c.weight_decay = wd;
      c.grad_scale = scale, c.step = step;
      rc = zs_adam_step(&c, &t);
    } else if (h->su.opt == ZS_SWAP_ADAGRAD) {
      zs_adagrad_config c;
      zs_adagrad_config_init(&c);
      c.lr = lr, c.eps = eps, c.weight_decay = wd, c.grad_scale = scale;
      rc = zs_adagrad_step(&c, &t);
    } else {
      zs_lion_config c;
      zs_lion_config_init(&c);
      c.lr = lr, c.beta1 = b1, c.beta2 = b2, c.weight_decay = wd;
      c.grad_scale = scale;
      rc = zs_lion_step(&c, &t);
    }
  }
  return rc;
}

static int h_step(harness *h, double lr, double scale) {
  zs_swap_step_args a;
  zs_swap_step_args_init(&a);
  a.grads = (const void *const *)h->grads;
  a.grad_dtype = h->su.gd;
  if (h->su.od != ZS_DTYPE_NONE) {
    a.outs = h->outs;
    a.out_dtype = h->su.od;
  }
  a.grad_scale = scale;
  a.lr = lr;
  return zs_swap_step(h->s, &a);
}

/* 1 if every partition's image equals the reference (and the out copies
 * when check_outs), else records a failure. */
static int h_same(harness *h, int check_outs, int line) {
  int i;
  for (i = 0; i < h->su.nparts; i++) {
    unsigned char *img = malloc((size_t)h->img[i]);
    int rc = zs_swap_read_image(h->s, i, img, h->img[i]);
    int same = rc == 0 && memcmp(img, h->ref[i], (size_t)h->img[i]) == 0;
    free(img);
    if (rc) {
      zt__fail(__FILE__, line, "read_image %d: %s", i, zs_last_error());
      return 0;
    }
    if (!same) {
      zt__fail(__FILE__, line, "partition %d (n = %llu) differs from the "
               "in-RAM reference", i, (unsigned long long)h->su.sizes[i]);
      return 0;
    }
    if (check_outs && h->su.od != ZS_DTYPE_NONE &&
        memcmp(h->outs[i], h->routs[i], (size_t)h->su.sizes[i] * 2) != 0) {
      zt__fail(__FILE__, line, "out copy of partition %d differs", i);
      return 0;
    }
  }
  return 1;
}

/* Steps t = from, ..., to on new gradients (lr 1e-3), the swapper and the
 * reference alike; 0 or the first error. */
static int h_train(harness *h, int from, int to) {
  int t, rc = 0;
  for (t = from; t <= to && rc == 0; t++) {
    h_new_grads(h);
    rc = h_step(h, 1e-3, 1.0);
    if (rc == 0) rc = h_ref_step(h, 1e-3, 1.0, t);
  }
  return rc;
}

/* A second swapper with the harness's configuration, in file `name`. */
static int h_create_other(const harness *h, const char *name, zs_swap **out) {
  zs_swap_config c;
  base_config(&c, h);
  c.name = name;
  return zs_swap_create(out, &c);
}

/* Steps another swapper with the same sizes on the harness's gradients. */
static int h_step_on(harness *h, zs_swap *other, double lr) {
  zs_swap *first = h->s;
  int rc;
  h->s = other;
  rc = h_step(h, lr, 1.0);
  h->s = first;
  return rc;
}

/* h_same for another swapper with the same sizes (for the out copies: the
 * ones its last step left in h->outs). */
static int h_same_other(harness *h, zs_swap *other, int check_outs, int line) {
  zs_swap *first = h->s;
  int same;
  h->s = other;
  same = h_same(h, check_outs, line);
  h->s = first;
  return same;
}

/* Many steps, odd sizes (1, 3, not multiples of the alignment, one larger
 * than a compute slice), every optimizer and state dtype, every buffer
 * count from 1 to 5, changing lr and grad_scale: bit-exact. */
static void equal_in_ram(void) {
  static const int combos[7][2] = {
      {ZS_SWAP_ADAM, ZS_DTYPE_F32},    {ZS_SWAP_ADAM, ZS_DTYPE_BF16},
      {ZS_SWAP_ADAM, ZS_DTYPE_Q8},     {ZS_SWAP_ADAGRAD, ZS_DTYPE_F32},
      {ZS_SWAP_ADAGRAD, ZS_DTYPE_BF16}, {ZS_SWAP_LION, ZS_DTYPE_F32},
      {ZS_SWAP_LION, ZS_DTYPE_BF16}};
  static const int gds[3] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_F16};
  static const int ods[3] = {ZS_DTYPE_BF16, ZS_DTYPE_NONE, ZS_DTYPE_F16};
  int c, t;
  for (c = 0; c < 7; c++) {
    setup su = {0, 0, 0, 0, 0, 6, {140001, 1, 3, 16391, 70001, 1000}, 0};
    harness h;
    zs_swap_stats st;
    su.opt = combos[c][0], su.sd = combos[c][1];
    su.gd = gds[c % 3], su.od = ods[c % 3], su.bufs = 1 + c % 5;
    if (!h_open(&h, &su)) return;
    if (!h_same(&h, 0, __LINE__)) goto out;
    for (t = 1; t <= 6; t++) {
      double lr, scale = t % 3 == 0 ? 0.5 : 1.0 + t % 2;
      zs_swap_get_hparams(h.s, &lr, NULL, NULL, NULL, NULL);
      lr *= 1.0 + 0.1 * t;
      h_new_grads(&h);
      ZT_OK(h_step(&h, lr, scale));
      ZT_OK(h_ref_step(&h, lr, scale, t));
      ZT_CHECK(zs_swap_steps(h.s) == t);
      if (!h_same(&h, 1, __LINE__)) goto out;
    }
    zs_swap_stats_get(h.s, &st);
    ZT_CHECK(st.steps == 6 && st.failed_steps == 0);
    ZT_CHECK(st.compute_ns > 0 && st.step_ns >= st.compute_ns);
  out:
    h_free(&h);
    if (zt__failed()) return;
  }
}

/* A fault on the nth read / write / aio piece / submit: the step fails with
 * the injected error and a message naming the partition, every partition
 * keeps its old state bit for bit, the step counter does not move, and
 * retrying the step (fault gone) matches the reference. */
static void faults_keep_state(void) {
  static const struct {
    const char *site;
    int n, err;
  } f[] = {{"swap.read", 1, ZS_EIO},    {"swap.read", 3, ZS_EIO},
           {"swap.write", 1, ZS_ENOSPC}, {"swap.write", 4, ZS_EIO},
           {"aio.submit", 2, ZS_ENOSPC}, {"aio.io", 1, ZS_EIO},
           {"aio.io", 4, ZS_ENOSPC},     {"aio.io", 6, ZS_EIO},
           {"aio.io", 8, ZS_ENOSPC},     {"swap.sync", 1, ZS_EIO},
           {"file.write", 2, ZS_ENOSPC}};
  setup su = {ZS_SWAP_ADAM, ZS_DTYPE_F32, ZS_DTYPE_F32, ZS_DTYPE_BF16, 3, 4,
              {5000, 70001, 3, 16391}, 0};
  harness h;
  int64_t step = 0;
  size_t k;
  if (!h_open(&h, &su)) return;
  for (k = 0; k < ZS_ARRAY_SIZE(f); k++) {
    int rc, sync = strcmp(f[k].site, "swap.sync") == 0;
    double lr;
    zs_swap_get_hparams(h.s, &lr, NULL, NULL, NULL, NULL);
    h.s->sync_each_step = sync; /* the internal flag; tested sites only */
    h_new_grads(&h);
    ZT_OK(zs_fault_set(f[k].site, f[k].n, 1, f[k].err));
    rc = h_step(&h, lr, 1.0);
    if (rc == 0 && strcmp(f[k].site, "file.write") == 0 &&
        strcmp(zs_swap_backend(h.s), "threads") != 0) {
      /* Only the threads backend writes through the file layer. */
      zs_fault_clear();
      ZT_OK(h_ref_step(&h, lr, 1.0, ++step));
      if (!h_same(&h, 1, __LINE__)) break;
      continue;
    }
    zs_fault_clear();
    ZT_CHECKF(rc == f[k].err, "fault %s #%d: step returned %s (%s)",
              f[k].site, f[k].n, zs_err_name(rc), zs_last_error());
    ZT_CHECKF(strstr(zs_last_error(), "partition") &&
                  strstr(zs_last_error(), "keeps the state of step"),
              "unclear message: %s", zs_last_error());
    ZT_CHECK(zs_swap_steps(h.s) == step);
    if (!h_same(&h, 0, __LINE__)) break;
    /* The retry succeeds and lands on the reference's next step. */
    ZT_OK(h_step(&h, lr, 1.0));
    ZT_OK(h_ref_step(&h, lr, 1.0, ++step));
    ZT_CHECK(zs_swap_steps(h.s) == step);
    if (!h_same(&h, 1, __LINE__)) break;
  }
  /* Short transfers are continued by the engine: no error at all. */
  if (!zt__failed()) {
    double lr;
    zs_swap_get_hparams(h.s, &lr, NULL, NULL, NULL, NULL);
    h_new_grads(&h);
    ZT_OK(zs_fault_set("aio.short", 2, 3, ZS_EIO));
    ZT_OK(h_step(&h, lr, 1.0));
    zs_fault_clear();
    ZT_OK(h_ref_step(&h, lr, 1.0, ++step));
    h_same(&h, 1, __LINE__);
  }
  zs_fault_clear();
  h_free(&h);
}

/* A swap file truncated behind the swapper's back: the step fails with
 * ZS_EOF naming the partition, and the step counter does not move. */
static void short_file(void) {
  setup su = {ZS_SWAP_ADAM, ZS_DTYPE_BF16, ZS_DTYPE_F32, ZS_DTYPE_NONE, 2, 3,
              {9000, 20000, 7}, 0};
  harness h;
  zs__file f = ZS__FILE_INIT;
  float *p = NULL;
  int rc;
  if (!h_open(&h, &su)) return;
  h_new_grads(&h);
  ZT_OK(zs__file_open(&f, zs_swap_file_path(h.s), ZS__O_RDWR));
  ZT_OK(zs__file_truncate(&f, (uint64_t)zs_swap_file_bytes(h.s) / 3));
  zs__file_close(&f);
  rc = h_step(&h, 1e-3, 1.0);
  ZT_CHECKF(rc == ZS_EOF, "step on a truncated file returned %s: %s",
            zs_err_name(rc), zs_last_error());
  ZT_CHECKF(strstr(zs_last_error(), "reading partition"), "message: %s",
            zs_last_error());
  ZT_CHECK(zs_swap_steps(h.s) == 0);
  p = malloc(20000 * 4);
  ZT_CHECK(p);
  ZT_ERR(zs_swap_get_state(h.s, 2, p, NULL, NULL), ZS_EOF);
  free(p);
  h_free(&h);
}

/* fp32 state views and raw images round-trip into a second swapper, which
 * then steps identically. */
static void checkpoint_roundtrip(void) {
  static const int sds[3] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_Q8};
  int d, i;
  for (d = 0; d < 3; d++) {
    setup su = {ZS_SWAP_ADAM, 0, ZS_DTYPE_BF16, ZS_DTYPE_BF16, 3, 3,
                {33333, 5, 4097}, 0};
    harness h, h2;
    zs_swap_config c;
    float *p = malloc(33333 * 4), *m = malloc(33333 * 4), *v = malloc(33333 * 4);
    float *rm = malloc(33333 * 4), *rv = malloc(33333 * 4);
    unsigned char *img = malloc(33333 * 8);
    ZT_CHECK(p && m && v && rm && rv && img);
    su.sd = sds[d];
    if (!h_open(&h, &su)) goto out_mem;
    memset(&h2, 0, sizeof h2);
    for (i = 1; i <= 3; i++) {
      h_new_grads(&h);
      ZT_OK(h_step(&h, 1e-3, 1.0));
      ZT_OK(h_ref_step(&h, 1e-3, 1.0, i));
    }
    base_config(&c, &h);
    c.name = "second";
    ZT_OK(zs_swap_create(&h2.s, &c));
    for (i = 0; i < su.nparts; i++) {
      size_t n = (size_t)su.sizes[i];
      unsigned char *r = h.ref[i];
      ZT_OK(zs_swap_get_state(h.s, i, p, m, v));
      ZT_CHECK(memcmp(p, r + h.po[i], n * 4) == 0);
      /* The fp32 view is the reference's states converted exactly. */
      if (su.sd == ZS_DTYPE_Q8) {
        ZT_OK(zs_adam_q8_dequantize((int8_t *)(r + h.mo[i]),
                                    (float *)(r + h.mso[i]),
                                    (uint8_t *)(r + h.vo[i]),
                                    (float *)(r + h.vso[i]), n, rm, rv));
        ZT_CHECK(memcmp(m, rm, n * 4) == 0 && memcmp(v, rv, n * 4) == 0);
        ZT_OK(zs_swap_read_image(h.s, i, img, h.img[i]));
        ZT_OK(zs_swap_write_image(h2.s, i, img, h.img[i]));
      } else {
        size_t k;
        for (k = 0; k < n; k++) {
          uint32_t u;
          float x;
          if (su.sd == ZS_DTYPE_F32) {
            x = ((float *)(r + h.mo[i]))[k];
          } else {
            u = (uint32_t)((uint16_t *)(r + h.mo[i]))[k] << 16;
            memcpy(&x, &u, 4);
          }
          ZT_CHECKF(memcmp(&x, &m[k], 4) == 0, "m[%zu] of partition %d", k, i);
        }
        ZT_OK(zs_swap_set_state(h2.s, i, p, m, v));
      }
    }
    ZT_OK(zs_swap_set_steps(h2.s, 3));
    /* Both swappers step on: identical images, equal to the reference. */
    h_new_grads(&h);
    ZT_OK(h_step(&h, 1e-3, 1.0));
    ZT_OK(h_ref_step(&h, 1e-3, 1.0, 4));
    {
      zs_swap *first = h.s;
      if (!h_same(&h, 1, __LINE__)) goto out;
      h.s = h2.s;
      ZT_OK(h_step(&h, 1e-3, 1.0));
      ZT_CHECK(zs_swap_steps(h.s) == 4);
      i = h_same(&h, 1, __LINE__);
      h.s = first;
      if (!i) goto out;
    }
  out:
    zs_swap_destroy(h2.s);
    h_free(&h);
  out_mem:
    free(p), free(m), free(v), free(rm), free(rv), free(img);
    if (zt__failed()) return;
  }
}

/* Typed array access: reading returns each array exactly as the in-RAM
 * reference stores it; writing every array into a fresh swapper
 * reproduces the state, which then steps like the reference; writing the
 * master weights alone keeps every state byte (8-bit codes and scales
 * included: nothing is requantized); bad combinations and I/O faults
 * change nothing; a fresh partition written with weights alone has zero
 * states. */
static void typed_arrays(void) {
  static const int combos[5][2] = {
      {ZS_SWAP_ADAM, ZS_DTYPE_F32}, {ZS_SWAP_ADAM, ZS_DTYPE_BF16},
      {ZS_SWAP_ADAM, ZS_DTYPE_Q8}, {ZS_SWAP_ADAGRAD, ZS_DTYPE_F32},
      {ZS_SWAP_LION, ZS_DTYPE_BF16}};
  enum { NMAX = 33333 };
  int c, i;
  for (c = 0; c < 5; c++) {
    setup su = {0, 0, ZS_DTYPE_F32, ZS_DTYPE_BF16, 3, 3, {NMAX, 5, 4097}, 0};
    harness h;
    zs_swap *s2 = NULL;
    int q8 = combos[c][1] == ZS_DTYPE_Q8;
    size_t es;
    float *p = malloc(NMAX * 4), *ms = malloc(NMAX * 4), *vs = malloc(NMAX * 4);
    unsigned char *m = malloc(NMAX * 4), *v = malloc(NMAX * 4);
    su.opt = combos[c][0], su.sd = combos[c][1];
    es = zs__swap_state_es(su.sd);
    if (!p || !ms || !vs || !m || !v) {
      zt__fail(__FILE__, __LINE__, "out of memory");
      goto out_mem;
    }
    if (!h_open(&h, &su)) goto out_mem;
    ZT_OK(h_train(&h, 1, 2));
    ZT_OK(h_create_other(&h, "typed", &s2));
    for (i = 0; i < su.nparts; i++) {
      size_t n = (size_t)su.sizes[i], qb = zs_optim_qblocks(n) * 4;
      const unsigned char *r = h.ref[i];
      void *pm = h.mo[i] >= 0 ? m : NULL, *pv = h.vo[i] >= 0 ? v : NULL;
      float *pms = q8 ? ms : NULL, *pvs = q8 ? vs : NULL;
      ZT_OK(zs_swap_read_arrays(h.s, i, p, pm, pv, pms, pvs));
      ZT_CHECKF(memcmp(p, r + h.po[i], n * 4) == 0, "param %d", i);
      ZT_CHECKF(!pm || memcmp(m, r + h.mo[i], n * es) == 0, "m %d", i);
      ZT_CHECKF(!pv || memcmp(v, r + h.vo[i], n * es) == 0, "v %d", i);
      ZT_CHECKF(!q8 || (memcmp(ms, r + h.mso[i], qb) == 0 &&
                        memcmp(vs, r + h.vso[i], qb) == 0), "scales %d", i);
      ZT_OK(zs_swap_write_arrays(s2, i, p, pm, pv, pms, pvs));
    }
    /* Both swappers step on and match the reference. */
    ZT_OK(zs_swap_set_steps(s2, 2));
    ZT_OK(h_train(&h, 3, 3));
    if (!h_same(&h, 1, __LINE__)) goto out;
    ZT_OK(h_step_on(&h, s2, 1e-3));
    if (!h_same_other(&h, s2, 1, __LINE__)) goto out;
    /* New master weights alone: every state byte stays, and the next step
     * starts from the new weights. */
    for (i = 0; i < su.nparts; i++) {
      size_t n = (size_t)su.sizes[i];
      fill_random(p, ZS_DTYPE_F32, n);
      ZT_OK(zs_swap_write_arrays(h.s, i, p, NULL, NULL, NULL, NULL));
      memcpy(h.ref[i] + h.po[i], p, n * 4);
    }
    if (!h_same(&h, 0, __LINE__)) goto out;
    ZT_OK(h_train(&h, 4, 4));
    if (!h_same(&h, 1, __LINE__)) goto out;
    /* Refused, changing nothing: scales without codes or for states that
     * are not 8-bit, Adagrad's m, Lion's v, a partition out of range, and
     * a write whose I/O fails. */
    if (q8) {
      ZT_ERR(zs_swap_write_arrays(h.s, 0, NULL, m, NULL, NULL, NULL),
             ZS_EINVAL);
      ZT_ERR(zs_swap_read_arrays(h.s, 0, NULL, NULL, v, ms, NULL), ZS_EINVAL);
    } else {
      ZT_ERR(zs_swap_write_arrays(h.s, 0, NULL, NULL, NULL, ms, NULL),
             ZS_EINVAL);
    }
    if (su.opt == ZS_SWAP_ADAGRAD)
      ZT_ERR(zs_swap_read_arrays(h.s, 0, NULL, m, NULL, NULL, NULL), ZS_EINVAL);
    if (su.opt == ZS_SWAP_LION)
      ZT_ERR(zs_swap_write_arrays(h.s, 0, NULL, NULL, v, NULL, NULL),
             ZS_EINVAL);
    ZT_ERR(zs_swap_read_arrays(h.s, 3, p, NULL, NULL, NULL, NULL), ZS_EINVAL);
    fill_random(p, ZS_DTYPE_F32, NMAX);
    ZT_OK(zs_fault_set("swap.write", 1, 1, ZS_ENOSPC));
    ZT_ERR(zs_swap_write_arrays(h.s, 0, p, NULL, NULL, NULL, NULL), ZS_ENOSPC);
    zs_fault_clear();
    if (!h_same(&h, 0, __LINE__)) goto out;
    /* A partition that holds no state yet: reading is refused, and the
     * weights written alone come with zero states. */
    zs_swap_destroy(s2);
    s2 = NULL;
    ZT_OK(h_create_other(&h, "typed_fresh", &s2));
    ZT_ERR(zs_swap_read_arrays(s2, 1, p, NULL, NULL, NULL, NULL), ZS_ESTATE);
    ZT_OK(zs_swap_write_arrays(s2, 1, p, NULL, NULL, NULL, NULL));
    {
      unsigned char img[4096];
      int64_t k, nb = zs_swap_image_bytes(s2, 1);
      ZT_CHECK(nb > 20 && nb <= (int64_t)sizeof img);
      ZT_OK(zs_swap_read_image(s2, 1, img, nb));
      ZT_CHECK(memcmp(img + h.po[1], p, 5 * 4) == 0);
      for (k = 20; k < nb && img[k] == 0; k++) continue;
      ZT_CHECKF(k == nb, "byte %lld of a fresh partition's states is not 0",
                (long long)k);
    }
  out:
    zs_swap_destroy(s2);
    h_free(&h);
  out_mem:
    free(p), free(ms), free(vs), free(m), free(v);
    if (zt__failed()) return;
  }
}

/* Bad input is refused with a clear error and changes nothing. */
static void bad_input(void) {
  setup su = {ZS_SWAP_ADAGRAD, ZS_DTYPE_F32, ZS_DTYPE_F32, ZS_DTYPE_NONE, 2, 2,
              {100, 200}, 0};
  harness h;
  zs_swap_config c;
  zs_swap_step_args a;
  zs_swap *s2 = NULL;
  uint64_t zero[2] = {100, 0};
  float buf[200];
  double lr;
  if (!h_open(&h, &su)) return;
  base_config(&c, &h);
  c.name = "other";
  c.path = NULL;
  ZT_ERR(zs_swap_create(&s2, &c), ZS_EINVAL);
  c.path = h.dir;
  c.sizes = zero;
  ZT_ERR(zs_swap_create(&s2, &c), ZS_EINVAL);
  ZT_CHECK(strstr(zs_last_error(), "partition 1") != NULL);
  c.sizes = su.sizes;
  c.buffer_count = 0;
  ZT_ERR(zs_swap_create(&s2, &c), ZS_EINVAL);
  c.buffer_count = 2;
  c.state_dtype = ZS_DTYPE_Q8; /* 8-bit states are Adam only */
  ZT_ERR(zs_swap_create(&s2, &c), ZS_EDTYPE);
  c.state_dtype = ZS_DTYPE_F32;
  c.lr = nan("");
  ZT_ERR(zs_swap_create(&s2, &c), ZS_EINVAL);
  c.lr = -1;
  /* The same file name again: refused, and the live file is untouched. */
  c.name = "zspeed_swap";
  ZT_ERR(zs_swap_create(&s2, &c), ZS_EEXIST);
  ZT_CHECK(strstr(zs_last_error(), "overwrite") != NULL);
  ZT_CHECK(h_same(&h, 0, __LINE__));
  /* Step arguments. */
  h_new_grads(&h);
  zs_swap_step_args_init(&a);
  ZT_ERR(zs_swap_step(h.s, &a), ZS_EINVAL); /* grads NULL */
  a.grads = (const void *const *)h.grads;
  a.grad_dtype = ZS_DTYPE_Q8;
  ZT_ERR(zs_swap_step(h.s, &a), ZS_EDTYPE);
  a.grad_dtype = ZS_DTYPE_F32;
  a.outs = h.outs;
  a.out_dtype = ZS_DTYPE_Q8; /* copy-out is BF16, F16 or F32 */
  ZT_ERR(zs_swap_step(h.s, &a), ZS_EDTYPE);
  a.outs = NULL;
  a.grad_scale = INFINITY;
  ZT_ERR(zs_swap_step(h.s, &a), ZS_EINVAL);
  ZT_CHECK(zs_swap_steps(h.s) == 0 && h_same(&h, 0, __LINE__));
  /* Step numbers stay below INT64_MAX, so the next one always exists. */
  a.grad_scale = 1;
  a.step = INT64_MAX;
  ZT_ERR(zs_swap_step(h.s, &a), ZS_EINVAL);
  a.step = 0;
  ZT_ERR(zs_swap_set_steps(h.s, INT64_MAX), ZS_EINVAL);
  ZT_ERR(zs_swap_set_steps(h.s, -1), ZS_EINVAL);
  ZT_CHECK(zs_swap_steps(h.s) == 0 && h_same(&h, 0, __LINE__));
  /* Hyperparameters: a bad one changes nothing. */
  zs_swap_get_hparams(h.s, &lr, NULL, NULL, NULL, NULL);
  ZT_CHECK(lr == 1e-2); /* Adagrad's default */
  ZT_ERR(zs_swap_set_hparams(h.s, 0.5, -1, -1, INFINITY, -1), ZS_EINVAL);
  zs_swap_get_hparams(h.s, &lr, NULL, NULL, NULL, NULL);
  ZT_CHECK(lr == 1e-2);
  /* State access. */
  ZT_ERR(zs_swap_get_state(h.s, 0, buf, buf, NULL), ZS_EINVAL); /* no m */
  ZT_ERR(zs_swap_get_state(h.s, 2, buf, NULL, NULL), ZS_EINVAL);
  ZT_ERR(zs_swap_read_image(h.s, 0, buf, 3), ZS_EINVAL);
  h_free(&h);
  /* A partition never initialized: the step refuses, naming it. */
  {
    setup s1 = {ZS_SWAP_LION, ZS_DTYPE_F32, ZS_DTYPE_F32, ZS_DTYPE_NONE, 2, 2,
                {10, 20}, 0};
    if (!h_open(&h, &s1)) return;
    base_config(&c, &h);
    c.name = "fresh";
    ZT_OK(zs_swap_create(&s2, &c));
    h_new_grads(&h);
    ZT_OK(zs_swap_init_partition(s2, 0, buf));
    zs_swap_step_args_init(&a);
    a.grads = (const void *const *)h.grads;
    ZT_ERR(zs_swap_step(s2, &a), ZS_ESTATE);
    ZT_CHECK(strstr(zs_last_error(), "partition 1") != NULL);
    zs_swap_destroy(s2);
    h_free(&h);
  }
}

/* Statistics add up, and destroy removes the file. */
static void stats_and_cleanup(void) {
  /* More buffers than partitions: the pipeline must not look past the
   * last partition. */
  setup su = {ZS_SWAP_ADAM, ZS_DTYPE_F32, ZS_DTYPE_F32, ZS_DTYPE_BF16, 8, 5,
              {30000, 30001, 29999, 5, 12345}, 0};
  harness h;
  zs_swap_stats st;
  char path[700];
  FILE *fp;
  if (!h_open(&h, &su)) return;
  zs_swap_stats_reset(h.s);
  h_new_grads(&h);
  ZT_OK(h_step(&h, 1e-3, 1.0));
  ZT_OK(h_ref_step(&h, 1e-3, 1.0, 1));
  if (!h_same(&h, 1, __LINE__)) goto out;
  zs_swap_stats_reset(h.s);
  h_new_grads(&h);
  ZT_OK(h_step(&h, 1e-3, 1.0));
  zs_swap_stats_get(h.s, &st);
  ZT_CHECK(st.steps == 1 && st.failed_steps == 0);
  ZT_CHECK(st.bytes_read == (uint64_t)zs_swap_file_bytes(h.s) / 2);
  ZT_CHECK(st.bytes_written == st.bytes_read);
  ZT_CHECK(st.last_step_ns == st.step_ns && st.compute_ns > 0);
  ZT_CHECK(st.compute_ns + st.read_wait_ns + st.write_wait_ns <= st.step_ns);
  ZT_CHECK(strlen(zs_swap_direct_why(h.s)) > 0);
  snprintf(path, sizeof path, "%s", zs_swap_file_path(h.s));
  fp = fopen(path, "rb");
  ZT_CHECK(fp != NULL);
  fclose(fp);
  ZT_OK(zs_swap_destroy(h.s));
  h.s = NULL;
  fp = fopen(path, "rb");
  ZT_CHECKF(fp == NULL, "%s still exists after zs_swap_destroy", path);
out:
  h_free(&h);
}

/* The I/O-only pass the benchmark measures the disk with reads the active
 * slots and overwrites the inactive ones: the state, the active slots and
 * later steps are unchanged, whatever the request size. */
static void io_pass_keeps_state(void) {
  setup su = {ZS_SWAP_ADAM, ZS_DTYPE_F32, ZS_DTYPE_F32, ZS_DTYPE_BF16, 3, 4,
              {30000, 1, 70001, 4097}, 0};
  static const int64_t lens[3] = {12345, 4096, (int64_t)1 << 20};
  harness h;
  unsigned char *rbuf = NULL, *wbuf = NULL;
  int t, k;
  uint64_t ns;
  if (!h_open(&h, &su)) return;
  rbuf = malloc((size_t)3 << 20); /* 3 read slots of up to 1 MiB */
  wbuf = malloc((size_t)1 << 20);
  if (!rbuf || !wbuf) {
    zt__fail(__FILE__, __LINE__, "out of memory");
    goto out;
  }
  memset(wbuf, 0xA5, (size_t)1 << 20);
  for (t = 1; t <= 3; t++) {
    for (k = 0; k < 3; k++) {
      ns = 0;
      ZT_OK(zs_swap_io_pass(h.s, rbuf, 3, wbuf, lens[k], k != 1, k != 2, &ns));
      ZT_CHECK(ns > 0);
      if (!h_same(&h, 0, __LINE__)) goto out;
    }
    ZT_ERR(zs_swap_io_pass(h.s, rbuf, 0, wbuf, 4096, 1, 1, &ns), ZS_EINVAL);
    ZT_ERR(zs_swap_io_pass(h.s, NULL, 3, wbuf, 4096, 1, 0, &ns), ZS_EINVAL);
    ZT_ERR(zs_swap_io_pass(NULL, rbuf, 3, wbuf, 4096, 1, 1, &ns), ZS_EINVAL);
    ZT_CHECK(zs_swap_steps(h.s) == t - 1);
    h_new_grads(&h);
    ZT_OK(h_step(&h, 1e-3, 1.0));
    ZT_OK(h_ref_step(&h, 1e-3, 1.0, t));
    if (!h_same(&h, 1, __LINE__)) goto out;
  }
out:
  free(rbuf);
  free(wbuf);
  h_free(&h);
}

/* A resumable step whose outs are its gradients (bf16 in, bf16 out: the
 * caller keeps the gradients in the weights' place). */
static int h_step_resumable(harness *h, double lr) {
  zs_swap_step_args a;
  zs_swap_step_args_init(&a);
  a.grads = (const void *const *)h->grads;
  a.grad_dtype = ZS_DTYPE_BF16;
  a.outs = h->grads;
  a.out_dtype = ZS_DTYPE_BF16;
  a.lr = lr;
  a.resumable = 1;
  return zs_swap_step(h->s, &a);
}

/* The compact layout's invariant: every partition's committed image and
 * reservation and every free slot are distinct slots of its class inside
 * the file. 1 if it holds, else records a failure. */
static int compact_consistent(const zs_swap *s, int line) {
  int i, j, k, n = 0;
  int64_t *seen = malloc(sizeof *seen * (size_t)(3 * s->nparts + 64));
  int64_t *cls = malloc(sizeof *cls * (size_t)(3 * s->nparts + 64));
  int ok = seen && cls;
  for (i = 0; ok && i < s->nparts; i++) {
    const zs__swap_part *p = &s->parts[i];
    seen[n] = p->loc, cls[n++] = p->cls;
    if (p->pend >= 0) seen[n] = p->pend, cls[n++] = p->cls;
  }
  for (k = 0; ok && k < s->nclasses; k++)
    for (j = 0; j < s->classes[k].nfree; j++)
      seen[n] = s->classes[k].free[j], cls[n++] = k;
  for (i = 0; ok && i < n; i++) {
    int64_t slot = s->classes[cls[i]].slot;
    if (seen[i] < 0 || seen[i] + slot > s->file_bytes) ok = 0;
    for (j = 0; j < i; j++)
      if (seen[j] == seen[i]) ok = 0;
  }
  free(seen);
  free(cls);
  if (!ok) zt__fail(__FILE__, line, "compact layout: slots overlap or leak");
  return ok;
}

/* Resumable steps with the outs in the gradients' place: a fault anywhere
 * leaves a step that the next call completes, every partition stepped
 * once from its own gradient (the result is the reference's bit for bit,
 * though the failed call overwrote some gradients with weights), or that
 * zs_swap_abandon_step undoes (a compact file: drops the stepped
 * partitions' state, which the caller then writes back, as a checkpoint
 * load does); meanwhile reads work and writes are refused. */
static void resumable_run(int compact) {
  static const struct {
    const char *site;
    int n, err;
  } f[] = {{"swap.read", 1, ZS_EIO},    {"swap.read", 3, ZS_EIO},
           {"swap.write", 1, ZS_ENOSPC}, {"swap.write", 2, ZS_EIO},
           {"swap.write", 4, ZS_EIO},    {"aio.submit", 3, ZS_ENOSPC},
           {"aio.io", 2, ZS_EIO},        {"aio.io", 5, ZS_ENOSPC},
           {"aio.io", 7, ZS_EIO}};
  /* Compact: three partitions of one size share min(3, 2) spares, one of
   * another size shares its one with nobody. */
  setup su = {ZS_SWAP_ADAM, ZS_DTYPE_Q8, ZS_DTYPE_BF16, ZS_DTYPE_BF16, 3, 5,
              {5000, 70001, 3, 16391, 4097}, 0};
  harness h;
  void *keep[MAXP] = {0};
  int64_t step = 0;
  size_t k;
  int i, abandon;
  if (compact) {
    setup cs = {ZS_SWAP_ADAM, ZS_DTYPE_Q8, ZS_DTYPE_BF16, ZS_DTYPE_BF16, 2, 5,
                {70001, 5000, 70001, 70001, 3}, 1};
    su = cs;
  }
  if (!h_open(&h, &su)) return;
  if (compact) {
    /* One slot each plus the spares: 2 of the 70001 size, 1 of each other. */
    int64_t want = 0;
    for (i = 0; i < su.nparts; i++) want += h.s->parts[i].slot;
    want += 2 * h.s->parts[0].slot + h.s->parts[1].slot + h.s->parts[4].slot;
    ZT_CHECKF(zs_swap_file_bytes(h.s) == want, "file %lld bytes, want %lld",
              (long long)zs_swap_file_bytes(h.s), (long long)want);
    ZT_CHECK(zs_swap_compact(h.s) == 1 && h.s->nclasses == 3);
    /* Its steps must be resumable. */
    h_new_grads(&h);
    ZT_ERR(h_step(&h, 1e-3, 1.0), ZS_EINVAL);
    ZT_CHECK(strstr(zs_last_error(), "resumable") != NULL);
  }
  for (i = 0; i < su.nparts; i++)
    if (!(keep[i] = malloc((size_t)su.sizes[i] * 2))) goto out;
  for (abandon = 0; abandon < 2; abandon++) {
    for (k = 0; k < ZS_ARRAY_SIZE(f); k++) {
      int rc, moved;
      unsigned char *img;
      /* Fresh gradients, kept aside: the swapper overwrites them. The
       * reference reads the kept ones (t.grad) and writes routs. */
      h_new_grads(&h);
      for (i = 0; i < su.nparts; i++)
        memcpy(keep[i], h.grads[i], (size_t)su.sizes[i] * 2);
      ZT_OK(zs_fault_set(f[k].site, f[k].n, 1, f[k].err));
      rc = h_step_resumable(&h, 1e-3);
      zs_fault_clear();
      ZT_CHECKF(rc == f[k].err, "fault %s #%d: step returned %s (%s)",
                f[k].site, f[k].n, zs_err_name(rc), zs_last_error());
      if (rc == 0) break;
      ZT_CHECKF(strstr(zs_last_error(), "stopped partway") &&
                    strstr(zs_last_error(), "zs_swap_abandon_step"),
                "unclear message: %s", zs_last_error());
      ZT_CHECK(zs_swap_steps(h.s) == step);
      if (compact && !compact_consistent(h.s, __LINE__)) goto out;
      moved = zs_swap_incomplete_step(h.s) != 0;
      ZT_CHECK(!moved || zs_swap_incomplete_step(h.s) == step + 1);
      if (moved) {
        /* Writes wait for the step, a plain step too; reads work. */
        ZT_ERR(zs_swap_set_steps(h.s, 3), ZS_ESTATE);
        ZT_CHECK(strstr(zs_last_error(), "stopped partway") != NULL);
        ZT_ERR(zs_swap_init_partition(h.s, 0, (const float *)keep[0]),
               ZS_ESTATE);
        ZT_ERR(h_step(&h, 1e-3, 1.0), compact ? ZS_EINVAL : ZS_ESTATE);
        img = malloc((size_t)h.img[1]);
        ZT_OK(zs_swap_read_image(h.s, 1, img, h.img[1]));
        free(img);
        {
          zs_swap_step_args a;
          zs_swap_step_args_init(&a);
          a.grads = (const void *const *)h.grads;
          a.grad_dtype = ZS_DTYPE_BF16;
          a.resumable = 1;
          a.step = step + 5;
          ZT_ERR(zs_swap_step(h.s, &a), ZS_EINVAL);
        }
      }
      if (abandon) {
        int dropped = 0;
        ZT_OK(zs_swap_abandon_step(h.s));
        ZT_CHECK(zs_swap_incomplete_step(h.s) == 0);
        for (i = 0; compact && i < su.nparts; i++) {
          img = malloc((size_t)h.img[i]);
          rc = zs_swap_read_image(h.s, i, img, h.img[i]);
          free(img);
          if (rc == 0) continue;
          /* Dropped: named by the step too, until it is written again. */
          ZT_CHECKF(rc == ZS_ESTATE && strstr(zs_last_error(), "dropped"),
                    "partition %d: %s", i, zs_last_error());
          ZT_ERR(h_step_resumable(&h, 1e-3), ZS_ESTATE);
          ZT_CHECK(strstr(zs_last_error(), "dropped") != NULL);
          ZT_OK(zs_swap_write_image(h.s, i, h.ref[i], h.img[i]));
          dropped++;
        }
        ZT_CHECK(!compact || dropped == 0 || moved);
        if (compact && !compact_consistent(h.s, __LINE__)) goto out;
        if (!h_same(&h, 0, __LINE__)) goto out; /* step t, bit for bit */
        for (i = 0; i < su.nparts; i++) /* the caller's gradients again */
          memcpy(h.grads[i], keep[i], (size_t)su.sizes[i] * 2);
      }
      ZT_OK(h_step_resumable(&h, 1e-3));
      ZT_CHECK(zs_swap_incomplete_step(h.s) == 0);
      for (i = 0; i < su.nparts; i++) { /* the reference's gradients */
        void *t = h.grads[i];
        h.grads[i] = keep[i], keep[i] = t;
      }
      ZT_OK(h_ref_step(&h, 1e-3, 1.0, ++step));
      for (i = 0; i < su.nparts; i++) { /* the swapper's outs */
        void *t = h.grads[i];
        h.grads[i] = keep[i], keep[i] = t;
        memcpy(h.outs[i], h.grads[i], (size_t)su.sizes[i] * 2);
      }
      ZT_CHECK(zs_swap_steps(h.s) == step);
      if (compact && !compact_consistent(h.s, __LINE__)) goto out;
      if (!h_same(&h, 1, __LINE__)) goto out;
    }
  }
  /* Abandoning with nothing incomplete does nothing; resumable steps
   * cannot sync. */
  ZT_OK(zs_swap_abandon_step(h.s));
  ZT_CHECK(zs_swap_steps(h.s) == step && h_same(&h, 0, __LINE__));
  h.s->sync_each_step = 1;
  ZT_ERR(h_step_resumable(&h, 1e-3), ZS_EINVAL);
  h.s->sync_each_step = 0;
  ZT_ERR(zs_swap_abandon_step(NULL), ZS_EINVAL);
out:
  for (i = 0; i < MAXP; i++) free(keep[i]);
  zs_fault_clear();
  h_free(&h);
}

static void resumable_steps(void) { resumable_run(0); }
static void compact_resumable_steps(void) { resumable_run(1); }

/* The compact layout over many clean steps, every optimizer and state
 * dtype and buffer counts 1..4 (the slots rotate through the free lists):
 * bit-exact against the in-RAM kernel; failed state writes keep the old
 * state and leak no slot; the I/O pass writes only free slots. */
static void compact_layout(void) {
  static const int opts[3] = {ZS_SWAP_ADAM, ZS_SWAP_ADAGRAD, ZS_SWAP_LION};
  static const int sds[3] = {ZS_DTYPE_F32, ZS_DTYPE_BF16, ZS_DTYPE_Q8};
  int o, d, bufs;
  for (o = 0; o < 3; o++)
    for (d = 0; d < 3; d++)
      for (bufs = 1; bufs <= 4; bufs++) {
        setup su = {opts[o], sds[d], ZS_DTYPE_BF16, ZS_DTYPE_BF16, bufs, 6,
                    {9001, 9001, 9001, 9001, 257, 9001}, 1};
        harness h;
        int t, i;
        if (opts[o] != ZS_SWAP_ADAM && sds[d] == ZS_DTYPE_Q8) continue;
        if (!h_open(&h, &su)) return;
        for (t = 1; t <= 7; t++) {
          zs_swap_step_args a;
          h_new_grads(&h);
          zs_swap_step_args_init(&a);
          a.grads = (const void *const *)h.grads;
          a.grad_dtype = ZS_DTYPE_BF16;
          a.outs = h.outs;
          a.out_dtype = ZS_DTYPE_BF16;
          a.lr = 1e-3;
          a.resumable = 1;
          ZT_OK(zs_swap_step(h.s, &a));
          ZT_OK(h_ref_step(&h, 1e-3, 1.0, t));
          if (!compact_consistent(h.s, __LINE__) || !h_same(&h, 1, __LINE__))
            break;
        }
        /* A failed state write keeps the old image, and its slot is free
         * again (more failures than there are spares). */
        for (i = 0; i < 3 * bufs + 2; i++) {
          unsigned char *other = malloc((size_t)h.img[i % 6]);
          if (!other) break;
          memset(other, 0x77, (size_t)h.img[i % 6]);
          ZT_OK(zs_fault_set("swap.write", 1, 1, ZS_EIO));
          ZT_ERR(zs_swap_write_image(h.s, i % 6, other, h.img[i % 6]), ZS_EIO);
          zs_fault_clear();
          free(other);
        }
        if (!compact_consistent(h.s, __LINE__) || !h_same(&h, 0, __LINE__)) {
          h_free(&h);
          return;
        }
        {
          unsigned char *rb = malloc((size_t)2 << 16), *wb = malloc(1 << 16);
          if (rb && wb) {
            memset(wb, 0x5A, 1 << 16);
            ZT_OK(zs_swap_io_pass(h.s, rb, 2, wb, 1 << 16, 1, 1, NULL));
            ZT_CHECK(h_same(&h, 0, __LINE__));
          }
          free(rb);
          free(wb);
        }
        h_free(&h);
      }
}

ZT_MAIN(ZT_CASE(equal_in_ram), ZT_CASE(faults_keep_state),
        ZT_CASE(resumable_steps), ZT_CASE(compact_resumable_steps),
        ZT_CASE(compact_layout),
        ZT_CASE(short_file), ZT_CASE(checkpoint_roundtrip),
        ZT_CASE(typed_arrays), ZT_CASE(bad_input), ZT_CASE(stats_and_cleanup),
        ZT_CASE(io_pass_keeps_state))
