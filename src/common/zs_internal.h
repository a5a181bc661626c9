/*
 * zs_internal.h - the portable core shared by every part of libzspeed:
 * error reporting, atomics, threads, files, clocks and fault injection.
 * Internal (zs__ prefix): not part of the ABI, but visible to the C tests,
 * which link the static library.
 */
#ifndef ZS_INTERNAL_H
#define ZS_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "zspeed/zspeed.h"

#ifdef _WIN32
#  ifndef WIN32_LEAN_AND_MEAN
#    define WIN32_LEAN_AND_MEAN
#  endif
#  include <windows.h>
#else
#  include <pthread.h>
#endif

/* --------------------------------------------------------------- helpers */

#if defined(__MINGW32__)
/* MinGW: C99 printf (%zu, %lld) via __USE_MINGW_ANSI_STDIO, set by CMake. */
#  define ZS_PRINTF(f, a) __attribute__((format(gnu_printf, f, a)))
#  define ZS_LIKELY(x) __builtin_expect(!!(x), 1)
#  define ZS_UNLIKELY(x) __builtin_expect(!!(x), 0)
#elif defined(__GNUC__) || defined(__clang__)
#  define ZS_PRINTF(f, a) __attribute__((format(printf, f, a)))
#  define ZS_LIKELY(x) __builtin_expect(!!(x), 1)
#  define ZS_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#  define ZS_PRINTF(f, a)
#  define ZS_LIKELY(x) (x)
#  define ZS_UNLIKELY(x) (x)
#endif

#if defined(_MSC_VER) && !defined(__clang__)
#  define ZS_THREAD_LOCAL __declspec(thread)
#else
#  define ZS_THREAD_LOCAL _Thread_local
#endif

#define ZS_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ZS_MAX(a, b) ((a) > (b) ? (a) : (b))
#define ZS_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* ---------------------------------------------------------------- errors */

/* Records a detailed message for zs_last_error() and returns err, so a
 * failure reads: return zs__fail(ZS_EINVAL, "n must be > 0, got %d", n); */
int zs__fail(int err, const char *fmt, ...) ZS_PRINTF(2, 3);
/* Appends context in front of the thread's current message
 * ("opening /x: " + old message). Returns err. */
int zs__fail_prefix(int err, const char *fmt, ...) ZS_PRINTF(2, 3);
/* Clears the calling thread's message (called by successful entry points
 * only where stale messages would mislead). */
void zs__clear_error(void);
/* Platform error translation: exactly one per platform. */
#ifdef _WIN32
int zs__translate_win32(unsigned long code);
#else
int zs__translate_errno(int e);
#endif
/* The last OS error of this thread, translated. */
int zs__os_error(void);

/* --------------------------------------------------------------- atomics */
/* Sequentially consistent unless the name says otherwise. GCC/Clang (and
 * MinGW) use the __atomic builtins, which TSan understands; MSVC uses the
 * Interlocked family. */

int64_t zs__atomic_load64(const volatile int64_t *p);
void zs__atomic_store64(volatile int64_t *p, int64_t v);
int64_t zs__atomic_add64(volatile int64_t *p, int64_t v); /* returns old */
int zs__atomic_cas64(volatile int64_t *p, int64_t *expected, int64_t desired);
int32_t zs__atomic_load32(const volatile int32_t *p);
void zs__atomic_store32(volatile int32_t *p, int32_t v);
int32_t zs__atomic_add32(volatile int32_t *p, int32_t v); /* returns old */

/* --------------------------------------------------------------- threads */

#ifdef _WIN32
typedef struct { HANDLE h; } zs__thread;
typedef SRWLOCK zs__mutex;
typedef CONDITION_VARIABLE zs__cond;
typedef INIT_ONCE zs__once_t;
#  define ZS__ONCE_INIT INIT_ONCE_STATIC_INIT
#else
typedef struct { pthread_t t; } zs__thread;
typedef pthread_mutex_t zs__mutex;
typedef pthread_cond_t zs__cond;
typedef pthread_once_t zs__once_t;
#  define ZS__ONCE_INIT PTHREAD_ONCE_INIT
#endif

typedef void (*zs__thread_fn)(void *arg);
int zs__thread_create(zs__thread *t, zs__thread_fn fn, void *arg);
int zs__thread_join(zs__thread *t);
int zs__mutex_init(zs__mutex *m);
void zs__mutex_destroy(zs__mutex *m);
void zs__mutex_lock(zs__mutex *m);
void zs__mutex_unlock(zs__mutex *m);
int zs__cond_init(zs__cond *c);
void zs__cond_destroy(zs__cond *c);
void zs__cond_wait(zs__cond *c, zs__mutex *m);
/* Returns 0 when signalled (or spuriously woken), ZS_EAGAIN on timeout. */
int zs__cond_timedwait(zs__cond *c, zs__mutex *m, uint64_t timeout_ns);
void zs__cond_signal(zs__cond *c);
void zs__cond_broadcast(zs__cond *c);
void zs__call_once(zs__once_t *o, void (*fn)(void));

/* Threads of one pool at most, the caller included (ZSPEED_NUM_THREADS). */
#define ZS__MAX_THREADS 4096
/* 0 if the default pool exists; else its error code, with the message
 * saying why (an unusable ZSPEED_NUM_THREADS names the variable). */
int zs__pool_default_check(void);

/* ----------------------------------------------------------------- clock */

/* Monotonic nanoseconds. */
uint64_t zs__now_ns(void);

/* --------------------------------------------------------------- env */

/* getenv that is thread-safe enough for reading once at start-up and
 * returns NULL for empty values. */
const char *zs__getenv(const char *name);

/* --------------------------------------------------------------- numbers */

/* The strict number parser of environment variables and the native
 * command's options (parse.c). The whole string must be the number; a value
 * outside [lo, hi] is refused, never clamped. Returns 0, ZS_EINVAL (not a
 * number; the message says what is expected) or ZS_ERANGE (the message
 * gives the range). */
int zs__parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out);
/* A byte or element count: an integer or decimal with an optional binary
 * unit (K, M, G, T = 2^10 .. 2^40, optionally followed by "iB" or "B"),
 * or 2^k; the result must be a whole number. */
int zs__parse_size(const char *s, int64_t lo, int64_t hi, int64_t *out);

/* ----------------------------------------------------------------- files */

enum zs__open_flags {
  ZS__O_RDONLY = 0,
  ZS__O_WRONLY = 1,
  ZS__O_RDWR = 2,
  ZS__O_ACCMODE = 3,
  ZS__O_CREAT = 1 << 2,
  ZS__O_TRUNC = 1 << 3,
  ZS__O_EXCL = 1 << 4,
  /* Bypass the page cache (O_DIRECT / FILE_FLAG_NO_BUFFERING). Fails with
   * ZS_ENOTSUP on file systems that refuse it (tmpfs) unless
   * ZS__O_DIRECT_TRY is also given, which falls back to buffered I/O. */
  ZS__O_DIRECT = 1 << 5,
  ZS__O_DIRECT_TRY = 1 << 6,
  /* Windows: open for overlapped I/O (FILE_FLAG_OVERLAPPED); ignored
   * elsewhere. */
  ZS__O_OVERLAPPED = 1 << 7
};

typedef struct zs__file {
  intptr_t h;     /* fd on POSIX, HANDLE on Windows; -1 when closed */
  int direct;     /* opened with direct I/O in effect */
  int overlapped; /* Windows: opened for overlapped I/O */
} zs__file;

#define ZS__FILE_INIT {-1, 0, 0}

int zs__file_open(zs__file *f, const char *path, int flags);
int zs__file_close(zs__file *f);
/* Positional read/write of up to len bytes; *done gets the bytes moved (a
 * short count at EOF on read is not an error here). Retries EINTR. Fault
 * sites: "file.read", "file.write". */
int zs__file_pread(zs__file *f, void *buf, size_t len, uint64_t off,
                   size_t *done);
int zs__file_pwrite(zs__file *f, const void *buf, size_t len, uint64_t off,
                    size_t *done);
int zs__file_size(zs__file *f, uint64_t *size);
int zs__file_truncate(zs__file *f, uint64_t size);
/* Reserves disk blocks for [0, size) and extends the file to size (so later
 * writes cannot fail with ENOSPC and, on Windows, are not extending writes). */
int zs__file_preallocate(zs__file *f, uint64_t size);
int zs__file_sync(zs__file *f);
/* Memory and file-offset alignment direct I/O needs for files at path (or in
 * the directory path): statx STATX_DIOALIGN where available, else 4096. */
int zs__file_dio_alignment(const char *path, uint32_t *mem_align,
                           uint32_t *off_align);
/* Atomically replaces `to` by `from` (rename / MoveFileEx with
 * MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH), then on POSIX fsyncs
 * the directory so the rename itself is durable. */
int zs__file_replace(const char *from, const char *to);
int zs__file_remove(const char *path);

/* -------------------------------------------------------- fault injection */

/* Returns 0, or the injected error if a fault armed with zs_fault_set fires
 * at `site` now. Cheap when nothing is armed (one atomic load). */
int zs__fault_check(const char *site);

#endif /* ZS_INTERNAL_H */
