/* file.c - files for direct I/O: open, positional read/write, preallocate,
 * sync, alignment query and atomic replace (declared in zs_internal.h).
 * This file holds what every platform shares: resetting the handle, the
 * NULL-path check and the "file.read" / "file.write" fault sites; the
 * system calls are in file_posix.c and file_win.c. */
#include "zs_os.h"

int zs__file_open(zs__file *f, const char *path, int flags) {
  f->h = -1;
  f->direct = 0;
  f->overlapped = 0;
  if (!path) return zs__fail(ZS_EINVAL, "file path is NULL");
  return zs__os_file_open(f, path, flags);
}

int zs__file_pread(zs__file *f, void *buf, size_t len, uint64_t off,
                   size_t *done) {
  int err = zs__fault_check("file.read");
  *done = 0;
  if (err) return err;
  return zs__os_file_pread(f, buf, len, off, done);
}

int zs__file_pwrite(zs__file *f, const void *buf, size_t len, uint64_t off,
                    size_t *done) {
  int err = zs__fault_check("file.write");
  *done = 0;
  if (err) return err;
  return zs__os_file_pwrite(f, buf, len, off, done);
}
