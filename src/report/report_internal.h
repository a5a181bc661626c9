/* report_internal.h - what the files of the report area share. The report
 * is the top layer of the library: it may call every other area (common,
 * optim, aio, swap) through their headers, and nothing below calls it. */
#ifndef ZS_REPORT_INTERNAL_H
#define ZS_REPORT_INTERNAL_H

#include "zs_internal.h"

/* Whether the CUDA driver library can be loaded and initialized (dlopen /
 * LoadLibrary at run time, never linked). Writes a one-line description to
 * out; returns 1 if at least one device is usable. */
int zs__cuda_probe(char *out, size_t cap);

#endif /* ZS_REPORT_INTERNAL_H */
