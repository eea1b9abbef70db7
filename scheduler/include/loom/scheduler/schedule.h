// loom/scheduler/schedule.h: the lowered form of a GEMM graph that the
// persistent kernel consumes, and the pure functions that produce it.
//
// Plain C++: the structs and the LOOM_HOST_DEVICE functions compile for the
// host and the device alike; nothing here calls the CUDA runtime. Everything is
// a pure function of the problem and the options, so it is tested on the CPU.
//
//   std::vector<loom::sched::NodeProblem> problems = ...;  // one per GEMM node
//   loom::sched::SchedulerOptions options{.num_sms = 132, .max_clusters = 66};
//   absl::StatusOr<loom::sched::Schedule> s = loom::sched::Lower(problems, options);
//   // s->queue is a topological order of cluster tile jobs; s->nodes[i] says
//   // how node i was tiled; flags live at s->nodes[i].flag_base + tile index.
#ifndef LOOM_SCHEDULER_SCHEDULE_H_
#define LOOM_SCHEDULER_SCHEDULE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

namespace loom::sched {

// One CTA's output tile and k-block size, in elements. `n` counts accumulator
// columns (a SwiGLU node's tile writes n / 2 output columns).
struct TileShape {
  int32_t m = 128;
  int32_t n = 256;
  int32_t k = 64;
};

// Which operand the CTAs of a cluster share (and TMA multicasts). A cluster job
// covers `cluster_size` CTA tiles side by side:
//   kShareB: CTA rank r computes m-block (job.m_block + r), same n-block; B is shared.
//   kShareA: CTA rank r computes n-block (job.n_block + r), same m-block; A is shared.
enum class ClusterShare : uint8_t { kShareB = 0, kShareA = 1 };

// The direction in which consecutive jobs of one swizzle group advance:
//   kAlongM: down a column of cluster tiles `group_size` clusters wide in N... see
//   RasterizeClusterTiles for the exact order.
enum class RasterOrder : uint8_t { kAlongM = 0, kAlongN = 1 };

// The kernel sums the split-K partials of a tile with at most this many rows
// inside M (decode) with both consumer warpgroups, one column pair per
// thread, for any split count (ops/kernel/splitk_reduce.cuh, which checks
// that the two agree); ChooseSplitK (tiling.h) counts on it, and a reduce in
// parts (NodeSchedule::reduce_parts) gives each job at most this many rows.
inline constexpr int32_t kFewRowReduceRows = 16;

enum class JobKind : uint8_t {
  kGemm = 0,    // accumulate A·Bᵀ over [k_block_begin, k_block_end); epilogue if split_k == 1, or
                // if it is the last split of a node whose last split sums (FinishesSplitTile)
  kReduce = 1,  // sum the split-K partials of a tile (or of one row part of it) in split order,
                // then the epilogue
};

// One cluster tile job. 16 bytes, stored in device memory in queue order.
struct TileJob {
  uint16_t node = 0;
  uint8_t kind = 0;           // JobKind
  uint8_t split = 0;          // kGemm: split-K index; kReduce: row part (NodeSchedule::reduce_parts)
  uint32_t m_block = 0;       // the cluster's first m-block
  uint32_t n_block = 0;       // the cluster's first n-block
  uint16_t k_block_begin = 0; // [begin, end), in k-blocks of TileShape::k
  uint16_t k_block_end = 0;
};
static_assert(sizeof(TileJob) == 16, "TileJob must stay a 16-byte record");

// A dependency of a node on a producer node, device-friendly form of
// loom::DataDependency: element (r, c) of the consumer's operand is element
// (r + row_offset, c + col_offset) of the producer's output.
enum class DependencyOperand : uint8_t { kA = 0, kB = 1, kBias = 2, kResidual = 3 };
struct DependencyEdge {
  int32_t producer = 0;
  uint8_t operand = 0;       // DependencyOperand
  uint8_t whole_tensor = 0;  // 1: wait for every tile of the producer
  int64_t row_offset = 0;
  int64_t col_offset = 0;
};

// What the scheduler needs to know of one GEMM node.
struct NodeProblem {
  int64_t m = 0;
  int64_t n = 0;  // accumulator columns
  int64_t k = 0;
  bool swiglu = false;                     // output is n / 2 columns wide
  std::vector<DependencyEdge> dependencies;  // producers have smaller indices
  std::string label = "";                    // how errors name the node; empty: "node <index>"
};

// How errors name node `index` of `problems` (its label, or "node <index>").
std::string ProblemLabel(const std::vector<NodeProblem>& problems, int index);

// Floats of one 128-byte line: where each split-K node's partials start in
// the workspace (NodeSchedule::workspace_offset is a multiple of it).
inline constexpr int64_t kWorkspaceLineElements = 32;

// How one node was lowered.
struct NodeSchedule {
  int64_t m = 0, n = 0, k = 0;
  int64_t out_cols = 0;        // n, or n / 2 for SwiGLU
  int32_t out_tile_n = 0;      // output columns per CTA tile
  int32_t m_blocks = 0;        // ceil(m / tile.m)
  int32_t n_blocks = 0;        // ceil(n / tile.n)
  int32_t k_blocks = 0;        // ceil(k / tile.k)
  ClusterShare share = ClusterShare::kShareB;
  RasterOrder raster = RasterOrder::kAlongM;
  // Bit 1 << o set when some edge of this node is on DependencyOperand o
  // (Lower), so that the kernel asks of an operand without producers
  // without reading the edges (HasProducerOperand). In the padding before
  // group_size: the fields after it keep their offsets.
  uint8_t producer_operands = 0;
  // 1: the kernels may wait for A's producers a run of flags at a time
  // (AFlagRunsAllowed; ARunOfBox); 0: granule by granule only. In the same
  // padding.
  uint8_t a_flag_runs = 0;
  int32_t group_size = 1;      // swizzle group width, in cluster tiles
  int32_t split_k = 1;         // number of K splits (1: none)
  // Output tile (mb, nb) has flag flag_base + mb * flag_row_stride + nb
  // (OutputFlagIndex). flag_row_stride is n_blocks, unless Lower gave this
  // node's tile rows and those of the other producers of one consumer's A
  // one flag row together (FlagGroupsOf, lower.cc): then a row block's flags
  // run on from one producer's columns into the next's.
  int32_t flag_base = 0;
  // Split-K, with P = PartialSlices(*this) partials a tile:
  int32_t partial_flag_base = -1;  // tile t, split s < P -> partial_flag_base + t * P + s
  // In the padding before workspace_offset: the fields after it keep their
  // offsets (the kernel's hot paths read them).
  int32_t flag_row_stride = 0;
  // fp32 partials, [P][m_blocks*tile.m][n_blocks*tile.n], from a multiple of
  // kWorkspaceLineElements
  int64_t workspace_offset = -1;
  int32_t dependency_begin = 0;    // this node's edges: dependencies[begin, begin + count)
  int32_t dependency_count = 0;
  // Every k-block from one multiple of this to the next reads the same
  // producer tiles of A (AWaitKBlocks): the A loader checks A's producers
  // once per such granule at most, and reads several granules' flags at once.
  int32_t a_wait_k_blocks = 1;
  // Split-K: reduce jobs per cluster tile (ChooseReduceParts). 0: none, the
  // last split's job adds the other splits' partials to its own accumulators
  // and runs the epilogue itself (FinishesSplitTile; it writes no partial).
  // 1: one job sums every row of its tiles. More: reduce job `part`
  // (TileJob::split) sums rows [part * reduce_part_rows, +reduce_part_rows) of each of its
  // tiles, on its own cluster, and stores them straight into C; the part that
  // finishes a tile last publishes its output flag, the parts counting in
  // flag part_count_base + tile index (ReducePartCountIndex).
  // NOTE: last, so that the fields the kernel's hot paths read keep their
  // offsets: reduce_part_rows inserted after reduce_parts cost the split-K
  // kernel 24 more bytes of spills, and the one-token chain ~1.8 us
  // (bench/NOTES.md v1.14).
  int32_t reduce_parts = 1;
  int32_t reduce_part_rows = 0;  // 1 .. kFewRowReduceRows when reduce_parts > 1
  int32_t part_count_base = -1;
  // Where the last split sums (reduce_parts == 0): the k-blocks it takes
  // beyond an even share (SplitKRange, ChooseLastSplitExtra in tiling.h), so
  // that the others' partials are ready when its main loop ends; negative,
  // fewer (SchedulerOptions::first_split_lead_k_blocks). The jobs carry
  // their k-block ranges; only the scheduler reads this.
  int32_t last_split_extra_k_blocks = 0;
};

struct SchedulerOptions {
  TileShape tile;
  int32_t cluster_size = 2;   // CTAs per cluster (1 or 2)
  int32_t num_sms = 132;      // SMs of the device (for wave and split-K decisions)
  int32_t max_clusters = 66;  // co-resident clusters the kernel will run
  int32_t split_k = 0;        // 0: the scheduler decides per node; >= 1: forced for every node
  int32_t group_size = 0;     // 0: the scheduler decides per node
  bool reduce_in_parts = true;  // false: one reduce job per tile (NodeSchedule::reduce_parts = 1)
  int32_t reduce_part_rows = 0;  // 0: the scheduler decides; 1 .. kFewRowReduceRows: rows of each part
  // A node of at most kMaxSplitsSummedByLast splits (tiling.h) whose tiles
  // would each be summed whole by one reduce job (not in parts, not a
  // few-row decode tile) has its last split sum them instead
  // (NodeSchedule::reduce_parts = 0); false: the reduce jobs.
  bool sum_in_last_split = true;
  // The k-blocks the last split of such a node takes beyond an even share
  // (NodeSchedule::last_split_extra_k_blocks): -1, the scheduler decides
  // (ChooseLastSplitExtra, tiling.h); >= 0, that many (at most k_blocks -
  // split_k) wherever the last split sums.
  int32_t last_split_extra_k_blocks = -1;
  // Where a node's A is read by a consumer that splits K in s > 1 (the
  // narrow kernel's pair split), the producer's cluster columns are queued
  // from s equal runs in turn (0, C/s, 2C/s, ..., 1, C/s + 1, ...:
  // Schedule::column_runs, NodeJobs) instead of left to right, so that each
  // split's k-range of A fills at the same pace rather than the last
  // split's only at the producer's end.
  bool interleave_split_producers = false;
  // Where a node's last split sums (NodeSchedule::reduce_parts == 0) and
  // its tiles make at least two waves of jobs (max_clusters), all its tiles
  // but the last one to two waves' (in NodeJobs's order) are multiplied
  // whole, each by one job over all of K (WholeTileOfSplitNode) that writes
  // no partial and sums none: the split is kept for the jobs that end the
  // node, where it evens out when the SMs finish (Schedule::whole_tiles).
  bool whole_leading_tiles = false;
  // Where a node splits K in two, its last split sums (NodeSchedule::
  // reduce_parts == 0) and all its jobs fit one wave (max_clusters), the
  // first split takes this many k-blocks more than the last
  // (NodeSchedule::last_split_extra_k_blocks = -first_split_lead_k_blocks):
  // the first splits are queued, so fetched, before every last split, which
  // waits for their partials. 0: even halves (or last_split_extra_k_blocks).
  // On each such node the first split's end is then moved down onto a
  // multiple of split_granule_k_blocks and kept a granule short of K, and
  // the lead is what that leaves (0 where it falls to the middle).
  int32_t first_split_lead_k_blocks = 0;
  // The k-blocks a lead moves a split's start by at a time (the narrow
  // kernel's ring stage); >= 1.
  int32_t split_granule_k_blocks = 1;
  // How errors about these options name them: "<name>.<field> must be ...".
  // The runtime passes its own options' name (CompileOptions), whose fields
  // a caller sets carry the same names as these.
  std::string name = "SchedulerOptions";
};

struct Schedule {
  TileShape tile;
  int32_t cluster_size = 2;
  std::vector<NodeSchedule> nodes;
  std::vector<DependencyEdge> dependencies;  // grouped by consumer node
  std::vector<TileJob> queue;                // topological, wavefront order
  int32_t num_flags = 0;  // output-tile flags + split-K partial flags + reduce part counts
  int64_t workspace_elements = 0;            // fp32 elements of split-K partials
  int32_t queue_clusters = 0;  // the clusters OrderQueue ordered and timed the queue for
  // Per node, the runs of cluster columns NodeJobs takes in turn: the most
  // K splits of a consumer that reads its output as A, where
  // SchedulerOptions::interleave_split_producers; empty: every node's
  // columns left to right.
  std::vector<int32_t> column_runs;
  // Per node, how many of its cluster tiles, the first in NodeJobs's order,
  // one job multiplies whole in a node that splits K
  // (SchedulerOptions::whole_leading_tiles); empty: none anywhere.
  std::vector<int64_t> whole_tiles;
};

// InvalidArgument unless `edge`, an edge of node `consumer`, names an earlier
// node, one of the four operands and offsets within +-2^62 (what Lower
// accepts, and what the reference executor asks of a schedule it is given);
// the message starts "has ...", for the caller to say which edge.
absl::Status CheckDependencyEdge(const DependencyEdge& edge, int consumer);

// Lowers a graph (nodes in a valid topological order, as GemmGraph keeps them)
// into a Schedule. InvalidArgument for problems it cannot lower (a dimension
// past the job encoding's range, a dependency on a later node).
absl::StatusOr<Schedule> Lower(const std::vector<NodeProblem>& problems,
                               const SchedulerOptions& options);

// --- Functions shared by the host, the kernel and the CPU reference. ---

// The CTA tile that cluster rank `rank` computes for `job`.
struct CtaTile {
  int32_t m_block;
  int32_t n_block;
};
LOOM_HOST_DEVICE inline CtaTile CtaTileOf(const TileJob& job, ClusterShare share, int rank) {
  return share == ClusterShare::kShareB
             ? CtaTile{static_cast<int32_t>(job.m_block) + rank, static_cast<int32_t>(job.n_block)}
             : CtaTile{static_cast<int32_t>(job.m_block), static_cast<int32_t>(job.n_block) + rank};
}

// A half-open box of producer tiles: m-blocks [m_begin, m_end) x n-blocks [n_begin, n_end).
struct TileBox {
  int32_t m_begin = 0, m_end = 0, n_begin = 0, n_end = 0;
  LOOM_HOST_DEVICE bool empty() const { return m_begin >= m_end || n_begin >= n_end; }
};

// ProducerTiles (below) for an edge that is not whole_tensor, from the fields
// it uses: the producer's m, out_cols and out_tile_n and the edge's offsets
// (the kernel keeps a copy of them beside the consumer: KernelNode::a_producer).
LOOM_HOST_DEVICE inline TileBox ProducerTilesOffset(int64_t producer_m, int64_t producer_out_cols,
                                                    int32_t producer_out_tile_n, int32_t tile_m,
                                                    int64_t row_offset, int64_t col_offset, int64_t row_begin,
                                                    int64_t row_end, int64_t col_begin, int64_t col_end) {
  int64_t r0 = row_begin + row_offset, r1 = row_end + row_offset;
  int64_t c0 = col_begin + col_offset, c1 = col_end + col_offset;
  if (r0 < 0) r0 = 0;
  if (c0 < 0) c0 = 0;
  if (r1 > producer_m) r1 = producer_m;
  if (c1 > producer_out_cols) c1 = producer_out_cols;
  if (r0 >= r1 || c0 >= c1) return TileBox{};
  // Every bound is now in [0, r1] or [0, c1]. In 32 bits where they fit (in
  // every plan but ones of 2^31 rows or columns): the kernel's A loader
  // works out a dependent job's producer tiles here before its first load,
  // and the four 64-bit divisions took ~300 of the ~1.5-2 kcycles that costs
  // (bench/NOTES.md v1.67).
  if (r1 <= INT32_MAX && c1 <= INT32_MAX) {
    const uint32_t m = static_cast<uint32_t>(tile_m), n = static_cast<uint32_t>(producer_out_tile_n);
    return TileBox{static_cast<int32_t>(static_cast<uint32_t>(r0) / m),
                   static_cast<int32_t>(static_cast<uint32_t>(r1 - 1) / m + 1),
                   static_cast<int32_t>(static_cast<uint32_t>(c0) / n),
                   static_cast<int32_t>(static_cast<uint32_t>(c1 - 1) / n + 1)};
  }
  return TileBox{static_cast<int32_t>(r0 / tile_m), static_cast<int32_t>((r1 - 1) / tile_m + 1),
                 static_cast<int32_t>(c0 / producer_out_tile_n),
                 static_cast<int32_t>((c1 - 1) / producer_out_tile_n + 1)};
}

// The producer's output tiles that hold the consumer operand's elements
// [row_begin, row_end) x [col_begin, col_end) under `edge`, clipped to the
// producer's output. Every tile of the producer when edge.whole_tensor is set.
LOOM_HOST_DEVICE inline TileBox ProducerTiles(const NodeSchedule& producer, const TileShape& tile,
                                              const DependencyEdge& edge, int64_t row_begin,
                                              int64_t row_end, int64_t col_begin, int64_t col_end) {
  if (edge.whole_tensor) return TileBox{0, producer.m_blocks, 0, producer.n_blocks};
  return ProducerTilesOffset(producer.m, producer.out_cols, producer.out_tile_n, tile.m, edge.row_offset,
                             edge.col_offset, row_begin, row_end, col_begin, col_end);
}

// NodeSchedule::a_wait_k_blocks for `node`, whose edges are already in
// schedule.dependencies: the largest g such that, for every A edge that is
// not whole-tensor, producer tile column boundaries fall on multiples of g
// k-blocks in the consumer's K (so k-blocks [j * g, (j + 1) * g) all read one
// producer tile column). 1 when a boundary is not k-block aligned;
// kAWaitWholeJob when A has no such edge (one wait per job covers everything).
inline constexpr int32_t kAWaitWholeJob = int32_t{1} << 30;
int32_t AWaitKBlocks(const Schedule& schedule, const NodeSchedule& node);

// NodeSchedule::a_flag_runs for `node`, whose edges are already in
// schedule.dependencies: whether granule j of a run of A's producer flags
// (ARunOfBox, worked out from one granule's box of one edge and moved on a
// tile column a granule) reads exactly the run's tiles j, so that a job may
// start waiting at any granule of a run. Two things break it:
//   - an A edge (not whole_tensor) whose producer's tile columns do not start
//     on a multiple of its out_tile_n in A's columns (col_offset): a granule
//     of whole tiles' width then straddles two tile columns;
//   - two A edges that give columns of one row block of A in common: a run
//     follows one edge's tiles and would not wait for the other's (a
//     whole_tensor edge beside any other A edge counts as in common).
// Producers side by side in A's columns (fan-in), each aligned, keep runs.
bool AFlagRunsAllowed(const Schedule& schedule, const NodeSchedule& node);

// The nodes whose output tile flags Lower lays out together, each group in
// the order of its flags within a row of tiles, the groups in the order of
// their first node; every node in exactly one group. A group of several is
// the producers of one consumer's A (its edges that are not whole_tensor):
// at least two, distinct, each with tiles and in no earlier group, of one
// m_blocks and one row_offset, in the order of the columns of A they give
// (the first consumer to find such producers claims them). Row block r of
// the group is then one run of flags, producer after producer
// (NodeSchedule::flag_row_stride), which a job's first run of A flags can
// cover whole (KernelNode::first_a_run; laid out producer by producer, two
// row blocks split it at the first seam). `nodes` are the nodes tiled
// (m_blocks, n_blocks), one per problem.
std::vector<std::vector<int>> FlagGroupsOf(const std::vector<NodeProblem>& problems,
                                           const std::vector<NodeSchedule>& nodes);

// Whether some dependency edge of `node` is on `operand`
// (NodeSchedule::producer_operands).
LOOM_HOST_DEVICE inline bool HasProducerOperand(const NodeSchedule& node, DependencyOperand operand) {
  return (node.producer_operands >> static_cast<int>(operand)) & 1;
}

// The flag of output tile (m_block, n_block) of a node whose tile flags start
// at flag_base, flag_row_stride flags from one row of tiles to the next.
LOOM_HOST_DEVICE inline int32_t TileFlagIndex(int32_t flag_base, int32_t flag_row_stride, int32_t m_block,
                                              int32_t n_block) {
  return flag_base + m_block * flag_row_stride + n_block;
}

LOOM_HOST_DEVICE inline int32_t OutputFlagIndex(const NodeSchedule& node, int32_t m_block,
                                                int32_t n_block) {
  return TileFlagIndex(node.flag_base, node.flag_row_stride, m_block, n_block);
}

// A run of A's producer flags: granule j of A (the a_wait_k_blocks k-blocks
// from the run's first granule on, j < granules) reads exactly the producer
// tiles whose flags are first_flag + j * tiles_per_granule onwards,
// tiles_per_granule of them (a power of two, 1 << tiles_shift), all whole.
// granules == 0: no run (the granules are waited for one by one).
struct AFlagRun {
  int32_t first_flag = 0;
  int32_t granules = 0;
  int32_t tiles_per_granule = 1;
  int32_t tiles_shift = 0;
};

// The granules of A (of `granule` k-blocks each) from the one k-block kb
// falls in to the one before kb_end: what a run from kb may cover of a job
// that ends at kb_end.
LOOM_HOST_DEVICE inline int32_t GranulesLeft(int32_t kb, int32_t kb_end, int32_t granule) {
  return (kb_end - kb / granule * granule + granule - 1) / granule;
}

// The run that starts at a granule of A whose producer tiles are `box` (of a
// producer whose tile flags start at flag_base, flag_row_stride from one row
// of its n_blocks tiles to the next, out_tile_n output columns each, out_cols
// in all), when A has that one producer edge:
// a granule is granule_cols columns of A, granules_left of them remain in
// the job, and at most max_tiles_per_granule tiles may make one granule (the
// kernel's poll finds a flag's granule with a shift). The run stops before
// a ragged last tile column (its k-block may also read whatever follows the
// producer's columns in A, which no flag of the run covers). Worked out by
// the narrow kernel's A loader (AProducerRun) and, for a job's first run, by
// the runtime (KernelNode::first_a_run).
LOOM_HOST_DEVICE inline AFlagRun ARunOfBox(int32_t flag_base, int32_t flag_row_stride, int32_t n_blocks,
                                           int32_t out_tile_n, int64_t out_cols, const TileBox& box,
                                           int32_t granule_cols, int32_t granules_left,
                                           int32_t max_tiles_per_granule) {
  AFlagRun run;
  if (box.empty()) return run;
  const int32_t rows = box.m_end - box.m_begin, columns = box.n_end - box.n_begin;
  const bool ragged = int64_t{n_blocks} * out_tile_n > out_cols;
  const int32_t columns_left = n_blocks - box.n_begin - (ragged ? 1 : 0);
  if (rows != 1 || granule_cols % out_tile_n != 0 || granule_cols / out_tile_n != columns ||
      columns > max_tiles_per_granule || (columns & (columns - 1)) != 0) {
    return run;
  }
  run.first_flag = TileFlagIndex(flag_base, flag_row_stride, box.m_begin, box.n_begin);
  run.tiles_per_granule = columns;
  while ((1 << run.tiles_shift) < columns) ++run.tiles_shift;
  const int32_t runs_left = columns_left / columns;
  run.granules = granules_left < runs_left ? granules_left : runs_left;
  return run;
}

// How many splits of each tile of a split-K node write a partial (flag and
// workspace slice): all, or all but the last where the last sums
// (NodeSchedule::reduce_parts == 0). 0 without split-K.
LOOM_HOST_DEVICE inline int32_t PartialSlices(const NodeSchedule& node) {
  if (node.split_k <= 1) return 0;
  return node.reduce_parts == 0 ? node.split_k - 1 : node.split_k;
}

// The flag of split `split`'s partial of tile (m_block, n_block) of a split-K
// node (layout: NodeSchedule::partial_flag_base).
LOOM_HOST_DEVICE inline int32_t PartialFlagIndex(const NodeSchedule& node, int32_t m_block, int32_t n_block,
                                                 int32_t split) {
  return node.partial_flag_base + (m_block * node.n_blocks + n_block) * PartialSlices(node) + split;
}

// Whether `job` is the last split of a node whose last split sums the
// others' partials (NodeSchedule::reduce_parts == 0): it waits for their
// partial flags after its main loop, adds them in split order to its own
// accumulators, runs the epilogue and publishes the tile's output flag.
LOOM_HOST_DEVICE inline bool FinishesSplitTile(const NodeSchedule& node, const TileJob& job) {
  return job.kind == static_cast<uint8_t>(JobKind::kGemm) && node.split_k > 1 && node.reduce_parts == 0 &&
         job.split == node.split_k - 1;
}

// Whether `job` runs the epilogue (and so publishes output flags, not a
// partial): kGemm jobs of unsplit nodes, the last split of a node whose last
// split sums (FinishesSplitTile), and kReduce jobs.
LOOM_HOST_DEVICE inline bool JobRunsEpilogue(const NodeSchedule& node, const TileJob& job) {
  return job.kind == static_cast<uint8_t>(JobKind::kReduce) || node.split_k <= 1 || FinishesSplitTile(node, job);
}

// Whether `job`, a FinishesSplitTile job, multiplies its tile over all of K
// (Schedule::whole_tiles): the last split's index from k-block 0, which no
// last split of a tile split in two or more parts has (each part keeps a
// k-block at least). It sums no partials.
LOOM_HOST_DEVICE inline bool WholeTileOfSplitNode(const NodeSchedule& node, const TileJob& job) {
  return FinishesSplitTile(node, job) && job.k_block_begin == 0;
}

// Whether `job` multiplies one part of its tile's K (its split, `job.split`):
// a kGemm job of a node that splits K, but not a whole tile
// (WholeTileOfSplitNode).
LOOM_HOST_DEVICE inline bool MultipliesPartOfK(const NodeSchedule& node, const TileJob& job) {
  return job.kind == static_cast<uint8_t>(JobKind::kGemm) && node.split_k > 1 && !WholeTileOfSplitNode(node, job);
}

// PartialsSummed (below) in a schedule without whole tiles (the tiled
// kernel's: only the narrow kernel's splits keep tiles whole).
LOOM_HOST_DEVICE inline int32_t PartialsSummedWithoutWholeTiles(const NodeSchedule& node, const TileJob& job) {
  if (job.kind == static_cast<uint8_t>(JobKind::kReduce)) return node.split_k;
  return FinishesSplitTile(node, job) ? node.split_k - 1 : 0;
}

// How many split-K partials of each of its tiles `job` sums, splits 0, 1, ...:
// every split's for a kReduce job, the earlier splits' for a
// FinishesSplitTile job that does not multiply its tile whole, else none.
LOOM_HOST_DEVICE inline int32_t PartialsSummed(const NodeSchedule& node, const TileJob& job) {
  return WholeTileOfSplitNode(node, job) ? 0 : PartialsSummedWithoutWholeTiles(node, job);
}

// The word in which the reduce parts of tile (m_block, n_block) of a node
// with reduce_parts > 1 count themselves (layout: NodeSchedule::part_count_base).
LOOM_HOST_DEVICE inline int32_t ReducePartCountIndex(const NodeSchedule& node, int32_t m_block,
                                                     int32_t n_block) {
  return node.part_count_base + m_block * node.n_blocks + n_block;
}

// The rows of its CTA tile that a reduce job sums, relative to the tile's
// first row: every row for reduce_parts == 1, else part `part`'s
// reduce_part_rows (clipped to M by the caller).
struct RowRange {
  int32_t begin = 0;
  int32_t end = 0;
};
LOOM_HOST_DEVICE inline RowRange ReduceRowsOf(const NodeSchedule& node, const TileShape& tile, int part) {
  if (node.reduce_parts <= 1) return RowRange{0, tile.m};
  return RowRange{part * node.reduce_part_rows, (part + 1) * node.reduce_part_rows};
}

}  // namespace loom::sched

#endif  // LOOM_SCHEDULER_SCHEDULE_H_
