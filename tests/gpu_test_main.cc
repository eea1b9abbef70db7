// main() of the *_gpu_test binaries. Without the Hopper GPUs its cases need
// (kDevices) the binary runs no case: it prints why and exits with
// kSkipExitCode, which ctest reports as "Skipped" (tests/CMakeLists.txt,
// SKIP_RETURN_CODE). With them it runs every case, and its exit code is
// GoogleTest's: a binary whose cases all fail is a failure, never a skip.
// NOTE: the skip used to be read from the output ("[  PASSED  ] 0 tests."),
// which GoogleTest also prints when every case fails, whatever the exit code.
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "testbed/testbed.h"

// LOOM_GPU_TEST_DEVICES: the Hopper GPUs the binary's cases need (devices 0
// to N - 1; 2 for multi_gpu_test, tests/CMakeLists.txt).
#ifndef LOOM_GPU_TEST_DEVICES
#define LOOM_GPU_TEST_DEVICES 1
#endif

namespace {
constexpr int kSkipExitCode = 77;  // tests/CMakeLists.txt's SKIP_RETURN_CODE
constexpr int kDevices = LOOM_GPU_TEST_DEVICES;
}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  // Listing the cases needs no GPU.
  if (!GTEST_FLAG_GET(list_tests)) {
    for (int device = 0; device < kDevices; ++device) {
      std::string why;
      if (!loom::testbed::HasHopperGpu(&why, device)) {
        std::printf("Skipped every case (they need %d Hopper GPU%s): %s\n", kDevices, kDevices > 1 ? "s" : "",
                    why.c_str());
        return kSkipExitCode;
      }
    }
  }
  return RUN_ALL_TESTS();
}
