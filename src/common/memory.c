/* memory.c - aligned and page-locked allocation. */
#include <stdlib.h>
#include <string.h>

#include "zs_internal.h"

#ifndef _WIN32
#  include <errno.h>
#  include <sys/mman.h>
#  include <sys/resource.h>
#  include <unistd.h>
#endif

static int zs__is_pow2(size_t x) { return x && !(x & (x - 1)); }

int zs_alloc_aligned(void **out, size_t size, size_t align) {
  void *p = NULL;
  if (!out) return zs__fail(ZS_EINVAL, "zs_alloc_aligned: out is NULL");
  if (!zs__is_pow2(align) || align < sizeof(void *))
    return zs__fail(ZS_EINVAL,
                    "zs_alloc_aligned: align must be a power of two >= %u, "
                    "got %zu",
                    (unsigned)sizeof(void *), align);
  if (size == 0) size = align; /* a unique, freeable pointer */
  /* Some allocators (msvcrt's _aligned_malloc under Wine) overflow
   * size + align silently: refuse impossible sizes ourselves. */
  if (size > SIZE_MAX - 2 * align)
    return zs__fail(ZS_ENOMEM, "cannot allocate %zu bytes aligned to %zu",
                    size, align);
#ifdef _WIN32
  p = _aligned_malloc(size, align);
  if (!p)
#else
  if (posix_memalign(&p, align, size) != 0)
#endif
    return zs__fail(ZS_ENOMEM, "cannot allocate %zu bytes aligned to %zu",
                    size, align);
  *out = p;
  return 0;
}

void zs_free_aligned(void *p) {
#ifdef _WIN32
  _aligned_free(p);
#else
  free(p);
#endif
}

static size_t zs__page_size(void) {
#ifdef _WIN32
  SYSTEM_INFO si;
  GetSystemInfo(&si);
  return si.dwPageSize;
#else
  long ps = sysconf(_SC_PAGESIZE);
  return ps > 0 ? (size_t)ps : 4096;
#endif
}

uint64_t zs_memlock_limit(void) {
#ifdef _WIN32
  /* Windows has no fixed limit: VirtualLock is bounded by the minimum
   * working set, which zs_alloc_pinned raises as needed. */
  return UINT64_MAX;
#else
  struct rlimit rl;
  if (geteuid() == 0) return UINT64_MAX; /* CAP_IPC_LOCK in practice */
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
    return UINT64_MAX;
  return (uint64_t)rl.rlim_cur;
#endif
}

int zs_alloc_pinned(void **out, size_t size, unsigned flags, int *locked) {
  size_t page = zs__page_size(), len;
  void *p;
  int err;
  if (!out) return zs__fail(ZS_EINVAL, "zs_alloc_pinned: out is NULL");
  if (flags & ~(unsigned)ZS_PIN_FALLBACK)
    return zs__fail(ZS_EINVAL, "zs_alloc_pinned: unknown flags 0x%x", flags);
  if (size > SIZE_MAX - page)
    return zs__fail(ZS_ENOMEM, "zs_alloc_pinned: size %zu too large", size);
  len = size ? (size + page - 1) / page * page : page;
#ifdef _WIN32
  p = VirtualAlloc(NULL, len, MEM_COMMIT | MEM_RESERVE, PAGE_READWRITE);
  if (!p) return zs__fail(ZS_ENOMEM, "VirtualAlloc of %zu bytes failed", len);
  err = zs__fault_check("mlock");
  if (err == 0 && !VirtualLock(p, len)) {
    /* The lock quota is the minimum working set: grow it by len and retry. */
    SIZE_T mn, mx;
    HANDLE self = GetCurrentProcess();
    if (GetProcessWorkingSetSize(self, &mn, &mx) &&
        SetProcessWorkingSetSize(self, mn + len, ZS_MAX(mx, mn + len)) &&
        VirtualLock(p, len))
      err = 0;
    else
      err = ZS_EMLOCK;
  }
  if (err) {
    if (!(flags & ZS_PIN_FALLBACK)) {
      VirtualFree(p, 0, MEM_RELEASE);
      return zs__fail(ZS_EMLOCK,
                      "VirtualLock of %zu bytes failed (working-set quota); "
                      "free memory, or pass ZS_PIN_FALLBACK to use unlocked "
                      "memory",
                      len);
    }
    if (locked) *locked = 0;
  } else if (locked) {
    *locked = 1;
  }
#else
  p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
           0);
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
#endif
  *out = p;
  return 0;
}

void zs_free_pinned(void *p, size_t size) {
  size_t page, len;
  if (!p) return;
  page = zs__page_size();
  len = size ? (size + page - 1) / page * page : page;
#ifdef _WIN32
  VirtualUnlock(p, len); /* fails harmlessly if it was never locked */
  VirtualFree(p, 0, MEM_RELEASE);
#else
  munlock(p, len);
  munmap(p, len);
#endif
}
