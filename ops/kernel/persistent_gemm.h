// persistent_gemm.h: the host entry points of loom's persistent kernel. Plain
// host code may include this; the kernel itself lives in persistent_gemm.cu.
#ifndef LOOM_OPS_KERNEL_PERSISTENT_GEMM_H_
#define LOOM_OPS_KERNEL_PERSISTENT_GEMM_H_

#include <cuda_runtime_api.h>

#include "kernel_config.h"
#include "kernel_params.h"

namespace loom::kernel {

// Dynamic shared memory one CTA needs for these ring depths and A stages, with
// tiles `tile_n` wide (256 or 128: kernel_config.h).
inline uint32_t SharedMemoryBytes(int a_stages, int b_stages, uint32_t a_stage_bytes, int tile_n) {
  return WithTiledConfig(tile_n, [&](auto config) {
    return ComputeSmemLayout<decltype(config)>(a_stages, b_stages, a_stage_bytes).total;
  });
}

// Clusters of `cluster_size` CTAs of the kernel that can be resident at once
// on the current device with this shared memory (occupancy API; the smaller
// of the answers of the plan's two instantiations, for tiles `tile_n` wide in
// the 16-bit type `half`: with and without split-K). Also raises every
// kernel's shared-memory limit to the device's maximum, so call it
// (Runtime::Compile does) before LaunchPersistentGemm on a device.
cudaError_t MaxCoresidentClusters(int a_stages, int b_stages, uint32_t a_stage_bytes, int cluster_size, int tile_n,
                                  ElementType half, int* clusters);

// Launches the persistent kernel: `clusters` clusters of params.cluster_size
// CTAs, the instantiation for tiles `tile_n` wide (the plan's) and the plan's
// 16-bit type `half` (ElementType::kBF16 or kFP16), with the split-K path when
// `split_k` (some node of the plan splits K), else the one without the reduce
// path. overlap_previous: launched with
// programmatic stream serialization: its CTAs start (barriers, tensor-map
// prefetches) as the previous kernel's leave, and wait for that kernel to
// end before reading anything else.
cudaError_t LaunchPersistentGemm(const KernelParams& params, int clusters, int tile_n, ElementType half, bool split_k,
                                 bool overlap_previous, cudaStream_t stream);

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_PERSISTENT_GEMM_H_
