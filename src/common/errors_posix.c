/* errors_posix.c - errno values to ZS_E* codes: the POSIX translation
 * function. */
#include <errno.h>

#include "zs_internal.h"

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
