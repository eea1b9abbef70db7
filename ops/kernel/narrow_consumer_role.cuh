// narrow_consumer_role.cuh: the narrow kernel's consumer warpgroups: their
// main loops (mma.sync at 1-16 rows, paired m64n64k16 wgmma at 17-32,
// m64n32k16 at 33-64), the ring releases, and the turns two consumers take
// over a CTA's jobs (protocol: narrow_context.cuh).
#ifndef LOOM_OPS_KERNEL_NARROW_CONSUMER_ROLE_CUH_
#define LOOM_OPS_KERNEL_NARROW_CONSUMER_ROLE_CUH_

#include <cuda/ptx>

#include "narrow_context.cuh"
#include "narrow_epilogue.cuh"
#include "wgmma.cuh"

namespace loom::kernel {

// RunWgmmaJob's main loop (33 to 64 rows): each k16 step one wgmma
// m64n32k16 with both operands from shared memory, A through a descriptor of
// all 64 rows of its k-block tile (rows past the plan's run into what follows
// the tile: NarrowConfig::ATileBytes). One wgmma into one accumulator waits for
// the last (a single chain of short wgmmas left the tensor cores idle,
// bench/NOTES.md v1.16), so the k16 steps of a k-block go to kChains
// independent accumulator sets, summed at the end (in a fixed order: the
// result does not depend on timing). A stage's 16 wgmmas are one group; its
// slots are freed once the next stage's group is issued and this one has
// retired (wgmma_wait_group<1>).
// NOTE: with A from registers (the RS form: each warp's 16 rows loaded with
// ldmatrix into one of two buffers, so one group a k-block and a wait after
// each) the MLP block at 64 tokens took 160 us and the 8-layer chain 177;
// with this loop 131 and 152 (bench/NOTES.md v1.18). Reading A from shared
// memory costs twice the bytes of B per wgmma; the waits cost more.
inline constexpr int kChains = NarrowConfig::kBlockK / 16;

// Frees the oldest stage's A and B slots once this warp's reads of them are
// done (one arrival per consumer warp, or on A one per lane:
// kEveryLaneOnA) and moves the cursors on.
template <bool kEveryLaneOnA>
__device__ __forceinline__ void ReleaseSlots(const NarrowContext& ctx, bool release_lane, RingCursor& a_release,
                                             RingCursor& b_release) {
  if (kEveryLaneOnA || release_lane) cuda::ptx::mbarrier_arrive(&ctx.barriers->a_empty[a_release.stage]);
  if (release_lane) cuda::ptx::mbarrier_arrive(&ctx.barriers->b_empty[b_release.stage]);
  a_release.Advance(ctx.params.a_stages);
  b_release.Advance(ctx.params.b_stages);
}

// What one consumer warpgroup keeps across jobs: which it is, its position
// in both rings, and the phase of its turn barrier, which keeps the two
// warpgroups' main loops in job order (ConsumeJobs).
struct ConsumerRings {
  int warpgroup;  // 0 or 1
  RingCursor a, b;
  uint32_t turn_phase = 0;

  // Its named barrier and partials buffer (RunMmaSyncJob, RunPairedWgmmaJob).
  __device__ uint32_t barrier() const { return static_cast<uint32_t>(NamedBarrier::kConsumer0) + warpgroup; }
  __device__ float4* partials(const NarrowContext& ctx) const {
    return ctx.partials + warpgroup * (NarrowConfig::kPartialsBytes / sizeof(float4));
  }
  // Its turn barrier (completes when the other warpgroup's main loop has
  // waited for its last stage), and the other's.
  __device__ uint64_t* turn(const NarrowContext& ctx) const { return &ctx.barriers->consumer_turn[warpgroup]; }
  __device__ uint64_t* next_turn(const NarrowContext& ctx) const {
    return &ctx.barriers->consumer_turn[warpgroup ^ 1];
  }
};

// This warp's main loop has waited for every stage of its job: the other
// warpgroup may wait for the next job's (one arrival per warp).
template <int kConsumers>
__device__ __forceinline__ void PassTurn(const NarrowContext& ctx, const ConsumerRings& rings, int lane) {
  if (kConsumers > 1 && lane == 0) cuda::ptx::mbarrier_arrive(rings.next_turn(ctx));
}

// Waits for the stage under the cursors to be full in both rings; on the
// job's first stage also stamps data_ready and lets the epilogue prefetch.
// The warp leaves converged: what follows (wgmma, ldmatrix, mma.sync) is
// warp-wide.
// NOTE: the __syncwarp costs a 64-row job at 33 CTAs 4-10% (nothing on the
// whole chip); waiting on a warp vote instead (`while (!__all_sync(...,
// try_wait))`) was slower still (bench/NOTES.md v1.48). Issuing the B poll's
// first try before A's result is tested made the 64-token block ~4 us slower
// (v1.88).
template <typename Epilogue>
__device__ __forceinline__ void WaitForStage(const NarrowContext& ctx, const ConsumerRings& rings, int index,
                                             bool first, bool leader, Epilogue& epilogue) {
  WaitPhase(&ctx.barriers->a_full[rings.a.stage], rings.a.phase);
  if (first) {
    RecordTrace(ctx, index, leader, &DeviceJobTrace::data_ready);
    epilogue.Prefetch();
  }
  WaitPhase(&ctx.barriers->b_full[rings.b.stage], rings.b.phase);
  __syncwarp();
}

// A job of 33 to 64 rows: wgmma m64n32k16 over the whole K, then the
// epilogue. kHalf: the plan's 16-bit type (NarrowGemmKernel).
template <int kConsumers, ElementType kHalf>
__device__ void RunWgmmaJob(const NarrowContext& ctx, const CtaWork& work, int index, bool leader, int warp,
                            int lane, ConsumerRings& rings) {
  const bool release_lane = lane == 0;
  const uint32_t a_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.a_ring));
  const uint32_t b_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.b_ring));
  const int k_blocks = work.job->k_block_end - work.job->k_block_begin;
  NarrowEpilogue<kHalf> epilogue(work, ctx.tile().m, warp, lane);
  float chains[kChains][16];
#pragma unroll
  for (int c = 0; c < kChains; ++c) {
#pragma unroll
    for (int r = 0; r < 16; ++r) chains[c][r] = 0.0f;
  }
  // The stage whose wgmmas were issued and whose slots are not yet released.
  RingCursor a_release = rings.a, b_release = rings.b;
  bool pending = false;
  const uint32_t a_tile_bytes = ctx.params.a_stage_bytes / NarrowConfig::kKBlocksPerStage;
  for (int kb0 = 0; kb0 < k_blocks; kb0 += NarrowConfig::kKBlocksPerStage) {
    WaitForStage(ctx, rings, index, kb0 == 0, leader, epilogue);
    const uint32_t a_stage = a_base + rings.a.stage * ctx.params.a_stage_bytes;
    const uint32_t b_stage = b_base + rings.b.stage * NarrowConfig::kBStageBytes;
    // Every k-block of the stage, those past K too (zero-filled: LoadStage):
    // wgmmas under a branch made ptxas fence the accumulators (C7519).
    ptx::wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < NarrowConfig::kKBlocksPerStage; ++kb) {
      const uint32_t desc_a = Swizzle128DescriptorLow(a_stage + kb * a_tile_bytes);
      const uint32_t desc_b = Swizzle128DescriptorLow(b_stage + kb * NarrowConfig::kBTileBytes);
#pragma unroll
      for (int k16 = 0; k16 < kChains; ++k16) {
        wgmma_m64n32k16_ss<kHalf>(chains[k16], AdvanceDescriptorLowK16(desc_a, k16),
                                AdvanceDescriptorLowK16(desc_b, k16));
      }
    }
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<1>();
    // The previous stage's group has retired: its slots are free.
    if (pending) ReleaseSlots<false>(ctx, release_lane, a_release, b_release);
    pending = true;
    rings.a.Advance(ctx.params.a_stages);
    rings.b.Advance(ctx.params.b_stages);
  }
  PassTurn<kConsumers>(ctx, rings, lane);
  ptx::wgmma_wait_group<0>();
  if (pending) ReleaseSlots<false>(ctx, release_lane, a_release, b_release);
  float acc[16];
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    acc[r] = chains[0][r];
#pragma unroll
    for (int c = 1; c < kChains; ++c) acc[r] += chains[c][r];
  }
  RecordTrace(ctx, index, leader, &DeviceJobTrace::mma_done);
  epilogue.Store(acc);
}

// A job of 17 to 32 rows (kRows, the A tile's rows: 24 or 32) on wgmma
// m64n64k16, two k-blocks a wgmma: its 64 rows are the tokens over k-block
// 2p (rows 0..kRows-1) and over k-block 2p + 1 (rows kRows..2 kRows-1),
// which lie one after the other in the A stage (rows past them read what
// follows and are never used); its 64 columns the tile's weights over the
// same two k-blocks, one after the other in the B stage. Of the product,
// rows 0..kRows-1 x columns 0-31 are the sums over k-block 2p, rows kRows..
// x columns 32-63 those over k-block 2p + 1; the rest mixes k-blocks and is
// never read. A stage is 8 wgmmas (two pairs x four k16 steps) into two
// accumulator sets, one group, its slots freed as in RunWgmmaJob (the same
// loop, written out: through a shared helper taking the stage's wgmmas as a
// lambda, the 24-token chain took 107.0-107.1 us against 106.3-106.6,
// bench/NOTES.md v1.24). Then the threads that hold the second k-block's
// sums hand them, through shared memory, to those that hold the first's for
// the same token, which add them
// (in a fixed order: the result does not depend on timing) and so hold the
// tile in RunWgmmaJob's layout, rows 0..kRows-1: the same epilogue stores it
// (it skips rows past M).
// NOTE: half as many wgmmas as RunWgmmaJob's m64n32k16 (which this replaced
// at 17-32 rows), each twice as wide: the MLP block at 24 / 32 tokens took
// 105.6-106.1 / 108.8-109.1 us against 111.7-112.0 / 115.2-115.5, the
// 8-layer chain 107.4-107.7 / 108.9-109.5 against 112.0-112.4 /
// 112.8-113.7. Four accumulator sets instead of two, or 32-row tiles at
// 17-24 rows, were no faster. The operands the other way round (weights as
// the 64 rows, the tokens of both k-blocks as N = 2 * rows) took 114.5 /
// 124.3 at 24 / 32 tokens, and at 48 / 64 tokens (N = 96 / 128) 149 / 167
// against 117 / 119 (bench/NOTES.md v1.24).
template <int kRows, int kConsumers, ElementType kHalf>
__device__ void RunPairedWgmmaJob(const NarrowContext& ctx, const CtaWork& work, int index, bool leader, int warp,
                                  int lane, ConsumerRings& rings) {
  constexpr int kPairChains = 2;
  constexpr int kHandoffPitch = NarrowConfig::kBlockN + 1;  // floats a token row, padded against bank conflicts
  static_assert(NarrowConfig::kKBlocksPerStage == 4 && NarrowConfig::kBlockN == 32, "two pairs of k-blocks a stage");
  static_assert(kRows % 8 == 0 && 2 * kRows <= 64, "both k-blocks' tokens in the 64 rows");
  static_assert(kRows * kHandoffPitch * 4 <= NarrowConfig::kPartialsBytes, "the handoff fits the partials");
  const uint32_t a_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.a_ring));
  const uint32_t b_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.b_ring));
  const uint32_t a_tile_bytes = NarrowConfig::ATileBytes(kRows);
  const int k_blocks = work.job->k_block_end - work.job->k_block_begin;
  NarrowEpilogue<kHalf> epilogue(work, ctx.tile().m, warp, lane);
  float chains[kPairChains][32] = {};
  RingCursor a_release = rings.a, b_release = rings.b;
  bool pending = false;
  for (int kb0 = 0; kb0 < k_blocks; kb0 += NarrowConfig::kKBlocksPerStage) {
    WaitForStage(ctx, rings, index, kb0 == 0, leader, epilogue);
    const uint32_t a_stage = a_base + rings.a.stage * ctx.params.a_stage_bytes;
    const uint32_t b_stage = b_base + rings.b.stage * NarrowConfig::kBStageBytes;
    ptx::wgmma_fence();
#pragma unroll
    for (int k16 = 0; k16 < NarrowConfig::kBlockK / 16; ++k16) {
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        const uint32_t tokens = Swizzle128DescriptorLow(a_stage + 2 * pair * a_tile_bytes);
        const uint32_t weights = Swizzle128DescriptorLow(b_stage + 2 * pair * NarrowConfig::kBTileBytes);
        wgmma_m64n64k16_ss<kHalf>(chains[pair], AdvanceDescriptorLowK16(tokens, k16),
                                AdvanceDescriptorLowK16(weights, k16));
      }
    }
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<1>();
    if (pending) ReleaseSlots<false>(ctx, lane == 0, a_release, b_release);
    pending = true;
    rings.a.Advance(ctx.params.a_stages);
    rings.b.Advance(ctx.params.b_stages);
  }
  PassTurn<kConsumers>(ctx, rings, lane);
  ptx::wgmma_wait_group<0>();
  if (pending) ReleaseSlots<false>(ctx, lane == 0, a_release, b_release);
  // Register 4c + 2h + e holds row 16 * warp + lane / 4 + 8h, column 8c + 2 *
  // (lane % 4) + e (wgmma.cuh); every index below is a constant (a run-time
  // one would put the accumulators in local memory), only the stores and
  // loads are predicated on the row.
  float* handoff = reinterpret_cast<float*>(rings.partials(ctx));
  // The first barrier: the previous job's partials have all been read.
  ptx::barrier_at<128>(rings.barrier());
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = 16 * warp + lane / 4 + 8 * h;
    if (row < kRows || row >= 2 * kRows) continue;
#pragma unroll
    for (int c = 4; c < 8; ++c) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 4 * c + 2 * h + e;
        handoff[(row - kRows) * kHandoffPitch + 8 * (c - 4) + 2 * (lane % 4) + e] = chains[0][r] + chains[1][r];
      }
    }
  }
  ptx::barrier_at<128>(rings.barrier());
  float acc[16];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = 16 * warp + lane / 4 + 8 * h;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 4 * c + 2 * h + e;
        acc[r] = chains[0][r] + chains[1][r];
        if (row < kRows) acc[r] += handoff[row * kHandoffPitch + 8 * c + 2 * (lane % 4) + e];
      }
    }
  }
  RecordTrace(ctx, index, leader, &DeviceJobTrace::mma_done);
  epilogue.Store(acc);
}

// A pair split's two 32-column epilogues (NarrowEpilogue), of the 64-column
// tile's left and right halves: WaitForStage's prefetch, only in the
// second half of K, the job that stores the tile.
template <ElementType kHalf>
struct PairEpilogue {
  NarrowEpilogue<kHalf> left, right;
  bool stores;
  __device__ void Prefetch() {
    if (!stores) return;
    left.Prefetch();
    right.Prefetch();
  }
};

// How the split job of kernel instantiation kKind (kPairSplit,
// kTallPairSplit or kWideSplit) is shaped and who multiplies it
// (RunPairSplitJob): the pair split's a 64 x 64 tile over half of K, one
// warpgroup's (33-64 rows, the two consumers in turns); the tall pair
// split's 128 x 64 over half of K, warpgroup w rows 64 w onwards (65-128
// rows); the wide split's 64 x 128 over a quarter of K, warpgroup w columns
// 64 w onwards (33-64 rows). The last two: both warpgroups on every job
// (NarrowConfig::BothWarpgroupsOnEveryJob), no turns.
template <NarrowConfig::Instantiation kKind>
struct SplitShape {
  static constexpr NarrowConfig::Split kSplit = NarrowConfig::SplitOf(kKind);
  static_assert(kSplit != NarrowConfig::Split::kNone, "a split job's instantiation");
  static constexpr bool kTall = kKind == NarrowConfig::Instantiation::kTallPairSplit;
  static constexpr bool kWide = kSplit == NarrowConfig::Split::kWide;
  static constexpr bool kBothWarpgroups = NarrowConfig::BothWarpgroupsOnEveryJob(kKind);
  static constexpr int kTileN = NarrowConfig::TileN(kSplit);
  static constexpr int kSplits = NarrowConfig::Splits(kSplit);
  // Threads holding the tile's accumulators: one warpgroup's, or both's.
  static constexpr int kTileThreads = kBothWarpgroups ? 256 : 128;
};

// The fp32 partial sums of one split of a split job's tile (RunPairSplitJob)
// in the plan's workspace, in the accumulator layout, kThreads (128, or 256
// with both warpgroups on the tile) accumulator threads a tile, 32 floats
// each (16 KiB, 32 KiB): float4 q of thread t at [q][t] (each store and
// load of a warp's 32 threads one contiguous 512-byte run). The node's
// workspace holds kSplits - 1 such blocks per tile (sched::PartialSlices:
// every split's but the last, which sums them), tile by tile, split by
// split within a tile (the tile's tile.m x tile.n floats each).
inline constexpr int kPairPartialFloat4s = 8;  // 32 accumulators a thread
template <int kThreads, int kSplits>
__device__ __forceinline__ float4* SplitPartialOf(const NarrowContext& ctx, const CtaWork& work, int split) {
  const sched::NodeSchedule& schedule = work.node->schedule;
  const int64_t tile = int64_t{work.m_block} * schedule.n_blocks + work.n_block;
  return reinterpret_cast<float4*>(ctx.params.workspace + schedule.workspace_offset) +
         (tile * (kSplits - 1) + split) * kPairPartialFloat4s * kThreads;
}

// A split job (NarrowConfig::Split::kPair or kWide; SplitShape<kKind> says
// which tile): its tile over its part of K (job.split 0 the first), wgmma
// m64n64k16 with both operands from shared memory, A as in RunWgmmaJob, B's
// 64 rows of a k-block (of the warpgroup's half of the tile, wide) one
// 8 KiB run. A stage is 16 wgmmas into two accumulator sets (as
// RunPairedWgmmaJob's: with four, 128 accumulator registers), one group,
// its slots freed as in RunWgmmaJob (the loop written out again, as
// RunPairedWgmmaJob's is, and for its reason). Then:
//   every split but the last: its sums to the workspace (SplitPartialOf),
//     plain stores, handed to the publisher as a tile is, which releases
//     the split's partial flag (sched::PartialFlagIndex);
//   the last split: its leader waits for the others' flags (acquire;
//     bounded by the watchdog, after which the launch's outputs are
//     unspecified), the warpgroup meets, each thread adds the others' sums
//     to its own, split 0's first (a fixed order: the same bits every
//     run), drops the lines it read from L2 unwritten
//     (DiscardWarpPartials' reason: dirty scratch written back while the
//     next launch streams), and stores its 32-column parts of the tile
//     through the fused epilogue;
//   a whole tile (the last split's index from k-block 0, all of K:
//     sched::WholeTileOfSplitNode, SchedulerOptions::whole_leading_tiles):
//     the epilogue at once, as an unsplit job's.
// Deadlock-free: every other split is earlier in the queue than the last,
// and waits for nothing after its main loop.
// Shape::kTall (NarrowConfig::TallPairSplit, 65-128 rows): the tile is 128 x 64 and
// both warpgroups run every job, this one (rings.warpgroup) on rows 64 w
// onwards: its A descriptors start that many rows into each k-block's tile
// (the rows past the plan's read what follows, as in RunWgmmaJob), its
// epilogue's rows too. Shape::kWide: the tile is 64 x 128, this warpgroup on
// columns 64 w onwards: its B descriptors start that many rows into each
// k-block's 16 KiB of B, its epilogue's columns too. With both warpgroups,
// the partial sums are threads 128 w onwards of the tile's 256, each
// warpgroup's first thread waits for the flags itself (the acquire its own
// threads' loads need), `leader` (warpgroup 0's) alone records the trace,
// and a stage's slots are freed before the next stage is waited for, not
// once its wgmmas are issued (the loop's first lines).
template <int kConsumers, ElementType kHalf, NarrowConfig::Instantiation kKind>
__device__ void RunPairSplitJob(const NarrowContext& ctx, const CtaWork& work, int index, bool leader, int warp,
                                int lane, ConsumerRings& rings) {
  using Shape = SplitShape<kKind>;
  constexpr int kTileN = Shape::kTileN;
  constexpr int kSplits = Shape::kSplits;
  constexpr int kTileThreads = Shape::kTileThreads;
  constexpr uint32_t kBKBlockBytes = kTileN * NarrowConfig::kBlockK * 2;
  static_assert(!Shape::kBothWarpgroups || kConsumers == 2, "the tile's halves are the two warpgroups'");
  // This warpgroup's first row of the tile, and its first A row's bytes into
  // a k-block's tile; its first column, and its first B row's bytes.
  const int row_offset = Shape::kTall ? NarrowConfig::kBlockM * rings.warpgroup : 0;
  const int column_part = Shape::kWide ? 2 * rings.warpgroup : 0;  // in 32-column parts
  const uint32_t a_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.a_ring)) +
                          static_cast<uint32_t>(row_offset) * NarrowConfig::kBlockK * 2;
  const uint32_t b_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.b_ring)) +
                          static_cast<uint32_t>(column_part * NarrowConfig::kBlockN) * NarrowConfig::kBlockK * 2;
  const int k_blocks = work.job->k_block_end - work.job->k_block_begin;
  const bool last = work.job->split == kSplits - 1;
  // Whether it adds the other splits' partials: the last split, unless it
  // covers all of K (the whole tile: sched::WholeTileOfSplitNode, which asks
  // whether it starts at k-block 0, the same for a last split; asked so,
  // ptxas spills nothing more in the two-consumer kernels).
  const bool sums = last && k_blocks != work.node->schedule.k_blocks;
  // The epilogue's rows are 16 * warp onwards: warps 4-7 are warpgroup 1's.
  const int row_warp = warp + row_offset / 16;
  PairEpilogue<kHalf> epilogue{NarrowEpilogue<kHalf>(work, ctx.tile().m, row_warp, lane, kTileN, column_part),
                               NarrowEpilogue<kHalf>(work, ctx.tile().m, row_warp, lane, kTileN, column_part + 1),
                               last};
  float chains[2][32] = {};
  RingCursor a_release = rings.a, b_release = rings.b;
  bool pending = false;
  const uint32_t a_tile_bytes = ctx.params.a_stage_bytes / NarrowConfig::kKBlocksPerStage;
  for (int kb0 = 0; kb0 < k_blocks; kb0 += NarrowConfig::kKBlocksPerStage) {
    if constexpr (Shape::kBothWarpgroups) {
      // Two stages of the larger operand (A's 64 KiB at 128 rows, B's 64
      // KiB with 128 columns): freed only once the next stage's wgmmas were
      // issued, as below, a slot would wait for that stage to land, and the
      // loader would have one stage in flight (at 128 tokens on H100s the
      // MLP block took ~17 us longer than main so, ~2 us freed here;
      // bench/NOTES.md v2.03). So the warpgroup waits for its last group and
      // frees that stage's slots before it waits for the next: the other
      // warpgroup's wgmmas fill the tensor pipes meanwhile. The same at
      // every stage, so that the warpgroup's wgmma.wait_group is uniform (a
      // wait chosen by a poll's outcome would not be).
      if (pending) {
        ptx::wgmma_wait_group<0>();
        ReleaseSlots<false>(ctx, lane == 0, a_release, b_release);
        pending = false;
      }
    }
    WaitForStage(ctx, rings, index, kb0 == 0, leader, epilogue);
    const uint32_t a_stage = a_base + rings.a.stage * ctx.params.a_stage_bytes;
    const uint32_t b_stage = b_base + rings.b.stage * NarrowConfig::BStageBytes(kTileN);
    ptx::wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < NarrowConfig::kKBlocksPerStage; ++kb) {
      const uint32_t desc_a = Swizzle128DescriptorLow(a_stage + kb * a_tile_bytes);
      const uint32_t desc_b = Swizzle128DescriptorLow(b_stage + kb * kBKBlockBytes);
#pragma unroll
      for (int k16 = 0; k16 < NarrowConfig::kBlockK / 16; ++k16) {
        wgmma_m64n64k16_ss<kHalf>(chains[k16 % 2], AdvanceDescriptorLowK16(desc_a, k16),
                                AdvanceDescriptorLowK16(desc_b, k16));
      }
    }
    ptx::wgmma_commit_group();
    if constexpr (!Shape::kBothWarpgroups) {
      ptx::wgmma_wait_group<1>();
      if (pending) ReleaseSlots<false>(ctx, lane == 0, a_release, b_release);
    }
    pending = true;
    rings.a.Advance(ctx.params.a_stages);
    rings.b.Advance(ctx.params.b_stages);
  }
  if constexpr (!Shape::kBothWarpgroups) PassTurn<kConsumers>(ctx, rings, lane);
  ptx::wgmma_wait_group<0>();
  if (pending) ReleaseSlots<false>(ctx, lane == 0, a_release, b_release);
  float acc[32];
#pragma unroll
  for (int r = 0; r < 32; ++r) acc[r] = chains[0][r] + chains[1][r];
  // This thread's float4s of split 0's partial; split s's are s blocks on.
  float4* const partials = SplitPartialOf<kTileThreads, kSplits>(ctx, work, 0) + (threadIdx.x - 128) % kTileThreads;
  constexpr int kPartialFloat4s = kPairPartialFloat4s * kTileThreads;
  if (!last) {
    // (With two splits the one that stores is split 0: a constant, where
    // the job's split read again kept a register more and the pair split's
    // two-consumer kernel spilled 28 bytes.)
    float4* partial = partials + (kSplits == 2 ? 0 : work.job->split) * kPartialFloat4s;
#pragma unroll
    for (int q = 0; q < kPairPartialFloat4s; ++q) {
      partial[q * kTileThreads] = make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
    }
    RecordTrace(ctx, index, leader, &DeviceJobTrace::mma_done);
    return;
  }
  if (sums) {
    if (threadIdx.x % 128 == 0) {
      for (int split = 0; split < kSplits - 1; ++split) {
        WaitForFlag(ctx, sched::PartialFlagIndex(work.node->schedule, work.m_block, work.n_block, split), index);
      }
    }
    ptx::barrier_at<128>(rings.barrier());  // the first thread's acquire, for every thread's loads below
    // Its own sums, then split 0's, split 1's, ... added in that order (in
    // place: a second array of 32 sums beside acc and the epilogue's
    // prefetched values made the wide split's kernel spill).
#pragma unroll
    for (int split = 0; split < kSplits - 1; ++split) {
      const float4* partial = partials + split * kPartialFloat4s;
#pragma unroll
      for (int q = 0; q < kPairPartialFloat4s; ++q) {
        const uint4 bits = ptx::ld_relaxed_gpu_v4(reinterpret_cast<const uint32_t*>(partial + q * kTileThreads));
        acc[4 * q] += __uint_as_float(bits.x);
        acc[4 * q + 1] += __uint_as_float(bits.y);
        acc[4 * q + 2] += __uint_as_float(bits.z);
        acc[4 * q + 3] += __uint_as_float(bits.w);
      }
      // The warp's lanes read float4s [q][32 warp, + 32) for every q: 32
      // lines of 128 bytes, lane l's line l % 4 of q = l / 4. Every load is
      // consumed above, so done, before the warp meets.
      __syncwarp();
      ptx::discard_global_l2(partial - lane + (lane / 4) * kTileThreads + (lane % 4) * 8);
    }
  }
  RecordTrace(ctx, index, leader, &DeviceJobTrace::mma_done);
  epilogue.left.Store(*reinterpret_cast<const float(*)[16]>(&acc[0]));
  epilogue.right.Store(*reinterpret_cast<const float(*)[16]>(&acc[16]));
}

// The same for a job of at most 16 rows, on mma.sync m16n8k16 with the
// operands swapped: the weights (the job's 32 columns of B, two 16-row
// blocks) are the 16-row operand, the tokens (one or two blocks of 8 rows of
// A) the 8-column one, so no instruction spends work on rows past M.
// Warp w multiplies k-block w of every stage, for every (weight block, token
// block) pair, one accumulator set per pair and k16 step (independent
// chains). Then the four warps' partial tiles meet in shared memory, and
// warp w sums pair w (weight block w % 2, token block w / 2) over the warps,
// in warp order (the result does not depend on timing), for its epilogue.
// Traced (bench/NOTES.md v1.17): with each warp on one pair over all of a
// stage's k-blocks, four mma.sync in a row into each chain, a one-token
// chain layer's main loop (64 k-blocks) took ~6.2 us; split by k-block,
// ~5 us.
// kTagged: the tagged handoff's instantiation (SwappedEpilogue).
template <int kTokenBlocks, int kConsumers, bool kTagged, ElementType kHalf>
__device__ void RunMmaSyncJob(const NarrowContext& ctx, const CtaWork& work, int index, bool leader, int warp,
                              int lane, ConsumerRings& rings) {
  const uint32_t a_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.a_ring));
  const uint32_t b_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.b_ring));
  const int k_blocks = work.job->k_block_end - work.job->k_block_begin;
  static_assert(NarrowConfig::kKBlocksPerStage == 4, "one k-block of each stage per consumer warp");
  const int weight_block = warp % 2, token_block = warp / 2;  // this warp's pair, for the epilogue
  const bool active = token_block < kTokenBlocks;
  SwappedEpilogue<kTagged, kHalf> epilogue(work, ctx.tile().m, weight_block, token_block, active, lane);
  const uint32_t a_tile_bytes = ctx.params.a_stage_bytes / NarrowConfig::kKBlocksPerStage;
  float chains[kTokenBlocks][2][4][4] = {};  // [token block][weight block][k16 step][register]
  for (int kb0 = 0; kb0 < k_blocks; kb0 += NarrowConfig::kKBlocksPerStage) {
    WaitForStage(ctx, rings, index, kb0 == 0, leader, epilogue);
    const uint32_t a_tile = a_base + rings.a.stage * ctx.params.a_stage_bytes + warp * a_tile_bytes;
    const uint32_t b_tile = b_base + rings.b.stage * NarrowConfig::kBStageBytes + warp * NarrowConfig::kBTileBytes;
    uint32_t tokens[kTokenBlocks][2][4];  // 16-byte chunks 0-3 and 4-7 of the token row (k 0-31, 32-63)
#pragma unroll
    for (int tb = 0; tb < kTokenBlocks; ++tb) {
      const int token_row = 8 * tb + (lane & 7);
      ptx::ldmatrix_x4(a_tile + SwizzledPanelOffset(token_row, 16 * ((lane >> 3) + 0)), tokens[tb][0]);
      ptx::ldmatrix_x4(a_tile + SwizzledPanelOffset(token_row, 16 * ((lane >> 3) + 4)), tokens[tb][1]);
    }
#pragma unroll
    for (int wb = 0; wb < 2; ++wb) {
      const int weight_row = 16 * wb + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
      for (int k16 = 0; k16 < 4; ++k16) {
        uint32_t weights[4];
        ptx::ldmatrix_x4(b_tile + SwizzledPanelOffset(weight_row, 16 * (2 * k16 + (lane >> 4))), weights);
#pragma unroll
        for (int tb = 0; tb < kTokenBlocks; ++tb) {
          ptx::mma_m16n8k16<kHalf>(chains[tb][wb][k16], weights, tokens[tb][k16 / 2][2 * (k16 % 2)],
                                 tokens[tb][k16 / 2][2 * (k16 % 2) + 1]);
        }
      }
    }
    // The stage's reads are done (ldmatrix is synchronous): free its slots.
    // With the tagged handoff, whose A loader refills the A slot with
    // generic stores, each lane releases its own reads of A. B (and A
    // without it) is released by lane 0 alone, so the warp meets first:
    // every lane's ldmatrix reads are then ordered before lane 0's arrival
    // (bar.warp.sync orders memory among the warp's lanes), hence before the
    // loader's next copy into the slot. NOTE: ptxas compiles this meeting of
    // a converged warp to no instruction (the warp's ldmatrix is one
    // instruction, its reads done before the arrival the warp issues after
    // it), and compute-sanitizer racecheck, which sees each lane's reads
    // and lane 0's arrival only, still reports the B loader's next bulk
    // copy into the slot as racing lanes 1-31's reads wherever a slot is
    // refilled (a job's K past the B ring, or a CTA's later jobs): a tool
    // limitation, bench/NOTES.md v1.89. Every lane arriving (as on A above)
    // quiets it, but changed ptxas's allocation of the two-consumer default
    // kernels: a thread-index re-read in each m64n32k16 stage's release,
    // ~2% slower a SM at 48-64 rows (v1.90; reverted).
    __syncwarp();
    ReleaseSlots<kTagged>(ctx, lane == 0, rings.a, rings.b);
  }
  PassTurn<kConsumers>(ctx, rings, lane);
  // The first barrier: the previous job's partials have all been read.
  ptx::barrier_at<128>(rings.barrier());
#pragma unroll
  for (int tb = 0; tb < kTokenBlocks; ++tb) {
#pragma unroll
    for (int wb = 0; wb < 2; ++wb) {
      float4 sum;
      const float(&c)[4][4] = chains[tb][wb];
      sum.x = (c[0][0] + c[1][0]) + (c[2][0] + c[3][0]);
      sum.y = (c[0][1] + c[1][1]) + (c[2][1] + c[3][1]);
      sum.z = (c[0][2] + c[1][2]) + (c[2][2] + c[3][2]);
      sum.w = (c[0][3] + c[1][3]) + (c[2][3] + c[3][3]);
      rings.partials(ctx)[(warp * 4 + 2 * tb + wb) * 32 + lane] = sum;
    }
  }
  ptx::barrier_at<128>(rings.barrier());
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (active) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float4 part = rings.partials(ctx)[(w * 4 + 2 * token_block + weight_block) * 32 + lane];
      acc[0] += part.x;
      acc[1] += part.y;
      acc[2] += part.z;
      acc[3] += part.w;
    }
  }
  RecordTrace(ctx, index, leader, &DeviceJobTrace::mma_done);
  epilogue.Store(acc, ctx.epoch);
}

// A job's stages waited for and freed without a multiply, after recording a
// failure for the launch (WaitKind::kNoKernelPath: no wait timed out): for a
// job the kernel has no path for (ConsumeJobs). Every lane frees A (the
// tagged handoff's kEveryLaneOnA).
template <int kConsumers>
__device__ void PassOverJob(const NarrowContext& ctx, const CtaWork& work, int index, int lane,
                            ConsumerRings& rings) {
  if (threadIdx.x % 128 == 0) ctx.watchdog.Report(WaitKind::kNoKernelPath, index, -1, 0, 0);
  const int stages = NarrowConfig::StagesOf(work.job->k_block_end - work.job->k_block_begin);
  for (int s = 0; s < stages; ++s) {
    WaitPhase(&ctx.barriers->a_full[rings.a.stage], rings.a.phase);
    WaitPhase(&ctx.barriers->b_full[rings.b.stage], rings.b.phase);
    __syncwarp();
    ReleaseSlots<true>(ctx, lane == 0, rings.a, rings.b);
  }
  PassTurn<kConsumers>(ctx, rings, lane);
}

// A consumer warpgroup, every other job of the CTA (`warpgroup` 0 the first,
// third, ...; 1 the second, fourth, ...): the main loop over the whole K and
// the epilogue into C, then each warp hands its part of the tile to the
// publisher. The jobs of the other warpgroup it reads too, and moves its
// ring and handoff cursors past them: both rings and the handoffs hold the
// CTA's jobs in queue order. So while one warpgroup runs a job's epilogue,
// the other multiplies the next job's stages as they land.
// After a time-out it goes on as usual (its rings drain: the top of the
// file) until the job stream ends.
// kPath: kPaired24 or kPaired32, RunPairedWgmmaJob for A tiles of that many
// rows; kSplit, RunPairSplitJob in kKind's form (without turns where both
// warpgroups run every job: NarrowConfig::BothWarpgroupsOnEveryJob);
// kByRows, the others by the plan's rows (RunMmaSyncJob up to 16,
// RunWgmmaJob past 32; kKind kTaggedHandoff: with the tagged handoff).
// NOTE: the paired jobs chosen per job beside the others in one loop, ptxas
// spilled (255 registers, 24 bytes) and the MLP block at 24 / 32 tokens took
// 111.2-111.9 / 111.6-111.7 us against 106.7-107.7 / 109.2-110.0 with a
// loop of their own (bench/NOTES.md v1.24).
enum class ConsumerPath : uint8_t { kByRows, kPaired24, kPaired32, kSplit };
template <ConsumerPath kPath, NarrowConfig::Instantiation kKind, int kConsumers, ElementType kHalf>
__device__ void ConsumeJobs(const NarrowContext& ctx, int warpgroup, int warp, int lane, bool leader) {
  static_assert(kConsumers == 1 || kConsumers == 2, "the turn passes to the other warpgroup");
  constexpr bool kTurns = kConsumers > 1 && !NarrowConfig::BothWarpgroupsOnEveryJob(kKind);
  constexpr bool kTagged = kKind == NarrowConfig::Instantiation::kTaggedHandoff;
  const uint32_t tile_rows = NarrowConfig::ATileRows(ctx.params.a_stage_bytes);
  JobStream jobs;
  ConsumerRings rings{warpgroup};
  RingCursor handoff;
  for (int ordinal = 0;; ++ordinal) {
    const int index = jobs.Next(ctx);
    if (index < 0) return;
    if (kTurns && ordinal % kConsumers != warpgroup) {
      const sched::TileJob& job = ctx.params.queue[index];
      const int stages = NarrowConfig::StagesOf(job.k_block_end - job.k_block_begin);
      rings.a.Skip(stages, ctx.params.a_stages);
      rings.b.Skip(stages, ctx.params.b_stages);
      handoff.Advance(NarrowConfig::kJobSlots);
      continue;
    }
    // A ring barrier's wait by parity tells its current phase only from the
    // one before: so the stages of this job are waited for only once the
    // other warpgroup has waited for its last job's (every job before this
    // one was its, or this warpgroup's own).
    if (kTurns && ordinal > 0) {
      WaitPhase(rings.turn(ctx), rings.turn_phase);
      rings.turn_phase ^= 1;
    }
    StartTrace(ctx, index, leader);
    const CtaWork work = ResolveJob(ctx, index);
    if constexpr (kPath == ConsumerPath::kSplit) {
      RunPairSplitJob<kConsumers, kHalf, kKind>(ctx, work, index, leader, warp, lane, rings);
    } else if constexpr (kPath == ConsumerPath::kByRows) {
      if (tile_rows <= 8) {
        RunMmaSyncJob<1, kConsumers, kTagged, kHalf>(ctx, work, index, leader, warp, lane, rings);
      } else if (tile_rows <= NarrowConfig::kMmaSyncRows) {
        RunMmaSyncJob<2, kConsumers, kTagged, kHalf>(ctx, work, index, leader, warp, lane, rings);
      } else if constexpr (kTagged) {
        // Not reached: a plan with tagged handoffs multiplies on mma.sync
        // (plan_resources.cc, TaggedHandoffsOf). Rather than compile in a path it
        // never runs, the launch fails and the job's stages drain.
        PassOverJob<kConsumers>(ctx, work, index, lane, rings);
      } else {
        RunWgmmaJob<kConsumers, kHalf>(ctx, work, index, leader, warp, lane, rings);
      }
    } else {
      RunPairedWgmmaJob<kPath == ConsumerPath::kPaired24 ? 24 : 32, kConsumers, kHalf>(ctx, work, index, leader, warp,
                                                                                    lane, rings);
    }
    __syncwarp();  // the lanes' stores to C, before lane 0's arrival
    if (lane == 0) {
      WaitPhase(&ctx.barriers->publish_empty[handoff.stage], handoff.phase ^ 1);
      cuda::ptx::mbarrier_arrive(&ctx.barriers->publish_full[handoff.stage]);
    }
    __syncwarp();  // converged again: JobStream::Next reads the slot once a warp
    handoff.Advance(NarrowConfig::kJobSlots);
    RecordTrace(ctx, index, leader, &DeviceJobTrace::staged);
  }
}

// The consumers of the kernel instantiation kKind (NarrowConfig::
// Instantiation). Where both warpgroups run every job
// (NarrowConfig::BothWarpgroupsOnEveryJob), the first's first thread records
// its trace.
template <NarrowConfig::Instantiation kKind, int kConsumers, ElementType kHalf>
__device__ void RunNarrowConsumer(const NarrowContext& ctx) {
  const int lane = threadIdx.x % 32;
  const int warp = (threadIdx.x / 32) % 4;
  const int warpgroup = threadIdx.x / 128 - 1;
  // Writes its jobs' traces (the publisher releases the flag).
  const bool leader = NarrowConfig::BothWarpgroupsOnEveryJob(kKind) ? threadIdx.x == 128 : threadIdx.x % 128 == 0;
  if constexpr (NarrowConfig::SplitOf(kKind) != NarrowConfig::Split::kNone) {
    ConsumeJobs<ConsumerPath::kSplit, kKind, kConsumers, kHalf>(ctx, warpgroup, warp, lane, leader);
  } else if constexpr (kKind == NarrowConfig::Instantiation::kPaired) {
    if (NarrowConfig::ATileRows(ctx.params.a_stage_bytes) <= 24) {
      ConsumeJobs<ConsumerPath::kPaired24, kKind, kConsumers, kHalf>(ctx, warpgroup, warp, lane, leader);
    } else {
      ConsumeJobs<ConsumerPath::kPaired32, kKind, kConsumers, kHalf>(ctx, warpgroup, warp, lane, leader);
    }
  } else {
    ConsumeJobs<ConsumerPath::kByRows, kKind, kConsumers, kHalf>(ctx, warpgroup, warp, lane, leader);
  }
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_NARROW_CONSUMER_ROLE_CUH_
