# The aio engine: one test body, registered once per backend. A backend the
# machine lacks (io_uring without liburing or blocked by seccomp, iocp off
# Windows) makes the cases SKIP with the probe's reason.
zs_test_binary(test_aio)
zs_add_test(test_aio)
foreach(backend threads io_uring iocp)
  zs_add_test(test_aio VARIANT ${backend} ENV ZSPEED_AIO_BACKEND=${backend})
endforeach()
