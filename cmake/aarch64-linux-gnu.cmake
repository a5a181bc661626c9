# Cross-compile zspeed for Linux on 64-bit Arm (Debian: gcc-aarch64-linux-gnu);
# the C tests then run under qemu-user (Debian: qemu-user).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
find_program(ZS_QEMU NAMES qemu-aarch64 qemu-aarch64-static)
if(ZS_QEMU)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${ZS_QEMU};-L;/usr/aarch64-linux-gnu)
endif()
