/* pool.c - the shared thread pool: a FIFO of tasks served by N workers, and a
 * parallel_for on top of it in which the caller works too.
 *
 * parallel_for queues up to (max_threads - 1) helper tasks that pull chunk
 * indices from one atomic counter. When the caller runs out of chunks it
 * takes back helpers that have not started yet (they may be stuck behind a
 * long task, e.g. blocking I/O) and waits only for the running ones, so a
 * parallel_for never waits for a worker to become free, and nesting is safe. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zs_internal.h"

typedef struct {
  zs_task_fn fn;
  void *arg;
} zs__task;

struct zs_pool {
  int nthreads;
  zs__thread *threads;
  zs__mutex mu;
  zs__cond cv;
  zs__task *q; /* ring buffer */
  size_t qcap, qhead, qlen;
  int stop;
};

/* 0 for threads outside any pool, i+1 for worker i of its pool. */
static ZS_THREAD_LOCAL int zs__worker_id;

typedef struct {
  int id;
  zs_pool *pool;
} zs__worker_start;

static void zs__worker_main(void *p) {
  zs__worker_start ws = *(zs__worker_start *)p;
  zs_pool *pool = ws.pool;
  free(p);
  zs__worker_id = ws.id;
  for (;;) {
    zs__task t;
    zs__mutex_lock(&pool->mu);
    while (pool->qlen == 0 && !pool->stop) zs__cond_wait(&pool->cv, &pool->mu);
    if (pool->qlen == 0) { /* stopping and drained */
      zs__mutex_unlock(&pool->mu);
      return;
    }
    t = pool->q[pool->qhead];
    pool->qhead = (pool->qhead + 1) % pool->qcap;
    pool->qlen--;
    zs__mutex_unlock(&pool->mu);
    t.fn(t.arg);
  }
}

static int zs__pool_push_locked(zs_pool *pool, zs_task_fn fn, void *arg) {
  if (pool->qlen == pool->qcap) {
    size_t ncap = pool->qcap ? pool->qcap * 2 : 64, i;
    zs__task *nq = malloc(ncap * sizeof *nq);
    if (!nq) return zs__fail(ZS_ENOMEM, "cannot grow the thread pool queue");
    for (i = 0; i < pool->qlen; i++)
      nq[i] = pool->q[(pool->qhead + i) % pool->qcap];
    free(pool->q);
    pool->q = nq;
    pool->qcap = ncap;
    pool->qhead = 0;
  }
  pool->q[(pool->qhead + pool->qlen) % pool->qcap].fn = fn;
  pool->q[(pool->qhead + pool->qlen) % pool->qcap].arg = arg;
  pool->qlen++;
  return 0;
}

int zs_pool_create(zs_pool **out, int nthreads) {
  zs_pool *pool;
  int i, rc;
  if (!out) return zs__fail(ZS_EINVAL, "zs_pool_create: out is NULL");
  if (nthreads < 0 || nthreads > 4096)
    return zs__fail(ZS_EINVAL,
                    "zs_pool_create: nthreads must be 0..4096 (0 = one per "
                    "core), got %d", nthreads);
  if (nthreads == 0) nthreads = ZS_MAX(1, zs_cpu_count() - 1);
  pool = calloc(1, sizeof *pool);
  if (!pool) return zs__fail(ZS_ENOMEM, "cannot allocate a thread pool");
  pool->threads = calloc((size_t)nthreads, sizeof *pool->threads);
  if (!pool->threads) {
    free(pool);
    return zs__fail(ZS_ENOMEM, "cannot allocate a thread pool");
  }
  zs__mutex_init(&pool->mu);
  zs__cond_init(&pool->cv);
  for (i = 0; i < nthreads; i++) {
    zs__worker_start *ws = malloc(sizeof *ws);
    rc = ws ? 0 : zs__fail(ZS_ENOMEM, "cannot allocate a worker");
    if (ws) {
      ws->id = i + 1;
      ws->pool = pool;
      rc = zs__thread_create(&pool->threads[i], zs__worker_main, ws);
      if (rc) free(ws);
    }
    if (rc) {
      pool->nthreads = i; /* destroy joins the ones already started */
      zs_pool_destroy(pool);
      return rc;
    }
  }
  pool->nthreads = nthreads;
  *out = pool;
  return 0;
}

void zs_pool_destroy(zs_pool *pool) {
  int i;
  if (!pool) return;
  zs__mutex_lock(&pool->mu);
  pool->stop = 1;
  zs__cond_broadcast(&pool->cv);
  zs__mutex_unlock(&pool->mu);
  for (i = 0; i < pool->nthreads; i++) zs__thread_join(&pool->threads[i]);
  zs__cond_destroy(&pool->cv);
  zs__mutex_destroy(&pool->mu);
  free(pool->q);
  free(pool->threads);
  free(pool);
}

int zs_pool_size(const zs_pool *pool) { return pool ? pool->nthreads : 0; }

int zs_pool_submit(zs_pool *pool, zs_task_fn fn, void *arg) {
  int rc;
  if (!pool || !fn)
    return zs__fail(ZS_EINVAL, "zs_pool_submit: pool and fn must be set");
  zs__mutex_lock(&pool->mu);
  if (pool->stop) {
    zs__mutex_unlock(&pool->mu);
    return zs__fail(ZS_ESTATE, "zs_pool_submit: the pool is shutting down");
  }
  rc = zs__pool_push_locked(pool, fn, arg);
  if (rc == 0) zs__cond_signal(&pool->cv);
  zs__mutex_unlock(&pool->mu);
  return rc;
}

/* ------------------------------------------------------------ parallel_for */

typedef struct {
  zs_range_fn fn;
  void *ctx;
  size_t n, chunk, nchunks;
  volatile int64_t next;     /* next chunk index to claim */
  volatile int32_t helpers;  /* helper tasks queued or running */
  zs__mutex mu;
  zs__cond done;
} zs__pfor_job;

static void zs__pfor_work(zs__pfor_job *job, int worker) {
  for (;;) {
    int64_t c = zs__atomic_add64(&job->next, 1);
    size_t begin, end;
    if (c < 0 || (size_t)c >= job->nchunks) return;
    begin = (size_t)c * job->chunk;
    end = ZS_MIN(job->n, begin + job->chunk);
    job->fn(job->ctx, begin, end, worker);
  }
}

static void zs__pfor_helper(void *arg) {
  zs__pfor_job *job = arg;
  zs__pfor_work(job, zs__worker_id);
  zs__mutex_lock(&job->mu);
  if (--job->helpers == 0) zs__cond_signal(&job->done);
  zs__mutex_unlock(&job->mu);
}

int zs_pool_parallel_for(zs_pool *pool, size_t n, size_t chunk,
                         int max_threads, zs_range_fn fn, void *ctx) {
  zs__pfor_job job;
  size_t nhelpers = 0, i;
  int rc;
  if (!fn) return zs__fail(ZS_EINVAL, "zs_pool_parallel_for: fn is NULL");
  /* NULL is what callers get from zs_pool_default() when the default pool
   * was refused: running on one thread then would hide the refusal. */
  if (!pool && (rc = zs__pool_default_check()) < 0) return rc;
  if (chunk == 0)
    return zs__fail(ZS_EINVAL, "zs_pool_parallel_for: chunk must be > 0");
  if (max_threads < 0)
    return zs__fail(ZS_EINVAL,
                    "zs_pool_parallel_for: max_threads must be >= 0 (0 = all)");
  if (n == 0) return 0;
  memset(&job, 0, sizeof job);
  job.fn = fn;
  job.ctx = ctx;
  job.n = n;
  job.chunk = chunk;
  job.nchunks = n / chunk + (n % chunk != 0);
  if (pool) {
    size_t want = max_threads == 0 ? (size_t)pool->nthreads
                                   : (size_t)(max_threads - 1);
    nhelpers = ZS_MIN(want, (size_t)pool->nthreads);
    nhelpers = ZS_MIN(nhelpers, job.nchunks - 1);
  }
  if (nhelpers > 0) {
    zs__mutex_init(&job.mu);
    zs__cond_init(&job.done);
    zs__mutex_lock(&pool->mu);
    for (i = 0; i < nhelpers; i++)
      if (zs__pool_push_locked(pool, zs__pfor_helper, &job) != 0) break;
    job.helpers = (int32_t)i; /* no helper runs before we unlock */
    nhelpers = i;
    if (nhelpers == 1)
      zs__cond_signal(&pool->cv);
    else if (nhelpers > 1)
      zs__cond_broadcast(&pool->cv);
    zs__mutex_unlock(&pool->mu);
  }
  zs__pfor_work(&job, 0);
  if (nhelpers > 0) {
    /* Take back helpers that never started: the work is already done. */
    size_t k, kept = 0, removed = 0;
    zs__mutex_lock(&pool->mu);
    for (k = 0; k < pool->qlen; k++) {
      zs__task t = pool->q[(pool->qhead + k) % pool->qcap];
      if (t.fn == zs__pfor_helper && t.arg == (void *)&job)
        removed++;
      else
        pool->q[(pool->qhead + kept++) % pool->qcap] = t;
    }
    pool->qlen = kept;
    zs__mutex_unlock(&pool->mu);
    zs__mutex_lock(&job.mu);
    job.helpers -= (int32_t)removed;
    while (job.helpers > 0) zs__cond_wait(&job.done, &job.mu);
    zs__mutex_unlock(&job.mu);
    zs__cond_destroy(&job.done);
    zs__mutex_destroy(&job.mu);
  }
  return 0;
}

/* ------------------------------------------------------------ default pool */

static zs_pool *zs__default_pool;
static zs__once_t zs__default_once = ZS__ONCE_INIT;
/* Why there is no default pool (ZSPEED_NUM_THREADS refused, or creating it
 * failed), with its error code; written once, by the once-function. */
static char zs__default_why[400];
static int zs__default_err;

static void zs__default_init(void) {
  int n = zs_cpu_count(), rc;
  int64_t v;
  const char *env = zs__getenv("ZSPEED_NUM_THREADS");
  if (env) {
    rc = zs__parse_int(env, 1, ZS__MAX_THREADS, &v);
    if (rc < 0) {
      zs__default_err = rc;
      snprintf(zs__default_why, sizeof zs__default_why,
               "ZSPEED_NUM_THREADS=%.64s: %s; set it to the number of "
               "threads, or unset it for one per core (%d here)",
               env, zs_last_error(), zs_cpu_count());
      return;
    }
    n = (int)v;
  }
  /* The caller works in parallel_for, so n threads need n - 1 workers; keep
   * at least one so zs_pool_submit always makes progress. */
  rc = zs_pool_create(&zs__default_pool, ZS_MAX(1, n - 1));
  if (rc < 0) {
    zs__default_err = rc;
    snprintf(zs__default_why, sizeof zs__default_why,
             "cannot create the default thread pool of %d threads: %s", n,
             zs_last_error());
    zs__default_pool = NULL;
  }
}

zs_pool *zs_pool_default(void) {
  zs__call_once(&zs__default_once, zs__default_init);
  return zs__default_pool;
}

int zs__pool_default_check(void) {
  zs__call_once(&zs__default_once, zs__default_init);
  return zs__default_err ? zs__fail(zs__default_err, "%s", zs__default_why)
                         : 0;
}
