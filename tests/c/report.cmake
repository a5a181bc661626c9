# Tests of the report area: the ABI table (test_abi), the library's list of
# refused choices (test_probe run with two refused), and the exit status of
# the native command.
#
# `zspeed report` prints the whole report and then exits with status 1 when
# the environment forces a choice the library refuses (ZSPEED_SIMD,
# ZSPEED_AIO_BACKEND, ZSPEED_NUM_THREADS), 0 otherwise. ctest cannot check an exit status and
# the output of one run together, so, as in layers.cmake, this file
# registers one test per case that runs this same file as a CMake script:
# it runs the native command (through the cross-compiling emulator, Wine or
# qemu, when there is one) with the case's environment and checks both.
if(NOT CMAKE_SCRIPT_MODE_FILE)
  if(ZSPEED_BUILD_CLI)
    # A list would be split into separate arguments: pass it with '|'.
    string(REPLACE ";" "|" zs_emu "${CMAKE_CROSSCOMPILING_EMULATOR}")
    foreach(case clean clean_json simd_unknown simd_missing aio_unknown
                 aio_unusable threads_unknown threads_range)
      add_test(NAME zspeed_report_status.${case}
               COMMAND ${CMAKE_COMMAND} -DZS_CLI=$<TARGET_FILE:zspeed_cli>
                       -DZS_EMU=${zs_emu} -DZS_CASE=${case}
                       -P ${CMAKE_CURRENT_LIST_FILE})
    endforeach()
  endif()
  # The ABI table the Python mirrors are checked against.
  zs_test_binary(test_abi)
  zs_add_test(test_abi)
  # The library's own list of problems (test_probe's report_problems) with
  # both choices refused.
  zs_add_test(test_probe VARIANT refused_env
              ENV ZSPEED_SIMD=bogus ZSPEED_AIO_BACKEND=floppy)
  return()
endif()
cmake_minimum_required(VERSION 3.20)

# Runs `zspeed report ARGN` with ZSPEED_SIMD / ZSPEED_AIO_BACKEND set to
# simd / aio and ZSPEED_NUM_THREADS to the variable threads ("" = unset);
# sets rc, out and err in the caller.
function(zs_report simd aio)
  string(REPLACE "|" ";" emu "${ZS_EMU}")
  foreach(pair "ZSPEED_SIMD;${simd}" "ZSPEED_AIO_BACKEND;${aio}"
               "ZSPEED_NUM_THREADS;${threads}")
    list(GET pair 0 var)
    list(LENGTH pair n)
    if(n GREATER 1)
      list(GET pair 1 value)
      set(ENV{${var}} "${value}")
    else()
      unset(ENV{${var}})
    endif()
  endforeach()
  execute_process(COMMAND ${emu} ${ZS_CLI} report ${ARGN}
                  RESULT_VARIABLE r OUTPUT_VARIABLE o ERROR_VARIABLE e)
  set(rc "${r}" PARENT_SCOPE)
  set(out "${o}" PARENT_SCOPE)
  set(err "${e}" PARENT_SCOPE)
endfunction()

macro(zs_fail what)
  message(FATAL_ERROR "zspeed report (${ZS_CASE}): ${what}\n"
          "status: ${rc}\nstdout:\n${out}\nstderr:\n${err}")
endmacro()

# The whole text report: its first and last lines are there.
macro(zs_expect_whole_text)
  string(FIND "${out}" "zspeed report" first)
  string(FIND "${out}" "cuda driver ......... " last)
  if(NOT first EQUAL 0 OR last LESS 0)
    zs_fail("the text report is incomplete")
  endif()
endmacro()

# The whole JSON report: one object from "version" to "problems".
macro(zs_expect_whole_json)
  string(STRIP "${out}" body)
  if(NOT body MATCHES "^{\n  \"version\": .*\n  \"problems\": \\[[^\n]*\\]\n}$")
    zs_fail("the JSON report is incomplete")
  endif()
endmacro()

if(ZS_CASE STREQUAL "clean")
  zs_report("" "")
  if(NOT rc EQUAL 0)
    zs_fail("a clean environment must exit with status 0")
  endif()
  zs_expect_whole_text()
  if(NOT err STREQUAL "")
    zs_fail("a clean environment prints nothing on stderr")
  endif()
  return()
elseif(ZS_CASE STREQUAL "clean_json")
  zs_report("" "" --json)
  if(NOT rc EQUAL 0)
    zs_fail("a clean environment must exit with status 0")
  endif()
  zs_expect_whole_json()
  if(NOT out MATCHES "\"problems\": \\[\\]")
    zs_fail("a clean environment lists no problems")
  endif()
  return()
endif()

# A refused choice: what to set, whether to ask for JSON, and what the
# report (a line of the text, or the first entry of "problems") and stderr
# must then say.
zs_report("" "" --json)
if(out MATCHES "\"best\": \"neon\"")
  set(missing avx2) # a real level this CPU lacks
else()
  set(missing neon)
endif()
if(out MATCHES "\"os\": \"Windows")
  set(unusable io_uring) # a real backend that cannot run here
else()
  set(unusable iocp)
endif()
set(simd "")
set(aio "")
set(threads "")
set(json "")
if(ZS_CASE STREQUAL "simd_unknown")
  set(simd bogus)
  set(shows "simd level \\.+ ERROR: ZSPEED_SIMD='bogus'")
  set(says "ZSPEED_SIMD='bogus' is not a SIMD level")
elseif(ZS_CASE STREQUAL "simd_missing")
  set(simd ${missing})
  set(json --json)
  set(says "ZSPEED_SIMD='${missing}' but this CPU lacks it")
  set(shows "\"problems\": \\[\"${says}")
elseif(ZS_CASE STREQUAL "aio_unknown")
  set(aio floppy)
  set(shows "auto chooses \\.+ ERROR: ZSPEED_AIO_BACKEND='floppy'")
  set(says "ZSPEED_AIO_BACKEND='floppy' is not a backend")
elseif(ZS_CASE STREQUAL "aio_unusable")
  set(aio ${unusable})
  set(json --json)
  set(says "the ${unusable} backend was forced by ZSPEED_AIO_BACKEND but is not usable here")
  set(shows "\"problems\": \\[\"${says}")
elseif(ZS_CASE STREQUAL "threads_unknown")
  set(threads abc)
  set(shows "threads \\.+ ERROR: ZSPEED_NUM_THREADS=abc")
  set(says "ZSPEED_NUM_THREADS=abc: 'abc' is not an integer")
elseif(ZS_CASE STREQUAL "threads_range")
  set(threads 100000)
  set(json --json)
  set(says "ZSPEED_NUM_THREADS=100000: '100000' is out of range")
  set(shows "\"threads\": {\"default\": null, \"env\": \"100000\", \"error\": \"${says}")
else()
  message(FATAL_ERROR "unknown case '${ZS_CASE}'")
endif()
zs_report("${simd}" "${aio}" ${json})
if(NOT rc EQUAL 1)
  zs_fail("a refused choice must exit with status 1")
endif()
if(json)
  zs_expect_whole_json()
else()
  zs_expect_whole_text()
endif()
if(NOT out MATCHES "${shows}")
  zs_fail("the report must show the refused choice")
endif()
if(NOT err MATCHES "1 problem with this environment:\n  ${says}")
  zs_fail("stderr must name the problem")
endif()
