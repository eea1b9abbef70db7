# kernel_codegen_test, narrow_gemm_codegen_test: compiles one kernel source
# (the tiled persistent kernel, the narrow decode kernel) for sm_90a with ptxas
# verbose output and fails if ptxas reports a wgmma performance hazard:
#   C7515/C7519/C7520 and the rest of the C75xx family: wgmma serialised
#   (accumulators written by other instructions while a group is in flight,
#   a wgmma pipeline crossing a call, ...). A serialised kernel still gives
#   correct results, so no functional test notices; v1.5 lost 30% this way
#   (bench/NOTES.md). Run by ctest (label cpu): needs nvcc, not a GPU.
# With -DFORBIDDEN_PTX=<regex>, it also reads that compile's PTX and fails
# if the regex matches: an instruction form the kernel must not contain
# (tests/CMakeLists.txt says which and why). With -DCHECK_HALF_TYPES=ON, it
# fails unless every multiply (wgmma.mma_async, mma.sync) of each kernel
# entry takes the entry's 16-bit type: .f16 in the fp16 instantiations
# (ElementType::kFP16, `ElementTypeE2E` in their mangled names), .bf16 in the
# rest; an fp16 instantiation that reached a bf16 multiply would read its
# inputs as the wrong type.
# Inputs: -DCUDA_COMPILER= -DFLAGS=<;-list: the kernel's compile flags>
#         -DSOURCE= -DENTRIES=<kernel entry functions the source must compile>
#         -DINCLUDES=<;-list> -DOUTPUT_DIR= [-DFORBIDDEN_PTX=<regex>]
#         [-DCHECK_HALF_TYPES=ON]
get_filename_component(name ${SOURCE} NAME_WE)
# With FORBIDDEN_PTX the same compile keeps its intermediate files, the PTX
# among them (one compile, not a second one for the PTX).
set(keep)
set(keep_dir ${OUTPUT_DIR}/${name}_keep)
if(FORBIDDEN_PTX OR CHECK_HALF_TYPES)
  file(MAKE_DIRECTORY ${keep_dir})
  set(keep -keep -keep-dir ${keep_dir})
endif()
execute_process(
  COMMAND ${CUDA_COMPILER} ${FLAGS} -Xptxas=-v ${INCLUDES} ${keep} -cubin -o ${OUTPUT_DIR}/${name}.cubin ${SOURCE}
  RESULT_VARIABLE result
  OUTPUT_VARIABLE output
  ERROR_VARIABLE output)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "compiling ${SOURCE} failed:\n${output}")
endif()
string(REGEX MATCHALL "[^\n]*\\(C75[0-9][0-9]\\)[^\n]*" hazards "${output}")
if(hazards)
  string(REPLACE ";" "\n" hazards "${hazards}")
  message(FATAL_ERROR "ptxas reports wgmma hazards in ${SOURCE}:\n${hazards}")
endif()
string(REGEX MATCHALL "Compiling entry function '[^']*'" entries "${output}")
list(LENGTH entries count)
if(count LESS ENTRIES)
  message(FATAL_ERROR "expected ${ENTRIES} kernel entry functions in ptxas output, saw ${count}:\n${output}")
endif()
message(STATUS "ptxas: no wgmma hazard in ${count} entry functions")
if((FORBIDDEN_PTX OR CHECK_HALF_TYPES) AND NOT EXISTS ${keep_dir}/${name}.ptx)
  message(FATAL_ERROR "the compile kept no ${keep_dir}/${name}.ptx")
endif()
if(CHECK_HALF_TYPES)
  # The entry lines and the multiplies, in order: each multiply belongs to
  # the entry above it.
  file(STRINGS ${keep_dir}/${name}.ptx lines REGEX "[.]entry |wgmma[.]mma_async[.]|mma[.]sync[.]")
  set(entry "")
  set(multiplies 0)
  foreach(line IN LISTS lines)
    if(line MATCHES "[.]entry ([^(]*)")
      set(entry "${CMAKE_MATCH_1}")
      continue()
    endif()
    math(EXPR multiplies "${multiplies} + 1")
    if(entry MATCHES "ElementTypeE2E")
      set(want "[.]f16[.]f16")
    else()
      set(want "[.]bf16[.]bf16")
    endif()
    if(NOT line MATCHES "${want}")
      message(FATAL_ERROR "${SOURCE}: entry ${entry} multiplies in the wrong 16-bit type:\n${line}")
    endif()
  endforeach()
  if(multiplies EQUAL 0)
    message(FATAL_ERROR "${SOURCE}: no multiply found in the PTX")
  endif()
  message(STATUS "PTX: ${multiplies} multiplies, each in its entry's 16-bit type")
endif()
if(FORBIDDEN_PTX)
  file(STRINGS ${keep_dir}/${name}.ptx forbidden REGEX "${FORBIDDEN_PTX}")
  if(forbidden)
    list(LENGTH forbidden count)
    list(GET forbidden 0 first)
    message(FATAL_ERROR "${SOURCE}: ${count} PTX lines match the forbidden '${FORBIDDEN_PTX}', the first:\n${first}")
  endif()
  message(STATUS "PTX: nothing matches '${FORBIDDEN_PTX}'")
endif()
