/* bench.c - `zspeed bench <name> [options]`: one command whose first
 * argument picks the benchmark from the table below; each area appends its
 * entry. */
#include <stdio.h>
#include <string.h>

#include "zs_cli.h"

static const zs_cli_command benches[] = {
    {"adam", "optimizer step throughput vs a STREAM-like copy", zs_bench_adam},
    {"io", "file read/write throughput of the aio engine (like fio, ds_io)",
     zs_cli_bench_io},
    {"swap", "NVMe optimizer step (zs_swap) vs max(disk, in-RAM step)",
     zs_cli_bench_swap},
};

static void bench_usage(FILE *out) {
  size_t i;
  fprintf(out, "usage: zspeed bench <benchmark> [options]\n\nbenchmarks:\n");
  for (i = 0; i < sizeof benches / sizeof benches[0]; i++)
    fprintf(out, "  %-10s %s\n", benches[i].name, benches[i].help);
  fprintf(out, "\n'zspeed bench <benchmark> --help' for its options.\n");
}

int zs_cli_bench(int argc, char **argv) {
  size_t i;
  if (argc < 1 || strcmp(argv[0], "-h") == 0 || strcmp(argv[0], "--help") == 0) {
    bench_usage(argc < 1 ? stderr : stdout);
    return argc < 1 ? 2 : 0;
  }
  for (i = 0; i < sizeof benches / sizeof benches[0]; i++)
    if (strcmp(benches[i].name, argv[0]) == 0)
      return benches[i].run(argc - 1, argv + 1);
  fprintf(stderr, "zspeed bench: unknown benchmark '%s'\n\n", argv[0]);
  bench_usage(stderr);
  return 2;
}
