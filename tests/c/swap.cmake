# The NVMe optimizer swapper: one test body, registered once per aio
# backend. A backend the machine lacks (io_uring without liburing or blocked
# by seccomp, iocp off Windows) makes the cases SKIP with the probe's reason.
zs_test_binary(test_swap)
zs_add_test(test_swap)
foreach(backend threads io_uring iocp)
  zs_add_test(test_swap VARIANT ${backend} ENV ZSPEED_AIO_BACKEND=${backend})
endforeach()
