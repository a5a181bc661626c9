/*
 * zspeed.h - the public C API of libzspeed: version, errors, CPU features,
 * memory, thread pool, the environment report and the ABI table.
 *
 * Every function here is exported with ZS_EXTERN and callable from ctypes:
 * no static inline functions, no structs passed by value. Functions that can
 * fail return 0 or a negative ZS_E* code; on failure they also leave a
 * human-readable explanation for the calling thread in zs_last_error().
 */
#ifndef ZSPEED_ZSPEED_H
#define ZSPEED_ZSPEED_H

#include <stddef.h>
#include <stdint.h>

#include "zspeed/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#  if defined(ZS_BUILDING_SHARED)
#    define ZS_EXTERN __declspec(dllexport)
#  elif defined(ZS_USING_SHARED)
#    define ZS_EXTERN __declspec(dllimport)
#  else
#    define ZS_EXTERN
#  endif
#elif defined(__GNUC__) || defined(__clang__)
#  define ZS_EXTERN __attribute__((visibility("default")))
#else
#  define ZS_EXTERN
#endif

/* ---------------------------------------------------------------- version */

#define ZS_VERSION_MAJOR 0
#define ZS_VERSION_MINOR 1
#define ZS_VERSION_PATCH 0
#define ZS_VERSION_HEX \
  ((ZS_VERSION_MAJOR << 16) | (ZS_VERSION_MINOR << 8) | ZS_VERSION_PATCH)
#define ZS_STRINGIFY_(x) #x
#define ZS_STRINGIFY(x) ZS_STRINGIFY_(x)
#define ZS_VERSION_STRING                                              \
  ZS_STRINGIFY(ZS_VERSION_MAJOR) "." ZS_STRINGIFY(ZS_VERSION_MINOR) "." \
  ZS_STRINGIFY(ZS_VERSION_PATCH)

/* The version the library was built as, (major << 16) | (minor << 8) | patch.
 * Compare with ZS_VERSION_HEX to detect a header/library mismatch. */
ZS_EXTERN unsigned zs_version(void);
/* The same as "major.minor.patch". */
ZS_EXTERN const char *zs_version_string(void);

/* ----------------------------------------------------------------- errors */

/* Short description of a ZS_E* code ("no space left on device"). Never NULL;
 * unknown codes give "unknown error". */
ZS_EXTERN const char *zs_strerror(int err);
/* Symbolic name of a ZS_E* code ("ZS_ENOSPC"). Never NULL. */
ZS_EXTERN const char *zs_err_name(int err);
/* The detailed message of the calling thread's most recent failure: what was
 * wrong and how to fix it. Empty string if nothing failed yet on this thread.
 * The pointer stays valid until the next zspeed call on the same thread. */
ZS_EXTERN const char *zs_last_error(void);

/* ------------------------------------------------------------ CPU & SIMD */

/* Feature bits reported by zs_cpu_features(). */
enum zs_cpu_feature {
  ZS_CPU_SSE2 = 1u << 0,
  ZS_CPU_AVX = 1u << 1,
  ZS_CPU_AVX2 = 1u << 2,
  ZS_CPU_FMA = 1u << 3,
  ZS_CPU_F16C = 1u << 4,
  ZS_CPU_AVX512F = 1u << 5,
  ZS_CPU_AVX512BW = 1u << 6,
  ZS_CPU_AVX512VL = 1u << 7,
  ZS_CPU_AVX512DQ = 1u << 8,
  ZS_CPU_AVX512BF16 = 1u << 9,
  ZS_CPU_NEON = 1u << 16,
  ZS_CPU_SVE = 1u << 17
};

/* SIMD code paths. A path is usable when the CPU has every feature it needs:
 * AVX2 needs AVX2+FMA+F16C; AVX512 needs AVX-512 F+BW+VL+DQ (and the OS must
 * save the wide registers, checked with xgetbv); NEON needs arm64 ASIMD. */
enum zs_simd_level {
  ZS_SIMD_SCALAR = 0,
  ZS_SIMD_AVX2 = 1,
  ZS_SIMD_AVX512 = 2,
  ZS_SIMD_NEON = 3
};

/* Feature bits of this CPU, detected once (usable by the OS, not just
 * advertised by CPUID). */
ZS_EXTERN uint32_t zs_cpu_features(void);
/* The CPU model name, e.g. "AMD EPYC 7B13" (empty if unknown). */
ZS_EXTERN const char *zs_cpu_model(void);
/* Logical cores this process may run on (affinity mask aware). */
ZS_EXTERN int zs_cpu_count(void);
/* Total physical memory in bytes (0 if unknown). */
ZS_EXTERN uint64_t zs_ram_bytes(void);
/* Best SIMD level this CPU supports. */
ZS_EXTERN int zs_simd_best(void);
/* The SIMD level kernels use: the forced one (zs_simd_force or the
 * ZSPEED_SIMD environment variable, read once) or else zs_simd_best().
 * Returns the level (>= 0), or ZS_ESIMD if ZSPEED_SIMD names a level the CPU
 * lacks or is not a known level name (zs_last_error says which). */
ZS_EXTERN int zs_simd_level(void);
/* Force a level by name ("scalar", "avx2", "avx512", "neon", or "auto" to go
 * back to the best). ZS_ESIMD if the CPU lacks it, ZS_EINVAL for an unknown
 * name; the previous choice is kept on failure. */
ZS_EXTERN int zs_simd_force(const char *name);
/* "scalar", "avx2", "avx512", "neon" ("unknown" for other values). */
ZS_EXTERN const char *zs_simd_name(int level);

/* ----------------------------------------------------------------- memory */

/* Aligned allocation; align must be a power of two >= sizeof(void*).
 * *out is set only on success. Free with zs_free_aligned. */
ZS_EXTERN int zs_alloc_aligned(void **out, size_t size, size_t align);
ZS_EXTERN void zs_free_aligned(void *p);

/* Flags for zs_alloc_pinned. */
enum zs_pin_flags {
  /* If the OS refuses to page-lock (RLIMIT_MEMLOCK on Linux, working-set
   * quota on Windows), return ordinary page-aligned memory instead of
   * failing, and report *locked = 0. */
  ZS_PIN_FALLBACK = 1u << 0
};

/* Page-aligned, zero-filled memory locked in RAM (mlock / VirtualLock), so it
 * is never swapped out. Without ZS_PIN_FALLBACK, a refused lock returns
 * ZS_EMLOCK and allocates nothing; zs_last_error says what the limit is and how
 * to raise it. *locked (may be NULL) tells whether the memory is locked.
 * Free with zs_free_pinned with the same size. Note: "pinned" for CUDA means
 * registered with the driver; that is the Python runtime's job. */
ZS_EXTERN int zs_alloc_pinned(void **out, size_t size, unsigned flags,
                              int *locked);
ZS_EXTERN void zs_free_pinned(void *p, size_t size);
/* Asks the OS to back the whole pages inside [p, p + size) with huge pages
 * when they are first touched (Linux: madvise MADV_HUGEPAGE, which the
 * transparent huge page setting "madvise" honours), so that filling a large
 * new buffer takes about 512 times fewer page faults. Advice only: the
 * memory and its contents are unchanged either way. Returns 0, ZS_EINVAL
 * for p NULL, or ZS_ENOTSUP where the OS has no such advice or refused it
 * (zs_last_error says why). */
ZS_EXTERN int zs_advise_huge_pages(void *p, size_t size);
/* The page-lock limit of this process in bytes; UINT64_MAX if unlimited
 * (or the process may lock without limit, e.g. root with CAP_IPC_LOCK). */
ZS_EXTERN uint64_t zs_memlock_limit(void);

/* ------------------------------------------------------------ thread pool */

typedef struct zs_pool zs_pool;

/* A pool of nthreads worker threads (0 = zs_cpu_count() - 1, since the
 * calling thread also works in zs_pool_parallel_for). */
ZS_EXTERN int zs_pool_create(zs_pool **out, int nthreads);
/* Joins the workers; tasks already submitted finish first. */
ZS_EXTERN void zs_pool_destroy(zs_pool *pool);
ZS_EXTERN int zs_pool_size(const zs_pool *pool);
/* The process-wide pool used when an API takes a NULL pool; created on first
 * use with ZSPEED_NUM_THREADS (or zs_cpu_count()) threads including the
 * caller. Never destroyed before exit. ZSPEED_NUM_THREADS must be an integer
 * in [1, 4096]; any other value is refused, not replaced: this returns NULL,
 * and every call that would use the default pool (a NULL pool given to
 * zs_pool_parallel_for, the optimizers, the swapper) fails with ZS_EINVAL
 * or ZS_ERANGE naming the variable, as zspeed report does. */
ZS_EXTERN zs_pool *zs_pool_default(void);

/* Body of a parallel loop: processes [begin, end). `worker` is 0 for the
 * calling thread and 1..n for pool workers (for per-worker scratch space). */
typedef void (*zs_range_fn)(void *ctx, size_t begin, size_t end, int worker);

/* Runs fn over [0, n) split into chunks of `chunk` items (the last may be
 * shorter), on at most `max_threads` threads including the caller
 * (0 = pool size + 1; a NULL pool runs on the caller alone, unless the
 * default pool was refused, see zs_pool_default). Chunk boundaries depend only on n and chunk, never on
 * the thread count, so per-chunk results can be combined deterministically.
 * Blocks until every chunk is done. Safe to call from inside a pool task. */
ZS_EXTERN int zs_pool_parallel_for(zs_pool *pool, size_t n, size_t chunk,
                                   int max_threads, zs_range_fn fn, void *ctx);

/* A fire-and-forget task run by a pool worker in submission order. */
typedef void (*zs_task_fn)(void *arg);
ZS_EXTERN int zs_pool_submit(zs_pool *pool, zs_task_fn fn, void *arg);

/* ----------------------------------------------------------------- report */

enum zs_report_flags { ZS_REPORT_JSON = 1u << 0 };

/* Writes the environment report (build, OS, CPU, SIMD, memory, page-lock
 * limit, I/O backends, CUDA driver) into buf as text or JSON, always
 * NUL-terminated when cap > 0. Returns the full length it needs (excluding
 * the NUL): call again with a bigger buffer if the result is >= cap. */
ZS_EXTERN int64_t zs_report(char *buf, size_t cap, unsigned flags);
/* The choices the environment forces that the library refuses: a
 * ZSPEED_SIMD value that is not a level or names one the CPU lacks, and a
 * ZSPEED_AIO_BACKEND value that is not a backend or names one that cannot
 * run here. Writes their explanations into buf, one per line,
 * NUL-terminated when cap > 0 (cut to fit), and returns how many there
 * are: 0 means everything the environment asks for is in effect. The JSON
 * report lists the same texts under "problems", and `zspeed report` exits
 * with status 1 when there is any. */
ZS_EXTERN int zs_report_problems(char *buf, size_t cap);

/* -------------------------------------------------------------- ABI table */

/* Kinds of rows in the ABI table. */
enum zs_abi_kind {
  /* A public struct: scope and name are its tag, value its sizeof, size its
   * alignment. Its fields follow it in declaration order. */
  ZS_ABI_STRUCT = 0,
  /* A field: scope is its struct, value its offset, size its sizeof. */
  ZS_ABI_FIELD = 1,
  /* An enum constant: scope is the enum's tag, name the constant, value its
   * value, size the sizeof of the enum type. */
  ZS_ABI_ENUM = 2,
  /* A #define'd number a caller needs (scope "constant"). */
  ZS_ABI_CONSTANT = 3
};

/* Row i (0, 1, 2, ...) of the table describing every public struct, enum
 * and constant of the headers as this library was compiled, so that
 * bindings which copy them (the Python package's ctypes mirrors) can check
 * their copies. Returns 1 and fills the outputs (any may be NULL; the
 * strings are static), or 0 when i is negative or past the end. The error
 * codes are not in the table: zs_err_name and zs_strerror describe them. */
ZS_EXTERN int zs_abi_entry(int i, int *kind, const char **scope,
                           const char **name, int64_t *value, int64_t *size);

/* ------------------------------------------------------- fault injection */

/* Test-only hook: make the nth (1-based) future call that reaches the named
 * site fail with `err` (a ZS_E* code); n = 0 clears the site. `count` > 1
 * fails that many consecutive calls from the nth on. Sites are documented
 * where they are checked (e.g. "mlock", "file.write"). Thread-safe. */
ZS_EXTERN int zs_fault_set(const char *site, int n, int count, int err);
/* Clears every armed fault. */
ZS_EXTERN void zs_fault_clear(void);

#ifdef __cplusplus
}
#endif
#endif /* ZSPEED_ZSPEED_H */
