/* optim_avx512.c - the kernels of optim_body.h over the AVX-512
 * (F+BW+VL+DQ) layer, 16 floats per vector. Compiled with the AVX-512
 * flags by the build; called only when zs_simd_level() reports AVX512. */
#include "optim/optim_vec_avx512.h"

#include "optim/optim_body.h"

const zs__optim_kernels zs__optim_avx512 = {
    "avx512", adam, {q8_moments, q8_finish}, adagrad, lion, sumsq};
