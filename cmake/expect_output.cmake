# ctest helper: runs COMMAND (a list) and passes only if its exit code is the
# one EXIT asks for ("zero" or "nonzero") AND its output (stdout and stderr)
# matches EXPECTED (a regular expression). PASS_REGULAR_EXPRESSION alone
# ignores the exit code: a binary that printed a refusal and ran on, or
# printed "check: OK" and then failed, would pass.
#   cmake -DEXIT=nonzero -DEXPECTED=<regex> "-DCOMMAND=<binary;arg;...>" -P expect_output.cmake
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(output "${out}${err}")
message("${output}")
if(NOT code MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the command did not exit normally: ${code}")
elseif(EXIT STREQUAL "zero" AND NOT code EQUAL 0)
  message(FATAL_ERROR "expected exit code 0, got ${code}")
elseif(EXIT STREQUAL "nonzero" AND code EQUAL 0)
  message(FATAL_ERROR "expected a refusal (a non-zero exit code), but the command exited 0")
elseif(NOT EXIT MATCHES "^(zero|nonzero)$")
  message(FATAL_ERROR "EXIT must be zero or nonzero, got '${EXIT}'")
endif()
if(NOT output MATCHES "${EXPECTED}")
  message(FATAL_ERROR "the output does not match: ${EXPECTED}")
endif()
