// splitk_reduce.cuh: the consumer side of a split-K reduce job. The split
// jobs store raw fp32 partials of their CTA tile into the node's workspace
// slice (store_role.cuh) and release one partial flag each; the reduce job of
// that tile waits for every split's flag and sums the partials in split order
// (bit-identical every run). A tile of many rows is summed into the
// accumulator layout and then runs the node's fused epilogue like any tile
// (SumPartials, consumer_role.cuh); a tile of a few rows is summed one column
// pair per thread, and when whole goes straight into C with its fused ops
// applied (SumFewRowPartials). A node reduced in parts
// (NodeSchedule::reduce_parts) has one reduce job per 8 or 16 rows of a
// tile, each a few-row sum straight into C; the part that finishes a tile
// last publishes its flag (FinishesReducePart). A few-row sum then drops the
// partials it read from L2 unwritten (DiscardWarpPartials).
#ifndef LOOM_OPS_KERNEL_SPLITK_REDUCE_CUH_
#define LOOM_OPS_KERNEL_SPLITK_REDUCE_CUH_

#include "cta_context.cuh"
#include "epilogue_role.cuh"

namespace loom::kernel {

// A split-K node's fp32 partials in the workspace (layout: schedule.h,
// workspace_offset): [split_k][m_blocks * kBlockM rows][n_blocks * kBlockN
// columns], every CTA tile padded to whole blocks.
struct PartialLayout {
  float* split0;         // split 0's slice: row 0, column 0
  int64_t row_stride;    // floats from one row to the next (the padded columns)
  int64_t split_stride;  // floats from one split's slice to the next

  template <class Config>
  __device__ PartialLayout(const CtaContext<Config>& ctx, const sched::NodeSchedule& schedule)
      : split0(ctx.params.workspace + schedule.workspace_offset),
        row_stride(int64_t{schedule.n_blocks} * Config::kBlockN),
        split_stride(int64_t{schedule.m_blocks} * KernelConfig::kBlockM * row_stride) {}
  // Row `row`, column `col` of split 0's slice.
  __device__ float* At(int64_t row, int64_t col) const { return split0 + row * row_stride + col; }
};

// Where this lane's accumulator rows live in a split-K partial: its two rows
// (lane / 4 and 8 further, of its warp's 16) in split 0's slice, pointing at
// the lane's first column pair; each further split is `split_stride` floats
// on.
struct LanePartialRows {
  float* lo;
  float* hi;
  int64_t split_stride;
  bool lo_ok, hi_ok;  // the row is inside M

  template <class Config>
  __device__ LanePartialRows(const CtaContext<Config>& ctx, const CtaWork& work, int warpgroup) {
    const sched::NodeSchedule& schedule = work.node->schedule;
    const PartialLayout partials(ctx, schedule);
    const int warp = (threadIdx.x / 32) % 4;
    const int lane = threadIdx.x % 32;
    const int64_t row_lo = int64_t{work.m_block} * KernelConfig::kBlockM +
                           warpgroup * KernelConfig::kRowsPerConsumer + warp * 16 + lane / 4;
    split_stride = partials.split_stride;
    lo_ok = row_lo < schedule.m;
    hi_ok = row_lo + 8 < schedule.m;
    lo = partials.At(row_lo, int64_t{work.n_block} * Config::kBlockN + 2 * (lane % 4));
    hi = lo + 8 * partials.row_stride;
  }
};

// A split-K partial whose CTA tile has at most this many rows inside M (all
// of them warpgroup 0's: decode, up to 64 tokens) is written by the consumers
// straight from registers to the workspace, live rows only, instead of eight
// fp32 panels staged for TMA stores (which clip the rows past M). The store
// thread then only publishes it (store_role.cuh), after one staging handshake
// per warpgroup that orders the consumers' stores before its flag release.
// Measured (bench/NOTES.md v1.14), this limit at 128 rows against 16: the
// chain at 32 tokens 212 -> 197 us, 32x4096x4096 0.74 -> 0.80 of cuBLAS, but
// no gain at 128 rows (128x14336x4096 0.76 -> 0.73), so fuller tiles keep the
// staged stores.
constexpr int kDirectPartialRows = KernelConfig::kRowsPerConsumer;

__device__ inline bool StoresPartialDirectly(const sched::NodeSchedule& schedule, int32_t m_block) {
  return schedule.m - int64_t{m_block} * KernelConfig::kBlockM <= kDirectPartialRows;
}

// The consumer side of a direct partial (StoresPartialDirectly): this lane's
// accumulators of rows inside M, as float2 pairs, into the split's workspace
// slice (layout: schedule.h, workspace_offset).
template <class Config>
__device__ inline void StorePartialDirectly(const CtaContext<Config>& ctx, const CtaWork& work, int warpgroup,
                                            RingCursor& staging, const float (&acc)[Config::kAccumulators]) {
  const LanePartialRows rows(ctx, work, warpgroup);
  float* lo = rows.lo + work.job->split * rows.split_stride;
  float* hi = rows.hi + work.job->split * rows.split_stride;
  WaitForStaging(ctx, warpgroup, staging);
#pragma unroll
  for (int c = 0; c < Config::kAccumulators / 4; ++c) {  // 8-column chunk c: registers 4c..4c+3
    if (rows.lo_ok) *reinterpret_cast<float2*>(lo + 8 * c) = make_float2(acc[4 * c], acc[4 * c + 1]);
    if (rows.hi_ok) *reinterpret_cast<float2*>(hi + 8 * c) = make_float2(acc[4 * c + 2], acc[4 * c + 3]);
  }
  PublishPanel(ctx, warpgroup, staging);
}

// A barrier over one consumer warpgroup (its NamedBarrier): true in every
// thread when `predicate` holds in all 128.
__device__ __forceinline__ bool ConsumerBarrierAnd(int warpgroup, bool predicate) {
  static_assert(KernelConfig::kConsumerWarpgroups == 2, "one named barrier per consumer warpgroup");
  constexpr int kFirst = static_cast<int>(NamedBarrier::kConsumer0);
  constexpr int kSecond = static_cast<int>(NamedBarrier::kConsumer1);
  return warpgroup == 0 ? ptx::barrier_and<kFirst, 128>(predicate) : ptx::barrier_and<kSecond, 128>(predicate);
}

// Both consumer warpgroups meet (all 256 threads arrive; the shared-memory
// writes of each before it, the reads of the other after it). No time limit:
// neither warpgroup leaves its job loop before the job stream ends, also in
// a launch that is aborting (watchdog.cuh).
template <class Config>
__device__ inline void ConsumersMeet(const CtaContext<Config>& ctx) {
  uint64_t* meet = &ctx.barriers->consumers_meet;
  const uint64_t state = cuda::ptx::mbarrier_arrive(meet);
  while (!cuda::ptx::mbarrier_try_wait(meet, state)) {
  }
}

// Split-K reduce, part 1: waits until splits [0, splits) of this CTA tile
// have published their partials (`splits`: sched::PartialsSummed, every
// split for a reduce job, the others for a last split that sums). Called by
// every thread of the consumer warpgroup:
// thread t waits for split t's flag (and t + 128, ...), so the splits are
// polled together, one round trip to L2 rather than one per split; the
// barrier then hands each thread's acquire on to the whole warpgroup. Returns
// false (in every thread) when the launch is aborting.
// NOTE: the reduce job runs the epilogue but does not wait for a bias or
// residual that another node produces: every split job's A loader already
// waited for them (acquire) before its first load, and the split's partial
// flag is released after that, so acquiring all partial flags orders the
// reduce after the producers too (release/acquire chains are transitive).
// Waiting here again put the loaders' dependency code into the consumer role
// and its register pressure into the main loop (spills, a quarter of the
// GEMM throughput lost).
template <class Config>
__device__ inline bool WaitForPartials(const CtaContext<Config>& ctx, const CtaWork& work, int splits, int warpgroup,
                                       int job_index) {
  const sched::NodeSchedule& schedule = work.node->schedule;
  const int first_flag = sched::PartialFlagIndex(schedule, work.m_block, work.n_block, 0);
  bool ok = true;
  for (int split = threadIdx.x % 128; ok && split < splits; split += 128) {
    ok = WaitForFlag(ctx, first_flag + split, job_index);
  }
  return ConsumerBarrierAnd(warpgroup, ok);
}

// Partials are scratch: once their reduce has read them nothing reads them
// again before the next launch rewrites them. Left dirty in L2, each line
// goes back to DRAM when evicted, which is while the next launch streams its
// first weights: at 128 tokens the MLP block's 16 MB of partials held
// gate/up's stream to 4.0 TB/s against 4.3 without them (bench/NOTES.md
// v1.42). So after a few-row sum each warp drops the lines it read, unwritten:
// its 64 columns (two lines) of `rows` rows from `first` (its first column in
// row 0 of split 0), in every split. No other warp reads those lines; the
// __syncwarp orders all its lanes' loads (consumed by the sums) before the
// discards. (SumPartials' whole tiles, of more than kFewRowReduceRows live
// rows, keep theirs: beside that path the discards spilled and made the
// 256-token block slower, 207.7 us against 202.6; after the consumer's last
// job they gained nothing, the multiply bounding those sizes rather than the
// stream. NOTES v1.42.) `split_k`: the node's splits, every one of which
// wrote a partial (a reduce job's node: sched::PartialSlices == split_k).
__device__ inline void DiscardWarpPartials(const float* first, int rows, int64_t row_stride, int split_k,
                                           int64_t split_stride) {
  __syncwarp();
  const int lane = threadIdx.x % 32;  // a lane pair per row, one line each
#pragma unroll 1
  for (int split = 0; split < split_k; ++split) {
#pragma unroll 1
    for (int row = lane / 2; row < rows; row += 16) {
      ptx::discard_global_l2(first + split * split_stride + row * row_stride + (lane % 2) * 32);
    }
  }
}

// Adds the partials of splits [0, splits) of this CTA tile (`splits`:
// sched::PartialsSummed) to `acc` (the accumulator layout), split 0 first: a fixed order, so the same
// bits every run. A reduce job starts from zero (SumPartials); the last split
// of a node whose last split sums, after its main loop, from its own
// accumulators: for two splits the reduce job's bits (0 + p0 + p1) but for
// the sign of a zero sum, for more another fixed order. Where it replaced the
// reduce job (bench/NOTES.md v1.44), the tile's own partial never leaves
// registers, the others' are read once, and no cluster has to take a reduce
// job while the next node waits.
template <class Config>
__device__ inline void AddPartials(const CtaContext<Config>& ctx, const CtaWork& work, int warpgroup, int splits,
                                   float (&acc)[Config::kAccumulators]) {
  const LanePartialRows rows(ctx, work, warpgroup);
  for (int split = 0; split < splits; ++split) {
    const float* lo = rows.lo + split * rows.split_stride;
    const float* hi = rows.hi + split * rows.split_stride;
#pragma unroll
    for (int c = 0; c < Config::kAccumulators / 4; ++c) {  // 8-column chunk c: registers 4c..4c+3
      if (rows.lo_ok) {
        const float2 v = *reinterpret_cast<const float2*>(lo + 8 * c);
        acc[4 * c] += v.x;
        acc[4 * c + 1] += v.y;
      }
      if (rows.hi_ok) {
        const float2 v = *reinterpret_cast<const float2*>(hi + 8 * c);
        acc[4 * c + 2] += v.x;
        acc[4 * c + 3] += v.y;
      }
    }
  }
}

// Split-K reduce, part 2: sums the partials in split order (the same order
// every run, so the result is bit-for-bit reproducible) into the accumulator
// layout.
template <class Config>
__device__ inline void SumPartials(const CtaContext<Config>& ctx, const CtaWork& work, int warpgroup,
                                   float (&acc)[Config::kAccumulators]) {
#pragma unroll
  for (int i = 0; i < Config::kAccumulators; ++i) acc[i] = 0.0f;
  AddPartials(ctx, work, warpgroup, work.node->schedule.split_k, acc);
}

// Elements [at, at + 1] of a tensor of the plan's 16-bit type (kHalf) or
// fp32, as floats.
template <ElementType kHalf>
__device__ __forceinline__ float2 LoadPair(const void* base, ElementType type, int64_t at) {
  using T = typename HalfType<kHalf>::T;
  return type == kHalf ? make_float2(LoadFloat<T>(base, at), LoadFloat<T>(base, at + 1))
                       : make_float2(LoadFloat<float>(base, at), LoadFloat<float>(base, at + 1));
}

// The output rows [row0, row0 + rows) that a reduce job sums for its CTA tile
// (m_block inside the node): all the tile's rows inside M, or those of the
// job's part (`part`, TileJob::split) when the node is reduced in parts.
struct ReduceRows {
  int64_t row0;
  int rows;
};
__device__ __forceinline__ ReduceRows ReduceRowsOfJob(const sched::NodeSchedule& schedule, int32_t m_block,
                                                      int part) {
  const sched::RowRange range = sched::ReduceRowsOf(schedule, KernelConfig::tile(), part);  // rows: either width
  const int64_t tile_row0 = int64_t{m_block} * KernelConfig::kBlockM;
  const int64_t end = min(tile_row0 + range.end, schedule.m);
  return ReduceRows{tile_row0 + range.begin, static_cast<int>(end - tile_row0 - range.begin)};
}

// A reduce job with at most kFewRowReduceRows rows to sum (decode, a few
// tokens; or one part of a tile reduced in parts) is summed by
// SumFewRowPartials, one column pair per thread, its rows taken as
// warpgroup 0's. Unless it goes straight into C (ReduceStoresDirectly, which
// every part does), its sums land in warpgroup 0's two staging buffers, one
// fp32 tile row per row.
__device__ inline bool SumsFewRows(const sched::NodeSchedule& schedule, int32_t m_block) {
  return schedule.reduce_parts > 1 ||
         schedule.m - int64_t{m_block} * KernelConfig::kBlockM <= sched::kFewRowReduceRows;
}

// A SumsFewRows job of more than one row is summed by both consumer
// warpgroups, the first half of its rows by warpgroup 0 and the rest by
// warpgroup 1; one row is warpgroup 0's alone, so warpgroup 1 moves on
// without waiting.
__device__ inline bool SumsWithBothWarpgroups(const sched::NodeSchedule& schedule, int32_t m_block, int part) {
  return SumsFewRows(schedule, m_block) && ReduceRowsOfJob(schedule, m_block, part).rows > 1;
}

// Whether consumer warpgroup `warpgroup` hands job `work`'s output to the
// store thread (its staging handshakes): a warpgroup with rows inside M, but
// for a SumsFewRows reduce job warpgroup 0 alone, whose rows they all are
// taken to be. The consumers and the store thread both ask this: a
// handshake one side expects and the other never makes is a hang.
__device__ inline bool HandsOverRows(const CtaWork& work, int warpgroup) {
  const sched::NodeSchedule& schedule = work.node->schedule;
  if (!work.in_range) return false;
  if (work.job->kind == static_cast<uint8_t>(sched::JobKind::kReduce) && SumsFewRows(schedule, work.m_block)) {
    return warpgroup == 0;
  }
  return WarpgroupRow0(work, warpgroup) < schedule.m;
}

// A SumsFewRows job whose tile is a whole non-SwiGLU tile inside C's TMA
// columns goes from the threads that sum it, fused ops applied, straight into
// C (no staging, no TMA store); the store thread only publishes it, after one
// staging handshake, as for a direct partial. Every part of a node reduced in
// parts does (the scheduler and the runtime see to it: a part cannot be
// staged, its TMA store would overwrite the other parts' rows).
__device__ inline bool ReduceStoresDirectly(const KernelNode& node, int32_t m_block, int32_t n_block) {
  return SumsFewRows(node.schedule, m_block) && node.activation != EpilogueActivation::kSwiGLU &&
         TileInsideTmaColumns(n_block, node.schedule.out_tile_n, node.c_tma_cols);
}

// The store thread of a reduce part, once the part is in C (and ordered
// before this by the staging handshake): counts the part done, and returns
// true for the one that completes its tile, which then publishes the tile's
// flag. The count word holds (epoch << 8) | parts done; a word of an older
// epoch (a launch that aborted part-way) counts as zero. (The tag keeps the
// epoch's low 24 bits: every launch rewrites the word, so an older tag is
// one of the last few launches', never 2^24 launches old.) Each CAS is a
// release of this part's stores and an acquire of the earlier parts', so the
// last part's flag release covers every part.
template <class Config>
__device__ inline bool FinishesReducePart(const CtaContext<Config>& ctx, const sched::NodeSchedule& schedule,
                                          int32_t m_block, int32_t n_block) {
  static_assert(KernelConfig::kBlockM <= 0xFF, "a tile's parts (at most one per row) fit the count's 8 bits");
  uint32_t* word = &ctx.params.flags[sched::ReducePartCountIndex(schedule, m_block, n_block)];
  const uint32_t tag = ctx.epoch << 8;
  const uint32_t parts = static_cast<uint32_t>(schedule.reduce_parts);
  // The first try guesses that this part is the last (the others' count in
  // the word): the last part is the one on the critical path, and then one
  // round trip settles it. A wrong guess returns the word to try again with.
  uint32_t seen = tag | (parts - 1);
  for (;;) {
    const uint32_t done = (seen & ~0xFFu) == tag ? (seen & 0xFFu) + 1 : 1;
    const uint32_t prior = ptx::atom_cas_acq_rel_gpu(word, seen, tag | done);
    if (prior == seen) return done == parts;
    seen = prior;
  }
}

// The fused ops SumFewRowPartials applies to one thread's column pair, in a
// plan whose 16-bit type is kHalf.
template <ElementType kHalf>
struct PairOps {
  bool apply = false;  // bias, activation, residual, in StageTile's order
  bool has_bias = false;
  float2 bias = make_float2(0.0f, 0.0f);
  EpilogueActivation activation = EpilogueActivation::kNone;
  const void* residual = nullptr;  // none when null; else row i's pair at element
  ElementType residual_type = kHalf;  // residual_at + i * residual_stride
  int64_t residual_at = 0;
  int64_t residual_stride = 0;

  // Row i's residual pair, when the ops add one (zero otherwise).
  __device__ float2 Residual(int i) const {
    return apply && residual != nullptr ? LoadPair<kHalf>(residual, residual_type, residual_at + i * residual_stride)
                                        : make_float2(0.0f, 0.0f);
  }
  // The ops on a sum, given its row's Residual.
  __device__ float2 Apply(float2 x, float2 row_residual) const {
    if (!apply) return x;
    if (has_bias) {  // no + 0 when there is none: it would turn -0 into +0
      x.x += bias.x;
      x.y += bias.y;
    }
    x.x = Activate(activation, x.x);
    x.y = Activate(activation, x.y);
    if (residual != nullptr) {
      x.x += row_residual.x;
      x.y += row_residual.y;
    }
    return x;
  }
};

// Where SumColumnPair puts row i's finished pair: fp32 into the staging row
// `staging` + i * kRowFloats (the tile's width), or, when `c` is set,
// converted straight into C's row i (`c` points at the thread's pair in the
// first row; C of the plan's 16-bit type kHalf or fp32).
template <int kRowFloats, ElementType kHalf>
struct PairSink {
  float* staging = nullptr;
  void* c = nullptr;
  int64_t c_stride = 0;  // elements
  ElementType c_type = kHalf;

  __device__ void Store(int i, float2 x) const {
    using Half = HalfType<kHalf>;
    if (c == nullptr) {
      *reinterpret_cast<float2*>(staging + i * kRowFloats) = x;
    } else if (c_type == kHalf) {
      reinterpret_cast<typename Half::T2*>(static_cast<typename Half::T*>(c) + i * c_stride)[0] = Half::FromFloat2(x);
    } else {
      reinterpret_cast<float2*>(static_cast<float*>(c) + i * c_stride)[0] = x;
    }
  }
};

// SumFewRowPartials' work for one thread's column pair: `partials` points at
// it in row 0 of split 0; row i's sum of the splits, in split order, then
// `ops`, goes to `out` (row i). kRows rows at a time, each with its
// residual loaded first: every load of a step is issued before the first add
// waits (a past-the-end row re-reads the last, unconditionally: a guarded
// load is a branch, and ptxas then waited for each load before the next,
// measured 2-3x slower). Traced on the H200 at 16 tokens, 1 row at a time
// summed a chain layer's 16 x 8 in ~11.5 us, 2 or 4 rows in 7-11; at one
// token, 2 rows (the row and its repeat) cost the chain 3 us against 1.
template <int kRows, class Ops, class Sink>
__device__ __forceinline__ void SumColumnPair(const float* partials, int64_t split_stride, int64_t padded_cols,
                                              int live_rows, int split_k, const Ops& ops, const Sink& out) {
#pragma unroll 1
  for (int i = 0; i < live_rows; i += kRows) {
    const float* row[kRows];
    float2 x[kRows], residual[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row[r] = partials + min(i + r, live_rows - 1) * padded_cols;
      x[r] = make_float2(0.0f, 0.0f);
      residual[r] = i + r < live_rows ? ops.Residual(i + r) : make_float2(0.0f, 0.0f);
    }
#pragma unroll 8
    for (int split = 0; split < split_k; ++split) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float2 v = __ldcg(reinterpret_cast<const float2*>(row[r] + split * split_stride));
        x[r].x += v.x;
        x[r].y += v.y;
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (i + r < live_rows) out.Store(i + r, ops.Apply(x[r], residual[r]));
    }
  }
}

// Split-K reduce, part 2 for a SumsFewRows tile. SumPartials leaves such a
// sum to the one warp that owns the live rows, 64 loads of 8 rows x 8 bytes
// each per lane and split, with 128 accumulators held (traced at 16 tokens:
// 9.8 us for a chain layer's 4 splits, 23.9 us for the MLP down projection's
// 8; bench/NOTES.md v1.12). Here each thread owns one column pair of its
// warpgroup's rows (a warp reads 256 contiguous bytes per load) and sums it
// split after split (SumColumnPair): the same adds in the same order as
// SumPartials, so the same bits. With SumsWithBothWarpgroups, warpgroup 1
// sums the second half of the rows (more loads in flight; the sum is bound
// by their latency).
// - A ReduceStoresDirectly tile (*stored): the threads also apply the fused
//   ops to their pairs in StageTile's order, with the bias and the rows'
//   residuals loaded before the sums (StageTile makes a round trip per panel
//   for them), and store the results straight into C. The caller then hands
//   the tile to the store thread with one staging handshake, which orders
//   every thread's stores (warpgroup 1's through the barrier here) before the
//   flag release.
// - Otherwise (SwiGLU, a tile past C's TMA columns), each row's sum goes to
//   its row of warpgroup 0's staging buffers, and from there into the
//   accumulator layout of `acc` (rows past M are zero) for StageOutput. The
//   buffers are waited for as that staging will wait for them, without
//   moving the cursor, so those waits then pass at once.
// Warpgroup 1 returns once its rows are in place, with nothing to stage.
// `partials_ready`: WaitForPartials' result in this warpgroup; false (the
// launch is aborting) skips the sum and leaves whatever the buffers hold,
// with every wait and meeting as in a sum.
template <class Config>
__device__ inline void SumFewRowPartials(const CtaContext<Config>& ctx, const CtaWork& work, int warpgroup,
                                         const RingCursor& staging, bool partials_ready,
                                         float (&acc)[Config::kAccumulators], bool* stored) {
  static_assert(KernelConfig::kStagingBuffers == 2, "the sums land in both staging buffers");
  static_assert(Config::kBlockN <= 2 * 128, "at most one column pair per thread of the warpgroup");
  static_assert(sched::kFewRowReduceRows * Config::kBlockN * 4 <=
                    KernelConfig::kStagingBuffers * KernelConfig::kStagingPanelBytes,
                "a few-row tile's sums fit in both staging buffers");
  const KernelNode& node = *work.node;
  const sched::NodeSchedule& schedule = node.schedule;
  const EpilogueFields fields(node);
  // A reduce job's node keeps every split's partial (reduce_parts >= 1, so
  // sched::PartialSlices(schedule) == split_k): the sum and the discards
  // below cover exactly the node's slices.
  const int split_k = schedule.split_k;
  const int part = work.job->split;
  const ReduceRows job_rows = ReduceRowsOfJob(schedule, work.m_block, part);
  const int64_t row0 = job_rows.row0;
  const int live_rows = job_rows.rows;  // 1 .. kFewRowReduceRows
  const bool both = live_rows > 1;  // SumsWithBothWarpgroups, as the caller decided it
  const bool direct = ReduceStoresDirectly(node, work.m_block, work.n_block);
  *stored = direct;
  // Row i's sum goes to staging row i: both buffers of warpgroup 0, which are
  // adjacent (unless direct).
  float* sums = reinterpret_cast<float*>(ctx.staging_panel(0, 0));
  if (warpgroup == 0 && !direct) {
    RingCursor second = staging;
    second.Advance(KernelConfig::kStagingBuffers);
    WaitForStaging(ctx, 0, staging);
    WaitForStaging(ctx, 0, second);
  }
  // With both warpgroups, warpgroup 1 may write the buffers once warpgroup 0
  // has waited for them.
  if (both && !direct) ConsumersMeet(ctx);
  const int first_half = (live_rows + 1) / 2;
  const int first_row = both && warpgroup == 1 ? first_half : 0;
  const int rows = both ? (warpgroup == 0 ? first_half : live_rows - first_half) : live_rows;

  const int t = threadIdx.x % 128;
  const PartialLayout layout(ctx, schedule);
  const int64_t col = int64_t{work.n_block} * Config::kBlockN + 2 * t;  // this thread's pair
  const float* partials = layout.At(row0 + first_row, col);
  // Tiles of 128 columns: the warpgroup's first 64 threads, one pair each.
  if (partials_ready && t < Config::kBlockN / 2) {
    PairOps<Config::kHalf> ops;
    if (direct) {
      ops.apply = true;
      ops.has_bias = fields.bias != nullptr;
      if (ops.has_bias) ops.bias = LoadPair<Config::kHalf>(fields.bias, fields.bias_type, col);
      ops.activation = fields.activation;
      ops.residual = fields.residual;
      ops.residual_type = fields.residual_type;
      ops.residual_at = (row0 + first_row) * fields.residual_stride + col;
      ops.residual_stride = fields.residual_stride;
    }
    PairSink<Config::kBlockN, Config::kHalf> sink;
    if (direct) {  // a whole tile: output column = tile column
      sink.c_type = node.out_type;
      sink.c_stride = fields.c_stride;
      const int64_t at = (row0 + first_row) * fields.c_stride + col;
      sink.c = node.out_type == Config::kHalf ? static_cast<void*>(static_cast<HalfOf<Config>*>(fields.c) + at)
                                               : static_cast<void*>(static_cast<float*>(fields.c) + at);
    } else {
      sink.staging = sums + first_row * Config::kBlockN + 2 * t;
    }
    if (rows == 1) {
      SumColumnPair<1>(partials, layout.split_stride, layout.row_stride, rows, split_k, ops, sink);
    } else {
      SumColumnPair<2>(partials, layout.split_stride, layout.row_stride, rows, split_k, ops, sink);
    }
    DiscardWarpPartials(partials - 2 * (t % 32), rows, layout.row_stride, split_k, layout.split_stride);
  }
  // Every row is in place.
  if (both) {
    ConsumersMeet(ctx);
    if (warpgroup == 1) return;
  } else {
    ConsumerBarrierAnd(0, true);
  }

  // Into the accumulator layout: lane l of warp w holds rows 16 w + l / 4
  // (registers 4c, 4c + 1) and 8 further (4c + 2, 4c + 3), columns
  // 8c + 2 (l % 4) + {0, 1}.
  const int warp = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;
  // NOTE: a direct tile gets zeros here rather than an early return: with
  // that return (or with its staging handshake in here) ptxas spilled 11 KB
  // in the split-K kernel, against 0.46 KB.
  const int row_lo = warp * 16 + lane / 4;
  const int rows_in_acc = direct ? 0 : live_rows;
  const float* lo = sums + row_lo * Config::kBlockN + 2 * (lane % 4);
  const float* hi = lo + 8 * Config::kBlockN;
#pragma unroll
  for (int c = 0; c < Config::kAccumulators / 4; ++c) {
    const float2 v_lo = row_lo < rows_in_acc ? *reinterpret_cast<const float2*>(lo + 8 * c) : make_float2(0.0f, 0.0f);
    const float2 v_hi =
        row_lo + 8 < rows_in_acc ? *reinterpret_cast<const float2*>(hi + 8 * c) : make_float2(0.0f, 0.0f);
    acc[4 * c] = v_lo.x;
    acc[4 * c + 1] = v_lo.y;
    acc[4 * c + 2] = v_hi.x;
    acc[4 * c + 3] = v_hi.y;
  }
  // Every read of the buffers comes before the epilogue writes its first panel.
  ConsumerBarrierAnd(0, true);
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_SPLITK_REDUCE_CUH_
