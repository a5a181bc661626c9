/* Threads, atomics, condition variables and the thread pool. Run under TSan
 * in CI (make test builds a -fsanitize=thread tree). */
#include <stdlib.h>
#include <string.h>

#include "zs_internal.h"
#include "zt.h"

typedef struct {
  zs__mutex mu;
  zs__cond cv;
  int64_t counter;
  volatile int64_t atomic_counter;
  int flag;
} shared_t;

static void bump(void *arg) {
  shared_t *s = arg;
  int i;
  for (i = 0; i < 10000; i++) {
    zs__mutex_lock(&s->mu);
    s->counter++;
    zs__mutex_unlock(&s->mu);
    zs__atomic_add64(&s->atomic_counter, 1);
  }
}

static void threads_mutex_atomics(void) {
  shared_t s;
  zs__thread t[4];
  int i;
  int64_t expect = 5;
  memset(&s, 0, sizeof s);
  ZT_OK(zs__mutex_init(&s.mu));
  for (i = 0; i < 4; i++) ZT_OK(zs__thread_create(&t[i], bump, &s));
  for (i = 0; i < 4; i++) ZT_OK(zs__thread_join(&t[i]));
  ZT_CHECK(s.counter == 40000);
  ZT_CHECK(zs__atomic_load64(&s.atomic_counter) == 40000);
  zs__atomic_store64(&s.atomic_counter, 5);
  ZT_CHECK(zs__atomic_cas64(&s.atomic_counter, &expect, 9));
  ZT_CHECK(!zs__atomic_cas64(&s.atomic_counter, &expect, 11));
  ZT_CHECK(expect == 9);
  zs__mutex_destroy(&s.mu);
}

static void signal_flag(void *arg) {
  shared_t *s = arg;
  zs__mutex_lock(&s->mu);
  s->flag = 1;
  zs__cond_signal(&s->cv);
  zs__mutex_unlock(&s->mu);
}

static void condvar_and_timeout(void) {
  shared_t s;
  zs__thread t;
  uint64_t t0;
  int rc;
  memset(&s, 0, sizeof s);
  ZT_OK(zs__mutex_init(&s.mu));
  ZT_OK(zs__cond_init(&s.cv));
  zs__mutex_lock(&s.mu);
  t0 = zs__now_ns();
  rc = zs__cond_timedwait(&s.cv, &s.mu, 20 * 1000000u);
  zs__mutex_unlock(&s.mu);
  /* Spurious wake-ups are allowed; a timeout must not come early. */
  ZT_CHECK(rc == ZS_EAGAIN || rc == 0);
  if (rc == ZS_EAGAIN) ZT_CHECK(zs__now_ns() - t0 >= 15 * 1000000u);
  ZT_OK(zs__thread_create(&t, signal_flag, &s));
  zs__mutex_lock(&s.mu);
  while (!s.flag) zs__cond_wait(&s.cv, &s.mu);
  zs__mutex_unlock(&s.mu);
  ZT_OK(zs__thread_join(&t));
  zs__cond_destroy(&s.cv);
  zs__mutex_destroy(&s.mu);
}

typedef struct {
  uint32_t *hits;       /* one per item: how often it was visited */
  uint64_t *chunk_sum;  /* one per chunk: deterministic partial sums */
  size_t chunk;
  volatile int64_t workers_seen; /* chunks done by pool workers */
} pfor_ctx;

static void visit(void *vctx, size_t begin, size_t end, int worker) {
  pfor_ctx *c = vctx;
  size_t i;
  uint64_t sum = 0;
  for (i = begin; i < end; i++) {
    c->hits[i]++;
    sum += i * i;
  }
  c->chunk_sum[begin / c->chunk] = sum;
  if (worker != 0) zs__atomic_add64(&c->workers_seen, 1);
}

static void parallel_for_covers_each_item_once(void) {
  static const size_t sizes[] = {0, 1, 7, 63, 64, 65, 1000, 100003};
  static const size_t chunks[] = {1, 16, 64, 1000, 1 << 20};
  zs_pool *pool;
  size_t si, ci, i;
  int threads;
  ZT_OK(zs_pool_create(&pool, 3));
  ZT_CHECK(zs_pool_size(pool) == 3);
  for (si = 0; si < ZS_ARRAY_SIZE(sizes); si++)
    for (ci = 0; ci < ZS_ARRAY_SIZE(chunks); ci++)
      for (threads = 0; threads <= 5; threads++) {
        size_t n = sizes[si], chunk = chunks[ci], nch = n / chunk + 1;
        pfor_ctx c;
        uint64_t total = 0, expect = 0;
        c.hits = calloc(n + 1, sizeof *c.hits);
        c.chunk_sum = calloc(nch, sizeof *c.chunk_sum);
        c.chunk = chunk;
        c.workers_seen = 0;
        ZT_CHECK(c.hits && c.chunk_sum);
        ZT_OK(zs_pool_parallel_for(pool, n, chunk, threads, visit, &c));
        for (i = 0; i < n; i++) {
          if (c.hits[i] != 1) {
            free(c.hits);
            free(c.chunk_sum);
            ZT_CHECKF(0, "n=%zu chunk=%zu threads=%d: item %zu visited %u times",
                      n, chunk, threads, i, c.hits[i]);
          }
          expect += (uint64_t)i * i;
        }
        for (i = 0; i < nch; i++) total += c.chunk_sum[i];
        free(c.hits);
        free(c.chunk_sum);
        ZT_CHECK(total == expect);
        /* threads == 1 means the caller alone. */
        if (threads == 1) ZT_CHECK(c.workers_seen == 0);
      }
  /* Without a pool the caller does everything. */
  {
    uint32_t hits[10] = {0};
    uint64_t sums[10];
    pfor_ctx c;
    c.hits = hits;
    c.chunk_sum = sums;
    c.chunk = 3;
    c.workers_seen = 0;
    ZT_OK(zs_pool_parallel_for(NULL, 10, 3, 0, visit, &c));
    for (i = 0; i < 10; i++) ZT_CHECK(hits[i] == 1);
  }
  ZT_ERR(zs_pool_parallel_for(pool, 10, 0, 0, visit, NULL), ZS_EINVAL);
  ZT_ERR(zs_pool_parallel_for(pool, 10, 1, -1, visit, NULL), ZS_EINVAL);
  ZT_ERR(zs_pool_parallel_for(pool, 10, 1, 0, NULL, NULL), ZS_EINVAL);
  zs_pool_destroy(pool);
}

typedef struct {
  zs__mutex mu;
  zs__cond cv;
  int release, done;
} gate_t;

static void blocker(void *arg) {
  gate_t *g = arg;
  zs__mutex_lock(&g->mu);
  while (!g->release) zs__cond_wait(&g->cv, &g->mu);
  g->done++;
  zs__mutex_unlock(&g->mu);
}

static void count_task(void *arg) { zs__atomic_add64((volatile int64_t *)arg, 1); }

static void parallel_for_does_not_wait_for_busy_workers(void) {
  /* Every worker is blocked in a long task: parallel_for must still finish
   * (the caller does all chunks and takes back the unstarted helpers). */
  zs_pool *pool;
  gate_t g;
  uint32_t hits[100] = {0};
  uint64_t sums[100];
  pfor_ctx c;
  volatile int64_t n = 0;
  int i;
  memset(&g, 0, sizeof g);
  ZT_OK(zs__mutex_init(&g.mu));
  ZT_OK(zs__cond_init(&g.cv));
  ZT_OK(zs_pool_create(&pool, 2));
  ZT_OK(zs_pool_submit(pool, blocker, &g));
  ZT_OK(zs_pool_submit(pool, blocker, &g));
  c.hits = hits;
  c.chunk_sum = sums;
  c.chunk = 1;
  c.workers_seen = 0;
  ZT_OK(zs_pool_parallel_for(pool, 100, 1, 0, visit, &c));
  for (i = 0; i < 100; i++) ZT_CHECK(hits[i] == 1);
  ZT_CHECK(c.workers_seen == 0); /* the caller did every chunk */
  for (i = 0; i < 50; i++) ZT_OK(zs_pool_submit(pool, count_task, (void *)&n));
  zs__mutex_lock(&g.mu);
  g.release = 1;
  zs__cond_broadcast(&g.cv);
  zs__mutex_unlock(&g.mu);
  zs_pool_destroy(pool); /* drains the queue first */
  ZT_CHECK(g.done == 2);
  ZT_CHECK(n == 50);
  zs__cond_destroy(&g.cv);
  zs__mutex_destroy(&g.mu);
}

typedef struct {
  zs_pool *pool;
  volatile int64_t total;
} nest_ctx;

static void inner(void *vctx, size_t b, size_t e, int worker) {
  nest_ctx *c = vctx;
  (void)worker;
  zs__atomic_add64(&c->total, (int64_t)(e - b));
}

static void outer(void *vctx, size_t b, size_t e, int worker) {
  nest_ctx *c = vctx;
  size_t i;
  (void)worker;
  for (i = b; i < e; i++) zs_pool_parallel_for(c->pool, 1000, 7, 0, inner, c);
}

static void nested_parallel_for(void) {
  nest_ctx c;
  ZT_OK(zs_pool_create(&c.pool, 3));
  c.total = 0;
  ZT_OK(zs_pool_parallel_for(c.pool, 16, 1, 0, outer, &c));
  ZT_CHECK(c.total == 16000);
  zs_pool_destroy(c.pool);
}

static void default_pool_and_errors(void) {
  zs_pool *p = zs_pool_default(), *q;
  ZT_CHECK(p != NULL);
  ZT_CHECK(zs_pool_default() == p);
  ZT_CHECK(zs_pool_size(p) >= 1);
  ZT_ERR(zs_pool_create(&q, -1), ZS_EINVAL);
  ZT_ERR(zs_pool_create(NULL, 1), ZS_EINVAL);
  ZT_ERR(zs_pool_submit(NULL, count_task, NULL), ZS_EINVAL);
  ZT_OK(zs_pool_create(&q, 0));
  ZT_CHECK(zs_pool_size(q) >= 1);
  zs_pool_destroy(q);
  zs_pool_destroy(NULL);
}

ZT_MAIN(ZT_CASE(threads_mutex_atomics), ZT_CASE(condvar_and_timeout),
        ZT_CASE(parallel_for_covers_each_item_once),
        ZT_CASE(parallel_for_does_not_wait_for_busy_workers),
        ZT_CASE(nested_parallel_for), ZT_CASE(default_pool_and_errors))
