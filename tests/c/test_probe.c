/* Run-time probes: io_uring refused by a seccomp filter (as under Docker's
 * default profile) must be reported as "blocked (EPERM)", and the report
 * must carry that reason. The filter is installed in a forked child so the
 * rest of the tests keep io_uring. */
#include <stdlib.h>
#include <string.h>

#include "zs_internal.h"
#include "zspeed/aio.h"
#include "zt.h"

/* The io_uring probe through the public API: 1 if usable, else 0 and why. */
static int uring_probe(const char **why) {
  static char buf[200];
  int ok = zs_aio_backend_available(ZS_AIO_BACKEND_IO_URING, buf, sizeof buf);
  *why = buf;
  return ok;
}

#if defined(__linux__)
#  include <errno.h>
#  include <linux/audit.h>
#  include <linux/filter.h>
#  include <linux/seccomp.h>
#  include <stddef.h>
#  include <stdio.h>
#  include <stdlib.h>
#  include <sys/prctl.h>
#  include <sys/syscall.h>
#  include <sys/wait.h>
#  include <unistd.h>

#  ifndef __NR_io_uring_setup
#    define __NR_io_uring_setup 425
#  endif

/* Returns EPERM for io_uring_setup, allows every other system call. */
static int block_uring(void) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog;
  prog.len = (unsigned short)(sizeof f / sizeof f[0]);
  prog.filter = f;
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

static void uring_blocked_by_seccomp(void) {
  const char *why = NULL;
  int status = 0;
  pid_t pid;
  /* Probe in a child first: the parent's result is cached for other tests. */
  pid = fork();
  ZT_CHECK(pid >= 0);
  if (pid == 0) {
    int ok = uring_probe(&why);
    _exit(ok ? 0 : (strstr(why, "not compiled in") ? 3 : 4));
  }
  ZT_CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
  if (WEXITSTATUS(status) == 3) ZT_SKIP("built without liburing");
  if (WEXITSTATUS(status) == 4)
    ZT_SKIP("io_uring is already unavailable on this machine");
  pid = fork();
  ZT_CHECK(pid >= 0);
  if (pid == 0) {
    char buf[8192];
    if (block_uring() != 0) _exit(5);
    if (uring_probe(&why)) _exit(6);
    if (!strstr(why, "blocked (EPERM)") || !strstr(why, "seccomp")) _exit(7);
    if (zs_report(buf, sizeof buf, 0) <= 0) _exit(8);
    if (!strstr(buf, "io_uring  .......... unavailable: blocked (EPERM)"))
      _exit(9);
    _exit(0);
  }
  ZT_CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
  if (WEXITSTATUS(status) == 5) ZT_SKIP("cannot install a seccomp filter here");
  ZT_CHECKF(WEXITSTATUS(status) == 0, "child check %d failed",
            WEXITSTATUS(status));
}
#else
static void uring_blocked_by_seccomp(void) {
  const char *why = NULL;
  ZT_CHECK(uring_probe(&why) == 0);
  ZT_CHECK(why && why[0]);
  ZT_SKIP("io_uring is Linux-only (reported as: %s)", why);
}
#endif

static void report_text_and_json(void) {
  char *buf;
  int64_t need = zs_report(NULL, 0, 0), got;
  ZT_CHECK(need > 100);
  buf = malloc((size_t)need + 1);
  ZT_CHECK(buf != NULL);
  got = zs_report(buf, (size_t)need + 1, 0);
  ZT_CHECK(got == need && strlen(buf) == (size_t)need);
  ZT_CHECK(strstr(buf, "simd level") && strstr(buf, "io backends:"));
  free(buf);
  need = zs_report(NULL, 0, ZS_REPORT_JSON);
  buf = malloc((size_t)need + 1);
  ZT_CHECK(buf != NULL);
  zs_report(buf, (size_t)need + 1, ZS_REPORT_JSON);
  ZT_CHECK(buf[0] == '{' && strstr(buf, "\"io_backends\""));
  free(buf);
  {
    char small[16];
    ZT_CHECK(zs_report(small, sizeof small, 0) == zs_report(NULL, 0, 0));
    ZT_CHECK(strlen(small) == sizeof small - 1); /* truncated, terminated */
  }
  ZT_ERR((int)zs_report(NULL, 0, 0x40), ZS_EINVAL);
}

/* zs_report_problems lists exactly the forced choices that are refused,
 * one per line; the JSON report carries the same list. ctest also runs this
 * binary with ZSPEED_SIMD=bogus and ZSPEED_AIO_BACKEND=floppy, where both
 * must be listed. */
static void report_problems(void) {
  char buf[2048], small[10], *json;
  const char *simd_env = getenv("ZSPEED_SIMD"), *aio_env = getenv("ZSPEED_AIO_BACKEND");
  int simd_bad = zs_simd_level() < 0;
  int aio_bad = zs_aio_backend_resolve(ZS_AIO_BACKEND_AUTO, NULL, 0) < 0;
  int64_t need;
  int n = zs_report_problems(buf, sizeof buf);
  ZT_CHECKF(n == simd_bad + aio_bad, "%d problems listed: %s", n, buf);
  if (simd_env && strcmp(simd_env, "bogus") == 0) ZT_CHECK(simd_bad);
  if (aio_env && strcmp(aio_env, "floppy") == 0) ZT_CHECK(aio_bad);
  if (n == 0) ZT_CHECK(buf[0] == '\0');
  if (simd_bad) ZT_CHECK(strstr(buf, "ZSPEED_SIMD='") != NULL);
  if (aio_bad) ZT_CHECK(strstr(buf, "ZSPEED_AIO_BACKEND") != NULL);
  ZT_CHECK((strchr(buf, '\n') != NULL) == (n == 2)); /* one per line */
  ZT_CHECK(zs_report_problems(NULL, 0) == n);
  ZT_CHECK(zs_report_problems(small, sizeof small) == n);
  ZT_CHECK(strlen(small) < sizeof small && strncmp(small, buf, strlen(small)) == 0);
  need = zs_report(NULL, 0, ZS_REPORT_JSON);
  json = malloc((size_t)need + 1);
  ZT_CHECK(json != NULL);
  zs_report(json, (size_t)need + 1, ZS_REPORT_JSON);
  if (n == 0) {
    ZT_CHECK(strstr(json, "\"problems\": []") != NULL);
  } else {
    char *first = strstr(json, "\"problems\": [\"");
    size_t len = strcspn(buf, "\n");
    ZT_CHECK(first != NULL && strncmp(first + 14, buf, len) == 0);
  }
  free(json);
}

ZT_MAIN(ZT_CASE(uring_blocked_by_seccomp), ZT_CASE(report_text_and_json),
        ZT_CASE(report_problems))
