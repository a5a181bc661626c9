/* CPU detection and SIMD dispatch. ctest runs this binary once plainly and
 * once per ZSPEED_SIMD value: a forced level the CPU has must be used, one it
 * lacks must be refused with ZS_ESIMD (never silently replaced). */
#include <stdlib.h>
#include <string.h>

#include "zs_internal.h"
#include "zt.h"

static void features_are_consistent(void) {
  uint32_t f = zs_cpu_features();
#if defined(__x86_64__) || defined(_M_X64)
  ZT_CHECK(f & ZS_CPU_SSE2); /* part of x86-64 */
  if (f & ZS_CPU_AVX2) ZT_CHECK(f & ZS_CPU_AVX);
  if (f & ZS_CPU_AVX512BW) ZT_CHECK(f & ZS_CPU_AVX512F);
  ZT_CHECK(!(f & ZS_CPU_NEON));
#elif defined(__aarch64__)
  ZT_CHECK(f & ZS_CPU_NEON);
#endif
  ZT_CHECK(zs_cpu_count() >= 1);
  ZT_CHECK(zs_ram_bytes() > ((uint64_t)64 << 20));
  ZT_CHECK(strlen(zs_cpu_model()) < 64);
}

static void best_level_is_supported(void) {
  int best = zs_simd_best();
  uint32_t f = zs_cpu_features();
  ZT_CHECK(best >= ZS_SIMD_SCALAR && best <= ZS_SIMD_NEON);
  if (best == ZS_SIMD_AVX512) ZT_CHECK(f & ZS_CPU_AVX512F);
  if (best == ZS_SIMD_AVX2) ZT_CHECK((f & ZS_CPU_AVX2) && (f & ZS_CPU_FMA));
  if ((f & ZS_CPU_AVX2) && (f & ZS_CPU_FMA) && (f & ZS_CPU_F16C))
    ZT_CHECK(best != ZS_SIMD_SCALAR);
}

static int level_of(const char *name) {
  int l;
  for (l = 0; l <= ZS_SIMD_NEON; l++)
    if (strcmp(zs_simd_name(l), name) == 0) return l;
  return -1;
}

static void env_override_is_honoured_or_refused(void) {
  const char *env = getenv("ZSPEED_SIMD");
  int level = zs_simd_level(), want;
  if (!env || !env[0] || strcmp(env, "auto") == 0) {
    ZT_CHECK(level == zs_simd_best());
    return;
  }
  want = level_of(env);
  ZT_CHECK(want >= 0);
  if (level == ZS_ESIMD) {
    ZT_CHECKF(strstr(zs_last_error(), env) != NULL, "'%s'", zs_last_error());
    ZT_CHECK(zs_simd_force(env) == ZS_ESIMD);
    ZT_SKIP("this CPU lacks %s (refused as expected: %s)", env,
            zs_last_error());
  }
  ZT_CHECKF(level == want, "ZSPEED_SIMD=%s but level %s", env,
            zs_simd_name(level));
}

static void force_and_restore(void) {
  int best = zs_simd_best();
  ZT_OK(zs_simd_force("scalar"));
  ZT_CHECK(zs_simd_level() == ZS_SIMD_SCALAR);
  ZT_ERR(zs_simd_force("sse9"), ZS_EINVAL);
  ZT_CHECK(zs_simd_level() == ZS_SIMD_SCALAR); /* kept on failure */
  ZT_ERR(zs_simd_force(NULL), ZS_EINVAL);
#if defined(__x86_64__) || defined(_M_X64)
  ZT_ERR(zs_simd_force("neon"), ZS_ESIMD);
#else
  ZT_ERR(zs_simd_force("avx2"), ZS_ESIMD);
#endif
  ZT_CHECK(zs_simd_level() == ZS_SIMD_SCALAR);
  ZT_OK(zs_simd_force(zs_simd_name(best)));
  ZT_CHECK(zs_simd_level() == best);
  ZT_OK(zs_simd_force("auto"));
  ZT_CHECK(zs_simd_level() == best);
}

ZT_MAIN(ZT_CASE(features_are_consistent), ZT_CASE(best_level_is_supported),
        ZT_CASE(env_override_is_honoured_or_refused), ZT_CASE(force_and_restore))
