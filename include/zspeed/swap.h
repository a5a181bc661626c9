/*
 * swap.h - ZeRO-Infinity optimizer offload to NVMe: the optimizer state of N
 * parameter partitions lives in a file, and one call runs a whole optimizer
 * step as a pipeline that reads partition i+1 while partition i is stepped
 * on the thread pool while partition i-1 is written back.
 *
 * State of a partition of n elements (its "image"):
 *   param   fp32 master weights           n * 4 bytes
 *   m       Adam exp_avg / Lion exp_avg   n * es   (not for Adagrad)
 *   v       Adam exp_avg_sq / Adagrad sum n * es   (not for Lion)
 *   m_scale, v_scale  8-bit Adam only: zs_optim_qblocks(n) floats each
 * with es = 4 (ZS_DTYPE_F32), 2 (ZS_DTYPE_BF16) or 1 (ZS_DTYPE_Q8, Adam
 * only); see optim.h for the numerics, which are exactly those of
 * zs_adam_step / zs_adagrad_step / zs_lion_step on the same buffers in RAM
 * (bit for bit: the swapper calls them). Each array starts at a multiple of
 * 64 bytes inside the image, in the order above; zs_swap_read_arrays /
 * zs_swap_write_arrays read and replace them by name, and zs_swap_layout()
 * gives the offsets for inspecting raw images.
 *
 * Storage: one file, <path>/<name>.swap, preallocated at creation, holding
 * two slots (A and B) per partition, each slot rounded up to the direct I/O
 * alignment. One file rather than one per partition because (1) space is
 * reserved once, up front, so running out of disk is reported by
 * zs_swap_create and not in the middle of step 1000 (on file systems that
 * honour preallocation; copy-on-write ones can still fail later, which the
 * step handles), (2) thousands of partitions need one descriptor, not
 * thousands, and (3) cleanup is one unlink. The file is opened with direct
 * I/O where the file system allows it (zs_swap_direct says which) and is
 * scratch space: it is deleted by zs_swap_destroy, and it is not a
 * checkpoint (use zs_swap_get_state / zs_swap_read_image for that).
 *
 * Compact layout (cfg.compact = 1): one slot per partition plus spare
 * slots, about half the disk. The partitions whose slots have the same
 * size share min(their number, buffer_count) spares; each write goes to a
 * free slot of the partition's size and the slot of the image it replaces
 * is free once the write succeeded. Partitions of one size (the front
 * end's, but for the last) thus cost their state once plus buffer_count
 * slots; partitions of all different sizes cost as much as two slots.
 * Steps must be resumable (a plain step: ZS_EINVAL), since the step t
 * image of a committed partition is overwritten later in the same step,
 * and for the same reason zs_swap_abandon_step cannot return a stepped
 * partition to step t: it drops its state (the partition then holds none:
 * the step and the state reads fail with ZS_ESTATE naming it until
 * zs_swap_set_state, zs_swap_write_image or zs_swap_init_partition gives it
 * one, e.g. from a checkpoint). Everything else is as below, including
 * the state writes' guarantee.
 *
 * Ownership. A swapper holds its file for as long as it exists (POSIX: an
 * exclusive flock() on it; Windows: a handle that refuses deletion), and the
 * operating system drops that hold when the process dies, however it dies.
 * So a swap file nobody holds was left by a dead process and may be deleted,
 * while one that is held belongs to a live swapper: zs_swap_create refuses
 * it (ZS_EEXIST, or ZS_EBUSY with overwrite) and a reclaim must leave it
 * alone. To reclaim a file: take the same hold (POSIX: flock(LOCK_EX |
 * LOCK_NB) on a descriptor of it, then delete it only if that succeeded and
 * the name still refers to the locked file; Windows: delete it, which fails
 * with a sharing violation while a swapper holds it).
 *
 * Crash and error safety. A step reads every partition from its active
 * slot and writes the updated image to the other slot; only when every
 * write of every partition has completed successfully (and, with
 * cfg.sync_each_step, the file was synced) does the swapper flip all active
 * slots at once and count the step. The slot table lives in memory (the
 * file is scratch). Hence, precisely: when zs_swap_step returns an error
 * (ZS_ENOSPC, ZS_EIO, ZS_EOF for a file truncated behind our back, an
 * injected fault, ...), every partition is entirely at the old step t, its
 * state bit-identical to before the call, zs_swap_steps() still returns t,
 * and the next zs_swap_step can simply be retried with the same gradients.
 * The caller's out buffers may have been partly written by a failed step
 * and must be ignored. zs_swap_init_partition / zs_swap_set_state /
 * zs_swap_write_arrays / zs_swap_write_image also write the inactive slot
 * and flip that one partition only after the write succeeded, so a failure
 * leaves its old state. The cost of this guarantee is twice the disk space
 * of the state (the compact layout's resumable steps need the spares
 * only).
 *
 * Resumable steps (args.resumable = 1). Each partition commits on its own:
 * its slot flips as soon as its write succeeded. A failure stops the step
 * partway: partitions then are stepped (at step t + 1, their outs
 * written), stepped with their new image still in a pinned buffer (their
 * outs written, their write failed), or untouched (their gradients
 * unread). zs_swap_incomplete_step() names the step; zs_swap_step again
 * (resumable, the same gradients and outs) completes it, writing the
 * buffered images and stepping only the untouched partitions, each
 * partition stepped once; zs_swap_abandon_step() instead returns every
 * partition to step t (the stepped ones' old images are still in their
 * other slots; a compact file drops the stepped ones' state instead). Meanwhile the state reads work (each partition as
 * committed) and every call that writes state (zs_swap_set_state,
 * zs_swap_write_*, zs_swap_init_partition, zs_swap_set_steps,
 * zs_swap_io_pass), as well as a plain zs_swap_step, fails with
 * ZS_ESTATE. This is what lets an out buffer alias its gradient (a
 * caller that keeps the gradients in the weights' place): no partition's
 * gradient is read twice, and none is lost by a failure. A kernel error
 * (impossible once check_args passed, so not expected) cannot be resumed:
 * the retry fails with ZS_ESTATE and only abandoning remains. Resumable
 * steps cannot sync the file (sync_each_step: ZS_EINVAL).
 *
 * Sizing. Pinned memory is buffer_count x the largest slot. Partitions of
 * 2^21 to 2^23 elements (24 to 96 MiB of fp32 Adam state) keep enough bytes
 * in flight for an NVMe drive with the default 4 buffers; much smaller ones
 * leave the device idle between requests, and few huge ones make the
 * unoverlapped first read and last write (about 1/partitions of the step
 * each) large. `zspeed bench swap` measures the step against its bound.
 *
 * Threads. A swapper is used by one thread at a time (no two calls on the
 * same handle concurrently). The step computes on cfg.pool (with the calling
 * thread) and moves data on the swapper's own aio handle.
 *
 * Test-only fault sites (zs_fault_set), besides those of aio.h and the
 * file layer: "swap.read" / "swap.write" fail the nth partition read /
 * write request of the swapper when it completes (as if the device
 * reported the error), "swap.sync" fails the nth sync.
 */
#ifndef ZSPEED_SWAP_H
#define ZSPEED_SWAP_H

#include "zspeed/zspeed.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Optimizers the swapper can run. */
enum zs_swap_optimizer {
  ZS_SWAP_ADAM = 0,    /* AdamW (adamw_mode 1) or Adam (0), zs_adam_step */
  ZS_SWAP_ADAGRAD = 1, /* zs_adagrad_step */
  ZS_SWAP_LION = 2     /* zs_lion_step */
};

/* Creation parameters. Fill with zs_swap_config_init() first, then change
 * fields: new fields may be added at the end. Hyperparameters that are
 * negative mean "the chosen optimizer's default" (those of optim.h:
 * Adam lr 1e-3, betas 0.9/0.999, eps 1e-8; Adagrad lr 1e-2, eps 1e-10;
 * Lion lr 1e-4, betas 0.9/0.99; weight_decay 0). */
typedef struct zs_swap_config {
  const char *path;      /* directory for the swap file (required) */
  const char *name;      /* file name stem; default "zspeed_swap" */
  int overwrite;         /* 1: replace an existing <name>.swap; default 0 */
  int partitions;        /* number of partitions, >= 1 */
  const uint64_t *sizes; /* elements of each partition (>= 1 each) */
  int buffer_count;      /* pinned buffers, >= 1; default 4 (>= 3 overlaps
                            read, compute and write) */
  int optimizer;         /* enum zs_swap_optimizer; default ZS_SWAP_ADAM */
  int state_dtype;       /* ZS_DTYPE_F32 (default), BF16, or Q8 (Adam) */
  double lr, beta1, beta2, eps, weight_decay; /* see above; default -1 */
  int adamw_mode;        /* Adam: 1 = AdamW (default), 0 = L2 */
  int bias_correction;   /* Adam: default 1 */
  int num_threads;       /* compute threads incl. the caller; 0 = pool + 1 */
  zs_pool *pool;         /* NULL = zs_pool_default() */
  /* aio engine: NULL = zs_aio_config_init defaults with block_size 4 MiB
   * and queue_depth 32 (really a const zs_aio_config *, see aio.h). */
  const void *aio;
  int direct;            /* enum zs_aio_direct: AUTO (default), ON, OFF */
  int sync_each_step;    /* 1: fsync the file before committing a step */
  int compact;           /* 1: the compact layout (see above); default 0 */
} zs_swap_config;

/* Per-step arguments. Fill with zs_swap_step_args_init() first. */
typedef struct zs_swap_step_args {
  /* One gradient per partition (partitions pointers, none NULL), each of
   * the partition's size in grad_dtype (F32, BF16 or F16; default F32). */
  const void *const *grads;
  int grad_dtype;
  /* NULL, or one pointer per partition (an entry may be NULL) receiving the
   * updated weights as out_dtype (BF16, F16 or F32; default BF16). F32 is a
   * plain copy of the updated fp32 masters, for models trained in fp32. */
  void *const *outs;
  int out_dtype;
  double grad_scale; /* multiplies every gradient (default 1) */
  double lr;         /* this step's lr; negative = the current lr (default) */
  /* Adam's step number for bias correction, in [0, 2^63 - 2]; 0 (default)
   * = zs_swap_steps() + 1. The committed step count becomes this number. */
  int64_t step;
  /* 1: a resumable step (see "Resumable steps" above); default 0. */
  int resumable;
} zs_swap_step_args;

/* Statistics, cumulative since creation or the last reset. The step's wall
 * time splits into compute_ns (the caller running optimizer kernels),
 * read_wait_ns (blocked until a partition's read finished), write_wait_ns
 * (blocked until a write freed a buffer or, at the end, until the last
 * writes landed) and the small rest (bookkeeping). read_wait + write_wait
 * large next to compute means the disk bounds the step. */
typedef struct zs_swap_stats {
  uint64_t steps, failed_steps;
  uint64_t bytes_read, bytes_written;
  uint64_t step_ns, compute_ns, read_wait_ns, write_wait_ns, sync_ns;
  uint64_t last_step_ns;
} zs_swap_stats;

typedef struct zs_swap zs_swap;

ZS_EXTERN void zs_swap_config_init(zs_swap_config *cfg);
ZS_EXTERN void zs_swap_step_args_init(zs_swap_step_args *args);

/* Creates the swap file (preallocated to zs_swap_file_bytes), the pinned
 * buffers (zs_alloc_pinned with ZS_PIN_FALLBACK) and the aio handle. Every
 * partition then needs zs_swap_init_partition, zs_swap_set_state or
 * zs_swap_write_image before the first step (which otherwise fails with
 * ZS_ESTATE naming the partition). Validates
 * everything first: bad sizes, dtypes or hyperparameters -> ZS_EINVAL /
 * ZS_EDTYPE; an existing file without overwrite -> ZS_EEXIST (the message
 * says whether a live swapper holds it or a dead process left it); with
 * overwrite, a file a live swapper holds -> ZS_EBUSY; not enough disk ->
 * ZS_ENOSPC naming the bytes needed. */
ZS_EXTERN int zs_swap_create(zs_swap **out, const zs_swap_config *cfg);
/* Waits for nothing (no I/O is in flight between calls), frees the buffers
 * and deletes the swap file. Returns 0 or the error of closing/removing the
 * file (the handle is freed either way). NULL is ignored. */
ZS_EXTERN int zs_swap_destroy(zs_swap *s);

/* Sets partition part's master weights to params (n fp32 values) and its
 * optimizer state to zero (Adam/Lion m = 0, v = 0; Adagrad's sum = 0). */
ZS_EXTERN int zs_swap_init_partition(zs_swap *s, int part,
                                     const float *params);

/* Runs one optimizer step over every partition (see the top of this file
 * for the pipeline and the error guarantee). */
ZS_EXTERN int zs_swap_step(zs_swap *s, const zs_swap_step_args *args);

/* After a resumable step failed partway: its step number (until it is
 * completed or abandoned), else 0. */
ZS_EXTERN int64_t zs_swap_incomplete_step(const zs_swap *s);
/* Returns every partition to the last completed step after a resumable
 * step failed partway (its outs must be ignored; a compact file drops the
 * stepped partitions' state instead, see "Compact layout"); 0 when none is
 * incomplete. */
ZS_EXTERN int zs_swap_abandon_step(zs_swap *s);

/* Changes hyperparameters for later steps; negative = keep the current
 * value. Validated before anything changes. */
ZS_EXTERN int zs_swap_set_hparams(zs_swap *s, double lr, double beta1,
                                  double beta2, double eps,
                                  double weight_decay);
/* The current hyperparameters (any pointer may be NULL). */
ZS_EXTERN void zs_swap_get_hparams(const zs_swap *s, double *lr,
                                   double *beta1, double *beta2, double *eps,
                                   double *weight_decay);

/* Committed steps (successful zs_swap_step calls, or the value set). */
ZS_EXTERN int64_t zs_swap_steps(const zs_swap *s);
/* Sets the step counter, e.g. after resuming from a checkpoint: steps in
 * [0, 2^63 - 2], so that the next step's number exists (else ZS_EINVAL). */
ZS_EXTERN int zs_swap_set_steps(zs_swap *s, int64_t steps);

/* ------------------------------------------------- checkpoint state */

/* Reads partition part's state as fp32 (bf16 and 8-bit states are
 * converted exactly as the kernels see them). Any of param, m, v may be
 * NULL to skip it; m of Adagrad and v of Lion must be NULL. */
ZS_EXTERN int zs_swap_get_state(zs_swap *s, int part, float *param, float *m,
                                float *v);
/* Replaces partition part's state from fp32 arrays (converted to the state
 * dtype: bf16 rounds to nearest even, 8-bit quantizes with
 * zs_adam_q8_quantize). m / v NULL = zero. param must not be NULL. */
ZS_EXTERN int zs_swap_set_state(zs_swap *s, int part, const float *param,
                                const float *m, const float *v);
/* Reads partition part's arrays exactly as stored, without conversion:
 * param (n floats), m and v (n elements of the state dtype: float for
 * ZS_DTYPE_F32, the uint16_t bit patterns of ZS_DTYPE_BF16, int8_t m and
 * uint8_t v for ZS_DTYPE_Q8) and, for ZS_DTYPE_Q8 only, m_scale and v_scale
 * (zs_optim_qblocks(n) floats each). Any pointer may be NULL to skip that
 * array; 8-bit codes come with their scales (m with m_scale, v with
 * v_scale, or neither), m of Adagrad and v of Lion must be NULL. */
ZS_EXTERN int zs_swap_read_arrays(zs_swap *s, int part, float *param, void *m,
                                  void *v, float *m_scale, float *v_scale);
/* Replaces the named arrays of partition part, typed as for
 * zs_swap_read_arrays; every array passed as NULL keeps its stored bytes
 * bit for bit (zeros for a partition that holds no state yet). For
 * example, param alone replaces the master weights and keeps 8-bit states
 * unrequantized. The same arrays are required together as for reading.
 * Written like zs_swap_set_state: a failure keeps the old state. */
ZS_EXTERN int zs_swap_write_arrays(zs_swap *s, int part, const float *param,
                                   const void *m, const void *v,
                                   const float *m_scale,
                                   const float *v_scale);
/* Bytes of partition part's image (zs_swap_layout's total), or a negative
 * ZS_E* code. */
ZS_EXTERN int64_t zs_swap_image_bytes(const zs_swap *s, int part);
/* Offsets of the arrays in partition part's image: param, m, v, m_scale,
 * v_scale (-1 for an array this optimizer/dtype does not have) and the
 * image's total bytes; any pointer may be NULL. For inspecting raw images
 * (tests, tools); zs_swap_read_arrays / zs_swap_write_arrays reach every
 * array without knowing the layout. */
ZS_EXTERN int zs_swap_layout(const zs_swap *s, int part, int64_t *param_off,
                             int64_t *m_off, int64_t *v_off,
                             int64_t *m_scale_off, int64_t *v_scale_off,
                             int64_t *total);
/* The raw image, exactly as stepped (bit-exact checkpoints of 8-bit
 * states, which a fp32 round trip would requantize). buf holds exactly
 * zs_swap_image_bytes(s, part) bytes; padding between arrays is zero. */
ZS_EXTERN int zs_swap_read_image(zs_swap *s, int part, void *buf,
                                 int64_t len);
ZS_EXTERN int zs_swap_write_image(zs_swap *s, int part, const void *buf,
                                  int64_t len);

/* -------------------------------------------------------- information */

ZS_EXTERN int zs_swap_partitions(const zs_swap *s);
ZS_EXTERN uint64_t zs_swap_partition_size(const zs_swap *s, int part);
/* The swap file's path and size (2 slots per partition, or compact: 1 and
 * the spares). */
ZS_EXTERN const char *zs_swap_file_path(const zs_swap *s);
ZS_EXTERN int64_t zs_swap_file_bytes(const zs_swap *s);
/* 1 if the file has the compact layout. */
ZS_EXTERN int zs_swap_compact(const zs_swap *s);
/* 1 if partition part holds state (it was initialized or written and no
 * abandoned step of a compact file dropped it), 0 if not or out of range. */
ZS_EXTERN int zs_swap_holds_state(const zs_swap *s, int part);
/* 1 if the file does direct I/O, 0 if buffered, and why. */
ZS_EXTERN int zs_swap_direct(const zs_swap *s);
ZS_EXTERN const char *zs_swap_direct_why(const zs_swap *s);
/* Whether the buffers are page-locked (0 if the lock limit refused). */
ZS_EXTERN int zs_swap_buffers_locked(const zs_swap *s);
/* The aio backend in use ("io_uring", "threads", "iocp"). */
ZS_EXTERN const char *zs_swap_backend(const zs_swap *s);

ZS_EXTERN void zs_swap_stats_get(const zs_swap *s, zs_swap_stats *out);
ZS_EXTERN void zs_swap_stats_reset(zs_swap *s);

/* ------------------------------------------------- disk measurement */

/* Measures the disk under the swapper: the I/O of one step without the
 * optimizer, on the swap file itself, so the result is the bound a step
 * can reach on these blocks of this device (`zspeed bench swap` divides
 * the bytes a step moves by it). With reads != 0 it reads every
 * partition's committed image; with writes != 0 it writes as many bytes
 * of wbuf into slots that hold no state (each partition's other slot, or
 * a compact file's free slots, cyclically; no step or state call reads
 * such a slot before writing it). Requests are at most buflen
 * bytes, issued in partition order (read i, write i, read i+1, ...), with
 * every write and up to rslots (1..64) reads in flight, each read into its
 * own buflen-byte part of rbuf (rslots * buflen bytes; wbuf holds buflen
 * bytes). What the buffers contain does not matter; pinned memory
 * (zs_alloc_pinned) avoids bounce copies on direct I/O. The state, the
 * step count and zs_swap_stats do not change. *ns (may be NULL) receives
 * the elapsed nanoseconds. Returns 0, ZS_EINVAL for bad arguments, or the
 * first I/O error. Like every call, not concurrent with another call on
 * the same swapper. */
ZS_EXTERN int zs_swap_io_pass(zs_swap *s, void *rbuf, int rslots,
                              const void *wbuf, int64_t buflen, int reads,
                              int writes, uint64_t *ns);

#ifdef __cplusplus
}
#endif
#endif /* ZSPEED_SWAP_H */
