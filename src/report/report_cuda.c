/* report_cuda.c - whether a CUDA driver can be loaded and initialized, for
 * the report. The driver library is opened at run time (dlopen /
 * LoadLibrary), never linked, so libzspeed runs on machines without one. */
#include <stdio.h>

#include "report/report_internal.h"

#if defined(_WIN32)
#  define ZS__CUDA_LIB "nvcuda.dll"
#else
#  include <dlfcn.h>
#  if defined(__APPLE__)
#    define ZS__CUDA_LIB "libcuda.dylib"
#  else
#    define ZS__CUDA_LIB "libcuda.so.1"
#  endif
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
