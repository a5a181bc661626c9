/* thread_posix.c - the pthreads half of thread.c: threads, mutexes,
 * condition variables on CLOCK_MONOTONIC (where the platform allows),
 * pthread_once and clock_gettime as the monotonic clock. */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "zs_os.h"

static void *zs__thread_main(void *p) {
  zs__thread_start_run(p);
  return NULL;
}

int zs__thread_create(zs__thread *t, zs__thread_fn fn, void *arg) {
  int rc;
  zs__thread_start *s = zs__thread_start_new(fn, arg);
  if (!s) return ZS_ENOMEM;
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
#if !defined(__APPLE__)
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
#endif
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
#if defined(__APPLE__)
  clock_gettime(CLOCK_REALTIME, &ts);
#else
  clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
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
