/* probe.c - run-time probes of optional platform features, decided once and
 * cached: io_uring (liburing) and the CUDA driver library. */
#include <stdio.h>
#include <string.h>

#include "zs_internal.h"

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

int zs__uring_probe(const char **why) {
  zs__call_once(&zs__uring_once, zs__uring_probe_once);
  if (why) *why = zs__uring_why;
  return zs__uring_ok;
}

/* ------------------------------------------------------------ CUDA driver */

#if defined(_WIN32)
#  define ZS__CUDA_LIB "nvcuda.dll"
#elif defined(__APPLE__)
#  define ZS__CUDA_LIB "libcuda.dylib"
#else
#  define ZS__CUDA_LIB "libcuda.so.1"
#  include <dlfcn.h>
#endif

typedef int (*zs__cu_int_fn)(int *);
typedef int (*zs__cu_init_fn)(unsigned);

int zs__cuda_probe(char *out, size_t cap) {
  void *lib;
  zs__cu_init_fn cu_init;
  zs__cu_int_fn cu_version, cu_count;
  int version = 0, count = 0, rc;
#if defined(_WIN32)
  lib = (void *)LoadLibraryA(ZS__CUDA_LIB);
#else
  lib = dlopen(ZS__CUDA_LIB, RTLD_NOW | RTLD_LOCAL);
#endif
  if (!lib) {
    snprintf(out, cap, "not found (%s cannot be loaded: no NVIDIA driver)",
             ZS__CUDA_LIB);
    return 0;
  }
#if defined(_WIN32)
  cu_init = (zs__cu_init_fn)(uintptr_t)GetProcAddress((HMODULE)lib, "cuInit");
  cu_version = (zs__cu_int_fn)(uintptr_t)GetProcAddress((HMODULE)lib,
                                                        "cuDriverGetVersion");
  cu_count = (zs__cu_int_fn)(uintptr_t)GetProcAddress((HMODULE)lib,
                                                      "cuDeviceGetCount");
#else
  *(void **)&cu_init = dlsym(lib, "cuInit");
  *(void **)&cu_version = dlsym(lib, "cuDriverGetVersion");
  *(void **)&cu_count = dlsym(lib, "cuDeviceGetCount");
#endif
  if (!cu_init || !cu_version || !cu_count) {
    snprintf(out, cap, "%s loaded but lacks cuInit/cuDriverGetVersion",
             ZS__CUDA_LIB);
    rc = 0;
  } else if ((rc = cu_init(0)) != 0) {
    cu_version(&version);
    snprintf(out, cap, "%s loaded (driver API %d.%d) but cuInit failed with "
             "CUresult %d (no usable GPU?)", ZS__CUDA_LIB, version / 1000,
             (version % 1000) / 10, rc);
    rc = 0;
  } else {
    cu_version(&version);
    cu_count(&count);
    snprintf(out, cap, "%s: driver API %d.%d, %d device(s)", ZS__CUDA_LIB,
             version / 1000, (version % 1000) / 10, count);
    rc = count > 0;
  }
  /* The library stays loaded: unloading a CUDA driver is not supported. */
  return rc;
}
