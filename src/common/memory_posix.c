/* memory_posix.c - the POSIX half of memory.c: posix_memalign, mmap +
 * mlock for pinned buffers, and RLIMIT_MEMLOCK as the page-lock limit. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "zs_os.h"

void *zs__os_aligned_alloc(size_t size, size_t align) {
  void *p = NULL;
  return posix_memalign(&p, align, size) == 0 ? p : NULL;
}

void zs__os_aligned_free(void *p) { free(p); }

size_t zs__os_page_size(void) {
  long ps = sysconf(_SC_PAGESIZE);
  return ps > 0 ? (size_t)ps : 4096;
}

uint64_t zs_memlock_limit(void) {
  struct rlimit rl;
  if (geteuid() == 0) return UINT64_MAX; /* CAP_IPC_LOCK in practice */
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
    return UINT64_MAX;
  return (uint64_t)rl.rlim_cur;
}

int zs__os_pin(void **out, size_t len, unsigned flags, int *locked) {
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  int err;
  if (p == MAP_FAILED)
    return zs__fail(ZS_ENOMEM, "mmap of %zu bytes failed", len);
  err = zs__fault_check("mlock");
  if (err == 0 && mlock(p, len) != 0) err = ZS_EMLOCK;
  if (err) {
    if (!(flags & ZS_PIN_FALLBACK)) {
      uint64_t lim = zs_memlock_limit();
      munmap(p, len);
      if (lim == UINT64_MAX)
        return zs__fail(ZS_EMLOCK,
                        "mlock of %zu bytes failed; pass ZS_PIN_FALLBACK to "
                        "use unlocked memory",
                        len);
      return zs__fail(ZS_EMLOCK,
                      "mlock of %zu bytes failed: the page-lock limit "
                      "(RLIMIT_MEMLOCK) is %llu bytes; raise it with "
                      "'ulimit -l unlimited' or in "
                      "/etc/security/limits.conf, or pass ZS_PIN_FALLBACK "
                      "to use unlocked memory",
                      len, (unsigned long long)lim);
    }
    if (locked) *locked = 0;
  } else if (locked) {
    *locked = 1;
  }
  *out = p;
  return 0;
}

void zs__os_unpin(void *p, size_t len) {
  munlock(p, len);
  munmap(p, len);
}

int zs__os_advise_huge(void *p, size_t len) {
#ifdef MADV_HUGEPAGE
  if (madvise(p, len, MADV_HUGEPAGE) != 0)
    return zs__fail(ZS_ENOTSUP, "madvise(MADV_HUGEPAGE) of %zu bytes: %s "
                    "(transparent huge pages off in this kernel?)", len,
                    strerror(errno));
  return 0;
#else
  (void)p;
  (void)len;
  return zs__fail(ZS_ENOTSUP, "this OS has no MADV_HUGEPAGE advice");
#endif
}
