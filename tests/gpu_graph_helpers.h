// gpu_graph_helpers.h: what the graph GPU suites share (graph_gpu_test.cc,
// multi_gpu_test.cc): the small MLP block most graph tests run, free device
// memory around a body, and a non-blocking stream.
#ifndef LOOM_TESTS_GPU_GRAPH_HELPERS_H_
#define LOOM_TESTS_GPU_GRAPH_HELPERS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "gpu_harness.h"
#include "gtest/gtest.h"

namespace loom::testbed {

// One MLP block at `tokens`: hidden 512, intermediate 1024 unless said,
// every tensor `dtype` (bf16 unless said).
//   h = swiglu(x W_gate_upᵀ): W_gate_up [2048, 512], rows interleaved (row
//       2j is gate_j, row 2j + 1 is up_j), h [tokens, 1024];
//   y = h W_downᵀ + x:        W_down [512, 1024], y [tokens, 512].
inline void AddMlpBlock(GpuHarness& h, Rng& rng, int64_t tokens, int64_t intermediate = 1024,
                        DType dtype = DType::kBF16, int64_t hidden = 512) {
  h.Input("x", dtype, tokens, hidden, rng);
  h.Input("W_gate_up", dtype, 2 * intermediate, hidden, rng);
  h.Input("W_down", dtype, hidden, intermediate, rng);
  h.Output("h", dtype, tokens, intermediate);
  h.Output("y", dtype, tokens, hidden);
  h.Build([](const auto& t, GemmGraph& g) {
    g.AddGemm("gate_up", t("x"), t("W_gate_up"), t("h"), {.activation = Activation::kSwiGLU});
    g.AddGemm("down", t("h"), t("W_down"), t("y"), {.residual = t("x")});
  });
}

inline int64_t FreeDeviceBytes() {
  size_t free_bytes = 0, total_bytes = 0;
  const cudaError_t error = cudaMemGetInfo(&free_bytes, &total_bytes);
  EXPECT_EQ(error, cudaSuccess) << "cudaMemGetInfo: " << cudaGetErrorName(error);
  return static_cast<int64_t>(free_bytes);
}

// Free device memory before and after `body` runs, each read once the device
// is idle, and printed to the test log under `what`.
struct FreeMemory {
  int64_t before = 0;
  int64_t after = 0;
  int64_t lost() const { return before - after; }
};
template <typename Body>
FreeMemory FreeMemoryAround(const std::string& what, Body&& body) {
  FreeMemory free;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  free.before = FreeDeviceBytes();
  body();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  free.after = FreeDeviceBytes();
  std::printf("[ loom     ] free device memory before %s %lld bytes, after %lld bytes\n", what.c_str(),
              static_cast<long long>(free.before), static_cast<long long>(free.after));
  return free;
}

// A non-blocking stream, destroyed with the object.
class Stream {
 public:
  Stream() { error_ = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); }
  ~Stream() {
    if (error_ == cudaSuccess) cudaStreamDestroy(stream_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaError_t error() const { return error_; }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
  cudaError_t error_ = cudaSuccess;
};

}  // namespace loom::testbed

#endif  // LOOM_TESTS_GPU_GRAPH_HELPERS_H_
