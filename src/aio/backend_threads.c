/* backend_threads.c - the portable backend: blocking workers that take
 * pieces from the handle's queue and move them with pread/pwrite. The
 * number of workers is the number of pieces in flight:
 * intra_op_parallelism * min(queue_depth, 16). */
#include <stdlib.h>

#include "aio/aio_internal.h"

typedef struct {
  int n;
  zs__thread *threads;
} zs__aio_threads;

static void zs__aio_worker(void *arg) {
  zs_aio *h = arg;
  zs__aio_op *op;
  while (zs__aio_take(h, &op, 1, 1) == 1) zs__aio_op_run_sync(h, op);
}

static int zs__aio_threads_start(zs_aio *h) {
  zs__aio_threads *t = calloc(1, sizeof *t);
  int want = h->cfg.intra_op_parallelism * ZS_MIN(h->cfg.queue_depth, 16), i, rc;
  if (!t || !(t->threads = calloc((size_t)want, sizeof *t->threads))) {
    free(t);
    return zs__fail(ZS_ENOMEM, "aio threads backend: out of memory");
  }
  for (i = 0; i < want; i++) {
    if ((rc = zs__thread_create(&t->threads[i], zs__aio_worker, h)) != 0) {
      zs__mutex_lock(&h->mu);
      h->stop = 1;
      zs__cond_broadcast(&h->cv_work);
      zs__mutex_unlock(&h->mu);
      while (i-- > 0) zs__thread_join(&t->threads[i]);
      free(t->threads);
      free(t);
      return zs__fail_prefix(rc, "aio threads backend: starting worker: ");
    }
  }
  t->n = want;
  h->be = t;
  return 0;
}

static void zs__aio_threads_stop(zs_aio *h) {
  zs__aio_threads *t = h->be;
  int i;
  for (i = 0; i < t->n; i++) zs__thread_join(&t->threads[i]);
  free(t->threads);
  free(t);
  h->be = NULL;
}

static void zs__aio_threads_kick(zs_aio *h) { (void)h; }

static int zs__aio_threads_prepare(zs_aio *h, zs_aio_file *f) {
  (void)h;
#ifdef _WIN32
  /* Synchronous I/O on a handle bound to a completion port would post its
   * completion to that port, where an IOCP lane would take it for one of
   * its own pieces. */
  if (f->port)
    return zs__fail(ZS_EBUSY, "%s is bound to an iocp aio handle's completion "
                    "port; open the file again for this handle", f->path);
#else
  (void)f;
#endif
  return 0;
}

const zs__aio_vt zs__aio_threads_vt = {zs__aio_threads_start,
                                       zs__aio_threads_stop,
                                       zs__aio_threads_kick,
                                       zs__aio_threads_prepare};
