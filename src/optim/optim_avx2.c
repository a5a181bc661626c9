/* optim_avx2.c - the kernels of optim_body.h over the AVX2 + FMA + F16C
 * layer, 8 floats per vector. Compiled with -mavx2 -mfma -mf16c by the
 * build; called only when zs_simd_level() says the CPU has them. */
#include "optim/optim_vec_avx2.h"

#include "optim/optim_body.h"

const zs__optim_kernels zs__optim_avx2 = {
    "avx2", adam, {q8_moments, q8_finish}, adagrad, lion, sumsq};
