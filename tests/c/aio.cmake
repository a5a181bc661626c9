# The aio engine: one test body, registered once per backend. A backend the
# machine lacks (io_uring without liburing or blocked by seccomp, iocp off
# Windows) makes the cases SKIP with the probe's reason.
zs_test_binary(test_aio)
zs_add_test(test_aio)
foreach(backend threads io_uring iocp)
  zs_add_test(test_aio VARIANT ${backend} ENV ZSPEED_AIO_BACKEND=${backend})
endforeach()
# The native I/O benchmark runs end to end on a small file (a smoke test of
# the command, not of speed).
if(ZSPEED_BUILD_CLI)
  add_test(NAME zspeed_bench_io_smoke
           COMMAND zspeed_cli bench io --folder . --size 4M --buffer 1M
                   --loops 1 --json
           WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(zspeed_bench_io_smoke PROPERTIES
                       PASS_REGULAR_EXPRESSION "\"gbps_median\": [0-9]")
endif()
