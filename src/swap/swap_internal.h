/* swap_internal.h - the swapper's handle, shared by the files of the swap
 * area. Their calls run one way:
 *   swap_state.c (state access) and swap_step.c (the pipelined step)
 *     -> swap.c (creation, slots, checks, the kernel call)
 *     -> swap_lock.c (holding the file);
 * nothing calls up, and swap_state.c and swap_step.c call each other in
 * nothing. */
#ifndef ZS_SWAP_INTERNAL_H
#define ZS_SWAP_INTERNAL_H

#include "zs_internal.h"
#include "zspeed/aio.h"
#include "zspeed/optim.h"
#include "zspeed/swap.h"

/* One partition: its size, where its state lives, whether it holds one. */
typedef struct zs__swap_part {
  uint64_t n;
  int64_t home;    /* two slots: file offset of slot 0 (slot 1 follows) */
  int64_t slot;    /* bytes of one slot (image rounded up to the alignment) */
  int64_t image;   /* bytes of the image proper */
  int64_t param_off, m_off, v_off, ms_off, vs_off; /* -1 = absent */
  int64_t loc;     /* file offset of the committed image */
  int64_t pend;    /* offset reserved for its new image (-1: none) */
  int cls;         /* compact layout: its slot size's class */
  int ready;       /* 1 once initialized / loaded */
  int dropped;     /* compact: an abandoned step dropped its state */
  int state;       /* in an incomplete resumable step: ZS__PART_* */
} zs__swap_part;

/* Compact layout: the partitions whose slots have one size share a class,
 * whose spare slots (min(partitions of the class, buffer_count)) and the
 * slots freed by commits are its free list. */
typedef struct zs__swap_class {
  int64_t slot;
  int count, nfree;
  int64_t *free;   /* count + spares entries of room */
} zs__swap_class;

/* A partition's progress in a resumable step (swap.h, "Resumable steps"). */
enum {
  ZS__PART_TODO = 0,    /* not stepped yet: its gradient is unread */
  ZS__PART_WRITING = 1, /* stepped; its new image waits in buffer
                           part % bufcount until its write succeeds */
  ZS__PART_DONE = 2     /* its new image is written and active */
};

struct zs_swap {
  int nparts;
  zs__swap_part *parts;
  int optimizer, state_dtype;
  double lr, beta1, beta2, eps, weight_decay;
  int adamw_mode, bias_correction, num_threads;
  zs_pool *pool;
  int sync_each_step;
  int64_t steps;
  /* I/O */
  zs_aio *aio;
  zs_aio_file *file;
  intptr_t owner;   /* the handle that marks the file as in use (swap_lock.c) */
  char *path;
  int64_t file_bytes;
  int compact;      /* one slot per partition plus spares (swap.h) */
  int nclasses;
  zs__swap_class *classes;
  int bufcount;
  size_t bufbytes;  /* bytes of each pinned buffer (largest slot) */
  void **bufs;
  int locked;
  /* Resumable steps: the number of the step that failed partway (0: none
   * is incomplete); lost = its failure may have consumed a gradient that
   * was not stepped (only zs_swap_abandon_step is possible then); spare =
   * a scratch buffer for the state reads allowed meanwhile, as buffers
   * hold images still to be written. */
  int64_t inc_step;
  int lost;
  void *spare;
  zs_swap_stats stats;
};

/* swap_lock.c: creates (O_EXCL unless overwrite) and holds the swap file at
 * path, so that no other swapper or reclaim takes it while this one lives;
 * ZS_EEXIST says whether an existing file is in use or was left by a dead
 * process, ZS_EBUSY refuses to overwrite a file in use. */
int zs__swap_claim(const char *path, int overwrite, intptr_t *owner);
/* Removes the owned file at path and releases it (*owner becomes -1). */
int zs__swap_unlink_owned(const char *path, intptr_t *owner);
/* Releases an owner handle (-1 is ignored). */
void zs__swap_release(intptr_t owner);

/* ------------------------------------------------- swap.c, for the others */

/* ZS_ESTATE naming fn if a resumable step is incomplete (calls that write
 * state must wait for it to be completed or abandoned). */
int zs__swap_check_complete(const zs_swap *s, const char *fn);
/* Size in bytes of one state element (1 for Q8). */
size_t zs__swap_state_es(int state_dtype);
/* Where part's next image goes: its reserved offset if it has one, else a
 * new reservation (two slots: the slot not committed; compact: a free slot
 * of its class, of which there is always one while at most buffer_count
 * writes are pending per class). */
int64_t zs__swap_reserve(zs_swap *s, int part);
/* The write to part's reservation succeeded: it becomes the committed
 * image and (compact) the old image's slot is free. */
void zs__swap_commit(zs_swap *s, int part);
/* part's reservation will not be committed: its slot is free again. */
void zs__swap_unreserve(zs_swap *s, int part);
/* A slot that holds no state now, for zs_swap_io_pass to overwrite: two
 * slots: part's uncommitted one; compact: the k-th free slot of its class
 * (cyclically). */
int64_t zs__swap_free_slot(const zs_swap *s, int part, int64_t k);
/* Runs the configured optimizer on t (t->n == 0: only validates). */
int zs__swap_kernel(const zs_swap *s, const zs_optim_tensors *t, double lr,
                    double beta1, double beta2, double eps, double wd,
                    double grad_scale, int64_t step);
/* Checks the "swap.read"/"swap.write" sites for a completed request. */
int zs__swap_fault(int write, int part);
#endif /* ZS_SWAP_INTERNAL_H */
