// loom/scheduler/tiling.h: how one GEMM node is cut into CTA tiles, grouped
// into cluster tiles and split along K. The per-node pieces of Lower(), exposed
// so each decision can be tested (and printed) on its own.
//
//   loom::sched::SchedulerOptions options{.tile = {128, 256, 64}, .cluster_size = 2};
//   absl::StatusOr<loom::sched::NodeSchedule> node =
//       loom::sched::TileNode(problem, /*node_index=*/3, options);
//   // node->m_blocks, n_blocks, k_blocks, share, raster, group_size, split_k are
//   // set; flags, workspace and dependencies are left to Lower().
//   loom::sched::ClusterGrid grid = loom::sched::ClusterGridOf(*node, 2);
//   loom::sched::KBlockRange r = loom::sched::SplitKRange(node->k_blocks, node->split_k, 0);
#ifndef LOOM_SCHEDULER_TILING_H_
#define LOOM_SCHEDULER_TILING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loom/scheduler/schedule.h"

namespace loom::sched {

// Limits of the 16-byte TileJob encoding.
inline constexpr int64_t kMaxNodes = 65535;        // TileJob::node is 16-bit
inline constexpr int64_t kMaxKBlocks = 65535;      // TileJob::k_block_end is 16-bit
inline constexpr int32_t kMaxSplitK = 256;         // TileJob::split is 8-bit (0..255)
inline constexpr int64_t kMaxBlocksPerDim = INT32_MAX;  // NodeSchedule::m_blocks is int32
inline constexpr int32_t kMaxReduceParts = 8;      // a reduce part's bit in a uint8_t mask
// The most jobs a schedule queues (2^24, ~2^25 output tiles of 128 x 256
// unsplit): the queue is ordered on the host, job by job, and copied to the
// device at 16 bytes a job; a graph of more is refused before any of that is
// allocated (a node of 2^31 - 1 rows ran Compile out of host memory).
inline constexpr int64_t kMaxJobs = int64_t{1} << 24;

// The most splits whose tiles' last split sums the others' partials
// (SchedulerOptions::sum_in_last_split); more keep their reduce jobs, which
// sum on other clusters. Measured (bench/NOTES.md v1.44) against reduce
// jobs: at two and three splits faster or level in every case; at four 2-7%
// faster where the scheduler picks four (the MLP block at 200-256 tokens,
// the 200-row chain), 2-5% slower in the 512-token down projection forced
// to four; at six and eight 4-17% slower in the down projection at 512
// tokens and 13-16% at 300 tokens with eight.
inline constexpr int32_t kMaxSplitsSummedByLast = 4;

// What the last split's sum of one other split's partial costs, in k-blocks
// of main loop: reading and adding its 128 KB took ~5.5 us a tile in the
// 4096 chain at 300 rows, where a k-block of a 128 x 256 tile takes ~0.6 us
// (bench/NOTES.md v1.45).
inline constexpr int32_t kPartialCostKBlocks = 9;

// Where a tile's last split sums the others' partials: the split count, at
// most `splits` (ChooseSplitK's), that minimises the last split's main loop
// plus its sum, ceil(k_blocks / s) + (s - 1) * kPartialCostKBlocks (ties to
// more splits). Measured on the H200 (bench/NOTES.md v1.46): the 4096 chain
// at 150 / 200 / 256 rows (64 k-blocks: 3 splits instead of ChooseSplitK's
// 4) 262 / 262 / 266-267 us against 268 / 272-273 / 278; the MLP block at
// 200-256 tokens level (its down projection, 224 k-blocks, keeps 4).
int32_t SplitsSummedByLast(int32_t k_blocks, int32_t splits);

// Checks the options Lower() depends on: positive tile sizes, cluster_size 1 or
// 2, positive num_sms / max_clusters, split_k in [0, 256], group_size >= 0.
// InvalidArgument naming the option, the rule and the value.
absl::Status ValidateOptions(const SchedulerOptions& options);

// The dependency depth of each node: 0 for a node that reads no other node,
// else one more than the deepest node it reads. The nodes of one depth run
// side by side (a step of the graph). Edges from a node not earlier in the
// list (which Lower refuses) are left out.
std::vector<int32_t> NodeDepths(const std::vector<NodeProblem>& problems);

// Tiles node `node_index`: copies m, n, k; sets out_cols, out_tile_n,
// m/n/k_blocks, share, raster, group_size, split_k, reduce_parts and
// reduce_part_rows (reduce_parts 0 for a node of at most
// kMaxSplitsSummedByLast splits whose tiles would each be summed whole by
// one reduce job, when options.sum_in_last_split: its last split sums them,
// and unless options.split_k forces the splits, SplitsSummedByLast of them).
// flag_row_stride is n_blocks (Lower may join the node's flag rows with
// other producers': FlagGroupsOf). Leaves flag_base, partial_flag_base,
// workspace_offset and the dependency range to Lower().
//
// NOTE: a node with m or n == 0 has no tiles: m_blocks = n_blocks = 0 (so it
// has no jobs and no flags, and any consumer box of it is empty). A node with
// k == 0 and m, n > 0 has its tiles as usual, each job over zero k-blocks:
// the tiled kernel runs only its epilogue, on accumulators of zero (the
// runtime keeps such graphs off the narrow kernel).
//
// InvalidArgument naming the node for: negative dimensions; SwiGLU with odd n
// or odd tile.n; k_blocks past 65535; m_blocks or n_blocks past INT32_MAX.
// `has_consumers`: a later node reads this one's output (ChooseReduceParts).
// `step_cluster_tiles`: ChooseSplitK's, the cluster tiles of the node's whole
// dependency depth (Lower); 0 counts the node alone.
absl::StatusOr<NodeSchedule> TileNode(const NodeProblem& problem, int node_index,
                                      const SchedulerOptions& options, bool has_consumers = false,
                                      int64_t step_cluster_tiles = 0);

// How a cluster of two shares its tiles (schedule.h: ClusterShare).
// kShareB (the cluster's CTAs take consecutive m-blocks and share the weight
// tile B) when the node has an even number of m-blocks, or more than
// kMaxOddRowBlocksSharingA; kShareA for a single m-block. For an odd number
// of m-blocks up to kMaxOddRowBlocksSharingA, kShareB would leave one CTA of
// the last cluster row without a tile (it still streams its half of B, so the
// cluster costs as much as a full one): kShareA instead wherever it pads
// fewer CTA tiles (always when n_blocks is even; when n_blocks is odd, iff
// m_blocks < n_blocks).
ClusterShare ChooseShare(int32_t m_blocks, int32_t n_blocks);

// Measured on the H200 (bench/NOTES.md v1.43): kShareA at 3-15 odd m-blocks
// beat kShareB by about the idle CTA's share, 1 / (m_blocks + 1) (the MLP
// block at 300 tokens 30% faster, at 1920 tokens 6%), while at 4-8 even
// m-blocks, where kShareB idles nothing, kShareA ran ~2% slower. Past 15 the
// idle share falls toward that cost: at 17 m-blocks level to 3% faster, at 23
// and 31 4-8% slower.
inline constexpr int32_t kMaxOddRowBlocksSharingA = 15;

// The grid of cluster tiles of a node: `rows` along M, `cols` along N.
//   kShareB: rows = ceil(m_blocks / cluster_size), cols = n_blocks.
//   kShareA: rows = m_blocks, cols = ceil(n_blocks / cluster_size).
struct ClusterGrid {
  int32_t rows = 0;
  int32_t cols = 0;
  int64_t size() const { return int64_t{rows} * cols; }
};
ClusterGrid ClusterGridOf(const NodeSchedule& node, int32_t cluster_size);

// The first CTA tile of cluster tile (row, col): (row * cluster_size, col) for
// kShareB, (row, col * cluster_size) for kShareA.
CtaTile FirstTileOfCluster(ClusterShare share, int32_t cluster_size, int32_t row, int32_t col);

// How a node's tiles would be reduced if it splits K
// (NodeSchedule::reduce_parts, reduce_part_rows): in parts of `rows` rows,
// one reduce job each, when `options.reduce_in_parts` and the node is one row
// block, not SwiGLU, with output tiles that are all whole (out_cols a multiple
// of out_tile_n); `rows` is options.reduce_part_rows if set, else the first
// of 8 and kFewRowReduceRows that gives 2 .. kMaxReduceParts parts whose
// jobs (`cluster_tiles` times as many) fit one wave (max_clusters), or for
// 8 rows and a node with consumers half a wave. Else one part.
// Why: a one-job reduce of 64-128 rows sums 0.5-1 MiB of partials on one SM
// (traced at 64 tokens: 19-22 us, plus 11 of epilogue, on 16 of 132 SMs);
// in parts, as many SMs share it, each with the few-row sum straight into C,
// whose time goes with the rows a thread sums (bench/NOTES.md v1.14).
// Every part must go straight into C, which the kernel needs (a part cannot
// be staged for a TMA store: the box would overwrite the other parts' rows).
// More parts than a wave cost more in jobs than they save (measured
// 128x14336x4096, 28 cluster tiles x 8 parts: 0.70 -> 0.57 of cuBLAS). 8 rows
// beat 16 where they fit (MLP at 16 / 64 tokens 124 / 130 -> 121 / 126 us,
// 64x4096x4096 0.67 -> 0.79), except in a chain at 64 tokens (214 -> 219
// us), whose 64 reduce jobs a layer took the SMs the next layer's jobs
// needed.
struct ReduceParts {
  int32_t parts = 1;
  int32_t rows = 0;  // 0 when parts == 1
};
ReduceParts ChooseReduceParts(const NodeSchedule& node, bool swiglu, int64_t cluster_tiles,
                              const SchedulerOptions& options, bool has_consumers);

// Split-K for one node. `forced` >= 1 forces it (clamped to k_blocks, because a
// split without k-blocks would do no work). forced == 0 decides: when the node
// has at most half a wave of cluster tiles (2 * clusters <= max_clusters), split
// so that clusters * split_k is about one wave, each split keeping >= 16
// k-blocks, or >= 8 when every reduce job would sum at most
// kFewRowReduceRows rows (`few_row_reduce`: one row block of that many rows,
// or a node reduced in parts); otherwise 1. Never more than kMaxSplitK.
// `step_cluster_tiles`: the cluster tiles of every node of this node's
// dependency depth, this one's included (Lower): those nodes run side by side
// and fill the wave together, so the rule above counts them instead of the
// node alone (0, or fewer than the node's own: the node alone). Counted per
// node, the 8-layer 4096 chain built as two 2048-column nodes a layer split
// each node in 3 at 300 rows where the one-node layer splits in 2, and took
// 350-365 us against 291 (bench/NOTES.md v1.69).
int32_t ChooseSplitK(int64_t cluster_tiles, int32_t k_blocks, int32_t max_clusters, int32_t forced,
                     bool few_row_reduce = false, int64_t step_cluster_tiles = 0);

// The k-blocks of split `split` of `split_k`: contiguous ranges that partition
// [0, k_blocks) in order. The last split takes `last_extra` k-blocks more
// than an even share (NodeSchedule::last_split_extra_k_blocks); the rest,
// k_blocks - last_extra, is shared by all splits with sizes differing by at
// most one (the first (k_blocks - last_extra) % split_k get the extra
// block). Needs 0 <= last_extra <= k_blocks - split_k, so that every split
// keeps a k-block when k_blocks >= split_k; or, with two splits, a negative
// last_extra of at least 2 - k_blocks: the last split that many k-blocks
// shorter than the first (SchedulerOptions::first_split_lead_k_blocks).
struct KBlockRange {
  int32_t begin = 0;
  int32_t end = 0;
};
KBlockRange SplitKRange(int32_t k_blocks, int32_t split_k, int32_t split, int32_t last_extra = 0);

// How many k-blocks more than an even share the last split of a node whose
// last split sums takes, when every split of a tile starts at about the
// same time: then the others' partials are stored by the time the last
// split's main loop ends, instead of being waited for after it (a partial
// takes ~5 us from a split's main loop's end to its flag). Measured on the
// H200 (bench/NOTES.md v1.45), the 8-layer 4096 chain at 200 / 300 / 512
// rows against even splits (276-279 / 306 / 302-303 us): with 4 extra
// k-blocks 275-276 / 297 / 294-295, with 8 271-273 / 289-291 / 287-288, 10
// and 12 within 1% of 8, 16 280-281 / 296-297 / 295; in the MLP block's
// down projection, whose splits start as gate/up's tiles end (several
// waves), 4 was 1-3% slower (v1.44), so it keeps even splits.
inline constexpr int32_t kLastSplitExtraKBlocks = 8;

// NodeSchedule::last_split_extra_k_blocks for node `node_index` of
// `schedule` (tiled, its dependencies lowered): 0 unless its last split sums
// (reduce_parts == 0 with split_k > 1). Then options.last_split_extra_k_blocks
// when that is >= 0 (clamped to k_blocks - split_k); when it is -1 (the
// scheduler decides), kLastSplitExtraKBlocks where the node's jobs and each
// of its producers' fit one wave (max_clusters), so that its splits start
// together, and every split keeps at least 8 k-blocks; else 0. With
// options.first_split_lead_k_blocks > 0, a node of two splits whose jobs
// fit one wave takes minus the lead that remains once its first split's end
// is on options.split_granule_k_blocks and a granule short of K, instead.
int32_t ChooseLastSplitExtra(const Schedule& schedule, int node_index, const SchedulerOptions& options);

// Schedule::whole_tiles of `node` (tiled) under
// SchedulerOptions::whole_leading_tiles: where its last split sums
// (reduce_parts == 0 with split_k > 1) and it has at least two waves of
// cluster tiles (`max_clusters` a wave), all but its last wave and the part
// wave past the whole ones (the 64-column MLP gate/up of 448 tiles on 132
// SMs: 264 whole, 184 split); else 0.
int64_t WholeLeadingTiles(const NodeSchedule& node, int32_t cluster_size, int32_t max_clusters);

}  // namespace loom::sched

#endif  // LOOM_SCHEDULER_TILING_H_
