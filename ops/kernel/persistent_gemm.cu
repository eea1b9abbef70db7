// persistent_gemm.cu: loom's persistent kernel. One CTA per SM (clusters of
// two), warp-specialised roles, jobs pulled from the device queue until it is
// empty. The roles and their protocols: cta_context.cuh; each role reads top
// to bottom in its own file.
//
// Deadlock freedom, the invariant every change must keep:
//   (a) jobs are handed out in queue order, which is topological;
//   (b) the grid never exceeds the co-resident clusters (the host asks the
//       occupancy API), so every job handed out is held by a running CTA;
//   (c) no role that finishes a job (consumers, store) waits on a later job.
// Then the lowest-numbered unfinished job has all its producers finished and
// its CTA's roles have nothing older to wait for, so it completes; by
// induction every job does. Waits are still bounded (watchdog.cuh) so a broken
// invariant reports instead of hanging.
#include "persistent_gemm.h"

#include <cuda/ptx>

#include <algorithm>
#include <array>

#include "consumer_role.cuh"
#include "loader_role.cuh"
#include "scheduler_role.cuh"
#include "store_role.cuh"

namespace loom::kernel {
namespace {

// Thread 0 of each CTA initialises every barrier of the CTA.
__device__ void InitBarriers(SmemBarriers* barriers, const KernelParams& params) {
  const uint32_t cluster = static_cast<uint32_t>(params.cluster_size);
  for (int s = 0; s < params.a_stages; ++s) {
    cuda::ptx::mbarrier_init(&barriers->a_full[s], 1);
    cuda::ptx::mbarrier_init(&barriers->a_empty[s], KernelConfig::kReleasingArrivalsPerCta * cluster);
  }
  for (int s = 0; s < params.b_stages; ++s) {
    cuda::ptx::mbarrier_init(&barriers->b_full[s], 1);
    cuda::ptx::mbarrier_init(&barriers->b_empty[s], KernelConfig::kReleasingArrivalsPerCta * cluster);
  }
  for (int s = 0; s < KernelConfig::kJobSlots; ++s) {
    cuda::ptx::mbarrier_init(&barriers->job_full[s], 1);
    cuda::ptx::mbarrier_init(&barriers->job_empty[s], KernelConfig::kJobReleasesPerCta * cluster);
  }
  for (int w = 0; w < KernelConfig::kConsumerWarpgroups; ++w) {
    for (int b = 0; b < KernelConfig::kStagingBuffers; ++b) {
      cuda::ptx::mbarrier_init(&barriers->staging_full[w][b], 128);
      cuda::ptx::mbarrier_init(&barriers->staging_empty[w][b], 1);
    }
  }
  cuda::ptx::mbarrier_init(&barriers->consumers_meet, 128 * KernelConfig::kConsumerWarpgroups);
  // Make the initialisation visible to the async proxy and to the peer CTA
  // before anyone (TMA, remote arrivals) touches the barriers.
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}

// Config: the tile's width (KernelConfig or KernelConfigN128, a plan's
// choice: CompileOptions::tile_n) and the plan's 16-bit type (those two for
// bf16, Fp16<...> of them for fp16). kSplitK: the instantiation for plans
// with split-K nodes (partials, reduce jobs). Plans without them launch the
// other one, whose consumers never see the reduce path (see RunConsumer in
// consumer_role.cuh for why that matters).
template <class Config, bool kSplitK>
__global__ void __launch_bounds__(KernelConfig::kThreads, 1)
    PersistentGemmKernel(const __grid_constant__ KernelParams params) {
  extern __shared__ uint8_t dynamic_smem[];
  // 128B-swizzled tiles need 1024-byte alignment; the layout reserved slack.
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(dynamic_smem));
  uint8_t* smem = dynamic_smem + (((raw + 1023) & ~1023u) - raw);
  const SmemLayout layout = ComputeSmemLayout<Config>(params.a_stages, params.b_stages, params.a_stage_bytes);
  auto* barriers = reinterpret_cast<SmemBarriers*>(smem + layout.barriers);
  auto* epoch_slot = reinterpret_cast<uint32_t*>(smem + layout.epoch);

  // Three round trips at once, as in the narrow kernel: the epoch, the
  // scheduler's first fetch, and the prefetches of what every job's first
  // steps read (PrefetchPlanRecords). The first two, and everything after
  // the cluster barrier, wait for the previous kernel on the stream to end
  // (with LaunchPersistentGemm's overlap_previous this launch's CTAs start
  // as that kernel's leave); the barriers and the prefetches need not.
  int first_fetch = -1;
  if (threadIdx.x == 0) {
    InitBarriers(barriers, params);
    cudaGridDependencySynchronize();
    *epoch_slot = params.state->epoch + 1;
  } else if (threadIdx.x == 3 * 32) {  // the scheduler (warp 3, lane 0), on cluster rank 0 only
    if (cuda::ptx::get_sreg_cluster_ctarank() == 0) {
      cudaGridDependencySynchronize();
      SpreadFirstFetch(params);
      first_fetch = static_cast<int>(atomicAdd(&params.state->cursor, 1u));
    }
  } else if (threadIdx.x / 32 == 2) {
    constexpr const CUtensorMap KernelNode::*kMaps[] = {&KernelNode::a_map, &KernelNode::b_map,
                                                        &KernelNode::a_slot_map, &KernelNode::b_slot_map};
    PrefetchPlanRecords(params, static_cast<int>(threadIdx.x % 32), kMaps);
  }
  ptx::cluster_sync();
  cudaGridDependencySynchronize();
  // The next launch may start its CTAs as this one's leave: only once this
  // one has waited, so no launch overlaps a kernel two back.
  cudaTriggerProgrammaticLaunchCompletion();

  const CtaContext<Config> ctx{params,
                       barriers,
                       smem + layout.a_ring,
                       smem + layout.b_ring,
                       smem + layout.staging,
                       reinterpret_cast<int32_t*>(smem + layout.job_slots),
                       cuda::ptx::get_sreg_cluster_ctarank(),
                       *epoch_slot,
                       Watchdog(params)};

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<KernelConfig::kProducerRegisters>();
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
      switch (warp) {
        case 0:
          RunALoader(ctx);
          break;
        case 1:
          RunBLoader(ctx);
          break;
        case 2:
          RunStore(ctx);
          break;
        case 3:
          if (ctx.rank == 0) {
            RunScheduler(ctx, first_fetch, 0, params.first_fetch_spread_cycles != 0 ? SchedulerCount(params) : 0u,
                         [] {});
            FinishFetching(params, ctx.epoch);
          }
          break;
      }
    }
    __syncwarp();
  } else {
    ptx::setmaxnreg_inc<KernelConfig::kConsumerRegisters>();
    RunConsumer<kSplitK>(ctx, warpgroup - 1);
  }

  // No CTA may leave while its peer can still arrive on its barriers or
  // multicast into its shared memory.
  ptx::cluster_sync();
}

// The fp16 instantiation of a width's config.
template <class Config>
using Fp16 = TiledConfig<Config::kBlockN, ElementType::kFP16>;

// `f` called with the config of tiles `tile_n` wide in the 16-bit type `half`.
template <class F>
decltype(auto) WithKernelConfig(int tile_n, ElementType half, F&& f) {
  return WithTiledConfig(tile_n, [&](auto width) {
    using Config = decltype(width);
    return half == ElementType::kFP16 ? f(Fp16<Config>{}) : f(Config{});
  });
}

// Every instantiation may use all the shared memory the device allows a
// block; each launch asks for what its ring depths need. Set once per Plan
// compile, not per launch (a launch stays pure device work, replays too).
cudaError_t ConfigureKernels() {
  int device = 0;
  if (cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) return error;
  int max_smem = 0;
  if (cudaError_t error = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      error != cudaSuccess) {
    return error;
  }
  for (auto kernel : {PersistentGemmKernel<KernelConfig, false>, PersistentGemmKernel<KernelConfig, true>,
                      PersistentGemmKernel<KernelConfigN128, false>, PersistentGemmKernel<KernelConfigN128, true>,
                      PersistentGemmKernel<Fp16<KernelConfig>, false>, PersistentGemmKernel<Fp16<KernelConfig>, true>,
                      PersistentGemmKernel<Fp16<KernelConfigN128>, false>,
                      PersistentGemmKernel<Fp16<KernelConfigN128>, true>}) {
    if (cudaError_t error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem);
        error != cudaSuccess) {
      return error;
    }
  }
  return cudaSuccess;
}

// `attributes`: room for two (the cluster shape, and programmatic stream
// serialization when `overlap_previous`).
cudaLaunchConfig_t MakeLaunchConfig(int ctas, uint32_t smem_bytes, cudaStream_t stream,
                                    cudaLaunchAttribute* attributes, int cluster_size, bool overlap_previous) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(ctas), 1, 1);
  config.blockDim = dim3(KernelConfig::kThreads, 1, 1);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = static_cast<unsigned>(cluster_size);
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attributes;
  config.numAttrs = overlap_previous ? 2 : 1;
  return config;
}

}  // namespace

cudaError_t MaxCoresidentClusters(int a_stages, int b_stages, uint32_t a_stage_bytes, int cluster_size, int tile_n,
                                  ElementType half, int* clusters) {
  if (cudaError_t error = ConfigureKernels(); error != cudaSuccess) return error;
  const uint32_t smem_bytes = SharedMemoryBytes(a_stages, b_stages, a_stage_bytes, tile_n);
  cudaLaunchAttribute attributes[2];
  cudaLaunchConfig_t config = MakeLaunchConfig(cluster_size, smem_bytes, nullptr, attributes, cluster_size, false);
  *clusters = 0;
  const auto kernels = WithKernelConfig(tile_n, half, [](auto kernel_config) {
    using Config = decltype(kernel_config);
    return std::array{PersistentGemmKernel<Config, false>, PersistentGemmKernel<Config, true>};
  });
  for (auto kernel : kernels) {
    int fit = 0;
    if (cudaError_t error = cudaOccupancyMaxActiveClusters(&fit, kernel, &config); error != cudaSuccess) return error;
    *clusters = *clusters == 0 ? fit : std::min(*clusters, fit);
  }
  return cudaSuccess;
}

cudaError_t LaunchPersistentGemm(const KernelParams& params, int clusters, int tile_n, ElementType half, bool split_k,
                                 bool overlap_previous, cudaStream_t stream) {
  const uint32_t smem_bytes = SharedMemoryBytes(params.a_stages, params.b_stages, params.a_stage_bytes, tile_n);
  cudaLaunchAttribute attributes[2];
  cudaLaunchConfig_t config = MakeLaunchConfig(clusters * params.cluster_size, smem_bytes, stream, attributes,
                                               params.cluster_size, overlap_previous);
  return WithKernelConfig(tile_n, half, [&](auto kernel_config) {
    using Config = decltype(kernel_config);
    return split_k ? cudaLaunchKernelEx(&config, PersistentGemmKernel<Config, true>, params)
                   : cudaLaunchKernelEx(&config, PersistentGemmKernel<Config, false>, params);
  });
}

}  // namespace loom::kernel
