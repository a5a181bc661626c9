/* Aligned and page-locked allocation, including the refused-lock path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_internal.h"
#if defined(__linux__)
#  include <sys/resource.h>
#  include <sys/wait.h>
#  include <unistd.h>
#endif
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

#if defined(__linux__)
/* A real refused lock, not an injected one: in a child that drops root (so
 * CAP_IPC_LOCK no longer bypasses the limit) and lowers RLIMIT_MEMLOCK to
 * 64 KiB, a 1 MiB pinned allocation must fail with ZS_EMLOCK, name the limit,
 * fall back cleanly with ZS_PIN_FALLBACK, and the report must warn. */
static void real_memlock_limit(void) {
  int status = 0;
  pid_t pid;
  if (ZT_SANITIZED) ZT_SKIP("sanitizer runtimes make mlock a no-op");
  pid = fork();
  ZT_CHECK(pid >= 0);
  if (pid == 0) {
    struct rlimit rl;
    void *p = NULL;
    int locked = -1;
    char *buf;
    int64_t need;
    rl.rlim_cur = rl.rlim_max = 64 * 1024;
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) _exit(10);
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(11);
    if (zs_memlock_limit() != 64 * 1024) _exit(12);
    if (zs_alloc_pinned(&p, 1 << 20, 0, &locked) != ZS_EMLOCK) _exit(13);
    if (!strstr(zs_last_error(), "RLIMIT_MEMLOCK") ||
        !strstr(zs_last_error(), "65536"))
      _exit(14);
    if (zs_alloc_pinned(&p, 1 << 20, ZS_PIN_FALLBACK, &locked) != 0 ||
        locked != 0)
      _exit(15);
    memset(p, 3, 1 << 20);
    zs_free_pinned(p, 1 << 20);
    if (zs_alloc_pinned(&p, 4096, 0, &locked) != 0 || locked != 1) _exit(16);
    zs_free_pinned(p, 4096);
    need = zs_report(NULL, 0, 0);
    buf = malloc((size_t)need + 1);
    if (!buf) _exit(17);
    zs_report(buf, (size_t)need + 1, 0);
    if (!strstr(buf, "page-lock limit ..... 64 KiB") ||
        !strstr(buf, "WARNING: page-lock limit is below 1 GiB"))
      _exit(18);
    free(buf);
    _exit(0);
  }
  ZT_CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
  if (WEXITSTATUS(status) == 11) ZT_SKIP("cannot drop root privileges here");
  ZT_CHECKF(WEXITSTATUS(status) == 0, "child check %d failed",
            WEXITSTATUS(status));
}
#else
static void real_memlock_limit(void) {
  ZT_SKIP("RLIMIT_MEMLOCK is Linux-specific; Windows grows the working set");
}
#endif

#if defined(__linux__) && defined(__x86_64__)
/* AnonHugePages of this process (kB), -1 if unreadable. */
static long anon_huge_kb(void) {
  char line[256];
  long kb = -1;
  FILE *f = fopen("/proc/self/smaps_rollup", "r");
  if (!f) return -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) break;
  fclose(f);
  return kb;
}

/* 1 if the kernel's transparent huge page mode honours MADV_HUGEPAGE. */
static int thp_advisable(void) {
  char mode[128] = "";
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (!f) return 0;
  if (!fgets(mode, sizeof mode, f)) mode[0] = 0;
  fclose(f);
  return strstr(mode, "[never]") == NULL && mode[0] != 0;
}
#endif

/* Huge page advice: the contents are kept, the whole pages inside the range
 * are advised (none for a range inside one page: nothing to do), and on a
 * Linux kernel whose THP mode honours it, touching advised memory gives
 * huge pages (checked on x86-64, where the tests run natively; the arm64
 * build runs under qemu-user, whose guest memory the host's counters do not
 * show as the guest advised it). */
static void huge_page_advice(void) {
  size_t len = (size_t)32 << 20;
  unsigned char *p = NULL;
  int rc;
  size_t i;
  ZT_ERR(zs_advise_huge_pages(NULL, 4096), ZS_EINVAL);
  ZT_OK(zs_alloc_aligned((void **)&p, len, (size_t)2 << 20));
  memset(p, 0x5A, 4096);
  ZT_OK(zs_advise_huge_pages(p + 1, 100)); /* no whole page inside */
  rc = zs_advise_huge_pages(p + 1, len - 1);
#if defined(__linux__) && defined(__x86_64__)
  if (thp_advisable()) {
    long before = anon_huge_kb();
    ZT_CHECKF(rc == 0, "advice refused: %s", zs_last_error());
    memset(p + 4096, 0x33, len - 4096);
    if (before >= 0)
      ZT_CHECKF(anon_huge_kb() >= before + 2048, "AnonHugePages %ld -> %ld kB "
                "after touching 32 MiB of advised memory", before,
                anon_huge_kb());
  } else {
    ZT_CHECK(rc == 0 || rc == ZS_ENOTSUP);
    memset(p + 4096, 0x33, len - 4096);
  }
#else
  ZT_CHECK(rc == 0 || rc == ZS_ENOTSUP);
  memset(p + 4096, 0x33, len - 4096);
#endif
  for (i = 0; i < 4096; i++) ZT_CHECK(p[i] == 0x5A);
  for (i = 4096; i < len; i += 4093) ZT_CHECK(p[i] == 0x33);
  zs_free_aligned(p);
}

ZT_MAIN(ZT_CASE(real_memlock_limit), ZT_CASE(huge_page_advice), ZT_CASE(aligned_alloc_alignments), ZT_CASE(aligned_alloc_errors),
        ZT_CASE(pinned_alloc_locks_or_reports),
        ZT_CASE(pinned_alloc_refused_lock), ZT_CASE(memlock_limit_is_reported))
