# The native command's numeric options go through one strict parser: a
# value that is not a number, has trailing characters, is nan or inf,
# negative, or outside the option's range is refused with exit status 2 and
# a message naming the option and the range, before any benchmark runs
# (no wrap-around, no out-of-range float-to-integer conversion: the
# sanitizer builds run these too). Registered like report.cmake: one test
# per case, running this file as a script.
if(NOT CMAKE_SCRIPT_MODE_FILE)
  if(ZSPEED_BUILD_CLI)
    string(REPLACE ";" "|" zs_emu "${CMAKE_CROSSCOMPILING_EMULATOR}")
    foreach(case io_huge io_nan io_inf io_negative io_fraction io_trailing
                 io_qd adam_negative adam_threads adam_steps swap_pow
                 swap_buffers swap_threads)
      add_test(NAME zspeed_cli_args.${case}
               COMMAND ${CMAKE_COMMAND} -DZS_CLI=$<TARGET_FILE:zspeed_cli>
                       -DZS_EMU=${zs_emu} -DZS_CASE=${case}
                       -P ${CMAKE_CURRENT_LIST_FILE})
    endforeach()
  endif()
  return()
endif()
cmake_minimum_required(VERSION 3.20)

# case -> arguments after "bench", and what stderr must say.
set(io_huge "io;--size;99999999999G")
set(io_huge_says "--size '99999999999G' is out of range: give a value in \\[1, 9223372036854775807\\]")
set(io_nan "io;--size;nan")
set(io_nan_says "--size 'nan' is not a size")
set(io_inf "io;--buffer;inf")
set(io_inf_says "--buffer 'inf' is not a size")
set(io_negative "io;--block-size;-4K")
set(io_negative_says "--block-size '-4K' is not a size")
set(io_fraction "io;--size;0.3K")
set(io_fraction_says "--size '0.3K' is not a whole number of bytes")
set(io_trailing "io;--loops;5x")
set(io_trailing_says "--loops '5x' is not an integer")
set(io_qd "io;--queue-depth;100000")
set(io_qd_says "--queue-depth '100000' is out of range: give a value in \\[1, 4096\\]")
set(adam_negative "adam;--n;-5")
set(adam_negative_says "--n '-5' is not a size")
set(adam_threads "adam;--threads;0")
set(adam_threads_says "--threads '0' is out of range: give a value in \\[1, 4096\\]")
set(adam_steps "adam;--steps;18446744073709551617")
set(adam_steps_says "--steps '18446744073709551617' is out of range")
set(swap_pow "swap;--params;2^80")
set(swap_pow_says "--params '2\\^80' is out of range: give a value in \\[1, 1099511627776\\]")
set(swap_buffers "swap;--buffers;100")
set(swap_buffers_says "--buffers '100' is out of range: give a value in \\[1, 64\\]")
set(swap_threads "swap;--threads;-1")
set(swap_threads_says "--threads '-1' is out of range: give a value in \\[0, 4096\\]")

string(REPLACE "|" ";" emu "${ZS_EMU}")
execute_process(COMMAND ${emu} ${ZS_CLI} bench ${${ZS_CASE}}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 60)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "zspeed bench ${${ZS_CASE}}: status ${rc}, expected 2\n"
          "stdout:\n${out}\nstderr:\n${err}")
endif()
if(NOT err MATCHES "${${ZS_CASE}_says}")
  message(FATAL_ERROR "zspeed bench ${${ZS_CASE}}: stderr does not say "
          "'${${ZS_CASE}_says}'\nstderr:\n${err}")
endif()
