/* bench_adam.c - `zspeed bench adam`: AdamW step throughput of libzspeed
 * for each state type and the offload case, next to a STREAM-like copy
 * measured in the same process with the same threads, so the achieved
 * bandwidth can be read as a fraction of what the memory system gives. The
 * comparison with torch and DeepSpeed is bench/bench_adam.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_cli.h"
#include "zs_internal.h"
#include "zspeed/optim.h"

typedef struct {
  float *dst;
  const float *src;
} copy_ctx;

static void copy_range(void *ctx, size_t b, size_t e, int worker) {
  copy_ctx *c = ctx;
  (void)worker;
  memcpy(c->dst + b, c->src + b, (e - b) * sizeof(float));
}

typedef struct {
  float *p, *g;
  uint16_t *g16;
} fill_ctx;

/* First touch happens on the threads that will use the pages. */
static void fill_range(void *ctx, size_t b, size_t e, int worker) {
  fill_ctx *c = ctx;
  size_t i;
  (void)worker;
  for (i = b; i < e; i++) {
    uint32_t h = (uint32_t)i * 2654435761u;
    c->p[i] = (float)(h >> 8) * (1.0f / 16777216.0f) - 0.5f;
    c->g[i] = (float)((h >> 4) & 0xffff) * (1.0f / 65536.0f) - 0.5f;
    c->g16[i] = (uint16_t)(0x3c00u + (h & 0x3ffu)); /* bf16 around 0.01 */
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void usage(FILE *out) {
  fprintf(out,
          "usage: zspeed bench adam [--n N] [--threads T] [--steps S]\n\n"
          "Times AdamW steps over N fp32 params (default 2^26) with fp32, "
          "bf16 and 8-bit\nstates, and the offload case (bf16 grads in, bf16 "
          "params out, fp32 states),\nand a STREAM-like parallel copy of N "
          "floats, with T threads (default: all\ncores). Prints the median "
          "of S steps (default 10) after one warm-up,\nand each case's GB/s "
          "as a percent of the copy's.\n");
}

#define BAD "zspeed bench adam"

int zs_bench_adam(int argc, char **argv) {
  size_t n = (size_t)1 << 26;
  int threads = zs_cpu_count(), steps = 10, i, k, rc = 1;
  zs_pool *pool = NULL;
  float *p = NULL, *g = NULL, *m = NULL, *v = NULL, *ms = NULL, *vs = NULL;
  uint16_t *g16 = NULL, *out = NULL;
  double *t = NULL, copy_gbs;
  size_t nb;
  int64_t n64;
  int bad;
  for (i = 0; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else if (i + 1 < argc && !strcmp(argv[i], "--n")) {
      if ((bad = zs_cli_size_opt(BAD, "--n", argv[++i], 1, (int64_t)1 << 40, &n64)))
        return bad;
      n = (size_t)n64;
    } else if (i + 1 < argc && !strcmp(argv[i], "--threads")) {
      if ((bad = zs_cli_int_opt(BAD, "--threads", argv[++i], 1, 4096, &threads)))
        return bad;
    } else if (i + 1 < argc && !strcmp(argv[i], "--steps")) {
      if ((bad = zs_cli_int_opt(BAD, "--steps", argv[++i], 1, 1000000, &steps)))
        return bad;
    } else {
      fprintf(stderr, "zspeed bench adam: unknown option '%s'\n\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  nb = zs_optim_qblocks(n);
  if (zs_pool_create(&pool, threads - 1) != 0 ||
      zs_alloc_aligned((void **)&p, n * 4, 64) != 0 ||
      zs_alloc_aligned((void **)&g, n * 4, 64) != 0 ||
      zs_alloc_aligned((void **)&m, n * 4, 64) != 0 ||
      zs_alloc_aligned((void **)&v, n * 4, 64) != 0 ||
      zs_alloc_aligned((void **)&g16, n * 2, 64) != 0 ||
      zs_alloc_aligned((void **)&out, n * 2, 64) != 0 ||
      zs_alloc_aligned((void **)&ms, nb * 4, 64) != 0 ||
      zs_alloc_aligned((void **)&vs, nb * 4, 64) != 0 ||
      !(t = malloc(sizeof(double) * (size_t)steps))) {
    fprintf(stderr, "zspeed bench adam: %s (n = %zu needs about %zu MiB)\n",
            zs_last_error(), n, n * 20 >> 20);
    goto done;
  }
  {
    fill_ctx f;
    copy_ctx c;
    f.p = p, f.g = g, f.g16 = g16;
    zs_pool_parallel_for(pool, n, 65536, threads, fill_range, &f);
    memset(m, 0, n * 4); /* zero states, touched by the copy below too */
    memset(v, 0, n * 4);
    memset(ms, 0, nb * 4);
    memset(vs, 0, nb * 4);
    c.dst = m, c.src = g;
    for (k = -1; k < steps; k++) {
      uint64_t t0 = zs__now_ns();
      zs_pool_parallel_for(pool, n, 65536, threads, copy_range, &c);
      if (k >= 0) t[k] = (double)(zs__now_ns() - t0) * 1e-9;
    }
    copy_gbs = 8.0 * (double)n / median(t, steps) * 1e-9;
    memset(m, 0, n * 4);
  }
  printf("zspeed bench adam: n=%zu threads=%d steps=%d simd=%s cpu=%s\n", n,
         threads, steps, zs_simd_level() >= 0 ? zs_simd_name(zs_simd_level())
                                              : "unusable",
         zs_cpu_model());
  printf("copy (STREAM-like, 8 B/elem)             %8.2f GB/s\n", copy_gbs);
  printf("%-40s %9s %8s %14s %8s\n", "case", "Gparam/s", "GB/s", "% of copy GB/s",
         "ms/step");
  for (k = 0; k < 4; k++) {
    static const char *names[] = {"adamw fp32 states", "adamw bf16 states",
                                  "adamw int8 states",
                                  "offload bf16 grad in/bf16 out, fp32 st"};
    zs_optim_tensors tt;
    zs_adam_config cfg;
    double bytes, sec;
    int s;
    zs_optim_tensors_init(&tt);
    tt.n = n, tt.param = p, tt.grad = g, tt.m = m, tt.v = v;
    bytes = 28;
    if (k == 1) {
      tt.state_dtype = ZS_DTYPE_BF16;
      bytes = 20;
    } else if (k == 2) {
      tt.state_dtype = ZS_DTYPE_Q8;
      tt.m_scale = ms, tt.v_scale = vs;
      bytes = 16 + 16.0 / ZS_OPTIM_QBLOCK;
    } else if (k == 3) {
      tt.grad = g16, tt.grad_dtype = ZS_DTYPE_BF16;
      tt.out = out, tt.out_dtype = ZS_DTYPE_BF16;
      bytes = 28;
    }
    memset(m, 0, n * 4);
    memset(v, 0, n * 4);
    zs_adam_config_init(&cfg);
    cfg.pool = pool, cfg.num_threads = threads, cfg.weight_decay = 0.01;
    for (s = -1; s < steps; s++) {
      uint64_t t0 = zs__now_ns();
      cfg.step = s + 2;
      if (zs_adam_step(&cfg, &tt) != 0) {
        fprintf(stderr, "zspeed bench adam: %s\n", zs_last_error());
        goto done;
      }
      if (s >= 0) t[s] = (double)(zs__now_ns() - t0) * 1e-9;
    }
    sec = median(t, steps);
    printf("%-40s %9.3f %8.2f %13.1f%% %8.2f\n", names[k], (double)n / sec * 1e-9,
           bytes * (double)n / sec * 1e-9,
           100.0 * bytes * (double)n / sec * 1e-9 / copy_gbs, sec * 1e3);
  }
  printf("GB/s: bytes a step reads and writes per param (fp32 28, bf16 20, "
         "int8 16.06,\n  offload 28) x Gparam/s.\n"
         "%% of copy GB/s: that GB/s as a percent of the copy line's (the "
         "memory bandwidth\n  these threads get). The copy is a yardstick, "
         "not a ceiling: it can pass 100%%,\n  as the copy's stores also "
         "read each line first (write-allocate), which its\n  8 B/elem "
         "(read + write) leave out.\n");
  rc = 0;
done:
  zs_free_aligned(p), zs_free_aligned(g), zs_free_aligned(m);
  zs_free_aligned(v), zs_free_aligned(g16), zs_free_aligned(out);
  zs_free_aligned(ms), zs_free_aligned(vs);
  free(t);
  if (pool) zs_pool_destroy(pool);
  return rc;
}
