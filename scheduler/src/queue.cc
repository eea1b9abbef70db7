// Per-node job lists, the wavefront queue order and its checker (see queue.h).
#include "loom/scheduler/queue.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <queue>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "loom/scheduler/job_access.h"
#include "loom/scheduler/raster.h"
#include "loom/scheduler/tiling.h"

namespace loom::sched {

namespace {

// The cluster columns of a grid `cols` wide in the order NodeJobs takes
// them: `runs` runs of equal length (the first cols % runs one longer), the
// first column of each run, then the second of each, and so on.
std::vector<int32_t> InterleavedColumns(int32_t cols, int32_t runs) {
  runs = std::clamp(runs, 1, std::max(cols, 1));
  const int32_t base = cols / runs;
  const int32_t longer = cols % runs;
  std::vector<int32_t> order;
  order.reserve(static_cast<size_t>(std::max(cols, 0)));
  for (int32_t offset = 0; offset < base + (longer > 0 ? 1 : 0); ++offset) {
    for (int32_t run = 0; run < runs; ++run) {
      const int32_t length = base + (run < longer ? 1 : 0);
      if (offset < length) order.push_back(run * base + std::min(run, longer) + offset);
    }
  }
  return order;
}

}  // namespace

std::vector<TileJob> NodeJobs(const Schedule& schedule, int node_index) {
  const NodeSchedule& node = schedule.nodes[node_index];
  const ClusterGrid grid = ClusterGridOf(node, schedule.cluster_size);
  std::vector<TileJob> jobs;
  if (grid.size() <= 0) return jobs;
  const int32_t split_k = std::max(node.split_k, 1);
  const int32_t runs = schedule.column_runs.empty() ? 1 : schedule.column_runs[node_index];
  const std::vector<int32_t> columns = runs > 1 ? InterleavedColumns(grid.cols, runs) : std::vector<int32_t>{};
  const int64_t whole = WholeTilesOf(schedule, node_index);
  jobs.reserve(static_cast<size_t>(NodeJobCount(schedule, node_index)));
  for (int64_t i = 0; i < grid.size(); ++i) {
    ClusterCoord c = RasterizedClusterTile(i, grid, node.raster, node.group_size);
    if (runs > 1) c.col = columns[c.col];
    const CtaTile first = FirstTileOfCluster(node.share, schedule.cluster_size, c.row, c.col);
    TileJob job;
    job.node = static_cast<uint16_t>(node_index);
    job.m_block = static_cast<uint32_t>(first.m_block);
    job.n_block = static_cast<uint32_t>(first.n_block);
    job.kind = static_cast<uint8_t>(JobKind::kGemm);
    if (split_k == 1 || i < whole) {
      job.split = static_cast<uint8_t>(split_k - 1);  // a whole tile: the last split's index (WholeTileOfSplitNode)
      job.k_block_begin = 0;
      job.k_block_end = static_cast<uint16_t>(node.k_blocks);
      jobs.push_back(job);
      continue;
    }
    for (int32_t s = 0; s < split_k; ++s) {
      const KBlockRange range = SplitKRange(node.k_blocks, split_k, s, node.last_split_extra_k_blocks);
      job.split = static_cast<uint8_t>(s);
      job.k_block_begin = static_cast<uint16_t>(range.begin);
      job.k_block_end = static_cast<uint16_t>(range.end);
      jobs.push_back(job);
    }
    job.kind = static_cast<uint8_t>(JobKind::kReduce);
    job.k_block_begin = 0;
    job.k_block_end = static_cast<uint16_t>(node.k_blocks);
    for (int32_t part = 0; part < node.reduce_parts; ++part) {
      job.split = static_cast<uint8_t>(part);
      jobs.push_back(job);
    }
  }
  return jobs;
}

int64_t NodeJobCount(const Schedule& schedule, int node_index) {
  const NodeSchedule& node = schedule.nodes[node_index];
  const int64_t clusters = std::max<int64_t>(ClusterGridOf(node, schedule.cluster_size).size(), 0);
  if (node.split_k <= 1) return clusters;
  const int64_t whole = WholeTilesOf(schedule, node_index);
  return whole + (clusters - whole) * (node.split_k + node.reduce_parts);
}

int64_t WholeTilesOf(const Schedule& schedule, int node_index) {
  return schedule.whole_tiles.empty() ? 0 : schedule.whole_tiles[node_index];
}

namespace {

// The jobs of every node, what each waits on and what it publishes: the
// graph that OrderQueue orders and SimulatedMakespan times.
//
// A job waits on units: each flag it reads; "all output tiles of node p"
// (num_flags + p) for a box that covers the whole producer; and "all output
// tiles of row block mb of node p" (row_unit_begin[p] + mb) for a box whose
// rows it covers whole. A job that reads whole producer rows (an A of K
// columns) so waits on a unit a row block, not on every tile: needs grow
// with the jobs, not with jobs x K (131072 x 131072 x 131072 took 18 s and
// 4 GB of host memory to compile with a unit a tile).
struct JobGraph {
  std::vector<TileJob> jobs;       // node by node, each node's in raster order
  std::vector<int64_t> job_counts;  // per node
  int64_t num_units = 0;
  std::vector<int64_t> row_unit_begin;  // per node
  std::vector<int64_t> need_begin;  // per job, into needs; one extra at the end
  // Per job, into needs: from here to the next job's need_begin, the split-K
  // partial flags it sums (PartialsSummed), which a kGemm job (the last split
  // of a node whose last split sums) waits for only after its main loop.
  std::vector<int64_t> partials_begin;
  std::vector<int64_t> needs;       // units, per job: its other needs, then its partials, each sorted and unique
  std::vector<int64_t> write_begin;  // per job, into writes; one extra at the end
  std::vector<FlagWrite> writes;
  std::vector<int64_t> waiter_begin;  // per unit, into waiters; one extra at the end
  std::vector<int64_t> waiters;       // jobs, per unit: the reverse of needs
  std::vector<int32_t> depth;         // per node (NodeDepthAndHeight)
  std::vector<int64_t> height;        // per node
};

// Depth (longest path from a source, in edges) and height (longest path to a
// sink, in jobs, this node's included) of each node. Producers have smaller
// indices than consumers, so one pass each way suffices.
void NodeDepthAndHeight(const Schedule& schedule, const std::vector<int64_t>& job_counts,
                        std::vector<int32_t>* depth, std::vector<int64_t>* height) {
  const int num_nodes = static_cast<int>(schedule.nodes.size());
  depth->assign(num_nodes, 0);
  height->assign(num_nodes, 0);
  for (int i = 0; i < num_nodes; ++i) {
    const NodeSchedule& node = schedule.nodes[i];
    for (int32_t e = 0; e < node.dependency_count; ++e) {
      const int32_t p = schedule.dependencies[node.dependency_begin + e].producer;
      (*depth)[i] = std::max((*depth)[i], (*depth)[p] + 1);
    }
  }
  std::vector<int64_t> below(num_nodes, 0);  // max height over consumers
  for (int i = num_nodes - 1; i >= 0; --i) {
    (*height)[i] = job_counts[i] + below[i];
    const NodeSchedule& node = schedule.nodes[i];
    for (int32_t e = 0; e < node.dependency_count; ++e) {
      const int32_t p = schedule.dependencies[node.dependency_begin + e].producer;
      below[p] = std::max(below[p], (*height)[i]);
    }
  }
}

JobGraph BuildJobGraph(const Schedule& schedule) {
  const int num_nodes = static_cast<int>(schedule.nodes.size());
  JobGraph g;
  g.job_counts.assign(num_nodes, 0);
  for (int i = 0; i < num_nodes; ++i) {
    std::vector<TileJob> node_jobs = NodeJobs(schedule, i);
    g.job_counts[i] = static_cast<int64_t>(node_jobs.size());
    g.jobs.insert(g.jobs.end(), node_jobs.begin(), node_jobs.end());
  }
  const int64_t num_jobs = static_cast<int64_t>(g.jobs.size());
  g.num_units = int64_t{schedule.num_flags} + num_nodes;
  g.row_unit_begin.assign(num_nodes, 0);
  for (int i = 0; i < num_nodes; ++i) {
    g.row_unit_begin[i] = g.num_units;
    g.num_units += schedule.nodes[i].m_blocks;
  }
  g.need_begin.assign(num_jobs + 1, 0);
  g.partials_begin.assign(num_jobs, 0);
  g.write_begin.assign(num_jobs + 1, 0);
  std::vector<ProducerBox> boxes;
  std::vector<FlagRead> partials;
  std::vector<int64_t> job_units;
  auto append_needs = [&] {  // job_units, sorted and unique
    std::sort(job_units.begin(), job_units.end());
    job_units.erase(std::unique(job_units.begin(), job_units.end()), job_units.end());
    g.needs.insert(g.needs.end(), job_units.begin(), job_units.end());
    job_units.clear();
  };
  for (int64_t j = 0; j < num_jobs; ++j) {
    const TileJob& job = g.jobs[j];
    boxes.clear();
    partials.clear();
    AppendJobReadBoxes(schedule, job, job.k_block_begin, job.k_block_end, ReadPhase::kMainLoop, &boxes);
    AppendJobReadBoxes(schedule, job, 0, 0, ReadPhase::kEpilogue, &boxes);
    AppendJobReads(schedule, job, 0, 0, ReadPhase::kPartials, &partials);
    for (const ProducerBox& pb : boxes) {
      const NodeSchedule& producer = schedule.nodes[pb.producer];
      const int64_t area = int64_t{pb.box.m_end - pb.box.m_begin} * (pb.box.n_end - pb.box.n_begin);
      if (area == int64_t{producer.m_blocks} * producer.n_blocks) {
        job_units.push_back(schedule.num_flags + pb.producer);
        continue;
      }
      if (pb.box.n_begin == 0 && pb.box.n_end == producer.n_blocks) {
        for (int32_t mb = pb.box.m_begin; mb < pb.box.m_end; ++mb) {
          job_units.push_back(g.row_unit_begin[pb.producer] + mb);
        }
        continue;
      }
      for (int32_t mb = pb.box.m_begin; mb < pb.box.m_end; ++mb) {
        for (int32_t nb = pb.box.n_begin; nb < pb.box.n_end; ++nb) {
          job_units.push_back(OutputFlagIndex(producer, mb, nb));
        }
      }
    }
    append_needs();
    g.partials_begin[j] = static_cast<int64_t>(g.needs.size());
    for (const FlagRead& r : partials) job_units.push_back(r.flag);
    append_needs();
    g.need_begin[j + 1] = static_cast<int64_t>(g.needs.size());
    AppendJobWrites(schedule, job, &g.writes);
    g.write_begin[j + 1] = static_cast<int64_t>(g.writes.size());
  }
  g.waiter_begin.assign(g.num_units + 1, 0);
  for (int64_t u : g.needs) ++g.waiter_begin[u + 1];
  for (int64_t u = 0; u < g.num_units; ++u) g.waiter_begin[u + 1] += g.waiter_begin[u];
  g.waiters.resize(g.needs.size());
  std::vector<int64_t> fill(g.waiter_begin.begin(), g.waiter_begin.end() - 1);
  for (int64_t j = 0; j < num_jobs; ++j) {
    for (int64_t i = g.need_begin[j]; i < g.need_begin[j + 1]; ++i) g.waiters[fill[g.needs[i]]++] = j;
  }
  NodeDepthAndHeight(schedule, g.job_counts, &g.depth, &g.height);
  return g;
}

// The wavefront order under `priority`, as job indices into g.jobs.
std::vector<int64_t> WavefrontOrder(const Schedule& schedule, const JobGraph& g, int64_t lag,
                                    NodePriority priority) {
  const int num_nodes = static_cast<int>(schedule.nodes.size());
  const int64_t num_jobs = static_cast<int64_t>(g.jobs.size());

  // Ready jobs not yet eligible, by the position from which they are
  // (min-heap); eligible jobs per node, by job index (= raster order, min-heap);
  // nodes with eligible jobs, by priority: deepest (or shallowest), then
  // longest remaining critical path, then lowest index.
  using Pending = std::pair<int64_t, int64_t>;  // (eligible_from, job)
  std::priority_queue<Pending, std::vector<Pending>, std::greater<>> pending;
  std::vector<std::priority_queue<int64_t, std::vector<int64_t>, std::greater<>>> eligible(num_nodes);
  using NodeKey = std::tuple<int32_t, int64_t, int32_t>;  // (+-depth, -height, node)
  std::set<NodeKey> eligible_nodes;
  const int32_t depth_sign = priority == NodePriority::kDeepestFirst ? -1 : 1;
  auto node_key = [&](int32_t i) { return NodeKey{depth_sign * g.depth[i], -g.height[i], i}; };
  auto make_eligible = [&](int64_t j) {
    const int32_t node = g.jobs[j].node;
    if (eligible[node].empty()) eligible_nodes.insert(node_key(node));
    eligible[node].push(j);
  };

  std::vector<int64_t> missing(num_jobs);
  std::vector<int64_t> latest_producer(num_jobs, -1);  // queue position of the last unit it needs
  for (int64_t j = 0; j < num_jobs; ++j) {
    missing[j] = g.need_begin[j + 1] - g.need_begin[j];
    if (missing[j] == 0) pending.push({0, j});
  }
  auto release_unit = [&](int64_t unit, int64_t position) {
    for (int64_t i = g.waiter_begin[unit]; i < g.waiter_begin[unit + 1]; ++i) {
      const int64_t j = g.waiters[i];
      latest_producer[j] = std::max(latest_producer[j], position);
      if (--missing[j] == 0) pending.push({latest_producer[j] + lag, j});
    }
  };

  std::vector<int64_t> output_tiles_left(num_nodes);
  const int64_t first_row_unit = int64_t{schedule.num_flags} + num_nodes;
  std::vector<int32_t> row_tiles_left(g.num_units - first_row_unit);  // by row unit - first_row_unit
  for (int i = 0; i < num_nodes; ++i) {
    output_tiles_left[i] = int64_t{schedule.nodes[i].m_blocks} * schedule.nodes[i].n_blocks;
    for (int32_t mb = 0; mb < schedule.nodes[i].m_blocks; ++mb) {
      row_tiles_left[g.row_unit_begin[i] - first_row_unit + mb] = schedule.nodes[i].n_blocks;
    }
  }

  std::vector<int64_t> order;
  order.reserve(num_jobs);
  std::vector<int32_t> writers_seen(static_cast<size_t>(std::max(schedule.num_flags, 0)), 0);
  for (int64_t position = 0; position < num_jobs; ++position) {
    while (!pending.empty() && pending.top().first <= position) {
      make_eligible(pending.top().second);
      pending.pop();
    }
    if (eligible_nodes.empty()) {
      if (pending.empty()) break;  // inconsistent schedule; CheckQueue reports it
      make_eligible(pending.top().second);  // nothing else to do: take the earliest
      pending.pop();
    }
    const int32_t node = std::get<2>(*eligible_nodes.begin());
    const int64_t j = eligible[node].top();
    eligible[node].pop();
    if (eligible[node].empty()) eligible_nodes.erase(eligible_nodes.begin());

    order.push_back(j);
    for (int64_t w = g.write_begin[j]; w < g.write_begin[j + 1]; ++w) {
      const FlagWrite& write = g.writes[w];
      if (write.writers > 1 && ++writers_seen[write.flag] < write.writers) continue;  // a tile's other parts to come
      release_unit(write.flag, position);
      if (write.split >= 0) continue;  // a split-K partial
      const int64_t row_unit = g.row_unit_begin[node] + write.m_block;
      if (--row_tiles_left[row_unit - first_row_unit] == 0) release_unit(row_unit, position);
      if (--output_tiles_left[node] == 0) release_unit(schedule.num_flags + node, position);
    }
  }
  return order;
}

// A job's cost in the simulation, in k-blocks of one CTA tile (a kGemm job
// streams one B tile a k-block), in two phases: its main loop (its k-blocks;
// none for a reduce job), and after it, once the partials it sums are
// published, its tail: the partials' bytes at about twice a weight k-block's
// rate (they come from L2) plus an epilogue's worth.
struct SimulatedCost {
  int64_t main_loop = 0;
  int64_t tail = 0;
};
SimulatedCost SimulatedJobCost(const Schedule& schedule, const TileJob& job) {
  constexpr int64_t kEpilogueKBlocks = 4;
  const NodeSchedule& node = schedule.nodes[job.node];
  const bool reduce = job.kind == static_cast<uint8_t>(JobKind::kReduce);
  const RowRange rows = ReduceRowsOf(node, schedule.tile, reduce ? job.split : 0);
  // fp32 partial rows of tile.n against bf16 B rows of tile.n, tile.k of them a k-block.
  const int64_t partial_rows = int64_t{PartialsSummed(node, job)} * (rows.end - rows.begin);
  const int64_t main_loop = reduce ? 0 : int64_t{job.k_block_end} - job.k_block_begin;
  const int64_t partial_rows_a_k_block = int64_t{2} * 2 * schedule.tile.k;  // 64-bit: tile.k may be any int32
  return SimulatedCost{main_loop, kEpilogueKBlocks + (partial_rows * 4 + partial_rows_a_k_block - 1) /
                                                         partial_rows_a_k_block};
}

// The simulated makespan of `order` (indices into g.jobs): `clusters`
// clusters take the jobs in queue order, each as soon as it is free (the
// kernel's dynamic fetch); a job starts when its cluster is free and every
// unit it waits on but its partials is published, runs its main loop, waits
// for its partials, and then takes its tail (SimulatedJobCost).
int64_t MakespanOf(const Schedule& schedule, const JobGraph& g, const std::vector<int64_t>& order,
                   int32_t clusters) {
  std::vector<int64_t> unit_done(g.num_units, 0);  // when the last writer of each unit ends
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<>> free_at;
  // Clusters past one a job are never taken: at most order.size() of them
  // (a caller's INT_MAX would otherwise fill the heap with 2^31 entries).
  const int64_t used = std::clamp<int64_t>(clusters, 1, std::max<int64_t>(static_cast<int64_t>(order.size()), 1));
  for (int64_t c = 0; c < used; ++c) free_at.push(0);
  int64_t makespan = 0;
  for (const int64_t j : order) {
    int64_t start = free_at.top();
    free_at.pop();
    for (int64_t i = g.need_begin[j]; i < g.partials_begin[j]; ++i) start = std::max(start, unit_done[g.needs[i]]);
    const SimulatedCost cost = SimulatedJobCost(schedule, g.jobs[j]);
    int64_t tail_start = start + cost.main_loop;
    for (int64_t i = g.partials_begin[j]; i < g.need_begin[j + 1]; ++i) {
      tail_start = std::max(tail_start, unit_done[g.needs[i]]);
    }
    const int64_t done = tail_start + cost.tail;
    free_at.push(done);
    makespan = std::max(makespan, done);
    const int32_t node = g.jobs[j].node;
    for (int64_t w = g.write_begin[j]; w < g.write_begin[j + 1]; ++w) {
      const FlagWrite& write = g.writes[w];
      unit_done[write.flag] = std::max(unit_done[write.flag], done);
      if (write.split < 0) {  // an output tile: part of "all of node" and of its row block
        for (const int64_t unit : {int64_t{schedule.num_flags} + node, g.row_unit_begin[node] + write.m_block}) {
          unit_done[unit] = std::max(unit_done[unit], done);
        }
      }
    }
  }
  return makespan;
}

std::vector<TileJob> JobsInOrder(const JobGraph& g, const std::vector<int64_t>& order) {
  std::vector<TileJob> queue;
  queue.reserve(order.size());
  for (const int64_t j : order) queue.push_back(g.jobs[j]);
  return queue;
}

}  // namespace

std::vector<TileJob> WavefrontQueue(const Schedule& schedule, int64_t lag, NodePriority priority) {
  const JobGraph g = BuildJobGraph(schedule);
  return JobsInOrder(g, WavefrontOrder(schedule, g, lag, priority));
}

namespace {

// Both wavefront orders of g's jobs and, where they differ, their makespans.
struct OrderPair {
  std::vector<int64_t> deepest, shallowest;
  bool agree = false;
  int64_t deepest_makespan = -1, shallowest_makespan = -1;
};
OrderPair BothOrders(const Schedule& schedule, const JobGraph& g, int64_t lag) {
  OrderPair pair{WavefrontOrder(schedule, g, lag, NodePriority::kDeepestFirst),
                 WavefrontOrder(schedule, g, lag, NodePriority::kShallowestFirst)};
  pair.agree = pair.deepest == pair.shallowest;
  if (!pair.agree) {
    const int32_t clusters = static_cast<int32_t>(std::clamp<int64_t>(lag, 1, int64_t{1} << 20));
    pair.deepest_makespan = MakespanOf(schedule, g, pair.deepest, clusters);
    pair.shallowest_makespan = MakespanOf(schedule, g, pair.shallowest, clusters);
  }
  return pair;
}

}  // namespace

std::vector<TileJob> OrderQueue(const Schedule& schedule, int64_t lag) {
  const JobGraph g = BuildJobGraph(schedule);
  const OrderPair pair = BothOrders(schedule, g, lag);
  // Deepest-first only where it simulates strictly shorter (a tie: queue.h).
  const bool deepest = pair.agree || pair.deepest_makespan < pair.shallowest_makespan;
  return JobsInOrder(g, deepest ? pair.deepest : pair.shallowest);
}

WavefrontOrders BothWavefrontOrders(const Schedule& schedule, int64_t lag) {
  const JobGraph g = BuildJobGraph(schedule);
  const OrderPair pair = BothOrders(schedule, g, lag);
  return WavefrontOrders{JobsInOrder(g, pair.deepest), JobsInOrder(g, pair.shallowest),
                         pair.agree, pair.deepest_makespan, pair.shallowest_makespan};
}

int64_t SimulatedMakespan(const Schedule& schedule, const std::vector<TileJob>& queue, int32_t clusters) {
  const JobGraph g = BuildJobGraph(schedule);
  std::map<std::tuple<uint16_t, uint8_t, uint8_t, uint32_t, uint32_t>, int64_t> index;
  for (int64_t j = 0; j < static_cast<int64_t>(g.jobs.size()); ++j) {
    const TileJob& t = g.jobs[j];
    index[{t.node, t.kind, t.split, t.m_block, t.n_block}] = j;
  }
  std::vector<int64_t> order;
  order.reserve(queue.size());
  for (const TileJob& t : queue) {
    const auto it = index.find({t.node, t.kind, t.split, t.m_block, t.n_block});
    if (it == index.end()) return -1;
    order.push_back(it->second);
  }
  return MakespanOf(schedule, g, order, clusters);
}

namespace {

auto JobKey(const TileJob& j) {
  return std::make_tuple(j.node, j.kind, j.split, j.m_block, j.n_block, j.k_block_begin, j.k_block_end);
}

std::string DescribeJob(const TileJob& j) {
  return absl::StrCat("node ", j.node, j.kind == static_cast<uint8_t>(JobKind::kReduce) ? " reduce part " : " gemm split ",
                      j.split, " m_block ", j.m_block, " n_block ", j.n_block, " k-blocks [",
                      j.k_block_begin, ", ", j.k_block_end, ")");
}

}  // namespace

absl::Status CheckQueue(const Schedule& schedule) {
  // Same jobs as the nodes define, each exactly once.
  std::vector<TileJob> expected;
  for (int i = 0; i < static_cast<int>(schedule.nodes.size()); ++i) {
    std::vector<TileJob> node_jobs = NodeJobs(schedule, i);
    expected.insert(expected.end(), node_jobs.begin(), node_jobs.end());
  }
  std::vector<TileJob> actual = schedule.queue;
  auto less = [](const TileJob& a, const TileJob& b) { return JobKey(a) < JobKey(b); };
  std::sort(expected.begin(), expected.end(), less);
  std::sort(actual.begin(), actual.end(), less);
  for (size_t i = 0; i < std::max(expected.size(), actual.size()); ++i) {
    if (i >= actual.size()) {
      return absl::InternalError(absl::StrCat("queue lacks job ", DescribeJob(expected[i])));
    }
    if (i >= expected.size() || JobKey(actual[i]) != JobKey(expected[i])) {
      const bool duplicate = i > 0 && JobKey(actual[i]) == JobKey(actual[i - 1]);
      return absl::InternalError(absl::StrCat("queue has ", duplicate ? "a duplicate of " : "an unexpected ",
                                              "job ", DescribeJob(actual[i])));
    }
  }

  // Topological: every flag a job waits on is written by earlier jobs (all
  // its writers, for the output flag of a tile reduced in parts).
  std::vector<char> written(static_cast<size_t>(std::max(schedule.num_flags, 0)), 0);
  std::vector<int32_t> writers_seen(written.size(), 0);
  std::vector<FlagRead> reads;
  std::vector<FlagWrite> writes;
  for (size_t position = 0; position < schedule.queue.size(); ++position) {
    const TileJob& job = schedule.queue[position];
    reads.clear();
    AppendEveryJobRead(schedule, job, &reads);
    for (const FlagRead& r : reads) {
      if (r.flag < 0 || r.flag >= schedule.num_flags || !written[r.flag]) {
        return absl::InternalError(absl::StrCat(
            "queue position ", position, " (", DescribeJob(job), ") reads node ", r.producer, " tile (",
            r.m_block, ", ", r.n_block, ")", r.split >= 0 ? absl::StrCat(" split ", r.split) : "",
            " (flag ", r.flag, ") before any job that writes it"));
      }
    }
    writes.clear();
    AppendJobWrites(schedule, job, &writes);
    for (const FlagWrite& w : writes) {
      if (w.flag < 0 || w.flag >= schedule.num_flags) {
        return absl::InternalError(absl::StrCat("queue position ", position, " (", DescribeJob(job),
                                                ") writes flag ", w.flag, " outside [0, ",
                                                schedule.num_flags, ")"));
      }
      if (++writers_seen[w.flag] >= w.writers) written[w.flag] = 1;
    }
  }
  return absl::OkStatus();
}

int32_t IdleClustersAtLaunch(const Schedule& schedule, int32_t clusters) {
  int32_t idle = clusters;
  std::vector<FlagRead> reads;
  const size_t first_wave = std::min(schedule.queue.size(), static_cast<size_t>(std::max(clusters, 0)));
  for (size_t position = 0; position < first_wave; ++position) {
    const TileJob& job = schedule.queue[position];
    reads.clear();
    AppendJobReads(schedule, job, job.k_block_begin, job.k_block_end, ReadPhase::kMainLoop, &reads);
    AppendJobReads(schedule, job, 0, 0, ReadPhase::kEpilogue, &reads);
    if (job.kind == static_cast<uint8_t>(JobKind::kReduce)) {
      AppendJobReads(schedule, job, 0, 0, ReadPhase::kPartials, &reads);
    }
    if (reads.empty()) --idle;
  }
  return idle;
}

}  // namespace loom::sched
