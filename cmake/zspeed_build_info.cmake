# zspeed_build_info.cmake - writes the Python module zspeed/_build_info.py a wheel carries:
# the git commit (short hash, as DeepSpeed records it) and branch the wheel was built from,
# or None for both where the sources are not a git checkout (an sdist, a copy). The Python
# package's _version.py reads it when present; the source tree never holds one.
#
#   cmake -DSOURCE_DIR=<zspeed sources> -DOUTPUT=<.../_build_info.py> -P zspeed_build_info.cmake
#
# Run at every build (CMakeLists.txt, the zspeed_build_info target), so a reused build folder
# follows new commits; the file is rewritten only when its text changes.
if(NOT SOURCE_DIR OR NOT OUTPUT)
  message(FATAL_ERROR "usage: cmake -DSOURCE_DIR=DIR -DOUTPUT=FILE -P zspeed_build_info.cmake")
endif()

set(hash "None")
set(branch "None")
find_package(Git QUIET)
if(GIT_FOUND)
  # The checkout must be SOURCE_DIR itself: sources unpacked inside some other repository
  # (an sdist in a user's project) do not take that repository's commit.
  execute_process(COMMAND "${GIT_EXECUTABLE}" rev-parse --show-toplevel
                  WORKING_DIRECTORY "${SOURCE_DIR}" RESULT_VARIABLE rc
                  OUTPUT_VARIABLE top OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  get_filename_component(src_real "${SOURCE_DIR}" REALPATH)
  if(rc EQUAL 0 AND NOT top STREQUAL "")
    get_filename_component(top_real "${top}" REALPATH)
  else()
    set(top_real "")
  endif()
  if(top_real STREQUAL src_real)
    execute_process(COMMAND "${GIT_EXECUTABLE}" rev-parse --short HEAD
                    WORKING_DIRECTORY "${SOURCE_DIR}" RESULT_VARIABLE rc1
                    OUTPUT_VARIABLE h OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    execute_process(COMMAND "${GIT_EXECUTABLE}" rev-parse --abbrev-ref HEAD
                    WORKING_DIRECTORY "${SOURCE_DIR}" RESULT_VARIABLE rc2
                    OUTPUT_VARIABLE b OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(rc1 EQUAL 0 AND NOT h STREQUAL "")
      set(hash "\"${h}\"")
      # A branch name may hold a quote; a detached HEAD is "HEAD", as DeepSpeed records it.
      if(rc2 EQUAL 0 AND NOT b STREQUAL "")
        string(REPLACE "\\" "\\\\" b "${b}")
        string(REPLACE "\"" "\\\"" b "${b}")
        set(branch "\"${b}\"")
      endif()
    endif()
  endif()
endif()

string(CONCAT text "# Written when this wheel was built (cmake/zspeed_build_info.cmake): the git checkout\n"
         "# it was built from, None where the sources were not one.\n"
         "git_hash = ${hash}\n"
         "git_branch = ${branch}\n")
set(old "")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUTPUT}" "${text}")
endif()
