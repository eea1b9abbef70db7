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
# (tests/CMakeLists.txt says which and why).
# Inputs: -DCUDA_COMPILER= -DFLAGS=<;-list: the kernel's compile flags>
#         -DSOURCE= -DENTRIES=<kernel entry functions the source must compile>
#         -DINCLUDES=<;-list> -DOUTPUT_DIR= [-DFORBIDDEN_PTX=<regex>]
get_filename_component(name ${SOURCE} NAME_WE)
# With FORBIDDEN_PTX the same compile keeps its intermediate files, the PTX
# among them (one compile, not a second one for the PTX).
set(keep)
set(keep_dir ${OUTPUT_DIR}/${name}_keep)
if(FORBIDDEN_PTX)
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
if(FORBIDDEN_PTX)
  if(NOT EXISTS ${keep_dir}/${name}.ptx)
    message(FATAL_ERROR "the compile kept no ${keep_dir}/${name}.ptx")
  endif()
  file(STRINGS ${keep_dir}/${name}.ptx forbidden REGEX "${FORBIDDEN_PTX}")
  if(forbidden)
    list(LENGTH forbidden count)
    list(GET forbidden 0 first)
    message(FATAL_ERROR "${SOURCE}: ${count} PTX lines match the forbidden '${FORBIDDEN_PTX}', the first:\n${first}")
  endif()
  message(STATUS "PTX: nothing matches '${FORBIDDEN_PTX}'")
endif()
