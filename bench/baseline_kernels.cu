// baseline_kernels.cu: the SwiGLU kernel of graph_bench's cuBLAS baseline.
//
// Memory-bound by design: one read of the GEMM output g [T, 2n] and one write of
// h [T, n]. Each thread of the vector path loads 16 bytes of g (four gate/up
// pairs) and stores 8 bytes of h; a scalar path takes the tail and unaligned
// pointers. Grid-stride loops, so the grid size needs no device query.
#include "baseline_kernels.h"

#include <algorithm>
#include <cstdint>

#include "half_types.cuh"

namespace loom::bench {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = 65535;

// The conversions of a 16-bit type, alone and in pairs: loom's own
// (half_types.cuh), the CUDA intrinsics any such kernel uses.
using Bf16 = kernel::HalfType<kernel::ElementType::kBF16>;
using Fp16 = kernel::HalfType<kernel::ElementType::kFP16>;

__device__ __forceinline__ float SiluTimes(float gate, float up) {
  return gate / (1.0f + expf(-gate)) * up;
}

// gate_up: [groups] x 16 bytes = 4 (gate, up) pairs; out: [groups] x 8 bytes = 4 results.
template <typename Half>
__global__ void SwiGLUVectorKernel(const uint4* __restrict__ gate_up, uint2* __restrict__ out,
                                   int64_t groups) {
  using Pair = typename Half::T2;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < groups;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 loaded = gate_up[i];
    const Pair* pairs = reinterpret_cast<const Pair*>(&loaded);
    const float2 p0 = Half::ToFloat2(pairs[0]);
    const float2 p1 = Half::ToFloat2(pairs[1]);
    const float2 p2 = Half::ToFloat2(pairs[2]);
    const float2 p3 = Half::ToFloat2(pairs[3]);
    uint2 packed;
    Pair* results = reinterpret_cast<Pair*>(&packed);
    results[0] = Half::FromFloat2(make_float2(SiluTimes(p0.x, p0.y), SiluTimes(p1.x, p1.y)));
    results[1] = Half::FromFloat2(make_float2(SiluTimes(p2.x, p2.y), SiluTimes(p3.x, p3.y)));
    out[i] = packed;
  }
}

// Elements [first, count) one at a time.
template <typename Half>
__global__ void SwiGLUScalarKernel(const typename Half::T* __restrict__ gate_up,
                                   typename Half::T* __restrict__ out, int64_t first,
                                   int64_t count) {
  for (int64_t i = first + blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float gate = Half::ToFloat(gate_up[2 * i]);
    const float up = Half::ToFloat(gate_up[2 * i + 1]);
    out[i] = Half::FromFloat(SiluTimes(gate, up));
  }
}

unsigned BlocksFor(int64_t work_items) {
  return static_cast<unsigned>(
      std::clamp<int64_t>((work_items + kThreadsPerBlock - 1) / kThreadsPerBlock, 1, kMaxBlocks));
}

template <typename Half>
cudaError_t LaunchSwiGLU(const void* gate_up, void* out, int64_t count, cudaStream_t stream) {
  using Scalar = typename Half::T;
  const bool vector_aligned = reinterpret_cast<uintptr_t>(gate_up) % 16 == 0 &&
                              reinterpret_cast<uintptr_t>(out) % 8 == 0;
  const int64_t groups = vector_aligned ? count / 4 : 0;
  if (groups > 0) {
    SwiGLUVectorKernel<Half><<<BlocksFor(groups), kThreadsPerBlock, 0, stream>>>(
        static_cast<const uint4*>(gate_up), static_cast<uint2*>(out), groups);
  }
  const int64_t first_scalar = groups * 4;
  if (first_scalar < count) {
    SwiGLUScalarKernel<Half><<<BlocksFor(count - first_scalar), kThreadsPerBlock, 0, stream>>>(
        static_cast<const Scalar*>(gate_up), static_cast<Scalar*>(out), first_scalar, count);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t SwiGLUInterleaved(const void* gate_up, void* out, int64_t count, cudaDataType_t type,
                              cudaStream_t stream) {
  if (type != CUDA_R_16BF && type != CUDA_R_16F) return cudaErrorInvalidValue;
  if (count <= 0) return cudaSuccess;
  return type == CUDA_R_16F ? LaunchSwiGLU<Fp16>(gate_up, out, count, stream)
                            : LaunchSwiGLU<Bf16>(gate_up, out, count, stream);
}

}  // namespace loom::bench
