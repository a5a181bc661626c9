/* backend_uring.c - the io_uring backend (Linux, liburing). Each lane is a
 * thread with its own ring of queue_depth entries: it takes pieces from the
 * handle's queue while it has free slots, submits them (one system call per
 * batch, or per piece with single_submit) and reaps completions, continuing
 * short transfers. Without overlap_events a lane submits a batch and reaps
 * all of it before taking more (DeepSpeed's "sequential" mode). */
#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>

#include "aio/aio_internal.h"

typedef struct {
  zs_aio *h;
  struct io_uring ring;
  zs__thread thread;
  unsigned inflight;
  int pending_submit; /* SQEs prepared but not yet submitted */
  zs__aio_op **batch;  /* queue_depth slots for pieces taken from the queue */
} zs__uring_lane;

typedef struct {
  int n;
  zs__uring_lane *lanes;
} zs__uring;

static void zs__uring_submit(zs__uring_lane *l) {
  int rc;
  if (!l->pending_submit) return;
  /* The rings are sized so the completion queue cannot overflow
   * (inflight <= queue_depth, CQ = 2 * SQ): only EINTR/EAGAIN can occur. */
  do rc = io_uring_submit(&l->ring);
  while (rc == -EINTR || rc == -EAGAIN);
  l->pending_submit = 0;
}

static void zs__uring_prep(zs__uring_lane *l, zs__aio_op *op, void *buf,
                           size_t len, uint64_t off, zs__file *f) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);
  if (!sqe) { /* cannot happen with inflight <= entries; be safe anyway */
    l->pending_submit = 1;
    zs__uring_submit(l);
    sqe = io_uring_get_sqe(&l->ring);
  }
  if (op->req->write)
    io_uring_prep_write(sqe, (int)f->h, buf, (unsigned)len, off);
  else
    io_uring_prep_read(sqe, (int)f->h, buf, (unsigned)len, off);
  io_uring_sqe_set_data(sqe, op);
  l->inflight++;
  l->pending_submit = 1;
  if (l->h->cfg.single_submit) zs__uring_submit(l);
}

/* Starts (or continues) op: unaligned windows run synchronously on the
 * buffered companion, aligned ones go to the ring. */
static void zs__uring_issue(zs__uring_lane *l, zs__aio_op *op) {
  for (;;) {
    void *buf;
    size_t len;
    uint64_t off;
    zs__file *f;
    int rc = zs__aio_op_next(l->h, op, &buf, &len, &off, &f);
    if (rc < 0) return;
    if (rc == 0) {
      if (!zs__aio_op_done(l->h, op, zs__aio_op_sync(op, 1))) return;
      continue;
    }
    zs__uring_prep(l, op, buf, len, off, f);
    return;
  }
}

static void zs__uring_reap(zs__uring_lane *l) {
  struct io_uring_cqe *cqe;
  int rc;
  do rc = io_uring_wait_cqe(&l->ring, &cqe);
  while (rc == -EINTR || rc == -EAGAIN);
  if (rc < 0) return;
  while (io_uring_peek_cqe(&l->ring, &cqe) == 0) {
    zs__aio_op *op = io_uring_cqe_get_data(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&l->ring, cqe);
    l->inflight--;
    if (res == -EAGAIN || res == -EINTR) {
      /* Transient: issue the same window again. */
      char *base = op->bounce ? op->bounce : op->ubuf;
      zs__uring_prep(l, op, base + op->done, op->want, op->off + op->done,
                     &op->req->file->fd);
      continue;
    }
    if (zs__aio_op_done(l->h, op, res < 0 ? zs__translate_errno(-res) : res))
      zs__uring_issue(l, op);
  }
  zs__uring_submit(l);
}

static void zs__uring_lane_main(void *arg) {
  zs__uring_lane *l = arg;
  zs_aio *h = l->h;
  unsigned qd = (unsigned)h->cfg.queue_depth;
  zs__aio_op **batch = l->batch;
  for (;;) {
    size_t k = 0, i, room = qd - l->inflight;
    if (!h->cfg.overlap_events && l->inflight > 0) room = 0;
    if (room) k = zs__aio_take(h, batch, room, l->inflight == 0);
    if (k == 0 && l->inflight == 0) {
      zs__mutex_lock(&h->mu);
      i = h->stop && !h->qhead;
      zs__mutex_unlock(&h->mu);
      if (i) break;
      continue;
    }
    for (i = 0; i < k; i++) zs__uring_issue(l, batch[i]);
    zs__uring_submit(l);
    if (l->inflight) zs__uring_reap(l);
  }
}

static void zs__uring_stop(zs_aio *h);

static int zs__uring_start(zs_aio *h) {
  zs__uring *u = calloc(1, sizeof *u);
  int n = h->cfg.intra_op_parallelism, i, rc = 0;
  if (!u || !(u->lanes = calloc((size_t)n, sizeof *u->lanes))) {
    free(u);
    return zs__fail(ZS_ENOMEM, "aio io_uring backend: out of memory");
  }
  h->be = u;
  for (i = 0; i < n && rc == 0; i++) {
    zs__uring_lane *l = &u->lanes[i];
    l->h = h;
    l->batch = malloc((size_t)h->cfg.queue_depth * sizeof *l->batch);
    if (!l->batch) {
      rc = zs__fail(ZS_ENOMEM, "aio io_uring backend: out of memory");
      break;
    }
    rc = zs__fault_check("aio.ring");
    if (rc == 0) rc = io_uring_queue_init((unsigned)h->cfg.queue_depth, &l->ring, 0);
    else rc = -ENOMEM; /* injected: behave as a refused ring */
    if (rc < 0) {
      int e = -rc;
      rc = zs__fail(zs__translate_errno(e), "aio io_uring backend: creating a "
                    "ring of %d entries failed: %s%s", h->cfg.queue_depth,
                    strerror(e), e == ENOMEM ? " (raise the page-lock limit "
                    "with ulimit -l, or lower queue_depth)" : "");
      break;
    }
    if ((rc = zs__thread_create(&l->thread, zs__uring_lane_main, l)) != 0) {
      io_uring_queue_exit(&l->ring);
      break;
    }
    u->n = i + 1;
  }
  if (rc != 0) {
    /* Stop the lanes already running; free the one that failed. */
    zs__mutex_lock(&h->mu);
    h->stop = 1;
    zs__cond_broadcast(&h->cv_work);
    zs__mutex_unlock(&h->mu);
    if (i < n) free(u->lanes[i].batch);
    zs__uring_stop(h);
  }
  return rc;
}

static void zs__uring_stop(zs_aio *h) {
  zs__uring *u = h->be;
  int i;
  if (!u) return;
  for (i = 0; i < u->n; i++) {
    zs__thread_join(&u->lanes[i].thread);
    io_uring_queue_exit(&u->lanes[i].ring);
    free(u->lanes[i].batch);
  }
  free(u->lanes);
  free(u);
  h->be = NULL;
}

static void zs__uring_kick(zs_aio *h) { (void)h; }

static int zs__uring_prepare(zs_aio *h, zs_aio_file *f) {
  (void)h;
  (void)f;
  return 0;
}

const zs__aio_vt zs__aio_uring_vt = {zs__uring_start, zs__uring_stop,
                                     zs__uring_kick, zs__uring_prepare};
