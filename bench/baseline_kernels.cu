// baseline_kernels.cu: the SwiGLU kernel of graph_bench's cuBLAS baseline.
//
// Memory-bound by design: one read of the GEMM output g [T, 2n] and one write of
// h [T, n]. Each thread of the vector path loads 16 bytes of g (four gate/up
// pairs) and stores 8 bytes of h; a scalar path takes the tail and unaligned
// pointers. Grid-stride loops, so the grid size needs no device query.
#include "baseline_kernels.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

namespace loom::bench {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = 65535;

__device__ __forceinline__ float SiluTimes(float gate, float up) {
  return gate / (1.0f + expf(-gate)) * up;
}

// gate_up: [groups] x 16 bytes = 4 (gate, up) pairs; out: [groups] x 8 bytes = 4 bf16.
__global__ void SwiGLUVectorKernel(const uint4* __restrict__ gate_up, uint2* __restrict__ out,
                                   int64_t groups) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < groups;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 loaded = gate_up[i];
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&loaded);
    const float2 p0 = __bfloat1622float2(pairs[0]);
    const float2 p1 = __bfloat1622float2(pairs[1]);
    const float2 p2 = __bfloat1622float2(pairs[2]);
    const float2 p3 = __bfloat1622float2(pairs[3]);
    uint2 packed;
    __nv_bfloat162* results = reinterpret_cast<__nv_bfloat162*>(&packed);
    results[0] = __floats2bfloat162_rn(SiluTimes(p0.x, p0.y), SiluTimes(p1.x, p1.y));
    results[1] = __floats2bfloat162_rn(SiluTimes(p2.x, p2.y), SiluTimes(p3.x, p3.y));
    out[i] = packed;
  }
}

// Elements [first, count) one at a time.
__global__ void SwiGLUScalarKernel(const __nv_bfloat16* __restrict__ gate_up,
                                   __nv_bfloat16* __restrict__ out, int64_t first, int64_t count) {
  for (int64_t i = first + blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float gate = __bfloat162float(gate_up[2 * i]);
    const float up = __bfloat162float(gate_up[2 * i + 1]);
    out[i] = __float2bfloat16_rn(SiluTimes(gate, up));
  }
}

unsigned BlocksFor(int64_t work_items) {
  return static_cast<unsigned>(
      std::clamp<int64_t>((work_items + kThreadsPerBlock - 1) / kThreadsPerBlock, 1, kMaxBlocks));
}

}  // namespace

cudaError_t SwiGLUInterleavedBf16(const void* gate_up, void* out, int64_t count,
                                  cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  const bool vector_aligned = reinterpret_cast<uintptr_t>(gate_up) % 16 == 0 &&
                              reinterpret_cast<uintptr_t>(out) % 8 == 0;
  const int64_t groups = vector_aligned ? count / 4 : 0;
  if (groups > 0) {
    SwiGLUVectorKernel<<<BlocksFor(groups), kThreadsPerBlock, 0, stream>>>(
        static_cast<const uint4*>(gate_up), static_cast<uint2*>(out), groups);
  }
  const int64_t first_scalar = groups * 4;
  if (first_scalar < count) {
    SwiGLUScalarKernel<<<BlocksFor(count - first_scalar), kThreadsPerBlock, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(gate_up), static_cast<__nv_bfloat16*>(out), first_scalar,
        count);
  }
  return cudaGetLastError();
}

}  // namespace loom::bench
