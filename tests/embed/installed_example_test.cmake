# installed_example_test.cmake: `cmake --install` into a fresh prefix, then examples/embed
# configured with find_package(dist) against that prefix, built and run from its own folder
# with no arguments, as a user would. Prints SKIPPED (the test's skip pattern) when something it
# needs is missing rather than failing.
#
# Variables: SOURCE_DIR, BINARY_DIR (the project's build tree), WORK_DIR (scratch),
# GENERATOR, CXX_COMPILER, SANITIZE (the project's DIST_SANITIZE: a sanitized library needs an
# executable built with the same sanitizers).
cmake_minimum_required(VERSION 3.25)

foreach(needed "${BINARY_DIR}/cmake_install.cmake" "${BINARY_DIR}/bin/dist"
               "${SOURCE_DIR}/examples/embed/CMakeLists.txt" "${SOURCE_DIR}/examples/gpt_tiny.dist")
  if(NOT EXISTS "${needed}")
    message("SKIPPED: ${needed} is missing (build the whole project first)")
    return()
  endif()
endforeach()
file(GLOB libs "${BINARY_DIR}/lib/libdist.so*")
if(NOT libs)
  message("SKIPPED: the embedding library is not built (target dist_embed)")
  return()
endif()

if(GENERATOR MATCHES "Ninja")
  find_program(NINJA_PROGRAM NAMES ninja ninja-build)
  if(NOT NINJA_PROGRAM)
    message("SKIPPED: ninja is not installed")
    return()
  endif()
endif()

set(prefix "${WORK_DIR}/prefix")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(run_output "${out}" PARENT_SCOPE)
endfunction()

run("cmake --install" ${CMAKE_COMMAND} --install "${BINARY_DIR}" --prefix "${prefix}")
foreach(installed include/dist/dist.hpp share/dist/stdlib/std/gpt.dist)
  if(NOT EXISTS "${prefix}/${installed}")
    message(FATAL_ERROR "the install has no ${installed}")
  endif()
endforeach()
file(GLOB configs "${prefix}/lib*/cmake/dist/distConfig.cmake")
if(NOT configs)
  message(FATAL_ERROR "the install has no lib/cmake/dist/distConfig.cmake")
endif()

set(build "${WORK_DIR}/build")
set(extra)
if(SANITIZE)
  list(APPEND extra "-DCMAKE_CXX_FLAGS=-fsanitize=${SANITIZE}"
       "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZE}")
endif()
run("configuring examples/embed" ${CMAKE_COMMAND} -S "${SOURCE_DIR}/examples/embed" -B "${build}"
    -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
    "-DCMAKE_PREFIX_PATH=${prefix}" ${extra})
run("building examples/embed" ${CMAKE_COMMAND} --build "${build}")

# From its own folder, with no arguments, and nothing pointing at the source tree's stdlib.
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env --unset=DIST_PATH "${build}/embed_example"
  WORKING_DIRECTORY "${SOURCE_DIR}/examples/embed"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "embed_example failed (${rc}):\n${err}")
endif()

string(FIND "${out}" "stdlib: ${prefix}/share/dist/stdlib" at)
if(at EQUAL -1)
  message(FATAL_ERROR "embed_example did not use the installed stdlib under ${prefix}")
endif()
string(REGEX MATCHALL "step +[0-9]+ +loss +[0-9.]+" steps "${out}")
list(LENGTH steps count)
if(NOT count EQUAL 8)
  message(FATAL_ERROR "expected 8 steps, saw ${count}")
endif()
list(GET steps 0 first)
list(GET steps -1 last)
string(REGEX REPLACE ".*loss +" "" first "${first}")
string(REGEX REPLACE ".*loss +" "" last "${last}")
# CMake compares numbers as doubles.
if(NOT last LESS first)
  message(FATAL_ERROR "the loss did not fall: ${first} at the first step, ${last} at the last")
endif()
message("embed_example: ${count} steps, loss ${first} -> ${last}")
