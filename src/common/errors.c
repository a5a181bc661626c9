/* errors.c - error names, descriptions, per-thread detail messages and the
 * one errno / GetLastError translation function per platform. */
#include <errno.h>
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

#ifdef _WIN32
int zs__translate_win32(unsigned long code) {
  switch (code) {
    case ERROR_SUCCESS:
      return 0;
    case ERROR_FILE_NOT_FOUND:
    case ERROR_PATH_NOT_FOUND:
    case ERROR_INVALID_DRIVE:
    case ERROR_MOD_NOT_FOUND:
      return ZS_ENOENT;
    case ERROR_ACCESS_DENIED:
    case ERROR_SHARING_VIOLATION:
    case ERROR_LOCK_VIOLATION:
      return ZS_EACCES;
    case ERROR_PRIVILEGE_NOT_HELD:
      return ZS_EPERM;
    case ERROR_NOT_ENOUGH_MEMORY:
    case ERROR_OUTOFMEMORY:
    case ERROR_COMMITMENT_LIMIT:
      return ZS_ENOMEM;
    case ERROR_WORKING_SET_QUOTA:
      return ZS_EMLOCK;
    case ERROR_INVALID_HANDLE:
      return ZS_EBADF;
    case ERROR_DISK_FULL:
    case ERROR_HANDLE_DISK_FULL:
      return ZS_ENOSPC;
    case ERROR_FILE_EXISTS:
    case ERROR_ALREADY_EXISTS:
      return ZS_EEXIST;
    case ERROR_TOO_MANY_OPEN_FILES:
      return ZS_EMFILE;
    case ERROR_FILENAME_EXCED_RANGE:
    case ERROR_BUFFER_OVERFLOW:
      return ZS_ENAMETOOLONG;
    case ERROR_DIRECTORY:
      return ZS_ENOTDIR;
    case ERROR_HANDLE_EOF:
      return ZS_EOF;
    case ERROR_NOT_SUPPORTED:
    case ERROR_INVALID_FUNCTION:
      return ZS_ENOTSUP;
    case ERROR_CALL_NOT_IMPLEMENTED:
      return ZS_ENOSYS;
    case ERROR_WRITE_PROTECT:
      return ZS_EROFS;
    case ERROR_BUSY:
      return ZS_EBUSY;
    case ERROR_OPERATION_ABORTED:
      return ZS_ECANCELED;
    case ERROR_INVALID_PARAMETER:
    case ERROR_INVALID_NAME:
    case ERROR_NEGATIVE_SEEK:
      return ZS_EINVAL;
    case ERROR_CRC:
    case ERROR_IO_DEVICE:
    case ERROR_READ_FAULT:
    case ERROR_WRITE_FAULT:
    case ERROR_GEN_FAILURE:
      return ZS_EIO;
    default:
      return ZS_EUNKNOWN;
  }
}
int zs__os_error(void) { return zs__translate_win32(GetLastError()); }
#else
int zs__translate_errno(int e) {
  switch (e) {
    case 0:
      return 0;
    case EINVAL:
      return ZS_EINVAL;
    case ENOMEM:
      return ZS_ENOMEM;
    case EIO:
      return ZS_EIO;
    case ENOSPC:
#ifdef EDQUOT
    case EDQUOT:
#endif
      return ZS_ENOSPC;
    case EBADF:
      return ZS_EBADF;
    case ENOENT:
      return ZS_ENOENT;
    case EACCES:
      return ZS_EACCES;
    case EPERM:
      return ZS_EPERM;
    case EEXIST:
      return ZS_EEXIST;
    case EAGAIN:
      return ZS_EAGAIN;
    case EINTR:
      return ZS_EINTR;
    case ENOSYS:
      return ZS_ENOSYS;
    case ENOTSUP:
#if defined(EOPNOTSUPP) && EOPNOTSUPP != ENOTSUP
    case EOPNOTSUPP:
#endif
      return ZS_ENOTSUP;
    case EISDIR:
      return ZS_EISDIR;
    case ENOTDIR:
      return ZS_ENOTDIR;
    case EMFILE:
    case ENFILE:
      return ZS_EMFILE;
    case ENAMETOOLONG:
      return ZS_ENAMETOOLONG;
    case EFBIG:
      return ZS_EFBIG;
    case EROFS:
      return ZS_EROFS;
    case EBUSY:
      return ZS_EBUSY;
    case ECANCELED:
      return ZS_ECANCELED;
    case ERANGE:
    case EOVERFLOW:
      return ZS_ERANGE;
    default:
      return ZS_EUNKNOWN;
  }
}
int zs__os_error(void) { return zs__translate_errno(errno); }
#endif
