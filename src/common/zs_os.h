/*
 * zs_os.h - the operating-system half of src/common. Each portable file
 * (file.c, memory.c, thread.c) keeps what every platform shares: argument
 * checks, fault-injection sites and messages. The functions below are what
 * differs, defined once per platform in the matching *_posix.c and *_win.c
 * file (CMake builds one of the two). Only src/common includes this header.
 */
#ifndef ZS_OS_H
#define ZS_OS_H

#include "zs_internal.h"

/* ----------------------------------------------------------------- files */

/* Sector sizes are 512 or 4096 bytes; 4096 satisfies both, so it is the
 * direct I/O alignment wherever the file system does not say otherwise. */
#define ZS__DEFAULT_DIO_ALIGN 4096u

/* zs__file_open after the portable checks: f is reset and path is not NULL. */
int zs__os_file_open(zs__file *f, const char *path, int flags);
/* zs__file_pread / zs__file_pwrite after the fault sites: *done is 0 on
 * entry and holds the bytes moved on return, also on failure. */
int zs__os_file_pread(zs__file *f, void *buf, size_t len, uint64_t off,
                      size_t *done);
int zs__os_file_pwrite(zs__file *f, const void *buf, size_t len, uint64_t off,
                       size_t *done);

/* ---------------------------------------------------------------- memory */

/* size bytes aligned to align (a power of two >= sizeof(void *), size not
 * 0 and small enough not to overflow), or NULL. */
void *zs__os_aligned_alloc(size_t size, size_t align);
void zs__os_aligned_free(void *p);
size_t zs__os_page_size(void);
/* Maps len bytes (a multiple of the page size) of zeroed memory and locks
 * them, applying the "mlock" fault site. A refused lock either fails with
 * ZS_EMLOCK (nothing mapped) or, with ZS_PIN_FALLBACK in flags, keeps the
 * memory unlocked; *locked (may be NULL) says which. */
int zs__os_pin(void **out, size_t len, unsigned flags, int *locked);
void zs__os_unpin(void *p, size_t len);
/* madvise(MADV_HUGEPAGE) of [p, p + len), p and len page-aligned, len > 0;
 * ZS_ENOTSUP where there is no such advice. */
int zs__os_advise_huge(void *p, size_t len);

/* --------------------------------------------------------------- threads */

/* What a new thread runs: both platforms' entry trampolines hand their
 * argument to zs__thread_start_run, which frees it and calls fn(arg). */
typedef struct zs__thread_start {
  zs__thread_fn fn;
  void *arg;
} zs__thread_start;

/* A start block for fn(arg), or NULL (with the error recorded). */
zs__thread_start *zs__thread_start_new(zs__thread_fn fn, void *arg);
void zs__thread_start_run(zs__thread_start *s);

#endif /* ZS_OS_H */
