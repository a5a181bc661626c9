/*
 * errors.h - zspeed's error codes.
 *
 * One X-macro list generates the enum, zs_strerror() and zs_err_name().
 * Codes are fixed negative numbers, the same on every platform (they are
 * not errno values), so the C ABI and the Python exceptions are stable.
 * Append new codes at the end only: a code's value is its position.
 */
#ifndef ZSPEED_ERRORS_H
#define ZSPEED_ERRORS_H

/* X(name, description) */
#define ZS_ERRNO_MAP(X)                                                       \
  X(EINVAL, "invalid argument")                                               \
  X(ENOMEM, "out of memory")                                                  \
  X(EIO, "input/output error")                                                \
  X(ENOSPC, "no space left on device")                                        \
  X(EBADF, "bad file descriptor")                                             \
  X(ENOENT, "no such file or directory")                                      \
  X(EACCES, "permission denied")                                              \
  X(EPERM, "operation not permitted")                                         \
  X(EEXIST, "file already exists")                                            \
  X(EAGAIN, "resource temporarily unavailable")                               \
  X(EINTR, "interrupted system call")                                         \
  X(ENOSYS, "function not implemented")                                       \
  X(ENOTSUP, "operation not supported")                                       \
  X(EISDIR, "is a directory")                                                 \
  X(ENOTDIR, "not a directory")                                               \
  X(EMFILE, "too many open files")                                            \
  X(ENAMETOOLONG, "name too long")                                            \
  X(EFBIG, "file too large")                                                  \
  X(EROFS, "read-only file system")                                           \
  X(EBUSY, "resource busy")                                                   \
  X(ECANCELED, "operation canceled")                                          \
  X(ERANGE, "value out of range")                                             \
  X(EOF, "unexpected end of file")                                            \
  X(EMLOCK, "cannot page-lock memory (lock limit reached)")                   \
  X(EALIGN, "buffer, offset or length not aligned as direct I/O requires")    \
  X(ESIMD, "requested SIMD level not supported by this CPU")                  \
  X(EOVERLAP, "buffers overlap")                                              \
  X(EDTYPE, "unsupported data type or combination")                           \
  X(EVERSION, "version mismatch")                                             \
  X(ECORRUPT, "data is corrupt or not in the expected format")                \
  X(ESTATE, "object is in the wrong state for this call")                     \
  X(EUNKNOWN, "unknown error")

#define ZS__ERR_ENUM_COUNTER(name, msg) ZS__IDX_##name,
enum zs__err_index { ZS_ERRNO_MAP(ZS__ERR_ENUM_COUNTER) ZS__ERR_COUNT };
#undef ZS__ERR_ENUM_COUNTER

/* ZS_EINVAL = -1, ZS_ENOMEM = -2, ... in list order. */
#define ZS__ERR_ENUM_VALUE(name, msg) ZS_##name = -(ZS__IDX_##name + 1),
typedef enum zs_errno { ZS_ERRNO_MAP(ZS__ERR_ENUM_VALUE) ZS_OK = 0 } zs_errno;
#undef ZS__ERR_ENUM_VALUE

#endif /* ZSPEED_ERRORS_H */
