// narrow_gemm.h: the host entry points of loom's narrow decode kernel
// (narrow_gemm.cu; why it exists: narrow_config.h). Plain host code may
// include this.
#ifndef LOOM_OPS_KERNEL_NARROW_GEMM_H_
#define LOOM_OPS_KERNEL_NARROW_GEMM_H_

#include <cuda_runtime_api.h>

#include "kernel_params.h"
#include "narrow_config.h"

namespace loom::kernel {

// Dynamic shared memory one CTA of the narrow kernel needs, with
// `consumers` consumer warpgroups (1 or NarrowConfig::kMaxConsumerWarpgroups),
// for tiles `tile_n` wide (NarrowConfig::TileN).
inline uint32_t NarrowSharedMemoryBytes(int a_stages, uint32_t a_stage_bytes, int b_stages, int consumers,
                                        int tile_n = NarrowConfig::kBlockN) {
  return ComputeNarrowSmemLayout(a_stages, a_stage_bytes, b_stages, consumers, tile_n).total;
}

// CTAs of the narrow kernel with `consumers` consumer warpgroups that can be
// resident at once on the current device with this much shared memory each
// (occupancy API). Also raises those instantiations' shared-memory limit,
// so call it before LaunchNarrowGemm. cudaErrorInvalidValue for consumers
// outside [1, NarrowConfig::kMaxConsumerWarpgroups].
cudaError_t MaxCoresidentNarrowCtas(uint32_t smem_bytes, int consumers, int* ctas);

// Launches the narrow kernel: `ctas` CTAs, no clusters (params.cluster_size
// is 1). params.a_stages / b_stages / a_stage_bytes are the narrow rings'.
// packed_b: some node has packed weights (KernelNode::packed_b); launches
// the instantiation whose B loader looks for them. consumers: consumer
// warpgroups, 1 or 2 (NarrowConfig::kMaxConsumerWarpgroups; else
// cudaErrorInvalidValue). tagged_handoffs: some node reads a tagged copy
// (KernelNode::tagged_a; one consumer warpgroup): launches the
// instantiation that has them (bf16 only: else cudaErrorInvalidValue).
// split: how the plan was lowered to divide K (NarrowConfig::Split): not at
// all; the pair split (64-column tiles, K in two halves; past 64 rows, A
// tiles of all of them, two consumers only, else cudaErrorInvalidValue); or
// the wide split (128-column tiles, K in quarters, two consumers only,
// else cudaErrorInvalidValue). half: the plan's 16-bit type
// (ElementType::kBF16 or kFP16). overlap_previous: launched with
// programmatic stream serialization, so that its CTAs start on the SMs
// the previous kernel on the stream leaves while that kernel's last CTAs
// still run (each role waits for it before touching what a launch writes:
// NarrowContext::AwaitPreviousLaunch). The first stages of packed weights
// stream in before that wait, so nothing may write them in the kernel just
// before (Plan::RepackWeights' kernel: the runtime's next launch does not
// overlap it).
cudaError_t LaunchNarrowGemm(const KernelParams& params, int ctas, bool packed_b, int consumers, bool tagged_handoffs,
                             NarrowConfig::Split split, ElementType half, bool overlap_previous,
                             cudaStream_t stream);

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_NARROW_GEMM_H_
