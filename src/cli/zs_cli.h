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

/* Option values, parsed strictly (zs__parse_size / zs__parse_int of
 * src/common): on a bad value these print "<cmd>: OPT 'V' is ..." (what is
 * wrong and the accepted range) to stderr and return 2, the command's exit
 * status; 0 otherwise. */
int zs_cli_size_opt(const char *cmd, const char *opt, const char *value,
                    int64_t lo, int64_t hi, int64_t *out);
int zs_cli_int_opt(const char *cmd, const char *opt, const char *value,
                   int lo, int hi, int *out);

/* `zspeed bench <name> ...` (bench.c); one entry per benchmark there. */
int zs_cli_bench(int argc, char **argv);
int zs_bench_adam(int argc, char **argv);   /* bench_adam.c */
int zs_cli_bench_io(int argc, char **argv); /* bench_io.c */
int zs_cli_bench_swap(int argc, char **argv); /* bench_swap.c */

#define ZS_CLI_EXTRA_COMMANDS \
  {"bench", "run a benchmark: bench adam | io | swap ... (bench --help " \
            "lists them)", \
   zs_cli_bench}

#endif
