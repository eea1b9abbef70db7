// dependencies.cuh: what a job waits for before it can start. The A loader
// waits for the producer tiles of each slice of A it loads, reading many
// producer tile columns' flags per check (WaitForAProducersAhead), and for the
// epilogue's inputs once per job (WaitForProducers); the scheduler looks,
// without waiting, whether a job it handed out can start yet
// (FindInputFlags, InputsReady), and holds back further fetches while it cannot.
#ifndef LOOM_OPS_KERNEL_DEPENDENCIES_CUH_
#define LOOM_OPS_KERNEL_DEPENDENCIES_CUH_

#include "cta_context.cuh"

namespace loom::kernel {

// Calls visit(d, producer, box) for each dependency edge d of `operand` and
// the box of producer tiles that elements [row_begin, row_end) x [col_begin,
// col_end) of the operand read, when that box is not empty. Stops, returning
// false, as soon as visit does.
template <typename Ctx, typename Visit>
__device__ __forceinline__ bool ForEachProducerBox(const Ctx& ctx, const KernelNode& node,
                                                   sched::DependencyOperand operand, int64_t row_begin,
                                                   int64_t row_end, int64_t col_begin, int64_t col_end,
                                                   Visit&& visit) {
  const sched::NodeSchedule& schedule = node.schedule;
  // No edge on this operand: none read (walking them for the epilogue's
  // inputs, which an MLP block's down job has none of, took 1.1-1.5 kcycles
  // at the start of each such job; bench/NOTES.md v1.67).
  if (!sched::HasProducerOperand(schedule, operand)) return true;
  for (int d = 0; d < schedule.dependency_count; ++d) {
    const sched::DependencyEdge& edge = ctx.params.dependencies[schedule.dependency_begin + d];
    if (edge.operand != static_cast<uint8_t>(operand)) continue;
    const sched::NodeSchedule& producer = ctx.params.nodes[edge.producer].schedule;
    const sched::TileBox box =
        sched::ProducerTiles(producer, ctx.tile(), edge, row_begin, row_end, col_begin, col_end);
    if (box.empty()) continue;
    if (!visit(d, producer, box)) return false;
  }
  return true;
}

// Waits until every producer tile that elements [row_begin, row_end) x
// [col_begin, col_end) of `operand` read is complete in this epoch. The memo
// remembers the last box known complete, so the k-blocks that fall inside one
// producer tile poll its flag once.
struct DependencyMemo {
  int dependency = -1;
  sched::TileBox satisfied;
  __device__ void Reset() { dependency = -1; }
  __device__ bool Covers(int d, const sched::TileBox& box) const {
    return d == dependency && box.m_begin >= satisfied.m_begin && box.m_end <= satisfied.m_end &&
           box.n_begin >= satisfied.n_begin && box.n_end <= satisfied.n_end;
  }
};

template <typename Ctx>
__device__ inline bool WaitForProducers(const Ctx& ctx, const KernelNode& node, int job_index,
                                        sched::DependencyOperand operand, int64_t row_begin,
                                        int64_t row_end, int64_t col_begin, int64_t col_end,
                                        DependencyMemo& memo) {
  bool waited = false;
  const bool done = ForEachProducerBox(
      ctx, node, operand, row_begin, row_end, col_begin, col_end,
      [&](int d, const sched::NodeSchedule& producer, const sched::TileBox& box) {
        if (memo.Covers(d, box)) return true;
        for (int mb = box.m_begin; mb < box.m_end; ++mb) {
          for (int nb = box.n_begin; nb < box.n_end; ++nb) {
            if (!WaitForFlag(ctx, sched::OutputFlagIndex(producer, mb, nb), job_index)) return false;
          }
        }
        memo.dependency = d;
        memo.satisfied = box;
        waited = true;
        return true;
      });
  // The producer wrote through the async proxy (TMA store) and released the
  // flag after a proxy fence; this fence orders our acquire before the TMA
  // loads (async proxy) we are about to issue.
  if (waited) cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
  return done;
}

// Waits for the producers of what the epilogue of the tile at (row0,
// n_block) reads, its residual and its bias, before the A loader's first
// load, so that the consumers find them complete (ordered through a_full).
template <typename Ctx>
__device__ inline bool WaitForEpilogueInputs(const Ctx& ctx, const KernelNode& node, int job_index, int64_t row0,
                                             int32_t n_block, DependencyMemo& memo) {
  const int64_t out_col0 = int64_t{n_block} * node.schedule.out_tile_n;
  const int64_t acc_col0 = int64_t{n_block} * ctx.tile().n;
  return WaitForProducers(ctx, node, job_index, sched::DependencyOperand::kResidual, row0,
                          row0 + ctx.tile().m, out_col0, out_col0 + node.schedule.out_tile_n, memo) &&
         WaitForProducers(ctx, node, job_index, sched::DependencyOperand::kBias, 0, 1, acc_col0,
                          acc_col0 + ctx.tile().n, memo);
}

// The end of the granule of A's k-blocks that k-block kb belongs to: the
// k-blocks [j * a_wait_k_blocks, (j + 1) * a_wait_k_blocks) read one producer
// tile column (AWaitKBlocks), so one check of their first covers them all.
// (32-bit: k-blocks fit a TileJob's 16 bits, and a_wait_k_blocks is at most
// 2^30.)
__device__ __forceinline__ int AGranuleEnd(const sched::NodeSchedule& schedule, int kb) {
  return (kb / schedule.a_wait_k_blocks + 1) * schedule.a_wait_k_blocks;
}

// The producer tiles of the granules of A from k-block kb on, when they form
// a run of consecutive flags: one A edge, and each granule is exactly
// tiles_per_granule whole producer tile columns of one tile row (a_wait_k_blocks
// k-blocks = tiles_per_granule x the producer's out_tile_n columns, kb's
// granule starting on a tile boundary), so granule j reads the tiles
// first_flag + j * tiles_per_granule onwards, all of them whole.
// tiles_per_granule is 1 for the tiled kernel (Config::kMaxTilesPerGranule),
// 2 or 4 for the narrow decode kernel's 32- and 16-column tiles: a power of
// two, so that a poll finds a flag's granule with a shift (a division there
// made the one-token chain ~1 us slower, and the 64-token one ~4 us;
// bench/NOTES.md v1.20). The run ends at kb_end or at the producer's last
// whole tile column: a ragged last tile (its output columns end inside it)
// shares its k-block with whatever follows it in A, another producer's
// columns perhaps, which the run's flags do not cover (found by the
// random-options soak on 128-wide tiles, whose SwiGLU output tiles are one
// k-block wide). Each poll reads as
// much of it as the Config::kFlagWordsPerPoll words from its first flag's
// hold (WaitForAProducersAhead). granules == 0 when the pattern does not
// hold (NodeSchedule::a_flag_runs unset: an edge's offset inside a tile
// column, or two edges that give columns of one row block; or several
// edges' tiles in kb's k-block): the caller then waits granule by granule.
// Worked out by AProducerRunOf (kernel_params.h), which host code checks
// plans with.
// NOTE: the run used to end where the poll's words do too, so every 16
// flags the A loader walked the node's edge and the producer's schedule
// again, each one round trip (the acquire fence before had emptied L1),
// before it read a flag; all the while with at most four A stages (~2.8 us
// of wgmma) in the ring. The 8192-token MLP's down projection (112 producer
// tile columns a job) did that seven times a job: traced, its main loop took
// 3.71-3.82x gate/up's (3.5x is their flops), 3.45x with no A waits at all,
// 3.53x with the run kept for the whole job (bench/NOTES.md v1.50).
// NOTE: worked out from granule 0 alone. A first version found each
// granule's tiles with ProducerTiles (64-bit divisions, records read from
// global memory), and those instructions, issued by one thread among busy
// consumer warps, cost the 8192-token MLP's down projection ~105 us per tile
// whether it looked ahead 8 or 16 granules per poll (bench/NOTES.md v1.11).
using FlagRun = sched::AFlagRun;

template <typename Ctx>
__device__ inline FlagRun AProducerRun(const Ctx& ctx, const KernelNode& node, int64_t row0, int kb,
                                       int kb_end) {
  using Config = typename Ctx::Config;
  return AProducerRunOf<Config::kBlockM, Config::kBlockK, Config::kMaxTilesPerGranule>(
      node, ctx.params.dependencies,
      [&](int producer) -> const sched::NodeSchedule& { return ctx.params.nodes[producer].schedule; }, ctx.tile(),
      row0, kb, kb_end);
}

// How many of the run's granules, from the first, have every flag at this
// epoch: one poll, the run's flags read as aligned 16-byte words (the flag
// array is padded to a whole word, plan_resources.cc), all in flight together. Every
// granule of the run lies in the words read (WaitForAProducersAhead caps the
// run to them). The words are read by kLanes lanes of a warp (the narrow
// kernel's A loader polls with all 32, the tiled kernel's with one thread):
// lane l reads words l, l + kLanes, ..., so each load instruction of a whole
// warp reads 512 consecutive bytes; with several lanes, all of them must call
// it and all get the answer.
template <int kLanes, typename Ctx>
__device__ __forceinline__ int CompleteGranules(const Ctx& ctx, const FlagRun& run, int lane) {
  static_assert(kLanes == 1 || kLanes == 32, "one thread or a whole warp");
  constexpr int kWordsPerLane = Ctx::Config::kFlagWordsPerPoll / kLanes;
  constexpr bool kOneTile = Ctx::Config::kMaxTilesPerGranule == 1;
  const int base = run.first_flag & ~3;
  const int skip = run.first_flag - base;
  const int tiles = kOneTile ? run.granules : run.granules * run.tiles_per_granule;
  const int words = (skip + tiles + 3) / 4;
  uint4 seen[kWordsPerLane];
#pragma unroll
  for (int i = 0; i < kWordsPerLane; ++i) {
    const int w = kLanes * i + lane;
    if (w < words) seen[i] = ptx::ld_relaxed_gpu_v4(&ctx.params.flags[base + 4 * w]);
  }
  // From the last word to the first, so that the last incomplete granule
  // found is the first of the run.
  // NOTE: the narrow kernel's warp version first took the minimum instead
  // (complete = min(complete, granule)): the same answer, but the one-token
  // 8-layer chain took 118.3-118.8 us against 112.0-112.4 this way
  // (bench/NOTES.md v1.20).
  int complete = run.granules;
#pragma unroll
  for (int i = kWordsPerLane - 1; i >= 0; --i) {
    const int w = kLanes * i + lane;
    const uint32_t value[4] = {seen[i].x, seen[i].y, seen[i].z, seen[i].w};
#pragma unroll
    for (int c = 3; c >= 0; --c) {
      const int tile = 4 * w + c - skip;
      const int granule = kOneTile ? tile : tile >> run.tiles_shift;
      if (w < words && tile >= 0 && granule < run.granules && !FlagDone(value[c], ctx.epoch)) {
        complete = granule;
      }
    }
  }
  if constexpr (kLanes > 1) complete = __reduce_min_sync(0xffffffffu, complete);
  return complete;
}

// What an A loader keeps of a job's run of A flags between its waits: the
// run AProducerRun found at k-block `kb`, so that a wait at a later granule
// of the same run only moves its first flag on and reads no records. Reset()
// at every job.
// NOTE: worked out again at every wait, the records (the node's edges, the
// producer's schedule, read after an acquire fence had emptied L1) sat on the
// path from the last producer flag to the next layer's A load: the one-token
// 8-layer chain took 109.9-110.6 us against 99.2-99.9 with the run kept, the
// 16-token chain 109.4-109.8 against 98.0-98.2, the 64-token chain 137-138
// against 122.5-122.8 (bench/NOTES.md v1.20).
struct KnownARun {
  int kb = -1;  // none yet
  int wait_k_blocks = 1;
  FlagRun run;
  __device__ void Reset() { kb = -1; }
  // The run the runtime worked out from k-block 0 (KernelNode::first_a_run).
  __device__ void Seed(int node_wait_k_blocks, const KernelNode::FirstARun& first) {
    kb = 0;
    wait_k_blocks = node_wait_k_blocks;
    run.first_flag = first.first_flag;
    run.granules = first.granules;
    run.tiles_shift = first.tiles_shift;
    run.tiles_per_granule = 1 << first.tiles_shift;
  }
};

// Waits until the producer tiles that k-block kb of A reads are complete and
// acquires them; the same polls read the flags of the granules after kb's
// (a granule: the a_wait_k_blocks k-blocks that read one producer tile
// column). Returns the k-block where the A loader must look again, the end of
// the leading granules found complete (at most kb_end), or -1 when the launch
// is aborting.
// NOTE: a wait is on the A loader's path: while it waits, no A load is
// issued. Traced (bench/NOTES.md v1.11), the 8192-token MLP's down projection
// took 321 us per tile against 155 us standalone while it waited once per
// producer tile column (two k-blocks, ~1.4 us of wgmma). A granule whose
// producer is still running costs what it did.
// kLanes: who polls (CompleteGranules): the tiled kernel's A loader alone
// (1), or the narrow kernel's whole warp (32), every lane calling with its
// `lane` and getting the same answer. A warp's lanes each acquire only the
// flags they read, and one lane then issues the TMA loads that read what
// all those flags announce: after the acquire fences the lanes meet
// (bar.warp.sync orders memory among them) before the proxy fence, so the
// acquires of every lane come before the issuer's loads (a review found the
// issuer's loads formally unordered after the other lanes' acquires).
// NOTE: a warp's polls are warp collectives, so its lanes must give up
// together. In SpinUntil each lane decides for itself, from the abort flag
// and the clock, which the converged warp reads in one instruction each, so
// every lane sees the same values and leaves at the same poll.
// SpinUntilAsWarp, where lane 0 decides for the warp, made ptxas spill in
// every narrow instantiation capped at 168 registers (0 -> 8 and 4 -> 8
// bytes of spill stores, compiled here); measure before switching.
template <int kLanes, typename Ctx>
__device__ inline int WaitForAProducersAhead(const Ctx& ctx, const KernelNode& node, int job_index, int64_t row0,
                                             int kb, int kb_end, KnownARun& known, int lane = 0) {
  static_assert(kLanes == 1 || kLanes == 32, "one thread or a whole warp");
  if (known.kb < 0 || kb / known.wait_k_blocks - known.kb / known.wait_k_blocks >= known.run.granules) {
    known.run = AProducerRun(ctx, node, row0, kb, kb_end);
    known.kb = kb;
    known.wait_k_blocks = node.schedule.a_wait_k_blocks;
  }
  const int wait_k_blocks = known.wait_k_blocks;
  const int granule_end = min((kb / wait_k_blocks + 1) * wait_k_blocks, kb_end);
  FlagRun run = known.run;
  const int skipped = kb / wait_k_blocks - known.kb / wait_k_blocks;  // granules of the run already done
  run.first_flag += skipped * run.tiles_per_granule;
  // One poll reads the Config::kFlagWordsPerPoll words from first_flag's.
  const int flags_left = 4 * Ctx::Config::kFlagWordsPerPoll - (run.first_flag & 3);
  run.granules = min(run.granules - skipped, flags_left >> run.tiles_shift);
  if (run.granules <= 0) {
    // Not a run (AProducerRun found none at kb): kb's own granule alone, as
    // WaitForProducers finds it (each lane waiting on every flag itself).
    DependencyMemo memo;
    if (!WaitForProducers(ctx, node, job_index, sched::DependencyOperand::kA, row0, row0 + ctx.tile().m,
                          kb * Ctx::Config::kBlockK, (kb + 1) * Ctx::Config::kBlockK, memo)) {
      return -1;
    }
    return granule_end;
  }
  int complete = 0;
  const bool done = ctx.watchdog.SpinUntil(
      [&] {
        complete = CompleteGranules<kLanes>(ctx, run, lane);
        if (complete > 0) return true;
        __nanosleep(64);
        return false;
      },
      WaitKind::kDependencyFlag, job_index, run.first_flag, ctx.epoch, &ctx.params.flags[run.first_flag]);
  if (!done) return -1;
  // Relaxed reads that saw the releases, then an acquire fence: an acquire
  // (see WaitForFlag). Then the proxy fence of WaitForProducers.
  cuda::ptx::fence(cuda::ptx::sem_acquire, cuda::ptx::scope_gpu);
  if constexpr (kLanes > 1) __syncwarp();
  cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
  return min((kb / wait_k_blocks + complete) * wait_k_blocks, kb_end);
}

// Whether every producer tile that elements [row_begin, row_end) x
// [col_begin, col_end) of `operand` read is complete in this epoch already,
// checked without waiting: relaxed reads, kBatch of them in flight together.
// It acquires nothing: a caller that goes on to read the producers' data must
// still wait (WaitForProducers) or fence.
template <typename Ctx>
__device__ inline bool ProducersDone(const Ctx& ctx, const KernelNode& node, sched::DependencyOperand operand,
                                     int64_t row_begin, int64_t row_end, int64_t col_begin, int64_t col_end) {
  constexpr int kBatch = 8;
  return ForEachProducerBox(
      ctx, node, operand, row_begin, row_end, col_begin, col_end,
      [&](int, const sched::NodeSchedule& producer, const sched::TileBox& box) {
        const int cols = box.n_end - box.n_begin;
        const int count = (box.m_end - box.m_begin) * cols;
        for (int i0 = 0; i0 < count; i0 += kBatch) {
          uint32_t seen[kBatch];
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            const int i = i0 + u;
            if (i < count) {
              seen[u] = ptx::ld_relaxed_gpu(&ctx.params.flags[sched::OutputFlagIndex(
                  producer, box.m_begin + i / cols, box.n_begin + i % cols)]);
            }
          }
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            if (i0 + u < count && !FlagDone(seen[u], ctx.epoch)) return false;
          }
        }
        return true;
      });
}

// Whether the A producers of GEMM job `index`'s first granule of k-blocks
// (AGranuleEnd) are complete; the general form of InputsReady, for a first
// granule that is not one run of flags. Looks at the cluster's first CTA tile
// only (a hint for pacing the fetch, not a wait that orders anything).
template <typename Ctx>
__device__ inline bool FirstGranuleProducersDone(const Ctx& ctx, int index) {
  const sched::TileJob& job = ctx.params.queue[index];
  const KernelNode& node = ctx.params.nodes[job.node];
  const sched::CtaTile tile = sched::CtaTileOf(job, node.schedule.share, 0);
  const int64_t row0 = int64_t{tile.m_block} * ctx.tile().m;
  const int64_t k_end = min(AGranuleEnd(node.schedule, job.k_block_begin), int{job.k_block_end});
  return ProducersDone(ctx, node, sched::DependencyOperand::kA, row0, row0 + ctx.tile().m,
                       int64_t{job.k_block_begin} * Ctx::Config::kBlockK, k_end * Ctx::Config::kBlockK);
}

// What the scheduler looks at while it holds job `index` back (whether the
// job could start now): a reduce job's partials, or the A producers of a GEMM
// job's first granule of k-blocks. A job that can start works through its
// k-blocks as their producers finish. The flags are found once, so that each
// look reads only the flags, when they are one run (AProducerRun); otherwise
// (`general`) each look is FirstGranuleProducersDone.
// NOTE: with the records walked at every look (after the A loader's acquire
// fences had emptied L1), the 64-token chain took 123.0-123.5 us against
// 117.6-117.9 and the 64-token MLP 124.8-125.1 against 123.5-123.8
// (bench/NOTES.md v1.20).
struct InputFlags {
  bool general = false;
  int first = 0;
  int count = 0;  // 0: nothing to wait for
};

template <typename Ctx>
__device__ inline InputFlags FindInputFlags(const Ctx& ctx, int index) {
  const sched::TileJob& job = ctx.params.queue[index];
  const KernelNode& node = ctx.params.nodes[job.node];
  const sched::NodeSchedule& schedule = node.schedule;
  const sched::CtaTile tile = sched::CtaTileOf(job, schedule.share, 0);
  InputFlags flags;
  if (job.kind == static_cast<uint8_t>(sched::JobKind::kReduce)) {
    flags.first = sched::PartialFlagIndex(schedule, tile.m_block, tile.n_block, 0);
    flags.count = schedule.split_k;
    return flags;
  }
  if (schedule.dependency_count == 0) return flags;
  const FlagRun run = AProducerRun(ctx, node, int64_t{tile.m_block} * ctx.tile().m, job.k_block_begin,
                                   job.k_block_end);
  flags.general = run.granules == 0;
  flags.first = run.first_flag;
  flags.count = run.tiles_per_granule;
  return flags;
}

template <typename Ctx>
__device__ inline bool InputsReady(const Ctx& ctx, const InputFlags& flags, int index) {
  if (flags.general) return FirstGranuleProducersDone(ctx, index);
  for (int i = 0; i < flags.count; ++i) {
    if (!FlagDone(ptx::ld_relaxed_gpu(&ctx.params.flags[flags.first + i]), ctx.epoch)) return false;
  }
  return true;
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_DEPENDENCIES_CUH_
