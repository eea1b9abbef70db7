// narrow_gemm.cu: loom's narrow decode kernel, for plans whose every node has
// at most 64 rows, or up to 128 in two row blocks (why: narrow_config.h).
// Persistent like the tiled kernel (persistent_gemm.cu), with the same job
// queue, job slots, scheduler, dependency waits and watchdog
// (cta_context.cuh, dependencies.cuh, scheduler_role.cuh), and the same
// deadlock-freedom argument: jobs in queue order, every CTA co-resident, no
// finishing role waits on a later job.
//
// The roles, their rings and the protocol between them: narrow_context.cuh.
// The loaders: narrow_loader_role.cuh; the consumers' main loops:
// narrow_consumer_role.cuh; the epilogue into C and the publisher:
// narrow_epilogue.cuh. This file: the kernel, which gives each warp its
// role, its instantiations, and the launch.
#include "narrow_gemm.h"

#include <cuda/ptx>

#include <array>

#include "narrow_consumer_role.cuh"
#include "narrow_context.cuh"
#include "narrow_loader_role.cuh"
#include "scheduler_role.cuh"

namespace loom::kernel {
namespace {

// kKind (NarrowConfig::InstantiationFor): kPaired, the plan's A tiles are
// 17 to 32 rows (RunPairedWgmmaJob), its own instantiation, as kPackedB:
// with the paired path beside the others in one kernel, the one-token chain
// took 96.6-97.0 us against 95.2-95.4 and the 64-token one 116.3-117.6
// against 114.3-114.8, with their own paths unchanged (bench/NOTES.md
// v1.24); kShortRowBlocks, row blocks of KernelParams::block_m rows;
// kTaggedHandoff, the tagged handoff (one consumer warpgroup only);
// kPairSplit, the pair split's 64-column tiles over half of K
// (RunPairSplitJob), its own instantiation so that the others keep their code;
// kTallPairSplit, the same at 65-128 rows, both consumer warpgroups on every job
// (two consumers only); kWideSplit, the wide split's 128-column tiles over
// quarters of K, both consumer warpgroups on every job (two consumers only).
// kConsumers: consumer warpgroups (NarrowConfig::kMaxConsumerWarpgroups).
// kHalf: the plan's 16-bit type, bf16 or fp16 (half_types.cuh; the tagged
// handoff's words hold pairs of it).
template <bool kPackedB, NarrowConfig::Instantiation kKind, int kConsumers, ElementType kHalf>
__global__ void __launch_bounds__(NarrowConfig::Threads(kConsumers), 1)
    NarrowGemmKernel(const __grid_constant__ KernelParams params) {
  extern __shared__ uint8_t dynamic_smem[];
  // 128B-swizzled tiles need 1024-byte alignment; the layout reserved slack.
  // (Written out as in PersistentGemmKernel: the same two lines through a
  // shared helper changed the tiled kernel's register allocation, 464 -> 504
  // bytes of spill stores.)
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(dynamic_smem));
  uint8_t* smem = dynamic_smem + (((raw + 1023) & ~1023u) - raw);
  constexpr bool kTall = kKind == NarrowConfig::Instantiation::kTallPairSplit;
  // Jobs over a part of K, the last part summing: the pair split (tall or
  // not) and the wide split.
  constexpr bool kSplitK = NarrowConfig::SplitOf(kKind) != NarrowConfig::Split::kNone;
  constexpr bool kBothWarpgroups = NarrowConfig::BothWarpgroupsOnEveryJob(kKind);
  static_assert(!kBothWarpgroups || kConsumers == 2, "the tile's halves are the two consumer warpgroups'");
  constexpr int kTileN = NarrowConfig::TileN(NarrowConfig::SplitOf(kKind));
  const NarrowSmemLayout layout =
      ComputeNarrowSmemLayout(params.a_stages, params.a_stage_bytes, params.b_stages, kConsumers, kTileN);
  auto* barriers = reinterpret_cast<NarrowBarriers*>(smem + layout.barriers);
  // Set-up that reads nothing a launch writes, so that it overlaps the end
  // of the previous launch (NarrowContext::AwaitPreviousLaunch): the
  // barriers, and the prefetches of what every job's first steps read
  // (PrefetchPlanRecords).
  if (threadIdx.x == 0) {
    InitNarrowBarriers<kConsumers, kKind == NarrowConfig::Instantiation::kTaggedHandoff, kBothWarpgroups>(barriers,
                                                                                                       params);
  } else if (threadIdx.x / 32 == 3) {
    constexpr const CUtensorMap KernelNode::*kMaps[] = {&KernelNode::a_map, &KernelNode::b_map};
    PrefetchPlanRecords(params, static_cast<int>(threadIdx.x % 32), kMaps);
  }
  __syncthreads();

  NarrowContext ctx{params,
                    barriers,
                    smem + layout.a_ring,
                    smem + layout.b_ring,
                    reinterpret_cast<float4*>(smem + layout.partials),
                    reinterpret_cast<int32_t*>(smem + layout.job_slots),
                    0,
                    0,
                    Watchdog(params),
                    kKind == NarrowConfig::Instantiation::kShortRowBlocks
                        ? params.block_m
                        : (kTall ? NarrowConfig::kMaxRows : NarrowConfig::kBlockM),
                    kTileN};
  if (threadIdx.x < 128) {
    if constexpr (kConsumers > 1) ptx::setmaxnreg_dec<NarrowConfig::kProducerRegisters>();
    const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
    if (warp == 0) {
      ctx.AwaitPreviousLaunch();
      RunNarrowALoader<kKind == NarrowConfig::Instantiation::kTaggedHandoff>(ctx, lane);
    } else if (lane == 0) {
      switch (warp) {
        case 1:
          RunNarrowBLoader<kPackedB, kTileN>(ctx);  // waits when it must (packed weights stream in first)
          break;
        case 2:
          // The first wave is static, CTA i taking queue index i, so the
          // first job is handed out before the wait (and its packed weights
          // start streaming); fetches after it start past the grid.
          RunScheduler(ctx, static_cast<int>(blockIdx.x), gridDim.x, 0u, [&] { ctx.AwaitPreviousLaunchAsScheduler(); });
          FinishFetching(params, ctx.epoch);
          break;
        default:
          ctx.AwaitPreviousLaunch();
          RunNarrowPublisher<kSplitK>(ctx);
          break;
      }
    }
    __syncwarp();
  } else {
    if constexpr (kConsumers > 1) ptx::setmaxnreg_inc<NarrowConfig::kConsumerRegisters>();
    ctx.AwaitPreviousLaunch();
    RunNarrowConsumer<kKind, kConsumers, kHalf>(ctx);
  }
  // Every TMA load this CTA issued has landed (its consumer waited for it)
  // before anyone leaves.
  __syncthreads();
}

}  // namespace

namespace {

using NarrowKernel = void (*)(KernelParams);

// A plan's instantiations by kind (NarrowConfig::InstantiationFor) and
// consumer warpgroups, for packed weights or not and the 16-bit type kHalf.
// (No tagged handoff with two consumer warpgroups: that slot is the default
// kernel's; no tall pair split or wide split with one: none, LaunchNarrowGemm
// refuses it.)
inline constexpr int kInstantiations = 7;
template <bool kPackedB, ElementType kHalf>
constexpr std::array<std::array<NarrowKernel, 2>, kInstantiations> KernelsOf() {
  using K = NarrowConfig::Instantiation;
  return {{{NarrowGemmKernel<kPackedB, K::kDefault, 1, kHalf>, NarrowGemmKernel<kPackedB, K::kDefault, 2, kHalf>},
           {NarrowGemmKernel<kPackedB, K::kPaired, 1, kHalf>, NarrowGemmKernel<kPackedB, K::kPaired, 2, kHalf>},
           {NarrowGemmKernel<kPackedB, K::kShortRowBlocks, 1, kHalf>,
            NarrowGemmKernel<kPackedB, K::kShortRowBlocks, 2, kHalf>},
           {NarrowGemmKernel<kPackedB, K::kTaggedHandoff, 1, kHalf>,
            NarrowGemmKernel<kPackedB, K::kDefault, 2, kHalf>},
           {NarrowGemmKernel<kPackedB, K::kPairSplit, 1, kHalf>,
            NarrowGemmKernel<kPackedB, K::kPairSplit, 2, kHalf>},
           {nullptr, NarrowGemmKernel<kPackedB, K::kTallPairSplit, 2, kHalf>},
           {nullptr, NarrowGemmKernel<kPackedB, K::kWideSplit, 2, kHalf>}}};
}

// The instantiation for packed weights or not, the kind, one or two consumer
// warpgroups and the plan's 16-bit type.
NarrowKernel NarrowKernelFor(bool packed_b, NarrowConfig::Instantiation kind, int consumers, ElementType half) {
  constexpr std::array<std::array<std::array<std::array<NarrowKernel, 2>, kInstantiations>, 2>, 2> kKernels = {
      {{KernelsOf<false, ElementType::kBF16>(), KernelsOf<true, ElementType::kBF16>()},
       {KernelsOf<false, ElementType::kFP16>(), KernelsOf<true, ElementType::kFP16>()}}};
  return kKernels[half == ElementType::kFP16][packed_b][static_cast<int>(kind)][consumers - 1];
}

}  // namespace

cudaError_t MaxCoresidentNarrowCtas(uint32_t smem_bytes, int consumers, int* ctas) {
  *ctas = 0;
  if (consumers < 1 || consumers > NarrowConfig::kMaxConsumerWarpgroups) return cudaErrorInvalidValue;
  int device = 0;
  if (cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) return error;
  int max_smem = 0;
  int sms = 0;
  if (cudaError_t error = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      error != cudaSuccess) {
    return error;
  }
  if (cudaError_t error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      error != cudaSuccess) {
    return error;
  }
  for (ElementType half : {ElementType::kBF16, ElementType::kFP16}) {
    for (bool packed_b : {false, true}) {
      for (NarrowConfig::Instantiation kind :
           {NarrowConfig::Instantiation::kDefault, NarrowConfig::Instantiation::kPaired,
            NarrowConfig::Instantiation::kShortRowBlocks, NarrowConfig::Instantiation::kTaggedHandoff,
            NarrowConfig::Instantiation::kPairSplit, NarrowConfig::Instantiation::kTallPairSplit,
            NarrowConfig::Instantiation::kWideSplit}) {
        const NarrowKernel kernel = NarrowKernelFor(packed_b, kind, consumers, half);
        if (kernel == nullptr) continue;  // no such instantiation (both warpgroups on every job, one consumer)
        if (cudaError_t error =
                cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem);
            error != cudaSuccess) {
          return error;
        }
      }
    }
  }
  // The instantiations with the same consumers differ only in the B
  // loader's branch and the consumer's path: one answer.
  int per_sm = 0;
  if (cudaError_t error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, NarrowKernelFor(false, NarrowConfig::Instantiation::kDefault, consumers, ElementType::kBF16),
          NarrowConfig::Threads(consumers), smem_bytes);
      error != cudaSuccess) {
    return error;
  }
  *ctas = per_sm * sms;
  return cudaSuccess;
}

cudaError_t LaunchNarrowGemm(const KernelParams& params, int ctas, bool packed_b, int consumers, bool tagged_handoffs,
                             NarrowConfig::Split split, ElementType half, bool overlap_previous,
                             cudaStream_t stream) {
  if (consumers < 1 || consumers > NarrowConfig::kMaxConsumerWarpgroups) return cudaErrorInvalidValue;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(ctas), 1, 1);
  config.blockDim = dim3(static_cast<unsigned>(NarrowConfig::Threads(consumers)), 1, 1);
  config.dynamicSmemBytes = NarrowSharedMemoryBytes(
      params.a_stages, params.a_stage_bytes, params.b_stages, consumers, NarrowConfig::TileN(split));
  config.stream = stream;
  cudaLaunchAttribute overlap;
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  if (overlap_previous) {
    config.attrs = &overlap;
    config.numAttrs = 1;
  }
  const NarrowConfig::Instantiation kind =
      NarrowConfig::InstantiationFor(NarrowConfig::ATileRows(params.a_stage_bytes), params.block_m, tagged_handoffs,
                                     split);
  const NarrowKernel kernel = NarrowKernelFor(packed_b, kind, consumers, half);
  if (kernel == nullptr) return cudaErrorInvalidValue;
  return cudaLaunchKernelEx(&config, kernel, params);
}

}  // namespace loom::kernel
