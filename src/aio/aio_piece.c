/* aio_piece.c - the per-piece logic every backend shares: taking pieces
 * from the queue, bounce buffers for misaligned memory, routing unaligned
 * windows to the buffered companion (our own enforcement of the direct I/O
 * rules), short transfers, fault injection, error messages, and completing
 * requests, with the handle's busy-time accounting (begun by aio.c's
 * submission, ended here at completion). Calls nothing in aio.c or the
 * backends, which call in here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aio/aio_internal.h"

void zs__aio_busy_begin(zs_aio *h) {
  if (h->inflight_reqs++ == 0) h->busy_since = zs__now_ns();
}

void zs__aio_busy_end(zs_aio *h) {
  if (--h->inflight_reqs == 0) h->st.busy_ns += zs__now_ns() - h->busy_since;
}

size_t zs__aio_take(zs_aio *h, zs__aio_op **out, size_t n, int block) {
  size_t k = 0;
  zs__mutex_lock(&h->mu);
  while (block && !h->qhead && !h->stop) zs__cond_wait(&h->cv_work, &h->mu);
  while (k < n && h->qhead) {
    out[k++] = h->qhead;
    h->qhead = h->qhead->next;
    if (!h->qhead) h->qtail = NULL;
  }
  zs__mutex_unlock(&h->mu);
  return k;
}

static void *zs__aio_bounce_get(zs_aio *h) {
  void *p = NULL;
  if (zs__fault_check("aio.bounce") != 0) return NULL;
  zs__mutex_lock(&h->mu);
  if (h->nbounce_free) p = h->bounce_free[--h->nbounce_free];
  zs__mutex_unlock(&h->mu);
  if (!p && zs_alloc_aligned(&p, h->bounce_size, ZS__AIO_MAX_ALIGN) != 0)
    p = NULL;
  return p;
}

static void zs__aio_bounce_put(zs_aio *h, void *p) {
  zs__mutex_lock(&h->mu);
  if (h->nbounce_free < h->bounce_cap) {
    h->bounce_free[h->nbounce_free++] = p;
    p = NULL;
  }
  zs__mutex_unlock(&h->mu);
  if (p) zs_free_aligned(p);
}

/* Finishes op with err (0 = success): copies a read's bounce data out,
 * updates the request, and completes it when it was the last piece. */
static void zs__aio_op_finish(zs_aio *h, zs__aio_op *op, int err,
                              const char *msg) {
  zs__aio_req *r = op->req;
  int last;
  if (op->bounce) {
    if (!r->write && op->done) memcpy(op->ubuf, op->bounce, op->done);
    zs__aio_bounce_put(h, op->bounce);
    op->bounce = NULL;
  }
  zs__mutex_lock(&h->mu);
  if (err && !r->err) {
    r->err = err;
    snprintf(r->msg, sizeof r->msg, "%s", msg ? msg : zs_strerror(err));
  }
  last = --r->remaining == 0;
  zs__mutex_unlock(&h->mu);
  if (!last) return;
  if (r->own_file) {
    int rc = zs_aio_file_close(r->file);
    zs__mutex_lock(&h->mu);
    if (rc && !r->err) {
      r->err = rc;
      snprintf(r->msg, sizeof r->msg, "closing the file after the request: %s",
               zs_last_error());
    }
    zs__mutex_unlock(&h->mu);
  }
  zs__mutex_lock(&h->mu);
  h->st.requests++;
  h->st.request_ns += zs__now_ns() - r->t_submit;
  if (r->err) h->st.requests_failed++;
  else if (r->write) h->st.bytes_written += (uint64_t)r->len;
  else h->st.bytes_read += (uint64_t)r->len;
  zs__aio_busy_end(h);
  r->done = 1;
  h->completions++;
  zs__cond_broadcast(&h->cv_done);
  zs__mutex_unlock(&h->mu);
}

static void zs__aio_op_fail(zs_aio *h, zs__aio_op *op, int err,
                            const char *detail) {
  char msg[320];
  zs__aio_req *r = op->req;
  snprintf(msg, sizeof msg, "%s of %zu bytes at offset %llu of %s failed: %s",
           r->write ? "write" : "read", op->len - op->done,
           (unsigned long long)(op->off + op->done), r->file->path, detail);
  zs__aio_op_finish(h, op, err, msg);
}

int zs__aio_op_next(zs_aio *h, zs__aio_op *op, void **buf, size_t *len,
                    uint64_t *off, zs__file **f) {
  zs_aio_file *file = op->req->file;
  char *base;
  int err;
  size_t want = op->len - op->done;
  if (op->need_bounce && !op->bounce) {
    op->bounce = zs__aio_bounce_get(h);
    if (!op->bounce) {
      zs__aio_op_fail(h, op, ZS_ENOMEM, "cannot allocate a bounce buffer for "
                      "unaligned memory; free memory or pass aligned buffers");
      return ZS_ENOMEM;
    }
    if (op->req->write) memcpy(op->bounce, op->ubuf, op->len);
    zs__mutex_lock(&h->mu);
    h->st.pieces_bounced++;
    zs__mutex_unlock(&h->mu);
  }
  if ((err = zs__fault_check("aio.submit")) != 0) {
    zs__aio_op_fail(h, op, err, "injected submission failure (aio.submit)");
    return err;
  }
  base = op->bounce ? op->bounce : op->ubuf;
  /* Short-transfer injection: move about half now, the rest later. */
  if (zs__fault_check("aio.short") != 0 && want > 1) {
    size_t half = want / 2;
    if (file->direct && half >= file->off_align)
      half = half / file->off_align * file->off_align;
    want = half;
  }
  *buf = base + op->done;
  *len = want;
  *off = op->off + op->done;
  op->want = want;
  zs__mutex_lock(&h->mu);
  h->st.pieces++;
  zs__mutex_unlock(&h->mu);
  /* Our own enforcement of the direct I/O rules (Wine, for one, does not
   * enforce them): anything unaligned goes to the buffered companion. */
  if (file->direct &&
      (((uintptr_t)*buf % file->mem_align) != 0 || (*off % file->off_align) != 0 ||
       (want % file->off_align) != 0)) {
    if (!op->counted_buffered) {
      op->counted_buffered = 1;
      zs__mutex_lock(&h->mu);
      h->st.pieces_buffered++;
      zs__mutex_unlock(&h->mu);
    }
    *f = &file->bfd;
    return 0;
  }
  *f = &file->fd;
  return 1;
}

int zs__aio_op_done(zs_aio *h, zs__aio_op *op, int64_t res) {
  char detail[200];
  int err;
  if (res >= 0 && (err = zs__fault_check("aio.io")) != 0) res = err;
  if (res < 0) {
    snprintf(detail, sizeof detail, "%s", zs_strerror((int)res));
    if (res == ZS_ENOSPC)
      snprintf(detail, sizeof detail, "%s; free space on the device or choose "
               "another folder", zs_strerror((int)res));
    zs__aio_op_fail(h, op, (int)res, detail);
    return 0;
  }
  if (res == 0 && op->want > 0) {
    if (op->req->write) {
      zs__aio_op_fail(h, op, ZS_EIO, "the device accepted no bytes");
    } else {
      int64_t size = zs_aio_file_size(op->req->file);
      snprintf(detail, sizeof detail, "the file ends at byte %lld (reading past "
               "the end of the file); check the offset and length",
               (long long)size);
      zs__aio_op_fail(h, op, ZS_EOF, detail);
    }
    return 0;
  }
  op->done += (size_t)res;
  if (op->done < op->len) {
    zs__mutex_lock(&h->mu);
    h->st.short_continued++;
    zs__mutex_unlock(&h->mu);
    return 1;
  }
  zs__aio_op_finish(h, op, 0, NULL);
  return 0;
}

int64_t zs__aio_op_sync(zs__aio_op *op, int use_companion) {
  zs_aio_file *file = op->req->file;
  zs__file *f = use_companion ? &file->bfd : &file->fd;
  char *base = op->bounce ? op->bounce : op->ubuf;
  size_t got = 0;
  int rc;
  if (op->req->write)
    rc = zs__file_pwrite(f, base + op->done, op->want, op->off + op->done, &got);
  else
    rc = zs__file_pread(f, base + op->done, op->want, op->off + op->done, &got);
  /* Bytes moved before an error count; the error shows on the next try. */
  return rc && got == 0 ? rc : (int64_t)got;
}

void zs__aio_op_run_sync(zs_aio *h, zs__aio_op *op) {
  for (;;) {
    void *buf;
    size_t len;
    uint64_t off;
    zs__file *f;
    int rc = zs__aio_op_next(h, op, &buf, &len, &off, &f);
    if (rc < 0) return;
    if (!zs__aio_op_done(h, op, zs__aio_op_sync(op, rc == 0))) return;
  }
}
