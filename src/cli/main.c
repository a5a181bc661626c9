/* main.c - the native `zspeed` command. Subcommands are looked up in one
 * table: report is here, bench (adam, io, swap) in bench.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_cli.h"

static int cmd_report(int argc, char **argv) {
  unsigned flags = 0;
  int i;
  int64_t need;
  char *buf;
  for (i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) {
      flags |= ZS_REPORT_JSON;
    } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      printf("usage: zspeed report [--json]\n\n"
             "Prints what zspeed sees on this machine: build, OS, CPU and "
             "SIMD level,\nmemory and page-lock limit, I/O backends (and why "
             "one is unavailable),\nand whether a CUDA driver can be "
             "loaded. Exits with status 1, after the whole\nreport, when "
             "ZSPEED_SIMD or ZSPEED_AIO_BACKEND asks for something that is "
             "refused.\n");
      return 0;
    } else {
      fprintf(stderr, "zspeed report: unknown option '%s' (try --json)\n",
              argv[i]);
      return 2;
    }
  }
  need = zs_report(NULL, 0, flags);
  if (need < 0) {
    fprintf(stderr, "zspeed report: %s\n", zs_last_error());
    return 1;
  }
  buf = malloc((size_t)need + 1);
  if (!buf) return 1;
  zs_report(buf, (size_t)need + 1, flags);
  fputs(buf, stdout);
  free(buf);
  /* The whole report is out; a choice the environment forces but the
   * library refuses makes the status 1, so scripts can rely on it. */
  {
    char problems[1200], *line, *next;
    int n = zs_report_problems(problems, sizeof problems);
    if (n > 0) {
      fflush(stdout);
      fprintf(stderr, "zspeed report: %d problem%s with this environment:\n",
              n, n == 1 ? "" : "s");
      for (line = problems; line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        fprintf(stderr, "  %s\n", line);
      }
      return 1;
    }
  }
  return 0;
}

static const zs_cli_command commands[] = {
    {"report", "print the environment report (--json for JSON)", cmd_report},
    ZS_CLI_EXTRA_COMMANDS};

static void usage(FILE *out) {
  size_t i;
  fprintf(out, "usage: zspeed <command> [options]\n\ncommands:\n");
  for (i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (commands[i].name)
      fprintf(out, "  %-12s %s\n", commands[i].name, commands[i].help);
  fprintf(out, "\nzspeed %s; 'zspeed <command> --help' for details.\n",
          zs_version_string());
}

int main(int argc, char **argv) {
  size_t i;
  if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("zspeed %s\n", zs_version_string());
    return 0;
  }
  for (i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (commands[i].name && strcmp(commands[i].name, argv[1]) == 0)
      return commands[i].run(argc - 2, argv + 2);
  fprintf(stderr, "zspeed: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}
