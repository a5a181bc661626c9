/* swap_step.c - one optimizer step over every partition, pipelined:
 *
 *   read(i+1..i+B-1)  ||  step(i) on the pool  ||  write(i-1, i-2, ...)
 *
 * Partition j uses pinned buffer j % B. Its read can be issued once the
 * write of partition j - B (the buffer's previous user) has completed. The
 * caller's thread drives everything: before stepping partition i it blocks
 * only for what i strictly needs (its buffer free, its read done); all
 * look-ahead reads are issued without blocking, also between slices of the
 * compute, so a write that completes while partition i is being stepped
 * frees its buffer for the next read at once. Writes go to a slot that
 * holds no state (zs__swap_reserve: the partition's other slot, or a free
 * one of a compact file), committed only after every write succeeded (see
 * swap.h for the guarantee), or, in a resumable step, each as soon as its
 * own write succeeded, the partitions keeping their
 * progress (ZS__PART_*) across a failure: a retry writes the images still
 * in their buffers and steps the rest. zs_swap_io_pass, at the end, moves
 * the same bytes without the optimizer, to measure the disk. */
#include <stdio.h>
#include <string.h>

#include "swap/swap_internal.h"

typedef struct swap_pipe {
  zs_swap *s;
  const zs_swap_step_args *a;
  double lr;
  int64_t step;
  int64_t rid[64], wid[64]; /* pending request per buffer, 0 = none */
  int wpart[64];
  int next_read;
  int resumable;
  int err;
  char msg[600];
} swap_pipe;

static void record(swap_pipe *p, int rc, const char *what, int part) {
  if (p->err) return;
  p->err = rc;
  if (p->resumable) {
    snprintf(p->msg, sizeof p->msg, "zs_swap_step: %s partition %d failed "
             "and resumable step %lld stopped partway: call zs_swap_step "
             "again to complete it (every partition is stepped once) or "
             "zs_swap_abandon_step to return every partition to step %lld: "
             "%s", what, part, (long long)p->step, (long long)p->s->steps,
             zs_last_error());
    return;
  }
  snprintf(p->msg, sizeof p->msg, "zs_swap_step: %s partition %d failed, "
           "the step was abandoned and every partition keeps the state of "
           "step %lld: %s", what, part, (long long)p->s->steps,
           zs_last_error());
}

/* Collects the write pending on buffer b. Without `block` it only does so
 * if the write has completed. Returns 1 if the buffer is free. */
static int reap_write(swap_pipe *p, int b, int block) {
  zs_swap *s = p->s;
  uint64_t t0;
  int rc;
  if (!p->wid[b]) return 1;
  if (!block && zs_aio_test(s->aio, p->wid[b]) == 0) return 0;
  t0 = zs__now_ns();
  rc = zs_aio_wait(s->aio, p->wid[b]);
  if (block) s->stats.write_wait_ns += zs__now_ns() - t0;
  if (rc == 0) rc = zs__swap_fault(1, p->wpart[b]);
  p->wid[b] = 0;
  if (rc < 0) {
    record(p, rc, "writing", p->wpart[b]);
  } else {
    zs__swap_part *q = &s->parts[p->wpart[b]];
    s->stats.bytes_written += (uint64_t)q->slot;
    if (p->resumable) { /* this partition's step is done */
      zs__swap_commit(s, p->wpart[b]);
      q->state = ZS__PART_DONE;
    }
  }
  return 1;
}

/* Issues reads in partition order up to partition last; the read of
 * partition `must` (if not issued yet) may block for its buffer, the others
 * are issued only if their buffer is already free. */
static void issue_reads(swap_pipe *p, int must, int last) {
  zs_swap *s = p->s;
  while (!p->err && p->next_read < s->nparts && p->next_read <= last) {
    int j = p->next_read, b = j % s->bufcount;
    zs__swap_part *q = &s->parts[j];
    int64_t id;
    if (q->state != ZS__PART_TODO) { /* stepped before a resumed failure */
      p->next_read++;
      continue;
    }
    if (!reap_write(p, b, j == must) || p->err) return;
    id = zs_aio_pread(s->aio, s->file, s->bufs[b], q->slot, q->loc);
    if (id < 0) {
      record(p, (int)id, "submitting the read of", j);
      return;
    }
    p->rid[b] = id;
    p->next_read++;
  }
}

/* Elements per kernel call: between calls the driver issues the reads
 * whose buffers were freed meanwhile. A multiple of ZS_OPTIM_CHUNK, so the
 * 8-bit blocks and the kernels' chunking are the same as for one call. */
static size_t slice_elems(const zs_swap *s) {
  int th = s->num_threads;
  if (th <= 0) th = zs_pool_size(s->pool ? s->pool : zs_pool_default()) + 1;
  return (size_t)ZS_OPTIM_CHUNK * 8 * (size_t)ZS_MAX(th, 1);
}

static size_t dtype_bytes(int dt) { return dt == ZS_DTYPE_F32 ? 4 : 2; }

/* Steps partition i, held in buffer b. */
static int compute(swap_pipe *p, int i, int b) {
  zs_swap *s = p->s;
  const zs_swap_step_args *a = p->a;
  zs__swap_part *q = &s->parts[i];
  unsigned char *base = s->bufs[b];
  size_t es = zs__swap_state_es(s->state_dtype), k, slice = slice_elems(s);
  size_t gs = dtype_bytes(a->grad_dtype), os = dtype_bytes(a->out_dtype);
  void *out = a->outs ? a->outs[i] : NULL;
  int rc = 0;
  /* A failure elsewhere stops a plain step between slices; a resumable one
   * finishes the partition (see zs_swap_step). */
  for (k = 0; k < q->n && rc == 0 && (p->resumable || !p->err); k += slice) {
    zs_optim_tensors t;
    uint64_t t0;
    zs_optim_tensors_init(&t);
    t.n = ZS_MIN(slice, q->n - k);
    t.param = base + q->param_off + k * 4;
    t.param_dtype = ZS_DTYPE_F32;
    t.grad = (const unsigned char *)a->grads[i] + k * gs;
    t.grad_dtype = a->grad_dtype;
    t.state_dtype = s->state_dtype;
    if (q->m_off >= 0) t.m = base + q->m_off + k * es;
    if (q->v_off >= 0) t.v = base + q->v_off + k * es;
    if (s->state_dtype == ZS_DTYPE_Q8) {
      t.m_scale = (float *)(base + q->ms_off) + k / ZS_OPTIM_QBLOCK;
      t.v_scale = (float *)(base + q->vs_off) + k / ZS_OPTIM_QBLOCK;
    }
    /* The kernels convert to BF16/F16 themselves; an F32 copy-out is the
     * updated master itself, copied after the kernel. */
    if (out && a->out_dtype != ZS_DTYPE_F32) {
      t.out = (unsigned char *)out + k * os;
      t.out_dtype = a->out_dtype;
    }
    t0 = zs__now_ns();
    rc = zs__swap_kernel(s, &t, p->lr, s->beta1, s->beta2, s->eps,
                         s->weight_decay, a->grad_scale, p->step);
    if (rc == 0 && out && a->out_dtype == ZS_DTYPE_F32)
      memcpy((unsigned char *)out + k * os, t.param, t.n * 4);
    s->stats.compute_ns += zs__now_ns() - t0;
    issue_reads(p, -1, i + s->bufcount - 1);
  }
  return rc;
}

/* Starts the write of partition i's new image, held in buffer b. */
static void start_write(swap_pipe *p, int i, int b) {
  zs_swap *s = p->s;
  zs__swap_part *q = &s->parts[i];
  int64_t off = zs__swap_reserve(s, i);
  p->wid[b] = off < 0 ? off
                      : zs_aio_pwrite(s->aio, s->file, s->bufs[b], q->slot, off);
  p->wpart[b] = i;
  if (p->resumable) q->state = ZS__PART_WRITING;
  if (p->wid[b] < 0) {
    int rc = (int)p->wid[b];
    p->wid[b] = 0;
    record(p, rc, "submitting the write of", i);
  }
}

/* Resumable steps: which step this call runs (a new one, or the one a
 * failure left incomplete) and whether it may. */
static int check_resume(swap_pipe *p) {
  zs_swap *s = p->s;
  const zs_swap_step_args *a = p->a;
  if (!p->resumable && s->compact)
    return zs__fail(ZS_EINVAL, "zs_swap_step: a compact swap file (one slot "
                    "per partition) commits each partition as it is "
                    "written, so its steps must be resumable: set "
                    "args.resumable = 1");
  if (!p->resumable) return zs__swap_check_complete(s, "zs_swap_step");
  if (s->sync_each_step)
    return zs__fail(ZS_EINVAL, "zs_swap_step: a resumable step commits each "
                    "partition on its own and cannot sync the file before "
                    "committing (sync_each_step); use one or the other");
  if (!s->inc_step) return 0;
  if (a->step > 0 && a->step != s->inc_step)
    return zs__fail(ZS_EINVAL, "zs_swap_step: step %lld stopped partway; a "
                    "call with step = %lld cannot complete it (pass 0 or "
                    "%lld, or zs_swap_abandon_step first)",
                    (long long)s->inc_step, (long long)a->step,
                    (long long)s->inc_step);
  if (s->lost)
    return zs__fail(ZS_ESTATE, "zs_swap_step: step %lld stopped in a kernel "
                    "call that may have consumed gradients it did not step; "
                    "it cannot be completed: call zs_swap_abandon_step",
                    (long long)s->inc_step);
  p->step = s->inc_step;
  return 0;
}

/* Checks everything a step needs before any I/O starts. */
static int check_args(swap_pipe *p) {
  zs_swap *s = p->s;
  const zs_swap_step_args *a = p->a;
  zs_optim_tensors t;
  int i, rc;
  if (!a || !a->grads)
    return zs__fail(ZS_EINVAL, "zs_swap_step: args and args->grads must not "
                    "be NULL");
  if (a->grad_dtype != ZS_DTYPE_F32 && a->grad_dtype != ZS_DTYPE_BF16 &&
      a->grad_dtype != ZS_DTYPE_F16)
    return zs__fail(ZS_EDTYPE, "zs_swap_step: grad_dtype %d must be "
                    "ZS_DTYPE_F32, BF16 or F16", a->grad_dtype);
  if (a->outs && a->out_dtype != ZS_DTYPE_BF16 && a->out_dtype != ZS_DTYPE_F16 &&
      a->out_dtype != ZS_DTYPE_F32)
    return zs__fail(ZS_EDTYPE, "zs_swap_step: out_dtype %d must be "
                    "ZS_DTYPE_BF16, F16 or F32", a->out_dtype);
  if (a->step < 0 || a->step == INT64_MAX)
    return zs__fail(ZS_EINVAL, "zs_swap_step: step = %lld must be in "
                    "[0, 2^63 - 2] (0 = count automatically)",
                    (long long)a->step);
  for (i = 0; i < s->nparts; i++) {
    if (!a->grads[i])
      return zs__fail(ZS_EINVAL, "zs_swap_step: grads[%d] is NULL", i);
    if (!s->parts[i].ready)
      return zs__fail(ZS_ESTATE, "zs_swap_step: partition %d holds no state "
                      "(%s); call zs_swap_init_partition or zs_swap_set_state "
                      "for it first", i,
                      s->parts[i].dropped
                          ? "zs_swap_abandon_step dropped it, as a compact "
                            "file keeps one image per partition"
                          : "not initialized yet");
  }
  zs_optim_tensors_init(&t);
  t.grad_dtype = a->grad_dtype;
  t.state_dtype = s->state_dtype;
  rc = zs__swap_kernel(s, &t, p->lr, s->beta1, s->beta2, s->eps,
                       s->weight_decay, a->grad_scale, p->step);
  return rc < 0 ? zs__fail_prefix(rc, "zs_swap_step") : 0;
}

int zs_swap_step(zs_swap *s, const zs_swap_step_args *a) {
  swap_pipe p;
  uint64_t t_start = zs__now_ns(), t0;
  int i, b, rc;
  if (!s) return zs__fail(ZS_EINVAL, "zs_swap_step: s is NULL");
  memset(&p, 0, sizeof p);
  p.s = s, p.a = a;
  if (a) {
    p.lr = a->lr >= 0 ? a->lr : s->lr;
    /* zs_swap_set_steps keeps steps below INT64_MAX, so this cannot wrap. */
    p.step = a->step > 0 ? a->step : s->steps + 1;
    p.resumable = a->resumable != 0;
    if ((rc = check_resume(&p)) < 0) return rc;
  }
  if ((rc = check_args(&p)) < 0) return rc;
  if (p.resumable) {
    s->inc_step = p.step;
    /* Images a failed write left in their buffers are written first. */
    for (i = 0; i < s->nparts && !p.err; i++)
      if (s->parts[i].state == ZS__PART_WRITING)
        start_write(&p, i, i % s->bufcount);
  }
  for (i = 0; i < s->nparts && !p.err; i++) {
    zs__swap_part *q = &s->parts[i];
    if (q->state != ZS__PART_TODO) continue;
    b = i % s->bufcount;
    issue_reads(&p, i, i + s->bufcount - 1);
    if (p.err) break;
    t0 = zs__now_ns();
    /* While partition i's read is in flight, every completed write frees a
     * buffer: issue the look-ahead read for it at once instead of after
     * this wait, so the device never runs dry behind the writes ahead of
     * this read in the queue. */
    while (!p.err && zs_aio_test(s->aio, p.rid[b]) == 0) {
      uint64_t seen = zs_aio_completions(s->aio);
      issue_reads(&p, -1, i + s->bufcount - 1);
      if (p.err || zs_aio_test(s->aio, p.rid[b]) != 0) break;
      zs_aio_wait_completion(s->aio, seen);
    }
    if (p.err) break;
    rc = zs_aio_wait(s->aio, p.rid[b]);
    s->stats.read_wait_ns += zs__now_ns() - t0;
    p.rid[b] = 0;
    if (rc == 0) rc = zs__swap_fault(0, i);
    if (rc < 0) {
      record(&p, rc, "reading", i);
      break;
    }
    s->stats.bytes_read += (uint64_t)q->slot;
    if ((rc = compute(&p, i, b)) < 0) {
      s->lost = p.resumable; /* its gradient may be partly consumed */
      record(&p, rc, "stepping", i);
      break;
    }
    if (p.err) {
      /* Another partition's write failed meanwhile. A resumable step
       * stepped partition i whole (its outs may alias its gradient, so it
       * cannot be stepped again): its image waits in buffer b for the
       * retry to write it. */
      if (p.resumable) q->state = ZS__PART_WRITING;
      break;
    }
    start_write(&p, i, b);
  }
  /* Drain: every request must be collected before the buffers are reused,
   * also after an error (then their results no longer matter). */
  for (b = 0; b < s->bufcount; b++) {
    if (p.rid[b]) zs_aio_wait(s->aio, p.rid[b]);
    reap_write(&p, b, 1);
  }
  if (!p.err && s->sync_each_step) {
    t0 = zs__now_ns();
    rc = zs__fault_check("swap.sync");
    if (rc == 0) rc = zs_aio_file_sync(s->file);
    s->stats.sync_ns += zs__now_ns() - t0;
    if (rc < 0) record(&p, rc, "syncing after writing", s->nparts - 1);
  }
  s->stats.last_step_ns = zs__now_ns() - t_start;
  s->stats.step_ns += s->stats.last_step_ns;
  if (p.err) {
    s->stats.failed_steps++;
    if (!p.resumable)
      for (i = 0; i < s->nparts; i++) zs__swap_unreserve(s, i);
    if (p.resumable) {
      int moved = 0;
      for (i = 0; i < s->nparts; i++) moved |= s->parts[i].state != ZS__PART_TODO;
      if (!moved) s->inc_step = 0; /* nothing was stepped: as if not called */
    }
    return zs__fail(p.err, "%s", p.msg);
  }
  for (i = 0; i < s->nparts; i++) {
    if (!p.resumable) zs__swap_commit(s, i);
    s->parts[i].state = ZS__PART_TODO;
  }
  s->inc_step = 0;
  s->steps = p.step;
  s->stats.steps++;
  return 0;
}

int zs_swap_abandon_step(zs_swap *s) {
  int i;
  if (!s) return zs__fail(ZS_EINVAL, "zs_swap_abandon_step: s is NULL");
  /* Two slots: a committed partition's step t image is still in its other
   * slot: nothing writes a slot of a partition between its commit and the
   * end of the step (the state writes wait, zs_swap_io_pass too). Compact:
   * that slot was freed by the commit and may hold another partition's new
   * image, so the partition holds no state until it is given one. */
  for (i = 0; i < s->nparts; i++) {
    zs__swap_part *q = &s->parts[i];
    if (q->state == ZS__PART_DONE && s->compact) q->ready = 0, q->dropped = 1;
    if (q->state == ZS__PART_DONE && !s->compact)
      q->loc = q->loc == q->home ? q->home + q->slot : q->home;
    zs__swap_unreserve(s, i);
    q->state = ZS__PART_TODO;
  }
  s->inc_step = 0;
  s->lost = 0;
  return 0;
}

int64_t zs_swap_incomplete_step(const zs_swap *s) {
  return s ? s->inc_step : 0;
}

/* ------------------------------------------------------- disk measurement */

/* Reads zs_swap_io_pass keeps in flight at most (its rslots). */
#define ZS__IO_PASS_MAX_READS 64

int zs_swap_io_pass(zs_swap *s, void *rbuf, int rslots, const void *wbuf,
                    int64_t buflen, int reads, int writes, uint64_t *ns) {
  uint64_t t0;
  int64_t ids[ZS__IO_PASS_MAX_READS];
  int64_t nread = 0;
  int i, rc = 0;
  if (!s || (reads && !rbuf) || (writes && !wbuf))
    return zs__fail(ZS_EINVAL, "zs_swap_io_pass: s, and rbuf for reads and "
                    "wbuf for writes, must not be NULL");
  if ((rc = zs__swap_check_complete(s, "zs_swap_io_pass")) < 0) return rc;
  if (rslots < 1 || rslots > ZS__IO_PASS_MAX_READS || buflen < 1)
    return zs__fail(ZS_EINVAL, "zs_swap_io_pass: rslots = %d must be 1..%d "
                    "and buflen = %lld >= 1", rslots, ZS__IO_PASS_MAX_READS,
                    (long long)buflen);
  t0 = zs__now_ns();
  for (i = 0; i < s->nparts && rc == 0; i++) {
    const zs__swap_part *p = &s->parts[i];
    int64_t k, id;
    for (k = 0; k < p->slot && rc == 0; k += buflen) {
      int64_t len = ZS_MIN(buflen, p->slot - k);
      if (reads) {
        int r = (int)(nread % rslots);
        /* The slot's previous read must be done before it is reused. */
        if (nread >= rslots && (id = zs_aio_wait(s->aio, ids[r])) < 0) {
          rc = (int)id;
          break;
        }
        id = zs_aio_pread(s->aio, s->file, (char *)rbuf + (int64_t)r * buflen,
                          len, p->loc + k);
        if (id < 0) {
          rc = (int)id;
          break;
        }
        ids[r] = id;
        nread++;
      }
      if (writes) {
        id = zs_aio_pwrite(s->aio, s->file, wbuf, len,
                           zs__swap_free_slot(s, i, i) + k);
        if (id < 0) rc = (int)id;
      }
    }
  }
  {
    int64_t w = zs_aio_wait_all(s->aio);
    if (rc == 0 && w < 0) rc = (int)w;
  }
  if (ns) *ns = zs__now_ns() - t0;
  return rc < 0 ? zs__fail_prefix(rc, "zs_swap_io_pass on %s", s->path) : 0;
}
