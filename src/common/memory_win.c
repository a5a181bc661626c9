/* memory_win.c - the Windows half of memory.c: _aligned_malloc,
 * VirtualAlloc + VirtualLock for pinned buffers (growing the working-set
 * quota when a lock is refused), and no fixed page-lock limit. */
#include <stdlib.h>

#include "zs_os.h"

void *zs__os_aligned_alloc(size_t size, size_t align) {
  return _aligned_malloc(size, align);
}

void zs__os_aligned_free(void *p) { _aligned_free(p); }

size_t zs__os_page_size(void) {
  SYSTEM_INFO si;
  GetSystemInfo(&si);
  return si.dwPageSize;
}

uint64_t zs_memlock_limit(void) {
  /* Windows has no fixed limit: VirtualLock is bounded by the minimum
   * working set, which zs__os_pin raises as needed. */
  return UINT64_MAX;
}

int zs__os_pin(void **out, size_t len, unsigned flags, int *locked) {
  void *p = VirtualAlloc(NULL, len, MEM_COMMIT | MEM_RESERVE, PAGE_READWRITE);
  int err;
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
  *out = p;
  return 0;
}

void zs__os_unpin(void *p, size_t len) {
  VirtualUnlock(p, len); /* fails harmlessly if it was never locked */
  VirtualFree(p, 0, MEM_RELEASE);
}

int zs__os_advise_huge(void *p, size_t len) {
  (void)p;
  (void)len;
  /* Large pages on Windows need SeLockMemoryPrivilege and VirtualAlloc's
   * MEM_LARGE_PAGES at allocation: there is no advice for existing memory. */
  return zs__fail(ZS_ENOTSUP, "Windows has no huge page advice for existing "
                  "memory");
}
