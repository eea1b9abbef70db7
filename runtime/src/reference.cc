// reference.cc: the CPU reference executor (loom/reference.h).
//
// A ReferenceExecutor holds, per node, a done bit for every output tile and
// for every split-K partial (the host mirror of the kernel's flags) and an
// FP64 partial workspace. A job is "ready" when every flag it waits for is
// done; which flags those are is sched::AppendJobReads (job_access.h), the
// model the queue order, the queue checker and the simulator share, so the
// reference runs a schedule under the same waits they assume. Executing a job
// computes its CTA tiles and sets their bits. The queue-order run requires
// each job to be ready when its turn comes (the queue must be topological);
// the simulated run lets virtual SMs hold jobs that are not ready yet and
// spin, like the GPU's CTAs do.
//
// Beside the flags, OutputWrites follows the data itself: which elements of
// the nodes' outputs have been written, and which host bytes they are. A job
// that reads an output byte before it is written fails the run, whatever the
// flags said, so a read model that waits for too little (a missing edge, a
// wrong producer box, a phase without its reads) cannot pass unseen.
#include "loom/reference.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <new>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "internal/host_memory.h"
#include "internal/view_overlap.h"
#include "loom/graph.h"
#include "loom/ops/reference.h"
#include "loom/runtime.h"
#include "loom/scheduler/job_access.h"
#include "loom/scheduler/schedule.h"
#include "loom/scheduler/tiling.h"
#include "loom/status.h"

namespace loom {
namespace {

using sched::JobKind;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The part of a node's problem one CTA tile covers, clipped to the node.
struct TileExtent {
  int64_t row_begin = 0, row_end = 0;          // rows of A and C
  int64_t acc_col_begin = 0, acc_col_end = 0;  // accumulator columns (rows of B)
  int64_t out_col_begin = 0, out_col_end = 0;  // columns of C
  int64_t k_begin = 0, k_end = 0;              // the job's k range, in elements
};

// Which elements of the graph's outputs (every node's C) have been written
// so far, and whether a view's elements are outputs not yet written. The
// graph's rules (GemmGraph::Validate: no two writers, no in-place node, no
// write after read) make every output element written exactly once, before
// anyone may read it. Reads are matched on bytes (a view may reinterpret an
// output: a column slice, a reshape), with a flag an element of each output,
// so the memory is the outputs' elements whatever their strides.
class OutputWrites {
 public:
  explicit OutputWrites(const GemmGraph& graph);

  // Marks elements [row_begin, row_end) x [col_begin, col_end) of node
  // `node`'s C written.
  void MarkWritten(int node, int64_t row_begin, int64_t row_end, int64_t col_begin, int64_t col_end);
  // The first element of that block of `view` some byte of which belongs to
  // an output element not yet written, as (row, column) of the view; nullopt
  // when there is none.
  std::optional<std::pair<int64_t, int64_t>> FirstUnwritten(const TensorView& view, int64_t row_begin,
                                                            int64_t row_end, int64_t col_begin,
                                                            int64_t col_end) const;

 private:
  struct Output {
    const TensorView* c;
    std::vector<uint8_t> written;  // [rows][cols]
  };
  static intptr_t Address(const TensorView& view, int64_t row, int64_t col) {
    return reinterpret_cast<intptr_t>(view.element(row, col));
  }
  // The first unwritten element of `output` with a byte in [begin, end), as
  // its first byte's address; nullopt when there is none.
  static std::optional<intptr_t> FirstUnwrittenIn(const Output& output, intptr_t begin, intptr_t end);

  std::vector<Output> outputs_;  // one a node, in node order (empty for an empty C)
  // The non-empty outputs' byte extents [first byte, last byte + 1), by
  // first byte, with the largest end up to each (a read looks only at the
  // outputs whose extents meet it: a long chain's reads would otherwise scan
  // every node's output, quadratic in the nodes).
  struct Extent {
    intptr_t begin, end;
    int node;
  };
  std::vector<Extent> extents_;
  std::vector<intptr_t> max_end_;  // [i]: the largest end of extents_[0..i]
};

OutputWrites::OutputWrites(const GemmGraph& graph) {
  for (int i = 0; i < graph.size(); ++i) {
    const TensorView& c = graph.nodes()[i].c;
    outputs_.push_back(Output{&c, std::vector<uint8_t>(static_cast<size_t>(c.rows * c.cols), 0)});
    if (c.empty()) continue;
    extents_.push_back({Address(c, 0, 0), Address(c, c.rows - 1, c.cols), i});  // past the last element
  }
  std::sort(extents_.begin(), extents_.end(), [](const Extent& a, const Extent& b) { return a.begin < b.begin; });
  for (const Extent& extent : extents_) {
    max_end_.push_back(max_end_.empty() ? extent.end : std::max(max_end_.back(), extent.end));
  }
}

void OutputWrites::MarkWritten(int node, int64_t row_begin, int64_t row_end, int64_t col_begin, int64_t col_end) {
  Output& output = outputs_[node];
  for (int64_t row = row_begin; row < row_end; ++row) {
    std::fill(output.written.begin() + row * output.c->cols + col_begin,
              output.written.begin() + row * output.c->cols + col_end, uint8_t{1});
  }
}

std::optional<intptr_t> OutputWrites::FirstUnwrittenIn(const Output& output, intptr_t begin, intptr_t end) {
  const TensorView& c = *output.c;
  if (c.empty()) return std::nullopt;
  const intptr_t base = Address(c, 0, 0);
  const intptr_t element = static_cast<intptr_t>(c.element_size());
  const intptr_t row_bytes = c.cols * element;
  // The rows of C whose bytes [base + i * stride, + row_bytes) meet [begin, end).
  int64_t first_row = 0, last_row = 0;
  if (c.rows > 1) {
    const intptr_t stride = c.row_stride_bytes();
    const intptr_t low = begin - base - row_bytes + 1;  // rows i with i * stride >= low end after begin
    first_row = std::max<int64_t>(0, low <= 0 ? 0 : (low + stride - 1) / stride);
    last_row = std::min<int64_t>(c.rows - 1, end - 1 - base < 0 ? -1 : (end - 1 - base) / stride);
  }
  for (int64_t row = first_row; row <= last_row; ++row) {
    const intptr_t row_start = Address(c, row, 0);
    const intptr_t from = std::max(begin, row_start), to = std::min(end, row_start + row_bytes);
    if (from >= to) continue;
    for (int64_t col = (from - row_start) / element; col <= (to - 1 - row_start) / element; ++col) {
      if (!output.written[static_cast<size_t>(row * c.cols + col)]) return Address(c, row, col);
    }
  }
  return std::nullopt;
}

std::optional<std::pair<int64_t, int64_t>> OutputWrites::FirstUnwritten(const TensorView& view,
                                                                       int64_t row_begin, int64_t row_end,
                                                                       int64_t col_begin,
                                                                       int64_t col_end) const {
  if (col_begin >= col_end) return std::nullopt;
  const intptr_t element = static_cast<intptr_t>(view.element_size());
  for (int64_t row = row_begin; row < row_end; ++row) {
    const intptr_t begin = Address(view, row, col_begin), end = Address(view, row, col_end);
    std::optional<intptr_t> first;
    // The extents that start before `end`, from the last back to where none
    // before can reach `begin`.
    const auto past = std::partition_point(extents_.begin(), extents_.end(),
                                           [end](const Extent& extent) { return extent.begin < end; });
    for (int64_t i = (past - extents_.begin()) - 1; i >= 0 && max_end_[i] > begin; --i) {
      if (extents_[i].end <= begin) continue;
      const std::optional<intptr_t> found = FirstUnwrittenIn(outputs_[extents_[i].node], begin, end);
      if (found && (!first || *found < *first)) first = found;
    }
    // The view's element holding that output element's first byte (or, when
    // the output element starts before the row's read, the first read).
    if (first) return std::make_pair(row, std::max<int64_t>(col_begin, (*first - Address(view, row, 0)) / element));
  }
  return std::nullopt;
}

// The host memory a node's state takes (AllocateNodeState): two flags a
// tile and, split-K, the FP64 partials with each partial's k-blocks and done
// flag.
struct NodeStateSize {
  size_t tiles = 0, partials = 0, elements = 0;  // elements: of the partials, split_k x M x N
  size_t bytes = 0;
};

class ReferenceExecutor {
 public:
  ReferenceExecutor(const GemmGraph& graph, const sched::Schedule& schedule)
      : graph_(graph), schedule_(schedule) {}

  // Checks that the schedule describes the graph and allocates the state.
  absl::Status Prepare();
  // Whether every flag `job` waits for (sched::AppendJobReads) is set. If
  // not, `blocker` (when non-null) says which one is missing.
  bool Ready(const sched::TileJob& job, std::string* blocker) const;
  // Computes the CTA tiles of queue entry `index`.
  absl::Status Execute(size_t index);
  // Every output tile of every node was computed.
  absl::Status CheckComplete() const;

  std::string DescribeJob(size_t index) const;

 private:
  struct NodeState {
    std::vector<uint8_t> tile_done;     // [m_blocks * n_blocks]
    std::vector<uint8_t> parts_done;    // [m_blocks * n_blocks]: reduce parts done, one bit each
    std::vector<uint8_t> partial_done;  // [tiles * split_k]
    // [tiles * split_k]: the k-blocks each partial covers.
    std::vector<std::pair<int32_t, int32_t>> partial_k_blocks;
    std::vector<double> workspace;      // [split_k][m][n] FP64 partials (split_k > 1)
  };

  const sched::NodeSchedule& node_schedule(int node) const { return schedule_.nodes[node]; }
  // Prepare's allocations for node `i`, of `size`: ResourceExhausted where they do not fit.
  absl::Status AllocateNodeState(int i, const NodeStateSize& size);
  // Every node's state size, each counted without overflow and together
  // inside the host's memory; else ResourceExhausted naming the node.
  absl::StatusOr<std::vector<NodeStateSize>> SizeStateForHost() const;
  // Node `i`'s state does not fit; `why` ends the message.
  absl::Status NodeStateTooLarge(int i, std::string_view why) const;
  // The CTA tile of `job` at cluster rank `rank`; false when it lies outside the node.
  bool TileOf(const sched::TileJob& job, int rank, sched::CtaTile* tile, TileExtent* extent) const;
  // Whether the flag `read` names is set (the host mirror of it).
  bool FlagSet(const sched::FlagRead& read) const;
  // The rows of C whose epilogue `job` runs in the CTA tile of `extent`: all of
  // the tile's, or a reduce part's.
  std::pair<int64_t, int64_t> EpilogueRows(const sched::TileJob& job, const TileExtent& extent) const;
  // Internal error when the CTA tile reads an output byte no job has written.
  absl::Status CheckReadsWritten(const sched::TileJob& job, const TileExtent& extent, size_t index) const;

  absl::Status ComputeTile(const sched::TileJob& job, const sched::CtaTile& tile,
                           const TileExtent& extent, size_t index);
  absl::Status ComputePartial(const sched::TileJob& job, const sched::CtaTile& tile,
                              const TileExtent& extent, size_t index);
  absl::Status ReduceTile(const sched::TileJob& job, const sched::CtaTile& tile,
                          const TileExtent& extent, size_t index);

  const GemmGraph& graph_;
  const sched::Schedule& schedule_;
  std::vector<NodeState> state_;
  std::optional<OutputWrites> output_writes_;  // made by Prepare, once the host views are checked
  mutable std::vector<sched::FlagRead> reads_;  // Ready's scratch
};

// Node `ns`'s state size; null where a count overflows size_t.
std::optional<NodeStateSize> NodeStateSizeOf(const sched::NodeSchedule& ns) {
  NodeStateSize size;
  size_t partial_bytes = 0;
  const size_t split = ns.split_k > 1 ? 1 : 0;  // 1 where the node has partials
  const bool counted =
      !__builtin_mul_overflow(static_cast<size_t>(ns.m_blocks), static_cast<size_t>(ns.n_blocks), &size.tiles) &&
      !__builtin_mul_overflow(size.tiles, static_cast<size_t>(ns.split_k), &size.partials) &&
      !__builtin_mul_overflow(static_cast<size_t>(ns.split_k), static_cast<size_t>(ns.m), &size.elements) &&
      !__builtin_mul_overflow(size.elements, static_cast<size_t>(ns.n), &size.elements) &&
      !__builtin_mul_overflow(size.elements, sizeof(double) * split, &size.bytes) &&
      !__builtin_mul_overflow(size.partials, (sizeof(std::pair<int32_t, int32_t>) + 1) * split, &partial_bytes) &&
      !__builtin_add_overflow(size.bytes, partial_bytes, &size.bytes) &&
      !__builtin_add_overflow(size.bytes, 2 * size.tiles, &size.bytes);
  if (!counted) return std::nullopt;
  return size;
}

absl::Status ReferenceExecutor::NodeStateTooLarge(int i, std::string_view why) const {
  const sched::NodeSchedule& ns = schedule_.nodes[i];
  return absl::ResourceExhaustedError(absl::StrFormat(
      "RunReference: %s's tile flags (%d x %d tiles) and split-K partials (split_k %d x M %d x N %d doubles) "
      "do not fit in host memory%s",
      graph_.NodeLabel(i), ns.m_blocks, ns.n_blocks, ns.split_k, ns.m, ns.n, why));
}

// A plan's sizes are the caller's, and Compile accepts splits of outputs far
// larger than their FP64 partials can be here. So before any node's state is
// filled, the nodes' state together must fit the memory this process can
// still be given (internal::HostMemoryBudgetOf: physical, available, and a
// cgroup's room): a host that overcommits memory would hand such allocations
// out and let the fill run into the OOM killer.
absl::StatusOr<std::vector<NodeStateSize>> ReferenceExecutor::SizeStateForHost() const {
  const std::optional<internal::HostMemoryBudget> budget = internal::HostMemoryBudgetOf(internal::ReadHostMemoryFacts());
  std::vector<NodeStateSize> sizes;
  size_t total = 0;
  for (int i = 0; i < graph_.size(); ++i) {
    const std::optional<NodeStateSize> size = NodeStateSizeOf(schedule_.nodes[i]);
    if (!size || __builtin_add_overflow(total, size->bytes, &total)) return NodeStateTooLarge(i, "");
    sizes.push_back(*size);
    if (budget && total > budget->bytes) {
      return NodeStateTooLarge(i, absl::StrFormat(": the nodes' state up to it takes %d bytes, and this host has %d "
                                                  "bytes for it (%s)",
                                                  total, budget->bytes, budget->source));
    }
  }
  return sizes;
}

// Node `i`'s flags and, split-K, its partials, of `size` (SizeStateForHost);
// ResourceExhausted where an allocation fails.
absl::Status ReferenceExecutor::AllocateNodeState(int i, const NodeStateSize& size) {
  NodeState& s = state_[i];
  try {
    // The largest first: where it cannot fit, nothing else was filled.
    if (schedule_.nodes[i].split_k > 1) {
      // NaN, so a partial read before it is written cannot go unnoticed.
      s.workspace.assign(size.elements, std::numeric_limits<double>::quiet_NaN());
      s.partial_k_blocks.assign(size.partials, {0, 0});
      s.partial_done.assign(size.partials, 0);
    }
    s.tile_done.assign(size.tiles, 0);
    s.parts_done.assign(size.tiles, 0);
  } catch (const std::bad_alloc&) {
    return NodeStateTooLarge(i, "");
  } catch (const std::length_error&) {  // past a vector's max_size
    return NodeStateTooLarge(i, "");
  }
  return absl::OkStatus();
}

absl::Status ReferenceExecutor::Prepare() {
  const sched::TileShape& t = schedule_.tile;
  if (static_cast<int>(schedule_.nodes.size()) != graph_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "schedule has %d nodes but the graph has %d", schedule_.nodes.size(), graph_.size()));
  }
  if (t.m <= 0 || t.n <= 0 || t.k <= 0 || (schedule_.cluster_size != 1 && schedule_.cluster_size != 2)) {
    return absl::InternalError(absl::StrFormat(
        "schedule: tile %dx%dx%d with cluster size %d is not a valid tiling (cluster size 1 or 2)", t.m, t.n,
        t.k, schedule_.cluster_size));
  }
  state_.resize(schedule_.nodes.size());
  for (int i = 0; i < graph_.size(); ++i) {
    const GemmNode& node = graph_.nodes()[i];
    const sched::NodeSchedule& ns = schedule_.nodes[i];
    if (ns.m != node.m() || ns.n != node.n() || ns.k != node.k() ||
        ns.out_cols != node.out_cols()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "node %d \"%s\": graph shape M=%d N=%d K=%d (out %d) but schedule says M=%d N=%d "
          "K=%d (out %d)",
          i, node.name, node.m(), node.n(), node.k(), node.out_cols(), ns.m, ns.n, ns.k,
          ns.out_cols));
    }
    const int64_t expected_out_tile_n = node.epilogue.activation == Activation::kSwiGLU ? t.n / 2 : t.n;
    if (ns.m_blocks != CeilDiv(ns.m, t.m) || ns.n_blocks != CeilDiv(ns.n, t.n) ||
        ns.k_blocks != CeilDiv(ns.k, t.k) || ns.out_tile_n != expected_out_tile_n ||
        ns.split_k < 1 || ns.split_k > std::max(ns.k_blocks, 1) || ns.split_k > sched::kMaxSplitK) {
      return absl::InternalError(absl::StrFormat(
          "schedule: node %d \"%s\" has m/n/k blocks %d/%d/%d, out tile n %d, split_k %d; "
          "tile %dx%dx%d gives %d/%d/%d, out tile n %d, split_k in [1, max(k_blocks, 1)]",
          i, node.name, ns.m_blocks, ns.n_blocks, ns.k_blocks, ns.out_tile_n, ns.split_k, t.m,
          t.n, t.k, CeilDiv(ns.m, t.m), CeilDiv(ns.n, t.n), CeilDiv(ns.k, t.k),
          expected_out_tile_n));
    }
    // The reduce jobs' rows must cover every row of a tile (a tile of the
    // last row block may have fewer than tile.m).
    const bool parts_cover_tile =
        ns.reduce_parts == 1 || (ns.reduce_parts == 0 && ns.split_k > 1) ||
        (ns.reduce_parts > 1 && ns.reduce_parts <= sched::kMaxReduceParts && ns.reduce_part_rows >= 1 &&
         ns.reduce_part_rows <= sched::kFewRowReduceRows &&
         int64_t{ns.reduce_parts} * ns.reduce_part_rows >= std::min<int64_t>(t.m, ns.m));
    if (!parts_cover_tile) {
      return absl::InternalError(absl::StrFormat(
          "schedule: node %d \"%s\" has reduce_parts %d of %d rows (split_k %d), which do not cover its tiles' "
          "min(tile.m %d, M %d) rows (parts: 0 with split_k > 1, 1, or 2-%d of 1-%d rows)",
          i, node.name, ns.reduce_parts, ns.reduce_part_rows, ns.split_k, t.m, ns.m, sched::kMaxReduceParts,
          sched::kFewRowReduceRows));
    }
    if (ns.dependency_begin < 0 || ns.dependency_count < 0 ||
        static_cast<size_t>(ns.dependency_begin) + ns.dependency_count >
            schedule_.dependencies.size()) {
      return absl::InternalError(absl::StrFormat(
          "schedule: node %d \"%s\" has dependencies [%d, %d) of %d", i, node.name,
          ns.dependency_begin, ns.dependency_begin + ns.dependency_count,
          schedule_.dependencies.size()));
    }
    for (int d = 0; d < ns.dependency_count; ++d) {
      const sched::DependencyEdge& edge = schedule_.dependencies[ns.dependency_begin + d];
      if (absl::Status status = sched::CheckDependencyEdge(edge, i); !status.ok()) {
        return absl::InternalError(
            absl::StrFormat("schedule: node %d \"%s\": dependency %d %s", i, node.name, d, status.message()));
      }
    }
  }
  const absl::StatusOr<std::vector<NodeStateSize>> sizes = SizeStateForHost();
  if (!sizes.ok()) return sizes.status();
  for (int i = 0; i < graph_.size(); ++i) LOOM_RETURN_IF_ERROR(AllocateNodeState(i, (*sizes)[i]));
  output_writes_.emplace(graph_);
  return absl::OkStatus();
}

bool ReferenceExecutor::TileOf(const sched::TileJob& job, int rank, sched::CtaTile* tile,
                               TileExtent* extent) const {
  const sched::NodeSchedule& ns = node_schedule(job.node);
  const sched::TileShape& t = schedule_.tile;
  *tile = sched::CtaTileOf(job, ns.share, rank);
  if (tile->m_block < 0 || tile->m_block >= ns.m_blocks || tile->n_block < 0 ||
      tile->n_block >= ns.n_blocks) {
    return false;
  }
  extent->row_begin = static_cast<int64_t>(tile->m_block) * t.m;
  extent->row_end = std::min<int64_t>(extent->row_begin + t.m, ns.m);
  extent->acc_col_begin = static_cast<int64_t>(tile->n_block) * t.n;
  extent->acc_col_end = std::min<int64_t>(extent->acc_col_begin + t.n, ns.n);
  extent->out_col_begin = static_cast<int64_t>(tile->n_block) * ns.out_tile_n;
  extent->out_col_end = std::min<int64_t>(extent->out_col_begin + ns.out_tile_n, ns.out_cols);
  extent->k_begin = std::min<int64_t>(static_cast<int64_t>(job.k_block_begin) * t.k, ns.k);
  extent->k_end = std::min<int64_t>(static_cast<int64_t>(job.k_block_end) * t.k, ns.k);
  return true;
}

bool ReferenceExecutor::FlagSet(const sched::FlagRead& read) const {
  const sched::NodeSchedule& producer = node_schedule(read.producer);
  const NodeState& s = state_[read.producer];
  const size_t tile = static_cast<size_t>(read.m_block) * producer.n_blocks + read.n_block;
  return read.split >= 0 ? s.partial_done[tile * producer.split_k + read.split] != 0 : s.tile_done[tile] != 0;
}

bool ReferenceExecutor::Ready(const sched::TileJob& job, std::string* blocker) const {
  // A malformed job is "ready": Execute reports what is wrong with it.
  if (job.node >= schedule_.nodes.size()) return true;
  const sched::NodeSchedule& ns = node_schedule(job.node);
  const bool reduce = job.kind == static_cast<uint8_t>(JobKind::kReduce);
  if ((job.kind != static_cast<uint8_t>(JobKind::kGemm) && !reduce) || (reduce && ns.split_k == 1)) {
    return true;
  }
  reads_.clear();
  sched::AppendEveryJobRead(schedule_, job, &reads_);
  for (const sched::FlagRead& read : reads_) {
    if (FlagSet(read)) continue;
    if (blocker != nullptr) {
      *blocker = read.split >= 0
                     ? absl::StrFormat("split-K partial %d of its own tile (m_block %d, n_block %d)",
                                       read.split, read.m_block, read.n_block)
                     : absl::StrFormat("tile (m_block %d, n_block %d) of node %d \"%s\"", read.m_block,
                                       read.n_block, read.producer, graph_.nodes()[read.producer].name);
    }
    return false;
  }
  return true;
}

std::pair<int64_t, int64_t> ReferenceExecutor::EpilogueRows(const sched::TileJob& job,
                                                            const TileExtent& e) const {
  if (job.kind != static_cast<uint8_t>(JobKind::kReduce)) return {e.row_begin, e.row_end};
  const sched::RowRange part = sched::ReduceRowsOf(node_schedule(job.node), schedule_.tile, job.split);
  return {e.row_begin + part.begin, std::min(e.row_end, e.row_begin + part.end)};
}

absl::Status ReferenceExecutor::CheckReadsWritten(const sched::TileJob& job, const TileExtent& e,
                                                  size_t index) const {
  const sched::NodeSchedule& ns = node_schedule(job.node);
  const GemmNode& node = graph_.nodes()[job.node];
  // Internal error when that block of `view` holds an output element no job
  // has written.
  const auto check = [&](const char* role, const TensorView& view, int64_t row_begin, int64_t row_end,
                         int64_t col_begin, int64_t col_end) -> absl::Status {
    const auto unwritten = output_writes_->FirstUnwritten(view, row_begin, row_end, col_begin, col_end);
    if (!unwritten) return absl::OkStatus();
    return absl::InternalError(absl::StrFormat(
        "schedule: %s reads %s \"%s\" element (%d, %d), another node's output, before any job wrote it "
        "(the flags it waited for did not cover it)",
        DescribeJob(index), role, view.name, unwritten->first, unwritten->second));
  };
  if (job.kind == static_cast<uint8_t>(JobKind::kGemm)) {
    LOOM_RETURN_IF_ERROR(check("A", node.a, e.row_begin, e.row_end, e.k_begin, e.k_end));
    LOOM_RETURN_IF_ERROR(check("B", node.b, e.acc_col_begin, e.acc_col_end, e.k_begin, e.k_end));
  }
  if (!sched::JobRunsEpilogue(ns, job)) return absl::OkStatus();
  if (node.epilogue.bias) {
    LOOM_RETURN_IF_ERROR(check("bias", *node.epilogue.bias, 0, 1, e.acc_col_begin, e.acc_col_end));
  }
  if (node.epilogue.residual) {
    const auto [row_begin, row_end] = EpilogueRows(job, e);
    LOOM_RETURN_IF_ERROR(check("residual", *node.epilogue.residual, row_begin, row_end, e.out_col_begin,
                               e.out_col_end));
  }
  return absl::OkStatus();
}

std::string ReferenceExecutor::DescribeJob(size_t index) const {
  const sched::TileJob& job = schedule_.queue[index];
  const std::string node_name =
      job.node < graph_.nodes().size() ? graph_.nodes()[job.node].name : "?";
  return absl::StrFormat("job %d (node %d \"%s\", %s %d, m_block %d, n_block %d, "
                         "k-blocks [%d, %d))",
                         index, job.node, node_name,
                         job.kind == static_cast<uint8_t>(JobKind::kReduce) ? "reduce, part" : "gemm, split",
                         job.split, job.m_block, job.n_block, job.k_block_begin, job.k_block_end);
}

absl::Status ReferenceExecutor::Execute(size_t index) {
  const sched::TileJob& job = schedule_.queue[index];
  if (job.node >= schedule_.nodes.size()) {
    return absl::InternalError(absl::StrCat("schedule: ", DescribeJob(index),
                                            " names a node the graph does not have"));
  }
  const sched::NodeSchedule& ns = node_schedule(job.node);
  if (job.kind != static_cast<uint8_t>(JobKind::kGemm) &&
      job.kind != static_cast<uint8_t>(JobKind::kReduce)) {
    return absl::InternalError(
        absl::StrCat("schedule: ", DescribeJob(index), " has unknown kind ", job.kind));
  }
  if (job.kind == static_cast<uint8_t>(JobKind::kReduce) && ns.split_k == 1) {
    return absl::InternalError(
        absl::StrCat("schedule: ", DescribeJob(index), " reduces a node without split-K"));
  }
  // (A node whose last split sums, reduce_parts 0, has no reduce job;
  // Prepare checked reduce_parts against kMaxReduceParts.)
  if (job.kind == static_cast<uint8_t>(JobKind::kReduce) && job.split >= ns.reduce_parts) {
    return absl::InternalError(absl::StrFormat("schedule: %s: part %d of reduce_parts %d", DescribeJob(index),
                                               job.split, ns.reduce_parts));
  }
  if (job.kind == static_cast<uint8_t>(JobKind::kGemm)) {
    if (job.k_block_begin > job.k_block_end || job.k_block_end > ns.k_blocks) {
      return absl::InternalError(absl::StrFormat("schedule: %s: k-blocks out of [0, %d)",
                                                 DescribeJob(index), ns.k_blocks));
    }
    if (job.split >= ns.split_k) {
      return absl::InternalError(absl::StrFormat("schedule: %s: split %d of split_k %d",
                                                 DescribeJob(index), job.split, ns.split_k));
    }
  }
  for (int rank = 0; rank < schedule_.cluster_size; ++rank) {
    sched::CtaTile tile;
    TileExtent extent;
    if (!TileOf(job, rank, &tile, &extent)) continue;
    LOOM_RETURN_IF_ERROR(CheckReadsWritten(job, extent, index));
    if (job.kind == static_cast<uint8_t>(JobKind::kReduce)) {
      LOOM_RETURN_IF_ERROR(ReduceTile(job, tile, extent, index));
    } else if (sched::MultipliesPartOfK(ns, job)) {
      LOOM_RETURN_IF_ERROR(ComputePartial(job, tile, extent, index));
      // The last split that sums: the kernel adds the other partials to its
      // accumulators, the reference sums all of them as a reduce job would.
      if (sched::FinishesSplitTile(ns, job)) LOOM_RETURN_IF_ERROR(ReduceTile(job, tile, extent, index));
    } else {
      LOOM_RETURN_IF_ERROR(ComputeTile(job, tile, extent, index));
    }
    if (sched::JobRunsEpilogue(ns, job)) {
      const auto [row_begin, row_end] = EpilogueRows(job, extent);
      output_writes_->MarkWritten(job.node, row_begin, row_end, extent.out_col_begin, extent.out_col_end);
    }
  }
  return absl::OkStatus();
}

// FP64 accumulator of one CTA tile over the extent's k range, [rows][cols].
std::vector<double> AccumulateExtent(const GemmNode& node, const TileExtent& e) {
  const int64_t rows = e.row_end - e.row_begin;
  const int64_t cols = e.acc_col_end - e.acc_col_begin;
  const int64_t k = e.k_end - e.k_begin;
  std::vector<double> acc(static_cast<size_t>(rows * cols), 0.0);
  if (k == 0) return acc;
  const std::vector<double> a = ops::LoadBlock(node.a, e.row_begin, rows, e.k_begin, k);
  const std::vector<double> b = ops::LoadBlock(node.b, e.acc_col_begin, cols, e.k_begin, k);
  ops::AccumulateTile(a.data(), k, b.data(), k, rows, cols, k, acc.data(), cols);
  return acc;
}

absl::Status ReferenceExecutor::ComputeTile(const sched::TileJob& job, const sched::CtaTile& tile,
                                            const TileExtent& e, size_t index) {
  const sched::NodeSchedule& ns = node_schedule(job.node);
  const GemmNode& node = graph_.nodes()[job.node];
  if (job.k_block_begin != 0 || job.k_block_end != ns.k_blocks) {
    return absl::InternalError(absl::StrFormat(
        "schedule: %s runs its tile's epilogue unsplit (split_k 1, or a whole tile of a split node) but covers "
        "k-blocks [%d, %d) of [0, %d)",
        DescribeJob(index), job.k_block_begin, job.k_block_end, ns.k_blocks));
  }
  uint8_t& done = state_[job.node].tile_done[static_cast<size_t>(tile.m_block) * ns.n_blocks +
                                            tile.n_block];
  if (done) {
    return absl::InternalError(absl::StrFormat("schedule: %s computes tile (%d, %d) a second time",
                                               DescribeJob(index), tile.m_block, tile.n_block));
  }
  const std::vector<double> acc = AccumulateExtent(node, e);
  const int64_t cols = e.acc_col_end - e.acc_col_begin;
  for (int64_t r = e.row_begin; r < e.row_end; ++r) {
    ops::StoreEpilogueRow(node, r, e.acc_col_begin, &acc[static_cast<size_t>((r - e.row_begin) * cols)],
                          cols);
  }
  done = 1;
  return absl::OkStatus();
}

absl::Status ReferenceExecutor::ComputePartial(const sched::TileJob& job,
                                               const sched::CtaTile& tile, const TileExtent& e,
                                               size_t index) {
  const sched::NodeSchedule& ns = node_schedule(job.node);
  NodeState& s = state_[job.node];
  const size_t slot =
      (static_cast<size_t>(tile.m_block) * ns.n_blocks + tile.n_block) * ns.split_k + job.split;
  if (s.partial_done[slot]) {
    return absl::InternalError(absl::StrFormat(
        "schedule: %s computes split %d of tile (%d, %d) a second time", DescribeJob(index),
        job.split, tile.m_block, tile.n_block));
  }
  const std::vector<double> acc = AccumulateExtent(graph_.nodes()[job.node], e);
  const int64_t cols = e.acc_col_end - e.acc_col_begin;
  double* partial = s.workspace.data() + static_cast<size_t>(job.split) * ns.m * ns.n;
  for (int64_t r = e.row_begin; r < e.row_end; ++r) {
    for (int64_t c = e.acc_col_begin; c < e.acc_col_end; ++c) {
      partial[r * ns.n + c] = acc[static_cast<size_t>((r - e.row_begin) * cols + (c - e.acc_col_begin))];
    }
  }
  s.partial_done[slot] = 1;
  s.partial_k_blocks[slot] = {job.k_block_begin, job.k_block_end};
  return absl::OkStatus();
}

absl::Status ReferenceExecutor::ReduceTile(const sched::TileJob& job, const sched::CtaTile& tile,
                                           const TileExtent& e, size_t index) {
  const sched::NodeSchedule& ns = node_schedule(job.node);
  const GemmNode& node = graph_.nodes()[job.node];
  NodeState& s = state_[job.node];
  const size_t tile_index = static_cast<size_t>(tile.m_block) * ns.n_blocks + tile.n_block;
  // In parts: this job's rows only, and the tile is done with its last part.
  const uint8_t part_bit = ns.reduce_parts > 1 ? static_cast<uint8_t>(1u << job.split) : 0;
  if (s.tile_done[tile_index] || (s.parts_done[tile_index] & part_bit) != 0) {
    return absl::InternalError(absl::StrFormat("schedule: %s reduces tile (%d, %d) a second time",
                                               DescribeJob(index), tile.m_block, tile.n_block));
  }
  const auto [row_begin, row_end] = EpilogueRows(job, e);
  // The partials must exist and cover the k-blocks [0, k_blocks) in split order.
  int32_t next_k_block = 0;
  for (int split = 0; split < ns.split_k; ++split) {
    const size_t slot = tile_index * ns.split_k + split;
    if (!s.partial_done[slot]) {
      return absl::InternalError(absl::StrFormat(
          "schedule: %s reduces tile (%d, %d) before its split %d is computed",
          DescribeJob(index), tile.m_block, tile.n_block, split));
    }
    const auto [begin, end] = s.partial_k_blocks[slot];
    if (begin != next_k_block) {
      return absl::InternalError(absl::StrFormat(
          "schedule: tile (%d, %d) of node %d \"%s\": split %d covers k-blocks [%d, %d), "
          "expected to start at %d",
          tile.m_block, tile.n_block, job.node, node.name, split, begin, end, next_k_block));
    }
    next_k_block = end;
  }
  if (next_k_block != ns.k_blocks) {
    return absl::InternalError(absl::StrFormat(
        "schedule: tile (%d, %d) of node %d \"%s\": splits cover k-blocks [0, %d) of %d",
        tile.m_block, tile.n_block, job.node, node.name, next_k_block, ns.k_blocks));
  }
  const int64_t cols = e.acc_col_end - e.acc_col_begin;
  std::vector<double> acc(static_cast<size_t>(cols));
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      double sum = 0.0;
      for (int split = 0; split < ns.split_k; ++split) {
        sum += s.workspace[static_cast<size_t>((split * ns.m + r) * ns.n + e.acc_col_begin + c)];
      }
      acc[static_cast<size_t>(c)] = sum;
    }
    ops::StoreEpilogueRow(node, r, e.acc_col_begin, acc.data(), cols);
  }
  s.parts_done[tile_index] |= part_bit;
  if (part_bit == 0 || s.parts_done[tile_index] == (1u << ns.reduce_parts) - 1) s.tile_done[tile_index] = 1;
  return absl::OkStatus();
}

absl::Status ReferenceExecutor::CheckComplete() const {
  for (int i = 0; i < graph_.size(); ++i) {
    const sched::NodeSchedule& ns = node_schedule(i);
    for (int32_t mb = 0; mb < ns.m_blocks; ++mb) {
      for (int32_t nb = 0; nb < ns.n_blocks; ++nb) {
        if (!state_[i].tile_done[static_cast<size_t>(mb) * ns.n_blocks + nb]) {
          return absl::InternalError(absl::StrFormat(
              "schedule: tile (m_block %d, n_block %d) of node %d \"%s\" is never computed", mb,
              nb, i, graph_.nodes()[i].name));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RunInQueueOrder(ReferenceExecutor& executor, const sched::Schedule& schedule) {
  for (size_t i = 0; i < schedule.queue.size(); ++i) {
    std::string blocker;
    if (!executor.Ready(schedule.queue[i], &blocker)) {
      return absl::InternalError(absl::StrCat("schedule: the queue is not a topological order: ",
                                              executor.DescribeJob(i), " reads ", blocker,
                                              " before it is done"));
    }
    LOOM_RETURN_IF_ERROR(executor.Execute(i));
  }
  return absl::OkStatus();
}

// Virtual SMs: each is idle or holds one dequeued job. A step picks, uniformly
// at random, one SM that can move: an idle SM dequeues the next job (the
// global cursor), a holding SM whose job is ready runs it. A held job that is
// not ready keeps its SM spinning, as a CTA does on the GPU.
absl::Status RunOnVirtualSms(ReferenceExecutor& executor, const sched::Schedule& schedule,
                             const ReferenceOptions& options) {
  constexpr int kIdle = -1;
  std::mt19937_64 random(options.seed);
  // At most one SM a job: the rest could never hold one (and INT_MAX of them
  // would not fit in memory).
  const size_t num_sms =
      std::min(static_cast<size_t>(options.simulated_sms), std::max<size_t>(schedule.queue.size(), 1));
  std::vector<int64_t> held(num_sms, kIdle);
  // Cached readiness of each held job: 1 ready, 0 not, -1 unknown. Only a
  // finished job can make another ready, so the cache is cleared after each.
  std::vector<int8_t> ready(num_sms, -1);
  size_t cursor = 0;
  size_t finished = 0;
  std::vector<size_t> movable;
  movable.reserve(num_sms);
  while (finished < schedule.queue.size()) {
    movable.clear();
    for (size_t sm = 0; sm < num_sms; ++sm) {
      if (held[sm] == kIdle) {
        if (cursor < schedule.queue.size()) movable.push_back(sm);
        continue;
      }
      if (ready[sm] < 0) ready[sm] = executor.Ready(schedule.queue[held[sm]], nullptr) ? 1 : 0;
      if (ready[sm] == 1) movable.push_back(sm);
    }
    if (movable.empty()) {
      std::string waits;
      int listed = 0;
      for (size_t sm = 0; sm < num_sms && listed < 4; ++sm) {
        if (held[sm] == kIdle) continue;
        std::string blocker;
        executor.Ready(schedule.queue[held[sm]], &blocker);
        absl::StrAppend(&waits, listed++ ? "; " : "", "SM ", sm, " holds ",
                        executor.DescribeJob(static_cast<size_t>(held[sm])), " waiting for ",
                        blocker);
      }
      return absl::InternalError(absl::StrFormat(
          "simulated run on %d SMs (seed %d) deadlocked after %d of %d jobs: %s", num_sms,
          options.seed, finished, schedule.queue.size(), waits));
    }
    const size_t sm = movable[std::uniform_int_distribution<size_t>(0, movable.size() - 1)(random)];
    if (held[sm] == kIdle) {
      held[sm] = static_cast<int64_t>(cursor++);
      ready[sm] = -1;
      continue;
    }
    LOOM_RETURN_IF_ERROR(executor.Execute(static_cast<size_t>(held[sm])));
    held[sm] = kIdle;
    ++finished;
    std::fill(ready.begin(), ready.end(), int8_t{-1});
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// RunReference for a graph already validated.
absl::Status RunValidReference(const GemmGraph& graph, const sched::Schedule& schedule,
                               const ReferenceOptions& options) {
  if (options.simulated_sms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("simulated_sms must be >= 0, got ", options.simulated_sms));
  }
  ReferenceExecutor executor(graph, schedule);
  LOOM_RETURN_IF_ERROR(executor.Prepare());
  if (options.simulated_sms == 0) {
    LOOM_RETURN_IF_ERROR(RunInQueueOrder(executor, schedule));
  } else {
    LOOM_RETURN_IF_ERROR(RunOnVirtualSms(executor, schedule, options));
  }
  return executor.CheckComplete();
}

}  // namespace

absl::Status RunReference(const GemmGraph& graph, const sched::Schedule& schedule,
                          const ReferenceOptions& options) {
  LOOM_RETURN_IF_ERROR(graph.Validate());  // what Compile would refuse, the kernels never run
  return RunValidReference(graph, schedule, options);
}

absl::Status RunReference(const Plan& plan, const ReferenceOptions& options) {
  if (!plan.valid()) {
    return absl::FailedPreconditionError("RunReference: the Plan was moved from (it has no graph or schedule)");
  }
  return RunValidReference(plan.graph(), plan.schedule(), options);  // Compile validated the graph
}

namespace {
absl::Status NaiveOperandsTooLarge(const GemmGraph& graph, int i) {
  const GemmNode& node = graph.nodes()[i];
  return absl::ResourceExhaustedError(
      absl::StrFormat("RunNaiveGraph: %s's A [%d, %d] and B [%d, %d] as doubles do not fit in host memory",
                      graph.NodeLabel(i), node.m(), node.k(), node.n(), node.k()));
}

// Operand `view` of node i whole, as doubles: views the kernels take can be
// far larger than host memory.
absl::StatusOr<std::vector<double>> LoadWhole(const GemmGraph& graph, int i, const TensorView& view) {
  try {
    return ops::LoadBlock(view, 0, view.rows, 0, view.cols);
  } catch (const std::bad_alloc&) {
    return NaiveOperandsTooLarge(graph, i);
  } catch (const std::length_error&) {  // past the vector's max_size
    return NaiveOperandsTooLarge(graph, i);
  }
}

// Whether a byte that the blocked loop reads while it writes C (B's rows, the
// bias, the residual) is one of C's (internal::ViewsOverlap, Validate's rule
// 6): then the node runs as a single row-major loop over a copy of B.
bool ReadsOverlapOutput(const GemmNode& node) {
  const auto overlaps_c = [&](const std::optional<TensorView>& view) {
    return view.has_value() && internal::ViewsOverlap(*view, node.c);
  };
  return internal::ViewsOverlap(node.b, node.c) || overlaps_c(node.epilogue.bias) ||
         overlaps_c(node.epilogue.residual);
}

// C's accumulator columns [col, col + cols) of every row, row by row: each
// row of `a` (A as doubles) times `b_rows` (B's rows col.. as doubles, K
// each), summed over k in order, then the epilogue.
void RunNaiveColumns(const GemmNode& node, const std::vector<double>& a, const double* b_rows, int64_t col,
                     int64_t cols) {
  const int64_t k = node.k();
  std::vector<double> acc(static_cast<size_t>(cols));
  for (int64_t row = 0; row < node.m(); ++row) {
    std::fill(acc.begin(), acc.end(), 0.0);
    ops::AccumulateTile(a.data() + row * k, k, b_rows, k, 1, cols, k, acc.data(), cols);
    ops::StoreEpilogueRow(node, row, col, acc.data(), cols);
  }
}

// One node, `a` its A as doubles: C's accumulator columns in blocks
// (ops::ForEachBlock), each block's B loaded as doubles once and
// multiplied by every row of A. Every output element is the one
// AccumulateTile sum over k in order, whatever the blocks and threads: the
// bits do not depend on them.
absl::Status RunNaiveNodeInBlocks(const GemmGraph& graph, int i, const std::vector<double>& a) {
  const GemmNode& node = graph.nodes()[i];
  const bool fitted = ops::ForEachBlock(node.n(), ops::ProductBlockColumns(node.k()), [&](int64_t col, int64_t cols) {
    const std::vector<double> b_rows = ops::LoadBlock(node.b, col, cols, 0, node.k());
    RunNaiveColumns(node, a, b_rows.data(), col, cols);
  });
  return fitted ? absl::OkStatus() : NaiveOperandsTooLarge(graph, i);
}
}  // namespace

absl::Status RunNaiveGraph(const GemmGraph& graph) {
  // Shapes that do not chain would read and write past the views, and a
  // non-empty view without data would be read through null (rule 1); the
  // kernels' hardware limits do not apply to this loop.
  LOOM_RETURN_IF_ERROR(graph.ValidateShapes());
  for (int i = 0; i < graph.size(); ++i) {
    const GemmNode& node = graph.nodes()[i];
    if (node.m() == 0 || node.n() == 0) continue;
    // A whole, as doubles (before C is written, which it may overlap).
    absl::StatusOr<std::vector<double>> a = LoadWhole(graph, i, node.a);
    if (!a.ok()) return a.status();
    if (!ReadsOverlapOutput(node)) {
      LOOM_RETURN_IF_ERROR(RunNaiveNodeInBlocks(graph, i, *a));
      continue;
    }
    // B, the bias or the residual shares bytes with C: all of B copied
    // first, then whole rows in order, as one thread.
    absl::StatusOr<std::vector<double>> b = LoadWhole(graph, i, node.b);
    if (!b.ok()) return b.status();
    RunNaiveColumns(node, *a, b->data(), 0, node.n());
  }
  return absl::OkStatus();
}

}  // namespace loom
