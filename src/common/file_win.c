/* file_win.c - the Windows half of file.c: CreateFileW with
 * FILE_FLAG_NO_BUFFERING for direct I/O, positional ReadFile/WriteFile that
 * also work on overlapped handles, SetFileInformationByHandle for sizes and
 * MoveFileExW for the atomic replace. Paths arrive as UTF-8 and are
 * converted to UTF-16. */
#include <stdlib.h>
#include <string.h>

#include "zs_os.h"

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

int zs__os_file_open(zs__file *f, const char *path, int flags) {
  DWORD access = 0, disp, attrs = FILE_ATTRIBUTE_NORMAL;
  wchar_t *w = NULL;
  HANDLE h;
  int rc, acc = flags & ZS__O_ACCMODE;
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

int zs__os_file_pread(zs__file *f, void *buf, size_t len, uint64_t off,
                      size_t *done) {
  int err = zs__win_io(f, buf, len, off, done, 0);
  return err ? zs__fail(err, "read of %zu bytes at offset %llu failed: %s",
                        len, (unsigned long long)off, zs_strerror(err))
             : 0;
}

int zs__os_file_pwrite(zs__file *f, const void *buf, size_t len, uint64_t off,
                       size_t *done) {
  int err = zs__win_io(f, (void *)buf, len, off, done, 1);
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