/* file.c - files for direct I/O: open, positional read/write, preallocate,
 * sync, alignment query and atomic replace, for POSIX and Windows. Paths are
 * UTF-8 everywhere; on Windows they are converted to UTF-16. */
#include <stdlib.h>
#include <string.h>

#include "zs_internal.h"

#ifndef _WIN32
#  include <errno.h>
#  include <fcntl.h>
#  include <stdio.h>
#  include <sys/stat.h>
#  include <unistd.h>
#  if defined(__linux__)
#    include <sys/syscall.h>
#  endif
#endif

#define ZS__DEFAULT_DIO_ALIGN 4096u

#ifdef _WIN32
/* ------------------------------------------------------------- Windows */

static int zs__widen(const char *path, wchar_t **out) {
  int n = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path, -1, NULL, 0);
  wchar_t *w;
  if (n <= 0) return zs__fail(ZS_EINVAL, "path is not valid UTF-8: %s", path);
  w = malloc((size_t)n * sizeof *w);
  if (!w) return zs__fail(ZS_ENOMEM, "cannot convert path %s", path);
  MultiByteToWideChar(CP_UTF8, 0, path, -1, w, n);
  *out = w;
  return 0;
}

int zs__file_open(zs__file *f, const char *path, int flags) {
  DWORD access = 0, disp, attrs = FILE_ATTRIBUTE_NORMAL;
  wchar_t *w = NULL;
  HANDLE h;
  int rc, acc = flags & ZS__O_ACCMODE;
  f->h = -1;
  f->direct = 0;
  f->overlapped = 0;
  if (!path) return zs__fail(ZS_EINVAL, "file path is NULL");
  if (acc == ZS__O_RDONLY) access = GENERIC_READ;
  else if (acc == ZS__O_WRONLY) access = GENERIC_WRITE;
  else access = GENERIC_READ | GENERIC_WRITE;
  if ((flags & ZS__O_CREAT) && (flags & ZS__O_EXCL)) disp = CREATE_NEW;
  else if ((flags & ZS__O_CREAT) && (flags & ZS__O_TRUNC)) disp = CREATE_ALWAYS;
  else if (flags & ZS__O_CREAT) disp = OPEN_ALWAYS;
  else if (flags & ZS__O_TRUNC) disp = TRUNCATE_EXISTING;
  else disp = OPEN_EXISTING;
  if (flags & (ZS__O_DIRECT | ZS__O_DIRECT_TRY)) attrs |= FILE_FLAG_NO_BUFFERING;
  if (flags & ZS__O_OVERLAPPED) attrs |= FILE_FLAG_OVERLAPPED;
  if ((rc = zs__widen(path, &w)) != 0) return rc;
  h = CreateFileW(w, access, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE,
                  NULL, disp, attrs, NULL);
  if (h == INVALID_HANDLE_VALUE && (flags & ZS__O_DIRECT_TRY)) {
    attrs &= ~(DWORD)FILE_FLAG_NO_BUFFERING;
    h = CreateFileW(w, access,
                    FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, NULL,
                    disp, attrs, NULL);
  }
  free(w);
  if (h == INVALID_HANDLE_VALUE) {
    int err = zs__os_error();
    return zs__fail(err, "cannot open %s: %s", path, zs_strerror(err));
  }
  f->h = (intptr_t)h;
  f->direct = (attrs & FILE_FLAG_NO_BUFFERING) != 0;
  f->overlapped = (flags & ZS__O_OVERLAPPED) != 0;
  return 0;
}

int zs__file_close(zs__file *f) {
  if (f->h == -1) return 0;
  if (!CloseHandle((HANDLE)f->h)) {
    f->h = -1;
    return zs__fail(zs__os_error(), "CloseHandle failed");
  }
  f->h = -1;
  return 0;
}

/* Synchronous positional I/O. On an overlapped handle the call is issued
 * with an event and waited for, so these helpers work on any handle. */
static int zs__win_io(zs__file *f, void *buf, size_t len, uint64_t off,
                      size_t *done, int write) {
  size_t total = 0;
  int err = 0;
  HANDLE ev = NULL;
  if (f->overlapped) {
    ev = CreateEventW(NULL, TRUE, FALSE, NULL);
    if (!ev) return zs__fail(zs__os_error(), "CreateEvent failed");
  }
  while (total < len) {
    OVERLAPPED ov;
    DWORD chunk = (DWORD)ZS_MIN(len - total, (size_t)1 << 30), got = 0;
    BOOL ok;
    uint64_t pos = off + total;
    memset(&ov, 0, sizeof ov);
    ov.Offset = (DWORD)pos;
    ov.OffsetHigh = (DWORD)(pos >> 32);
    ov.hEvent = ev;
    if (write)
      ok = WriteFile((HANDLE)f->h, (const char *)buf + total, chunk, &got, &ov);
    else
      ok = ReadFile((HANDLE)f->h, (char *)buf + total, chunk, &got, &ov);
    if (!ok && GetLastError() == ERROR_IO_PENDING)
      ok = GetOverlappedResult((HANDLE)f->h, &ov, &got, TRUE);
    if (!ok) {
      if (!write && GetLastError() == ERROR_HANDLE_EOF) break;
      err = zs__os_error();
      break;
    }
    if (got == 0) break; /* EOF */
    total += got;
  }
  if (ev) CloseHandle(ev);
  *done = total;
  return err;
}

int zs__file_pread(zs__file *f, void *buf, size_t len, uint64_t off,
                   size_t *done) {
  int err = zs__fault_check("file.read");
  *done = 0;
  if (err) return err;
  err = zs__win_io(f, buf, len, off, done, 0);
  return err ? zs__fail(err, "read of %zu bytes at offset %llu failed: %s",
                        len, (unsigned long long)off, zs_strerror(err))
             : 0;
}

int zs__file_pwrite(zs__file *f, const void *buf, size_t len, uint64_t off,
                    size_t *done) {
  int err = zs__fault_check("file.write");
  *done = 0;
  if (err) return err;
  err = zs__win_io(f, (void *)buf, len, off, done, 1);
  return err ? zs__fail(err, "write of %zu bytes at offset %llu failed: %s",
                        len, (unsigned long long)off, zs_strerror(err))
             : 0;
}

int zs__file_size(zs__file *f, uint64_t *size) {
  LARGE_INTEGER li;
  if (!GetFileSizeEx((HANDLE)f->h, &li))
    return zs__fail(zs__os_error(), "GetFileSizeEx failed");
  *size = (uint64_t)li.QuadPart;
  return 0;
}

int zs__file_truncate(zs__file *f, uint64_t size) {
  FILE_END_OF_FILE_INFO info;
  info.EndOfFile.QuadPart = (LONGLONG)size;
  if (!SetFileInformationByHandle((HANDLE)f->h, FileEndOfFileInfo, &info,
                                  sizeof info))
    return zs__fail(zs__os_error(), "setting the file size to %llu failed",
                    (unsigned long long)size);
  return 0;
}

int zs__file_preallocate(zs__file *f, uint64_t size) {
  FILE_ALLOCATION_INFO alloc;
  uint64_t cur = 0;
  int rc = zs__file_size(f, &cur);
  if (rc) return rc;
  alloc.AllocationSize.QuadPart = (LONGLONG)size;
  if (!SetFileInformationByHandle((HANDLE)f->h, FileAllocationInfo, &alloc,
                                  sizeof alloc)) {
    int err = zs__os_error();
    /* Some file systems (and Wine) cannot reserve blocks: setting the end
     * of file below still pre-extends it. */
    if (err != ZS_ENOSYS && err != ZS_ENOTSUP)
      return zs__fail(err, "reserving %llu bytes failed: %s",
                      (unsigned long long)size, zs_strerror(err));
  }
  return cur < size ? zs__file_truncate(f, size) : 0;
}

int zs__file_sync(zs__file *f) {
  if (!FlushFileBuffers((HANDLE)f->h))
    return zs__fail(zs__os_error(), "FlushFileBuffers failed");
  return 0;
}

int zs__file_dio_alignment(const char *path, uint32_t *mem_align,
                           uint32_t *off_align) {
  (void)path;
  /* Sector sizes are 512 or 4096 bytes; 4096 satisfies both. */
  *mem_align = ZS__DEFAULT_DIO_ALIGN;
  *off_align = ZS__DEFAULT_DIO_ALIGN;
  return 0;
}

int zs__file_replace(const char *from, const char *to) {
  wchar_t *wf = NULL, *wt = NULL;
  int rc;
  if ((rc = zs__widen(from, &wf)) != 0) return rc;
  if ((rc = zs__widen(to, &wt)) != 0) {
    free(wf);
    return rc;
  }
  if (!MoveFileExW(wf, wt, MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH))
    rc = zs__os_error();
  free(wf);
  free(wt);
  return rc ? zs__fail(rc, "replacing %s by %s failed: %s", to, from,
                       zs_strerror(rc))
            : 0;
}

int zs__file_remove(const char *path) {
  wchar_t *w = NULL;
  int rc;
  if ((rc = zs__widen(path, &w)) != 0) return rc;
  if (!DeleteFileW(w)) rc = zs__os_error();
  free(w);
  return rc ? zs__fail(rc, "removing %s failed: %s", path, zs_strerror(rc)) : 0;
}

#else
/* --------------------------------------------------------------- POSIX */

int zs__file_open(zs__file *f, const char *path, int flags) {
  int oflags = O_CLOEXEC, acc = flags & ZS__O_ACCMODE, fd, err;
  f->h = -1;
  f->direct = 0;
  f->overlapped = 0;
  if (!path) return zs__fail(ZS_EINVAL, "file path is NULL");
  oflags |= acc == ZS__O_RDONLY ? O_RDONLY
            : acc == ZS__O_WRONLY ? O_WRONLY
                                  : O_RDWR;
  if (flags & ZS__O_CREAT) oflags |= O_CREAT;
  if (flags & ZS__O_TRUNC) oflags |= O_TRUNC;
  if (flags & ZS__O_EXCL) oflags |= O_EXCL;
#  ifdef O_DIRECT
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
#  endif
  do fd = open(path, oflags, 0644);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    err = zs__os_error();
    return zs__fail(err, "cannot open %s: %s", path, zs_strerror(err));
  }
#  if defined(__APPLE__)
  if (flags & (ZS__O_DIRECT | ZS__O_DIRECT_TRY)) {
    /* macOS has no O_DIRECT; F_NOCACHE is its equivalent. */
    if (fcntl(fd, F_NOCACHE, 1) == 0) f->direct = 1;
  }
#  endif
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

int zs__file_pread(zs__file *f, void *buf, size_t len, uint64_t off,
                   size_t *done) {
  size_t total = 0;
  int err = zs__fault_check("file.read");
  *done = 0;
  if (err) return err;
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

int zs__file_pwrite(zs__file *f, const void *buf, size_t len, uint64_t off,
                    size_t *done) {
  size_t total = 0;
  int err = zs__fault_check("file.write");
  *done = 0;
  if (err) return err;
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
#  if defined(__linux__)
  do rc = posix_fallocate((int)f->h, 0, (off_t)size);
  while (rc == EINTR);
  if (rc == 0) return 0;
  if (rc != EOPNOTSUPP && rc != ENOSYS && rc != EINVAL) {
    int err = zs__translate_errno(rc);
    return zs__fail(err, "reserving %llu bytes failed: %s",
                    (unsigned long long)size, zs_strerror(err));
  }
#  endif
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
#  if defined(__APPLE__)
  rc = fcntl((int)f->h, F_FULLFSYNC);
  if (rc != 0) rc = fsync((int)f->h);
#  else
  do rc = fsync((int)f->h);
  while (rc != 0 && errno == EINTR);
#  endif
  return rc ? zs__fail(zs__os_error(), "fsync failed") : 0;
}

#  if defined(__linux__) && defined(SYS_statx)
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
#    define ZS__STATX_DIOALIGN 0x00002000u
#  endif

int zs__file_dio_alignment(const char *path, uint32_t *mem_align,
                           uint32_t *off_align) {
  *mem_align = ZS__DEFAULT_DIO_ALIGN;
  *off_align = ZS__DEFAULT_DIO_ALIGN;
  if (!path) return zs__fail(ZS_EINVAL, "path is NULL");
#  if defined(__linux__) && defined(SYS_statx)
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
#  endif
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
#endif
