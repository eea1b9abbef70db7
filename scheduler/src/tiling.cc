// Per-node tiling, cluster grouping and split-K choices (see tiling.h).
#include "loom/scheduler/tiling.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "loom/scheduler/queue.h"
#include "loom/scheduler/raster.h"

namespace loom::sched {
namespace {

// For a >= 0, b > 0, without overflow for any such a (a + b - 1 overflows
// from INT64_MAX - b + 2; the blocks of such a dimension are refused after).
int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// a * b for a, b >= 0, INT64_MAX where it would overflow.
int64_t SaturatingProduct(int64_t a, int64_t b) {
  int64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? std::numeric_limits<int64_t>::max() : product;
}

std::string Label(const NodeProblem& problem, int index) {
  return problem.label.empty() ? absl::StrCat("node ", index) : problem.label;
}

}  // namespace

std::string ProblemLabel(const std::vector<NodeProblem>& problems, int index) {
  return index >= 0 && index < static_cast<int>(problems.size()) ? Label(problems[index], index)
                                                                  : absl::StrCat("node ", index);
}

absl::Status ValidateOptions(const SchedulerOptions& options) {
  // InvalidArgument naming the field as the caller knows the options.
  const auto refuse = [&](auto&&... what) {
    return absl::InvalidArgumentError(absl::StrCat(options.name, ".", what...));
  };
  const TileShape& t = options.tile;
  if (t.m <= 0) return refuse("tile.m must be positive, got ", t.m);
  if (t.n <= 0) return refuse("tile.n must be positive, got ", t.n);
  if (t.k <= 0) return refuse("tile.k must be positive, got ", t.k);
  if (options.cluster_size != 1 && options.cluster_size != 2) {
    return refuse("cluster_size must be 1 or 2, got ", options.cluster_size);
  }
  if (options.num_sms <= 0) return refuse("num_sms must be positive, got ", options.num_sms);
  if (options.max_clusters <= 0) return refuse("max_clusters must be positive, got ", options.max_clusters);
  if (options.split_k < 0 || options.split_k > kMaxSplitK) {
    return refuse("split_k must be in [0, ", kMaxSplitK, "] (the TileJob split field is 8-bit), got ",
                  options.split_k);
  }
  if (options.group_size < 0) return refuse("group_size must be >= 0, got ", options.group_size);
  if (options.last_split_extra_k_blocks < -1 || options.last_split_extra_k_blocks > kMaxKBlocks) {
    return refuse("last_split_extra_k_blocks must be -1 (the scheduler decides) or in [0, ", kMaxKBlocks, "], got ",
                  options.last_split_extra_k_blocks);
  }
  if (options.first_split_lead_k_blocks < 0 || options.first_split_lead_k_blocks > kMaxKBlocks) {
    return refuse("first_split_lead_k_blocks must be in [0, ", kMaxKBlocks, "], got ",
                  options.first_split_lead_k_blocks);
  }
  if (options.split_granule_k_blocks < 1 || options.split_granule_k_blocks > kMaxKBlocks) {
    return refuse("split_granule_k_blocks must be in [1, ", kMaxKBlocks, "], got ", options.split_granule_k_blocks);
  }
  if (options.reduce_part_rows < 0 || options.reduce_part_rows > kFewRowReduceRows) {
    return refuse("reduce_part_rows must be in [0, ", kFewRowReduceRows, "] (a part is one few-row reduce), got ",
                  options.reduce_part_rows);
  }
  return absl::OkStatus();
}

ClusterShare ChooseShare(int32_t m_blocks, int32_t n_blocks) {
  if (m_blocks < 2) return ClusterShare::kShareA;
  if (m_blocks % 2 == 0 || m_blocks > kMaxOddRowBlocksSharingA) return ClusterShare::kShareB;
  // Odd m-blocks: pairs along M leave one CTA of the last cluster row idle
  // (2 * ceil(m/2) * n CTA tiles for m * n), pairs along N only the last
  // column's if n_blocks is odd (2 * m * ceil(n/2)). Fewer idle CTAs wins;
  // a tie keeps the weights multicast.
  const int64_t share_b_tiles = 2 * CeilDiv(m_blocks, 2) * int64_t{n_blocks};
  const int64_t share_a_tiles = 2 * int64_t{m_blocks} * CeilDiv(n_blocks, 2);
  return share_a_tiles < share_b_tiles ? ClusterShare::kShareA : ClusterShare::kShareB;
}

ClusterGrid ClusterGridOf(const NodeSchedule& node, int32_t cluster_size) {
  if (node.share == ClusterShare::kShareB) {
    return ClusterGrid{static_cast<int32_t>(CeilDiv(node.m_blocks, cluster_size)), node.n_blocks};
  }
  return ClusterGrid{node.m_blocks, static_cast<int32_t>(CeilDiv(node.n_blocks, cluster_size))};
}

CtaTile FirstTileOfCluster(ClusterShare share, int32_t cluster_size, int32_t row, int32_t col) {
  return share == ClusterShare::kShareB ? CtaTile{row * cluster_size, col}
                                        : CtaTile{row, col * cluster_size};
}

int32_t ChooseSplitK(int64_t cluster_tiles, int32_t k_blocks, int32_t max_clusters, int32_t forced,
                     bool few_row_reduce, int64_t step_cluster_tiles) {
  if (k_blocks <= 1 || cluster_tiles <= 0) return 1;
  if (forced >= 1) return std::min({forced, k_blocks, kMaxSplitK});
  // Split only when the node and the nodes beside it leave most of a wave
  // idle; a step that fills half a wave or more is better served by other
  // nodes filling the rest than by paying for a reduction.
  const int64_t step_tiles = std::max(cluster_tiles, step_cluster_tiles);
  if (2 * step_tiles > max_clusters) return 1;
  // Each split keeps at least 16 k-blocks (1024 of K): measured on decode
  // chains (bench/NOTES.md, v1.8), 4 splits of 16 beat 8 splits of 8 by
  // 7-10%: half as many partials to reduce per layer, and half the SMs free
  // to hold the next layer's jobs and fill their B rings while they wait.
  const int64_t to_fill_wave = max_clusters / step_tiles;
  const int64_t keeping_16_blocks = k_blocks / 16;  // floor(k_blocks / s) >= 16
  int64_t split = std::min<int64_t>({to_fill_wave, keeping_16_blocks, kMaxSplitK});
  // A decode node, whose partials the consumer warpgroups sum one column pair
  // per thread, pays for a split in k-blocks, not in reduce time: measured
  // (v1.12), the one-token chain ran 8% faster with 8 splits of 8 than with 4
  // of 16; at 16 tokens the new sum and 8 splits together took the chain from
  // 242 to 217 us (v1.13); reduced in parts, at 32-128 tokens, 8 splits
  // against 4 took it from 238-284 to 211-261 us (v1.14).
  const int64_t keeping_8_blocks = std::min<int64_t>({to_fill_wave, k_blocks / 8, kMaxSplitK});
  if (few_row_reduce) split = std::max(split, keeping_8_blocks);
  return static_cast<int32_t>(std::max<int64_t>(split, 1));
}

ReduceParts ChooseReduceParts(const NodeSchedule& node, bool swiglu, int64_t cluster_tiles,
                              const SchedulerOptions& options, bool has_consumers) {
  if (!options.reduce_in_parts || swiglu || node.m_blocks != 1 || node.out_cols % node.out_tile_n != 0) {
    return ReduceParts{};
  }
  auto fits = [&](int32_t rows) {
    const int64_t parts = CeilDiv(node.m, rows);
    const bool small = options.reduce_part_rows == 0 && rows < kFewRowReduceRows && has_consumers;
    const int64_t jobs = small ? options.max_clusters / 2 : options.max_clusters;
    return parts >= 2 && parts <= kMaxReduceParts && cluster_tiles * parts <= jobs;
  };
  for (int32_t rows : {options.reduce_part_rows, 8, kFewRowReduceRows}) {
    if (rows <= 0 || !fits(rows)) {
      if (options.reduce_part_rows > 0) break;  // forced, and it does not fit
      continue;
    }
    return ReduceParts{static_cast<int32_t>(CeilDiv(node.m, rows)), rows};
  }
  return ReduceParts{};
}

int32_t SplitsSummedByLast(int32_t k_blocks, int32_t splits) {
  int32_t best = splits;
  int64_t best_cost = INT64_MAX;
  for (int32_t s = splits; s >= 2; --s) {
    const int64_t cost = CeilDiv(k_blocks, s) + int64_t{s - 1} * kPartialCostKBlocks;
    if (cost < best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

KBlockRange SplitKRange(int32_t k_blocks, int32_t split_k, int32_t split, int32_t last_extra) {
  const int32_t shared = k_blocks - last_extra;
  const int32_t base = shared / split_k;
  const int32_t extra = shared % split_k;  // the first `extra` splits get base + 1
  const int32_t begin = split * base + std::min(split, extra);
  const int32_t end = begin + base + (split < extra ? 1 : 0);
  return KBlockRange{begin, split == split_k - 1 ? k_blocks : end};
}

int32_t ChooseLastSplitExtra(const Schedule& schedule, int node_index, const SchedulerOptions& options) {
  const NodeSchedule& node = schedule.nodes[node_index];
  if (node.split_k <= 1 || node.reduce_parts != 0) return 0;
  const int32_t most = std::max(node.k_blocks - node.split_k, 0);
  if (options.first_split_lead_k_blocks > 0 && node.split_k == 2 &&
      NodeJobCount(schedule, node_index) <= options.max_clusters) {
    // The first split's end, (k_blocks + lead) / 2 rounded up as SplitKRange
    // rounds it, moved down onto the granule and a granule short of K.
    const int32_t granule = options.split_granule_k_blocks;
    const int32_t wanted = (node.k_blocks + options.first_split_lead_k_blocks + 1) / 2;
    const int32_t end = std::min(wanted, node.k_blocks - granule) / granule * granule;
    return -std::max(2 * end - node.k_blocks, 0);
  }
  if (options.last_split_extra_k_blocks >= 0) return std::min(options.last_split_extra_k_blocks, most);
  constexpr int32_t kMinKBlocksPerSplit = 8;
  if ((node.k_blocks - kLastSplitExtraKBlocks) / node.split_k < kMinKBlocksPerSplit) return 0;
  if (NodeJobCount(schedule, node_index) > options.max_clusters) return 0;
  for (int32_t e = 0; e < node.dependency_count; ++e) {
    const int32_t producer = schedule.dependencies[node.dependency_begin + e].producer;
    if (NodeJobCount(schedule, producer) > options.max_clusters) return 0;
  }
  return kLastSplitExtraKBlocks;
}

int64_t WholeLeadingTiles(const NodeSchedule& node, int32_t cluster_size, int32_t max_clusters) {
  if (node.split_k <= 1 || node.reduce_parts != 0 || max_clusters <= 0) return 0;
  const int64_t tiles = std::max<int64_t>(ClusterGridOf(node, cluster_size).size(), 0);
  const int64_t waves = tiles / max_clusters;
  return waves >= 2 ? (waves - 1) * max_clusters : 0;
}

std::vector<int32_t> NodeDepths(const std::vector<NodeProblem>& problems) {
  std::vector<int32_t> depth(problems.size(), 0);
  for (size_t i = 0; i < problems.size(); ++i) {
    for (const DependencyEdge& edge : problems[i].dependencies) {
      if (edge.producer >= 0 && static_cast<size_t>(edge.producer) < i) {
        depth[i] = std::max(depth[i], depth[edge.producer] + 1);
      }
    }
  }
  return depth;
}

absl::StatusOr<NodeSchedule> TileNode(const NodeProblem& problem, int node_index,
                                      const SchedulerOptions& options, bool has_consumers,
                                      int64_t step_cluster_tiles) {
  const TileShape& tile = options.tile;
  const auto refuse = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(Label(problem, node_index), ": ", what));
  };
  if (problem.m < 0) return refuse(absl::StrCat("M must be >= 0, got ", problem.m));
  if (problem.n < 0) return refuse(absl::StrCat("N must be >= 0, got ", problem.n));
  if (problem.k < 0) return refuse(absl::StrCat("K must be >= 0, got ", problem.k));
  if (problem.swiglu && problem.n % 2 != 0) {
    return refuse(absl::StrCat("SwiGLU needs an even N (gate/up pairs), got N = ", problem.n));
  }
  if (problem.swiglu && tile.n % 2 != 0) {
    return refuse(absl::StrCat("SwiGLU needs an even tile.n (whole gate/up pairs per tile), got tile.n = ", tile.n));
  }

  NodeSchedule node;
  node.m = problem.m;
  node.n = problem.n;
  node.k = problem.k;
  node.out_cols = problem.swiglu ? problem.n / 2 : problem.n;
  node.out_tile_n = problem.swiglu ? tile.n / 2 : tile.n;

  const int64_t k_blocks = CeilDiv(problem.k, tile.k);
  if (k_blocks > kMaxKBlocks) {
    return refuse(absl::StrCat("k_blocks = ", k_blocks, " (K = ", problem.k, ", tile.k = ", tile.k, ") exceeds ",
                               kMaxKBlocks, ", the TileJob k-block range"));
  }
  const bool empty = problem.m == 0 || problem.n == 0;  // K = 0 still has an output: epilogue(0)
  const int64_t m_blocks = empty ? 0 : CeilDiv(problem.m, tile.m);
  const int64_t n_blocks = empty ? 0 : CeilDiv(problem.n, tile.n);
  if (m_blocks > kMaxBlocksPerDim) {
    return refuse(absl::StrCat("m_blocks = ", m_blocks, " (M = ", problem.m, ") exceeds ", kMaxBlocksPerDim));
  }
  if (n_blocks > kMaxBlocksPerDim) {
    return refuse(absl::StrCat("n_blocks = ", n_blocks, " (N = ", problem.n, ") exceeds ", kMaxBlocksPerDim));
  }
  node.m_blocks = static_cast<int32_t>(m_blocks);
  node.n_blocks = static_cast<int32_t>(n_blocks);
  node.flag_row_stride = node.n_blocks;  // Lower may join it with other producers' (FlagGroupsOf)
  node.k_blocks = static_cast<int32_t>(k_blocks);
  node.share = ChooseShare(node.m_blocks, node.n_blocks);

  const ClusterGrid grid = ClusterGridOf(node, options.cluster_size);
  node.raster = ChooseRaster(grid);
  if (options.group_size > 0) {
    node.group_size = options.group_size;
  } else {
    // The cross panel: one band step's tiles of the operand that stays in L2
    // (B tiles when walking along M, A tiles along N), bf16, whole K.
    const int64_t cross_extent =
        node.raster == RasterOrder::kAlongM
            ? int64_t{tile.n} * (node.share == ClusterShare::kShareA ? options.cluster_size : 1)
            : int64_t{tile.m} * (node.share == ClusterShare::kShareB ? options.cluster_size : 1);
    const int64_t cross_panel_bytes =
        SaturatingProduct(cross_extent, SaturatingProduct(std::max<int64_t>(problem.k, 1), 2));
    node.group_size = ChooseGroupSize(grid, node.raster, options.max_clusters, cross_panel_bytes);
  }
  const ReduceParts parts = ChooseReduceParts(node, problem.swiglu, grid.size(), options, has_consumers);
  const bool few_row_reduce = (node.m_blocks == 1 && problem.m <= kFewRowReduceRows) || parts.parts > 1;
  node.split_k = ChooseSplitK(grid.size(), node.k_blocks, options.max_clusters, options.split_k, few_row_reduce,
                              step_cluster_tiles);
  if (node.split_k > 1) {
    // Tiles summed whole, each by one reduce job, are summed by their last
    // split instead: that split's partial never leaves its registers, nor
    // waits for a cluster to take a reduce job (bench/NOTES.md v1.44).
    const bool whole_tile_reduce = parts.parts <= 1 && !few_row_reduce;
    const bool last_sums = whole_tile_reduce && options.sum_in_last_split && node.split_k <= kMaxSplitsSummedByLast;
    if (last_sums && options.split_k == 0) node.split_k = SplitsSummedByLast(node.k_blocks, node.split_k);
    node.reduce_parts = last_sums ? 0 : parts.parts;
    node.reduce_part_rows = parts.rows;
  }
  return node;
}

}  // namespace loom::sched
