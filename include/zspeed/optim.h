/*
 * optim.h - CPU optimizer kernels: AdamW/Adam, Adagrad, Lion and the
 * gradient statistics pass (sum of squares + inf/NaN flag).
 *
 * One step updates n elements of a parameter in place:
 *   param  fp32 (master weights), or bf16/fp16 updated in place;
 *   grad   fp32, bf16 or fp16; every gradient is first multiplied by
 *          cfg->grad_scale (= clip coefficient / loss scale), fused;
 *   states fp32, bf16 or (Adam only) 8-bit blockwise quantized, see below;
 *   out    optional: a bf16 or fp16 copy of the updated weights written in
 *          the same pass (e.g. into a pinned buffer for the host-to-device
 *          copy), or NULL. out may be grad itself (the same pointer and
 *          dtype): each element's gradient is read before its new weight is
 *          written over it, so the step turns a gradient buffer into the
 *          weights in place (ZeRO-3 lands gradients in the parameter shards).
 * All arithmetic is done in fp32 whatever the storage types.
 *
 * Dispatch. The kernel is picked on every call from zs_simd_level(), which
 * honours ZSPEED_SIMD / zs_simd_force(): scalar, avx2 (AVX2+FMA+F16C),
 * avx512 (F+BW+VL+DQ) or neon (arm64). If ZSPEED_SIMD names a level the CPU
 * lacks the step fails with ZS_ESIMD and modifies nothing.
 *
 * Threads. Every call blocks until done and may run concurrently with other
 * calls on other buffers (each runs its own zs_pool_parallel_for). Note that
 * torch's OpenMP workers busy-wait after torch operations and then compete
 * with the pool for cores; set OMP_WAIT_POLICY=PASSIVE when both share them
 * (see bench/RESULTS.md).
 *
 * Determinism. Work is split into chunks of ZS_OPTIM_CHUNK elements (a
 * multiple of every vector width and of the quantization block) handed to
 * zs_pool_parallel_for; vector tails are processed by the vector body on a
 * zero-padded copy, so every element gets the same bits for any thread count.
 * Moreover every ISA performs the same IEEE operations in the same order
 * (fused multiply-adds exactly where the scalar reference uses a correctly
 * rounded fma), so scalar, AVX2, AVX-512 and NEON give bit-identical
 * results as well (tested).
 *
 * Rounding. Every narrowing store (bf16/fp16 params, bf16 states, the out
 * copy) rounds to nearest even. Round-to-nearest was chosen over stochastic
 * rounding because it is deterministic (restarts and any thread count give
 * the same bits) and needs no RNG state in checkpoints. Its known cost: a bf16
 * state whose relative change per step is below 2^-9 does not move (e.g. a
 * second moment decaying by beta2 = 0.999 while the gradient is zero). Use
 * fp32 or int8 states (whose per-block scale tracks such decay) when that
 * matters.
 *
 * 8-bit states (ZS_DTYPE_Q8, AdamW/Adam only). Elements are grouped in
 * blocks of ZS_OPTIM_QBLOCK = 256 consecutive elements; each block has one
 * fp32 scale per state. With t = q / 127 (m) or t = q / 255 (v):
 *   m (int8, signed):   m = m_scale * t * |t|       (signed square map)
 *   v (uint8):          sqrt(v) = v_scale * t * t  (v_scale = max sqrt(v))
 * i.e. the square map spends the codes densely near zero, where most
 * moments are, and v is stored through sqrt(v): the quantity the update
 * divides by, with half the dynamic range of v. Relative to the block maximum
 * the smallest non-zero m is 1/16129 and the smallest non-zero v is
 * 1/4.2e9. Codes are the nearest ones, ties up: with M the block maximum
 * and t = fl(|m| * fl(127^2 / M)) (t = fl(sqrt(v) * fl(255^2 / M)) for v),
 * the code magnitude is the integer q with (q - 1/2)^2 <= t < (q + 1/2)^2,
 * decided exactly (a NaN state gets code 0). A step dequantizes the block,
 * runs the fp32 update, and requantizes with the new block maxima.
 * Quantization can make |m| inconsistent with v (m rounded up while v
 * rounded to zero would give a huge m / eps step), so in
 * 8-bit mode m is clamped to +-C*sqrt(v) with
 * C = (1-beta1) / sqrt((1-beta2) * (1 - beta1^2/beta2)): exact Adam moments
 * always satisfy this bound (Cauchy-Schwarz), so it only removes quantization
 * artefacts (no clamp when beta1^2 >= beta2). Zero-filled codes and scales
 * are the zero state.
 *
 * Validation happens before anything is written: NULL pointers, a pointer
 * not aligned to its element size, any two buffers overlapping (but out
 * being grad itself, above), unsupported
 * dtypes or combinations, non-finite or out-of-range hyperparameters and
 * amsgrad all fail with a clear zs_last_error() and leave every buffer
 * untouched.
 */
#ifndef ZSPEED_OPTIM_H
#define ZSPEED_OPTIM_H

#include "zspeed/zspeed.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of optimizer buffers. */
enum zs_dtype {
  ZS_DTYPE_F32 = 0,
  ZS_DTYPE_BF16 = 1,
  ZS_DTYPE_F16 = 2,
  /* States only (Adam): m as int8, v as uint8, one fp32 scale per block. */
  ZS_DTYPE_Q8 = 3,
  /* out_dtype when there is no out buffer. */
  ZS_DTYPE_NONE = -1
};

/* Elements per thread-pool chunk; a multiple of ZS_OPTIM_QBLOCK and of every
 * vector width. */
#define ZS_OPTIM_CHUNK 16384
/* Elements per 8-bit quantization block. */
#define ZS_OPTIM_QBLOCK 256

/* The buffers of one tensor's step. Unused pointers must be NULL.
 *   AdamW/Adam: m = exp_avg, v = exp_avg_sq.
 *   Adagrad:    v = state_sum (m must be NULL).
 *   Lion:       m = exp_avg   (v must be NULL).
 * m_scale / v_scale: ZS_DTYPE_Q8 only, zs_optim_qblocks(n) floats each. */
typedef struct zs_optim_tensors {
  size_t n;
  void *param;
  int param_dtype;   /* F32, BF16 or F16 */
  const void *grad;
  int grad_dtype;    /* F32, BF16 or F16 */
  void *m;
  void *v;
  int state_dtype;   /* F32, BF16, or Q8 (Adam only) */
  float *m_scale;
  float *v_scale;
  void *out;         /* optional copy of the updated params, or NULL */
  int out_dtype;     /* BF16 or F16 with out; ignored without */
} zs_optim_tensors;

/* Fills t with n = 0, NULL pointers, fp32 dtypes and no out buffer. */
ZS_EXTERN void zs_optim_tensors_init(zs_optim_tensors *t);

/* Number of quantization blocks (= scales per state) for n elements. */
ZS_EXTERN size_t zs_optim_qblocks(size_t n);

/* ------------------------------------------------------------ AdamW/Adam */

/* torch.optim.AdamW (adamw_mode = 1) / torch.optim.Adam (adamw_mode = 0) with
 * amsgrad off. For step t (1-based, counted by the caller):
 *   g  = grad * grad_scale;  if Adam: g += weight_decay * p
 *   m  = beta1 * m + (1 - beta1) * g
 *   v  = beta2 * v + (1 - beta2) * g^2
 *   if AdamW: p *= 1 - lr * weight_decay
 *   p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)
 * with bc1 = 1 - beta1^t, bc2 = 1 - beta2^t, or bc1 = bc2 = 1 when
 * bias_correction = 0 (DeepSpeed's option; torch always corrects). */
typedef struct zs_adam_config {
  double lr;           /* >= 0; default 1e-3 */
  double beta1;        /* in [0, 1); default 0.9 */
  double beta2;        /* in [0, 1); default 0.999 */
  double eps;          /* >= 0; default 1e-8 */
  double weight_decay; /* >= 0; default 0 */
  double grad_scale;   /* finite; default 1 */
  int64_t step;        /* >= 1: this update's step number; default 1 */
  int adamw_mode;      /* 1 = decoupled decay (default), 0 = L2 (Adam) */
  int bias_correction; /* default 1 */
  int amsgrad;         /* must be 0: refused with ZS_ENOTSUP */
  int num_threads;     /* threads incl. the caller; 0 = all of the pool */
  zs_pool *pool;       /* NULL = zs_pool_default() */
} zs_adam_config;

ZS_EXTERN void zs_adam_config_init(zs_adam_config *cfg);
ZS_EXTERN int zs_adam_step(const zs_adam_config *cfg,
                           const zs_optim_tensors *t);

/* --------------------------------------------------------------- Adagrad */

/* torch.optim.Adagrad with lr_decay = 0 (anything else: ZS_ENOTSUP):
 *   g = grad * grad_scale + weight_decay * p
 *   v += g^2;  p -= lr * g / (sqrt(v) + eps)
 * initial_accumulator_value is the caller's initial fill of v. States fp32
 * or bf16. */
typedef struct zs_adagrad_config {
  double lr;           /* >= 0; default 1e-2 */
  double lr_decay;     /* must be 0 */
  double weight_decay; /* >= 0; default 0 */
  double eps;          /* >= 0; default 1e-10 */
  double grad_scale;   /* default 1 */
  int num_threads;
  zs_pool *pool;
} zs_adagrad_config;

ZS_EXTERN void zs_adagrad_config_init(zs_adagrad_config *cfg);
ZS_EXTERN int zs_adagrad_step(const zs_adagrad_config *cfg,
                              const zs_optim_tensors *t);

/* ------------------------------------------------------------------ Lion */

/* Lion (Chen et al. 2023, as in lion-pytorch):
 *   g = grad * grad_scale;  c = beta1 * m + (1 - beta1) * g
 *   p = p * (1 - lr * weight_decay) - lr * sign(c)      (sign(0) = 0)
 *   m = beta2 * m + (1 - beta2) * g
 * States fp32 or bf16. */
typedef struct zs_lion_config {
  double lr;           /* >= 0; default 1e-4 */
  double beta1;        /* in [0, 1]; default 0.9 */
  double beta2;        /* in [0, 1]; default 0.99 */
  double weight_decay; /* >= 0; default 0 */
  double grad_scale;   /* default 1 */
  int num_threads;
  zs_pool *pool;
} zs_lion_config;

ZS_EXTERN void zs_lion_config_init(zs_lion_config *cfg);
ZS_EXTERN int zs_lion_step(const zs_lion_config *cfg,
                           const zs_optim_tensors *t);

/* ---------------------------------------------------------- grad stats */

/* Sum of squares of (scale * g) over n elements of dtype (F32/BF16/F16),
 * accumulated in float64, and whether any scaled element is inf or NaN.
 * Deterministic: each ZS_OPTIM_CHUNK-element chunk is summed into 16 fixed
 * lanes (element i into lane i % 16, in index order), lanes are added in
 * order, chunk partials are added in chunk order; scale * g is rounded to
 * fp32 and its square is exact in float64, so the result is the same for any
 * thread count and any SIMD level. *nonfinite (may be NULL) is 1 when the
 * sum is not finite, which happens exactly when an element is inf/NaN.
 * *sumsq is then +inf or NaN. num_threads 0 = all of the pool; pool NULL =
 * zs_pool_default(). */
ZS_EXTERN int zs_grad_stats(const void *g, int dtype, size_t n, double scale,
                            zs_pool *pool, int num_threads, double *sumsq,
                            int *nonfinite);

/* ------------------------------------------------------ 8-bit helpers */

/* Converts 8-bit Adam states (n elements, zs_optim_qblocks(n) scales each)
 * to fp32 m and v, by the map documented above. Either output may be NULL
 * to skip it (its inputs may then be NULL too). */
ZS_EXTERN int zs_adam_q8_dequantize(const int8_t *m, const float *m_scale,
                                    const uint8_t *v, const float *v_scale,
                                    size_t n, float *m_out, float *v_out);
/* The inverse: quantizes fp32 m and v (v >= 0) into 8-bit states, e.g. to
 * convert fp32 optimizer states loaded from a checkpoint. */
ZS_EXTERN int zs_adam_q8_quantize(const float *m, const float *v, size_t n,
                                  int8_t *m_q, float *m_scale, uint8_t *v_q,
                                  float *v_scale);

#ifdef __cplusplus
}
#endif
#endif /* ZSPEED_OPTIM_H */
