// narrow_config.h: the compile-time shape of loom's narrow decode kernel
// (narrow_gemm.cu) and its shared-memory layout. Host and device code both
// include it, as with kernel_config.h for the tiled kernel.
//
// Why a second kernel: at decode sizes (every node of the plan has at most 64
// rows; up to 128 in two row blocks, kMaxRows) the tiled kernel's 256-column
// tiles leave too few tiles to occupy the SMs, so it splits K, and a split-K
// layer is a chain of round trips through L2 (partials, their flags, the
// reduce job, its flag). The narrow kernel gives each CTA a 32-column tile
// over the whole of K instead: 128 tiles for a 4096-wide layer, no partials
// and no reduce, the tile published once, and a deep ring of small B stages
// that holds most of a job's weights before its A (the previous layer's
// output) exists.
#ifndef LOOM_OPS_KERNEL_NARROW_CONFIG_H_
#define LOOM_OPS_KERNEL_NARROW_CONFIG_H_

#include <cstdint>

#include "kernel_config.h"
#include "packed_layout.h"
#include "loom/scheduler/schedule.h"

namespace loom::kernel {

struct NarrowConfig {
  // CTA tile: 64 rows (every row of a plan of at most 64; BlockRows past
  // that) x 32 accumulator columns (16 FP32 registers a thread in the wgmma
  // layout, wgmma.cuh), whole K, multiplied by one consumer warpgroup.
  static constexpr int kBlockM = 64;
  // A plan of 65 to kMaxRows rows runs in two row blocks of BlockRows rows
  // each (its A tiles: the wgmma path, RunWgmmaJob), so that each job's A
  // tiles hold its rows and few more: in two 64-row blocks, a 65-row plan's
  // second block loaded one row and 63 of TMA zero fill, and the 8-layer
  // 4096 chain at 65 rows took 274 us against 174 at 128; in 40-row blocks,
  // 170 (bench/NOTES.md v1.33). Each 32-column tile of B is read by two
  // jobs, next to each other in the queue.
  static constexpr int kMaxRows = 2 * kBlockM;
  static constexpr int32_t BlockRows(int64_t rows) {
    return rows <= kBlockM ? kBlockM : static_cast<int32_t>(((rows + 1) / 2 + 7) / 8 * 8);
  }
  // The rows of a plan's A tiles (before ATileBytes rounds them to 8): its
  // rows up to 64, one row block's past that.
  // With the pair split past 64 rows (TallPairSplit), one row block of all of them.
  static constexpr int64_t TileRows(int64_t rows, bool pair_split = false) {
    return rows <= kBlockM || pair_split ? rows : BlockRows(rows);
  }
  static constexpr int kBlockN = 32;
  static constexpr int kBlockK = 64;  // one 128-byte swizzle row, as in KernelConfig
  // The pair split (CompileOptions::narrow_pair_split; 33-64 rows): each
  // job a 64 x 64 tile (wgmma m64n64k16, Instantiation::kPairSplit) over
  // half of K, its two halves two jobs (the scheduler's split-K with the
  // last split summing: the queue may put them waves apart, the first
  // always earlier), the second adding the first's partial sums
  // (RunPairSplitJob). Per weight
  // byte a CTA takes in one byte of A instead of two, as a 32-column tile
  // over the whole of K does, and a node keeps as many jobs.
  // Past 64 rows (65-128, TallPairSplit; Instantiation::kTallPairSplit)
  // the plan is one row block and a job's tile 128 x 64, multiplied by both
  // consumer warpgroups at once, warpgroup w rows 64 w onwards, from the
  // same B stages (RunPairSplitJob's kTall): per weight byte the CTA still
  // takes in two bytes of A, where the default past 64 rows (two row
  // blocks, each job a 32-column tile over the whole of K) reads each weight
  // tile twice and four bytes of A a weight byte (bench/NOTES.md v1.33).
  static constexpr int kPairSplitBlockN = 64;
  static constexpr int kPairSplits = 2;
  static constexpr bool TallPairSplit(int64_t rows) { return rows > kBlockM; }
  // The wide split (CompileOptions::narrow_wide_split; 33-64 rows, two
  // consumer warpgroups): each job a 64 x 128 tile over a quarter of K,
  // multiplied by both consumer warpgroups at once, warpgroup w columns
  // 64 w onwards (wgmma m64n64k16 each, B's rows 64 w onwards of the same
  // stages; RunPairSplitJob's kWide), the last quarter adding the other
  // three's partial sums. Per weight byte a CTA takes in half a byte of A
  // (the pair split one, the whole-K 32-column tile two), and a node keeps
  // as many jobs as with 32-column tiles over the whole of K.
  static constexpr int kWideSplitBlockN = 128;
  static constexpr int kWideSplits = 4;
  // How a plan's jobs divide K: not at all (kBlockN-column tiles over the
  // whole of K), the pair split (its halves) or the wide split (its
  // quarters).
  enum class Split : uint8_t { kNone, kPair, kWide };
  // A plan's tile width, and the jobs each tile's K is divided among.
  LOOM_HOST_DEVICE static constexpr int TileN(Split split) {
    return split == Split::kWide ? kWideSplitBlockN : (split == Split::kPair ? kPairSplitBlockN : kBlockN);
  }
  LOOM_HOST_DEVICE static constexpr int Splits(Split split) {
    return split == Split::kWide ? kWideSplits : (split == Split::kPair ? kPairSplits : 1);
  }
  // One consumer warpgroup, or two taking the CTA's jobs in turn
  // (narrow_consumer_role.cuh, ConsumeJobs): one runs a job's epilogue while
  // the other multiplies the next job's stages. Two pay where a CTA runs many jobs of
  // 17-64 rows (the MLP block, whose gate/up is seven waves, at 32 / 64
  // tokens 89.3-89.7 / 105.3-105.4 us against 95.1-95.5 / 110.4), not on
  // the mma.sync path (16 tokens 84.2-84.4 against 81.5-81.9) nor in a chain
  // of one-wave layers (64 tokens 112.6-112.7 against 109.2-109.7)
  // (bench/NOTES.md v1.29):
  // CompileOptions::narrow_consumers. A kernel instantiation each.
  static constexpr int kMaxConsumerWarpgroups = 2;
  static constexpr int Threads(int consumers) { return 128 * (1 + consumers); }  // producer warpgroup + consumers
  // Register split with two consumers (setmaxnreg), as in KernelConfig:
  // __launch_bounds__(384, 1) gives 168 a thread, and the producer
  // warpgroup gives some of its registers to the consumers. ptxas -v: with
  // 168 each the unpaired instantiations spilled 84 bytes; 120 / 192 spilled
  // 8 bytes in them (104 / 200, 112 / 192 and 96 / 200 as much or more), and
  // none since their wgmma descriptors are built from 32-bit low words
  // (wgmma.cuh; bench/NOTES.md v1.31). (One consumer: 256 threads, 255
  // registers a thread, no split.)
  static constexpr int kLaunchRegisters = (65536 / (128 * 3)) / 8 * 8;  // 168
  static constexpr int kProducerRegisters = 120;
  static constexpr int kConsumerRegisters = 192;
  // setmaxnreg.inc blocks forever when the registers are not there.
  static_assert(kMaxConsumerWarpgroups == 2 &&
                    kProducerRegisters * 128 + kConsumerRegisters * 128 * 2 <= kLaunchRegisters * 128 * 3,
                "the register split overdraws");
  static constexpr int kJobSlots = KernelConfig::kJobSlots;
  // Arrivals per CTA that free a job slot: the A loader warp, the B loader,
  // the publisher and every consumer warp (each consumer warpgroup reads
  // every job, its own and the other's; the consumers store the output
  // themselves: no store warp).
  static constexpr int JobReleasesPerCta(int consumers) { return 3 + 4 * consumers; }
  // Consumer warps that free a ring slot (and hand a tile over): the four of
  // the warpgroup whose job it is; with the tall pair split or the wide
  // split (both warpgroups on every job), of both.
  static constexpr int kReleasingWarpsPerCta = 4;
  static constexpr int ReleasingWarpsPerCta(bool both_warpgroups) {
    return both_warpgroups ? 2 * kReleasingWarpsPerCta : kReleasingWarpsPerCta;
  }
  // No clusters: a job slot is freed and waited for in this CTA (at CTA
  // scope, as in the tiled kernel: JobStream::Next). NOTE: with a
  // cluster-scope release, a consumer warp's release of its next job's slot
  // waited for its stores to C to complete: the consumer fetched each job
  // 4-6 us after it had finished the last one (traced, bench/NOTES.md v1.17).
  static constexpr bool kJobSlotsAcrossCluster = false;
  // A 64-column k-block of A reads two 32-column producer tiles, four of a
  // SwiGLU producer's 16-column ones (dependencies.cuh, AProducerRun).
  static constexpr int kMaxTilesPerGranule = 4;
  // The A loader is a whole warp so that one poll reads many flags at once:
  // each lane reads kFlagWordsPerLane 16-byte words, kFlagWordsPerPoll in
  // all, 512 flags: every producer tile of a K = 4096 job (128 flags), or of
  // a down projection's 14336 (896) in two polls. With one thread reading 64
  // flags a poll, a poll (an L2 round trip, ~1-2 us while HBM is busy) came
  // every 4 stages, and the MLP's down projection waited 36 of its 64 us on
  // A (bench/NOTES.md v1.16).
  static constexpr int kFlagWordsPerLane = 4;
  static constexpr int kFlagWordsPerPoll = 32 * kFlagWordsPerLane;

  // A ring stage holds kKBlocksPerStage consecutive k-blocks (one TMA load
  // each for A and B where K is a multiple of 64: runtime/internal/
  // tensor_maps.h, EncodeKBlockMap). With one k-block a stage (a 4 KiB TMA
  // load of B, one wgmma group each), ring depths of 8 to 48 stages all gave
  // 1x28672x4096 ~0.5 of cuBLAS; four a stage, 0.74 (bench/NOTES.md v1.16).
  static constexpr int kKBlocksPerStage = 4;
  // The ring stages that hold `k_blocks` k-blocks (the last one in part).
  template <typename Int>
  LOOM_HOST_DEVICE static constexpr Int StagesOf(Int k_blocks) {
    return (k_blocks + kKBlocksPerStage - 1) / kKBlocksPerStage;
  }
  // The tagged handoff (plan_resources.cc, TaggedHandoffsOf): in a plan on the
  // mma.sync path, a node of at most kTaggedMaxRows rows whose A is exactly
  // another node's C (the same view; that node of one wave of tiles at
  // most) reads A from a tagged copy that the producer's epilogue writes
  // beside C (KernelNode::tagged_c): each 8-byte word two 16-bit values
  // (bf16 or fp16, the plan's) of a row and the launch's epoch, one
  // single-copy-atomic store, so a word showing the epoch holds its data.
  // The A loader polls the data itself: no flag, which the producer may
  // release only once its stores to C have completed (a round trip under a
  // full memory pipe), and no TMA load after the flag. A poll reads a window of
  // kTaggedStagesPerPoll stages (every lane a word of each k-block and row),
  // and hands over its leading stages found complete. Measured (bench/
  // NOTES.md v1.34, the one-token 8-layer 4096 chain): 75.5-76.9 us against
  // 84.8-85.2 with flags; windows of 8 stages 79.2-79.8; at two rows 82.6
  // against 84.6-85.0 (windows of 2 stages were slower); at three and four
  // rows slower than the flags (89.7-105 us against 86.4-87.1): two rows
  // at most. Only with one consumer warpgroup (the default at 1-16 rows, 255
  // registers a thread; its own instantiation, Instantiation::
  // kTaggedHandoff): with two, the producer warpgroup's 120 registers
  // spilled 76-148 bytes with 16 words a poll.
  static constexpr int kTaggedMaxRows = 2;
  static constexpr int kTaggedStagesPerPoll = 4;
  // 64-bit words a row of a tagged copy of `cols` 16-bit columns takes
  // (KernelNode::tagged_c: two columns a word, the last one padded).
  LOOM_HOST_DEVICE static constexpr int64_t TaggedWordsPerRow(int64_t cols) { return (cols + 1) / 2; }
  static constexpr int kMaxAStages = 16;
  static constexpr int kMaxBStages = 16;
  // By default the B loader keeps at most this many stages in flight
  // (issued, not yet landed; CompileOptions::narrow_b_in_flight), however
  // deep the ring: every memory operation of the SM (flag polls, A loads, the
  // consumer's stores and the release behind them) queues behind what is in
  // flight, ~30 GB/s an SM while HBM is busy.
  static constexpr int kBStagesInFlight = 4;
  // With packed weights (one bulk copy a stage), three, except for a chain
  // of one-wave layers: the MLP block at 16 tokens 88.5-88.9 us against
  // 91.3-91.7 with four, the one-token chain 92.8-93.4 against 91.2-91.5
  // (bench/NOTES.md v1.23).
  static constexpr int kPackedBStagesInFlight = 3;
  static constexpr uint32_t kBTileBytes = kBlockN * kBlockK * 2;                // one k-block: 4 KiB
  static constexpr uint32_t kBStageBytes = kKBlocksPerStage * kBTileBytes;    // 16 KiB
  // A B stage of tiles `tile_n` wide (kBlockN; kPairSplitBlockN: 32 KiB;
  // kWideSplitBlockN: 64 KiB).
  LOOM_HOST_DEVICE static constexpr uint32_t BStageBytes(int tile_n) {
    return static_cast<uint32_t>(tile_n) * kBlockK * 2 * kKBlocksPerStage;
  }
  // A k-block of A holds only the plan's rows, rounded up to the 8-row group
  // of the 128B swizzle (TMA zero-fills the rows past M): 1 KiB for up to 8
  // tokens. The wgmma paths (17 to 64 rows) read 64 rows from a tile's
  // start (17-32 rows: the tiles of two k-blocks at once,
  // narrow_consumer_role.cuh, RunPairedWgmmaJob; 33-64: RunWgmmaJob), past the tiles into whatever
  // follows (later k-blocks and stages, then the B ring, which the layout
  // puts after A for that reason): at most 24 rows, 3 KiB. Those rows only
  // reach accumulator rows that are never read.
  static constexpr uint32_t ATileBytes(int64_t rows) {
    return static_cast<uint32_t>((rows + 7) / 8 * 8) * kBlockK * 2;
  }
  static constexpr uint32_t AStageBytes(int64_t rows) { return kKBlocksPerStage * ATileBytes(rows); }
  // The rows of the A tiles of a stage of a_stage_bytes (the inverse).
  static constexpr uint32_t ATileRows(uint32_t a_stage_bytes) {
    return a_stage_bytes / kKBlocksPerStage / (kBlockK * 2);
  }

  // Plans of at most this many rows multiply on mma.sync (the tokens as one
  // or two 8-column blocks), taller ones on wgmma (narrow_consumer_role.cuh).
  static constexpr int kMmaSyncRows = 16;
  // Plans of 17 to this many rows multiply two k-blocks a wgmma
  // (RunPairedWgmmaJob), taller ones one (RunWgmmaJob).
  static constexpr int kPairedRows = 32;
  // How a plan multiplies, by its A tiles' rows (ATileRows): the kernel
  // instantiation it launches and what Explain says.
  enum class Multiply : uint8_t { kMmaSync, kPairedWgmma, kWgmma };
  static constexpr Multiply MultiplyFor(uint32_t tile_rows) {
    return tile_rows <= kMmaSyncRows ? Multiply::kMmaSync
                                     : (tile_rows <= kPairedRows ? Multiply::kPairedWgmma : Multiply::kWgmma);
  }
  // The mma.sync path (at most 16 rows) splits a stage's k-blocks among the
  // four consumer warps and sums their partial tiles through shared memory:
  // [4 warps][4 (weight block, token block) pairs][32 lanes][4] fp32, one
  // such buffer per consumer warpgroup. The paired wgmma path (17-32 rows)
  // hands its second k-block's sums over in the same buffer; the m64n32k16
  // path (33-64 rows) has no use for it, and its shared memory goes to the
  // B ring instead: one more stage, 6 against 5 at 48 and 64 rows (the MLP
  // block at 48 tokens 96.7-97.3 us against 99.2-99.6, at 64 99.4-101.2
  // against 100.6-101.3; bench/NOTES.md v1.32).
  static constexpr uint32_t kPartialsBytes = 4 * 4 * 32 * 4 * 4;
  static constexpr bool UsesPartials(uint32_t tile_rows) { return MultiplyFor(tile_rows) != Multiply::kWgmma; }
  // The kernel instantiation a plan launches (narrow_gemm.cu): the mma.sync
  // and m64n32k16 paths in row blocks of kBlockM; the paired wgmma path
  // (17-32 rows); the m64n32k16 path in row blocks shorter than kBlockM
  // (65-127 rows, BlockRows), read from KernelParams::block_m. The row block
  // is a constant in the first two: read from the parameters, the unpaired
  // two-consumer kernels spilled 8 bytes and the 64-token MLP block took
  // ~2 us longer (bench/NOTES.md v1.33). kTaggedHandoff: the first, with the
  // tagged handoff (kTaggedMaxRows; LaunchNarrowGemm's tagged_handoffs), for a
  // plan on the mma.sync path with one consumer warpgroup. Compiled into
  // the default kernel, that path made the 64-token 8-layer chain (one
  // consumer, the m64n32k16 path) 109.1-109.9 us against 105.7-105.8
  // (bench/NOTES.md v1.34).
  // kPairSplit: the pair split's 64-column tiles (kPairSplitBlockN), for
  // plans of 33-64 rows (the runtime's NarrowPairSplitApplies);
  // kTallPairSplit, the same for 65-128 rows in one row block, both consumer
  // warpgroups on every job (TallPairSplit; two consumers only); kWideSplit,
  // the wide split's 128-column tiles (Split::kWide; two consumers only).
  enum class Instantiation : uint8_t {
    kDefault, kPaired, kShortRowBlocks, kTaggedHandoff, kPairSplit, kTallPairSplit, kWideSplit
  };
  static constexpr Instantiation InstantiationFor(uint32_t tile_rows, int32_t block_m, bool tagged_handoffs,
                                                  Split split = Split::kNone) {
    if (split == Split::kWide) return Instantiation::kWideSplit;
    if (split == Split::kPair) {
      return TallPairSplit(tile_rows) ? Instantiation::kTallPairSplit : Instantiation::kPairSplit;
    }
    if (block_m != kBlockM) return Instantiation::kShortRowBlocks;
    if (MultiplyFor(tile_rows) == Multiply::kPairedWgmma) return Instantiation::kPaired;
    return tagged_handoffs ? Instantiation::kTaggedHandoff : Instantiation::kDefault;
  }
  // The other way: how an instantiation's jobs divide K, and whether both
  // consumer warpgroups run every job (the tall pair split, the wide split).
  LOOM_HOST_DEVICE static constexpr Split SplitOf(Instantiation kind) {
    return kind == Instantiation::kWideSplit
               ? Split::kWide
               : (kind == Instantiation::kPairSplit || kind == Instantiation::kTallPairSplit ? Split::kPair
                                                                                               : Split::kNone);
  }
  LOOM_HOST_DEVICE static constexpr bool BothWarpgroupsOnEveryJob(Instantiation kind) {
    return kind == Instantiation::kTallPairSplit || kind == Instantiation::kWideSplit;
  }

  // Packed weights (CompileOptions::pack_weights; the layout: packed_layout.h):
  // a stage of four k-blocks of a 32-row tile is one 16 KiB block (of a
  // 64-row tile of the pair split, 32 KiB; of the wide split's 128 rows,
  // 64 KiB).
  LOOM_HOST_DEVICE static constexpr PackedLayout Packed(int tile_n = kBlockN) { return {tile_n, kKBlocksPerStage}; }

  // The scheduler's tile for a plan of at most `rows` rows, `tile_n`
  // (TileN) columns wide: with the pair split past 64 rows one row block of
  // kMaxRows (TallPairSplit).
  static constexpr sched::TileShape tile(int64_t rows, int tile_n = kBlockN) {
    return {tile_n == kPairSplitBlockN && TallPairSplit(rows) ? kMaxRows : BlockRows(rows), tile_n, kBlockK};
  }
  // Whether a plan of `rows` rows may take the pair split: 33-64 rows (the
  // m64n32k16 path's A tiles, one row block), or 65-128 (TallPairSplit, with
  // two consumer warpgroups). Its nodes' K must also split in two on a stage
  // boundary (the runtime's NarrowPairSplitApplies).
  static constexpr bool PairSplitRows(int64_t rows) { return rows > kPairedRows && rows <= kMaxRows; }
  // Whether a plan of `rows` rows may take the wide split: 33-64 rows (with
  // two consumer warpgroups, and every node's K in quarters on stage
  // boundaries: the runtime's NarrowWideSplitApplies).
  static constexpr bool WideSplitRows(int64_t rows) { return rows > kPairedRows && rows <= kBlockM; }

  static_assert(kBlockK * 2 == 128, "a k-block row must be exactly one 128-byte swizzle span");
};
static_assert(NarrowConfig::kBlockK == PackedLayout::kKBlockElements &&
                  NarrowConfig::Packed().StageBytes() == NarrowConfig::kBStageBytes,
              "a packed stage is the bytes a B stage's tensor loads write");

// The mbarriers, in this order, from NarrowSmemLayout::barriers.
struct NarrowBarriers {
  uint64_t a_full[NarrowConfig::kMaxAStages];
  uint64_t a_empty[NarrowConfig::kMaxAStages];
  uint64_t b_full[NarrowConfig::kMaxBStages];
  uint64_t b_empty[NarrowConfig::kMaxBStages];
  uint64_t job_full[NarrowConfig::kJobSlots];
  uint64_t job_empty[NarrowConfig::kJobSlots];
  // A finished tile, handed from the consumer warps (one arrival each, after
  // their stores to C) to the publisher, which releases its flag.
  uint64_t publish_full[NarrowConfig::kJobSlots];
  uint64_t publish_empty[NarrowConfig::kJobSlots];
  // With two consumer warpgroups, one per warpgroup: the other's main loop
  // has waited for every stage of its job (one arrival per warp), so this
  // one may wait for the next job's (narrow_consumer_role.cuh, ConsumeJobs).
  uint64_t consumer_turn[NarrowConfig::kMaxConsumerWarpgroups];
  // This launch's epoch, read by the scheduler thread and handed to the
  // CTA's other roles (NarrowContext::AwaitPreviousLaunch): one arrival,
  // once `epoch` is written.
  uint64_t epoch_ready;
  uint32_t epoch;
  // Claim pacing (KernelParams::claim_stages): the last job of which the B
  // loader has at most claim_stages stages left to issue, written by the B
  // loader, read by the scheduler thread (NarrowContext::LoaderNear).
  int32_t b_loader_near;
};

// Byte offsets into the dynamic shared memory of one CTA.
struct NarrowSmemLayout {
  uint32_t a_ring = 0;     // [a_stages][kKBlocksPerStage][rows][128 B], 128B swizzle
  uint32_t b_ring = 0;     // [b_stages][kKBlocksPerStage][kBlockN][128 B], 128B swizzle; after A (see ATileBytes)
  uint32_t partials = 0;   // fp32 [consumer warpgroups][4][4][32][4] (kPartialsBytes each; none: UsesPartials)
  uint32_t barriers = 0;   // NarrowBarriers
  uint32_t job_slots = 0;  // int32_t [kJobSlots]
  uint32_t total = 0;      // bytes to request, including 1 KiB of alignment slack
};

// `tile_n`: the plan's tile width (NarrowConfig::TileN), which sets a B
// stage's bytes.
LOOM_HOST_DEVICE constexpr NarrowSmemLayout ComputeNarrowSmemLayout(int a_stages, uint32_t a_stage_bytes,
                                                                    int b_stages, int consumers,
                                                                    int tile_n = NarrowConfig::kBlockN) {
  NarrowSmemLayout layout;
  uint32_t offset = 0;
  layout.a_ring = offset;
  offset += static_cast<uint32_t>(a_stages) * a_stage_bytes;
  layout.b_ring = offset;
  offset += static_cast<uint32_t>(b_stages) * NarrowConfig::BStageBytes(tile_n);
  layout.partials = offset;
  if (NarrowConfig::UsesPartials(NarrowConfig::ATileRows(a_stage_bytes))) {
    offset += static_cast<uint32_t>(consumers) * NarrowConfig::kPartialsBytes;
  }
  layout.barriers = offset;
  offset += sizeof(NarrowBarriers);
  layout.job_slots = offset;
  offset += NarrowConfig::kJobSlots * sizeof(int32_t);
  layout.total = offset + 1024;
  return layout;
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_NARROW_CONFIG_H_
