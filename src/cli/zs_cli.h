/* zs_cli.h - the native command's subcommand table. An area that adds a
 * subcommand declares its function here and appends an entry to
 * ZS_CLI_EXTRA_COMMANDS (e.g. "bench" in bench.c). */
#ifndef ZS_CLI_H
#define ZS_CLI_H

#include "zspeed/zspeed.h"

typedef struct {
  const char *name;
  const char *help;
  int (*run)(int argc, char **argv); /* argv after the command name */
} zs_cli_command;

/* `zspeed bench <name> ...` (bench.c); one entry per benchmark there. */
int zs_cli_bench(int argc, char **argv);
int zs_bench_adam(int argc, char **argv);   /* bench_adam.c */
int zs_cli_bench_io(int argc, char **argv); /* bench_io.c */

#define ZS_CLI_EXTRA_COMMANDS \
  {"bench", "run a benchmark: bench adam | io ... (bench --help lists them)", \
   zs_cli_bench}

#endif
