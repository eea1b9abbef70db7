// device_fill.h: random device data for the benchmark.
#ifndef LOOM_BENCH_DEVICE_FILL_H_
#define LOOM_BENCH_DEVICE_FILL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::bench {

// `count` bf16 values uniform in [-1, 1), a pure function of (seed, index).
cudaError_t FillUniformBf16(void* data, int64_t count, uint64_t seed, cudaStream_t stream);

}  // namespace loom::bench

#endif  // LOOM_BENCH_DEVICE_FILL_H_
