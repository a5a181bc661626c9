# The NVMe optimizer swapper: one test body, registered once per aio
# backend. A backend the machine lacks (io_uring without liburing or blocked
# by seccomp, iocp off Windows) makes the cases SKIP with the probe's reason.
zs_test_binary(test_swap)
zs_add_test(test_swap)
foreach(backend threads io_uring iocp)
  zs_add_test(test_swap VARIANT ${backend} ENV ZSPEED_AIO_BACKEND=${backend})
endforeach()
# The native swap benchmark runs end to end on a small model (a smoke test
# of the command and of zs_swap_io_pass inside it, not of speed).
if(ZSPEED_BUILD_CLI)
  add_test(NAME zspeed_bench_swap_smoke
           COMMAND zspeed_cli bench swap --params 2^18 --partition 2^16
                   --steps 2 --json
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(zspeed_bench_swap_smoke PROPERTIES
                       PASS_REGULAR_EXPRESSION "\"ratio\": [0-9]")
endif()
