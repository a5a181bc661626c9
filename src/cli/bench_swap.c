/* bench_swap.c - `zspeed bench swap`: the NVMe optimizer step against its
 * bound, all measured in one run on one file:
 *
 *   disk    bytes a step moves (every partition's active slot read, its
 *           inactive slot written), moved by a plain aio pass over the swap
 *           file itself (zs_swap_io_pass: the same blocks, written one
 *           step earlier, as the step reads and writes), with every write
 *           and ZS__BSW_RSLOTS reads of 16 MiB (256 MiB) in flight -> GB/s
 *   RAM     the same optimizer step on the same partitions with the state
 *           in RAM (what CPU offload does) -> seconds
 *   swap    zs_swap_step -> seconds, with its compute / read-wait /
 *           write-wait split
 *
 * bound = max(bytes_moved / disk GB/s, RAM step); the report is the median
 * over rounds of swap step / that round's bound (1.00 = the pipeline hides
 * the smaller side completely). Every round measures disk and swap step
 * next to each other, in alternating order (disk first in odd rounds, step
 * first in even ones), so a disk whose speed drifts within a run (a virtual
 * disk's burst budget or host cache running out, another job's I/O) slows
 * the bound and the step alike and favours neither. See bench/RESULTS.md,
 * "Development VM, repeated runs", for why this matters. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_cli.h"
#include "zs_internal.h"
#include "zspeed/aio.h"
#include "zspeed/optim.h"
#include "zspeed/swap.h"

typedef struct {
  const char *folder, *backend, *state;
  int64_t params, part, block;
  int qd, buffers, steps, threads, json, bf16_grads, out;
} zs__bsw_opts;

static void bsw_usage(FILE *out) {
  fprintf(out,
          "usage: zspeed bench swap [options]\n\n"
          "  --folder DIR        where the swap file goes (default .)\n"
          "  --params N          parameters in total (default 2^26; 2^k ok)\n"
          "  --partition N       elements per partition (default 2^22)\n"
          "  --state f32|bf16|q8 optimizer state dtype (default f32)\n"
          "  --grads bf16|f32    gradient dtype (default bf16)\n"
          "  --no-out            no bf16 copy of the updated weights\n"
          "  --buffers N         pinned buffers (default 4)\n"
          "  --steps N           timed steps (default 5; median reported)\n"
          "  --threads N         compute threads incl. caller (default all)\n"
          "  --backend auto|io_uring|threads|iocp (default auto)\n"
          "  --block-size N      aio block size (default 4M)\n"
          "  --queue-depth N     aio queue depth (default 32)\n"
          "  --json              one JSON object\n");
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Reads in flight in the disk pass, each into its own chunk of memory: 16
 * x 16 MiB keeps far more bytes queued than the step itself (its
 * buffer_count partitions) while staying a modest pinned allocation. */
#define ZS__BSW_RSLOTS 16

/* One I/O-only pass over the swap file (see zs_swap_io_pass); seconds,
 * or < 0 on error. */
static double disk_pass(zs_swap *sw, void *rbuf, void *wbuf, int64_t chunk,
                        int reads, int writes) {
  uint64_t ns = 0;
  if (zs_swap_io_pass(sw, rbuf, ZS__BSW_RSLOTS, wbuf, chunk, reads, writes,
                       &ns) < 0)
    return -1;
  return (double)ns / 1e9;
}

/* The in-RAM state of every partition, stepped with the same kernel. */
typedef struct {
  float *p;
  void *m, *v;
  float *ms, *vs;
} ram_state;

static int ram_step(const zs__bsw_opts *o, int sd, ram_state *r,
                    void *const *grads, void *const *outs, const uint64_t *sz,
                    int nparts, int64_t step) {
  zs_adam_config c;
  size_t es = sd == ZS_DTYPE_F32 ? 4 : sd == ZS_DTYPE_BF16 ? 2 : 1;
  int i, rc = 0;
  zs_adam_config_init(&c);
  c.step = step;
  c.weight_decay = 0.01;
  c.num_threads = o->threads;
  for (i = 0; i < nparts && rc == 0; i++) {
    zs_optim_tensors t;
    size_t off = (size_t)i * (size_t)o->part;
    zs_optim_tensors_init(&t);
    t.n = sz[i];
    t.param = r->p + off;
    t.grad = grads[i];
    t.grad_dtype = o->bf16_grads ? ZS_DTYPE_BF16 : ZS_DTYPE_F32;
    t.m = (char *)r->m + off * es;
    t.v = (char *)r->v + off * es;
    t.state_dtype = sd;
    if (sd == ZS_DTYPE_Q8) {
      t.m_scale = r->ms + off / ZS_OPTIM_QBLOCK;
      t.v_scale = r->vs + off / ZS_OPTIM_QBLOCK;
    }
    if (outs) t.out = outs[i], t.out_dtype = ZS_DTYPE_BF16;
    rc = zs_adam_step(&c, &t);
  }
  return rc;
}

static int bsw_run(const zs__bsw_opts *o) {
  int sd = !strcmp(o->state, "bf16") ? ZS_DTYPE_BF16
           : !strcmp(o->state, "q8") ? ZS_DTYPE_Q8 : ZS_DTYPE_F32;
  int nparts = (int)((o->params + o->part - 1) / o->part), i, rc = 0, s;
  size_t gsz = o->bf16_grads ? 2 : 4, es = sd == ZS_DTYPE_F32 ? 4 : sd == ZS_DTYPE_BF16 ? 2 : 1;
  uint64_t *sz = calloc((size_t)nparts, sizeof *sz);
  void **grads = calloc((size_t)nparts, sizeof *grads);
  void **outs = calloc((size_t)nparts, sizeof *outs);
  double *tswap = calloc((size_t)o->steps, sizeof(double));
  double *tram = calloc((size_t)o->steps, sizeof(double));
  double *traw = calloc((size_t)o->steps, sizeof(double));
  double *tio = calloc((size_t)o->steps, sizeof(double));
  double *ratio = calloc((size_t)o->steps, sizeof(double));
  zs_swap_stats *sts = calloc((size_t)o->steps, sizeof *sts);
  size_t n = (size_t)o->params, qb = zs_optim_qblocks(n) + (size_t)nparts;
  ram_state r = {malloc(n * 4), calloc(n, es), calloc(n, es), calloc(qb, 4),
                 calloc(qb, 4)};
  char *gmem = malloc(n * gsz), *omem = malloc(n * 2);
  zs_swap_config c;
  zs_aio_config ac;
  zs_swap *sw = NULL;
  zs_swap_stats st_med;
  zs_swap_step_args a;
  void *rbuf = NULL, *wbuf = NULL;
  int64_t chunk = 16 << 20, bytes_step;
  double t_r = 0, t_w = 0, gbs_rw, ratio_med, gbs_r, gbs_w, swap_med, ram_med;
  double io_bound, bound, best_gap = 1e300;
  const char *what = "out of memory";
  if (!sz || !grads || !outs || !tswap || !tram || !traw || !tio || !ratio || !sts || !r.p || !r.m || !r.v ||
      !r.ms || !r.vs || !gmem || !omem)
    goto fail;
  /* Deterministic, bounded data: weights and gradients in [-1, 1]. */
  for (i = 0; i < nparts; i++) {
    size_t k, b = (size_t)i * (size_t)o->part;
    sz[i] = (uint64_t)ZS_MIN(o->part, o->params - (int64_t)b);
    grads[i] = gmem + b * gsz;
    outs[i] = o->out ? omem + b * 2 : NULL;
    for (k = 0; k < sz[i]; k++) {
      float x = (float)(((b + k) * 2654435761u) % 2001) / 1000.0f - 1.0f;
      r.p[b + k] = x;
      if (o->bf16_grads) {
        uint32_t u;
        float g = x * 0.01f;
        memcpy(&u, &g, 4);
        ((uint16_t *)gmem)[b + k] = (uint16_t)(u >> 16);
      } else {
        ((float *)gmem)[b + k] = x * 0.01f;
      }
    }
  }
  zs_aio_config_init(&ac);
  ac.block_size = o->block;
  ac.queue_depth = o->qd;
  if (o->backend && !strcmp(o->backend, "io_uring")) ac.backend = ZS_AIO_BACKEND_IO_URING;
  if (o->backend && !strcmp(o->backend, "threads")) ac.backend = ZS_AIO_BACKEND_THREADS;
  if (o->backend && !strcmp(o->backend, "iocp")) ac.backend = ZS_AIO_BACKEND_IOCP;
  zs_swap_config_init(&c);
  c.path = o->folder;
  c.name = "zspeed_bench_swap";
  c.overwrite = 1;
  c.partitions = nparts;
  c.sizes = sz;
  c.buffer_count = o->buffers;
  c.state_dtype = sd;
  c.weight_decay = 0.01;
  c.num_threads = o->threads;
  c.aio = &ac;
  what = "creating the swapper";
  if ((rc = zs_swap_create(&sw, &c)) < 0) goto fail;
  bytes_step = zs_swap_file_bytes(sw) / 2;
  if (!o->json)
    printf("zspeed bench swap: %lld params in %d partitions, %s state, %s grads, "
           "%d buffers%s\n  file %s (%.2f GiB), backend %s, %s\n",
           (long long)o->params, nparts, o->state, o->bf16_grads ? "bf16" : "f32",
           o->buffers, zs_swap_buffers_locked(sw) ? " (page-locked)" : " (not locked)",
           zs_swap_file_path(sw), (double)zs_swap_file_bytes(sw) / (1 << 30),
           zs_swap_backend(sw), zs_swap_direct_why(sw));
  what = "allocating the disk pass buffers";
  if ((rc = zs_alloc_pinned(&rbuf, (size_t)chunk * ZS__BSW_RSLOTS,
                            ZS_PIN_FALLBACK, NULL)) < 0 ||
      (rc = zs_alloc_pinned(&wbuf, (size_t)chunk, ZS_PIN_FALLBACK, NULL)) < 0)
    goto fail;
  memset(wbuf, 0x3C, (size_t)chunk);
  /* State: weights as above, zero moments, in RAM and on disk. */
  what = "initializing partitions";
  for (i = 0; i < nparts; i++)
    if ((rc = zs_swap_init_partition(sw, i, r.p + (size_t)i * (size_t)o->part)) < 0)
      goto fail;
  zs_swap_step_args_init(&a);
  a.grads = (const void *const *)grads;
  a.grad_dtype = o->bf16_grads ? ZS_DTYPE_BF16 : ZS_DTYPE_F32;
  a.outs = o->out ? outs : NULL;
  a.out_dtype = ZS_DTYPE_BF16;
  what = "stepping";
  /* One untimed step each (page faults, pool start); after it both slots
   * of every partition hold written data, so no pass below reads
   * never-written (preallocated) blocks, which return zeros without
   * touching the device. */
  if ((rc = zs_swap_step(sw, &a)) < 0) goto fail;
  if ((rc = ram_step(o, sd, &r, grads, o->out ? outs : NULL, sz, nparts, 1)) < 0)
    goto fail;
  what = "measuring the disk";
  t_r = disk_pass(sw, rbuf, wbuf, chunk, 1, 0);
  t_w = t_r < 0 ? -1 : disk_pass(sw, rbuf, wbuf, chunk, 0, 1);
  if (t_r < 0 || t_w < 0) goto fail_io;
  what = "stepping";
  memset(&st_med, 0, sizeof st_med);
  for (s = 0; s < o->steps; s++) {
    uint64_t t0;
    int k;
    /* Disk pass and swap step next to each other, in alternating order. */
    for (k = 0; k < 2; k++) {
      if (k == s % 2) {
        tio[s] = disk_pass(sw, rbuf, wbuf, chunk, 1, 1);
        if (tio[s] < 0) goto fail_io;
      } else {
        t0 = zs__now_ns();
        zs_swap_stats_reset(sw);
        if ((rc = zs_swap_step(sw, &a)) < 0) goto fail;
        tswap[s] = (double)(zs__now_ns() - t0) / 1e9;
        zs_swap_stats_get(sw, &sts[s]);
      }
    }
    t0 = zs__now_ns();
    if ((rc = ram_step(o, sd, &r, grads, o->out ? outs : NULL, sz, nparts, s + 2)) < 0)
      goto fail;
    tram[s] = (double)(zs__now_ns() - t0) / 1e9;
    ratio[s] = tswap[s] / ZS_MAX(tio[s], tram[s]);
    if (!o->json)
      printf("  round %d (%s): disk %.3f s, RAM %.3f s, swap %.3f s (compute %.3f, "
             "read wait %.3f, write wait %.3f) -> %.3fx\n", s + 1,
             s % 2 ? "step first" : "disk first", tio[s], tram[s],
             tswap[s], (double)sts[s].compute_ns / 1e9,
             (double)sts[s].read_wait_ns / 1e9, (double)sts[s].write_wait_ns / 1e9,
             ratio[s]);
    traw[s] = tswap[s];
  }
  swap_med = median(tswap, o->steps);
  /* Report the split of the step closest to the median. */
  for (s = 0; s < o->steps; s++) {
    double gap = (traw[s] - swap_med) * (traw[s] - swap_med);
    if (gap < best_gap) best_gap = gap, st_med = sts[s];
  }
  ram_med = median(tram, o->steps);
  io_bound = median(tio, o->steps);
  ratio_med = median(ratio, o->steps);
  gbs_rw = 2.0 * (double)bytes_step / io_bound / 1e9;
  gbs_r = (double)bytes_step / t_r / 1e9;
  gbs_w = (double)bytes_step / t_w / 1e9;
  bound = ZS_MAX(io_bound, ram_med);
  if (o->json)
    printf("{\"params\": %lld, \"partitions\": %d, \"state\": \"%s\", "
           "\"bytes_per_step\": %lld, \"disk_gbps_rw\": %.4f, \"disk_gbps_read\": "
           "%.4f, \"disk_gbps_write\": %.4f, \"io_bound_s\": %.4f, \"ram_step_s\": "
           "%.4f, \"swap_step_s\": %.4f, \"bound_s\": %.4f, \"ratio\": %.4f, "
           "\"ratio_of_medians\": %.4f, "
           "\"compute_s\": %.4f, \"read_wait_s\": %.4f, \"write_wait_s\": %.4f, "
           "\"backend\": \"%s\", \"direct\": %d, \"buffers\": %d, \"locked\": %d}\n",
           (long long)o->params, nparts, o->state, (long long)(2 * bytes_step),
           gbs_rw, gbs_r, gbs_w, io_bound, ram_med, swap_med, bound, ratio_med,
           swap_med / bound,
           (double)st_med.compute_ns / 1e9, (double)st_med.read_wait_ns / 1e9,
           (double)st_med.write_wait_ns / 1e9, zs_swap_backend(sw), zs_swap_direct(sw),
           o->buffers, zs_swap_buffers_locked(sw));
  else
    printf("  disk: %.3f GB/s read+write together (alone: read %.3f, write %.3f)\n"
           "  bytes per step %.3f GB -> I/O bound %.3f s (median); RAM step %.3f s\n"
           "  swap step median %.3f s; median ratio to max(I/O, RAM) %.3fx "
           "(ratio of medians %.3fx)\n  %s bounds the step\n",
           gbs_rw, gbs_r, gbs_w, 2.0 * (double)bytes_step / 1e9, io_bound,
           ram_med, swap_med, ratio_med, swap_med / bound,
           io_bound > ram_med ? "the disk" : "the CPU");
  rc = 0;
  goto done;
fail_io:
  rc = ZS_EIO;
fail:
  fprintf(stderr, "zspeed bench swap: %s: %s\n", what,
          rc ? zs_last_error() : "out of memory");
  if (!rc) rc = ZS_ENOMEM;
done:
  if (rbuf) zs_free_pinned(rbuf, (size_t)chunk * ZS__BSW_RSLOTS);
  if (wbuf) zs_free_pinned(wbuf, (size_t)chunk);
  zs_swap_destroy(sw);
  free(sz), free(grads), free(outs), free(tswap), free(tram), free(traw), free(sts), free(tio), free(ratio);
  free(r.p), free(r.m), free(r.v), free(r.ms), free(r.vs), free(gmem), free(omem);
  return rc ? 1 : 0;
}

#define BSW "zspeed bench swap"

int zs_cli_bench_swap(int argc, char **argv) {
  zs__bsw_opts o;
  int i;
  memset(&o, 0, sizeof o);
  o.folder = ".";
  o.state = "f32";
  o.params = (int64_t)1 << 26;
  o.part = (int64_t)1 << 22;
  o.block = 4 << 20;
  o.qd = 32;
  o.buffers = 4;
  o.steps = 5;
  o.bf16_grads = 1;
  o.out = 1;
  for (i = 0; i < argc; i++) {
    const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0, num = 0;
    if (!strcmp(k, "-h") || !strcmp(k, "--help")) {
      bsw_usage(stdout);
      return 0;
    }
    if (!strcmp(k, "--json")) { o.json = 1; continue; }
    if (!strcmp(k, "--no-out")) { o.out = 0; continue; }
    if (!v) {
      fprintf(stderr, "zspeed bench swap: %s is unknown or needs a value (see --help)\n", k);
      return 2;
    }
    i++;
    if (!strcmp(k, "--folder")) o.folder = v;
    else if (!strcmp(k, "--backend")) o.backend = v;
    else if (!strcmp(k, "--state")) {
      o.state = v;
      bad = strcmp(v, "f32") && strcmp(v, "bf16") && strcmp(v, "q8");
    } else if (!strcmp(k, "--grads")) {
      o.bf16_grads = !strcmp(v, "bf16");
      bad = strcmp(v, "bf16") && strcmp(v, "f32");
    } else if (!strcmp(k, "--params")) num = zs_cli_size_opt(BSW, k, v, 1, (int64_t)1 << 40, &o.params);
    else if (!strcmp(k, "--partition")) num = zs_cli_size_opt(BSW, k, v, 1, (int64_t)1 << 40, &o.part);
    else if (!strcmp(k, "--block-size")) num = zs_cli_size_opt(BSW, k, v, 1, (int64_t)1 << 30, &o.block);
    else if (!strcmp(k, "--queue-depth")) num = zs_cli_int_opt(BSW, k, v, 1, 4096, &o.qd);
    else if (!strcmp(k, "--buffers")) num = zs_cli_int_opt(BSW, k, v, 1, 64, &o.buffers);
    else if (!strcmp(k, "--steps")) num = zs_cli_int_opt(BSW, k, v, 1, 1000000, &o.steps);
    else if (!strcmp(k, "--threads")) num = zs_cli_int_opt(BSW, k, v, 0, 4096, &o.threads);
    else {
      fprintf(stderr, "zspeed bench swap: unknown option '%s' (see --help)\n", k);
      return 2;
    }
    if (num) return num;
    if (bad) {
      fprintf(stderr, "zspeed bench swap: bad value '%s' for %s\n", v, k);
      return 2;
    }
  }
  /* Partitions start at multiples of the 8-bit block in the RAM copy. */
  o.part = (o.part + ZS_OPTIM_QBLOCK - 1) / ZS_OPTIM_QBLOCK * ZS_OPTIM_QBLOCK;
  if (o.part > o.params) o.part = o.params;
  return bsw_run(&o);
}
