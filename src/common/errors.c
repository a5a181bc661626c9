/* errors.c - error names, descriptions and per-thread detail messages. The
 * one translation of the platform's error numbers (errno, GetLastError) is
 * in errors_posix.c / errors_win.c. */
#include <stdio.h>
#include <string.h>

#include "zs_internal.h"

#define ZS__ERR_NAME_CASE(name, msg) \
  case ZS_##name:                    \
    return "ZS_" #name;
#define ZS__ERR_MSG_CASE(name, msg) \
  case ZS_##name:                   \
    return msg;

const char *zs_err_name(int err) {
  switch (err) {
    ZS_ERRNO_MAP(ZS__ERR_NAME_CASE)
    case 0:
      return "ZS_OK";
    default:
      return "ZS_EUNKNOWN";
  }
}

const char *zs_strerror(int err) {
  switch (err) {
    ZS_ERRNO_MAP(ZS__ERR_MSG_CASE)
    case 0:
      return "success";
    default:
      return "unknown error";
  }
}

/* One message per thread: the calling thread's last failure, so concurrent
 * callers (Python threads, I/O workers) never see each other's text. */
#define ZS__MSG_CAP 1024
static ZS_THREAD_LOCAL char zs__msg[ZS__MSG_CAP];

const char *zs_last_error(void) { return zs__msg; }

void zs__clear_error(void) { zs__msg[0] = '\0'; }

int zs__fail(int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(zs__msg, sizeof zs__msg, fmt, ap);
  va_end(ap);
  return err;
}

int zs__fail_prefix(int err, const char *fmt, ...) {
  char old[ZS__MSG_CAP];
  size_t n;
  va_list ap;
  memcpy(old, zs__msg, sizeof old);
  old[sizeof old - 1] = '\0';
  va_start(ap, fmt);
  vsnprintf(zs__msg, sizeof zs__msg, fmt, ap);
  va_end(ap);
  n = strlen(zs__msg);
  {
    /* Append ": " + the old message (or the code's description), cut to fit:
     * copied by hand so no compiler sees a possibly truncating snprintf. */
    const char *tail = old[0] ? old : zs_strerror(err);
    size_t room = sizeof zs__msg - 1 - n, len = strlen(tail) + 2;
    if (room >= 2) {
      size_t k = len < room ? len : room;
      zs__msg[n] = ':';
      zs__msg[n + 1] = ' ';
      memcpy(zs__msg + n + 2, tail, k - 2);
      zs__msg[n + k] = '\0';
    }
  }
  return err;
}
