/* swap.c - the NVMe optimizer swapper: creation (file layout, buffers,
 * aio handle), the slots of the file (reserve, commit, unreserve), the
 * checks and the kernel call the other swap files share, hyperparameters,
 * information and statistics. The per-partition state access for
 * checkpoints is in swap_state.c, the pipelined step in swap_step.c; both
 * build on this file, which calls neither (below all three: swap_lock.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "swap/swap_internal.h"

#define ZS__SWAP_MAXBUF 64
#define ZS__SWAP_ARRAY_ALIGN 64

static int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

size_t zs__swap_state_es(int dt) {
  return dt == ZS_DTYPE_F32 ? 4 : dt == ZS_DTYPE_BF16 ? 2 : 1;
}

void zs_swap_config_init(zs_swap_config *c) {
  if (!c) return;
  memset(c, 0, sizeof *c);
  c->name = "zspeed_swap";
  c->buffer_count = 4;
  c->optimizer = ZS_SWAP_ADAM;
  c->state_dtype = ZS_DTYPE_F32;
  c->lr = c->beta1 = c->beta2 = c->eps = c->weight_decay = -1;
  c->adamw_mode = 1;
  c->bias_correction = 1;
  c->direct = ZS_AIO_DIRECT_AUTO;
}

void zs_swap_step_args_init(zs_swap_step_args *a) {
  if (!a) return;
  memset(a, 0, sizeof *a);
  a->grad_dtype = ZS_DTYPE_F32;
  a->out_dtype = ZS_DTYPE_BF16;
  a->grad_scale = 1.0;
  a->lr = -1;
}

int zs__swap_check_complete(const zs_swap *s, const char *fn) {
  int i, done = 0;
  if (!s || !s->inc_step) return 0;
  for (i = 0; i < s->nparts; i++) done += s->parts[i].state == ZS__PART_DONE;
  return zs__fail(ZS_ESTATE, "%s: resumable step %lld stopped partway (%d of "
                  "%d partitions are stepped); call zs_swap_step again to "
                  "complete it, or zs_swap_abandon_step to return every "
                  "partition to step %lld, first", fn, (long long)s->inc_step,
                  done, s->nparts, (long long)s->steps);
}

int zs__swap_fault(int write, int part) {
  int rc = zs__fault_check(write ? "swap.write" : "swap.read");
  if (rc)
    return zs__fail(rc, "injected fault at %s of partition %d",
                    write ? "swap.write" : "swap.read", part);
  return 0;
}

/* Runs the configured optimizer on t. With t->n == 0 this only validates
 * the hyperparameters and dtypes, which is how creation and
 * zs_swap_set_hparams check them with the kernels' own rules. */
int zs__swap_kernel(const zs_swap *s, const zs_optim_tensors *t, double lr,
                    double beta1, double beta2, double eps, double wd,
                    double grad_scale, int64_t step) {
  if (s->optimizer == ZS_SWAP_ADAM) {
    zs_adam_config c;
    zs_adam_config_init(&c);
    c.lr = lr, c.beta1 = beta1, c.beta2 = beta2, c.eps = eps;
    c.weight_decay = wd, c.grad_scale = grad_scale, c.step = step;
    c.adamw_mode = s->adamw_mode, c.bias_correction = s->bias_correction;
    c.num_threads = s->num_threads, c.pool = s->pool;
    return zs_adam_step(&c, t);
  }
  if (s->optimizer == ZS_SWAP_ADAGRAD) {
    zs_adagrad_config c;
    zs_adagrad_config_init(&c);
    c.lr = lr, c.eps = eps, c.weight_decay = wd, c.grad_scale = grad_scale;
    c.num_threads = s->num_threads, c.pool = s->pool;
    return zs_adagrad_step(&c, t);
  }
  {
    zs_lion_config c;
    zs_lion_config_init(&c);
    c.lr = lr, c.beta1 = beta1, c.beta2 = beta2, c.weight_decay = wd;
    c.grad_scale = grad_scale;
    c.num_threads = s->num_threads, c.pool = s->pool;
    return zs_lion_step(&c, t);
  }
}

static int validate_hparams(const zs_swap *s, double lr, double b1, double b2,
                            double eps, double wd) {
  zs_optim_tensors t;
  zs_optim_tensors_init(&t);
  t.state_dtype = s->state_dtype;
  return zs__swap_kernel(s, &t, lr, b1, b2, eps, wd, 1.0, 1);
}

/* The chosen optimizer's default for a negative hyperparameter. */
static void resolve_defaults(int opt, double *lr, double *b1, double *b2,
                             double *eps, double *wd) {
  static const double def[3][4] = {{1e-3, 0.9, 0.999, 1e-8},
                                   {1e-2, 0, 0, 1e-10},
                                   {1e-4, 0.9, 0.99, 0}};
  if (*lr < 0) *lr = def[opt][0];
  if (*b1 < 0) *b1 = def[opt][1];
  if (*b2 < 0) *b2 = def[opt][2];
  if (*eps < 0) *eps = def[opt][3];
  if (*wd < 0) *wd = 0;
}

/* Array offsets inside one partition's image. */
static void layout(zs_swap *s, zs__swap_part *p, int64_t align) {
  int64_t n = (int64_t)p->n, es = (int64_t)zs__swap_state_es(s->state_dtype);
  int64_t pos = n * 4, qb = (int64_t)zs_optim_qblocks(p->n) * 4;
  int has_m = s->optimizer != ZS_SWAP_ADAGRAD;
  int has_v = s->optimizer != ZS_SWAP_LION;
  p->param_off = 0;
  p->m_off = p->v_off = p->ms_off = p->vs_off = -1;
  if (has_m) {
    p->m_off = round_up(pos, ZS__SWAP_ARRAY_ALIGN);
    pos = p->m_off + n * es;
  }
  if (has_v) {
    p->v_off = round_up(pos, ZS__SWAP_ARRAY_ALIGN);
    pos = p->v_off + n * es;
  }
  if (s->state_dtype == ZS_DTYPE_Q8) {
    p->ms_off = round_up(pos, ZS__SWAP_ARRAY_ALIGN);
    p->vs_off = round_up(p->ms_off + qb, ZS__SWAP_ARRAY_ALIGN);
    pos = p->vs_off + qb;
  }
  p->image = pos;
  p->slot = round_up(pos, align);
}

static int check_config(const zs_swap_config *c) {
  int i;
  if (!c) return zs__fail(ZS_EINVAL, "zs_swap_create: cfg is NULL; fill one "
                          "with zs_swap_config_init");
  if (!c->path || !c->path[0])
    return zs__fail(ZS_EINVAL, "zs_swap_create: cfg.path is empty; set it to "
                    "a directory on the NVMe drive (nvme_path)");
  if (!c->name || !c->name[0] || strpbrk(c->name, "/\\"))
    return zs__fail(ZS_EINVAL, "zs_swap_create: cfg.name must be a non-empty "
                    "file name without slashes");
  if (c->partitions < 1 || !c->sizes)
    return zs__fail(ZS_EINVAL, "zs_swap_create: cfg.partitions = %d must be "
                    ">= 1 with cfg.sizes giving each partition's elements",
                    c->partitions);
  for (i = 0; i < c->partitions; i++)
    if (c->sizes[i] < 1 || c->sizes[i] > ((uint64_t)1 << 40))
      return zs__fail(ZS_EINVAL, "zs_swap_create: partition %d has %llu "
                      "elements; sizes must be in [1, 2^40]", i,
                      (unsigned long long)c->sizes[i]);
  if (c->buffer_count < 1 || c->buffer_count > ZS__SWAP_MAXBUF)
    return zs__fail(ZS_EINVAL, "zs_swap_create: buffer_count = %d must be in "
                    "[1, %d] (3 or more overlap read, compute and write)",
                    c->buffer_count, ZS__SWAP_MAXBUF);
  if (c->optimizer < ZS_SWAP_ADAM || c->optimizer > ZS_SWAP_LION)
    return zs__fail(ZS_EINVAL, "zs_swap_create: optimizer = %d is not "
                    "ZS_SWAP_ADAM, ZS_SWAP_ADAGRAD or ZS_SWAP_LION",
                    c->optimizer);
  if (c->direct < ZS_AIO_DIRECT_AUTO || c->direct > ZS_AIO_DIRECT_OFF)
    return zs__fail(ZS_EINVAL, "zs_swap_create: direct = %d is not a "
                    "zs_aio_direct value", c->direct);
  return 0;
}

/* Claims the file (swap_lock.c: created exclusively unless overwrite, and
 * held for the swapper's life), then opens it for the aio engine. */
static int open_file(zs_swap *s, const zs_swap_config *c) {
  unsigned fl = ZS_AIO_RDWR | ZS_AIO_CREATE | ZS_AIO_TRUNCATE;
  int rc = zs__swap_claim(s->path, c->overwrite, &s->owner);
  if (rc) return rc;
  if (c->direct == ZS_AIO_DIRECT_ON) fl |= ZS_AIO_DIRECT_REQUIRE;
  if (c->direct == ZS_AIO_DIRECT_OFF) fl |= ZS_AIO_BUFFERED;
  rc = zs_aio_file_open(&s->file, s->path, fl);
  if (rc) {
    zs__fail_prefix(rc, "opening swap file %s", s->path);
    zs__swap_unlink_owned(s->path, &s->owner);
    return rc;
  }
  return 0;
}

/* Compact layout: groups the partitions by slot size and lays out each
 * class's spare slots after the partitions' own, from *pos on. */
static int make_classes(zs_swap *s, int64_t *pos) {
  int i, k, last = 0;
  s->classes = calloc((size_t)s->nparts, sizeof *s->classes);
  if (!s->classes)
    return zs__fail(ZS_ENOMEM, "zs_swap_create: out of memory");
  for (i = 0; i < s->nparts; i++) {
    zs__swap_part *p = &s->parts[i];
    if (s->nclasses == 0 || s->classes[last].slot != p->slot) {
      for (last = 0; last < s->nclasses; last++)
        if (s->classes[last].slot == p->slot) break;
      if (last == s->nclasses) s->classes[s->nclasses++].slot = p->slot;
    }
    p->cls = last;
    s->classes[last].count++;
  }
  for (k = 0; k < s->nclasses; k++) {
    zs__swap_class *c = &s->classes[k];
    int spares = ZS_MIN(c->count, s->bufcount);
    c->free = malloc((size_t)spares * sizeof *c->free);
    if (!c->free)
      return zs__fail(ZS_ENOMEM, "zs_swap_create: out of memory");
    for (i = 0; i < spares; i++, *pos += c->slot) c->free[c->nfree++] = *pos;
  }
  return 0;
}

int64_t zs__swap_reserve(zs_swap *s, int part) {
  zs__swap_part *p = &s->parts[part];
  if (p->pend >= 0) return p->pend;
  if (!s->compact) {
    p->pend = p->loc == p->home ? p->home + p->slot : p->home;
  } else {
    zs__swap_class *c = &s->classes[p->cls];
    /* Cannot happen: each class has a spare per buffer, and every pending
     * write holds a buffer. */
    if (c->nfree == 0)
      return zs__fail(ZS_ESTATE, "swapper: no free slot for partition %d "
                      "(internal error)", part);
    p->pend = c->free[--c->nfree];
  }
  return p->pend;
}

/* Compact layout: the slot at off (of part's class) holds no state now. */
static void free_slot(zs_swap *s, int part, int64_t off) {
  if (s->compact) {
    zs__swap_class *c = &s->classes[s->parts[part].cls];
    c->free[c->nfree++] = off;
  }
}

void zs__swap_commit(zs_swap *s, int part) {
  zs__swap_part *p = &s->parts[part];
  if (p->pend < 0) return;
  free_slot(s, part, p->loc);
  p->loc = p->pend;
  p->pend = -1;
}

void zs__swap_unreserve(zs_swap *s, int part) {
  zs__swap_part *p = &s->parts[part];
  if (p->pend < 0) return;
  free_slot(s, part, p->pend);
  p->pend = -1;
}

int64_t zs__swap_free_slot(const zs_swap *s, int part, int64_t k) {
  const zs__swap_part *p = &s->parts[part];
  const zs__swap_class *c;
  if (!s->compact) return p->loc == p->home ? p->home + p->slot : p->home;
  c = &s->classes[p->cls];
  return c->nfree ? c->free[k % c->nfree] : -1;
}

int zs_swap_create(zs_swap **out, const zs_swap_config *c) {
  zs_swap *s;
  zs_aio_config ac;
  int64_t align, pos = 0;
  size_t plen;
  int i, rc;
  if (!out) return zs__fail(ZS_EINVAL, "zs_swap_create: out is NULL");
  if ((rc = check_config(c)) < 0) return rc;
  s = calloc(1, sizeof *s);
  if (!s) return zs__fail(ZS_ENOMEM, "zs_swap_create: out of memory");
  s->owner = -1;
  s->nparts = c->partitions;
  s->optimizer = c->optimizer;
  s->state_dtype = c->state_dtype;
  s->lr = c->lr, s->beta1 = c->beta1, s->beta2 = c->beta2;
  s->eps = c->eps, s->weight_decay = c->weight_decay;
  resolve_defaults(s->optimizer, &s->lr, &s->beta1, &s->beta2, &s->eps,
                   &s->weight_decay);
  s->adamw_mode = c->adamw_mode, s->bias_correction = c->bias_correction;
  s->num_threads = c->num_threads, s->pool = c->pool;
  s->sync_each_step = c->sync_each_step;
  s->bufcount = c->buffer_count;
  rc = validate_hparams(s, s->lr, s->beta1, s->beta2, s->eps, s->weight_decay);
  if (rc < 0) {
    free(s);
    return zs__fail_prefix(rc, "zs_swap_create");
  }
  plen = strlen(c->path) + strlen(c->name) + 8;
  s->path = malloc(plen);
  s->parts = calloc((size_t)s->nparts, sizeof *s->parts);
  s->bufs = calloc((size_t)s->bufcount, sizeof *s->bufs);
  if (!s->path || !s->parts || !s->bufs) {
    rc = zs__fail(ZS_ENOMEM, "zs_swap_create: out of memory");
    goto fail;
  }
  snprintf(s->path, plen, "%s/%s.swap", c->path, c->name);
  if (c->aio) {
    ac = *(const zs_aio_config *)c->aio;
  } else {
    zs_aio_config_init(&ac);
    ac.block_size = 4 << 20;
    ac.queue_depth = 32;
  }
  if ((rc = zs_aio_create(&s->aio, &ac)) < 0) {
    zs__fail_prefix(rc, "zs_swap_create: creating the aio handle");
    goto fail;
  }
  if ((rc = open_file(s, c)) < 0) goto fail_nofile;
  align = ZS_MAX((int64_t)zs_aio_file_alignment(s->file), 4096);
  s->compact = c->compact != 0;
  for (i = 0; i < s->nparts; i++) {
    zs__swap_part *p = &s->parts[i];
    p->n = c->sizes[i];
    layout(s, p, align);
    p->home = p->loc = pos;
    p->pend = -1;
    pos += (s->compact ? 1 : 2) * p->slot;
    if ((size_t)p->slot > s->bufbytes) s->bufbytes = (size_t)p->slot;
  }
  if (s->compact && (rc = make_classes(s, &pos)) < 0) goto fail;
  s->file_bytes = pos;
  if ((rc = zs_aio_file_preallocate(s->file, pos)) < 0) {
    zs__fail_prefix(rc, "zs_swap_create: reserving %lld bytes (%.3f GiB: %s) "
                    "for %s; free space or point nvme_path at a larger drive",
                    (long long)pos, (double)pos / (1 << 30),
                    s->compact ? "one slot of every partition's state and "
                    "the spare slots" : "two slots of every partition's "
                    "state", s->path);
    goto fail;
  }
  for (i = 0; i < s->bufcount; i++) {
    int locked = 0;
    rc = zs_alloc_pinned(&s->bufs[i], s->bufbytes, ZS_PIN_FALLBACK, &locked);
    if (rc < 0) {
      zs__fail_prefix(rc, "zs_swap_create: allocating %d buffers of %zu "
                      "bytes; lower buffer_count or use smaller partitions",
                      s->bufcount, s->bufbytes);
      goto fail;
    }
    s->locked = i == 0 ? locked : (s->locked && locked);
  }
  *out = s;
  return 0;
fail:
  if (s->file) {
    zs_aio_file_close(s->file);
    s->file = NULL;
    zs__swap_unlink_owned(s->path, &s->owner);
  }
fail_nofile:
  zs_swap_destroy(s);
  return rc;
}

int zs_swap_destroy(zs_swap *s) {
  int rc = 0, i;
  if (!s) return 0;
  if (s->file) {
    rc = zs_aio_file_close(s->file);
    if (zs__swap_unlink_owned(s->path, &s->owner) < 0 && rc == 0)
      rc = zs__fail_prefix(ZS_EIO, "zs_swap_destroy: removing %s", s->path);
  }
  zs__swap_release(s->owner);
  if (s->aio) zs_aio_destroy(s->aio);
  if (s->bufs)
    for (i = 0; i < s->bufcount; i++)
      if (s->bufs[i]) zs_free_pinned(s->bufs[i], s->bufbytes);
  if (s->spare) zs_free_pinned(s->spare, s->bufbytes);
  if (s->classes)
    for (i = 0; i < s->nclasses; i++) free(s->classes[i].free);
  free(s->classes);
  free(s->bufs);
  free(s->parts);
  free(s->path);
  free(s);
  return rc;
}

/* ----------------------------------------------------- hyperparameters */

int zs_swap_set_hparams(zs_swap *s, double lr, double b1, double b2,
                        double eps, double wd) {
  int rc;
  if (!s) return zs__fail(ZS_EINVAL, "zs_swap_set_hparams: s is NULL");
  if (lr < 0) lr = s->lr;
  if (b1 < 0) b1 = s->beta1;
  if (b2 < 0) b2 = s->beta2;
  if (eps < 0) eps = s->eps;
  if (wd < 0) wd = s->weight_decay;
  if ((rc = validate_hparams(s, lr, b1, b2, eps, wd)) < 0)
    return zs__fail_prefix(rc, "zs_swap_set_hparams");
  s->lr = lr, s->beta1 = b1, s->beta2 = b2, s->eps = eps, s->weight_decay = wd;
  return 0;
}

void zs_swap_get_hparams(const zs_swap *s, double *lr, double *b1, double *b2,
                         double *eps, double *wd) {
  if (!s) return;
  if (lr) *lr = s->lr;
  if (b1) *b1 = s->beta1;
  if (b2) *b2 = s->beta2;
  if (eps) *eps = s->eps;
  if (wd) *wd = s->weight_decay;
}

int64_t zs_swap_steps(const zs_swap *s) { return s ? s->steps : 0; }

int zs_swap_set_steps(zs_swap *s, int64_t steps) {
  /* The next step is numbered steps + 1, which must be an int64_t too. */
  int rc = zs__swap_check_complete(s, "zs_swap_set_steps");
  if (rc < 0) return rc;
  if (!s || steps < 0 || steps == INT64_MAX)
    return zs__fail(ZS_EINVAL, "zs_swap_set_steps: steps = %lld must be in "
                    "[0, 2^63 - 2]", (long long)steps);
  s->steps = steps;
  return 0;
}

/* ------------------------------------------------------- information */

int zs_swap_partitions(const zs_swap *s) { return s ? s->nparts : 0; }
uint64_t zs_swap_partition_size(const zs_swap *s, int part) {
  return s && part >= 0 && part < s->nparts ? s->parts[part].n : 0;
}
const char *zs_swap_file_path(const zs_swap *s) { return s ? s->path : ""; }
int64_t zs_swap_file_bytes(const zs_swap *s) { return s ? s->file_bytes : 0; }
int zs_swap_compact(const zs_swap *s) { return s ? s->compact : 0; }
int zs_swap_holds_state(const zs_swap *s, int part) {
  return s && part >= 0 && part < s->nparts && s->parts[part].ready;
}
int zs_swap_direct(const zs_swap *s) {
  return s ? zs_aio_file_direct(s->file) : 0;
}
const char *zs_swap_direct_why(const zs_swap *s) {
  return s ? zs_aio_file_why(s->file) : "";
}
int zs_swap_buffers_locked(const zs_swap *s) { return s ? s->locked : 0; }
const char *zs_swap_backend(const zs_swap *s) {
  return s ? zs_aio_backend(s->aio) : "";
}

void zs_swap_stats_get(const zs_swap *s, zs_swap_stats *out) {
  if (!out) return;
  if (!s) {
    memset(out, 0, sizeof *out);
    return;
  }
  *out = s->stats;
}

void zs_swap_stats_reset(zs_swap *s) {
  if (s) memset(&s->stats, 0, sizeof s->stats);
}
