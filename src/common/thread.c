/* thread.c - atomics, threads, mutexes, condition variables, once, and the
 * monotonic clock, for pthreads and Win32. No C11 <threads.h> or
 * <stdatomic.h>: MSVC lacks the first and only recently grew the second. */
#include <stdlib.h>
#include <time.h>

#include "zs_internal.h"

#ifndef _WIN32
#  include <errno.h>
#  include <unistd.h>
#endif

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

/* --------------------------------------------------------------- threads */

typedef struct {
  zs__thread_fn fn;
  void *arg;
} zs__thread_start;

#ifdef _WIN32
static DWORD WINAPI zs__thread_main(LPVOID p) {
  zs__thread_start s = *(zs__thread_start *)p;
  free(p);
  s.fn(s.arg);
  return 0;
}

int zs__thread_create(zs__thread *t, zs__thread_fn fn, void *arg) {
  zs__thread_start *s = malloc(sizeof *s);
  if (!s) return zs__fail(ZS_ENOMEM, "cannot allocate thread start block");
  s->fn = fn;
  s->arg = arg;
  t->h = CreateThread(NULL, 0, zs__thread_main, s, 0, NULL);
  if (!t->h) {
    int err = zs__os_error();
    free(s);
    return zs__fail(err, "CreateThread failed: %s", zs_strerror(err));
  }
  return 0;
}

int zs__thread_join(zs__thread *t) {
  if (WaitForSingleObject(t->h, INFINITE) != WAIT_OBJECT_0)
    return zs__fail(zs__os_error(), "WaitForSingleObject on a thread failed");
  CloseHandle(t->h);
  t->h = NULL;
  return 0;
}

int zs__mutex_init(zs__mutex *m) {
  InitializeSRWLock(m);
  return 0;
}
void zs__mutex_destroy(zs__mutex *m) { (void)m; }
void zs__mutex_lock(zs__mutex *m) { AcquireSRWLockExclusive(m); }
void zs__mutex_unlock(zs__mutex *m) { ReleaseSRWLockExclusive(m); }
int zs__cond_init(zs__cond *c) {
  InitializeConditionVariable(c);
  return 0;
}
void zs__cond_destroy(zs__cond *c) { (void)c; }
void zs__cond_wait(zs__cond *c, zs__mutex *m) {
  SleepConditionVariableSRW(c, m, INFINITE, 0);
}
int zs__cond_timedwait(zs__cond *c, zs__mutex *m, uint64_t timeout_ns) {
  DWORD ms = (DWORD)ZS_MIN(timeout_ns / 1000000u, (uint64_t)0xFFFFFFFEu);
  if (!SleepConditionVariableSRW(c, m, ms, 0)) return ZS_EAGAIN;
  return 0;
}
void zs__cond_signal(zs__cond *c) { WakeConditionVariable(c); }
void zs__cond_broadcast(zs__cond *c) { WakeAllConditionVariable(c); }

static BOOL CALLBACK zs__once_tramp(PINIT_ONCE o, PVOID fn, PVOID *ctx) {
  (void)o;
  (void)ctx;
  ((void (*)(void))(uintptr_t)fn)();
  return TRUE;
}
void zs__call_once(zs__once_t *o, void (*fn)(void)) {
  InitOnceExecuteOnce(o, zs__once_tramp, (PVOID)(uintptr_t)fn, NULL);
}

uint64_t zs__now_ns(void) {
  static LARGE_INTEGER freq;
  LARGE_INTEGER now;
  if (freq.QuadPart == 0) QueryPerformanceFrequency(&freq);
  QueryPerformanceCounter(&now);
  return (uint64_t)((double)now.QuadPart * 1e9 / (double)freq.QuadPart);
}
#else
static void *zs__thread_main(void *p) {
  zs__thread_start s = *(zs__thread_start *)p;
  free(p);
  s.fn(s.arg);
  return NULL;
}

int zs__thread_create(zs__thread *t, zs__thread_fn fn, void *arg) {
  int rc;
  zs__thread_start *s = malloc(sizeof *s);
  if (!s) return zs__fail(ZS_ENOMEM, "cannot allocate thread start block");
  s->fn = fn;
  s->arg = arg;
  rc = pthread_create(&t->t, NULL, zs__thread_main, s);
  if (rc != 0) {
    free(s);
    return zs__fail(zs__translate_errno(rc), "pthread_create failed: %s",
                    zs_strerror(zs__translate_errno(rc)));
  }
  return 0;
}

int zs__thread_join(zs__thread *t) {
  int rc = pthread_join(t->t, NULL);
  if (rc != 0)
    return zs__fail(zs__translate_errno(rc), "pthread_join failed");
  return 0;
}

int zs__mutex_init(zs__mutex *m) {
  int rc = pthread_mutex_init(m, NULL);
  return rc ? zs__fail(zs__translate_errno(rc), "pthread_mutex_init failed")
            : 0;
}
void zs__mutex_destroy(zs__mutex *m) { pthread_mutex_destroy(m); }
void zs__mutex_lock(zs__mutex *m) {
  if (pthread_mutex_lock(m) != 0) abort(); /* only on corrupted state */
}
void zs__mutex_unlock(zs__mutex *m) {
  if (pthread_mutex_unlock(m) != 0) abort();
}

int zs__cond_init(zs__cond *c) {
  /* CLOCK_MONOTONIC, so timed waits are immune to wall-clock changes. */
  pthread_condattr_t attr;
  int rc;
  pthread_condattr_init(&attr);
#  if !defined(__APPLE__)
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
#  endif
  rc = pthread_cond_init(c, &attr);
  pthread_condattr_destroy(&attr);
  return rc ? zs__fail(zs__translate_errno(rc), "pthread_cond_init failed")
            : 0;
}
void zs__cond_destroy(zs__cond *c) { pthread_cond_destroy(c); }
void zs__cond_wait(zs__cond *c, zs__mutex *m) {
  if (pthread_cond_wait(c, m) != 0) abort();
}
int zs__cond_timedwait(zs__cond *c, zs__mutex *m, uint64_t timeout_ns) {
  struct timespec ts;
  uint64_t ns;
#  if defined(__APPLE__)
  clock_gettime(CLOCK_REALTIME, &ts);
#  else
  clock_gettime(CLOCK_MONOTONIC, &ts);
#  endif
  ns = (uint64_t)ts.tv_nsec + timeout_ns;
  ts.tv_sec += (time_t)(ns / 1000000000u);
  ts.tv_nsec = (long)(ns % 1000000000u);
  return pthread_cond_timedwait(c, m, &ts) == ETIMEDOUT ? ZS_EAGAIN : 0;
}
void zs__cond_signal(zs__cond *c) { pthread_cond_signal(c); }
void zs__cond_broadcast(zs__cond *c) { pthread_cond_broadcast(c); }
void zs__call_once(zs__once_t *o, void (*fn)(void)) { pthread_once(o, fn); }

uint64_t zs__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#endif

const char *zs__getenv(const char *name) {
  const char *v = getenv(name);
  return (v && v[0]) ? v : NULL;
}
