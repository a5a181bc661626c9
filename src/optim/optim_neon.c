/* optim_neon.c - the kernels of optim_body.h over the AArch64 Advanced
 * SIMD layer, 4 floats per vector. Built only for arm64 (the build drops
 * *_neon.c elsewhere). */
#include "optim/optim_vec_neon.h"

#include "optim/optim_body.h"

const zs__optim_kernels zs__optim_neon = {
    "neon", adam, {q8_moments, q8_finish}, adagrad, lion, sumsq};
