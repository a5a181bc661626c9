/* aio_probe.c - whether each backend can run on this machine, and why not:
 * decided once per process, worded once, and used both by the backend
 * choice (aio.c) and by the environment report. io_uring is probed by
 * creating and destroying a small ring, which is exactly what a seccomp
 * profile or an old kernel refuses. */
#include <stdio.h>
#include <string.h>

#include "aio/aio_internal.h"

#if defined(ZS_HAVE_URING)
#  include <errno.h>
#  include <liburing.h>
#endif

static int zs__uring_ok;
static char zs__uring_why[160];
static zs__once_t zs__uring_once = ZS__ONCE_INIT;

static void zs__uring_probe_once(void) {
#if !defined(ZS_HAVE_URING)
#  if defined(_WIN32)
  snprintf(zs__uring_why, sizeof zs__uring_why, "not available on Windows");
#  elif defined(__linux__)
  snprintf(zs__uring_why, sizeof zs__uring_why,
           "not compiled in (build without liburing; install liburing-dev "
           "and rebuild)");
#  else
  snprintf(zs__uring_why, sizeof zs__uring_why, "Linux only");
#  endif
  zs__uring_ok = 0;
#else
  struct io_uring ring;
  int rc;
  if (zs__getenv("ZSPEED_DISABLE_URING")) {
    snprintf(zs__uring_why, sizeof zs__uring_why,
             "disabled by ZSPEED_DISABLE_URING");
    return;
  }
  rc = io_uring_queue_init(4, &ring, 0);
  if (rc == 0) {
    io_uring_queue_exit(&ring);
    zs__uring_ok = 1;
    snprintf(zs__uring_why, sizeof zs__uring_why, "available");
    return;
  }
  switch (-rc) {
    case EPERM:
      snprintf(zs__uring_why, sizeof zs__uring_why,
               "blocked (EPERM): a seccomp profile (e.g. Docker's default) or "
               "kernel.io_uring_disabled forbids it");
      break;
    case ENOSYS:
      snprintf(zs__uring_why, sizeof zs__uring_why,
               "kernel has no io_uring (ENOSYS; needs Linux >= 5.1)");
      break;
    case ENOMEM:
      snprintf(zs__uring_why, sizeof zs__uring_why,
               "cannot allocate a ring (ENOMEM; raise the page-lock limit)");
      break;
    default:
      snprintf(zs__uring_why, sizeof zs__uring_why, "setup failed: %s",
               strerror(-rc));
  }
#endif
}

int zs__aio_backend_usable(int backend, const char **why) {
  switch (backend) {
    case ZS_AIO_BACKEND_THREADS:
      *why = "available (portable pread/pwrite worker pool, always built)";
      return 1;
    case ZS_AIO_BACKEND_IO_URING:
      zs__call_once(&zs__uring_once, zs__uring_probe_once);
      *why = zs__uring_why;
      return zs__uring_ok;
    case ZS_AIO_BACKEND_IOCP:
#ifdef _WIN32
      *why = "available (overlapped I/O on a completion port)";
      return 1;
#else
      *why = "Windows only";
      return 0;
#endif
    default:
      return zs__fail(ZS_EINVAL, "zs_aio_backend_available: %d is not a "
                      "concrete backend; use ZS_AIO_BACKEND_IO_URING, "
                      "_THREADS or _IOCP", backend);
  }
}

int zs_aio_backend_available(int backend, char *why, size_t cap) {
  const char *w = "";
  int ok = zs__aio_backend_usable(backend, &w);
  if (ok >= 0 && why && cap) snprintf(why, cap, "%s", w);
  return ok;
}
