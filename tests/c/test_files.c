/* File helpers: direct I/O open, positional I/O, preallocate, sync,
 * alignment query and atomic replace. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_internal.h"
#include "zt.h"


static void roundtrip_buffered(void) {
  char dir[512], path[600];
  zs__file f = ZS__FILE_INIT;
  unsigned char wbuf[10007], rbuf[10007];
  size_t done, i;
  uint64_t size;
  snprintf(dir, sizeof dir, "%s", zt_tmpdir());
  zt_path_in(path, sizeof path, dir, "a.bin");
  for (i = 0; i < sizeof wbuf; i++) wbuf[i] = (unsigned char)zt_rand();
  ZT_OK(zs__file_open(&f, path, ZS__O_RDWR | ZS__O_CREAT | ZS__O_TRUNC));
  ZT_OK(zs__file_pwrite(&f, wbuf, sizeof wbuf, 123, &done));
  ZT_CHECK(done == sizeof wbuf);
  ZT_OK(zs__file_size(&f, &size));
  ZT_CHECK(size == 123 + sizeof wbuf);
  ZT_OK(zs__file_pread(&f, rbuf, sizeof rbuf, 123, &done));
  ZT_CHECK(done == sizeof rbuf);
  ZT_CHECK(memcmp(wbuf, rbuf, sizeof wbuf) == 0);
  /* A read crossing EOF is short, not an error. */
  ZT_OK(zs__file_pread(&f, rbuf, 100, size - 40, &done));
  ZT_CHECK(done == 40);
  ZT_OK(zs__file_pread(&f, rbuf, 100, size + 4096, &done));
  ZT_CHECK(done == 0);
  ZT_OK(zs__file_sync(&f));
  ZT_OK(zs__file_truncate(&f, 50));
  ZT_OK(zs__file_size(&f, &size));
  ZT_CHECK(size == 50);
  ZT_OK(zs__file_close(&f));
  ZT_OK(zs__file_close(&f)); /* closing twice is harmless */
  zt_rmtree(dir);
}

static void direct_io_roundtrip(void) {
  char dir[512], path[600];
  zs__file f = ZS__FILE_INIT;
  uint32_t mem_align, off_align;
  size_t len = 1 << 20, done, i;
  unsigned char *w = NULL, *r = NULL;
  snprintf(dir, sizeof dir, "%s", zt_tmpdir());
  zt_path_in(path, sizeof path, dir, "d.bin");
  ZT_OK(zs__file_dio_alignment(dir, &mem_align, &off_align));
  ZT_CHECK(mem_align >= 1 && (mem_align & (mem_align - 1)) == 0);
  ZT_CHECK(off_align >= 512 && off_align <= 65536);
  ZT_OK(zs_alloc_aligned((void **)&w, len, 4096));
  ZT_OK(zs_alloc_aligned((void **)&r, len, 4096));
  for (i = 0; i < len; i++) w[i] = (unsigned char)(i * 31 + 7);
  {
    int rc = zs__file_open(&f, path,
                           ZS__O_RDWR | ZS__O_CREAT | ZS__O_TRUNC | ZS__O_DIRECT);
    if (rc == ZS_ENOTSUP) {
      zs_free_aligned(w);
      zs_free_aligned(r);
      ZT_CHECK(strstr(zs_last_error(), "direct I/O") != NULL);
      /* The TRY flag falls back to buffered I/O instead. */
      ZT_OK(zs__file_open(&f, path, ZS__O_RDWR | ZS__O_CREAT | ZS__O_DIRECT_TRY));
      ZT_CHECK(f.direct == 0);
      zs__file_close(&f);
      zt_rmtree(dir);
      ZT_SKIP("this file system refuses direct I/O (fallback checked)");
    }
    ZT_OK(rc);
  }
  ZT_CHECK(f.direct == 1);
  ZT_OK(zs__file_preallocate(&f, 4 * (uint64_t)len));
  {
    uint64_t size;
    ZT_OK(zs__file_size(&f, &size));
    ZT_CHECK(size == 4 * (uint64_t)len);
  }
  ZT_OK(zs__file_pwrite(&f, w, len, 2 * (uint64_t)len, &done));
  ZT_CHECK(done == len);
  ZT_OK(zs__file_pread(&f, r, len, 2 * (uint64_t)len, &done));
  ZT_CHECK(done == len && memcmp(w, r, len) == 0);
  ZT_OK(zs__file_pread(&f, r, len, 0, &done)); /* preallocated: zeros */
  ZT_CHECK(done == len && r[0] == 0 && r[len - 1] == 0);
  ZT_OK(zs__file_close(&f));
  zs_free_aligned(w);
  zs_free_aligned(r);
  zt_rmtree(dir);
}

static void atomic_replace_and_errors(void) {
  char dir[512], a[600], b[600], missing[600];
  zs__file f = ZS__FILE_INIT;
  size_t done;
  char buf[8] = {0};
  snprintf(dir, sizeof dir, "%s", zt_tmpdir());
  zt_path_in(a, sizeof a, dir, "new.tmp");
  zt_path_in(b, sizeof b, dir, "ckpt");
  zt_path_in(missing, sizeof missing, dir, "nope/none");
  ZT_OK(zs__file_open(&f, b, ZS__O_WRONLY | ZS__O_CREAT | ZS__O_TRUNC));
  ZT_OK(zs__file_pwrite(&f, "old", 3, 0, &done));
  ZT_OK(zs__file_close(&f));
  ZT_OK(zs__file_open(&f, a, ZS__O_WRONLY | ZS__O_CREAT | ZS__O_TRUNC));
  ZT_OK(zs__file_pwrite(&f, "newer", 5, 0, &done));
  ZT_OK(zs__file_sync(&f));
  ZT_OK(zs__file_close(&f));
  ZT_OK(zs__file_replace(a, b));
  ZT_OK(zs__file_open(&f, b, ZS__O_RDONLY));
  ZT_OK(zs__file_pread(&f, buf, sizeof buf, 0, &done));
  ZT_CHECK(done == 5 && memcmp(buf, "newer", 5) == 0);
  ZT_OK(zs__file_close(&f));
  ZT_ERR(zs__file_open(&f, a, ZS__O_RDONLY), ZS_ENOENT); /* moved away */
  ZT_CHECK(strstr(zs_last_error(), "new.tmp") != NULL);
  ZT_ERR(zs__file_open(&f, missing, ZS__O_WRONLY | ZS__O_CREAT), ZS_ENOENT);
  ZT_ERR(zs__file_replace(a, b), ZS_ENOENT);
  ZT_OK(zs__file_remove(b));
  ZT_ERR(zs__file_remove(b), ZS_ENOENT);
  ZT_ERR(zs__file_open(&f, NULL, ZS__O_RDONLY), ZS_EINVAL);
  zt_rmtree(dir);
}

static void injected_io_faults(void) {
  char dir[512], path[600];
  zs__file f = ZS__FILE_INIT;
  size_t done = 99;
  char buf[16] = "abcdefghijklmno";
  snprintf(dir, sizeof dir, "%s", zt_tmpdir());
  zt_path_in(path, sizeof path, dir, "f.bin");
  ZT_OK(zs__file_open(&f, path, ZS__O_RDWR | ZS__O_CREAT | ZS__O_TRUNC));
  ZT_OK(zs_fault_set("file.write", 1, 1, ZS_ENOSPC));
  ZT_ERR(zs__file_pwrite(&f, buf, sizeof buf, 0, &done), ZS_ENOSPC);
  ZT_CHECK(done == 0);
  ZT_OK(zs__file_pwrite(&f, buf, sizeof buf, 0, &done)); /* usable again */
  ZT_OK(zs_fault_set("file.read", 1, 1, ZS_EIO));
  ZT_ERR(zs__file_pread(&f, buf, sizeof buf, 0, &done), ZS_EIO);
  ZT_OK(zs__file_pread(&f, buf, sizeof buf, 0, &done));
  ZT_CHECK(done == sizeof buf);
  ZT_OK(zs__file_close(&f));
  zt_rmtree(dir);
}

ZT_MAIN(ZT_CASE(roundtrip_buffered), ZT_CASE(direct_io_roundtrip),
        ZT_CASE(atomic_replace_and_errors), ZT_CASE(injected_io_faults))
