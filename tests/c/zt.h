/* zt.h - zspeed's tiny C test runner. TAP-like output:
 *
 *   1..N
 *   ok 1 - name
 *   not ok 2 - name
 *   #   file.c:42: check failed: x == 3
 *   ok 3 - name # SKIP reason
 *   N passed, N failed, N skipped
 *
 * A test is a void function; ZT_CHECK returns from it on failure, ZT_SKIP
 * marks it skipped. Run one binary with test names as arguments to run only
 * those. Each binary lists its cases with ZT_MAIN. */
#ifndef ZT_H
#define ZT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
  const char *name;
  void (*fn)(void);
} zt_case;

void zt__fail(const char *file, int line, const char *fmt, ...);
void zt__skip(const char *fmt, ...);
int zt__failed(void);
int zt_run(const zt_case *cases, size_t n, int argc, char **argv);
/* A deterministic per-test random generator (xorshift64*). */
uint64_t zt_rand(void);
double zt_randf(void); /* uniform in [0, 1) */
/* A fresh temporary directory for the current test (removed by the caller
 * with zt_rmdir); returns a pointer to a static buffer. */
const char *zt_tmpdir(void);
void zt_rmtree(const char *dir);
/* out = dir + the platform's separator + name (truncated to cap). */
void zt_path_in(char *out, size_t cap, const char *dir, const char *name);

#define ZT_CHECK(cond)                                         \
  do {                                                         \
    if (!(cond)) {                                             \
      zt__fail(__FILE__, __LINE__, "check failed: %s", #cond); \
      return;                                                  \
    }                                                          \
  } while (0)

#define ZT_CHECKF(cond, ...)                  \
  do {                                        \
    if (!(cond)) {                            \
      zt__fail(__FILE__, __LINE__, __VA_ARGS__); \
      return;                                 \
    }                                         \
  } while (0)

/* Checks that a zspeed call returned 0, printing the error otherwise. */
#define ZT_OK(call)                                                       \
  do {                                                                    \
    int zt_rc_ = (call);                                                  \
    if (zt_rc_ != 0) {                                                    \
      zt__fail(__FILE__, __LINE__, "%s returned %s (%s): %s", #call,      \
               zs_err_name(zt_rc_), zs_strerror(zt_rc_), zs_last_error()); \
      return;                                                             \
    }                                                                     \
  } while (0)

/* Checks that a zspeed call failed with exactly `err`. */
#define ZT_ERR(call, err)                                                \
  do {                                                                   \
    int zt_rc_ = (call);                                                 \
    if (zt_rc_ != (err)) {                                               \
      zt__fail(__FILE__, __LINE__, "%s returned %s, expected %s", #call, \
               zs_err_name(zt_rc_), zs_err_name(err));                   \
      return;                                                            \
    }                                                                    \
  } while (0)

#define ZT_SKIP(...)     \
  do {                   \
    zt__skip(__VA_ARGS__); \
    return;              \
  } while (0)

#define ZT_MAIN(...)                                                    \
  int main(int argc, char **argv) {                                     \
    static const zt_case zt_cases_[] = {__VA_ARGS__};                   \
    return zt_run(zt_cases_, sizeof zt_cases_ / sizeof zt_cases_[0], argc, \
                  argv);                                                \
  }

#define ZT_CASE(fn) {#fn, fn}

/* 1 in sanitizer builds, whose runtimes replace some system calls (ASan and
 * TSan turn mlock into a no-op). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#  define ZT_SANITIZED 1
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#    define ZT_SANITIZED 1
#  endif
#endif
#ifndef ZT_SANITIZED
#  define ZT_SANITIZED 0
#endif

#endif
