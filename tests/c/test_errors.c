/* Errors, version and fault injection. */
#include <errno.h>
#include <string.h>

#include "zs_internal.h"
#include "zt.h"

static void codes_are_distinct_and_named(void) {
  int e;
  for (e = -1; e >= -(int)ZS__ERR_COUNT; e--) {
    const char *name = zs_err_name(e), *msg = zs_strerror(e);
    int f;
    ZT_CHECKF(strncmp(name, "ZS_E", 4) == 0, "code %d has name %s", e, name);
    ZT_CHECKF(strcmp(msg, "unknown error") != 0 || e == ZS_EUNKNOWN,
              "code %d has no message", e);
    for (f = e - 1; f >= -(int)ZS__ERR_COUNT; f--)
      ZT_CHECKF(strcmp(name, zs_err_name(f)) != 0, "%d and %d share %s", e, f,
                name);
  }
  ZT_CHECK(ZS_EINVAL == -1);
  ZT_CHECK(strcmp(zs_err_name(ZS_ENOSPC), "ZS_ENOSPC") == 0);
  ZT_CHECK(strcmp(zs_strerror(ZS_ENOSPC), "no space left on device") == 0);
  ZT_CHECK(strcmp(zs_strerror(12345), "unknown error") == 0);
  ZT_CHECK(strcmp(zs_err_name(-9999), "ZS_EUNKNOWN") == 0);
  ZT_CHECK(strcmp(zs_err_name(0), "ZS_OK") == 0);
}

static void last_error_is_per_call_detail(void) {
  void *p = NULL;
  ZT_ERR(zs_alloc_aligned(&p, 64, 3), ZS_EINVAL);
  ZT_CHECKF(strstr(zs_last_error(), "power of two") != NULL, "got '%s'",
            zs_last_error());
  zs__fail(ZS_EIO, "inner %d", 7);
  zs__fail_prefix(ZS_EIO, "outer");
  ZT_CHECKF(strcmp(zs_last_error(), "outer: inner 7") == 0, "got '%s'",
            zs_last_error());
  zs__clear_error();
  ZT_CHECK(zs_last_error()[0] == '\0');
}

static void os_error_translation(void) {
#ifdef _WIN32
  ZT_CHECK(zs__translate_win32(ERROR_FILE_NOT_FOUND) == ZS_ENOENT);
  ZT_CHECK(zs__translate_win32(ERROR_DISK_FULL) == ZS_ENOSPC);
  ZT_CHECK(zs__translate_win32(ERROR_ACCESS_DENIED) == ZS_EACCES);
  ZT_CHECK(zs__translate_win32(0) == 0);
  ZT_CHECK(zs__translate_win32(0x7FFFFFFF) == ZS_EUNKNOWN);
#else
  ZT_CHECK(zs__translate_errno(ENOENT) == ZS_ENOENT);
  ZT_CHECK(zs__translate_errno(ENOSPC) == ZS_ENOSPC);
  ZT_CHECK(zs__translate_errno(EIO) == ZS_EIO);
  ZT_CHECK(zs__translate_errno(0) == 0);
  ZT_CHECK(zs__translate_errno(100000) == ZS_EUNKNOWN);
#endif
}

static void version_matches_header(void) {
  ZT_CHECK(zs_version() == ZS_VERSION_HEX);
  ZT_CHECK(strcmp(zs_version_string(), ZS_VERSION_STRING) == 0);
}

static void fault_fires_on_nth_call(void) {
  int i, fired_at = -1;
  ZT_OK(zs_fault_set("test.site", 3, 2, ZS_EIO));
  for (i = 1; i <= 6; i++) {
    int rc = zs__fault_check("test.site");
    if (rc && fired_at < 0) fired_at = i;
    if (i == 3 || i == 4)
      ZT_CHECKF(rc == ZS_EIO, "call %d returned %d", i, rc);
    else
      ZT_CHECKF(rc == 0, "call %d returned %d", i, rc);
  }
  ZT_CHECK(fired_at == 3);
  ZT_CHECK(strstr(zs_last_error(), "test.site") != NULL);
  ZT_OK(zs_fault_set("other", 1, 1, ZS_ENOSPC));
  ZT_CHECK(zs__fault_check("test.site") == 0);
  zs_fault_clear();
  ZT_CHECK(zs__fault_check("other") == 0);
  ZT_ERR(zs_fault_set("x", 1, 1, 5), ZS_EINVAL);
  ZT_ERR(zs_fault_set(NULL, 1, 1, ZS_EIO), ZS_EINVAL);
}

ZT_MAIN(ZT_CASE(codes_are_distinct_and_named),
        ZT_CASE(last_error_is_per_call_detail),
        ZT_CASE(os_error_translation), ZT_CASE(version_matches_header),
        ZT_CASE(fault_fires_on_nth_call))
