/* backend_iocp_win.c - the Windows backend: overlapped ReadFile/WriteFile on
 * files bound to one I/O completion port per handle, served by
 * intra_op_parallelism lane threads that all wait on the port.
 *
 * The port carries three kinds of packets: completions of pieces (their
 * OVERLAPPED is the first member of the op), "work queued" packets posted by
 * kick(), and "stop" packets. Any lane may issue pieces and any lane may
 * reap them; the number in flight is bounded by queue_depth times the lane
 * count, counted under the handle mutex. A file handle can belong to one
 * port only, so a file opened for direct I/O serves one handle at a time
 * with this backend (open it again for another handle). */
#include <stdlib.h>
#include <string.h>

#include "aio/aio_internal.h"

#define ZS__KEY_IO 0
#define ZS__KEY_WORK 1
#define ZS__KEY_STOP 2
#define ZS__IOCP_BATCH 64

typedef struct {
  HANDLE port;
  int n;
  zs__thread *threads;
  int64_t inflight, limit; /* under the handle mutex */
} zs__iocp;

static void zs__iocp_add(zs_aio *h, int64_t d) {
  zs__iocp *p = h->be;
  zs__mutex_lock(&h->mu);
  p->inflight += d;
  zs__mutex_unlock(&h->mu);
}

/* Starts (or continues) op. Unaligned windows run synchronously on the
 * buffered companion; others are issued and complete through the port. */
static void zs__iocp_issue(zs_aio *h, zs__aio_op *op) {
  for (;;) {
    void *buf;
    size_t len;
    uint64_t off;
    zs__file *f;
    BOOL ok;
    DWORD e = 0;
    int rc = zs__aio_op_next(h, op, &buf, &len, &off, &f);
    if (rc < 0) return;
    if (rc == 0) {
      if (!zs__aio_op_done(h, op, zs__aio_op_sync(op, 1))) return;
      continue;
    }
    memset(&op->ov, 0, sizeof op->ov);
    op->ov.Offset = (DWORD)off;
    op->ov.OffsetHigh = (DWORD)(off >> 32);
    zs__iocp_add(h, 1);
    if (op->req->write)
      ok = WriteFile((HANDLE)f->h, buf, (DWORD)len, NULL, &op->ov);
    else
      ok = ReadFile((HANDLE)f->h, buf, (DWORD)len, NULL, &op->ov);
    /* Success, immediate or pending, always queues a completion packet. */
    if (ok || (e = GetLastError()) == ERROR_IO_PENDING) return;
    zs__iocp_add(h, -1);
    if (!zs__aio_op_done(h, op, e == ERROR_HANDLE_EOF ? 0 : zs__translate_win32(e)))
      return;
  }
}

/* Issues queued pieces while there is room in flight. */
static void zs__iocp_fill(zs_aio *h) {
  zs__iocp *p = h->be;
  zs__aio_op *batch[ZS__IOCP_BATCH];
  for (;;) {
    int64_t room;
    size_t k, i;
    zs__mutex_lock(&h->mu);
    room = p->limit - p->inflight;
    zs__mutex_unlock(&h->mu);
    if (room <= 0) return;
    k = zs__aio_take(h, batch, (size_t)ZS_MIN(room, ZS__IOCP_BATCH), 0);
    if (k == 0) return;
    for (i = 0; i < k; i++) zs__iocp_issue(h, batch[i]);
  }
}

static void zs__iocp_lane(void *arg) {
  zs_aio *h = arg;
  zs__iocp *p = h->be;
  for (;;) {
    DWORD n = 0;
    ULONG_PTR key = 0;
    OVERLAPPED *ov = NULL;
    BOOL ok = GetQueuedCompletionStatus(p->port, &n, &key, &ov, INFINITE);
    if (!ov) {
      if (!ok) continue; /* no packet dequeued: spurious failure, retry */
      if (key == ZS__KEY_STOP) return;
      zs__iocp_fill(h);
      continue;
    }
    {
      zs__aio_op *op = (zs__aio_op *)ov;
      int64_t res = (int64_t)n;
      if (!ok) {
        DWORD e = GetLastError();
        res = e == ERROR_HANDLE_EOF ? 0 : zs__translate_win32(e);
      }
      zs__iocp_add(h, -1);
      if (zs__aio_op_done(h, op, res)) zs__iocp_issue(h, op);
    }
    zs__iocp_fill(h);
  }
}

static void zs__iocp_stop(zs_aio *h);

static int zs__iocp_start(zs_aio *h) {
  zs__iocp *p = calloc(1, sizeof *p);
  int i, rc = 0;
  if (!p) return zs__fail(ZS_ENOMEM, "aio iocp backend: out of memory");
  p->n = 0;
  p->limit = (int64_t)h->cfg.queue_depth * h->cfg.intra_op_parallelism;
  p->threads = calloc((size_t)h->cfg.intra_op_parallelism, sizeof *p->threads);
  p->port = CreateIoCompletionPort(INVALID_HANDLE_VALUE, NULL, 0,
                                   (DWORD)h->cfg.intra_op_parallelism);
  if (!p->threads || !p->port) {
    rc = p->threads ? zs__fail(zs__os_error(), "CreateIoCompletionPort failed")
                    : zs__fail(ZS_ENOMEM, "aio iocp backend: out of memory");
    if (p->port) CloseHandle(p->port);
    free(p->threads);
    free(p);
    return rc;
  }
  h->be = p;
  for (i = 0; i < h->cfg.intra_op_parallelism; i++) {
    if ((rc = zs__thread_create(&p->threads[i], zs__iocp_lane, h)) != 0) break;
    p->n = i + 1;
  }
  if (rc) zs__iocp_stop(h);
  return rc;
}

static void zs__iocp_stop(zs_aio *h) {
  zs__iocp *p = h->be;
  int i;
  for (i = 0; i < p->n; i++)
    PostQueuedCompletionStatus(p->port, 0, ZS__KEY_STOP, NULL);
  for (i = 0; i < p->n; i++) zs__thread_join(&p->threads[i]);
  CloseHandle(p->port);
  free(p->threads);
  free(p);
  h->be = NULL;
}

static void zs__iocp_kick(zs_aio *h) {
  zs__iocp *p = h->be;
  PostQueuedCompletionStatus(p->port, 0, ZS__KEY_WORK, NULL);
}

static int zs__iocp_prepare(zs_aio *h, zs_aio_file *f) {
  zs__iocp *p = h->be;
  int rc = 0;
  zs__mutex_lock(&h->mu);
  if (f->port == NULL) {
    if (CreateIoCompletionPort((HANDLE)f->fd.h, p->port, ZS__KEY_IO, 0))
      f->port = p->port;
    else
      rc = zs__fail(zs__os_error(), "binding %s to the I/O completion port "
                    "failed; open the file again for this handle", f->path);
  } else if (f->port != p->port) {
    rc = zs__fail(ZS_EBUSY, "%s is bound to another aio handle's completion "
                  "port (Windows allows one per file handle); open the file "
                  "again for this handle", f->path);
  }
  zs__mutex_unlock(&h->mu);
  return rc;
}

const zs__aio_vt zs__aio_iocp_vt = {zs__iocp_start, zs__iocp_stop,
                                    zs__iocp_kick, zs__iocp_prepare};
