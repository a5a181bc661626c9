/* zt.c - the test runner behind zt.h. */
#ifndef _WIN32
#  define _POSIX_C_SOURCE 200809L
#endif
#include "zt.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#ifdef _WIN32
#  define WIN32_LEAN_AND_MEAN
#  include <windows.h>
#else
#  include <dirent.h>
#  include <sys/stat.h>
#  include <unistd.h>
#endif

static int zt_state; /* 0 pass, 1 fail, 2 skip */
static char zt_skip_reason[256];
static uint64_t zt_rng = 0x9E3779B97F4A7C15ull;
static char zt_dir[512];

void zt__fail(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  zt_state = 1;
  printf("#   %s:%d: ", file, line);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  fflush(stdout);
}

void zt__skip(const char *fmt, ...) {
  va_list ap;
  if (zt_state == 1) return;
  zt_state = 2;
  va_start(ap, fmt);
  vsnprintf(zt_skip_reason, sizeof zt_skip_reason, fmt, ap);
  va_end(ap);
}

int zt__failed(void) { return zt_state == 1; }

uint64_t zt_rand(void) {
  zt_rng ^= zt_rng >> 12;
  zt_rng ^= zt_rng << 25;
  zt_rng ^= zt_rng >> 27;
  return zt_rng * 0x2545F4914F6CDD1Dull;
}

double zt_randf(void) { return (double)(zt_rand() >> 11) * (1.0 / 9007199254740992.0); }

const char *zt_tmpdir(void) {
  static unsigned counter;
#ifdef _WIN32
  char base[MAX_PATH];
  DWORD n = GetTempPathA(sizeof base, base);
  if (n == 0 || n >= sizeof base) strcpy(base, ".\\");
  snprintf(zt_dir, sizeof zt_dir, "%szt_%lu_%u", base,
           (unsigned long)GetCurrentProcessId(), counter++);
  CreateDirectoryA(zt_dir, NULL);
#else
  const char *base = getenv("ZT_TMPDIR");
  if (!base || !base[0]) base = getenv("TMPDIR");
  if (!base || !base[0]) base = "/tmp";
  snprintf(zt_dir, sizeof zt_dir, "%s/zt_%ld_%u", base, (long)getpid(),
           counter++);
  mkdir(zt_dir, 0700);
#endif
  return zt_dir;
}

void zt_path_in(char *out, size_t cap, const char *dir, const char *name) {
#ifdef _WIN32
  snprintf(out, cap, "%s\\%s", dir, name);
#else
  snprintf(out, cap, "%s/%s", dir, name);
#endif
}

void zt_rmtree(const char *dir) {
#ifdef _WIN32
  char pat[600], path[900];
  WIN32_FIND_DATAA fd;
  HANDLE h;
  snprintf(pat, sizeof pat, "%s\\*", dir);
  h = FindFirstFileA(pat, &fd);
  if (h != INVALID_HANDLE_VALUE) {
    do {
      if (!strcmp(fd.cFileName, ".") || !strcmp(fd.cFileName, "..")) continue;
      snprintf(path, sizeof path, "%s\\%s", dir, fd.cFileName);
      if (fd.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY)
        zt_rmtree(path);
      else
        DeleteFileA(path);
    } while (FindNextFileA(h, &fd));
    FindClose(h);
  }
  RemoveDirectoryA(dir);
#else
  DIR *d = opendir(dir);
  struct dirent *e;
  char path[900];
  if (d) {
    while ((e = readdir(d)) != NULL) {
      struct stat st;
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
        zt_rmtree(path);
      else
        unlink(path);
    }
    closedir(d);
  }
  rmdir(dir);
#endif
}

int zt_run(const zt_case *cases, size_t n, int argc, char **argv) {
  size_t i, planned = 0;
  int passed = 0, failed = 0, skipped = 0, a;
  setvbuf(stdout, NULL, _IONBF, 0);
  for (i = 0; i < n; i++) {
    int want = argc <= 1;
    for (a = 1; a < argc && !want; a++) want = strcmp(argv[a], cases[i].name) == 0;
    planned += (size_t)want;
  }
  printf("1..%zu\n", planned);
  planned = 0;
  for (i = 0; i < n; i++) {
    int want = argc <= 1;
    for (a = 1; a < argc && !want; a++) want = strcmp(argv[a], cases[i].name) == 0;
    if (!want) continue;
    zt_state = 0;
    zt_skip_reason[0] = '\0';
    zt_rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)(i + 1) * 0xBF58476D1CE4E5B9ull;
    cases[i].fn();
    planned++;
    if (zt_state == 1) {
      printf("not ok %zu - %s\n", planned, cases[i].name);
      failed++;
    } else if (zt_state == 2) {
      printf("ok %zu - %s # SKIP %s\n", planned, cases[i].name, zt_skip_reason);
      skipped++;
    } else {
      printf("ok %zu - %s\n", planned, cases[i].name);
      passed++;
    }
  }
  printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  return failed ? 1 : 0;
}
