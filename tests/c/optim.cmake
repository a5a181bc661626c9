# Optimizer kernels: one binary, run once per SIMD level. A level the CPU
# lacks makes every numeric test skip (with the reason) and checks that the
# kernels refuse it with ZS_ESIMD.
zs_test_binary(test_optim)
zs_add_test(test_optim)
foreach(level scalar avx2 avx512 neon)
  zs_add_test(test_optim VARIANT ${level} ENV ZSPEED_SIMD=${level})
endforeach()
