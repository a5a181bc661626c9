/* aio.c - the aio engine's front end: backend choice, handles, splitting
 * requests into pieces and queueing them, waiting, statistics. The per-piece
 * logic the backends share is in aio_piece.c. Calls run one way: aio.c ->
 * the backends (their tables) -> aio_piece.c -> aio_file.c, and aio.c ->
 * aio_piece.c, aio_file.c, aio_probe.c; nothing calls back into aio.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aio/aio_internal.h"

/* The threads backend's blocking workers per lane are capped: beyond this,
 * more threads only add contention on a single device. */
#define ZS__AIO_THREADS_PER_LANE 16

void zs_aio_config_init(zs_aio_config *cfg) {
  if (!cfg) return;
  memset(cfg, 0, sizeof *cfg);
  cfg->block_size = 1 << 20;
  cfg->queue_depth = 128;
  cfg->single_submit = 0;
  cfg->overlap_events = 0;
  cfg->intra_op_parallelism = 1;
  cfg->backend = ZS_AIO_BACKEND_AUTO;
  cfg->direct = ZS_AIO_DIRECT_AUTO;
}

const char *zs_aio_backend_name(int backend) {
  switch (backend) {
    case ZS_AIO_BACKEND_AUTO: return "auto";
    case ZS_AIO_BACKEND_IO_URING: return "io_uring";
    case ZS_AIO_BACKEND_THREADS: return "threads";
    case ZS_AIO_BACKEND_IOCP: return "iocp";
    default: return "unknown";
  }
}

int zs_aio_backend_resolve(int backend, char *why, size_t cap) {
  const char *uwhy = "", *iwhy = "", *twhy = "", *env = NULL;
  const char *src = "requested";
  int uok = zs__aio_backend_usable(ZS_AIO_BACKEND_IO_URING, &uwhy);
  int iok = zs__aio_backend_usable(ZS_AIO_BACKEND_IOCP, &iwhy), chosen;
  char tmp[400];
  zs__aio_backend_usable(ZS_AIO_BACKEND_THREADS, &twhy);
  if (backend == ZS_AIO_BACKEND_AUTO && (env = zs__getenv("ZSPEED_AIO_BACKEND"))) {
    src = "forced by ZSPEED_AIO_BACKEND";
    if (strcmp(env, "auto") == 0) backend = ZS_AIO_BACKEND_AUTO;
    else if (strcmp(env, "io_uring") == 0) backend = ZS_AIO_BACKEND_IO_URING;
    else if (strcmp(env, "threads") == 0) backend = ZS_AIO_BACKEND_THREADS;
    else if (strcmp(env, "iocp") == 0) backend = ZS_AIO_BACKEND_IOCP;
    else
      return zs__fail(ZS_EINVAL, "ZSPEED_AIO_BACKEND='%s' is not a backend; "
                      "use auto, io_uring, threads or iocp", env);
  }
  switch (backend) {
    case ZS_AIO_BACKEND_AUTO:
      chosen = uok ? ZS_AIO_BACKEND_IO_URING
               : iok ? ZS_AIO_BACKEND_IOCP : ZS_AIO_BACKEND_THREADS;
      snprintf(tmp, sizeof tmp, "auto chose %s; io_uring: %s; iocp: %s; "
               "threads: %s", zs_aio_backend_name(chosen), uwhy, iwhy, twhy);
      break;
    case ZS_AIO_BACKEND_IO_URING:
      if (!uok)
        return zs__fail(ZS_ENOTSUP, "the io_uring backend was %s but is not "
                        "usable here: %s; use backend auto or threads", src, uwhy);
      chosen = backend;
      snprintf(tmp, sizeof tmp, "io_uring %s (%s)", src, uwhy);
      break;
    case ZS_AIO_BACKEND_IOCP:
      if (!iok)
        return zs__fail(ZS_ENOTSUP, "the iocp backend was %s but is not usable "
                        "here: %s; use backend auto or threads", src, iwhy);
      chosen = backend;
      snprintf(tmp, sizeof tmp, "iocp %s (%s)", src, iwhy);
      break;
    case ZS_AIO_BACKEND_THREADS:
      chosen = backend;
      snprintf(tmp, sizeof tmp, "threads %s; io_uring: %s; iocp: %s", src, uwhy,
               iwhy);
      break;
    default:
      return zs__fail(ZS_EINVAL, "unknown aio backend %d; use one of "
                      "ZS_AIO_BACKEND_AUTO/IO_URING/THREADS/IOCP", backend);
  }
  if (why && cap) snprintf(why, cap, "%s", tmp);
  return chosen;
}

/* ---------------------------------------------------------------- handle */

static void zs__aio_free_bounces(zs_aio *h) {
  size_t i;
  for (i = 0; i < h->nbounce_free; i++) zs_free_aligned(h->bounce_free[i]);
  free(h->bounce_free);
}

int zs_aio_create(zs_aio **out, const zs_aio_config *cfg) {
  zs_aio_config c;
  zs_aio *h;
  int backend, rc;
  if (!out) return zs__fail(ZS_EINVAL, "zs_aio_create: out is NULL");
  if (cfg) c = *cfg;
  else zs_aio_config_init(&c);
  if (c.block_size < 1 || c.block_size > ((int64_t)1 << 30))
    return zs__fail(ZS_EINVAL, "aio block_size must be in [1, 1 GiB], got %lld",
                    (long long)c.block_size);
  if (c.queue_depth < 1 || c.queue_depth > 4096)
    return zs__fail(ZS_EINVAL, "aio queue_depth must be in [1, 4096], got %d",
                    c.queue_depth);
  if (c.intra_op_parallelism < 1 || c.intra_op_parallelism > 256)
    return zs__fail(ZS_EINVAL, "aio intra_op_parallelism must be in [1, 256], "
                    "got %d", c.intra_op_parallelism);
  if (c.direct < ZS_AIO_DIRECT_AUTO || c.direct > ZS_AIO_DIRECT_OFF)
    return zs__fail(ZS_EINVAL, "aio direct must be ZS_AIO_DIRECT_AUTO, _ON or "
                    "_OFF, got %d", c.direct);
  h = calloc(1, sizeof *h);
  if (!h) return zs__fail(ZS_ENOMEM, "zs_aio_create: out of memory");
  backend = zs_aio_backend_resolve(c.backend, h->why, sizeof h->why);
  if (backend < 0) {
    free(h);
    return backend;
  }
  c.backend = backend;
  h->cfg = c;
  h->next_id = 1;
  /* Bounce buffers hold a whole piece; pieces are block_size rounded up to
   * the file's alignment, which divides ZS__AIO_MAX_ALIGN. */
  h->bounce_size = (size_t)((c.block_size + ZS__AIO_MAX_ALIGN - 1) /
                            ZS__AIO_MAX_ALIGN * ZS__AIO_MAX_ALIGN);
  h->bounce_cap = (size_t)c.queue_depth * (size_t)c.intra_op_parallelism;
  h->bounce_free = malloc(h->bounce_cap * sizeof *h->bounce_free);
  switch (backend) {
#if defined(ZS_HAVE_URING)
    case ZS_AIO_BACKEND_IO_URING: h->vt = &zs__aio_uring_vt; break;
#endif
#if defined(_WIN32)
    case ZS_AIO_BACKEND_IOCP: h->vt = &zs__aio_iocp_vt; break;
#endif
    default: h->vt = &zs__aio_threads_vt; break;
  }
  if (!h->bounce_free) {
    free(h);
    return zs__fail(ZS_ENOMEM, "zs_aio_create: out of memory");
  }
  zs__mutex_init(&h->mu);
  zs__cond_init(&h->cv_work);
  zs__cond_init(&h->cv_done);
  if ((rc = h->vt->start(h)) != 0) {
    zs__cond_destroy(&h->cv_work);
    zs__cond_destroy(&h->cv_done);
    zs__mutex_destroy(&h->mu);
    zs__aio_free_bounces(h);
    free(h);
    return rc;
  }
  *out = h;
  return 0;
}

void zs_aio_destroy(zs_aio *h) {
  if (!h) return;
  zs_aio_wait_all(h);
  zs__mutex_lock(&h->mu);
  h->stop = 1;
  zs__cond_broadcast(&h->cv_work);
  zs__mutex_unlock(&h->mu);
  h->vt->stop(h);
  zs__cond_destroy(&h->cv_work);
  zs__cond_destroy(&h->cv_done);
  zs__mutex_destroy(&h->mu);
  zs__aio_free_bounces(h);
  free(h);
}

void zs_aio_get_config(const zs_aio *h, zs_aio_config *out) {
  if (h && out) *out = h->cfg;
}

const char *zs_aio_backend(const zs_aio *h) {
  return h ? zs_aio_backend_name(h->cfg.backend) : "unknown";
}

const char *zs_aio_backend_why(const zs_aio *h) { return h ? h->why : ""; }

/* ------------------------------------------------------------ submission */

static uint64_t zs__round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Splits [off, off + len) into an unaligned head, aligned blocks and an
 * unaligned tail, so that pieces never share an alignment unit (no two
 * pieces of one request read-modify-write the same sector). */
static size_t zs__aio_split(zs__aio_req *r, char *buf, uint64_t off,
                            uint64_t len, uint64_t bs, uint64_t align,
                            uint32_t mem_align, zs__aio_op *ops) {
  uint64_t end = off + len, head_end, tail, p;
  size_t n = 0;
  head_end = ZS_MIN(zs__round_up(off, align), end);
  tail = ZS_MAX(end / align * align, head_end);
  if (head_end > off) {
    if (ops) {
      ops[n].ubuf = buf;
      ops[n].off = off;
      ops[n].len = (size_t)(head_end - off);
    }
    n++;
  }
  for (p = head_end; p < tail; p += bs) {
    if (ops) {
      ops[n].ubuf = buf + (p - off);
      ops[n].off = p;
      ops[n].len = (size_t)ZS_MIN(bs, tail - p);
      ops[n].need_bounce = ((uintptr_t)ops[n].ubuf % mem_align) != 0;
    }
    n++;
  }
  if (end > tail) {
    if (ops) {
      ops[n].ubuf = buf + (tail - off);
      ops[n].off = tail;
      ops[n].len = (size_t)(end - tail);
    }
    n++;
  }
  if (ops) {
    size_t i;
    for (i = 0; i < n; i++) ops[i].req = r;
  }
  return n;
}

static int64_t zs__aio_submit(zs_aio *h, zs_aio_file *f, int own, void *buf,
                              int64_t len, int64_t off, int write) {
  zs__aio_req *r;
  uint64_t align, bs;
  size_t n, i;
  int rc;
  int64_t id;
  const char *what = write ? "zs_aio_pwrite" : "zs_aio_pread";
  if (!h || !f) {
    rc = zs__fail(ZS_EINVAL, "%s: handle and file must not be NULL", what);
    goto fail_early;
  }
  if (len < 0 || off < 0 || len > INT64_MAX - off || (!buf && len > 0)) {
    rc = zs__fail(ZS_EINVAL, "%s: need buf != NULL, len >= 0, off >= 0 and "
                  "off + len <= INT64_MAX (got len %lld, off %lld)", what,
                  (long long)len, (long long)off);
    goto fail_early;
  }
  if ((rc = h->vt->prepare(h, f)) != 0) goto fail_early;
#ifdef _WIN32
  /* Writes that extend a file run synchronously on Windows: extend first. */
  if (write && len > 0) {
    int64_t size = zs_aio_file_size(f);
    if (size >= 0 && size < off + len) {
      rc = zs__file_truncate(&f->fd, (uint64_t)(off + len));
      if (rc) goto fail_early;
    }
  }
#endif
  align = f->direct ? f->off_align : 1;
  bs = zs__round_up((uint64_t)h->cfg.block_size, align);
  n = len ? zs__aio_split(NULL, buf, (uint64_t)off, (uint64_t)len, bs, align,
                          f->mem_align, NULL)
          : 0;
  if (n > (size_t)INT32_MAX) {
    rc = zs__fail(ZS_EINVAL, "%s: %lld bytes in blocks of %lld make too many "
                  "pieces; raise block_size", what, (long long)len,
                  (long long)bs);
    goto fail_early;
  }
  r = calloc(1, sizeof *r);
  if (!r || (n && !(r->ops = calloc(n, sizeof *r->ops)))) {
    free(r);
    rc = zs__fail(ZS_ENOMEM, "%s: out of memory for %zu pieces", what, n);
    goto fail_early;
  }
  if (n) zs__aio_split(r, buf, (uint64_t)off, (uint64_t)len, bs, align,
                       f->mem_align, r->ops);
  r->nops = n;
  r->write = write;
  r->own_file = own;
  r->file = f;
  r->len = len;
  r->off = off;
  r->remaining = (int32_t)n;
  r->t_submit = zs__now_ns();
  zs__mutex_lock(&h->mu);
  if (h->stop) {
    zs__mutex_unlock(&h->mu);
    free(r->ops);
    free(r);
    rc = zs__fail(ZS_ESTATE, "%s: the handle is being destroyed", what);
    goto fail_early;
  }
  id = r->id = h->next_id++;
  if (h->rtail) h->rtail->next = r;
  else h->rhead = r;
  h->rtail = r;
  h->live++;
  if (n == 0) {
    r->done = 1;
    h->st.requests++;
    h->completions++;
    zs__cond_broadcast(&h->cv_done);
  } else {
    zs__aio_busy_begin(h);
    for (i = 0; i < n; i++) {
      if (h->qtail) h->qtail->next = &r->ops[i];
      else h->qhead = &r->ops[i];
      h->qtail = &r->ops[i];
    }
    zs__cond_broadcast(&h->cv_work);
  }
  zs__mutex_unlock(&h->mu);
  if (n == 0 && own) zs_aio_file_close(f);
  if (n) h->vt->kick(h);
  return id;
fail_early:
  if (own) zs_aio_file_close(f);
  return rc;
}

int64_t zs_aio_pread(zs_aio *h, zs_aio_file *f, void *buf, int64_t len,
                     int64_t off) {
  return zs__aio_submit(h, f, 0, buf, len, off, 0);
}

int64_t zs_aio_pwrite(zs_aio *h, zs_aio_file *f, const void *buf, int64_t len,
                      int64_t off) {
  return zs__aio_submit(h, f, 0, (void *)(uintptr_t)buf, len, off, 1);
}

static int64_t zs__aio_submit_path(zs_aio *h, const char *path, void *buf,
                                   int64_t len, int64_t off, int write) {
  zs_aio_file *f = NULL;
  unsigned flags;
  int rc;
  if (!h || !path)
    return zs__fail(ZS_EINVAL, "aio request by path: handle and path must not "
                               "be NULL");
  flags = write ? (ZS_AIO_WRITE | ZS_AIO_CREATE) : ZS_AIO_READ;
  if (h->cfg.direct == ZS_AIO_DIRECT_ON) flags |= ZS_AIO_DIRECT_REQUIRE;
  if (h->cfg.direct == ZS_AIO_DIRECT_OFF) flags |= ZS_AIO_BUFFERED;
  if ((rc = zs_aio_file_open(&f, path, flags)) != 0) return rc;
  return zs__aio_submit(h, f, 1, buf, len, off, write);
}

int64_t zs_aio_pread_path(zs_aio *h, const char *path, void *buf, int64_t len,
                          int64_t off) {
  return zs__aio_submit_path(h, path, buf, len, off, 0);
}

int64_t zs_aio_pwrite_path(zs_aio *h, const char *path, const void *buf,
                           int64_t len, int64_t off) {
  return zs__aio_submit_path(h, path, (void *)(uintptr_t)buf, len, off, 1);
}

/* --------------------------------------------------------------- waiting */

static void zs__aio_unlink_locked(zs_aio *h, zs__aio_req *r) {
  zs__aio_req **pp = &h->rhead, *prev = NULL;
  while (*pp && *pp != r) {
    prev = *pp;
    pp = &(*pp)->next;
  }
  if (!*pp) return;
  *pp = r->next;
  if (h->rtail == r) h->rtail = prev;
  h->live--;
}

static int zs__aio_release(zs__aio_req *r) {
  int err = r->err;
  if (err) zs__fail(err, "%s", r->msg);
  free(r->ops);
  free(r);
  return err;
}

int zs_aio_wait(zs_aio *h, int64_t id) {
  zs__aio_req *r;
  if (!h) return zs__fail(ZS_EINVAL, "zs_aio_wait: handle is NULL");
  zs__mutex_lock(&h->mu);
  for (r = h->rhead; r && r->id != id; r = r->next) {
  }
  if (!r || r->claimed) {
    zs__mutex_unlock(&h->mu);
    return zs__fail(ZS_EINVAL, "zs_aio_wait: no request %lld in flight on this "
                    "handle (already waited for, or never submitted)",
                    (long long)id);
  }
  r->claimed = 1;
  while (!r->done) zs__cond_wait(&h->cv_done, &h->mu);
  zs__aio_unlink_locked(h, r);
  zs__mutex_unlock(&h->mu);
  return zs__aio_release(r);
}

uint64_t zs_aio_completions(zs_aio *h) {
  uint64_t n;
  if (!h) return 0;
  zs__mutex_lock(&h->mu);
  n = h->completions;
  zs__mutex_unlock(&h->mu);
  return n;
}

void zs_aio_wait_completion(zs_aio *h, uint64_t seen) {
  if (!h) return;
  zs__mutex_lock(&h->mu);
  while (h->completions == seen) zs__cond_wait(&h->cv_done, &h->mu);
  zs__mutex_unlock(&h->mu);
}

int zs_aio_test(zs_aio *h, int64_t id) {
  zs__aio_req *r;
  int done;
  if (!h) return zs__fail(ZS_EINVAL, "zs_aio_test: handle is NULL");
  zs__mutex_lock(&h->mu);
  for (r = h->rhead; r && r->id != id; r = r->next) {
  }
  done = r ? r->done : ZS_EINVAL;
  zs__mutex_unlock(&h->mu);
  return done < 0 ? zs__fail(ZS_EINVAL, "zs_aio_test: no request %lld on this "
                             "handle", (long long)id)
                  : done;
}

int64_t zs_aio_wait_all(zs_aio *h) {
  zs__aio_req *r, *next, *mine = NULL, **tail = &mine;
  int64_t last, count = 0;
  int err = 0;
  if (!h) return zs__fail(ZS_EINVAL, "zs_aio_wait_all: handle is NULL");
  zs__mutex_lock(&h->mu);
  last = h->next_id - 1;
  for (;;) {
    int busy = 0;
    for (r = h->rhead; r && r->id <= last; r = r->next)
      if (!r->claimed && !r->done) busy = 1;
    if (!busy) break;
    zs__cond_wait(&h->cv_done, &h->mu);
  }
  /* Take every unclaimed request up to `last`; requests a zs_aio_wait is
   * waiting for stay with that waiter. */
  for (r = h->rhead; r && r->id <= last; r = next) {
    next = r->next;
    if (r->claimed) continue;
    zs__aio_unlink_locked(h, r);
    r->next = NULL;
    *tail = r;
    tail = &r->next;
  }
  zs__mutex_unlock(&h->mu);
  for (r = mine; r; r = next) {
    next = r->next;
    if (r->err && !err) {
      err = zs__aio_release(r);
    } else {
      free(r->ops);
      free(r);
    }
    count++;
  }
  if (err) zs__fail_prefix(err, "%lld request(s) waited for; the first failed: ",
                           (long long)count);
  return err ? err : count;
}

int64_t zs_aio_pending(zs_aio *h) {
  int64_t n;
  if (!h) return 0;
  zs__mutex_lock(&h->mu);
  n = h->live;
  zs__mutex_unlock(&h->mu);
  return n;
}

int zs_aio_read(zs_aio *h, zs_aio_file *f, void *buf, int64_t len, int64_t off) {
  int64_t id = zs_aio_pread(h, f, buf, len, off);
  return id < 0 ? (int)id : zs_aio_wait(h, id);
}

int zs_aio_write(zs_aio *h, zs_aio_file *f, const void *buf, int64_t len,
                 int64_t off) {
  int64_t id = zs_aio_pwrite(h, f, buf, len, off);
  return id < 0 ? (int)id : zs_aio_wait(h, id);
}

void zs_aio_stats_get(zs_aio *h, zs_aio_stats *out) {
  if (!h || !out) return;
  zs__mutex_lock(&h->mu);
  *out = h->st;
  if (h->inflight_reqs > 0) out->busy_ns += zs__now_ns() - h->busy_since;
  zs__mutex_unlock(&h->mu);
}

void zs_aio_stats_reset(zs_aio *h) {
  if (!h) return;
  zs__mutex_lock(&h->mu);
  memset(&h->st, 0, sizeof h->st);
  if (h->inflight_reqs > 0) h->busy_since = zs__now_ns();
  zs__mutex_unlock(&h->mu);
}
