/* errors_win.c - GetLastError codes to ZS_E* codes: the Windows
 * translation function. */
#include "zs_internal.h"

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
