/* aio_file.c - files for the aio engine: a direct handle for aligned pieces,
 * a buffered companion on the same file for the unaligned head and tail of
 * a request, and the reason direct I/O is (not) in effect. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aio/aio_internal.h"

static char *zs__strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

int zs_aio_file_open(zs_aio_file **out, const char *path, unsigned flags) {
  const unsigned known = 3u | ZS_AIO_CREATE | ZS_AIO_TRUNCATE |
                         ZS_AIO_DIRECT_REQUIRE | ZS_AIO_BUFFERED;
  unsigned acc = flags & 3u;
  int zflags, rc, extra = 0, refused = 0;
  zs_aio_file *f;
  if (!out || !path)
    return zs__fail(ZS_EINVAL, "zs_aio_file_open: out and path must not be NULL");
  if (acc == 3u || (flags & ~known))
    return zs__fail(ZS_EINVAL, "zs_aio_file_open: bad flags 0x%x (use one of "
                               "ZS_AIO_READ/WRITE/RDWR plus CREATE, TRUNCATE, "
                               "DIRECT_REQUIRE or BUFFERED)", flags);
  if ((flags & ZS_AIO_DIRECT_REQUIRE) && (flags & ZS_AIO_BUFFERED))
    return zs__fail(ZS_EINVAL, "zs_aio_file_open: ZS_AIO_DIRECT_REQUIRE and "
                               "ZS_AIO_BUFFERED exclude each other");
  f = calloc(1, sizeof *f);
  if (!f || !(f->path = zs__strdup(path))) {
    free(f);
    return zs__fail(ZS_ENOMEM, "zs_aio_file_open: out of memory");
  }
  f->fd.h = f->bfd.h = -1;
  zflags = (int)acc;
  if (flags & ZS_AIO_CREATE) zflags |= ZS__O_CREAT;
  if (flags & ZS_AIO_TRUNCATE) zflags |= ZS__O_TRUNC;
#ifdef _WIN32
  /* The IOCP backend needs an overlapped handle; the synchronous helpers
   * work on one too. */
  extra |= ZS__O_OVERLAPPED;
#endif
  if (!(flags & ZS_AIO_BUFFERED)) {
    /* Test hook: behave as on a file system that refuses O_DIRECT. */
    refused = zs__fault_check("aio.nodirect") != 0;
    if (refused && (flags & ZS_AIO_DIRECT_REQUIRE)) {
      rc = zs__fail(ZS_ENOTSUP, "cannot open %s for direct I/O: the file "
                    "system does not support it (injected); use a directory "
                    "on a disk or turn direct I/O off", path);
      goto fail;
    }
    if (!refused)
      extra |= (flags & ZS_AIO_DIRECT_REQUIRE) ? ZS__O_DIRECT : ZS__O_DIRECT_TRY;
  }
  rc = zs__file_open(&f->fd, path, zflags | extra);
  if (rc) goto fail;
  f->mem_align = f->off_align = 1;
  if (f->fd.direct) {
    uint32_t ma = 4096, oa = 4096;
    zs__file_dio_alignment(path, &ma, &oa);
    if (ma > ZS__AIO_MAX_ALIGN || oa > ZS__AIO_MAX_ALIGN) {
      if (flags & ZS_AIO_DIRECT_REQUIRE) {
        rc = zs__fail(ZS_ENOTSUP, "%s needs direct I/O alignment %u/%u, more "
                      "than the %u zspeed supports; open it buffered",
                      path, ma, oa, ZS__AIO_MAX_ALIGN);
        goto fail;
      }
      zs__file_close(&f->fd);
      rc = zs__file_open(&f->fd, path, (zflags & ~ZS__O_TRUNC) | (extra & ZS__O_OVERLAPPED));
      if (rc) goto fail;
      snprintf(f->why, sizeof f->why, "buffered: direct I/O would need %u-byte "
               "alignment (more than %u)", ZS_MAX(ma, oa), ZS__AIO_MAX_ALIGN);
    } else {
      /* The companion never creates or truncates: the file exists now. */
      rc = zs__file_open(&f->bfd, path, (int)acc);
      if (rc) goto fail;
      f->direct = 1;
      f->mem_align = ma;
      f->off_align = oa;
      snprintf(f->why, sizeof f->why, "direct I/O (memory aligned to %u bytes, "
               "offsets and lengths to %u)", ma, oa);
    }
  } else if (flags & ZS_AIO_BUFFERED) {
    snprintf(f->why, sizeof f->why, "buffered I/O (requested)");
  } else {
    snprintf(f->why, sizeof f->why, "buffered: the file system refuses direct "
             "I/O (tmpfs or similar); use a directory on a disk for direct I/O");
  }
  *out = f;
  return 0;
fail:
  zs__file_close(&f->fd);
  zs__file_close(&f->bfd);
  free(f->path);
  free(f);
  return rc;
}

int zs_aio_file_close(zs_aio_file *f) {
  int rc, rc2;
  if (!f) return 0;
  rc = zs__file_close(&f->fd);
  rc2 = zs__file_close(&f->bfd);
  free(f->path);
  free(f);
  return rc ? rc : rc2;
}

int zs_aio_file_direct(const zs_aio_file *f) { return f ? f->direct : 0; }

const char *zs_aio_file_why(const zs_aio_file *f) { return f ? f->why : ""; }

uint32_t zs_aio_file_alignment(const zs_aio_file *f) {
  return f ? ZS_MAX(f->mem_align, f->off_align) : 1;
}

int64_t zs_aio_file_size(zs_aio_file *f) {
  uint64_t size = 0;
  int rc;
  if (!f) return zs__fail(ZS_EINVAL, "zs_aio_file_size: file is NULL");
  rc = zs__file_size(&f->fd, &size);
  return rc ? rc : (int64_t)size;
}

int zs_aio_file_preallocate(zs_aio_file *f, int64_t size) {
  if (!f || size < 0)
    return zs__fail(ZS_EINVAL, "zs_aio_file_preallocate: file NULL or size < 0");
  return zs__file_preallocate(&f->fd, (uint64_t)size);
}

int zs_aio_file_sync(zs_aio_file *f) {
  if (!f) return zs__fail(ZS_EINVAL, "zs_aio_file_sync: file is NULL");
  return zs__file_sync(&f->fd);
}
