// main() of the *_gpu_test binaries. Without a Hopper GPU the binary runs no
// case: it prints why and exits with kSkipExitCode, which ctest reports as
// "Skipped" (tests/CMakeLists.txt, SKIP_RETURN_CODE). With one it runs every
// case, and its exit code is GoogleTest's: a binary whose cases all fail is a
// failure, never a skip.
// NOTE: the skip used to be read from the output ("[  PASSED  ] 0 tests."),
// which GoogleTest also prints when every case fails, whatever the exit code.
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "testbed/testbed.h"

namespace {
constexpr int kSkipExitCode = 77;  // tests/CMakeLists.txt's SKIP_RETURN_CODE
}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  std::string why;
  // Listing the cases needs no GPU.
  if (!GTEST_FLAG_GET(list_tests) && !loom::testbed::HasHopperGpu(&why)) {
    std::printf("Skipped every case: %s\n", why.c_str());
    return kSkipExitCode;
  }
  return RUN_ALL_TESTS();
}
