/*
 * aio.h - zspeed's asynchronous file I/O engine (DeepSpeed's async_io op,
 * portable): read or write a memory buffer from/to a file at an offset,
 * synchronously or asynchronously, over one of three backends:
 *
 *   io_uring  Linux, through liburing; probed at run time (a seccomp profile
 *             such as Docker's default may forbid it).
 *   threads   a pool of worker threads doing pread/pwrite (every platform).
 *   iocp      Windows overlapped I/O on a completion port.
 *
 * Model. A handle (zs_aio) owns worker threads and a queue. A request (one
 * call to zs_aio_pread/zs_aio_pwrite) is split into pieces of at most
 * block_size bytes that the backend keeps in flight, queue_depth at a time
 * per lane, over intra_op_parallelism lanes. Submission returns at once with
 * a request id; zs_aio_wait() waits for one request, zs_aio_wait_all() for
 * every request submitted so far. Each request has its own status: a failed
 * request never makes the handle unusable, and its error (code and message)
 * is reported by the wait that collects it.
 *
 * Direct I/O. Files are opened with O_DIRECT / FILE_FLAG_NO_BUFFERING by
 * default. Where the file system refuses it (tmpfs), the file falls back to
 * buffered I/O and the reason is kept (zs_aio_file_why); with
 * ZS_AIO_DIRECT_ON the open fails instead. Requests need no alignment: the
 * engine issues only aligned pieces on a direct handle (the alignment comes
 * from statx STATX_DIOALIGN, else 4096), copies through an aligned bounce
 * buffer when the memory is not aligned, and moves an unaligned head or tail
 * (less than one alignment unit each) through a second, buffered handle on
 * the same file. Concurrent requests writing the same alignment unit of a
 * file are not ordered (as with pwrite).
 *
 * Errors. Functions return 0 (or a non-negative count/id) on success and a
 * negative ZS_E* code on failure, with details in zs_last_error(). Read past
 * the end of a file fails the request with ZS_EOF (bytes before the end are
 * still read into the buffer).
 *
 * Threads. A handle may be used from several threads at once. Buffers must
 * stay valid and untouched until the request has been waited for.
 *
 * Test-only fault sites (zs_fault_set): "aio.submit" fails the nth piece
 * handed to a backend (as if the submit call failed), "aio.io" fails the nth
 * completed piece (as if the device returned the error), "aio.short" makes
 * the nth piece transfer only part of its bytes (the engine continues it),
 * "aio.bounce" fails the nth bounce-buffer allocation, "aio.ring" makes the
 * nth io_uring ring creation fail as if the kernel refused it (ENOMEM),
 * "aio.nodirect" makes the nth zs_aio_file_open behave as on a file system
 * that refuses direct I/O.
 */
#ifndef ZSPEED_AIO_H
#define ZSPEED_AIO_H

#include "zspeed/zspeed.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Backends. AUTO picks io_uring when the probe says it works, else iocp on
 * Windows, else threads; the environment variable ZSPEED_AIO_BACKEND
 * (auto | io_uring | threads | iocp) overrides AUTO. */
enum zs_aio_backend {
  ZS_AIO_BACKEND_AUTO = 0,
  ZS_AIO_BACKEND_IO_URING = 1,
  ZS_AIO_BACKEND_THREADS = 2,
  ZS_AIO_BACKEND_IOCP = 3
};

/* Direct I/O policy of files opened by the handle (and by zs_aio_file_open). */
enum zs_aio_direct {
  ZS_AIO_DIRECT_AUTO = 0, /* direct if the file system allows it, else buffered */
  ZS_AIO_DIRECT_ON = 1,   /* direct or fail with ZS_ENOTSUP */
  ZS_AIO_DIRECT_OFF = 2   /* always buffered (page cache) */
};

/* Handle configuration. Always fill with zs_aio_config_init() first, then
 * change fields: new fields may be added at the end. The defaults are those
 * of DeepSpeed's aio_handle constructor. */
typedef struct zs_aio_config {
  /* Piece size in bytes (default 1 MiB). Rounded up to the direct I/O
   * alignment of each file. DeepSpeed: block_size. */
  int64_t block_size;
  /* Pieces in flight per lane (default 128). DeepSpeed: queue_depth. */
  int queue_depth;
  /* io_uring: submit each piece with its own system call (default 0 =
   * batch). Other backends ignore it. DeepSpeed: single_submit. */
  int single_submit;
  /* io_uring: keep submitting while completions are reaped (1), or submit a
   * batch and reap it entirely before the next (0, default). Other backends
   * ignore it. DeepSpeed: overlap_events. */
  int overlap_events;
  /* Lanes (default 1): io_uring rings / IOCP threads, each with its own
   * thread and queue_depth pieces in flight. The threads backend runs
   * intra_op_parallelism * min(queue_depth, 16) blocking workers. DeepSpeed:
   * intra_op_parallelism (older: thread_count). */
  int intra_op_parallelism;
  /* enum zs_aio_backend (default AUTO). */
  int backend;
  /* enum zs_aio_direct for files opened by path (default AUTO). */
  int direct;
} zs_aio_config;

/* Per-handle statistics (cumulative since creation or the last reset). */
typedef struct zs_aio_stats {
  uint64_t bytes_read, bytes_written;   /* bytes moved by successful requests */
  uint64_t requests, requests_failed;   /* requests completed (incl. failed) */
  uint64_t pieces;                      /* pieces issued to the backend */
  uint64_t pieces_bounced;              /* pieces copied via a bounce buffer */
  uint64_t pieces_buffered;             /* unaligned head/tail pieces */
  uint64_t short_continued;             /* short transfers continued */
  uint64_t request_ns;  /* sum over requests of submit-to-completion time */
  uint64_t busy_ns;     /* wall time with at least one request in flight */
} zs_aio_stats;

typedef struct zs_aio zs_aio;
typedef struct zs_aio_file zs_aio_file;

/* ------------------------------------------------------------- backends */

/* Fills cfg with the defaults. */
ZS_EXTERN void zs_aio_config_init(zs_aio_config *cfg);

/* "auto", "io_uring", "threads", "iocp" ("unknown" otherwise). */
ZS_EXTERN const char *zs_aio_backend_name(int backend);

/* Whether a concrete backend (ZS_AIO_BACKEND_IO_URING, _THREADS or _IOCP)
 * can run on this machine. Decided once per process: io_uring by creating a
 * small ring (which a seccomp profile such as Docker's default, an old
 * kernel, ZSPEED_DISABLE_URING or a build without liburing rule out), iocp
 * by the platform. Returns 1 if it can, 0 if not, ZS_EINVAL for AUTO or an
 * unknown value. why (may be NULL) receives, NUL-terminated within cap
 * bytes, "available (...)" or the reason it is not, e.g. "Windows only" or
 * "blocked (EPERM): a seccomp profile ... forbids it". zspeed report and
 * zs_aio_backend_resolve use the same words. */
ZS_EXTERN int zs_aio_backend_available(int backend, char *why, size_t cap);

/* Resolves a backend choice (ZS_AIO_BACKEND_*; AUTO consults
 * ZSPEED_AIO_BACKEND) without creating a handle. Returns the concrete backend
 * (> 0), or ZS_ENOTSUP if the requested backend is not usable here, or
 * ZS_EINVAL for an unknown value or environment name. why (may be NULL)
 * receives, NUL-terminated within cap bytes, why this backend was chosen and
 * why the others were not, e.g. "io_uring: available; iocp: Windows only". */
ZS_EXTERN int zs_aio_backend_resolve(int backend, char *why, size_t cap);

/* --------------------------------------------------------------- handle */

/* Creates a handle (cfg NULL = defaults) and starts its threads. Fails with
 * ZS_EINVAL for out-of-range fields (block_size < 1 or > 1 GiB, queue_depth
 * < 1 or > 4096, intra_op_parallelism < 1 or > 256), ZS_ENOTSUP if a forced
 * backend is not usable. */
ZS_EXTERN int zs_aio_create(zs_aio **out, const zs_aio_config *cfg);
/* Waits for every outstanding request, then stops the threads and frees
 * the handle. No other call on h may be in progress or follow. NULL is
 * ignored. */
ZS_EXTERN void zs_aio_destroy(zs_aio *h);
/* The configuration in effect (backend resolved to a concrete value). */
ZS_EXTERN void zs_aio_get_config(const zs_aio *h, zs_aio_config *out);
/* The backend this handle runs ("io_uring", "threads", "iocp") and the text
 * explaining the choice (see zs_aio_backend_resolve). Valid while h lives. */
ZS_EXTERN const char *zs_aio_backend(const zs_aio *h);
ZS_EXTERN const char *zs_aio_backend_why(const zs_aio *h);

/* ----------------------------------------------------------------- files */

/* Flags for zs_aio_file_open. Exactly one of READ, WRITE, RDWR. */
enum zs_aio_open_flags {
  ZS_AIO_READ = 0,
  ZS_AIO_WRITE = 1,
  ZS_AIO_RDWR = 2,
  ZS_AIO_CREATE = 1 << 2,   /* create if missing */
  ZS_AIO_TRUNCATE = 1 << 3, /* truncate to 0 on open */
  /* Direct I/O policy (default: try, fall back to buffered). */
  ZS_AIO_DIRECT_REQUIRE = 1 << 4,
  ZS_AIO_BUFFERED = 1 << 5
};

/* Opens a file for use with any handle; keep it open across many requests
 * (the NVMe swapper does). Closing is the caller's job, after every request
 * on it was waited for. With the iocp backend, the first handle that uses
 * a file binds it to its completion port (Windows allows one): requests of
 * any other handle on that file object then fail with ZS_EBUSY, so open the
 * file once per handle. */
ZS_EXTERN int zs_aio_file_open(zs_aio_file **out, const char *path,
                               unsigned flags);
/* Closes the file; returns the close error, if any. NULL is ignored. */
ZS_EXTERN int zs_aio_file_close(zs_aio_file *f);
/* 1 if the file does direct I/O, 0 if buffered. */
ZS_EXTERN int zs_aio_file_direct(const zs_aio_file *f);
/* Why the file is (or is not) doing direct I/O. */
ZS_EXTERN const char *zs_aio_file_why(const zs_aio_file *f);
/* Direct I/O alignment of the file (memory and file offset), 1 if buffered. */
ZS_EXTERN uint32_t zs_aio_file_alignment(const zs_aio_file *f);
/* Current size of the file in bytes, or a negative ZS_E* code. */
ZS_EXTERN int64_t zs_aio_file_size(zs_aio_file *f);
/* Reserves space and extends the file to size bytes (never shrinks). */
ZS_EXTERN int zs_aio_file_preallocate(zs_aio_file *f, int64_t size);
/* Flushes the file's data to the device. */
ZS_EXTERN int zs_aio_file_sync(zs_aio_file *f);

/* -------------------------------------------------------------- requests */

/* Submits an asynchronous read of len bytes at file offset off into buf
 * (or write of buf). Returns a request id (> 0) at once, or a negative
 * ZS_E* code if the request could not be queued (bad arguments, closed
 * handle); I/O errors are reported by the wait instead. len 0 is allowed
 * (completes at once). off + len must not exceed INT64_MAX. */
ZS_EXTERN int64_t zs_aio_pread(zs_aio *h, zs_aio_file *f, void *buf,
                               int64_t len, int64_t off);
ZS_EXTERN int64_t zs_aio_pwrite(zs_aio *h, zs_aio_file *f, const void *buf,
                                int64_t len, int64_t off);
/* The same by path: the file is opened with the handle's direct policy
 * (reads: existing file read-only; writes: created if missing, never
 * truncated) and closed when the request completes. An open failure is
 * returned at once. */
ZS_EXTERN int64_t zs_aio_pread_path(zs_aio *h, const char *path, void *buf,
                                    int64_t len, int64_t off);
ZS_EXTERN int64_t zs_aio_pwrite_path(zs_aio *h, const char *path,
                                     const void *buf, int64_t len, int64_t off);

/* Waits for request id and releases it. Returns 0 if it succeeded, its
 * error code if it failed (zs_last_error() then says what failed, where and
 * why), or ZS_EINVAL for an id that is unknown or already waited for. */
ZS_EXTERN int zs_aio_wait(zs_aio *h, int64_t id);
/* Non-blocking: 1 if request id has completed (wait will not block), 0 if
 * it is in flight, ZS_EINVAL if the id is unknown. */
ZS_EXTERN int zs_aio_test(zs_aio *h, int64_t id);
/* Waits for every request submitted so far (by any thread) and releases
 * them. Returns the number of requests collected (>= 0) if all succeeded,
 * else the error of the first failed one (in submission order) with its
 * message; every request is released either way. */
ZS_EXTERN int64_t zs_aio_wait_all(zs_aio *h);
/* Requests submitted and not yet released by a wait. */
ZS_EXTERN int64_t zs_aio_pending(zs_aio *h);

/* Requests of h that have completed since it was created, successfully or
 * not (a counter that never goes back; requests of length 0 count at
 * submission). With zs_aio_wait_completion it lets a caller that keeps
 * several requests in flight sleep until the next one completes, whichever
 * it is, without collecting it: read the counter, test the requests it
 * cares about (zs_aio_test), then wait for the counter to move. 0 for NULL. */
ZS_EXTERN uint64_t zs_aio_completions(zs_aio *h);
/* Blocks until zs_aio_completions(h) != seen; returns at once if a request
 * completed after the caller read seen. NULL is ignored. */
ZS_EXTERN void zs_aio_wait_completion(zs_aio *h, uint64_t seen);

/* Synchronous helpers: submit and wait. Return 0 or the request's error. */
ZS_EXTERN int zs_aio_read(zs_aio *h, zs_aio_file *f, void *buf, int64_t len,
                          int64_t off);
ZS_EXTERN int zs_aio_write(zs_aio *h, zs_aio_file *f, const void *buf,
                           int64_t len, int64_t off);

/* ------------------------------------------------------------ statistics */

ZS_EXTERN void zs_aio_stats_get(zs_aio *h, zs_aio_stats *out);
ZS_EXTERN void zs_aio_stats_reset(zs_aio *h);

#ifdef __cplusplus
}
#endif
#endif /* ZSPEED_AIO_H */
