// device_fill.cu: fills device buffers with reproducible random bf16 or fp16
// values, so the benchmark's inputs never touch the host (GBs of data).
#include "device_fill.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace loom::bench {
namespace {

__device__ uint32_t Hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

struct RoundToBf16 {
  __device__ __nv_bfloat16 operator()(float x) const { return __float2bfloat16_rn(x); }
};
struct RoundToFp16 {
  __device__ __half operator()(float x) const { return __float2half_rn(x); }
};

// Element i of a fill: uniform in [-scale, scale), rounded by `round`.
template <typename T, typename Round>
__global__ void FillUniformKernel(T* data, int64_t count, uint64_t seed, float scale, Round round) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    const float u = (Hash(seed * 0x9E3779B97F4A7C15ULL + i) >> 8) * (1.0f / 16777216.0f);  // [0, 1)
    data[i] = round(scale * (2.0f * u - 1.0f));
  }
}

}  // namespace

cudaError_t FillUniformBf16(void* data, int64_t count, uint64_t seed, cudaStream_t stream, float scale) {
  FillUniformKernel<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(data), count, seed, scale,
                                              RoundToBf16{});
  return cudaGetLastError();
}

cudaError_t FillUniformFp16(void* data, int64_t count, uint64_t seed, cudaStream_t stream, float scale) {
  FillUniformKernel<<<1024, 256, 0, stream>>>(static_cast<__half*>(data), count, seed, scale,
                                              RoundToFp16{});
  return cudaGetLastError();
}

}  // namespace loom::bench
