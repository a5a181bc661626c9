/* thread_win.c - the Win32 half of thread.c: CreateThread, slim
 * reader/writer locks as mutexes, condition variables, InitOnceExecuteOnce
 * and QueryPerformanceCounter as the monotonic clock. */
#include <stdlib.h>

#include "zs_os.h"

static DWORD WINAPI zs__thread_main(LPVOID p) {
  zs__thread_start_run(p);
  return 0;
}

int zs__thread_create(zs__thread *t, zs__thread_fn fn, void *arg) {
  zs__thread_start *s = zs__thread_start_new(fn, arg);
  if (!s) return ZS_ENOMEM;
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
