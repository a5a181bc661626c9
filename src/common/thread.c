/* thread.c - atomics, threads, mutexes, condition variables, once, and the
 * monotonic clock (declared in zs_internal.h). No C11 <threads.h> or
 * <stdatomic.h>: MSVC lacks the first and only recently grew the second.
 * This file holds what does not depend on the operating system (the
 * atomics depend on the compiler), the thread start block and getenv;
 * thread_posix.c and thread_win.c hold the rest. */
#include <stdlib.h>

#include "zs_os.h"

/* --------------------------------------------------------------- atomics */

#if defined(__GNUC__) || defined(__clang__)
int64_t zs__atomic_load64(const volatile int64_t *p) {
  return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}
void zs__atomic_store64(volatile int64_t *p, int64_t v) {
  __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}
int64_t zs__atomic_add64(volatile int64_t *p, int64_t v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
int zs__atomic_cas64(volatile int64_t *p, int64_t *expected, int64_t desired) {
  return __atomic_compare_exchange_n(p, expected, desired, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST);
}
int32_t zs__atomic_load32(const volatile int32_t *p) {
  return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}
void zs__atomic_store32(volatile int32_t *p, int32_t v) {
  __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}
int32_t zs__atomic_add32(volatile int32_t *p, int32_t v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
#elif defined(_MSC_VER)
#  include <intrin.h>
int64_t zs__atomic_load64(const volatile int64_t *p) {
  return _InterlockedCompareExchange64((volatile __int64 *)p, 0, 0);
}
void zs__atomic_store64(volatile int64_t *p, int64_t v) {
  _InterlockedExchange64((volatile __int64 *)p, v);
}
int64_t zs__atomic_add64(volatile int64_t *p, int64_t v) {
  return _InterlockedExchangeAdd64((volatile __int64 *)p, v);
}
int zs__atomic_cas64(volatile int64_t *p, int64_t *expected, int64_t desired) {
  int64_t old = _InterlockedCompareExchange64((volatile __int64 *)p, desired,
                                              *expected);
  if (old == *expected) return 1;
  *expected = old;
  return 0;
}
int32_t zs__atomic_load32(const volatile int32_t *p) {
  return _InterlockedCompareExchange((volatile long *)p, 0, 0);
}
void zs__atomic_store32(volatile int32_t *p, int32_t v) {
  _InterlockedExchange((volatile long *)p, v);
}
int32_t zs__atomic_add32(volatile int32_t *p, int32_t v) {
  return _InterlockedExchangeAdd((volatile long *)p, v);
}
#else
#  error "zspeed needs GCC, Clang or MSVC atomics"
#endif

/* --------------------------------------------------------- thread start */

zs__thread_start *zs__thread_start_new(zs__thread_fn fn, void *arg) {
  zs__thread_start *s = malloc(sizeof *s);
  if (!s) {
    zs__fail(ZS_ENOMEM, "cannot allocate thread start block");
    return NULL;
  }
  s->fn = fn;
  s->arg = arg;
  return s;
}

void zs__thread_start_run(zs__thread_start *s) {
  zs__thread_start copy = *s;
  free(s);
  copy.fn(copy.arg);
}

/* ------------------------------------------------------------------- env */

const char *zs__getenv(const char *name) {
  const char *v = getenv(name);
  return (v && v[0]) ? v : NULL;
}
