// Lower(): a graph of GEMM nodes -> the Schedule the persistent kernel runs.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "loom/scheduler/queue.h"
#include "loom/scheduler/schedule.h"
#include "loom/scheduler/tiling.h"

namespace loom::sched {

int32_t AWaitKBlocks(const Schedule& schedule, const NodeSchedule& node) {
  const int64_t k_block = schedule.tile.k;
  int64_t granule = 0;  // in k-blocks; 0: no constraint yet (gcd(0, x) = x)
  for (int d = 0; d < node.dependency_count; ++d) {
    const DependencyEdge& edge = schedule.dependencies[node.dependency_begin + d];
    if (edge.operand != static_cast<uint8_t>(DependencyOperand::kA) || edge.whole_tensor) continue;
    // Boundaries in the consumer's K: j * out_tile_n - col_offset.
    const int64_t tile_cols = schedule.nodes[edge.producer].out_tile_n;
    const int64_t offset = edge.col_offset < 0 ? -edge.col_offset : edge.col_offset;
    if (tile_cols % k_block != 0 || offset % k_block != 0) return 1;
    granule = std::gcd(granule, tile_cols / k_block);
    granule = std::gcd(granule, offset / k_block);
  }
  return granule == 0 ? kAWaitWholeJob : static_cast<int32_t>(granule);
}

bool AFlagRunsAllowed(const Schedule& schedule, const NodeSchedule& node) {
  // Where an A edge's producer output lies in A: consumer row blocks
  // [first_block, last_block] and A's columns [col_begin, col_end), clipped
  // to A (what the A loader's TMA loads can read).
  struct Region {
    int64_t first_block = 0, last_block = 0, col_begin = 0, col_end = 0;
  };
  constexpr int64_t kEverything = int64_t{1} << 62;
  std::vector<Region> regions;
  for (int d = 0; d < node.dependency_count; ++d) {
    const DependencyEdge& edge = schedule.dependencies[node.dependency_begin + d];
    if (edge.operand != static_cast<uint8_t>(DependencyOperand::kA)) continue;
    if (edge.whole_tensor) {
      regions.push_back({0, kEverything, 0, kEverything});
      continue;
    }
    const NodeSchedule& producer = schedule.nodes[edge.producer];
    if (edge.col_offset % producer.out_tile_n != 0) return false;
    const int64_t row_begin = std::max<int64_t>(0, -edge.row_offset);
    const int64_t row_end = std::min<int64_t>(node.m, producer.m - edge.row_offset);
    const int64_t col_begin = std::max<int64_t>(0, -edge.col_offset);
    const int64_t col_end = std::min<int64_t>(node.k, producer.out_cols - edge.col_offset);
    if (row_begin >= row_end || col_begin >= col_end) continue;  // A reads none of it
    regions.push_back({row_begin / schedule.tile.m, (row_end - 1) / schedule.tile.m, col_begin, col_end});
  }
  for (size_t i = 0; i < regions.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      const Region& a = regions[i];
      const Region& b = regions[j];
      const bool blocks_meet = a.first_block <= b.last_block && b.first_block <= a.last_block;
      const bool columns_meet = a.col_begin < b.col_end && b.col_begin < a.col_end;
      if (blocks_meet && columns_meet) return false;
    }
  }
  return true;
}

std::vector<std::vector<int>> FlagGroupsOf(const std::vector<NodeProblem>& problems,
                                           const std::vector<NodeSchedule>& nodes) {
  const int num_nodes = static_cast<int>(nodes.size());
  std::vector<int> group_of(num_nodes, -1);
  std::vector<std::vector<int>> joined;  // the groups of several
  auto has_tiles = [&](int p) { return int64_t{nodes[p].m_blocks} * nodes[p].n_blocks > 0; };
  for (int i = 0; i < num_nodes && i < static_cast<int>(problems.size()); ++i) {
    // (first column of A it gives, producer, row offset)
    std::vector<std::tuple<int64_t, int, int64_t>> parts;
    for (const DependencyEdge& edge : problems[i].dependencies) {
      if (edge.operand != static_cast<uint8_t>(DependencyOperand::kA) || edge.whole_tensor) continue;
      if (edge.producer < 0 || edge.producer >= i) continue;  // Lower refuses the graph
      parts.emplace_back(-edge.col_offset, edge.producer, edge.row_offset);
    }
    if (parts.size() < 2) continue;
    std::sort(parts.begin(), parts.end());
    const auto [first_column, first_producer, first_row_offset] = parts[0];
    bool joinable = true;
    for (size_t j = 0; j < parts.size() && joinable; ++j) {
      const auto [column, producer, row_offset] = parts[j];
      joinable = group_of[producer] < 0 && has_tiles(producer) &&
                 nodes[producer].m_blocks == nodes[first_producer].m_blocks && row_offset == first_row_offset;
      for (size_t e = 0; e < j && joinable; ++e) joinable = std::get<1>(parts[e]) != producer;  // each once
    }
    if (!joinable) continue;
    std::vector<int>& group = joined.emplace_back();
    for (const auto& part : parts) {
      group.push_back(std::get<1>(part));
      group_of[std::get<1>(part)] = static_cast<int>(joined.size()) - 1;
    }
  }
  std::vector<std::vector<int>> groups;
  std::vector<bool> placed(joined.size(), false);
  for (int i = 0; i < num_nodes; ++i) {
    if (group_of[i] < 0) {
      groups.push_back({i});
    } else if (!placed[group_of[i]]) {
      placed[group_of[i]] = true;
      groups.push_back(joined[group_of[i]]);
    }
  }
  return groups;
}

namespace {

// Every edge names an earlier node and an operand, with offsets inside
// +-2^62: they are negated and added to row and column bounds
// (FlagGroupsOf, ProducerTiles), which past that could overflow. (What
// Compile derives from views lies far inside.)
absl::Status ValidateEdges(const std::vector<NodeProblem>& problems) {
  for (int i = 0; i < static_cast<int>(problems.size()); ++i) {
    const std::vector<DependencyEdge>& edges = problems[i].dependencies;
    for (int e = 0; e < static_cast<int>(edges.size()); ++e) {
      if (absl::Status status = CheckDependencyEdge(edges[e], i); !status.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(ProblemLabel(problems, i), ": dependency ", e, " ", status.message()));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDependencyEdge(const DependencyEdge& edge, int consumer) {
  constexpr int64_t kMaxOffset = int64_t{1} << 62;
  if (edge.producer < 0 || edge.producer >= consumer) {
    return absl::InvalidArgumentError(
        absl::StrCat("has producer ", edge.producer, ", which is not an earlier node"));
  }
  if (edge.operand > static_cast<uint8_t>(DependencyOperand::kResidual)) {
    return absl::InvalidArgumentError(absl::StrCat("has operand ", static_cast<int>(edge.operand),
                                                   ", not one of A, B, bias, residual"));
  }
  for (const auto& [what, offset] : {std::pair{"row_offset", edge.row_offset}, {"col_offset", edge.col_offset}}) {
    if (offset < -kMaxOffset || offset > kMaxOffset) {
      return absl::InvalidArgumentError(absl::StrCat("has ", what, " ", offset, ", past +-2^62"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Schedule> Lower(const std::vector<NodeProblem>& problems,
                               const SchedulerOptions& options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  if (absl::Status s = ValidateEdges(problems); !s.ok()) return s;
  if (static_cast<int64_t>(problems.size()) > kMaxNodes) {
    return absl::InvalidArgumentError(absl::StrCat("graph: ", problems.size(), " nodes exceed ", kMaxNodes,
                                                   ", the TileJob node field's range"));
  }

  Schedule schedule;
  schedule.tile = options.tile;
  schedule.cluster_size = options.cluster_size;
  schedule.nodes.reserve(problems.size());
  std::vector<bool> has_consumers(problems.size(), false);
  for (const NodeProblem& problem : problems) {
    for (const DependencyEdge& edge : problem.dependencies) {
      if (edge.producer >= 0 && edge.producer < static_cast<int32_t>(problems.size())) {
        has_consumers[edge.producer] = true;
      }
    }
  }
  // Each node alone first, for its cluster tiles; then, where other nodes
  // share its dependency depth (they fill a wave together: ChooseSplitK),
  // again with the cluster tiles of the whole depth.
  const int num_nodes = static_cast<int>(problems.size());
  const std::vector<int32_t> depth = NodeDepths(problems);
  std::vector<int64_t> step_cluster_tiles(num_nodes, 0);  // by depth
  for (int i = 0; i < num_nodes; ++i) {
    absl::StatusOr<NodeSchedule> alone = TileNode(problems[i], i, options, has_consumers[i]);
    if (!alone.ok()) return alone.status();
    step_cluster_tiles[depth[i]] += ClusterGridOf(*alone, options.cluster_size).size();
    schedule.nodes.push_back(*alone);
  }
  for (int i = 0; i < num_nodes; ++i) {
    const int64_t own = ClusterGridOf(schedule.nodes[i], options.cluster_size).size();
    if (step_cluster_tiles[depth[i]] == own) continue;
    absl::StatusOr<NodeSchedule> node =
        TileNode(problems[i], i, options, has_consumers[i], step_cluster_tiles[depth[i]]);
    if (!node.ok()) return node.status();
    schedule.nodes[i] = *node;
  }

  // Flags: every node's output tiles, group after group (FlagGroupsOf: a
  // node alone, or the producers of one consumer's A, row block by row
  // block); then the split-K partial flags of split nodes, each followed by
  // its tiles' reduce part counts if it reduces in parts. Workspace: split
  // nodes' partials, in order.
  int64_t flags = 0;
  std::vector<int> flags_overflow_group;  // the nodes whose tiles pass the flag limit
  for (const std::vector<int>& group : FlagGroupsOf(problems, schedule.nodes)) {
    int64_t row_stride = 0;
    for (int i : group) row_stride += schedule.nodes[i].n_blocks;
    const int64_t group_flags = int64_t{schedule.nodes[group.front()].m_blocks} * row_stride;
    if (flags + group_flags > std::numeric_limits<int32_t>::max()) {
      flags_overflow_group = group;
      flags += group_flags;
      break;
    }
    int64_t offset = 0;
    for (int i : group) {
      schedule.nodes[i].flag_base = static_cast<int32_t>(flags + offset);
      schedule.nodes[i].flag_row_stride = static_cast<int32_t>(row_stride);
      offset += schedule.nodes[i].n_blocks;
    }
    flags += group_flags;
  }
  int64_t workspace = 0;
  int flags_overflow_split = -1;  // the split node whose partials pass the flag limit
  for (int i = 0; i < static_cast<int>(schedule.nodes.size()) && flags <= INT32_MAX; ++i) {
    NodeSchedule& node = schedule.nodes[i];
    const int64_t tiles = int64_t{node.m_blocks} * node.n_blocks;
    if (node.split_k <= 1 || tiles == 0) continue;
    node.partial_flag_base = static_cast<int32_t>(flags);
    flags += tiles * PartialSlices(node);
    if (node.reduce_parts > 1) {
      node.part_count_base = static_cast<int32_t>(flags);
      flags += tiles;
    }
    if (flags > INT32_MAX) flags_overflow_split = i;
    // Each node's partials start on a 128-byte line: the kernels' few-row
    // sums drop the lines they read from L2 (discard.global.L2, which takes
    // a 128-byte aligned address; splitk_reduce.cuh). The kernels' tiles
    // (multiples of 128 x 128 floats) keep every offset aligned already.
    const int64_t misaligned = workspace % kWorkspaceLineElements;
    if (misaligned != 0 && __builtin_add_overflow(workspace, kWorkspaceLineElements - misaligned, &workspace)) {
      return absl::InvalidArgumentError(
          absl::StrCat(ProblemLabel(problems, i), ": the split-K workspace overflows a 64-bit element count"));
    }
    node.workspace_offset = workspace;
    // fp32 partials of every tile's slices; checked, as tiles of any int32
    // size are valid options.
    int64_t elements = PartialSlices(node);
    bool overflow = false;
    for (const int64_t factor : {int64_t{node.m_blocks}, int64_t{options.tile.m}, int64_t{node.n_blocks},
                                 int64_t{options.tile.n}}) {
      overflow = overflow || __builtin_mul_overflow(elements, factor, &elements);
    }
    if (overflow || __builtin_add_overflow(workspace, elements, &workspace)) {
      return absl::InvalidArgumentError(absl::StrCat(ProblemLabel(problems, i), ": the split-K workspace (",
                                                     PartialSlices(node), " partials of ", node.m_blocks, " x ",
                                                     node.n_blocks, " tiles of ", options.tile.m, " x ",
                                                     options.tile.n, ") overflows a 64-bit element count"));
    }
  }
  if (flags > std::numeric_limits<int32_t>::max()) {
    std::string where;
    if (flags_overflow_group.empty()) {
      const NodeSchedule& node = schedule.nodes[flags_overflow_split];
      where = absl::StrCat(ProblemLabel(problems, flags_overflow_split), "'s split-K partials (split_k = ",
                           node.split_k, ", ", PartialSlices(node), " a tile of ", node.m_blocks, " x ",
                           node.n_blocks, ") and reduce part counts take the count to ", flags);
    } else {
      int64_t tiles = 0;
      std::vector<std::string> labels;
      for (int i : flags_overflow_group) {
        tiles += int64_t{schedule.nodes[i].m_blocks} * schedule.nodes[i].n_blocks;
        labels.push_back(ProblemLabel(problems, i));
      }
      where = absl::StrCat(absl::StrJoin(labels, ", "), "'s output tiles (", tiles, ") take the count to ", flags);
    }
    return absl::InvalidArgumentError(absl::StrCat("graph: more than ", std::numeric_limits<int32_t>::max(),
                                                   " tile flags (output tiles + split-K partials + reduce part "
                                                   "counts): ",
                                                   where));
  }
  schedule.num_flags = static_cast<int32_t>(flags);
  schedule.workspace_elements = workspace;

  // Dependencies, grouped by consumer. An edge on a producer without tiles
  // (zero-size) is dropped: there is no flag to wait for, the runtime provides
  // that output before the launch. The kernels index them in 32 bits
  // (NodeSchedule::dependency_begin): ~2^31 edges take ~2^16 nodes each
  // overlapping every earlier one, and tens of GiB here, so this is only
  // said, never reached by a test.
  int64_t edges = 0;
  for (const NodeProblem& problem : problems) edges += static_cast<int64_t>(problem.dependencies.size());
  if (edges > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("graph: ", edges, " dependency edges exceed 2^31 - 1, the kernels' edge index range"));
  }
  for (int i = 0; i < static_cast<int>(problems.size()); ++i) {
    NodeSchedule& node = schedule.nodes[i];
    node.dependency_begin = static_cast<int32_t>(schedule.dependencies.size());
    for (const DependencyEdge& edge : problems[i].dependencies) {  // ValidateEdges checked them
      const NodeSchedule& producer = schedule.nodes[edge.producer];
      if (int64_t{producer.m_blocks} * producer.n_blocks == 0) continue;
      schedule.dependencies.push_back(edge);
      node.producer_operands |= static_cast<uint8_t>(1u << edge.operand);
    }
    node.dependency_count = static_cast<int32_t>(schedule.dependencies.size()) - node.dependency_begin;
    node.a_wait_k_blocks = AWaitKBlocks(schedule, node);
    // Runs need a granule: none where every A edge waits for its whole
    // producer (kAWaitWholeJob, whose columns would overflow the kernels'
    // int arithmetic).
    node.a_flag_runs = node.a_wait_k_blocks != kAWaitWholeJob && AFlagRunsAllowed(schedule, node) ? 1 : 0;
  }
  for (int i = 0; i < static_cast<int>(schedule.nodes.size()); ++i) {
    schedule.nodes[i].last_split_extra_k_blocks = ChooseLastSplitExtra(schedule, i, options);
  }
  if (options.whole_leading_tiles) {
    schedule.whole_tiles.assign(schedule.nodes.size(), 0);
    for (int i = 0; i < static_cast<int>(schedule.nodes.size()); ++i) {
      schedule.whole_tiles[i] = WholeLeadingTiles(schedule.nodes[i], schedule.cluster_size, options.max_clusters);
    }
  }

  int64_t expected_jobs = 0;
  int largest = 0;  // the node with the most jobs, for the message below
  int64_t largest_jobs = 0;
  for (int i = 0; i < static_cast<int>(schedule.nodes.size()); ++i) {
    const int64_t jobs = NodeJobCount(schedule, i);
    expected_jobs += jobs;
    if (jobs > largest_jobs) {
      largest = i;
      largest_jobs = jobs;
    }
  }
  if (expected_jobs > kMaxJobs) {
    return absl::InvalidArgumentError(absl::StrCat("graph: ", expected_jobs, " jobs exceed ", kMaxJobs,
                                                   ", the most a plan queues; ", ProblemLabel(problems, largest),
                                                   " has ", largest_jobs));
  }

  if (options.interleave_split_producers) {
    schedule.column_runs.assign(schedule.nodes.size(), 1);
    for (const NodeSchedule& consumer : schedule.nodes) {
      for (int32_t e = 0; e < consumer.dependency_count; ++e) {
        const DependencyEdge& edge = schedule.dependencies[consumer.dependency_begin + e];
        if (edge.operand != static_cast<uint8_t>(DependencyOperand::kA)) continue;
        int32_t& runs = schedule.column_runs[edge.producer];
        runs = std::max(runs, consumer.split_k);
      }
    }
  }
  // Deadlock freedom rests on (a) this queue being topological, (b) all
  // clusters co-resident, (c) no epilogue waiting on a later job. A consumer
  // is placed about one wave (max_clusters jobs) behind what it reads.
  schedule.queue = OrderQueue(schedule, options.max_clusters);
  schedule.queue_clusters = options.max_clusters;
  if (static_cast<int64_t>(schedule.queue.size()) != expected_jobs) {
    return absl::InternalError(absl::StrCat("scheduler: queued ", schedule.queue.size(), " of ",
                                            expected_jobs, " jobs"));
  }
  return schedule;
}

}  // namespace loom::sched
