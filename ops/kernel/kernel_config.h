// kernel_config.h: the compile-time shape of loom's persistent GEMM kernel and
// the shared-memory layout derived from it. Host and device code both include
// it: the runtime sizes shared memory and refuses plans that do not fit, the
// kernel carves its shared memory with the same function.
#ifndef LOOM_OPS_KERNEL_KERNEL_CONFIG_H_
#define LOOM_OPS_KERNEL_KERNEL_CONFIG_H_

#include <cstdint>

#include "kernel_params.h"
#include "loom/scheduler/schedule.h"
#include "packed_layout.h"

namespace loom::kernel {

// kTileN, the tile's width: 256 (KernelConfig, every plan's by default) or
// 128 (KernelConfigN128: twice the tiles of a node, each half the weights of
// a k-block; CompileOptions::tile_n). kHalfType: the plan's 16-bit element
// type, bf16 or fp16 (half_types.cuh); the shapes below do not depend on it.
template <int kTileN, ElementType kHalfType = ElementType::kBF16>
struct TiledConfig {
  static constexpr ElementType kHalf = kHalfType;
  // CTA tile: two consumer warpgroups, each owns 64 rows x kTileN columns of
  // FP32 accumulators (wgmma m64n256k16 or m64n128k16, kAccumulators
  // registers per thread).
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = kTileN;
  static constexpr int kAccumulators = kBlockN / 2;  // 64 rows x kBlockN over 128 threads
  static constexpr int kBlockK = 64;  // 64 16-bit elements = 128 bytes = one 128B swizzle row
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kRowsPerConsumer = kBlockM / kConsumerWarpgroups;  // 64
  static constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);        // 384
  static constexpr int kMaxClusterSize = 2;

  // Register split (setmaxnreg): producer warpgroup low, consumers high.
  // NOTE: setmaxnreg moves registers within what the CTA got at launch
  // (__launch_bounds__(384, 1) caps that at 168 per thread), and an .inc that
  // cannot be satisfied blocks forever. 56/224 fills it exactly. Measured
  // (bench/NOTES.md, v1.6): 72/216 left ring cursors spilled to local memory
  // inside the consumers' main loop (an LDL on the loop-carried path of every
  // k-block); 56/224 removed most of them and gained ~1-2% on square shapes.
  static constexpr int kLaunchRegisters = (65536 / kThreads) / 8 * 8;  // 168
  static constexpr int kProducerRegisters = 56;
  static constexpr int kConsumerRegisters = 224;

  static constexpr int kMaxStages = 8;   // per ring
  // Producer tile columns one granule of A's k-blocks may read for the A
  // loader's batched flag polls (dependencies.cuh, AProducerRun): one here,
  // where a k-block is narrower than any tile.
  static constexpr int kMaxTilesPerGranule = 1;
  // 16-byte words of flags (four each) the A loader reads per poll.
  static constexpr int kFlagWordsPerPoll = 4;
  // Jobs a cluster holds at once (fetched ahead of its loaders). 2, not 4
  // (v1.9, bench/NOTES.md): every fetched job is committed to its cluster, so
  // the more slots, the more of a dependent graph is handed out before anyone
  // knows which clusters will be free (66 clusters x 4 slots held most of the
  // 8-layer chain's 320 jobs at launch). Measured: the chain at one token 5-7%
  // faster with 2; the MLP block within noise. (Since v1.10 the scheduler also
  // holds back while its last job cannot start: scheduler_role.cuh.)
  static constexpr int kJobSlots = 2;
  // Arrivals per CTA that free a job slot: the A loader, the B loader and the
  // store warp (one thread each), and every consumer warp.
  static constexpr int kJobReleasesPerCta = 3 + 4 * kConsumerWarpgroups;
  // The job slots are read in every CTA of the cluster and freed in rank 0's
  // (JobStream::Next: every reader's wait and release at CTA scope; the
  // scheduler's wait for the releases acquires at cluster scope).
  static constexpr bool kJobSlotsAcrossCluster = true;
  // A launch whose first wave leaves clusters idle (a one-wave node with
  // fewer cluster tiles than clusters, its consumers behind it) has each
  // cluster delay its first fetch by this many cycles times a pseudo-random
  // rank of its SM (SpreadFirstFetch, scheduler_role.cuh): up to ~1.7 us
  // for 66 clusters. Why: CTAs are placed GPC by GPC in launch order, so the
  // first clusters to fetch share a few GPCs, and SMs whose part of the chip
  // has more SMs streaming stream slower (bench/gpc_probe.cu; 112 CTAs
  // streaming 2 MiB each: 58.5 us placed by launch order, 53.7 spread evenly
  // over the GPCs). Measured on the MLP block at 128 tokens (bench/NOTES.md
  // v1.39): gate/up's main loops 57-69 us by SM without, 60-62 with; the
  // block 123.2-123.8 us against 125.3-126.3. 100 cycles a rank took 152 us
  // (before the second fetch waited for the first fetches: early clusters
  // took a second gate/up job while late ones had none).
  static constexpr uint32_t kFirstFetchSpreadCycles = 50;
  // Each consumer warpgroup releases a ring slot once: its first thread
  // arrives after the warpgroup's wgmma.wait_group (RunMainLoop, mma_role.cuh).
  // One arrival a warpgroup instead of one a warp (a quarter of the remote
  // arrivals): 128-wide tiles 2-6% faster (512 x 4096 x 4096 0.693-0.699 ->
  // 0.722-0.738, 256 x 4096 x 14336 0.781-0.783 -> 0.808-0.821), the chains
  // at 200-512 rows 1-2%, 256-wide tiles level (bench/NOTES.md v1.71).
  static constexpr int kReleasingArrivalsPerCta = kConsumerWarpgroups;

  // Epilogue staging: per consumer warpgroup, kStagingBuffers panels of
  // 64 rows x 128 bytes (64 16-bit or 32 fp32 columns), 128B swizzled.
  static constexpr int kStagingBuffers = 2;
  static constexpr int kPanelBytes = 128;
  static constexpr int kStagingPanelBytes = kRowsPerConsumer * kPanelBytes;  // 8 KiB

  // TMA boxes: half-tiles, so a cluster peer can load its half for both CTAs.
  static constexpr int kABoxRows = kBlockM / 2;  // 64
  static constexpr int kBBoxRows = kBlockN / 2;  // 128 (64)
  static constexpr uint32_t kAStageBytes = kBlockM * kBlockK * 2;  // 16 KiB
  static constexpr uint32_t kBStageBytes = kBlockN * kBlockK * 2;  // 32 KiB (16)
  // A plan whose every node has at most kRowsPerConsumer rows (decode) only
  // ever loads and reads the first half of an A stage (warpgroup 0's rows):
  // its A stages are that half (KernelParams::a_stage_bytes), 32 KiB less
  // shared memory per CTA.
  static constexpr uint32_t kHalfAStageBytes = kAStageBytes / 2;  // 8 KiB

  static constexpr sched::TileShape tile() { return {kBlockM, kBlockN, kBlockK}; }
  // Packed weights (CompileOptions::pack_weights; the layout:
  // packed_layout.h): a stage, one k-block of a kBlockN-row tile, is one kBStageBytes
  // block, which the B loader reads with one bulk copy, or, where the
  // cluster shares B, each CTA half of it for both (RunBLoader,
  // loader_role.cuh). Packed for nodes of at most kMaxPackedRowBlocks row
  // blocks (256 rows), where the weights' stream bounds the node: a node
  // of M rows does M flops a weight byte, and past ~180 (the H200's
  // ~750 TF/s over ~4.2 TB/s) the multiply bounds it instead.
  LOOM_HOST_DEVICE static constexpr PackedLayout Packed() { return {kBlockN, 1}; }
  static constexpr int kMaxPackedRowBlocks = 2;

  static_assert(kBlockK * 2 == 128, "a k-block row must be exactly one 128-byte swizzle span");
  static_assert(128 * kProducerRegisters + 128 * kConsumerWarpgroups * kConsumerRegisters <=
                    kLaunchRegisters * kThreads,
                "register split exceeds the registers the CTA holds at launch: setmaxnreg.inc would hang");
  static_assert(kProducerRegisters % 8 == 0 && kConsumerRegisters % 8 == 0,
                "setmaxnreg takes multiples of 8");
  static_assert(kTileN == 256 || kTileN == 128, "the main loop has m64n256k16 and m64n128k16");
  static_assert(kHalf == ElementType::kBF16 || kHalf == ElementType::kFP16, "wgmma takes bf16 or fp16 here");
  static_assert(kBlockK == PackedLayout::kKBlockElements && Packed().StageBytes() == kBStageBytes,
                "a packed stage is the bytes a B stage's tensor load writes");
};

// The tiled kernel's two tile widths. What does not depend on the width
// (kBlockM, kBlockK, rings, staging, registers) is the same in both, and code
// that runs for either reads it from KernelConfig. (Each width also has an
// fp16 instantiation, TiledConfig<W, ElementType::kFP16>, of the same shape.)
using KernelConfig = TiledConfig<256>;
using KernelConfigN128 = TiledConfig<128>;

// `f` called with the config of tiles `tile_n` wide (a plan's width,
// CompileOptions::tile_n, already checked: anything but 128 is 256), for the
// host code that picks by it: the one place a width becomes its config.
template <class F>
constexpr decltype(auto) WithTiledConfig(int tile_n, F&& f) {
  return tile_n == KernelConfigN128::kBlockN ? f(KernelConfigN128{}) : f(KernelConfig{});
}

// Named barriers (bar.sync / bar.red ids; 0 is __syncthreads'): one per
// consumer warpgroup for syncs among its 128 threads. (Both warpgroups meet
// on an mbarrier: ConsumersMeet.)
enum class NamedBarrier : int { kConsumer0 = 1, kConsumer1 = 2 };

// Byte offsets into the dynamic shared memory of one CTA.
struct SmemLayout {
  uint32_t a_ring = 0;       // [a_stages][kBlockM][kBlockK] 16-bit, 128B swizzle
  uint32_t b_ring = 0;       // [b_stages][kBlockN][kBlockK] 16-bit, 128B swizzle
  uint32_t staging = 0;      // [kConsumerWarpgroups][kStagingBuffers][64][128 B], 128B swizzle
  uint32_t barriers = 0;     // uint64_t mbarriers, see SmemBarriers
  uint32_t job_slots = 0;    // int32_t [kJobSlots]
  uint32_t epoch = 0;        // uint32_t: this launch's epoch, read once by thread 0
  uint32_t total = 0;        // bytes to request, including 1 KiB of alignment slack
};

// The mbarriers, in this order, from SmemLayout::barriers.
struct SmemBarriers {
  uint64_t a_full[KernelConfig::kMaxStages];
  uint64_t a_empty[KernelConfig::kMaxStages];
  uint64_t b_full[KernelConfig::kMaxStages];
  uint64_t b_empty[KernelConfig::kMaxStages];
  uint64_t job_full[KernelConfig::kJobSlots];
  uint64_t job_empty[KernelConfig::kJobSlots];
  uint64_t staging_full[KernelConfig::kConsumerWarpgroups][KernelConfig::kStagingBuffers];
  uint64_t staging_empty[KernelConfig::kConsumerWarpgroups][KernelConfig::kStagingBuffers];
  uint64_t consumers_meet;  // both consumer warpgroups' threads, at a few-row reduce (ConsumersMeet)
};

template <class Config>
LOOM_HOST_DEVICE constexpr SmemLayout ComputeSmemLayout(int a_stages, int b_stages,
                                                        uint32_t a_stage_bytes = Config::kAStageBytes) {
  SmemLayout layout;
  uint32_t offset = 0;
  layout.a_ring = offset;
  offset += static_cast<uint32_t>(a_stages) * a_stage_bytes;
  layout.b_ring = offset;
  offset += static_cast<uint32_t>(b_stages) * Config::kBStageBytes;
  layout.staging = offset;
  offset += KernelConfig::kConsumerWarpgroups * KernelConfig::kStagingBuffers *
            KernelConfig::kStagingPanelBytes;
  layout.barriers = offset;
  offset += sizeof(SmemBarriers);
  layout.job_slots = offset;
  offset += KernelConfig::kJobSlots * sizeof(int32_t);
  layout.epoch = offset;
  offset += sizeof(uint32_t);
  // The dynamic shared memory base is only guaranteed 16-byte aligned; 128B
  // swizzled tiles need 1024. The kernel rounds the base up, so ask for slack.
  layout.total = offset + 1024;
  return layout;
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_KERNEL_CONFIG_H_
