# Optimizer kernels: one binary, run once per SIMD level. A level the CPU
# lacks makes every numeric test skip (with the reason) and checks that the
# kernels refuse it with ZS_ESIMD.
zs_test_binary(test_optim)
zs_add_test(test_optim)
foreach(level scalar avx2 avx512 neon)
  zs_add_test(test_optim VARIANT ${level} ENV ZSPEED_SIMD=${level})
endforeach()
# The native benchmark command runs end to end (a smoke test: it checks
# that `zspeed bench adam` parses its options and completes, not speed).
if(ZSPEED_BUILD_CLI)
  add_test(NAME zspeed_bench_adam_smoke
           COMMAND zspeed_cli bench adam --n 100003 --threads 2 --steps 2)
  add_test(NAME zspeed_bench_unknown_refused
           COMMAND zspeed_cli bench no-such-bench)
  set_tests_properties(zspeed_bench_unknown_refused PROPERTIES WILL_FAIL TRUE)
endif()
