/*
 * aio_internal.h - what the files of the aio area share (the front end
 * aio.c, aio_file.c, aio_piece.c, aio_probe.c and the backends): requests,
 * pieces ("ops"), the handle, the availability of each backend, and the
 * helpers that prepare a transfer and account for its result, so that each
 * backend only moves bytes. Other areas use aio through zspeed/aio.h only.
 */
#ifndef ZS_AIO_INTERNAL_H
#define ZS_AIO_INTERNAL_H

#include "zs_internal.h"
#include "zspeed/aio.h"

/* Bounce buffers are this aligned, so any direct I/O alignment up to it is
 * met; files needing more fall back to buffered I/O. */
#define ZS__AIO_MAX_ALIGN 65536u

struct zs_aio_file {
  zs__file fd;       /* direct when `direct`, else buffered */
  zs__file bfd;      /* buffered companion for unaligned pieces (direct only) */
  int direct;
  uint32_t mem_align, off_align; /* 1 when buffered */
  char why[200];
  char *path;
#ifdef _WIN32
  HANDLE port; /* IOCP the direct handle is bound to, or NULL */
#endif
};

struct zs__aio_req;

/* One piece of a request: at most one block of file range. */
typedef struct zs__aio_op {
#ifdef _WIN32
  OVERLAPPED ov; /* first member: the IOCP backend maps it back to the op */
#endif
  struct zs__aio_op *next; /* queue link */
  struct zs__aio_req *req;
  char *ubuf;      /* the caller's memory for this piece */
  uint64_t off;    /* file offset of the piece */
  size_t len;      /* piece length */
  size_t done;     /* bytes transferred so far */
  size_t want;     /* bytes of the transfer in progress */
  char *bounce;    /* aligned copy (bounce pieces), or NULL */
  int need_bounce; /* memory not aligned for direct I/O */
  int counted_buffered;
} zs__aio_op;

typedef struct zs__aio_req {
  struct zs__aio_req *next; /* live requests in submission order */
  int64_t id;
  int write;
  int own_file; /* opened by path: closed on completion */
  zs_aio_file *file;
  int64_t len, off;
  int32_t remaining; /* pieces not finished (under the handle mutex) */
  int done, claimed;
  int err;
  char msg[320];
  uint64_t t_submit;
  size_t nops;
  zs__aio_op *ops;
} zs__aio_req;

typedef struct zs__aio_vt {
  int (*start)(zs_aio *h);
  /* h->stop is set and the queue drained: stop and join the threads. */
  void (*stop)(zs_aio *h);
  /* Ops were queued (called without the mutex held). */
  void (*kick)(zs_aio *h);
  /* Called before a request on file f is queued (may bind f, extend it). */
  int (*prepare)(zs_aio *h, zs_aio_file *f);
} zs__aio_vt;

struct zs_aio {
  zs_aio_config cfg;
  char why[400];
  const zs__aio_vt *vt;
  void *be; /* backend state */
  zs__mutex mu;
  zs__cond cv_work; /* ops queued or stopping */
  zs__cond cv_done; /* a request completed */
  zs__aio_op *qhead, *qtail;
  zs__aio_req *rhead, *rtail;
  int64_t next_id, live;
  uint64_t completions; /* requests completed, never reset */
  int stop;
  uint64_t busy_since;
  int64_t inflight_reqs;
  zs_aio_stats st;
  void **bounce_free;
  size_t nbounce_free, bounce_cap, bounce_size;
};

/* Backends (each file defines one). */
extern const zs__aio_vt zs__aio_threads_vt;
#if defined(ZS_HAVE_URING)
extern const zs__aio_vt zs__aio_uring_vt;
#endif
#if defined(_WIN32)
extern const zs__aio_vt zs__aio_iocp_vt;
#endif

/* Whether backend (IO_URING, THREADS or IOCP) can run here: 1 or 0, with
 * *why pointing at the reason (static text, decided once per process); a
 * negative ZS_EINVAL for any other value. zs_aio_backend_available is the
 * public copy of this. */
int zs__aio_backend_usable(int backend, const char **why);

/* aio_piece.c: busy-time accounting (under the handle mutex): a request
 * started or completed. */
void zs__aio_busy_begin(zs_aio *h);
void zs__aio_busy_end(zs_aio *h);

/* Pops up to n queued ops into out (FIFO). With block != 0 waits while the
 * queue is empty; returns 0 only when stopping (block) or empty (!block). */
size_t zs__aio_take(zs_aio *h, zs__aio_op **out, size_t n, int block);

/* Sets up the next transfer of op. Returns 1 when the transfer may go to the
 * backend's asynchronous path (buf, len, off and f filled, alignment checked),
 * 0 when it must be done synchronously with zs__aio_op_sync (an unaligned
 * piece on a direct file: it uses the buffered companion), or a negative
 * error: then the op has already been finished with that error. */
int zs__aio_op_next(zs_aio *h, zs__aio_op *op, void **buf, size_t *len,
                    uint64_t *off, zs__file **f);
/* Accounts the result of a transfer (bytes moved, or a ZS_E* code). Returns
 * 1 if the op needs another transfer (short transfer continued), 0 if it is
 * finished (its request has been updated; do not touch op afterwards). */
int zs__aio_op_done(zs_aio *h, zs__aio_op *op, int64_t res);
/* Runs op to completion with blocking pread/pwrite (threads backend, and
 * unaligned pieces in every backend). */
void zs__aio_op_run_sync(zs_aio *h, zs__aio_op *op);
/* One blocking transfer of the op's current window (after op_next). */
int64_t zs__aio_op_sync(zs__aio_op *op, int use_companion);

#endif /* ZS_AIO_INTERNAL_H */
