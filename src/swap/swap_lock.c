/* swap_lock.c - who owns a swap file.
 *
 * A live swapper holds its file through an extra handle for as long as it
 * exists, and that handle says "in use" to everyone else:
 *   POSIX:   an exclusive flock() on the file (released by the kernel when the
 *            process dies, however it dies);
 *   Windows: a handle opened without FILE_SHARE_DELETE, so that no other
 *            process can delete the file or open it for deletion (closed by
 *            the system when the process dies).
 * A swap file that nobody holds was therefore left by a process that died
 * (a crash, kill -9, a container restart) and may be reclaimed; one that is
 * held belongs to a live run and is never touched. Reclaiming (by the Python
 * engine at start-up, or by hand) takes the same lock first, and the creator
 * checks after locking that the name still refers to the file it locked, so
 * a reclaim racing with a creation cannot delete a live file. */
#include <stdlib.h>
#include <string.h>

#include "swap_internal.h"

#ifndef _WIN32
#  include <errno.h>
#  include <fcntl.h>
#  include <sys/file.h>
#  include <sys/stat.h>
#  include <unistd.h>
#  ifndef O_NOFOLLOW
#    define O_NOFOLLOW 0
#  endif
#  ifndef O_CLOEXEC
#    define O_CLOEXEC 0
#  endif
#endif

/* How often a creation is retried when a reclaim removed the new file
 * between its creation and its lock (each retry needs another such race). */
#define ZS__CLAIM_TRIES 8

static int exists_msg(const char *path, int live) {
  if (live)
    return zs__fail(ZS_EEXIST, "swap file %s is in use by a running swapper "
                    "(in this or another process); give each swapper its "
                    "own file name (overwrite cannot take over a file in "
                    "use)", path);
  return zs__fail(ZS_EEXIST, "swap file %s already exists and no running "
                  "swapper holds it: it was left by a process that died. "
                  "Delete it (zspeed's engine removes such files in "
                  "nvme_path by itself), or set cfg.overwrite = 1", path);
}

#ifdef _WIN32

static int widen(const char *path, wchar_t **out) {
  int n = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path, -1, NULL, 0);
  if (n <= 0) return zs__fail(ZS_EINVAL, "path is not valid UTF-8: %s", path);
  *out = malloc((size_t)n * sizeof **out);
  if (!*out) return zs__fail(ZS_ENOMEM, "out of memory converting %s", path);
  MultiByteToWideChar(CP_UTF8, 0, path, -1, *out, n);
  return 0;
}

/* Whether some handle that refuses deletion (a live swapper's) is open on
 * the file: opening it for deletion is then a sharing violation. */
static int held_by_other(const wchar_t *w) {
  HANDLE h = CreateFileW(w, DELETE, FILE_SHARE_READ | FILE_SHARE_WRITE |
                         FILE_SHARE_DELETE, NULL, OPEN_EXISTING,
                         FILE_ATTRIBUTE_NORMAL, NULL);
  if (h == INVALID_HANDLE_VALUE)
    return GetLastError() == ERROR_SHARING_VIOLATION;
  CloseHandle(h);
  return 0;
}

int zs__swap_claim(const char *path, int overwrite, intptr_t *out) {
  wchar_t *w = NULL;
  HANDLE h;
  DWORD err;
  int rc;
  *out = -1;
  if ((rc = widen(path, &w)) != 0) return rc;
  if (overwrite && held_by_other(w)) {
    free(w);
    return zs__fail(ZS_EBUSY, "swap file %s is in use by a running swapper "
                    "(in this or another process); overwrite cannot take it "
                    "over", path);
  }
  /* Others may read and write the file (the aio engine opens its own
   * handle; tools may read it) but, without FILE_SHARE_DELETE, nobody can
   * delete it or open it for deletion while this handle is open. */
  h = CreateFileW(w, GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_WRITE, NULL,
                  overwrite ? OPEN_ALWAYS : CREATE_NEW, FILE_ATTRIBUTE_NORMAL,
                  NULL);
  if (h == INVALID_HANDLE_VALUE) {
    err = GetLastError();
    if (err == ERROR_FILE_EXISTS || err == ERROR_ALREADY_EXISTS) {
      int live = held_by_other(w);
      free(w);
      return exists_msg(path, live);
    }
    free(w);
    rc = zs__translate_win32(err);
    return zs__fail(rc, "creating swap file %s: %s", path, zs_strerror(rc));
  }
  free(w);
  *out = (intptr_t)h;
  return 0;
}

void zs__swap_release(intptr_t h) {
  if (h != -1) CloseHandle((HANDLE)h);
}

/* Windows: the owner's handle refuses deletion, so the file is removed after
 * that handle is closed; a reclaim in between already removed it. */
int zs__swap_unlink_owned(const char *path, intptr_t *h) {
  int rc;
  zs__swap_release(*h);
  *h = -1;
  rc = zs__file_remove(path);
  return rc == ZS_ENOENT ? 0 : rc;
}

#else /* POSIX */

/* Whether a live swapper holds the file at path (its flock is exclusive). */
static int held_by_other(const char *path) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC), held = 0;
  if (fd < 0) return 0;
  if (flock(fd, LOCK_SH | LOCK_NB) < 0) held = errno == EWOULDBLOCK;
  close(fd);
  return held;
}

int zs__swap_claim(const char *path, int overwrite, intptr_t *out) {
  int tries, fd, err;
  struct stat named, locked;
  *out = -1;
  for (tries = 0; tries < ZS__CLAIM_TRIES; tries++) {
    fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC |
              (overwrite ? 0 : O_EXCL), 0644);
    if (fd < 0) {
      err = errno;
      if (err == EEXIST) return exists_msg(path, held_by_other(path));
      err = zs__translate_errno(err);
      return zs__fail(err, "creating swap file %s: %s", path,
                      zs_strerror(err));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
      err = errno;
      close(fd);
      if (err != EWOULDBLOCK) {
        err = zs__translate_errno(err);
        return zs__fail(err, "locking swap file %s: %s", path,
                        zs_strerror(err));
      }
      if (overwrite)
        return zs__fail(ZS_EBUSY, "swap file %s is in use by a running "
                        "swapper (in this or another process); overwrite "
                        "cannot take it over", path);
      continue; /* a reclaim holds the file we just created: it goes away */
    }
    /* A reclaim may have removed the name between open and flock. */
    if (stat(path, &named) == 0 && fstat(fd, &locked) == 0 &&
        named.st_dev == locked.st_dev && named.st_ino == locked.st_ino) {
      *out = fd;
      return 0;
    }
    close(fd);
  }
  return zs__fail(ZS_EBUSY, "swap file %s was removed %d times while it was "
                  "being created (something deletes files in that folder)",
                  path, ZS__CLAIM_TRIES);
}

void zs__swap_release(intptr_t fd) {
  if (fd != -1) close((int)fd);
}

/* POSIX: removed while still locked, so no reclaim can race with it. */
int zs__swap_unlink_owned(const char *path, intptr_t *fd) {
  int rc = zs__file_remove(path);
  zs__swap_release(*fd);
  *fd = -1;
  return rc;
}

#endif
