# The library's areas are layers: each may use only itself and the layers
# below it, and no two files may include each other in a loop.
#
#   common          errors, threads, memory, files, CPU (the portable core)
#   optim, aio      optimizer kernels; the I/O engine (neither uses the other)
#   swap            the NVMe optimizer step (uses optim and aio)
#   report          the environment report and the ABI table (uses all)
#   cli             the native command (public headers and common's utilities)
#
# This file has two uses. Included by tests/c/CMakeLists.txt it registers
# the test `layers`, which runs this same file as a CMake script over src/;
# the script checks every #include "..." of every file (a call into another
# area needs that area's declarations, so the includes are where a wrong
# arrow shows) and every zs_/zs__ name a file mentions (a name owned by a
# higher or sibling area is a call that runs the wrong way):
#   - another area's headers: only its public one (include/zspeed/), and
#     only if that area is below; common's zs_internal.h is open to all,
#     every other internal header (zs_os.h, <area>/<area>_internal.h) only
#     to its own area;
#   - no include cycles among the files under src/;
#   - no call cycles among the .c files under src/: a file that names a
#     function or table another file defines (in its code, not in comments
#     or strings) depends on it, and those dependencies must run one way
#     (A names B's, B names A's: a loop). Files defining the same name are
#     alternatives (the _posix/_win pair of one interface), not users of
#     each other.
if(NOT CMAKE_SCRIPT_MODE_FILE)
  add_test(NAME layers
           COMMAND ${CMAKE_COMMAND} -DZS_SRC=${PROJECT_SOURCE_DIR}/src
                   -P ${CMAKE_CURRENT_LIST_FILE})
  return()
endif()
cmake_minimum_required(VERSION 3.20)

# ------------------------------------------------------------------ tables
set(rank_common 0)
set(rank_optim 1)
set(rank_aio 1)
set(rank_swap 2)
set(rank_report 3)
set(rank_cli 4)
# The area each public header belongs to.
set(public_zspeed.h common)
set(public_errors.h common)
set(public_optim.h optim)
set(public_aio.h aio)
set(public_swap.h swap)
# Name prefixes each area owns (after zs_ or zs__, or the whole name).
set(names_optim "adam_;adagrad_;lion_;optim_;grad_stats")
set(names_aio "aio_")
set(names_swap "swap_")
set(names_report "report;abi_;cuda_probe")

set(problems "")
set(cfiles "")

# Areas whose .c files the call-loop check skips (none: cli's option parsers
# live in options.c, below the commands that use them).
set(call_loops_pending "")

# A may use B: the same area, or B strictly below A.
function(zs_may_use a b out)
  if(a STREQUAL b OR rank_${b} LESS rank_${a})
    set(${out} 1 PARENT_SCOPE)
  else()
    set(${out} 0 PARENT_SCOPE)
  endif()
endfunction()

file(GLOB_RECURSE files RELATIVE ${ZS_SRC} ${ZS_SRC}/*.c ${ZS_SRC}/*.h)
list(SORT files)
foreach(f ${files})
  string(REGEX MATCH "^[^/]+" area "${f}")
  if(NOT DEFINED rank_${area})
    list(APPEND problems "${f}: area '${area}' has no place in the layers "
                         "(add it to tests/c/layers.cmake)")
    continue()
  endif()
  get_filename_component(dir "${f}" DIRECTORY)
  file(STRINGS ${ZS_SRC}/${f} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  set(edges_${f} "")
  foreach(line ${lines})
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" inc
           "${line}")
    if(inc MATCHES "^zspeed/(.+)$")
      set(target_area "${public_${CMAKE_MATCH_1}}")
      if(NOT target_area)
        list(APPEND problems "${f}: public header ${inc} belongs to no area "
                             "(add it to tests/c/layers.cmake)")
        continue()
      endif()
      zs_may_use(${area} ${target_area} ok)
      if(NOT ok)
        list(APPEND problems "${f} (${area}) includes ${inc} of the "
                             "${target_area} area, which is not below it")
      endif()
      continue()
    endif()
    if(EXISTS ${ZS_SRC}/${dir}/${inc})
      set(resolved "${dir}/${inc}")
    elseif(EXISTS ${ZS_SRC}/${inc})
      set(resolved "${inc}")
    elseif(EXISTS ${ZS_SRC}/common/${inc})
      set(resolved "common/${inc}")
    else()
      list(APPEND problems "${f}: cannot find the included \"${inc}\"")
      continue()
    endif()
    string(REGEX MATCH "^[^/]+" target_area "${resolved}")
    if(NOT target_area STREQUAL area AND NOT resolved STREQUAL "common/zs_internal.h")
      list(APPEND problems "${f} (${area}) includes ${resolved}, an internal "
                           "header of the ${target_area} area")
    endif()
    list(APPEND edges_${f} "${resolved}")
  endforeach()

  # Names owned by an area this one may not use.
  file(READ ${ZS_SRC}/${f} text)
  foreach(owner optim aio swap report)
    zs_may_use(${area} ${owner} ok)
    if(ok)
      continue()
    endif()
    foreach(prefix ${names_${owner}})
      string(REGEX MATCH "[^A-Za-z0-9_]zs__?${prefix}[A-Za-z0-9_]*" hit
             "${text}")
      if(hit)
        string(SUBSTRING "${hit}" 1 -1 hit)
        list(APPEND problems "${f} (${area}) names ${hit} of the ${owner} "
                             "area, which is not below it")
      endif()
    endforeach()
  endforeach()

  # For the call loops: the zs_/zs__ functions and tables this .c file
  # defines with external linkage (at the start of a line, not static,
  # extern or a prototype), and every zs_/zs__ name it mentions in its
  # code.
  if(f MATCHES "\\.c$" AND NOT area IN_LIST call_loops_pending)
    file(STRINGS ${ZS_SRC}/${f} deflines
         REGEX "^[A-Za-z_][A-Za-z0-9_ *]*[ *]zs__?[A-Za-z0-9_]+ *(\\(|=)")
    set(defs_${f} "")
    foreach(line ${deflines})
      if(line MATCHES "^(static|extern|typedef|return)[ \t]" OR
         line MATCHES "\\);[ \t]*$")
        continue()
      endif()
      string(REGEX MATCH "zs__?[A-Za-z0-9_]+ *(\\(|=)" name "${line}")
      string(REGEX REPLACE " *(\\(|=)$" "" name "${name}")
      list(APPEND defs_${f} "${name}")
      list(APPEND definers_${name} "${f}")
    endforeach()
    # Comments, string and character literals out, in one left-to-right
    # pass (a quote inside a comment, a slash inside a string stay inert).
    string(REGEX REPLACE
           "/\\*([^*]|\\*+[^*/])*\\*+/|//[^\n]*|\"([^\"\\\\\n]|\\\\.)*\"|'([^'\\\\\n]|\\\\.)*'"
           " " code "${text}")
    string(REGEX MATCHALL "zs__?[A-Za-z0-9_]+" mentioned "${code}")
    if(mentioned)
      list(REMOVE_DUPLICATES mentioned)
    endif()
    set(mentions_${f} "${mentioned}")
    list(APPEND cfiles "${f}")
  endif()
endforeach()

# ------------------------------------------------------- include and call loops
# Depth-first search over the edges <kind>_<file>; a file met again while
# it is on the current path closes a loop.
function(zs_visit kind node path)
  get_property(done GLOBAL PROPERTY zs_done_${kind})
  if(node IN_LIST done)
    return()
  endif()
  if(node IN_LIST path)
    get_property(loops GLOBAL PROPERTY zs_loops)
    set(cycle "${path}")
    list(APPEND cycle "${node}")
    string(REPLACE ";" " -> " shown "${cycle}")
    list(APPEND loops "${kind} loop: ${shown}")
    set_property(GLOBAL PROPERTY zs_loops "${loops}")
    return()
  endif()
  set(deeper "${path}")
  list(APPEND deeper "${node}")
  foreach(next ${${kind}_${node}})
    zs_visit(${kind} "${next}" "${deeper}")
  endforeach()
  set_property(GLOBAL APPEND PROPERTY zs_done_${kind} "${node}")
endfunction()
set_property(GLOBAL PROPERTY zs_loops "")

# Includes: edges_<file> from the scan above.
set_property(GLOBAL PROPERTY zs_done_edges "")
foreach(f ${files})
  zs_visit(edges "${f}" "")
endforeach()

# Calls: A -> B where A mentions a name that B defines and A does not.
set(ncalls 0)
foreach(f ${cfiles})
  set(call_${f} "")
  foreach(name ${mentions_${f}})
    if(NOT DEFINED definers_${name} OR name IN_LIST defs_${f})
      continue()
    endif()
    foreach(d ${definers_${name}})
      if(NOT d IN_LIST call_${f})
        list(APPEND call_${f} "${d}")
        math(EXPR ncalls "${ncalls} + 1")
      endif()
    endforeach()
  endforeach()
endforeach()
set_property(GLOBAL PROPERTY zs_done_call "")
foreach(f ${cfiles})
  zs_visit(call "${f}" "")
endforeach()

get_property(loops GLOBAL PROPERTY zs_loops)
list(APPEND problems ${loops})

list(LENGTH files nfiles)
if(problems)
  string(REPLACE ";" "\n  " shown "${problems}")
  message(FATAL_ERROR "layering problems:\n  ${shown}")
endif()
list(LENGTH cfiles ncfiles)
message(STATUS "layers: ${nfiles} files under src/ respect the layers and "
               "include no loops; the ${ncalls} dependencies among the "
               "${ncfiles} .c files checked for calls run one way")
