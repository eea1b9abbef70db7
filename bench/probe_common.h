// probe_common.h: what the stand-alone device probes (bench/*_probe.cu)
// share: a CUDA call that exits on failure, the comma-separated integer
// lists their flags take, and the cluster launch attribute (the cluster
// barrier is ops/kernel/ptx.cuh's cluster_sync, as in the kernels).
#ifndef LOOM_BENCH_PROBE_COMMON_H_
#define LOOM_BENCH_PROBE_COMMON_H_

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

// Runs a CUDA runtime call; on failure prints where and why, and exits 1.
#define PROBE_CHECK(call)                                                                 \
  do {                                                                                    \
    const cudaError_t probe_error = (call);                                               \
    if (probe_error != cudaSuccess) {                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                  \
                   cudaGetErrorString(probe_error));                                      \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

// The integers of flag --`flag`'s comma-separated `list`; an entry that is
// not one is refused (the flag, the entry and the list printed; exit 2).
inline std::vector<int> ParseIntList(const char* flag, const std::string& list) {
  std::vector<int> values;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int value = 0;
    if (!absl::SimpleAtoi(part, &value)) {
      std::fprintf(stderr, "--%s: '%.*s' is not an integer (in '%s')\n", flag, static_cast<int>(part.size()),
                   part.data(), list.c_str());
      std::exit(2);
    }
    values.push_back(value);
  }
  return values;
}

// The launch attribute for clusters of `size` CTAs along x.
inline cudaLaunchAttribute ClusterDimension(int size) {
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(size);
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  return attribute;
}

#endif  // LOOM_BENCH_PROBE_COMMON_H_
