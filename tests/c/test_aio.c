/* The aio engine. Every case runs under whichever backend the environment
 * selects (ctest registers one variant per backend through
 * ZSPEED_AIO_BACKEND); a backend this machine lacks makes every case SKIP
 * with the probe's reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_internal.h"
#include "zspeed/aio.h"
#include "zt.h"

#define KiB ((int64_t)1024)
#define MiB (1024 * KiB)


/* Creates a handle for the backend the environment asks for. Returns 1 on
 * success, 0 after recording a skip or failure. */
static int make_handle(zs_aio **h, const zs_aio_config *cfg) {
  int rc = zs_aio_create(h, cfg);
  if (rc == ZS_ENOTSUP) {
    zt__skip("backend not usable here: %s", zs_last_error());
    return 0;
  }
  if (rc != 0) {
    zt__fail(__FILE__, __LINE__, "zs_aio_create: %s", zs_last_error());
    return 0;
  }
  return 1;
}

static void fill_random(unsigned char *p, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) p[i] = (unsigned char)(zt_rand() >> 24);
}

/* FNV-1a: a checksum to compare large buffers with a clear report. */
static uint64_t fnv(const unsigned char *p, size_t n) {
  uint64_t hsh = 1469598103934665603ull;
  size_t i;
  for (i = 0; i < n; i++) hsh = (hsh ^ p[i]) * 1099511628211ull;
  return hsh;
}

static void backend_choice(void) {
  zs_aio *h;
  zs_aio_config cfg;
  char why[400];
  int b;
  const char *env = getenv("ZSPEED_AIO_BACKEND");
  zs_aio_config_init(&cfg);
  ZT_CHECK(cfg.block_size == MiB && cfg.queue_depth == 128 &&
           cfg.single_submit == 0 && cfg.overlap_events == 0 &&
           cfg.intra_op_parallelism == 1);
  if (!make_handle(&h, NULL)) return;
  ZT_CHECK(strlen(zs_aio_backend_why(h)) > 0);
  if (env && strcmp(env, "auto") != 0)
    ZT_CHECKF(strcmp(zs_aio_backend(h), env) == 0, "forced %s, got %s", env,
              zs_aio_backend(h));
  zs_aio_destroy(h);
  /* The threads backend is always there; forcing a missing one is an error
   * that names the backend and the reason. */
  b = zs_aio_backend_resolve(ZS_AIO_BACKEND_THREADS, why, sizeof why);
  ZT_CHECK(b == ZS_AIO_BACKEND_THREADS);
#ifdef _WIN32
  b = zs_aio_backend_resolve(ZS_AIO_BACKEND_IO_URING, why, sizeof why);
  ZT_CHECK(b == ZS_ENOTSUP && strstr(zs_last_error(), "io_uring") != NULL);
#else
  b = zs_aio_backend_resolve(ZS_AIO_BACKEND_IOCP, why, sizeof why);
  ZT_CHECK(b == ZS_ENOTSUP && strstr(zs_last_error(), "Windows only") != NULL);
#endif
  ZT_ERR(zs_aio_backend_resolve(42, why, sizeof why), ZS_EINVAL);
  /* A ring the kernel refuses fails creation cleanly (io_uring only). */
  if (make_handle(&h, NULL)) {
    int uring = strcmp(zs_aio_backend(h), "io_uring") == 0, rc;
    zs_aio_destroy(h);
    ZT_OK(zs_fault_set("aio.ring", 1, 1, ZS_ENOMEM));
    rc = zs_aio_create(&h, NULL);
    zs_fault_clear();
    if (uring) {
      ZT_CHECK(rc == ZS_ENOMEM && strstr(zs_last_error(), "ring") != NULL);
    } else {
      ZT_OK(rc);
      zs_aio_destroy(h);
    }
  }
  cfg.queue_depth = 0;
  ZT_ERR(zs_aio_create(&h, &cfg), ZS_EINVAL);
  zs_aio_config_init(&cfg);
  cfg.block_size = 0;
  ZT_ERR(zs_aio_create(&h, &cfg), ZS_EINVAL);
}

/* Writes a reference image in random-sized chunks submitted all at once,
 * then reads random (mostly unaligned) ranges into misaligned buffers, many
 * in flight, and compares. */
static void roundtrip_random(void) {
  const size_t fsize = 8 * MiB + 4321;
  char dir[512], path[600];
  unsigned char *ref = malloc(fsize), *arena = malloc(fsize + 64 * 40);
  zs_aio *h;
  zs_aio_file *f;
  zs_aio_config cfg;
  zs_aio_stats st;
  size_t pos, i, offs[40], lens[40];
  unsigned char *dsts[40];
  int64_t n, ids[40];
  ZT_CHECK(ref && arena);
  zs_aio_config_init(&cfg);
  cfg.block_size = 64 * KiB + 1; /* rounded up to the alignment */
  cfg.queue_depth = 8;
  if (!make_handle(&h, &cfg)) goto out_mem;
  snprintf(dir, sizeof dir, "%s", zt_tmpdir());
  zt_path_in(path, sizeof path, dir, "r.bin");
  fill_random(ref, fsize);
  ZT_OK(zs_aio_file_open(&f, path, ZS_AIO_RDWR | ZS_AIO_CREATE | ZS_AIO_TRUNCATE));
  /* Write: consecutive chunks of random size, each from a misaligned copy. */
  for (pos = 0, n = 0; pos < fsize; n++) {
    size_t len = ZS_MIN(fsize - pos, (size_t)(zt_rand() % (700 * KiB)) + 1);
    ZT_CHECK(zs_aio_pwrite(h, f, ref + pos, (int64_t)len, (int64_t)pos) > 0);
    pos += len;
  }
  ZT_CHECKF(zs_aio_wait_all(h) == n, "wait_all must count %lld requests",
            (long long)n);
  ZT_CHECK(zs_aio_file_size(f) == (int64_t)fsize);
  /* Read: 40 random ranges at once, into buffers at odd addresses. */
  for (i = 0; i < 40; i++) {
    offs[i] = (size_t)(zt_rand() % fsize);
    lens[i] = ZS_MIN(fsize - offs[i], (size_t)(zt_rand() % (300 * KiB)) + 1);
    lens[i] = ZS_MIN(lens[i], fsize / 40 - 8);
    dsts[i] = arena + i * (fsize / 40) + (i % 7);
    memset(dsts[i], 0xEE, lens[i]);
    ids[i] = zs_aio_pread(h, f, dsts[i], (int64_t)lens[i], (int64_t)offs[i]);
    ZT_CHECK(ids[i] > 0);
  }
  for (i = 0; i < 40; i++) {
    ZT_OK(zs_aio_wait(h, ids[i]));
    ZT_CHECKF(memcmp(dsts[i], ref + offs[i], lens[i]) == 0,
              "range %zu (off %zu len %zu) differs", i, offs[i], lens[i]);
  }
  zs_aio_stats_get(h, &st);
  ZT_CHECK(st.bytes_written == fsize);
  ZT_CHECK(st.requests == (uint64_t)n + 40 && st.requests_failed == 0);
  ZT_CHECK(st.request_ns > 0 && st.busy_ns > 0 && st.pieces >= (uint64_t)n);
  /* Full read-back into one misaligned buffer, compared by checksum. */
  memset(arena, 0, fsize + 3);
  ZT_OK(zs_aio_read(h, f, arena + 3, (int64_t)fsize, 0));
  ZT_CHECKF(fnv(arena + 3, fsize) == fnv(ref, fsize), "checksum mismatch");
  ZT_OK(zs_aio_file_close(f));
  zs_aio_destroy(h);
  zt_rmtree(dir);
out_mem:
  free(ref);
  free(arena);
}

/* Random reads checked byte for byte against the reference. */
static void random_reads_verified(void) {
  const size_t fsize = 3 * MiB + 777;
  char dir[512], path[600];
  unsigned char *ref = malloc(fsize), *bufs[48];
  size_t offs[48], lens[48], i;
  int64_t ids[48];
  zs_aio *h;
  zs_aio_file *f;
  zs_aio_config cfg;
  ZT_CHECK(ref);
  zs_aio_config_init(&cfg);
  cfg.block_size = 32 * KiB;
  cfg.queue_depth = 16;
  cfg.intra_op_parallelism = 2;
  cfg.overlap_events = 1;
  if (!make_handle(&h, &cfg)) {
    free(ref);
    return;
  }
  snprintf(dir, sizeof dir, "%s", zt_tmpdir());
  zt_path_in(path, sizeof path, dir, "v.bin");
  fill_random(ref, fsize);
  ZT_OK(zs_aio_file_open(&f, path, ZS_AIO_RDWR | ZS_AIO_CREATE | ZS_AIO_TRUNCATE));
  ZT_OK(zs_aio_write(h, f, ref, (int64_t)fsize, 0));
  for (i = 0; i < 48; i++) {
    offs[i] = (size_t)(zt_rand() % fsize);
    lens[i] = ZS_MIN(fsize - offs[i], (size_t)(zt_rand() % (200 * KiB)) + 1);
    if (i % 5 == 0) offs[i] = offs[i] / 4096 * 4096; /* some aligned ones */
    lens[i] = ZS_MIN(lens[i], fsize - offs[i]);
    bufs[i] = malloc(lens[i] + 16);
    ZT_CHECK(bufs[i]);
    ids[i] = zs_aio_pread(h, f, bufs[i] + (i % 3), (int64_t)lens[i],
                          (int64_t)offs[i]);
    ZT_CHECK(ids[i] > 0);
  }
  ZT_CHECK(zs_aio_pending(h) == 48);
  for (i = 48; i-- > 0;) { /* wait in reverse order */
    ZT_OK(zs_aio_wait(h, ids[i]));
    ZT_CHECKF(memcmp(bufs[i] + (i % 3), ref + offs[i], lens[i]) == 0,
              "read %zu (off %zu len %zu) differs", i, offs[i], lens[i]);
    free(bufs[i]);
  }
  ZT_CHECK(zs_aio_pending(h) == 0);
  ZT_ERR(zs_aio_wait(h, ids[0]), ZS_EINVAL); /* already waited for */
  ZT_OK(zs_aio_file_close(f));
  zs_aio_destroy(h);
  zt_rmtree(dir);
  free(ref);
}

/* The direct I/O rules: an unaligned head and tail go to the buffered
 * companion, misaligned memory through a bounce buffer, aligned pieces
 * straight to the direct handle. Checked through the statistics, so the
 * rules hold even where the OS would not enforce them (Wine). */
static void direct_alignment_rules(void) {
  char dir[512], path[600];
  zs_aio *h;
  zs_aio_file *f;
  zs_aio_config cfg;
  zs_aio_stats st;
  unsigned char *abuf = NULL, *rbuf = NULL;
  const int64_t bs = 64 * KiB;
  uint32_t al;
  int64_t off, len;
  zs_aio_config_init(&cfg);
  cfg.block_size = bs;
  cfg.queue_depth = 4;
  if (!make_handle(&h, &cfg)) return;
  snprintf(dir, sizeof dir, "%s", zt_tmpdir());
  zt_path_in(path, sizeof path, dir, "a.bin");
  ZT_OK(zs_aio_file_open(&f, path, ZS_AIO_RDWR | ZS_AIO_CREATE | ZS_AIO_TRUNCATE));
  if (!zs_aio_file_direct(f)) {
    ZT_CHECK(strstr(zs_aio_file_why(f), "buffered") != NULL);
    zs_aio_file_close(f);
    zs_aio_destroy(h);
    zt_rmtree(dir);
    ZT_SKIP("no direct I/O in this temporary directory");
  }
  al = zs_aio_file_alignment(f);
  ZT_CHECK(al >= 512 && (al & (al - 1)) == 0);
  ZT_CHECK(bs % al == 0);
  ZT_OK(zs_alloc_aligned((void **)&abuf, (size_t)(4 * bs + 2 * al), 65536));
  ZT_OK(zs_alloc_aligned((void **)&rbuf, (size_t)(4 * bs + 2 * al), 65536));
  fill_random(abuf, (size_t)(4 * bs + 2 * al));
  /* Aligned everything: no bounce, no buffered piece, 4 pieces. */
  zs_aio_stats_reset(h);
  ZT_OK(zs_aio_write(h, f, abuf, 4 * bs, 0));
  zs_aio_stats_get(h, &st);
  ZT_CHECK(st.pieces == 4 && st.pieces_bounced == 0 && st.pieces_buffered == 0);
  /* Unaligned offset and length from aligned memory: the head (al - 100
   * bytes) and the tail (50 bytes) are buffered; the middle pieces land on
   * aligned offsets but at memory addresses al - 100 past aligned ones, so
   * they bounce. */
  off = 100;
  len = 2 * bs + (al - 100) + 50;
  zs_aio_stats_reset(h);
  ZT_OK(zs_aio_write(h, f, abuf, len, off));
  zs_aio_stats_get(h, &st);
  ZT_CHECKF(st.pieces_buffered == 2 && st.pieces_bounced == 2,
            "buffered %llu bounced %llu", (unsigned long long)st.pieces_buffered,
            (unsigned long long)st.pieces_bounced);
  /* Read it back the same way and compare; then the untouched prefix. */
  memset(rbuf, 0, (size_t)len);
  ZT_OK(zs_aio_read(h, f, rbuf, len, off));
  ZT_CHECK(memcmp(rbuf, abuf, (size_t)len) == 0);
  ZT_OK(zs_aio_read(h, f, rbuf, 100, 0));
  ZT_CHECK(memcmp(rbuf, abuf, 100) == 0);
  /* A request inside one alignment unit: a single buffered piece. */
  zs_aio_stats_reset(h);
  ZT_OK(zs_aio_read(h, f, rbuf + 1, 10, 1000));
  zs_aio_stats_get(h, &st);
  ZT_CHECK(st.pieces_buffered == 1 && st.pieces == 1);
  /* A file may end in the middle of an alignment unit. */
  ZT_OK(zs_aio_write(h, f, abuf, 4 * bs + 7, 0));
  ZT_CHECK(zs_aio_file_size(f) >= 4 * bs + 7);
  ZT_OK(zs_aio_read(h, f, rbuf, 4 * bs + 7, 0));
  ZT_CHECK(memcmp(rbuf, abuf, (size_t)(4 * bs + 7)) == 0);
  zs_free_aligned(abuf);
  zs_free_aligned(rbuf);
  ZT_OK(zs_aio_file_close(f));
  zs_aio_destroy(h);
  zt_rmtree(dir);
}

/* A file several times larger than the buffers, streamed with two buffers
 * reused (double buffering), as the NVMe swapper does. */
static void large_file_reused_buffers(void) {
  const int64_t chunk = MiB + 512, nchunks = 24;
  char dir[512], path[600];
  unsigned char *b[2];
  uint64_t sum_w = 0, sum_r = 0;
  int64_t i, id[2] = {0, 0};
  zs_aio *h;
  zs_aio_file *f;
  if (!make_handle(&h, NULL)) return;
  snprintf(dir, sizeof dir, "%s", zt_tmpdir());
  zt_path_in(path, sizeof path, dir, "big.bin");
  ZT_OK(zs_aio_file_open(&f, path, ZS_AIO_RDWR | ZS_AIO_CREATE | ZS_AIO_TRUNCATE));
  ZT_OK(zs_aio_file_preallocate(f, chunk * nchunks));
  ZT_OK(zs_alloc_aligned((void **)&b[0], (size_t)chunk, 4096));
  ZT_OK(zs_alloc_aligned((void **)&b[1], (size_t)chunk, 4096));
  for (i = 0; i < nchunks; i++) {
    unsigned char *p = b[i & 1];
    if (id[i & 1]) ZT_OK(zs_aio_wait(h, id[i & 1]));
    fill_random(p, (size_t)chunk);
    sum_w += fnv(p, (size_t)chunk) * (uint64_t)(i + 1);
    id[i & 1] = zs_aio_pwrite(h, f, p, chunk, i * chunk);
    ZT_CHECK(id[i & 1] > 0);
  }
  ZT_CHECK(zs_aio_wait_all(h) == 2);
  ZT_OK(zs_aio_file_sync(f));
  id[0] = zs_aio_pread(h, f, b[0], chunk, 0);
  for (i = 0; i < nchunks; i++) {
    unsigned char *p = b[i & 1];
    ZT_OK(zs_aio_wait(h, id[i & 1]));
    if (i + 1 < nchunks) {
      id[(i + 1) & 1] = zs_aio_pread(h, f, b[(i + 1) & 1], chunk, (i + 1) * chunk);
      ZT_CHECK(id[(i + 1) & 1] > 0);
    }
    sum_r += fnv(p, (size_t)chunk) * (uint64_t)(i + 1);
  }
  ZT_CHECK(sum_r == sum_w);
  zs_free_aligned(b[0]);
  zs_free_aligned(b[1]);
  ZT_OK(zs_aio_file_close(f));
  zs_aio_destroy(h);
  zt_rmtree(dir);
}

/* Real errors and injected faults: each fails its own request with a clear
 * message, and the handle keeps working afterwards. */
static void errors_per_request(void) {
  char dir[512], path[600], missing[600];
  unsigned char *buf = malloc(MiB), *back = malloc(MiB);
  zs_aio *h;
  zs_aio_file *f, *ro;
  zs_aio_config cfg;
  zs_aio_stats st;
  int64_t a, b, c;
  ZT_CHECK(buf && back);
  zs_aio_config_init(&cfg);
  cfg.block_size = 64 * KiB;
  cfg.queue_depth = 4;
  if (!make_handle(&h, &cfg)) goto out;
  snprintf(dir, sizeof dir, "%s", zt_tmpdir());
  zt_path_in(path, sizeof path, dir, "e.bin");
  zt_path_in(missing, sizeof missing, dir, "missing.bin");
  fill_random(buf, MiB);
  ZT_OK(zs_aio_file_open(&f, path, ZS_AIO_RDWR | ZS_AIO_CREATE | ZS_AIO_TRUNCATE));
  ZT_OK(zs_aio_write(h, f, buf, MiB, 0));
  /* Reading past the end of the file. */
  ZT_ERR(zs_aio_read(h, f, back, 4096, MiB), ZS_EOF);
  ZT_CHECKF(strstr(zs_last_error(), "end of the file") != NULL, "%s",
            zs_last_error());
  ZT_ERR(zs_aio_read(h, f, back, MiB, 1000), ZS_EOF); /* crosses the end */
  ZT_CHECK(memcmp(back, buf + 1000, MiB - 1000) == 0); /* the bytes before */
  /* Writing through a file opened read-only. */
  ZT_OK(zs_aio_file_open(&ro, path, ZS_AIO_READ));
  a = zs_aio_pwrite(h, ro, buf, 64 * KiB, 0);
  ZT_CHECK(a > 0);
  {
    int rc = zs_aio_wait(h, a);
    ZT_CHECKF(rc == ZS_EBADF || rc == ZS_EACCES || rc == ZS_EPERM,
              "write to read-only file: %s", zs_err_name(rc));
    ZT_CHECK(strstr(zs_last_error(), "write of") != NULL);
  }
  ZT_OK(zs_aio_file_close(ro));
  /* Opening a missing file by path fails at once. */
  ZT_ERR((int)zs_aio_pread_path(h, missing, back, 10, 0), ZS_ENOENT);
  /* The third piece submitted fails; only its request reports it. One
   * piece in flight keeps the submission order deterministic. */
  {
    /* Its own file object: with IOCP a file serves one handle. */
    zs_aio *h1;
    zs_aio_file *f1;
    cfg.queue_depth = 1;
    ZT_OK(zs_aio_create(&h1, &cfg));
    ZT_OK(zs_aio_file_open(&f1, path, ZS_AIO_RDWR));
    ZT_OK(zs_fault_set("aio.submit", 3, 1, ZS_EIO));
    a = zs_aio_pwrite(h1, f1, buf, 128 * KiB, 0); /* pieces 1, 2 */
    b = zs_aio_pwrite(h1, f1, buf + 128 * KiB, 128 * KiB, 128 * KiB); /* 3, 4 */
    c = zs_aio_pwrite(h1, f1, buf + 256 * KiB, 64 * KiB, 256 * KiB);
    ZT_CHECK(a > 0 && b > 0 && c > 0);
    ZT_OK(zs_aio_wait(h1, a));
    ZT_ERR(zs_aio_wait(h1, b), ZS_EIO);
    ZT_CHECKF(strstr(zs_last_error(), "aio.submit") != NULL, "%s",
              zs_last_error());
    ZT_OK(zs_aio_wait(h1, c));
    zs_aio_destroy(h1);
    ZT_OK(zs_aio_file_close(f1));
  }
  /* A device error on completion, with the fix in the message. */
  ZT_OK(zs_fault_set("aio.io", 1, 1, ZS_ENOSPC));
  ZT_ERR(zs_aio_write(h, f, buf, 64 * KiB, 0), ZS_ENOSPC);
  ZT_CHECK(strstr(zs_last_error(), "free space") != NULL);
  /* wait_all reports the first failure but collects every request. */
  ZT_OK(zs_fault_set("aio.io", 2, 1, ZS_EIO));
  ZT_CHECK(zs_aio_pread(h, f, back, 64 * KiB, 0) > 0);
  ZT_CHECK(zs_aio_pread(h, f, back + 64 * KiB, 64 * KiB, 64 * KiB) > 0);
  ZT_CHECK(zs_aio_pread(h, f, back + 128 * KiB, 64 * KiB, 128 * KiB) > 0);
  ZT_CHECK(zs_aio_wait_all(h) == ZS_EIO);
  ZT_CHECK(zs_aio_pending(h) == 0);
  zs_fault_clear();
  /* No memory for a bounce buffer (misaligned memory on a direct file). */
  if (zs_aio_file_direct(f)) {
    ZT_OK(zs_fault_set("aio.bounce", 1, 1, ZS_ENOMEM));
    ZT_ERR(zs_aio_read(h, f, back + 1, 64 * KiB, 0), ZS_ENOMEM);
    ZT_CHECK(strstr(zs_last_error(), "bounce") != NULL);
    zs_fault_clear();
  }
  /* Short transfers are continued until complete. */
  zs_aio_stats_reset(h);
  ZT_OK(zs_fault_set("aio.short", 1, 40, ZS_EIO));
  memset(back, 0, MiB);
  ZT_OK(zs_aio_read(h, f, back, MiB, 0));
  zs_fault_clear();
  ZT_CHECK(memcmp(back, buf, MiB) == 0);
  zs_aio_stats_get(h, &st);
  ZT_CHECK(st.short_continued > 0);
  /* And after all that the handle still works. */
  memset(back, 0, MiB);
  ZT_OK(zs_aio_read(h, f, back, MiB, 0));
  ZT_CHECK(memcmp(back, buf, MiB) == 0);
  zs_aio_stats_get(h, &st);
  ZT_ERR((int)zs_aio_pread(h, f, NULL, 10, 0), ZS_EINVAL);
  ZT_ERR((int)zs_aio_pread(h, f, back, -1, 0), ZS_EINVAL);
  ZT_ERR(zs_aio_wait(h, 999999), ZS_EINVAL);
  if (strcmp(zs_aio_backend(h), "iocp") == 0) {
    /* f is bound to h's completion port: other handles must refuse it. */
    zs_aio *h2;
    ZT_OK(zs_aio_create(&h2, &cfg));
    ZT_ERR((int)zs_aio_pread(h2, f, back, 4096, 0), ZS_EBUSY);
    zs_aio_destroy(h2);
    cfg.backend = ZS_AIO_BACKEND_THREADS;
    ZT_OK(zs_aio_create(&h2, &cfg));
    ZT_ERR((int)zs_aio_pread(h2, f, back, 4096, 0), ZS_EBUSY);
    ZT_CHECK(strstr(zs_last_error(), "open the file again") != NULL);
    zs_aio_destroy(h2);
  }
  ZT_OK(zs_aio_file_close(f));
  zs_aio_destroy(h);
  zt_rmtree(dir);
out:
  free(buf);
  free(back);
}

/* Requests by path (DeepSpeed's API): files opened and closed per request,
 * a write creates the file without truncating it. */
static void by_path(void) {
  char dir[512], path[600];
  unsigned char *buf = malloc(300 * KiB), *back = malloc(300 * KiB);
  zs_aio *h;
  int64_t id, n;
  ZT_CHECK(buf && back);
  if (!make_handle(&h, NULL)) goto out;
  snprintf(dir, sizeof dir, "%s", zt_tmpdir());
  zt_path_in(path, sizeof path, dir, "p.bin");
  fill_random(buf, 300 * KiB);
  id = zs_aio_pwrite_path(h, path, buf, 200 * KiB, 0);
  ZT_CHECK(id > 0);
  ZT_OK(zs_aio_wait(h, id));
  id = zs_aio_pwrite_path(h, path, buf + 200 * KiB, 100 * KiB, 200 * KiB);
  ZT_CHECK(id > 0 && zs_aio_test(h, id) >= 0);
  ZT_OK(zs_aio_wait(h, id));
  id = zs_aio_pread_path(h, path, back, 300 * KiB, 0);
  ZT_CHECK(id > 0);
  n = zs_aio_wait_all(h);
  ZT_CHECKF(n == 1, "wait_all: %lld: %s", (long long)n, zs_last_error());
  ZT_CHECK(memcmp(back, buf, 300 * KiB) == 0);
  ZT_CHECK(zs_aio_pwrite_path(h, path, buf, 0, 0) > 0); /* empty request */
  ZT_CHECK(zs_aio_wait_all(h) == 1);
  zs_aio_destroy(h);
  zt_rmtree(dir);
out:
  free(buf);
  free(back);
}

typedef struct {
  zs_aio *h;
  zs_aio_file *f;
  int idx, bad;
} worker_arg;

/* Each thread writes and reads back its own region of a shared file. */
static void worker(void *p) {
  worker_arg *a = p;
  size_t len = 256 * KiB + (size_t)a->idx * 100, i;
  unsigned char *w = malloc(len), *r = malloc(len);
  int round;
  if (!w || !r) {
    a->bad = 1;
    free(w);
    free(r);
    return;
  }
  for (round = 0; round < 4; round++) {
    int64_t off = (int64_t)a->idx * MiB + round * 7;
    for (i = 0; i < len; i++) w[i] = (unsigned char)(i * 13 + (size_t)a->idx + (size_t)round);
    if (zs_aio_write(a->h, a->f, w, (int64_t)len, off) != 0 ||
        zs_aio_read(a->h, a->f, r, (int64_t)len, off) != 0 ||
        memcmp(w, r, len) != 0)
      a->bad = 1;
  }
  free(w);
  free(r);
}

static void many_threads_one_handle(void) {
  char dir[512], path[600];
  zs__thread t[4];
  worker_arg a[4];
  zs_aio *h;
  zs_aio_file *f;
  zs_aio_config cfg;
  int i;
  zs_aio_config_init(&cfg);
  cfg.block_size = 32 * KiB;
  cfg.queue_depth = 8;
  cfg.single_submit = 1;
  if (!make_handle(&h, &cfg)) return;
  snprintf(dir, sizeof dir, "%s", zt_tmpdir());
  zt_path_in(path, sizeof path, dir, "t.bin");
  ZT_OK(zs_aio_file_open(&f, path, ZS_AIO_RDWR | ZS_AIO_CREATE | ZS_AIO_TRUNCATE));
  for (i = 0; i < 4; i++) {
    a[i].h = h;
    a[i].f = f;
    a[i].idx = i;
    a[i].bad = 0;
    ZT_OK(zs__thread_create(&t[i], worker, &a[i]));
  }
  for (i = 0; i < 4; i++) ZT_OK(zs__thread_join(&t[i]));
  for (i = 0; i < 4; i++) ZT_CHECKF(!a[i].bad, "thread %d saw wrong data", i);
  ZT_OK(zs_aio_file_close(f));
  zs_aio_destroy(h);
  zt_rmtree(dir);
}

/* Where the file system refuses O_DIRECT (tmpfs before Linux 6.6), the
 * default falls back to buffered I/O and says why; insisting on direct I/O
 * fails clearly. Uses a real tmpfs when it refuses, else the fault hook. */
static void direct_fallback(void) {
  char dir[512], path[600];
  zs_aio_file *f;
  zs_aio *h;
  unsigned char buf[5000], back[5000];
  int injected = 1;
  snprintf(dir, sizeof dir, "%s", zt_tmpdir());
  zt_path_in(path, sizeof path, dir, "fb.bin");
#ifdef __linux__
  {
    char shm[128];
    snprintf(shm, sizeof shm, "/dev/shm/zs_aio_%ld.bin", (long)(zt_rand() % 100000));
    if (zs_aio_file_open(&f, shm, ZS_AIO_RDWR | ZS_AIO_CREATE) == 0) {
      if (!zs_aio_file_direct(f)) {
        injected = 0;
        snprintf(path, sizeof path, "%s", shm);
      }
      zs_aio_file_close(f);
      if (injected) zs__file_remove(shm);
    }
  }
#endif
  if (injected) ZT_OK(zs_fault_set("aio.nodirect", 1, 1, ZS_ENOTSUP));
  ZT_OK(zs_aio_file_open(&f, path, ZS_AIO_RDWR | ZS_AIO_CREATE));
  zs_fault_clear();
  ZT_CHECK(!zs_aio_file_direct(f) && zs_aio_file_alignment(f) == 1);
  ZT_CHECKF(strstr(zs_aio_file_why(f), "refuses direct") != NULL, "%s",
            zs_aio_file_why(f));
  if (!make_handle(&h, NULL)) {
    zs_aio_file_close(f);
    zs__file_remove(path);
    zt_rmtree(dir);
    return;
  }
  /* Buffered files take any offset and length as a plain piece. */
  fill_random(buf, sizeof buf);
  ZT_OK(zs_aio_write(h, f, buf, sizeof buf, 3));
  ZT_OK(zs_aio_read(h, f, back, sizeof back, 3));
  ZT_CHECK(memcmp(buf, back, sizeof buf) == 0);
  zs_aio_destroy(h);
  ZT_OK(zs_aio_file_close(f));
  if (injected) ZT_OK(zs_fault_set("aio.nodirect", 1, 1, ZS_ENOTSUP));
  ZT_ERR(zs_aio_file_open(&f, path, ZS_AIO_READ | ZS_AIO_DIRECT_REQUIRE),
         ZS_ENOTSUP);
  zs_fault_clear();
  ZT_CHECK(strstr(zs_last_error(), "direct I/O") != NULL);
  /* Buffered on request says so. */
  ZT_OK(zs_aio_file_open(&f, path, ZS_AIO_READ | ZS_AIO_BUFFERED));
  ZT_CHECK(!zs_aio_file_direct(f) && strstr(zs_aio_file_why(f), "requested"));
  ZT_OK(zs_aio_file_close(f));
  ZT_ERR(zs_aio_file_open(&f, path, ZS_AIO_READ | ZS_AIO_BUFFERED |
                                        ZS_AIO_DIRECT_REQUIRE), ZS_EINVAL);
  zs__file_remove(path);
  zt_rmtree(dir);
}

/* Backend availability: one answer and one wording for each backend, the
 * same that zs_aio_backend_resolve gives when the backend is forced. */
static void backend_availability(void) {
  char why[400], small[8];
  int ok;
  ZT_CHECK(zs_aio_backend_available(ZS_AIO_BACKEND_THREADS, why, sizeof why) == 1);
  ZT_CHECK(strncmp(why, "available", 9) == 0);
  ok = zs_aio_backend_available(ZS_AIO_BACKEND_IOCP, why, sizeof why);
#ifdef _WIN32
  ZT_CHECK(ok == 1 && strncmp(why, "available", 9) == 0);
#else
  ZT_CHECK(ok == 0 && strcmp(why, "Windows only") == 0);
#endif
  ok = zs_aio_backend_available(ZS_AIO_BACKEND_IO_URING, why, sizeof why);
  ZT_CHECK(ok == 0 || ok == 1);
  ZT_CHECK(why[0] != '\0');
  {
    /* Forcing io_uring succeeds exactly when it is available, and a refusal
     * quotes the same reason. */
    char rwhy[400];
    int b = zs_aio_backend_resolve(ZS_AIO_BACKEND_IO_URING, rwhy, sizeof rwhy);
    if (ok) {
      ZT_CHECK(b == ZS_AIO_BACKEND_IO_URING && strstr(rwhy, why) != NULL);
    } else {
      ZT_CHECK(b == ZS_ENOTSUP && strstr(zs_last_error(), why) != NULL);
    }
  }
  /* A NULL or short why buffer is fine: the answer does not change. */
  ZT_CHECK(zs_aio_backend_available(ZS_AIO_BACKEND_IO_URING, NULL, 0) == ok);
  ZT_CHECK(zs_aio_backend_available(ZS_AIO_BACKEND_THREADS, small, sizeof small) == 1);
  ZT_CHECK(strlen(small) == sizeof small - 1);
  ZT_ERR(zs_aio_backend_available(ZS_AIO_BACKEND_AUTO, why, sizeof why), ZS_EINVAL);
  ZT_ERR(zs_aio_backend_available(42, why, sizeof why), ZS_EINVAL);
}

/* The completion counter moves once per completed request (also failed and
 * empty ones), never when a request is collected, and
 * zs_aio_wait_completion returns only after a completion. */
static void completion_counter(void) {
  char dir[512], path[600];
  const size_t len = 4 * (size_t)MiB + 123;
  unsigned char *buf = malloc(len);
  zs_aio *h = NULL;
  zs_aio_file *f = NULL;
  uint64_t c0;
  int64_t id;
  ZT_CHECK(buf != NULL);
  ZT_CHECK(zs_aio_completions(NULL) == 0);
  zs_aio_wait_completion(NULL, 0); /* ignored */
  snprintf(dir, sizeof dir, "%s", zt_tmpdir());
  if (!make_handle(&h, NULL)) goto out;
  zt_path_in(path, sizeof path, dir, "c.bin");
  fill_random(buf, len);
  ZT_OK(zs_aio_file_open(&f, path, ZS_AIO_RDWR | ZS_AIO_CREATE | ZS_AIO_TRUNCATE));
  c0 = zs_aio_completions(h);
  ZT_CHECK(c0 == 0);
  id = zs_aio_pwrite(h, f, buf, (int64_t)len, 0);
  ZT_CHECK(id > 0);
  zs_aio_wait_completion(h, c0);
  ZT_CHECK(zs_aio_test(h, id) == 1);
  ZT_CHECK(zs_aio_completions(h) == c0 + 1);
  ZT_OK(zs_aio_wait(h, id));
  ZT_CHECK(zs_aio_completions(h) == c0 + 1);
  /* Empty requests complete at submission. */
  id = zs_aio_pread(h, f, buf, 0, 0);
  ZT_CHECK(id > 0);
  ZT_CHECK(zs_aio_completions(h) == c0 + 2);
  zs_aio_wait_completion(h, c0 + 1); /* returns at once */
  ZT_OK(zs_aio_wait(h, id));
  /* A failed request (a read past the end of the file) counts too. */
  id = zs_aio_pread(h, f, buf, (int64_t)len, 1);
  ZT_CHECK(id > 0);
  zs_aio_wait_completion(h, c0 + 2);
  ZT_CHECK(zs_aio_completions(h) == c0 + 3);
  ZT_ERR(zs_aio_wait(h, id), ZS_EOF);
out:
  if (f) zs_aio_file_close(f);
  zs_aio_destroy(h);
  free(buf);
  zt_rmtree(dir);
}

ZT_MAIN(ZT_CASE(backend_choice), ZT_CASE(roundtrip_random),
        ZT_CASE(random_reads_verified), ZT_CASE(direct_alignment_rules),
        ZT_CASE(large_file_reused_buffers), ZT_CASE(errors_per_request),
        ZT_CASE(by_path), ZT_CASE(many_threads_one_handle),
        ZT_CASE(direct_fallback), ZT_CASE(backend_availability),
        ZT_CASE(completion_counter))
