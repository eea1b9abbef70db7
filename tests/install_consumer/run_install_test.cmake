# Checks that an installed loom works for a user project (cmake -P script).
#
#   cmake -DLOOM_BINARY_DIR=<loom build> -DLOOM_CONSUMER_DIR=<this folder>
#         -DLOOM_SCRATCH_DIR=<scratch> [-DCMAKE_CUDA_COMPILER=<nvcc>]
#         -P run_install_test.cmake
#
# Steps, each fatal on failure:
#   1. cmake --install <loom build> --prefix <scratch>/prefix
#   2. configure tests/install_consumer with CMAKE_PREFIX_PATH=<scratch>/prefix
#      (same generator and C++ compiler as the loom build)
#   3. build it
#   4. run the program and check what it printed
cmake_minimum_required(VERSION 3.25)

foreach(required LOOM_BINARY_DIR LOOM_CONSUMER_DIR LOOM_SCRATCH_DIR)
  if(NOT DEFINED ${required} OR "${${required}}" STREQUAL "")
    message(FATAL_ERROR "install test: -D${required}=... is required")
  endif()
endforeach()

set(prefix "${LOOM_SCRATCH_DIR}/prefix")
set(consumer_build "${LOOM_SCRATCH_DIR}/consumer-build")
file(REMOVE_RECURSE "${LOOM_SCRATCH_DIR}")
file(MAKE_DIRECTORY "${LOOM_SCRATCH_DIR}")

# Runs a command; on failure prints its output and stops the test.
function(run_step what)
  execute_process(COMMAND ${ARGN}
                  RESULT_VARIABLE result
                  OUTPUT_VARIABLE output
                  ERROR_VARIABLE output)
  if(NOT result EQUAL 0)
    string(REPLACE ";" " " command_line "${ARGN}")
    message(FATAL_ERROR "install test: ${what} failed (exit ${result})\n"
                        "command: ${command_line}\n${output}")
  endif()
  message(STATUS "install test: ${what}: ok")
  set(step_output "${output}" PARENT_SCOPE)
endfunction()

# Read one entry of the loom build's cache, empty when absent.
function(read_loom_cache entry out_var)
  file(STRINGS "${LOOM_BINARY_DIR}/CMakeCache.txt" line REGEX "^${entry}:[A-Z]+=")
  string(REGEX REPLACE "^${entry}:[A-Z]+=" "" value "${line}")
  set(${out_var} "${value}" PARENT_SCOPE)
endfunction()

if(NOT EXISTS "${LOOM_BINARY_DIR}/CMakeCache.txt")
  message(FATAL_ERROR "install test: ${LOOM_BINARY_DIR} is not a configured loom build")
endif()
read_loom_cache(CMAKE_GENERATOR generator)
read_loom_cache(CMAKE_MAKE_PROGRAM make_program)
read_loom_cache(CMAKE_CXX_COMPILER cxx_compiler)
read_loom_cache(CMAKE_BUILD_TYPE build_type)
if(build_type STREQUAL "")
  set(build_type Release)
endif()

# 1. Install into a scratch prefix.
run_step("cmake --install"
  "${CMAKE_COMMAND}" --install "${LOOM_BINARY_DIR}" --prefix "${prefix}" --config "${build_type}")
foreach(installed include/loom/runtime.h include/loom/graph.h include/loom/tensor.h
                  include/loom/status.h include/loom/scheduler/schedule.h)
  if(NOT EXISTS "${prefix}/${installed}")
    message(FATAL_ERROR "install test: ${installed} was not installed under ${prefix}")
  endif()
endforeach()
file(GLOB_RECURSE package_config "${prefix}/*/loomConfig.cmake")
if(NOT package_config)
  message(FATAL_ERROR "install test: no loomConfig.cmake was installed under ${prefix}")
endif()

# 2. Configure the consumer against the prefix only.
set(configure_args
  -S "${LOOM_CONSUMER_DIR}" -B "${consumer_build}"
  -G "${generator}"
  "-DCMAKE_PREFIX_PATH=${prefix}"
  "-DCMAKE_BUILD_TYPE=${build_type}")
if(NOT make_program STREQUAL "")
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${make_program}")
endif()
if(NOT cxx_compiler STREQUAL "")
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${cxx_compiler}")
endif()
if(DEFINED CMAKE_CUDA_COMPILER AND NOT CMAKE_CUDA_COMPILER STREQUAL "")
  # The consumer enables only CXX; FindCUDAToolkit (through loom's package
  # config) finds the toolkit from the directory above nvcc's bin/.
  get_filename_component(cuda_bin "${CMAKE_CUDA_COMPILER}" DIRECTORY)
  get_filename_component(cuda_root "${cuda_bin}" DIRECTORY)
  list(APPEND configure_args "-DCMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER}"
                             "-DCUDAToolkit_ROOT=${cuda_root}")
endif()
run_step("configure the consumer project" "${CMAKE_COMMAND}" ${configure_args})

# 3. Build it.
run_step("build the consumer project"
  "${CMAKE_COMMAND}" --build "${consumer_build}" --config "${build_type}")

# 4. Run it and check its output.
find_program(consumer_app NAMES app
             PATHS "${consumer_build}" "${consumer_build}/${build_type}" NO_DEFAULT_PATH)
if(NOT consumer_app)
  message(FATAL_ERROR "install test: the consumer program was not built in ${consumer_build}")
endif()
run_step("run the consumer program" "${consumer_app}")
foreach(expected "consumer_proj" "loom install consumer: OK")
  string(FIND "${step_output}" "${expected}" position)
  if(position EQUAL -1)
    message(FATAL_ERROR "install test: the consumer's output lacks \"${expected}\":\n"
                        "${step_output}")
  endif()
endforeach()
message(STATUS "install test: consumer output:\n${step_output}")
message(STATUS "install test: passed")
