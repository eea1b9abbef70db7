// device_fill.h: random device data for the benchmarks.
#ifndef LOOM_BENCH_DEVICE_FILL_H_
#define LOOM_BENCH_DEVICE_FILL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::bench {

// `count` bf16 values uniform in [-scale, scale), a pure function of (seed,
// index). A weight scale of sqrt(3 / K) keeps a layer's outputs at the
// variance of its inputs, so chains of layers stay in range.
cudaError_t FillUniformBf16(void* data, int64_t count, uint64_t seed, cudaStream_t stream,
                            float scale = 1.0f);
// The same values rounded to fp16 instead.
cudaError_t FillUniformFp16(void* data, int64_t count, uint64_t seed, cudaStream_t stream,
                            float scale = 1.0f);

}  // namespace loom::bench

#endif  // LOOM_BENCH_DEVICE_FILL_H_
