/* report.c - zs_report(): what zspeed sees on this machine, as text or JSON.
 * The native `zspeed report` command and `python -m zspeed report` print it.
 * It asks each area for its own facts (CPU and memory from common, backend
 * availability from aio) and words nothing twice. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report/report_internal.h"
#include "zspeed/aio.h"

#ifndef _WIN32
#  include <sys/utsname.h>
#  include <unistd.h>
#endif

#ifndef ZS_BUILD_DATE
#  define ZS_BUILD_DATE "unknown"
#endif
#ifndef ZS_BUILD_FLAGS
#  define ZS_BUILD_FLAGS ""
#endif
#ifndef ZS_BUILD_TYPE
#  define ZS_BUILD_TYPE ""
#endif

/* Pinned buffers for offload are hundreds of MiB; below this the report
 * warns that locking will fall back to pageable memory. */
#define ZS__MEMLOCK_WARN ((uint64_t)1 << 30)

/* ------------------------------------------------------- string builder */

typedef struct {
  char *p;
  size_t len, cap;
  int oom;
} zs__sb;

static void zs__sb_vadd(zs__sb *sb, const char *fmt, va_list ap) {
  va_list ap2;
  int n;
  if (sb->oom) return;
  va_copy(ap2, ap);
  n = vsnprintf(sb->p ? sb->p + sb->len : NULL, sb->p ? sb->cap - sb->len : 0,
                fmt, ap2);
  va_end(ap2);
  if (n < 0) return;
  if (sb->len + (size_t)n + 1 > sb->cap) {
    size_t ncap = (sb->cap + (size_t)n + 1) * 2;
    char *np = realloc(sb->p, ncap);
    if (!np) {
      sb->oom = 1;
      return;
    }
    sb->p = np;
    sb->cap = ncap;
    vsnprintf(sb->p + sb->len, sb->cap - sb->len, fmt, ap);
  }
  sb->len += (size_t)n;
}

static void zs__sb_add(zs__sb *sb, const char *fmt, ...) ZS_PRINTF(2, 3);
static void zs__sb_add(zs__sb *sb, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  zs__sb_vadd(sb, fmt, ap);
  va_end(ap);
}

/* A JSON string literal (quotes included). */
static void zs__sb_json_str(zs__sb *sb, const char *s) {
  zs__sb_add(sb, "\"");
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      zs__sb_add(sb, "\\%c", c);
    else if (c < 0x20)
      zs__sb_add(sb, "\\u%04x", c);
    else
      zs__sb_add(sb, "%c", c);
  }
  zs__sb_add(sb, "\"");
}

/* A JSON string literal, or null for NULL. */
static void zs__sb_json_opt(zs__sb *sb, const char *s) {
  if (s)
    zs__sb_json_str(sb, s);
  else
    zs__sb_add(sb, "null");
}

/* ------------------------------------------------------------ facts */

static const char *zs__compiler(void) {
#if defined(__clang__)
  return "Clang " __clang_version__;
#elif defined(__MINGW64__) && defined(__GNUC__)
  return "MinGW-w64 GCC " __VERSION__;
#elif defined(__GNUC__)
  return "GCC " __VERSION__;
#elif defined(_MSC_VER)
  return "MSVC " ZS_STRINGIFY(_MSC_FULL_VER);
#else
  return "unknown compiler";
#endif
}

static void zs__os(char *out, size_t cap) {
#ifdef _WIN32
  typedef LONG(WINAPI * rtl_fn)(OSVERSIONINFOW *);
  typedef const char *(*wine_fn)(void);
  HMODULE ntdll = GetModuleHandleA("ntdll.dll");
  rtl_fn rtl = ntdll ? (rtl_fn)(uintptr_t)GetProcAddress(ntdll, "RtlGetVersion")
                     : NULL;
  wine_fn wine = ntdll ? (wine_fn)(uintptr_t)GetProcAddress(ntdll,
                                                            "wine_get_version")
                       : NULL;
  OSVERSIONINFOW vi;
  memset(&vi, 0, sizeof vi);
  vi.dwOSVersionInfoSize = sizeof vi;
  if (rtl) rtl(&vi);
  snprintf(out, cap, "Windows %lu.%lu build %lu%s%s%s",
           (unsigned long)vi.dwMajorVersion, (unsigned long)vi.dwMinorVersion,
           (unsigned long)vi.dwBuildNumber, wine ? " (under Wine " : "",
           wine ? wine() : "", wine ? ")" : "");
#else
  struct utsname u;
  if (uname(&u) == 0)
    snprintf(out, cap, "%s %s %s", u.sysname, u.release, u.machine);
  else
    snprintf(out, cap, "unknown");
#endif
}

/* The I/O backends in the order the report lists them. */
static const struct {
  const char *name;
  int backend;
} zs__report_backends[3] = {{"threads", ZS_AIO_BACKEND_THREADS},
                            {"io_uring", ZS_AIO_BACKEND_IO_URING},
                            {"iocp", ZS_AIO_BACKEND_IOCP}};

static void zs__features_str(char *out, size_t cap, uint32_t f, int json) {
  static const struct {
    uint32_t bit;
    const char *name;
  } names[] = {{ZS_CPU_SSE2, "sse2"},          {ZS_CPU_AVX, "avx"},
               {ZS_CPU_AVX2, "avx2"},          {ZS_CPU_FMA, "fma"},
               {ZS_CPU_F16C, "f16c"},          {ZS_CPU_AVX512F, "avx512f"},
               {ZS_CPU_AVX512BW, "avx512bw"},  {ZS_CPU_AVX512VL, "avx512vl"},
               {ZS_CPU_AVX512DQ, "avx512dq"},  {ZS_CPU_AVX512BF16, "avx512bf16"},
               {ZS_CPU_NEON, "neon"},          {ZS_CPU_SVE, "sve"}};
  size_t i, len = 0;
  out[0] = '\0';
  for (i = 0; i < ZS_ARRAY_SIZE(names) && len + 16 < cap; i++) {
    if (!(f & names[i].bit)) continue;
    len += (size_t)snprintf(out + len, cap - len,
                            json ? "%s\"%s\"" : "%s%s",
                            len ? (json ? ", " : " ") : "", names[i].name);
  }
  if (!len && !json) snprintf(out, cap, "(none detected)");
}

static void zs__bytes_str(char *out, size_t cap, uint64_t b) {
  if (b >= ((uint64_t)1 << 30))
    snprintf(out, cap, "%.1f GiB", (double)b / (double)((uint64_t)1 << 30));
  else if (b >= ((uint64_t)1 << 20))
    snprintf(out, cap, "%.1f MiB", (double)b / (double)((uint64_t)1 << 20));
  else
    snprintf(out, cap, "%llu KiB", (unsigned long long)(b >> 10));
}

/* ----------------------------------------------------------- problems */

/* Choices the environment forces that the library refuses, each worded by
 * the call that refuses it. The SIMD level and the I/O backend are the
 * choices a variable can force (ZSPEED_SIMD, ZSPEED_AIO_BACKEND), and the
 * default pool's size (ZSPEED_NUM_THREADS); each is decided once per
 * process, so asking again is cheap. */
#define ZS__MAX_PROBLEMS 3

typedef struct {
  int n;
  char msg[ZS__MAX_PROBLEMS][512];
} zs__problems;

static void zs__find_problems(zs__problems *p) {
  p->n = 0;
  if (zs_simd_level() < 0)
    snprintf(p->msg[p->n++], sizeof p->msg[0], "%s", zs_last_error());
  if (zs_aio_backend_resolve(ZS_AIO_BACKEND_AUTO, NULL, 0) < 0)
    snprintf(p->msg[p->n++], sizeof p->msg[0], "%s", zs_last_error());
  if (zs__pool_default_check() < 0)
    snprintf(p->msg[p->n++], sizeof p->msg[0], "%s", zs_last_error());
}

int zs_report_problems(char *buf, size_t cap) {
  zs__problems p;
  size_t len = 0;
  int i;
  zs__find_problems(&p);
  if (buf && cap > 0) {
    buf[0] = '\0';
    for (i = 0; i < p.n && len + 1 < cap; i++) {
      int w = snprintf(buf + len, cap - len, "%s%s", i ? "\n" : "", p.msg[i]);
      if (w < 0) break;
      len = ZS_MIN(len + (size_t)w, cap - 1);
    }
  }
  return p.n;
}

/* ------------------------------------------------------------- report */

int64_t zs_report(char *buf, size_t cap, unsigned flags) {
  zs__sb sb = {NULL, 0, 0, 0};
  char os[256], feats[256], ram[32], lock[64], cuda[256];
  const char *simd_env = zs__getenv("ZSPEED_SIMD");
  const char *threads_env = zs__getenv("ZSPEED_NUM_THREADS");
  const char *lock_warning = NULL;
  int json = (flags & ZS_REPORT_JSON) != 0, level, best, cuda_ok, i;
  uint64_t lim = zs_memlock_limit(), ramb = zs_ram_bytes();
  int be_ok[3];
  char be_why[3][200];
  char simd_err[512] = "", aio_why[512] = "", aio_chosen[32] = "";
  char threads_err[512] = "";
  int threads;
  int64_t total;
  zs__problems problems;

  if (flags & ~(unsigned)ZS_REPORT_JSON)
    return zs__fail(ZS_EINVAL, "zs_report: unknown flags 0x%x", flags);
  zs__os(os, sizeof os);
  best = zs_simd_best();
  level = zs_simd_level();
  if (level < 0) snprintf(simd_err, sizeof simd_err, "%s", zs_last_error());
  zs__bytes_str(ram, sizeof ram, ramb);
  if (lim == UINT64_MAX) {
#ifdef _WIN32
    snprintf(lock, sizeof lock, "no fixed limit (working set grows on demand)");
#else
    snprintf(lock, sizeof lock, geteuid() == 0 ? "unlimited (root)" : "unlimited");
#endif
  } else {
    zs__bytes_str(lock, sizeof lock, lim);
    if (lim < ZS__MEMLOCK_WARN)
      lock_warning = "page-lock limit is below 1 GiB: large pinned buffers "
                     "will fall back to pageable memory (slower host-device "
                     "copies). Raise it with 'ulimit -l unlimited' or in "
                     "/etc/security/limits.conf";
  }
  for (i = 0; i < 3; i++)
    be_ok[i] = zs_aio_backend_available(zs__report_backends[i].backend,
                                        be_why[i], sizeof be_why[i]);
  {
    int b = zs_aio_backend_resolve(ZS_AIO_BACKEND_AUTO, aio_why, sizeof aio_why);
    if (b > 0)
      snprintf(aio_chosen, sizeof aio_chosen, "%s", zs_aio_backend_name(b));
    else
      snprintf(aio_why, sizeof aio_why, "%s", zs_last_error());
  }
  cuda_ok = zs__cuda_probe(cuda, sizeof cuda);
  threads = zs_pool_size(zs_pool_default()) + 1;
  if (zs__pool_default_check() < 0)
    snprintf(threads_err, sizeof threads_err, "%s", zs_last_error());
  zs__find_problems(&problems);

  if (json) {
    zs__sb_add(&sb, "{\n  \"version\": \"%s\",\n", zs_version_string());
    zs__sb_add(&sb, "  \"build\": {\"type\": ");
    zs__sb_json_str(&sb, ZS_BUILD_TYPE);
    zs__sb_add(&sb, ", \"compiler\": ");
    zs__sb_json_str(&sb, zs__compiler());
    zs__sb_add(&sb, ", \"flags\": ");
    zs__sb_json_str(&sb, ZS_BUILD_FLAGS);
    zs__sb_add(&sb, ", \"date\": ");
    zs__sb_json_str(&sb, ZS_BUILD_DATE);
    zs__sb_add(&sb, "},\n  \"os\": ");
    zs__sb_json_str(&sb, os);
    zs__sb_add(&sb, ",\n  \"cpu\": {\"model\": ");
    zs__sb_json_str(&sb, zs_cpu_model());
    zs__features_str(feats, sizeof feats, zs_cpu_features(), 1);
    zs__sb_add(&sb, ", \"cores\": %d, \"features\": [%s]},\n", zs_cpu_count(),
               feats);
    zs__sb_add(&sb, "  \"simd\": {\"best\": \"%s\", \"level\": ",
               zs_simd_name(best));
    if (level >= 0)
      zs__sb_add(&sb, "\"%s\"", zs_simd_name(level));
    else
      zs__sb_add(&sb, "null");
    zs__sb_add(&sb, ", \"forced_by_env\": ");
    zs__sb_json_opt(&sb, simd_env);
    zs__sb_add(&sb, ", \"error\": ");
    zs__sb_json_opt(&sb, level < 0 ? simd_err : NULL);
    zs__sb_add(&sb, "},\n  \"threads\": {\"default\": ");
    if (threads_err[0])
      zs__sb_add(&sb, "null");
    else
      zs__sb_add(&sb, "%d", threads);
    zs__sb_add(&sb, ", \"env\": ");
    zs__sb_json_opt(&sb, threads_env);
    zs__sb_add(&sb, ", \"error\": ");
    zs__sb_json_opt(&sb, threads_err[0] ? threads_err : NULL);
    zs__sb_add(&sb, "},\n  \"memory\": {\"ram_bytes\": %llu, "
               "\"memlock_limit_bytes\": ", (unsigned long long)ramb);
    if (lim == UINT64_MAX)
      zs__sb_add(&sb, "null");
    else
      zs__sb_add(&sb, "%llu", (unsigned long long)lim);
    zs__sb_add(&sb, ", \"memlock_warning\": ");
    zs__sb_json_opt(&sb, lock_warning);
    zs__sb_add(&sb, "},\n  \"io_backends\": {");
    for (i = 0; i < 3; i++) {
      zs__sb_add(&sb, "%s\n    \"%s\": {\"available\": %s, \"why\": ",
                 i ? "," : "", zs__report_backends[i].name,
                 be_ok[i] ? "true" : "false");
      zs__sb_json_str(&sb, be_why[i]);
      zs__sb_add(&sb, "}");
    }
    zs__sb_add(&sb, "\n  },\n  \"io_backend_auto\": {\"chosen\": ");
    zs__sb_json_opt(&sb, aio_chosen[0] ? aio_chosen : NULL);
    zs__sb_add(&sb, ", \"why\": ");
    zs__sb_json_str(&sb, aio_why);
    zs__sb_add(&sb, "},\n  \"cuda_driver\": {\"available\": %s, "
               "\"detail\": ", cuda_ok ? "true" : "false");
    zs__sb_json_str(&sb, cuda);
    zs__sb_add(&sb, "},\n  \"problems\": [");
    for (i = 0; i < problems.n; i++) {
      zs__sb_add(&sb, "%s", i ? ", " : "");
      zs__sb_json_str(&sb, problems.msg[i]);
    }
    zs__sb_add(&sb, "]\n}\n");
  } else {
    zs__features_str(feats, sizeof feats, zs_cpu_features(), 0);
    zs__sb_add(&sb, "zspeed report\n");
    zs__sb_add(&sb, "--------------------------------------------------\n");
    zs__sb_add(&sb, "version ............. %s\n", zs_version_string());
    zs__sb_add(&sb, "build ............... %s, %s\n", ZS_BUILD_TYPE,
               zs__compiler());
    zs__sb_add(&sb, "build flags ......... %s\n",
               ZS_BUILD_FLAGS[0] ? ZS_BUILD_FLAGS : "(none)");
    zs__sb_add(&sb, "build date .......... %s\n", ZS_BUILD_DATE);
    zs__sb_add(&sb, "os .................. %s\n", os);
    zs__sb_add(&sb, "cpu ................. %s\n",
               zs_cpu_model()[0] ? zs_cpu_model() : "(unknown model)");
    zs__sb_add(&sb, "cores ............... %d\n", zs_cpu_count());
    zs__sb_add(&sb, "cpu features ........ %s\n", feats);
    if (level >= 0)
      zs__sb_add(&sb, "simd level .......... %s (best on this CPU: %s%s%s)\n",
                 zs_simd_name(level), zs_simd_name(best),
                 simd_env ? "; forced by ZSPEED_SIMD=" : "",
                 simd_env ? simd_env : "");
    else
      zs__sb_add(&sb, "simd level .......... ERROR: %s\n", simd_err);
    if (threads_err[0])
      zs__sb_add(&sb, "threads ............. ERROR: %s\n", threads_err);
    else
      zs__sb_add(&sb, "threads ............. %d%s%s%s\n", threads,
                 threads_env ? " (ZSPEED_NUM_THREADS=" : " (one per core)",
                 threads_env ? threads_env : "", threads_env ? ")" : "");
    zs__sb_add(&sb, "ram ................. %s\n", ram);
    zs__sb_add(&sb, "page-lock limit ..... %s\n", lock);
    if (lock_warning) zs__sb_add(&sb, "  WARNING: %s\n", lock_warning);
    zs__sb_add(&sb, "io backends:\n");
    for (i = 0; i < 3; i++)
      zs__sb_add(&sb, "  %-9s .......... %s%s\n", zs__report_backends[i].name,
                 be_ok[i] ? "" : "unavailable: ", be_why[i]);
    if (aio_chosen[0])
      zs__sb_add(&sb, "  auto chooses ...... %s (%s)\n", aio_chosen, aio_why);
    else
      zs__sb_add(&sb, "  auto chooses ...... ERROR: %s\n", aio_why);
    zs__sb_add(&sb, "cuda driver ......... %s\n", cuda);
  }
  if (sb.oom) {
    free(sb.p);
    return zs__fail(ZS_ENOMEM, "zs_report: out of memory");
  }
  total = (int64_t)sb.len;
  if (buf && cap > 0) {
    size_t n = ZS_MIN(sb.len, cap - 1);
    memcpy(buf, sb.p, n);
    buf[n] = '\0';
  }
  free(sb.p);
  return total;
}
