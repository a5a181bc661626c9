/* optim_internal.h - what the optimizer driver (optim.c) shares with the
 * kernel files. The driver validates, derives the fp32 constants below once
 * per call, and runs one kernel per ZS_OPTIM_CHUNK chunk on the thread pool.
 * Kernels see the pointers of their chunk already advanced to its first
 * element and index from 0; the 8-bit block loop, which needs absolute
 * block numbers for the scales, lives in the driver and calls the kernels'
 * two block passes. Dependencies run one way, with this file at the bottom:
 *   optim.c -> the kernel tables declared below, nothing else of the kernel
 *              files;
 *   optim_scalar.c      = optim_vec_scalar.h + optim_adam.h + its loops;
 *   optim_<isa>.c       = optim_vec_<isa>.h + optim_body.h (which includes
 *                         optim_adam.h), for avx2, avx512 and neon;
 * and no kernel file or header calls or includes the driver. */
#ifndef ZS_OPTIM_INTERNAL_H
#define ZS_OPTIM_INTERNAL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "zspeed/optim.h"

/* Vector bodies must be inlined into their loops for the constants to stay
 * in registers (they are also called through pointers for the tails). */
#if defined(__GNUC__) || defined(__clang__)
#  define ZS__FORCE_INLINE static inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#  define ZS__FORCE_INLINE static __forceinline
#else
#  define ZS__FORCE_INLINE static inline
#endif

/* A hint to bring the cache line at p in for reading; nothing where the
 * compiler has no portable way to say it. */
#if defined(__GNUC__) || defined(__clang__)
#  define ZS__PREFETCH(p) __builtin_prefetch((p), 0, 3)
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#  include <xmmintrin.h>
#  define ZS__PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)
#else
#  define ZS__PREFETCH(p) ((void)(p))
#endif

/* Everything a kernel needs; all arithmetic constants are fp32 so that every
 * ISA computes with the same operands. */
typedef struct zs__optim_args {
  char *param;
  const char *grad;
  char *m;
  char *v;
  float *m_scale;
  float *v_scale;
  char *out;
  int pd, gd, sd, od; /* dtypes; od = ZS_DTYPE_NONE without out */
  int l2;             /* add weight_decay * p to the gradient */
  int clamp;          /* 8-bit Adam: clamp |m| <= clampc * sqrt(v) */
  float gs;           /* gradient multiplier */
  float b1, omb1, b2, omb2; /* beta1, 1 - beta1, beta2, 1 - beta2 */
  float eps, wd;
  float decay;        /* multiplier of p before the update (1 if none) */
  float neg_step;     /* -lr / bc1 (Adam), -lr (Adagrad, Lion) */
  float rbc2;         /* 1 / sqrt(bc2) (Adam) */
  float clampc;
} zs__optim_args;

/* A kernel updates elements [0, n) of a, whose pointers are advanced to
 * the first element of a chunk (a chunk starts at a multiple of
 * ZS_OPTIM_CHUNK, hence of ZS_OPTIM_QBLOCK and of every vector width).
 * Used for fp32 and bf16 states; 8-bit states go through zs__q8_ops. */
typedef void (*zs__optim_fn)(const zs__optim_args *a, size_t n);
/* Sum of squares of (float)(g[i] * scale) over [begin, end) as documented
 * for zs_grad_stats: 16 float64 lanes, element i in lane (i - begin) % 16,
 * lanes added 0..15. */
typedef double (*zs__sumsq_fn)(const void *g, int dtype, float scale,
                               size_t begin, size_t end);

/* The two passes over one block of 8-bit states that each kernel table
 * supplies; the loop over the blocks (optim.c) is the same for all. One
 * block of ZS_OPTIM_QBLOCK elements takes two passes over fp32 scratch
 * that stays in L1:
 *   moments: dequantize the codes in registers, update m and v, store m
 *            and s = sqrt(v) into the scratch, keep the block maxima of |m|
 *            and s in registers;
 *   finish:  update the params from the scratch (the divide) and, in the
 *            same loop, requantize the scratch against those maxima.
 * The requantization needs the block maxima, so a second pass over the
 * scratch is unavoidable; the parameter update (the divide) goes there
 * rather than into the first pass, so that each pass has one long-latency
 * operation (the square root, the divide) with independent work beside it.
 * The short last block runs on zero-padded copies (optim.c). */
typedef struct zs__q8_ops {
  /* a points at the block (param, grad, out at its first element); mq/vq
   * and ms/vs are its codes and scales. Writes mt = m and st = sqrt(v) for
   * all ZS_OPTIM_QBLOCK elements and the maxima of |m| and of s in the
   * MAXPS sense (NaN never enters a maximum). Reads param only for Adam's
   * L2 term; writes nothing else. */
  void (*moments)(const zs__optim_args *a, const int8_t *mq, float ms,
                  const uint8_t *vq, float vs, float *mt, float *st,
                  float *mmax, float *smax);
  /* Updates param (and out) of the block from mt and st, and writes the
   * codes of mt and st against the maxima mmax and smax. */
  void (*finish)(const zs__optim_args *a, const float *mt, const float *st,
                 float mmax, float smax, int8_t *mq, uint8_t *vq);
} zs__q8_ops;

typedef struct zs__optim_kernels {
  const char *name;
  zs__optim_fn adam;   /* fp32 or bf16 states */
  zs__q8_ops adam_q8;  /* 8-bit states */
  zs__optim_fn adagrad;
  zs__optim_fn lion;
  zs__sumsq_fn sumsq;
} zs__optim_kernels;

extern const zs__optim_kernels zs__optim_scalar;
#if defined(__x86_64__) || defined(_M_X64)
#  define ZS__OPTIM_X86 1
extern const zs__optim_kernels zs__optim_avx2;
extern const zs__optim_kernels zs__optim_avx512;
#endif
#if defined(__aarch64__) || defined(_M_ARM64)
#  define ZS__OPTIM_NEON 1
extern const zs__optim_kernels zs__optim_neon;
#endif

/* Bytes per element of a (non-Q8) dtype. */
static inline size_t zs__dtype_size(int dt) {
  return dt == ZS_DTYPE_F32 ? 4 : 2;
}

/* ------------------------------------------------ scalar conversions.
 * Round-to-nearest-even, identical to what F16C and the AVX2/AVX-512 integer
 * sequences produce, so the ISAs agree bit for bit. */

static inline float zs__bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint32_t zs__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static inline float zs__bf16_to_f32(uint16_t h) {
  return zs__bits_f32((uint32_t)h << 16);
}

static inline uint16_t zs__f32_to_bf16(float f) {
  uint32_t x = zs__f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static inline float zs__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    /* Zero or subnormal: m * 2^-24 is exact in fp32. */
    float f = (float)m * 5.9604644775390625e-8f;
    return zs__bits_f32(zs__f32_bits(f) | sign);
  }
  if (e == 31) return zs__bits_f32(sign | 0x7f800000u | (m << 13));
  return zs__bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static inline uint16_t zs__f32_to_f16(float f) {
  uint32_t x = zs__f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) /* NaN: quiet, keep the top payload bits */
    return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 */
  if (x < 0x38800000u) {
    /* Below the smallest normal half: adding 0.5 puts the value in units of
     * 2^-24 into the low mantissa bits, rounded to nearest even by the FPU
     * (a carry into 0x400 is the correct smallest normal). */
    float a = zs__bits_f32(x) + 0.5f;
    return (uint16_t)(sign | (zs__f32_bits(a) - 0x3f000000u));
  }
  x += 0xc8000fffu + ((x >> 13) & 1u); /* rebias exponent, round */
  return (uint16_t)(sign | (x >> 13));
}

static inline float zs__load(const void *base, int dt, size_t i) {
  if (dt == ZS_DTYPE_F32) return ((const float *)base)[i];
  if (dt == ZS_DTYPE_BF16) return zs__bf16_to_f32(((const uint16_t *)base)[i]);
  return zs__f16_to_f32(((const uint16_t *)base)[i]);
}

static inline void zs__store(void *base, int dt, size_t i, float x) {
  if (dt == ZS_DTYPE_F32)
    ((float *)base)[i] = x;
  else if (dt == ZS_DTYPE_BF16)
    ((uint16_t *)base)[i] = zs__f32_to_bf16(x);
  else
    ((uint16_t *)base)[i] = zs__f32_to_f16(x);
}

/* A correctly rounded fmaf for the scalar kernels, independent of the C
 * library (MinGW's fmaf is not correctly rounded, which broke the promise
 * that every ISA gives the same bits). a*b is exact in double; TwoSum gives
 * the exact error of the double sum; the only way the final rounding to
 * float can then go wrong is a double result exactly halfway between two
 * floats, where the sign of the error breaks the tie. */
static inline float zs__fmaf(float a, float b, float c) {
  double xy = (double)a * (double)b;
  double s = xy + (double)c;
  double bb = s - xy;
  double err = (xy - (s - bb)) + ((double)c - bb);
  float f = (float)s;
  if (err != 0.0 && (double)f != s) {
    float g = nextafterf(f, s > (double)f ? INFINITY : -INFINITY);
    if ((double)f + (double)g == 2.0 * s) f = ((err > 0) == (g > f)) ? g : f;
  }
  return f;
}

/* max/min with the x86 MAXPS/MINPS rule (second operand if unordered), so
 * the scalar reference matches the vector code even for NaN. */
static inline float zs__maxps(float a, float b) { return a > b ? a : b; }
static inline float zs__minps(float a, float b) { return a < b ? a : b; }

/* ------------------------------------------------- 8-bit state helpers */

#define ZS__Q_INV127 (1.0f / 127.0f)
#define ZS__Q_INV255 (1.0f / 255.0f)

/* The 8-bit maps in exact terms (every ISA computes exactly this):
 *   m code: sign(m) * Q(max(|m| * cm, FLT_MIN)), cm = coef(mmax, 16129)
 *   v code: Q(max(s * cs, FLT_MIN)),             cs = coef(smax, 65025)
 * where coef(M, K) = min(K / M, FLT_MAX) for M > 0, else 0 (every product
 * and quotient rounded to fp32), max() follows the MAXPS rule so a NaN
 * becomes FLT_MIN (code 0), and Q(t) is the integer q >= 0 with
 * (q - 1/2)^2 <= t < (q + 1/2)^2 (q = 0 for t < 1/4): sqrt(t) rounded
 * half up, decided exactly. As |m| <= mmax (s <= smax) for every element
 * of the block, t <= K (1 + 2^-22) < (sqrt(K) + 1/2)^2, so codes stay
 * within +-127 (0..255) without a clamp. The vector code estimates sqrt(t)
 * from a reciprocal square root approximation (whose bits differ between
 * CPU vendors) to within ZS__Q_ERR; then floor(estimate + ZS__Q_OFF) is q
 * or q - 1, and one compare against the exactly representable (q + 1/2)^2
 * decides: no ISA needs a full square root here and all agree bit for
 * bit. */
static inline float zs__q8_coef(float max, float k) {
  float c;
  if (!(max > 0.0f)) return 0.0f;
  c = k / max;
  return c < 3.40282347e38f ? c : 3.40282347e38f;
}

/* sqrt(t) <= 255.01 here, and RSQRTPS (relative error <= 1.5 * 2^-12)
 * puts t * rsqrt(t) within 0.094 of it (RSQRT14PS: 0.016; a correctly
 * rounded square root: 2^-15). With |e - sqrt(t)| <= ZS__Q_ERR = 0.1,
 * e + 3/8 lies in [sqrt(t) + 0.275, sqrt(t) + 0.475], whose floor is q - 1
 * or q for q = floor(sqrt(t) + 1/2). */
#define ZS__Q_OFF 0.375f

/* Q(t) for FLT_MIN <= t <= 65025 (1 + 2^-22), given an estimate e of
 * sqrt(t) within 0.1. */
static inline int zs__q8_round(float t, float e) {
  int q = (int)(e + ZS__Q_OFF);
  float h = (float)q + 0.5f;
  return q + (t >= h * h ? 1 : 0);
}

#define ZS__Q_TMIN 1.17549435e-38f /* FLT_MIN */

/* Dequantization of one element (the order of operations every ISA
 * uses). */
static inline void zs__q8_dequant1(int8_t cm, float ms, uint8_t cv, float vs,
                                   float *m, float *v) {
  float t = (float)cm * ZS__Q_INV127;
  float u = (float)cv * ZS__Q_INV255;
  float s = (u * u) * vs;
  *m = (t * fabsf(t)) * ms;
  *v = s * s;
}

/* The scalar conversions of one block of ZS_OPTIM_QBLOCK elements: the
 * scalar reference's (optim_scalar.c) and those behind zs_adam_q8_quantize
 * and zs_adam_q8_dequantize (optim.c). Here rather than in either file, so
 * that the driver needs nothing of a kernel file but its table. */
static inline void zs__q8_dequant_block(const int8_t *mq, float ms,
                                        const uint8_t *vq, float vs, float *m,
                                        float *v) {
  int i;
  for (i = 0; i < ZS_OPTIM_QBLOCK; i++)
    zs__q8_dequant1(mq[i], ms, vq[i], vs, m + i, v + i);
}

/* Codes of the block's m and s = sqrt(v) against the maxima mmax and
 * smax (the maps above, with a correctly rounded square root as the
 * estimate). */
static inline void zs__q8_quant_block(const float *m, const float *s,
                                      float mmax, float smax, int8_t *mq,
                                      uint8_t *vq) {
  float cm = zs__q8_coef(mmax, 16129.0f), cs = zs__q8_coef(smax, 65025.0f);
  int i;
  for (i = 0; i < ZS_OPTIM_QBLOCK; i++) {
    float tm = zs__maxps(fabsf(m[i]) * cm, ZS__Q_TMIN);
    float ts = zs__maxps(s[i] * cs, ZS__Q_TMIN);
    int qm = zs__q8_round(tm, sqrtf(tm)), qv = zs__q8_round(ts, sqrtf(ts));
    mq[i] = (int8_t)(m[i] < 0.0f ? -qm : qm);
    vq[i] = (uint8_t)qv;
  }
}

#endif
