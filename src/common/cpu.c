/* cpu.c - CPU features, model, core count and RAM, detected once, and the
 * SIMD level kernels dispatch on (ZSPEED_SIMD or zs_simd_force override). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_internal.h"

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || \
    defined(_M_IX86)
#  define ZS_X86 1
#  if defined(_MSC_VER) && !defined(__clang__)
#    include <intrin.h>
#  else
#    include <cpuid.h>
#  endif
#elif defined(__aarch64__) || defined(_M_ARM64)
#  define ZS_ARM64 1
#  if defined(__linux__)
#    include <sys/auxv.h>
#  endif
#endif

#ifndef _WIN32
#  include <unistd.h>
#  if defined(__linux__)
#    include <sched.h>
#    include <sys/sysinfo.h>
#  endif
#  if defined(__APPLE__)
#    include <sys/sysctl.h>
#  endif
#endif

static uint32_t zs__features;
static char zs__model[64];
static zs__once_t zs__cpu_once = ZS__ONCE_INIT;

#ifdef ZS_X86
static void zs__cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
#  if defined(_MSC_VER) && !defined(__clang__)
  int v[4];
  __cpuidex(v, (int)leaf, (int)sub);
  r[0] = (uint32_t)v[0];
  r[1] = (uint32_t)v[1];
  r[2] = (uint32_t)v[2];
  r[3] = (uint32_t)v[3];
#  else
  __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
#  endif
}

/* XCR0: which register states the OS saves on context switch. Read with the
 * xgetbv instruction, encoded as bytes so no -mxsave flag is needed. */
static uint64_t zs__xgetbv0(void) {
#  if defined(_MSC_VER) && !defined(__clang__)
  return _xgetbv(0);
#  else
  uint32_t eax, edx;
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(eax), "=d"(edx) : "c"(0));
  return ((uint64_t)edx << 32) | eax;
#  endif
}

static void zs__detect(void) {
  uint32_t r[4], max_leaf, f = 0, ext;
  uint64_t xcr0 = 0;
  int osxsave, ymm_os, zmm_os;
  zs__cpuid(0, 0, r);
  max_leaf = r[0];
  zs__cpuid(1, 0, r);
  if (r[3] & (1u << 26)) f |= ZS_CPU_SSE2;
  osxsave = (r[2] >> 27) & 1;
  if (osxsave) xcr0 = zs__xgetbv0();
  ymm_os = (xcr0 & 0x6) == 0x6;    /* XMM and YMM state */
  zmm_os = (xcr0 & 0xe6) == 0xe6;  /* plus opmask and both ZMM halves */
  if (ymm_os) {
    if (r[2] & (1u << 28)) f |= ZS_CPU_AVX;
    if (r[2] & (1u << 12)) f |= ZS_CPU_FMA;
    if (r[2] & (1u << 29)) f |= ZS_CPU_F16C;
  }
  if (max_leaf >= 7) {
    zs__cpuid(7, 0, r);
    if (ymm_os && (r[1] & (1u << 5))) f |= ZS_CPU_AVX2;
    if (zmm_os) {
      if (r[1] & (1u << 16)) f |= ZS_CPU_AVX512F;
      if (r[1] & (1u << 17)) f |= ZS_CPU_AVX512DQ;
      if (r[1] & (1u << 30)) f |= ZS_CPU_AVX512BW;
      if (r[1] & (1u << 31)) f |= ZS_CPU_AVX512VL;
      zs__cpuid(7, 1, r);
      if (r[0] & (1u << 5)) f |= ZS_CPU_AVX512BF16;
    }
  }
  zs__features = f;
  zs__cpuid(0x80000000u, 0, r);
  ext = r[0];
  if (ext >= 0x80000004u) {
    uint32_t b[12];
    size_t i, start = 0, len;
    zs__cpuid(0x80000002u, 0, b);
    zs__cpuid(0x80000003u, 0, b + 4);
    zs__cpuid(0x80000004u, 0, b + 8);
    memcpy(zs__model, b, 48);
    zs__model[48] = '\0';
    while (zs__model[start] == ' ') start++;
    memmove(zs__model, zs__model + start, strlen(zs__model + start) + 1);
    len = strlen(zs__model);
    for (i = len; i > 0 && zs__model[i - 1] == ' '; i--) zs__model[i - 1] = 0;
  }
}
#elif defined(ZS_ARM64)
static void zs__detect(void) {
  uint32_t f = ZS_CPU_NEON; /* ASIMD is mandatory in AArch64 */
#  if defined(__linux__)
  unsigned long hw = getauxval(AT_HWCAP);
#    ifndef HWCAP_SVE
#      define HWCAP_SVE (1UL << 22)
#    endif
  if (hw & HWCAP_SVE) f |= ZS_CPU_SVE;
  {
    FILE *fp = fopen("/proc/cpuinfo", "r");
    char line[256];
    while (fp && fgets(line, sizeof line, fp)) {
      char *c = strchr(line, ':');
      if (c && (strncmp(line, "model name", 10) == 0 ||
                strncmp(line, "Model", 5) == 0)) {
        snprintf(zs__model, sizeof zs__model, "%s", c + 2);
        zs__model[strcspn(zs__model, "\n")] = 0;
        break;
      }
    }
    if (fp) fclose(fp);
  }
#  elif defined(__APPLE__)
  {
    size_t len = sizeof zs__model;
    sysctlbyname("machdep.cpu.brand_string", zs__model, &len, NULL, 0);
  }
#  endif
  zs__features = f;
}
#else
static void zs__detect(void) { zs__features = 0; }
#endif

uint32_t zs_cpu_features(void) {
  zs__call_once(&zs__cpu_once, zs__detect);
  return zs__features;
}

const char *zs_cpu_model(void) {
  zs__call_once(&zs__cpu_once, zs__detect);
  return zs__model;
}

int zs_cpu_count(void) {
#ifdef _WIN32
  DWORD n = GetActiveProcessorCount(ALL_PROCESSOR_GROUPS);
  return n ? (int)n : 1;
#else
#  if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#  endif
  {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
  }
#endif
}

uint64_t zs_ram_bytes(void) {
#ifdef _WIN32
  MEMORYSTATUSEX ms;
  ms.dwLength = sizeof ms;
  return GlobalMemoryStatusEx(&ms) ? (uint64_t)ms.ullTotalPhys : 0;
#elif defined(__APPLE__)
  uint64_t mem = 0;
  size_t len = sizeof mem;
  return sysctlbyname("hw.memsize", &mem, &len, NULL, 0) == 0 ? mem : 0;
#else
  long pages = sysconf(_SC_PHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
  return (pages > 0 && ps > 0) ? (uint64_t)pages * (uint64_t)ps : 0;
#endif
}

/* ------------------------------------------------------------- SIMD level */

static int zs__level_supported(int level) {
  uint32_t f = zs_cpu_features();
  const uint32_t avx2 = ZS_CPU_AVX2 | ZS_CPU_FMA | ZS_CPU_F16C;
  const uint32_t avx512 =
      avx2 | ZS_CPU_AVX512F | ZS_CPU_AVX512BW | ZS_CPU_AVX512VL |
      ZS_CPU_AVX512DQ;
  switch (level) {
    case ZS_SIMD_SCALAR:
      return 1;
    case ZS_SIMD_AVX2:
      return (f & avx2) == avx2;
    case ZS_SIMD_AVX512:
      return (f & avx512) == avx512;
    case ZS_SIMD_NEON:
      return (f & ZS_CPU_NEON) != 0;
    default:
      return 0;
  }
}

int zs_simd_best(void) {
  if (zs__level_supported(ZS_SIMD_AVX512)) return ZS_SIMD_AVX512;
  if (zs__level_supported(ZS_SIMD_AVX2)) return ZS_SIMD_AVX2;
  if (zs__level_supported(ZS_SIMD_NEON)) return ZS_SIMD_NEON;
  return ZS_SIMD_SCALAR;
}

const char *zs_simd_name(int level) {
  switch (level) {
    case ZS_SIMD_SCALAR:
      return "scalar";
    case ZS_SIMD_AVX2:
      return "avx2";
    case ZS_SIMD_AVX512:
      return "avx512";
    case ZS_SIMD_NEON:
      return "neon";
    default:
      return "unknown";
  }
}

static int zs__level_from_name(const char *name) {
  int l;
  for (l = ZS_SIMD_SCALAR; l <= ZS_SIMD_NEON; l++)
    if (strcmp(name, zs_simd_name(l)) == 0) return l;
  return -1;
}

/* -1: not forced; otherwise the forced level. Set from the environment
 * once, then only by zs_simd_force. */
static volatile int32_t zs__forced = -1;
static volatile int32_t zs__env_error; /* ZSPEED_SIMD was unusable */
static char zs__env_value[32];
static zs__once_t zs__simd_once = ZS__ONCE_INIT;

static void zs__simd_env(void) {
  const char *env = zs__getenv("ZSPEED_SIMD");
  int l;
  if (!env || strcmp(env, "auto") == 0) return;
  snprintf(zs__env_value, sizeof zs__env_value, "%s", env);
  l = zs__level_from_name(env);
  if (l < 0 || !zs__level_supported(l)) {
    zs__atomic_store32(&zs__env_error, 1);
    return;
  }
  zs__atomic_store32(&zs__forced, l);
}

static int zs__simd_refuse(const char *what, const char *value) {
  int l = zs__level_from_name(value);
  if (l < 0)
    return zs__fail(ZS_ESIMD,
                    "%s='%s' is not a SIMD level; use one of auto, scalar, "
                    "avx2, avx512, neon",
                    what, value);
  return zs__fail(ZS_ESIMD,
                  "%s='%s' but this CPU lacks it (best available: %s); unset "
                  "it or choose %s or scalar",
                  what, value, zs_simd_name(zs_simd_best()),
                  zs_simd_name(zs_simd_best()));
}

int zs_simd_level(void) {
  int32_t f;
  zs__call_once(&zs__simd_once, zs__simd_env);
  f = zs__atomic_load32(&zs__forced);
  if (f >= 0) return f;
  if (zs__atomic_load32(&zs__env_error))
    return zs__simd_refuse("ZSPEED_SIMD", zs__env_value);
  return zs_simd_best();
}

int zs_simd_force(const char *name) {
  int l;
  if (!name) return zs__fail(ZS_EINVAL, "zs_simd_force: name is NULL");
  zs__call_once(&zs__simd_once, zs__simd_env);
  if (strcmp(name, "auto") == 0) {
    zs__atomic_store32(&zs__env_error, 0);
    zs__atomic_store32(&zs__forced, -1);
    return 0;
  }
  l = zs__level_from_name(name);
  if (l < 0)
    return zs__fail(ZS_EINVAL,
                    "zs_simd_force: '%s' is not a SIMD level; use one of "
                    "auto, scalar, avx2, avx512, neon",
                    name);
  if (!zs__level_supported(l)) return zs__simd_refuse("zs_simd_force", name);
  zs__atomic_store32(&zs__env_error, 0);
  zs__atomic_store32(&zs__forced, l);
  return 0;
}
