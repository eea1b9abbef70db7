// ExplainSchedule(): a readable account of a Schedule (see explain.h).
#include "loom/scheduler/explain.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "loom/scheduler/queue.h"
#include "loom/scheduler/tiling.h"

namespace loom::sched {
namespace {

std::string NodeName(const std::vector<std::string>& names, int i) {
  if (i >= 0 && i < static_cast<int>(names.size()) && !names[i].empty()) return names[i];
  return absl::StrCat("node ", i);
}

const char* OperandName(uint8_t operand) {
  switch (static_cast<DependencyOperand>(operand)) {
    case DependencyOperand::kA: return "A";
    case DependencyOperand::kB: return "B";
    case DependencyOperand::kBias: return "bias";
    case DependencyOperand::kResidual: return "residual";
  }
  return "?";
}

// Which wavefront order the queue is and what SimulatedMakespan gave both.
std::string ExplainQueueOrder(const Schedule& schedule) {
  const int32_t clusters = schedule.queue_clusters;
  const WavefrontOrders orders = BothWavefrontOrders(schedule, clusters);
  auto same = [](const std::vector<TileJob>& a, const std::vector<TileJob>& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](const TileJob& x, const TileJob& y) {
             return std::memcmp(&x, &y, sizeof(TileJob)) == 0;
           });
  };
  const bool is_deepest = same(schedule.queue, orders.deepest);
  if (!is_deepest && !same(schedule.queue, orders.shallowest)) {
    return "  order: neither wavefront order (set by hand)\n";
  }
  if (orders.agree) {
    return absl::StrFormat("  order: deepest-first and shallowest-first agree (%d clusters)\n", clusters);
  }
  return absl::StrFormat("  order: %s, simulated on %d clusters at %d k-blocks against %d for %s\n",
                         is_deepest ? "deepest-first" : "shallowest-first", clusters,
                         is_deepest ? orders.deepest_makespan : orders.shallowest_makespan,
                         is_deepest ? orders.shallowest_makespan : orders.deepest_makespan,
                         is_deepest ? "shallowest-first" : "deepest-first");
}

}  // namespace

std::string ExplainSchedule(const Schedule& schedule, const std::vector<std::string>& node_names) {
  std::string out;
  const int num_nodes = static_cast<int>(schedule.nodes.size());
  absl::StrAppendFormat(&out, "schedule: %d nodes, tile %dx%dx%d (m x n x k), cluster %d, %d flags, "
                        "%d fp32 workspace elements\n",
                        num_nodes, schedule.tile.m, schedule.tile.n, schedule.tile.k, schedule.cluster_size,
                        schedule.num_flags, schedule.workspace_elements);
  for (int i = 0; i < num_nodes; ++i) {
    const NodeSchedule& node = schedule.nodes[i];
    const ClusterGrid grid = ClusterGridOf(node, schedule.cluster_size);
    absl::StrAppendFormat(&out, "node %d '%s': M=%d N=%d K=%d -> %d output columns\n", i,
                          NodeName(node_names, i), node.m, node.n, node.k, node.out_cols);
    if (node.m_blocks == 0 || node.n_blocks == 0) {
      out += "  zero-size: no tiles, no jobs, no flags\n";
    } else {
      absl::StrAppendFormat(
          &out,
          "  tiles %d x %d x %d blocks (m x n x k), output tile %dx%d; clusters of %d sharing %s "
          "(%d x %d cluster tiles)\n",
          node.m_blocks, node.n_blocks, node.k_blocks, schedule.tile.m, node.out_tile_n,
          schedule.cluster_size, node.share == ClusterShare::kShareB ? "B (consecutive m-blocks)"
                                                                     : "A (consecutive n-blocks)",
          grid.rows, grid.cols);
      absl::StrAppendFormat(&out, "  raster along %s, group %d", node.raster == RasterOrder::kAlongM ? "M" : "N",
                            node.group_size);
      if (!schedule.column_runs.empty() && schedule.column_runs[i] > 1) {
        absl::StrAppendFormat(&out, ", cluster columns from %d runs in turn", schedule.column_runs[i]);
      }
      absl::StrAppendFormat(&out, "; split_k %d", node.split_k);
      if (node.reduce_parts > 1) {
        absl::StrAppendFormat(&out, ", each tile reduced in %d parts of %d rows", node.reduce_parts,
                              node.reduce_part_rows);
      } else if (node.split_k > 1 && node.reduce_parts == 0) {
        out += ", each tile summed by its last split";
        if (node.last_split_extra_k_blocks > 0) {
          absl::StrAppendFormat(&out, " (%d k-blocks longer than the others)", node.last_split_extra_k_blocks);
        } else if (node.last_split_extra_k_blocks < 0) {
          absl::StrAppendFormat(&out, " (%d k-blocks shorter than the first)", -node.last_split_extra_k_blocks);
        }
        if (const int64_t whole = WholeTilesOf(schedule, i); whole > 0) {
          absl::StrAppendFormat(&out, ", but the first %d cluster tiles multiplied whole, one job each", whole);
        }
      }
      absl::StrAppendFormat(&out, "; %d jobs\n", NodeJobCount(schedule, i));
      if (node.flag_row_stride == node.n_blocks || node.m_blocks <= 1) {
        absl::StrAppendFormat(&out, "  flags [%d, %d)", node.flag_base, node.flag_base + node.m_blocks * node.n_blocks);
      } else {
        // Laid out with other producers of one consumer's A (FlagGroupsOf).
        absl::StrAppendFormat(&out, "  flags [%d, %d) + %d a tile row", node.flag_base,
                              node.flag_base + node.n_blocks, node.flag_row_stride);
      }
      if (node.split_k > 1) {
        absl::StrAppendFormat(&out, "; partial flags [%d, %d); workspace at %d", node.partial_flag_base,
                              node.partial_flag_base + node.m_blocks * node.n_blocks * PartialSlices(node),
                              node.workspace_offset);
      }
      if (node.reduce_parts > 1) {
        absl::StrAppendFormat(&out, "; part counts [%d, %d)", node.part_count_base,
                              node.part_count_base + node.m_blocks * node.n_blocks);
      }
      out += "\n";
    }
    if (node.dependency_count == 0) {
      out += "  dependencies: none\n";
    }
    for (int32_t e = 0; e < node.dependency_count; ++e) {
      const DependencyEdge& edge = schedule.dependencies[node.dependency_begin + e];
      absl::StrAppendFormat(&out, "  reads %s from '%s' (node %d)", OperandName(edge.operand),
                            NodeName(node_names, edge.producer), edge.producer);
      if (edge.whole_tensor) {
        out += ": whole tensor\n";
      } else {
        absl::StrAppendFormat(&out, ", offsets (%+d rows, %+d cols)\n", edge.row_offset, edge.col_offset);
      }
    }
    const bool a_has_producer_tiles = node.a_wait_k_blocks < node.k_blocks;
    if (a_has_producer_tiles) {
      absl::StrAppendFormat(&out, "  A's producers: one granule of producer tiles every %d k-blocks%s\n",
                            node.a_wait_k_blocks,
                            node.a_flag_runs ? ""
                                             : ", waited for one granule at a time (producers that give columns "
                                               "of one row block in common, or an output inside a tile column: "
                                               "no runs of flags)");
    }
  }

  // The queue.
  const int64_t total = static_cast<int64_t>(schedule.queue.size());
  int64_t reduces = 0;
  std::vector<int64_t> first(num_nodes, -1), last(num_nodes, -1), count(num_nodes, 0);
  for (int64_t p = 0; p < total; ++p) {
    const TileJob& job = schedule.queue[p];
    if (job.kind == static_cast<uint8_t>(JobKind::kReduce)) ++reduces;
    if (job.node >= num_nodes) continue;
    if (first[job.node] < 0) first[job.node] = p;
    last[job.node] = p;
    ++count[job.node];
  }
  absl::StrAppendFormat(&out, "queue: %d jobs (%d gemm, %d reduce)\n", total, total - reduces, reduces);
  if (schedule.queue_clusters > 0) out += ExplainQueueOrder(schedule);
  const int64_t shown = std::min<int64_t>(total, 16);
  for (int64_t p = 0; p < shown; ++p) {
    const TileJob& job = schedule.queue[p];
    const bool reduce = job.kind == static_cast<uint8_t>(JobKind::kReduce);
    absl::StrAppendFormat(&out, "  #%-4d %-12s %s m%-4d n%-4d", p, NodeName(node_names, job.node),
                          reduce ? "reduce" : "gemm  ", job.m_block, job.n_block);
    if (!reduce) {
      absl::StrAppendFormat(&out, " k[%d, %d)", job.k_block_begin, job.k_block_end);
      if (job.node < num_nodes && MultipliesPartOfK(schedule.nodes[job.node], job)) {
        absl::StrAppendFormat(&out, " split %d", job.split);
      } else if (job.node < num_nodes && WholeTileOfSplitNode(schedule.nodes[job.node], job)) {
        out += " whole";  // the last split's index, all of K
      }
    } else if (job.node < num_nodes && schedule.nodes[job.node].reduce_parts > 1) {
      absl::StrAppendFormat(&out, " part %d", job.split);
    }
    out += "\n";
  }
  if (total > shown) absl::StrAppendFormat(&out, "  ... %d more\n", total - shown);
  for (int i = 0; i < num_nodes; ++i) {
    if (count[i] == 0) {
      absl::StrAppendFormat(&out, "  '%s': no jobs\n", NodeName(node_names, i));
    } else {
      absl::StrAppendFormat(&out, "  '%s': %d jobs at queue positions [%d, %d]\n", NodeName(node_names, i),
                            count[i], first[i], last[i]);
    }
  }
  return out;
}

}  // namespace loom::sched
