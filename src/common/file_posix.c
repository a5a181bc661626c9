/* file_posix.c - the POSIX half of file.c: open with O_DIRECT (F_NOCACHE on
 * macOS), pread/pwrite loops that retry EINTR, posix_fallocate on Linux,
 * statx for the direct I/O alignment, and rename plus a directory fsync for
 * the atomic replace. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__linux__)
#  include <sys/syscall.h>
#endif

#include "zs_os.h"

int zs__os_file_open(zs__file *f, const char *path, int flags) {
  int oflags = O_CLOEXEC, acc = flags & ZS__O_ACCMODE, fd, err;
  oflags |= acc == ZS__O_RDONLY ? O_RDONLY
            : acc == ZS__O_WRONLY ? O_WRONLY
                                  : O_RDWR;
  if (flags & ZS__O_CREAT) oflags |= O_CREAT;
  if (flags & ZS__O_TRUNC) oflags |= O_TRUNC;
  if (flags & ZS__O_EXCL) oflags |= O_EXCL;
#ifdef O_DIRECT
  if (flags & (ZS__O_DIRECT | ZS__O_DIRECT_TRY)) {
    do fd = open(path, oflags | O_DIRECT, 0644);
    while (fd < 0 && errno == EINTR);
    if (fd >= 0) {
      f->h = fd;
      f->direct = 1;
      return 0;
    }
    /* tmpfs and some FUSE/overlay file systems refuse O_DIRECT with EINVAL. */
    if (errno != EINVAL) {
      err = zs__os_error();
      return zs__fail(err, "cannot open %s: %s", path, zs_strerror(err));
    }
    if (!(flags & ZS__O_DIRECT_TRY))
      return zs__fail(ZS_ENOTSUP,
                      "cannot open %s for direct I/O: the file system does "
                      "not support O_DIRECT (tmpfs?); use a directory on a "
                      "disk or turn direct I/O off",
                      path);
  }
#endif
  do fd = open(path, oflags, 0644);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    err = zs__os_error();
    return zs__fail(err, "cannot open %s: %s", path, zs_strerror(err));
  }
#if defined(__APPLE__)
  if (flags & (ZS__O_DIRECT | ZS__O_DIRECT_TRY)) {
    /* macOS has no O_DIRECT; F_NOCACHE is its equivalent. */
    if (fcntl(fd, F_NOCACHE, 1) == 0) f->direct = 1;
  }
#endif
  f->h = fd;
  return 0;
}

int zs__file_close(zs__file *f) {
  int rc;
  if (f->h == -1) return 0;
  rc = close((int)f->h);
  f->h = -1;
  /* A failing close still releases the descriptor; report it for writes. */
  return rc ? zs__fail(zs__os_error(), "close failed") : 0;
}

int zs__os_file_pread(zs__file *f, void *buf, size_t len, uint64_t off,
                      size_t *done) {
  size_t total = 0;
  int err;
  while (total < len) {
    ssize_t n = pread((int)f->h, (char *)buf + total, len - total,
                      (off_t)(off + total));
    if (n < 0) {
      if (errno == EINTR) continue;
      err = zs__os_error();
      *done = total;
      return zs__fail(err, "read of %zu bytes at offset %llu failed: %s", len,
                      (unsigned long long)off, zs_strerror(err));
    }
    if (n == 0) break; /* EOF */
    total += (size_t)n;
  }
  *done = total;
  return 0;
}

int zs__os_file_pwrite(zs__file *f, const void *buf, size_t len, uint64_t off,
                       size_t *done) {
  size_t total = 0;
  int err;
  while (total < len) {
    ssize_t n = pwrite((int)f->h, (const char *)buf + total, len - total,
                       (off_t)(off + total));
    if (n < 0) {
      if (errno == EINTR) continue;
      err = zs__os_error();
      *done = total;
      return zs__fail(err, "write of %zu bytes at offset %llu failed: %s", len,
                      (unsigned long long)off, zs_strerror(err));
    }
    if (n == 0) {
      *done = total;
      return zs__fail(ZS_EIO, "write at offset %llu made no progress",
                      (unsigned long long)(off + total));
    }
    total += (size_t)n;
  }
  *done = total;
  return 0;
}

int zs__file_size(zs__file *f, uint64_t *size) {
  struct stat st;
  if (fstat((int)f->h, &st) != 0) return zs__fail(zs__os_error(), "fstat failed");
  *size = (uint64_t)st.st_size;
  return 0;
}

int zs__file_truncate(zs__file *f, uint64_t size) {
  int rc;
  do rc = ftruncate((int)f->h, (off_t)size);
  while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    int err = zs__os_error();
    return zs__fail(err, "setting the file size to %llu failed: %s",
                    (unsigned long long)size, zs_strerror(err));
  }
  return 0;
}

int zs__file_preallocate(zs__file *f, uint64_t size) {
  int rc;
  if (size == 0) return 0;
#if defined(__linux__)
  do rc = posix_fallocate((int)f->h, 0, (off_t)size);
  while (rc == EINTR);
  if (rc == 0) return 0;
  if (rc != EOPNOTSUPP && rc != ENOSYS && rc != EINVAL) {
    int err = zs__translate_errno(rc);
    return zs__fail(err, "reserving %llu bytes failed: %s",
                    (unsigned long long)size, zs_strerror(err));
  }
#endif
  /* No block reservation on this file system: at least set the size. */
  {
    uint64_t cur;
    rc = zs__file_size(f, &cur);
    if (rc) return rc;
    return cur < size ? zs__file_truncate(f, size) : 0;
  }
}

int zs__file_sync(zs__file *f) {
  int rc;
#if defined(__APPLE__)
  rc = fcntl((int)f->h, F_FULLFSYNC);
  if (rc != 0) rc = fsync((int)f->h);
#else
  do rc = fsync((int)f->h);
  while (rc != 0 && errno == EINTR);
#endif
  return rc ? zs__fail(zs__os_error(), "fsync failed") : 0;
}

#if defined(__linux__) && defined(SYS_statx)
/* The kernel's struct statx (include/uapi/linux/stat.h), declared here so the
 * DIO alignment fields are available whatever the libc headers carry. */
struct zs__statx {
  uint32_t mask, blksize;
  uint64_t attributes;
  uint32_t nlink, uid, gid;
  uint16_t mode, pad0;
  uint64_t ino, size, blocks, attributes_mask;
  struct {
    int64_t sec;
    uint32_t nsec;
    int32_t pad;
  } atime, btime, ctime, mtime;
  uint32_t rdev_major, rdev_minor, dev_major, dev_minor;
  uint64_t mnt_id;
  uint32_t dio_mem_align, dio_offset_align;
  uint64_t spare[12];
};
#  define ZS__STATX_DIOALIGN 0x00002000u
#endif

int zs__file_dio_alignment(const char *path, uint32_t *mem_align,
                           uint32_t *off_align) {
  *mem_align = ZS__DEFAULT_DIO_ALIGN;
  *off_align = ZS__DEFAULT_DIO_ALIGN;
  if (!path) return zs__fail(ZS_EINVAL, "path is NULL");
#if defined(__linux__) && defined(SYS_statx)
  {
    struct zs__statx sx;
    memset(&sx, 0, sizeof sx);
    if (syscall(SYS_statx, AT_FDCWD, path, 0, ZS__STATX_DIOALIGN, &sx) == 0 &&
        (sx.mask & ZS__STATX_DIOALIGN) && sx.dio_mem_align != 0 &&
        sx.dio_offset_align != 0) {
      *mem_align = sx.dio_mem_align;
      *off_align = sx.dio_offset_align;
    }
  }
#endif
  return 0;
}

static int zs__sync_parent_dir(const char *path) {
  char *dir = strdup(path), *slash;
  int fd, rc = 0;
  if (!dir) return zs__fail(ZS_ENOMEM, "out of memory");
  slash = strrchr(dir, '/');
  if (slash == dir) dir[1] = '\0';
  else if (slash) *slash = '\0';
  else strcpy(dir, ".");
  fd = open(dir, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    /* Some file systems refuse fsync on directories (EINVAL): harmless. */
    if (fsync(fd) != 0 && errno != EINVAL) rc = zs__os_error();
    close(fd);
  }
  free(dir);
  return rc ? zs__fail(rc, "syncing the directory of %s failed", path) : 0;
}

int zs__file_replace(const char *from, const char *to) {
  if (!from || !to) return zs__fail(ZS_EINVAL, "path is NULL");
  if (rename(from, to) != 0) {
    int err = zs__os_error();
    return zs__fail(err, "replacing %s by %s failed: %s", to, from,
                    zs_strerror(err));
  }
  return zs__sync_parent_dir(to);
}

int zs__file_remove(const char *path) {
  if (!path) return zs__fail(ZS_EINVAL, "path is NULL");
  if (unlink(path) != 0) {
    int err = zs__os_error();
    return zs__fail(err, "removing %s failed: %s", path, zs_strerror(err));
  }
  return 0;
}