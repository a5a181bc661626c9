/* bench_io.c - `zspeed bench io`: sequential read/write throughput of the
 * aio engine on one file, like DeepSpeed's ds_io and fio. Each loop moves
 * the whole file through one reused buffer, submitting every request at
 * once so the engine keeps queue_depth blocks in flight per lane; the
 * result is the median GB/s (10^9 bytes/s) over the loops. Without --file
 * the file is zspeed's own scratch file (DIR/zspeed_bench_io.bin), removed
 * when the command ends: done, failed or interrupted (SIGINT, SIGTERM). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifndef _WIN32
#  include <unistd.h>
#endif

#include "zs_cli.h"
#include "zs_internal.h"
#include "zspeed/aio.h"

typedef struct {
  const char *file, *folder, *backend, *rw, *direct;
  int64_t size, block, buffer;
  int qd, threads, loops, json, single_submit, overlap;
} zs__bio_opts;

static void bio_usage(FILE *out) {
  fprintf(out,
          "usage: zspeed bench io [options]\n\n"
          "  --folder DIR         where the scratch file zspeed_bench_io.bin goes\n"
          "                       (default: the current folder); it is removed\n"
          "                       when the command ends, even on error or Ctrl-C\n"
          "  --file PATH          use PATH instead (created/extended as needed)\n"
          "                       and keep it afterwards\n"
          "  --size N             bytes to move per loop (default 1G; K/M/G)\n"
          "  --block-size N       aio block size (default 1M)\n"
          "  --queue-depth N      blocks in flight per thread (default 32)\n"
          "  --threads N          intra_op_parallelism (default 1)\n"
          "  --buffer N           request/buffer size (default 64M)\n"
          "  --rw read|write|both (default both: write, then read)\n"
          "  --direct auto|on|off (default auto: direct where possible)\n"
          "  --backend auto|io_uring|threads|iocp (default auto)\n"
          "  --loops N            timed loops per direction (default 5)\n"
          "  --single-submit      io_uring: one system call per block\n"
          "  --no-overlap-events  io_uring: reap each batch before the next\n"
          "                       (default: overlap, DeepSpeed's config default)\n"
          "  --json               one JSON object per direction\n");
}

/* The scratch file's path while the signal handlers are in place. */
static char bio_scratch[1024];
static volatile sig_atomic_t bio_stop;

/* SIGINT/SIGTERM while a scratch file exists. POSIX: unlink() and raise()
 * are async-signal-safe, so the handler removes the file and the command dies
 * of the signal at once (a request stuck on a dead disk cannot hold it up;
 * the space comes back when the process's descriptor closes). Windows runs
 * the handler on another thread and cannot delete a file that is open: it
 * sets bio_stop, the loops stop submitting and drain, bio_run closes and
 * removes the file and raises the signal again; a second Ctrl-C ends the
 * command at once. */
static void bio_on_signal(int sig) {
#ifndef _WIN32
  static const char msg[] = "zspeed bench io: interrupted (scratch file removed)\n";
  unlink(bio_scratch);
  if (write(2, msg, sizeof msg - 1) < 0) {
    /* nothing to do: the command is ending */
  }
  signal(sig, SIG_DFL);
  raise(sig);
#else
  bio_stop = sig;
  signal(sig, SIG_DFL);
#endif
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* One timed pass over the file; returns seconds or a negative error. */
static double bio_pass(zs_aio *h, zs_aio_file *f, void *buf,
                       const zs__bio_opts *o, int write, int *err) {
  uint64_t t0 = zs__now_ns();
  int64_t off, rc;
  for (off = 0; off < o->size; off += o->buffer) {
    int64_t len = ZS_MIN(o->buffer, o->size - off);
    if (bio_stop) break;
    rc = write ? zs_aio_pwrite(h, f, buf, len, off) : zs_aio_pread(h, f, buf, len, off);
    if (rc < 0) {
      *err = (int)rc;
      zs_aio_wait_all(h);
      return -1;
    }
  }
  rc = zs_aio_wait_all(h);
  if (rc < 0) {
    *err = (int)rc;
    return -1;
  }
  if (bio_stop) return -1; /* *err stays 0: interrupted */
  return (double)(zs__now_ns() - t0) / 1e9;
}

static int bio_run(zs__bio_opts *o) {
  zs_aio_config cfg;
  zs_aio *h = NULL;
  zs_aio_file *f = NULL;
  void *buf = NULL;
  char path[1024];
  unsigned flags = ZS_AIO_RDWR | ZS_AIO_CREATE;
  int rc, dir, locked = 0, err = 0, ret = 1, scratch = !o->file;
  int caught = 0; /* the scratch file's signal handlers are in place */
  double *gbs = NULL;
  zs_aio_config_init(&cfg);
  cfg.block_size = o->block;
  cfg.queue_depth = o->qd;
  cfg.intra_op_parallelism = o->threads;
  cfg.single_submit = o->single_submit;
  cfg.overlap_events = o->overlap;
  if (!o->backend || strcmp(o->backend, "auto") == 0) cfg.backend = ZS_AIO_BACKEND_AUTO;
  else if (strcmp(o->backend, "io_uring") == 0) cfg.backend = ZS_AIO_BACKEND_IO_URING;
  else if (strcmp(o->backend, "threads") == 0) cfg.backend = ZS_AIO_BACKEND_THREADS;
  else if (strcmp(o->backend, "iocp") == 0) cfg.backend = ZS_AIO_BACKEND_IOCP;
  else {
    fprintf(stderr, "zspeed bench io: unknown backend '%s'\n", o->backend);
    return 2;
  }
  if (strcmp(o->direct, "on") == 0) flags |= ZS_AIO_DIRECT_REQUIRE;
  else if (strcmp(o->direct, "off") == 0) flags |= ZS_AIO_BUFFERED;
  else if (strcmp(o->direct, "auto") != 0) {
    fprintf(stderr, "zspeed bench io: --direct takes auto, on or off\n");
    return 2;
  }
  if (o->file) rc = snprintf(path, sizeof path, "%s", o->file);
  else rc = snprintf(path, sizeof path, "%s/zspeed_bench_io.bin", o->folder ? o->folder : ".");
  if (rc < 0 || (size_t)rc >= sizeof path) { /* never a truncated name */
    fprintf(stderr, "zspeed bench io: the file's path is longer than %d bytes\n",
            (int)sizeof path - 1);
    return 2;
  }
  if ((rc = zs_aio_create(&h, &cfg)) != 0) goto fail;
  if (scratch) {
    snprintf(bio_scratch, sizeof bio_scratch, "%s", path);
    bio_stop = 0;
    signal(SIGINT, bio_on_signal);
    signal(SIGTERM, bio_on_signal);
    caught = 1;
  }
  if ((rc = zs_aio_file_open(&f, path, flags)) != 0) goto fail;
  if ((rc = zs_alloc_pinned(&buf, (size_t)o->buffer, ZS_PIN_FALLBACK, &locked)) != 0)
    goto fail;
  memset(buf, 0x5A, (size_t)o->buffer);
  gbs = calloc((size_t)o->loops, sizeof *gbs);
  if (!gbs) goto fail;
  if (!o->json)
    printf("zspeed bench io: %s, %.2f GiB, block %lld KiB, qd %d, threads %d, "
           "buffer %lld MiB\n  backend %s (%s)\n  file: %s\n  %s\n",
           path, (double)o->size / (double)(1 << 30), (long long)(o->block >> 10),
           o->qd, o->threads, (long long)(o->buffer >> 20), zs_aio_backend(h),
           zs_aio_backend_why(h), zs_aio_file_why(f),
           scratch ? "scratch file: removed when done (--file PATH keeps one)"
                   : "--file: kept when done");
  /* Reading needs the whole file: write it once (untimed) if it is short. */
  if (strcmp(o->rw, "read") == 0 && zs_aio_file_size(f) < o->size) {
    if (bio_pass(h, f, buf, o, 1, &err) < 0) goto fail_err;
  }
  for (dir = 0; dir < 2; dir++) {
    int write = dir == 0, i;
    const char *name = write ? "write" : "read";
    double med;
    if (strcmp(o->rw, "both") != 0 && strcmp(o->rw, name) != 0) continue;
    for (i = 0; i < o->loops; i++) {
      double s = bio_pass(h, f, buf, o, write, &err);
      if (s < 0) goto fail_err;
      gbs[i] = (double)o->size / s / 1e9;
      if (!o->json) printf("  %-5s loop %d: %.3f GB/s\n", name, i + 1, gbs[i]);
    }
    qsort(gbs, (size_t)o->loops, sizeof *gbs, cmp_double);
    med = o->loops % 2 ? gbs[o->loops / 2]
                       : (gbs[o->loops / 2 - 1] + gbs[o->loops / 2]) / 2;
    if (o->json)
      printf("{\"rw\": \"%s\", \"gbps_median\": %.4f, \"gbps_min\": %.4f, "
             "\"gbps_max\": %.4f, \"loops\": %d, \"size\": %lld, \"block_size\": "
             "%lld, \"queue_depth\": %d, \"threads\": %d, \"backend\": \"%s\", "
             "\"direct\": %d}\n", name, med, gbs[0], gbs[o->loops - 1], o->loops,
             (long long)o->size, (long long)o->block, o->qd, o->threads,
             zs_aio_backend(h), zs_aio_file_direct(f));
    else
      printf("%s: median %.3f GB/s (min %.3f, max %.3f) over %d loops\n", name,
             med, gbs[0], gbs[o->loops - 1], o->loops);
  }
  ret = 0;
  goto done;
fail_err:
  rc = err;
  if (!rc) {
    fprintf(stderr, "zspeed bench io: interrupted\n");
    goto done;
  }
fail:
  fprintf(stderr, "zspeed bench io: %s\n", rc ? zs_last_error() : "out of memory");
done:
  free(gbs);
  if (buf) zs_free_pinned(buf, (size_t)o->buffer);
  zs_aio_destroy(h);
  /* Closed before removing: Windows cannot delete a file that is open. An
   * open that failed may still have created the scratch file (O_CREAT, then
   * O_DIRECT refused): it goes too, quietly. */
  if (f) zs_aio_file_close(f);
  if (caught) {
    if (zs__file_remove(path) != 0 && f)
      fprintf(stderr, "zspeed bench io: %s\n", zs_last_error());
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    /* Windows: die of the signal, as the caller (a shell, a script) expects. */
    if (bio_stop) raise(bio_stop);
  }
  return ret;
}

#define BIO "zspeed bench io"

int zs_cli_bench_io(int argc, char **argv) {
  zs__bio_opts o;
  int i;
  memset(&o, 0, sizeof o);
  o.size = (int64_t)1 << 30;
  o.block = 1 << 20;
  o.buffer = 64 << 20;
  o.qd = 32;
  o.threads = 1;
  o.loops = 5;
  o.overlap = 1;
  o.rw = "both";
  o.direct = "auto";
  for (i = 0; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      bio_usage(stdout);
      return 0;
    } else if (strcmp(a, "--json") == 0) {
      o.json = 1;
      continue;
    } else if (strcmp(a, "--single-submit") == 0) {
      o.single_submit = 1;
      continue;
    } else if (strcmp(a, "--no-overlap-events") == 0) {
      o.overlap = 0;
      continue;
    }
    if (!v) {
      fprintf(stderr, "zspeed bench io: %s needs a value\n", a);
      return 2;
    }
    i++;
    if (strcmp(a, "--file") == 0) o.file = v;
    else if (strcmp(a, "--folder") == 0) o.folder = v;
    else if (strcmp(a, "--backend") == 0) o.backend = v;
    else if (strcmp(a, "--rw") == 0) o.rw = v;
    else if (strcmp(a, "--direct") == 0) o.direct = v;
    else if (strcmp(a, "--size") == 0) bad = zs_cli_size_opt(BIO, a, v, 1, INT64_MAX, &o.size);
    else if (strcmp(a, "--block-size") == 0) bad = zs_cli_size_opt(BIO, a, v, 1, (int64_t)1 << 30, &o.block);
    else if (strcmp(a, "--buffer") == 0) bad = zs_cli_size_opt(BIO, a, v, 1, (int64_t)1 << 40, &o.buffer);
    else if (strcmp(a, "--queue-depth") == 0) bad = zs_cli_int_opt(BIO, a, v, 1, 4096, &o.qd);
    else if (strcmp(a, "--threads") == 0) bad = zs_cli_int_opt(BIO, a, v, 1, 256, &o.threads);
    else if (strcmp(a, "--loops") == 0) bad = zs_cli_int_opt(BIO, a, v, 1, 1000000, &o.loops);
    else {
      fprintf(stderr, "zspeed bench io: unknown option '%s' (see --help)\n", a);
      return 2;
    }
    if (bad) return bad;
  }
  if (strcmp(o.rw, "read") && strcmp(o.rw, "write") && strcmp(o.rw, "both")) {
    fprintf(stderr, "zspeed bench io: --rw takes read, write or both\n");
    return 2;
  }
  if (o.buffer > o.size) o.buffer = o.size;
  return bio_run(&o);
}
