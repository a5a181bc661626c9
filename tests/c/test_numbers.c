/* The strict number parser (zs__parse_int, zs__parse_size) that the native
 * command's options and ZSPEED_NUM_THREADS go through, and the default
 * pool's handling of ZSPEED_NUM_THREADS: a usable value sizes the pool, any
 * other is refused (never replaced by the core count). numbers.cmake runs
 * this binary with several values of the variable. */
#include <stdlib.h>
#include <string.h>

#include "zs_internal.h"
#include "zt.h"

static void parse_int_is_strict(void) {
  static const char *bad[] = {"", " 4", "4 ", "4x", "0x10", "1e3", "nan",
                              "inf", "-", "+", "1.0", "--1", "abc"};
  int64_t v = 7;
  size_t i;
  ZT_OK(zs__parse_int("42", 1, 100, &v));
  ZT_CHECK(v == 42);
  ZT_OK(zs__parse_int("-5", -10, 10, &v));
  ZT_CHECK(v == -5);
  ZT_OK(zs__parse_int("+9223372036854775807", 0, INT64_MAX, &v));
  ZT_CHECK(v == INT64_MAX);
  for (i = 0; i < ZS_ARRAY_SIZE(bad); i++) {
    v = 7;
    ZT_ERR(zs__parse_int(bad[i], INT64_MIN, INT64_MAX, &v), ZS_EINVAL);
    ZT_CHECKF(v == 7 && strstr(zs_last_error(), "is not an integer"),
              "'%s': %s", bad[i], zs_last_error());
  }
  ZT_ERR(zs__parse_int("0", 1, 4096, &v), ZS_ERANGE);
  ZT_CHECK(strstr(zs_last_error(), "[1, 4096]") != NULL);
  ZT_ERR(zs__parse_int("-1", 1, 4096, &v), ZS_ERANGE);
  ZT_ERR(zs__parse_int("100000", 1, 4096, &v), ZS_ERANGE);
  /* Beyond int64: refused, not wrapped. */
  ZT_ERR(zs__parse_int("18446744073709551621", 0, INT64_MAX, &v), ZS_ERANGE);
  ZT_ERR(zs__parse_int("9223372036854775808", 0, INT64_MAX, &v), ZS_ERANGE);
  ZT_CHECK(v == 7);
}

static void parse_size_units_and_limits(void) {
  static const struct { const char *s; int64_t v; } ok[] = {
      {"4096", 4096}, {"64K", 65536}, {"64k", 65536}, {"64KiB", 65536},
      {"64KB", 65536}, {"1.5G", (int64_t)3 << 29}, {".5K", 512},
      {"2^20", 1 << 20}, {"3M", 3 << 20}, {"1T", (int64_t)1 << 40},
      {"8B", 8}, {"0.25M", 1 << 18}};
  static const char *bad[] = {"", "nan", "inf", "-5", "-1K", "1.5.5", "5X",
                              "1KK", "2^", "2^x", " 1", "1 ", "0.3K",
                              "1.0000000001K", "1e9"};
  int64_t v = 0;
  size_t i;
  for (i = 0; i < ZS_ARRAY_SIZE(ok); i++) {
    ZT_OK(zs__parse_size(ok[i].s, 0, INT64_MAX, &v));
    ZT_CHECKF(v == ok[i].v, "'%s' -> %lld, expected %lld", ok[i].s,
              (long long)v, (long long)ok[i].v);
  }
  for (i = 0; i < ZS_ARRAY_SIZE(bad); i++) {
    v = -7;
    ZT_CHECKF(zs__parse_size(bad[i], 0, INT64_MAX, &v) == ZS_EINVAL && v == -7,
              "'%s' was accepted (%lld)", bad[i], (long long)v);
  }
  /* Too large for int64 or for the caller: refused with the range. */
  ZT_ERR(zs__parse_size("99999999999G", 1, INT64_MAX, &v), ZS_ERANGE);
  ZT_ERR(zs__parse_size("8388608T", 1, INT64_MAX, &v), ZS_ERANGE);
  ZT_ERR(zs__parse_size("99999999999999999999", 1, INT64_MAX, &v), ZS_ERANGE);
  ZT_ERR(zs__parse_size("2^63", 1, INT64_MAX, &v), ZS_ERANGE);
  ZT_ERR(zs__parse_size("0", 1, 100, &v), ZS_ERANGE);
  ZT_ERR(zs__parse_size("2K", 1, 1024, &v), ZS_ERANGE);
  ZT_CHECK(strstr(zs_last_error(), "[1, 1024]") != NULL);
  ZT_OK(zs__parse_size("8191.875K", 0, INT64_MAX, &v));
  ZT_CHECK(v == 8191 * 1024 + 896);
}

/* As ZSPEED_NUM_THREADS says: a usable value sizes the default pool (the
 * caller counts as one of the threads), anything else leaves no default
 * pool, and every use of it fails naming the variable. */
static void count_visit(void *ctx, size_t b, size_t e, int worker) {
  (void)worker;
  zs__atomic_add64((volatile int64_t *)ctx, (int64_t)(e - b));
}

static void default_pool_follows_the_variable(void) {
  const char *env = getenv("ZSPEED_NUM_THREADS");
  int64_t want = 0, seen = 0;
  int usable = !env || !env[0] ||
               zs__parse_int(env, 1, ZS__MAX_THREADS, &want) == 0;
  zs_pool *p = zs_pool_default();
  if (!env || !env[0]) want = zs_cpu_count();
  if (usable) {
    ZT_CHECK(p != NULL);
    /* The pool keeps one worker even for 1 thread (zs_pool_submit needs
     * one to make progress). */
    ZT_CHECKF(zs_pool_size(p) + 1 == (int)ZS_MAX(want, 2),
              "ZSPEED_NUM_THREADS=%s: %d threads", env ? env : "(unset)",
              zs_pool_size(p) + 1);
    ZT_OK(zs__pool_default_check());
    ZT_OK(zs_pool_parallel_for(NULL, 100, 7, 0, count_visit, &seen));
    ZT_CHECK(seen == 100);
    return;
  }
  ZT_CHECK(p == NULL);
  ZT_CHECK(zs__pool_default_check() < 0);
  ZT_CHECKF(strstr(zs_last_error(), "ZSPEED_NUM_THREADS=") != NULL,
            "%s", zs_last_error());
  ZT_CHECK(zs_pool_parallel_for(NULL, 100, 7, 0, count_visit, &seen) < 0);
  ZT_CHECK(seen == 0 && strstr(zs_last_error(), "ZSPEED_NUM_THREADS") != NULL);
}

ZT_MAIN(ZT_CASE(parse_int_is_strict), ZT_CASE(parse_size_units_and_limits),
        ZT_CASE(default_pool_follows_the_variable))
