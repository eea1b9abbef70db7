# kernel_codegen_test: compiles the persistent kernel for sm_90a with ptxas
# verbose output and fails if ptxas reports a wgmma performance hazard:
#   C7515/C7519/C7520 and the rest of the C75xx family: wgmma serialised
#   (accumulators written by other instructions while a group is in flight,
#   a wgmma pipeline crossing a call, ...). A serialised kernel still gives
#   correct results, so no functional test notices; v1.5 lost 30% this way
#   (bench/NOTES.md). Run by ctest (label cpu): needs nvcc, not a GPU.
# Inputs: -DCUDA_COMPILER= -DFLAGS=<;-list: the kernel's compile flags>
#         -DSOURCE= -DINCLUDES=<;-list> -DOUTPUT_DIR=
execute_process(
  COMMAND ${CUDA_COMPILER} ${FLAGS} -Xptxas=-v ${INCLUDES} -cubin -o ${OUTPUT_DIR}/persistent_gemm.cubin ${SOURCE}
  RESULT_VARIABLE result
  OUTPUT_VARIABLE output
  ERROR_VARIABLE output)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "compiling ${SOURCE} failed:\n${output}")
endif()
string(REGEX MATCHALL "[^\n]*\\(C75[0-9][0-9]\\)[^\n]*" hazards "${output}")
if(hazards)
  string(REPLACE ";" "\n" hazards "${hazards}")
  message(FATAL_ERROR "ptxas reports wgmma hazards in the persistent kernel:\n${hazards}")
endif()
string(REGEX MATCHALL "Compiling entry function '[^']*'" entries "${output}")
list(LENGTH entries count)
if(count LESS 2)
  message(FATAL_ERROR "expected both kernel instantiations in ptxas output, saw ${count}:\n${output}")
endif()
message(STATUS "ptxas: no wgmma hazard in ${count} entry functions")
