/* options.c - the option parsers every `zspeed` subcommand uses: a size
 * (with its K/M/G suffixes) or an int within bounds, or a message naming the
 * command and the option, and exit status 2. Below the commands: they call
 * these, never the reverse. */
#include <stdio.h>

#include "zs_cli.h"
#include "zs_internal.h"

int zs_cli_size_opt(const char *cmd, const char *opt, const char *value,
                    int64_t lo, int64_t hi, int64_t *out) {
  if (zs__parse_size(value, lo, hi, out) == 0) return 0;
  fprintf(stderr, "%s: %s %s\n", cmd, opt, zs_last_error());
  return 2;
}

int zs_cli_int_opt(const char *cmd, const char *opt, const char *value,
                   int lo, int hi, int *out) {
  int64_t v;
  if (zs__parse_int(value, lo, hi, &v) == 0) {
    *out = (int)v;
    return 0;
  }
  fprintf(stderr, "%s: %s %s\n", cmd, opt, zs_last_error());
  return 2;
}
