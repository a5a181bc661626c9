/* Aligned and page-locked allocation, including the refused-lock path. */
#include <string.h>

#include "zs_internal.h"
#include "zt.h"

static void aligned_alloc_alignments(void) {
  size_t align;
  for (align = sizeof(void *); align <= 65536; align *= 2) {
    void *p = NULL;
    ZT_OK(zs_alloc_aligned(&p, 1000 + align, align));
    ZT_CHECKF(((uintptr_t)p & (align - 1)) == 0, "align %zu: %p", align, p);
    memset(p, 0xAB, 1000 + align);
    zs_free_aligned(p);
  }
  {
    void *p = (void *)1;
    ZT_OK(zs_alloc_aligned(&p, 0, 64)); /* zero size is a valid pointer */
    ZT_CHECK(p != NULL && p != (void *)1);
    zs_free_aligned(p);
  }
}

static void aligned_alloc_errors(void) {
  void *p = (void *)0x1234;
  ZT_ERR(zs_alloc_aligned(&p, 64, 48), ZS_EINVAL);
  ZT_ERR(zs_alloc_aligned(&p, 64, 2), ZS_EINVAL);
  ZT_ERR(zs_alloc_aligned(NULL, 64, 64), ZS_EINVAL);
  ZT_CHECK(p == (void *)0x1234); /* untouched on failure */
  ZT_ERR(zs_alloc_aligned(&p, SIZE_MAX - 100, 4096), ZS_ENOMEM);
  ZT_CHECK(p == (void *)0x1234);
}

static void pinned_alloc_locks_or_reports(void) {
  void *p = NULL;
  int locked = -1;
  size_t size = 3 * 4096 + 17;
  int rc = zs_alloc_pinned(&p, size, 0, &locked);
  if (rc == ZS_EMLOCK)
    ZT_SKIP("page-lock limit too small for a 16 KiB lock here: %s",
            zs_last_error());
  ZT_OK(rc);
  ZT_CHECK(locked == 1);
  ZT_CHECK(((uintptr_t)p & 4095) == 0);
  {
    size_t i;
    const unsigned char *b = p;
    for (i = 0; i < size; i++) ZT_CHECK(b[i] == 0);
  }
  memset(p, 1, size);
  zs_free_pinned(p, size);
}

static void pinned_alloc_refused_lock(void) {
  /* Simulate the lock limit with the "mlock" fault site: without the
   * fallback flag the call fails cleanly with ZS_EMLOCK and a message that
   * says how to fix it; with it, unlocked memory comes back. */
  void *p = (void *)0x1234;
  int locked = -1;
  ZT_OK(zs_fault_set("mlock", 1, 1, ZS_EMLOCK));
  ZT_ERR(zs_alloc_pinned(&p, 1 << 20, 0, &locked), ZS_EMLOCK);
  ZT_CHECK(p == (void *)0x1234 && locked == -1);
  ZT_CHECKF(strstr(zs_last_error(), "ZS_PIN_FALLBACK") != NULL, "'%s'",
            zs_last_error());
  ZT_OK(zs_fault_set("mlock", 1, 1, ZS_EMLOCK));
  ZT_OK(zs_alloc_pinned(&p, 1 << 20, ZS_PIN_FALLBACK, &locked));
  ZT_CHECK(locked == 0);
  memset(p, 7, 1 << 20);
  zs_free_pinned(p, 1 << 20);
  ZT_ERR(zs_alloc_pinned(&p, 16, 0x80, NULL), ZS_EINVAL);
  ZT_ERR(zs_alloc_pinned(NULL, 16, 0, NULL), ZS_EINVAL);
}

static void memlock_limit_is_reported(void) {
  ZT_CHECK(zs_memlock_limit() > 0);
}

ZT_MAIN(ZT_CASE(aligned_alloc_alignments), ZT_CASE(aligned_alloc_errors),
        ZT_CASE(pinned_alloc_locks_or_reports),
        ZT_CASE(pinned_alloc_refused_lock), ZT_CASE(memlock_limit_is_reported))
