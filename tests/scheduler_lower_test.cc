// Lower(): flags, split-K, dependencies, refusals and the explain text.
#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "loom/scheduler/explain.h"
#include "loom/scheduler/queue.h"
#include "loom/scheduler/schedule.h"
#include "loom/scheduler/tiling.h"
#include "testbed/node_problems.h"

namespace loom::sched {
namespace {

using testbed::Edge;
using testbed::Gemm;

SchedulerOptions Options() {
  SchedulerOptions o;
  o.tile = {128, 256, 64};
  o.cluster_size = 2;
  o.num_sms = 132;
  o.max_clusters = 66;
  return o;
}

void ExpectInvalid(const absl::StatusOr<Schedule>& s, const std::string& fragment) {
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_NE(s.status().message().find(fragment), std::string::npos)
      << "message \"" << s.status().message() << "\" lacks \"" << fragment << "\"";
}

TEST(LowerTest, RefusesBadOptionsNamingTheOption) {
  std::vector<NodeProblem> g = {Gemm(128, 128, 128)};
  SchedulerOptions o = Options();
  o.cluster_size = 4;
  ExpectInvalid(Lower(g, o), "cluster_size must be 1 or 2, got 4");
  o = Options();
  o.tile.k = 0;
  ExpectInvalid(Lower(g, o), "tile.k must be positive, got 0");
  o = Options();
  o.split_k = 300;
  ExpectInvalid(Lower(g, o), "split_k must be in [0, 256]");
  o = Options();
  o.max_clusters = 0;
  ExpectInvalid(Lower(g, o), "max_clusters must be positive, got 0");
  o = Options();
  o.group_size = -1;  // reachable from the command line: loom_graph_bench --group_size
  ExpectInvalid(Lower(g, o), "group_size must be >= 0, got -1");
  // The field is named as its owner knows it: SchedulerOptions by default,
  // the caller's options where the caller names them (the runtime's
  // CompileOptions).
  EXPECT_EQ(Lower(g, o).status().message(), "SchedulerOptions.group_size must be >= 0, got -1");
  o.name = "CompileOptions";
  EXPECT_EQ(Lower(g, o).status().message(), "CompileOptions.group_size must be >= 0, got -1");
}

TEST(LowerTest, RefusesALastSplitExtraOutsideItsRange) {
  std::vector<NodeProblem> g = {Gemm(300, 4096, 4096)};
  SchedulerOptions o = Options();
  o.last_split_extra_k_blocks = -2;
  ExpectInvalid(Lower(g, o), "last_split_extra_k_blocks must be -1 (the scheduler decides) or in [0, 65535], got -2");
  o.last_split_extra_k_blocks = 65536;
  ExpectInvalid(Lower(g, o), "got 65536");
}

TEST(LowerTest, RefusesBadNodesNamingTheNode) {
  ExpectInvalid(Lower({Gemm(8, 8, 8), Gemm(8, 8, 8), Gemm(8, -3, 8)}, Options()), "node 2: N must be >= 0, got -3");
  ExpectInvalid(Lower({Gemm(8, 8, 8), Gemm(8, 9, 8, {}, true), Gemm(8, 8, 8)}, Options()), "node 1");
  ExpectInvalid(Lower({Gemm(8, 8, int64_t{64} * 70000)}, Options()), "node 0: k_blocks = 70000");
  SchedulerOptions odd = Options();
  odd.tile.n = 255;
  ExpectInvalid(Lower({Gemm(8, 8, 8), Gemm(8, 8, 8, {}, true)}, odd), "node 1: SwiGLU needs an even tile.n");
}

TEST(LowerTest, RefusesAnEdgeOnALaterOrUnknownNode) {
  ExpectInvalid(Lower({Gemm(8, 8, 8), Gemm(8, 8, 8, {Edge(1, DependencyOperand::kA)})}, Options()),
                "node 1: dependency 0 has producer 1, which is not an earlier node");
  ExpectInvalid(Lower({Gemm(8, 8, 8, {Edge(-1, DependencyOperand::kA)})}, Options()),
                "node 0: dependency 0 has producer -1");
  DependencyEdge bad = Edge(0, DependencyOperand::kA);
  bad.operand = 9;
  ExpectInvalid(Lower({Gemm(8, 8, 8), Gemm(8, 8, 8, {bad})}, Options()), "node 1: dependency 0 has operand 9");
}

// Dimensions near INT64_MAX are refused, not wrapped to one tile (the block
// counts were once rounded up with a + b - 1, which overflowed); a label
// names the node where the caller gave one.
TEST(LowerTest, RefusesDimensionsPastTheBlockRangeWithoutOverflow) {
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  ExpectInvalid(Lower({Gemm(kHuge, 8, 8)}, Options()), "node 0: m_blocks = 72057594037927936");
  ExpectInvalid(Lower({Gemm(8, kHuge, 8)}, Options()), "node 0: n_blocks = 36028797018963968");
  ExpectInvalid(Lower({Gemm(8, 8, kHuge)}, Options()), "node 0: k_blocks = 144115188075855872");
  NodeProblem labelled = Gemm(kHuge, 8, 8);
  labelled.label = "node \"tall\"";
  ExpectInvalid(Lower({Gemm(8, 8, 8), labelled}, Options()), "node \"tall\": m_blocks");
}

// Edge offsets past +-2^62 are refused before anything negates or adds them.
TEST(LowerTest, RefusesEdgeOffsetsPastTwoToThe62) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  ExpectInvalid(Lower({Gemm(8, 8, 8), Gemm(8, 8, 8, {Edge(0, DependencyOperand::kA, kMin, 0)})}, Options()),
                "node 1: dependency 0 has row_offset -9223372036854775808, past +-2^62");
  ExpectInvalid(
      Lower({Gemm(8, 8, 8), Gemm(8, 8, 8, {Edge(0, DependencyOperand::kA, 0, (int64_t{1} << 62) + 1)})}, Options()),
      "node 1: dependency 0 has col_offset 4611686018427387905");
  EXPECT_TRUE(
      Lower({Gemm(8, 8, 8), Gemm(8, 8, 8, {Edge(0, DependencyOperand::kA, 0, -(int64_t{1} << 62))})}, Options()).ok());
}

// Tiles of any int32 size are valid options; a split-K workspace past 64 bits
// of elements is refused by node, not wrapped.
TEST(LowerTest, RefusesASplitKWorkspacePastSixtyFourBits) {
  SchedulerOptions o = Options();
  o.tile = {1 << 30, 1 << 30, 64};
  o.cluster_size = 1;
  o.split_k = 4;
  o.sum_in_last_split = false;
  o.reduce_in_parts = false;
  ExpectInvalid(Lower({Gemm(int64_t{1} << 33, int64_t{1} << 33, 64 * 8)}, o),
                "node 0: the split-K workspace (4 partials of 8 x 8 tiles of 1073741824 x 1073741824)");
}

// So is a k-block of 2^30 elements: the queue order's cost model divides by
// four times it, which overflowed 32 bits to 0 (a crash) before.
TEST(LowerTest, TilesOfAnyInt32DepthAreOrdered) {
  SchedulerOptions o = Options();
  o.tile = {128, 256, 1 << 30};
  o.cluster_size = 1;
  o.max_clusters = 4;
  o.num_sms = 8;
  const absl::StatusOr<Schedule> s =
      Lower({Gemm(1024, 256, 64), Gemm(1024, 256, 256, {Edge(0, DependencyOperand::kA)}), Gemm(128, 4096, 64)}, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(CheckQueue(*s).ok());
}

// The order of a node's distinct n-blocks in NodeJobs (each split's job of a
// tile in turn, so each tile's first job counts).
std::vector<int32_t> NBlockOrder(const Schedule& s, int node) {
  std::vector<int32_t> order;
  for (const TileJob& job : NodeJobs(s, node)) {
    const int32_t n_block = static_cast<int32_t>(job.n_block);
    if (std::find(order.begin(), order.end(), n_block) == order.end()) order.push_back(n_block);
  }
  return order;
}

// With interleave_split_producers, a producer whose A consumer splits K in
// two is queued from its two runs of columns in turn (the first run the
// longer where the count is odd), so both halves of the consumer's K fill
// together; the consumer itself, which no node reads, keeps its raster
// order, and without the option so does the producer.
TEST(LowerTest, ProducersOfASplitAAreQueuedFromEachRunInTurn) {
  SchedulerOptions o = Options();
  o.tile = {64, 64, 64};
  o.cluster_size = 1;
  o.split_k = 2;
  o.reduce_in_parts = false;
  o.last_split_extra_k_blocks = 0;
  const std::vector<NodeProblem> graph = {Gemm(64, 7 * 64, 512),
                                          Gemm(64, 3 * 64, 7 * 64, {Edge(0, DependencyOperand::kA)})};
  absl::StatusOr<Schedule> s = Lower(graph, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(NBlockOrder(*s, 0), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6}));
  o.interleave_split_producers = true;
  s = Lower(graph, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->column_runs, (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(NBlockOrder(*s, 0), (std::vector<int32_t>{0, 4, 1, 5, 2, 6, 3}));
  EXPECT_EQ(NBlockOrder(*s, 1), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(static_cast<int64_t>(NodeJobs(*s, 0).size()), NodeJobCount(*s, 0));
  EXPECT_TRUE(CheckQueue(*s).ok()) << CheckQueue(*s);
}

// Options of the narrow kernel's pair split: one-CTA clusters of 64 x 64
// tiles, K in two halves, the last summing; `max_clusters` a wave.
SchedulerOptions PairSplitOptions(int32_t max_clusters) {
  SchedulerOptions o = Options();
  o.tile = {64, 64, 64};
  o.cluster_size = 1;
  o.max_clusters = max_clusters;
  o.split_k = 2;
  o.reduce_in_parts = false;
  return o;
}

// SchedulerOptions::whole_leading_tiles: a node whose last split sums and
// whose tiles make two waves or more has all but its last wave and the part
// wave whole, each one job over all of K with the last split's index
// (WholeTileOfSplitNode, summing no partials); the queue keeps every other
// tile's parts, the last after the first.
TEST(LowerTest, WholeLeadingTilesLeaveTheLastWavesSplit) {
  SchedulerOptions o = PairSplitOptions(/*max_clusters=*/4);
  o.last_split_extra_k_blocks = 0;
  o.whole_leading_tiles = true;
  // 19 tiles (4 waves and 3): 12 whole; 8 (2 waves): 4; 7 (1 wave and 3): none.
  const std::vector<NodeProblem> graph = {Gemm(64, 19 * 64, 512), Gemm(64, 8 * 64, 512), Gemm(64, 7 * 64, 512)};
  absl::StatusOr<Schedule> s = Lower(graph, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->whole_tiles, (std::vector<int64_t>{12, 4, 0}));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(WholeLeadingTiles(s->nodes[i], 1, o.max_clusters), s->whole_tiles[i]);
    const std::vector<TileJob> jobs = NodeJobs(*s, i);
    ASSERT_EQ(static_cast<int64_t>(jobs.size()), NodeJobCount(*s, i));
    const int64_t tiles = s->nodes[i].n_blocks;
    EXPECT_EQ(NodeJobCount(*s, i), s->whole_tiles[i] + 2 * (tiles - s->whole_tiles[i]));
    std::map<uint32_t, std::vector<int>> splits_of_tile;  // n-block: the splits of its jobs, in order
    for (int64_t j = 0; j < static_cast<int64_t>(jobs.size()); ++j) {
      const TileJob& job = jobs[j];
      const bool whole = WholeTileOfSplitNode(s->nodes[i], job);
      EXPECT_EQ(whole, j < s->whole_tiles[i]) << "node " << i << " job " << j;  // the leading tiles
      EXPECT_EQ(MultipliesPartOfK(s->nodes[i], job), !whole) << "node " << i << " job " << j;
      EXPECT_EQ(PartialsSummed(s->nodes[i], job), job.split == 1 && !whole ? 1 : 0);
      if (whole) {
        EXPECT_EQ(job.split, 1);
        EXPECT_EQ(job.k_block_end, 8);
      }
      splits_of_tile[job.n_block].push_back(whole ? -1 : job.split);
    }
    ASSERT_EQ(static_cast<int64_t>(splits_of_tile.size()), tiles);
    int64_t whole_seen = 0;
    for (const auto& [n_block, splits] : splits_of_tile) {
      if (splits == std::vector<int>{-1}) {
        ++whole_seen;
      } else {
        EXPECT_EQ(splits, (std::vector<int>{0, 1})) << "node " << i << " n-block " << n_block;
      }
    }
    EXPECT_EQ(whole_seen, s->whole_tiles[i]);
  }
  EXPECT_TRUE(CheckQueue(*s).ok()) << CheckQueue(*s);
  // Explain's queue names a whole tile's job as such, a part's by its split.
  const std::string explain = ExplainSchedule(*s, {"a", "b", "c"});
  EXPECT_NE(explain.find("k[0, 8) whole\n"), std::string::npos) << explain;
  EXPECT_EQ(explain.find("k[0, 8) split"), std::string::npos) << explain;
  // Not where the tiles are summed by reduce jobs, nor without the option.
  o.sum_in_last_split = false;
  s = Lower(graph, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->whole_tiles, (std::vector<int64_t>{0, 0, 0}));
  o.sum_in_last_split = true;
  o.whole_leading_tiles = false;
  s = Lower(graph, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->whole_tiles.empty());
  EXPECT_EQ(NodeJobCount(*s, 0), 38);
}

// SchedulerOptions::first_split_lead_k_blocks: a node of two splits whose
// jobs fit one wave (max_clusters) has its first split that many k-blocks
// longer than its last (clamped so that the last keeps a granule, its start
// moved down onto SchedulerOptions::split_granule_k_blocks); a node of
// more jobs, even halves.
TEST(LowerTest, FirstSplitLeadsOnNodesOfOneWave) {
  SchedulerOptions o = PairSplitOptions(/*max_clusters=*/8);
  o.first_split_lead_k_blocks = 8;
  // K of 24 k-blocks: 4 tiles (8 jobs, one wave): 16 and 8; 5 tiles (10
  // jobs): 12 and 12. K of 6 k-blocks, 2 tiles: the lead clamped to 4, 5 and 1.
  const std::vector<NodeProblem> graph = {Gemm(64, 4 * 64, 24 * 64), Gemm(64, 5 * 64, 24 * 64),
                                          Gemm(64, 2 * 64, 6 * 64)};
  absl::StatusOr<Schedule> s = Lower(graph, o);
  ASSERT_TRUE(s.ok()) << s.status();
  const int32_t first_end[] = {16, 12, 5};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(absl::StrCat("node ", i));
    EXPECT_EQ(s->nodes[i].last_split_extra_k_blocks, (std::vector<int32_t>{-8, 0, -4})[i]);
    for (const TileJob& job : NodeJobs(*s, i)) {
      EXPECT_EQ(job.k_block_begin, job.split == 0 ? 0 : first_end[i]);
      EXPECT_EQ(job.k_block_end, job.split == 0 ? first_end[i] : s->nodes[i].k_blocks);
    }
  }
  EXPECT_TRUE(CheckQueue(*s).ok()) << CheckQueue(*s);
  const std::string explain = ExplainSchedule(*s, {"a", "b", "c"});
  EXPECT_NE(explain.find("(8 k-blocks shorter than the first)"), std::string::npos) << explain;
  // On a granule of 4: a lead of 10 at K = 24 ends the first split at 17,
  // moved down to 16 (a lead of 8); at K = 6 the first split would end past
  // K - 4 = 2, moved down to 0: even halves.
  o.split_granule_k_blocks = 4;
  o.first_split_lead_k_blocks = 10;
  s = Lower(graph, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->nodes[0].last_split_extra_k_blocks, -8);
  EXPECT_EQ(s->nodes[2].last_split_extra_k_blocks, 0);
  // Refused below 0, and a granule below 1.
  o.first_split_lead_k_blocks = -1;
  ExpectInvalid(Lower(graph, o), "first_split_lead_k_blocks must be in [0, 65535], got -1");
  o.first_split_lead_k_blocks = 8;
  o.split_granule_k_blocks = 0;
  ExpectInvalid(Lower(graph, o), "split_granule_k_blocks must be in [1, 65535], got 0");
}

// Each split node's partials start on a 128-byte line, whatever the tile
// (the kernels' few-row sums drop whole lines; their own tiles keep every
// offset aligned anyway).
TEST(LowerTest, EachSplitNodesPartialsStartOnALine) {
  SchedulerOptions o = Options();
  o.tile = {3, 5, 64};
  o.cluster_size = 1;
  o.split_k = 3;
  const absl::StatusOr<Schedule> s = Lower({Gemm(7, 11, 640), Gemm(5, 9, 640), Gemm(13, 3, 640)}, o);
  ASSERT_TRUE(s.ok()) << s.status();
  int64_t end = 0;
  for (const NodeSchedule& node : s->nodes) {
    ASSERT_GT(node.split_k, 1);
    EXPECT_EQ(node.workspace_offset % kWorkspaceLineElements, 0) << node.workspace_offset;
    EXPECT_GE(node.workspace_offset, end);
    end = node.workspace_offset + int64_t{PartialSlices(node)} * node.m_blocks * o.tile.m * node.n_blocks * o.tile.n;
  }
  EXPECT_EQ(s->workspace_elements, end);
}

// A node whose A edges all wait for their whole producer has no runs of A
// flags (its granule, kAWaitWholeJob k-blocks, would overflow the kernels'
// int columns).
TEST(LowerTest, WholeTensorAEdgesHaveNoFlagRuns) {
  DependencyEdge whole = Edge(0, DependencyOperand::kA);
  whole.whole_tensor = 1;
  absl::StatusOr<Schedule> s = Lower({Gemm(128, 256, 64), Gemm(128, 256, 256, {whole})}, Options());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->nodes[1].a_wait_k_blocks, kAWaitWholeJob);
  EXPECT_EQ(s->nodes[1].a_flag_runs, 0);
  s = Lower({Gemm(128, 256, 64), Gemm(128, 256, 256, {Edge(0, DependencyOperand::kA)})}, Options());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->nodes[1].a_flag_runs, 1);
}

// A whole_tensor edge (an operand that is no one translation of the
// producer's output) waits for every tile of the producer, ragged last row
// and column included, whatever elements the consumer's tile reads.
TEST(LowerTest, AWholeTensorEdgeReadsEveryProducerTile) {
  absl::StatusOr<Schedule> s = Lower({Gemm(300, 600, 512)}, Options());
  ASSERT_TRUE(s.ok()) << s.status();
  const NodeSchedule& producer = s->nodes[0];
  ASSERT_EQ(producer.m_blocks, 3);
  ASSERT_EQ(producer.n_blocks, 3);
  DependencyEdge whole = Edge(0, DependencyOperand::kA);
  whole.whole_tensor = 1;
  struct Region {
    int64_t row_begin, row_end, col_begin, col_end;
  };
  for (const Region& r : {Region{0, 1, 0, 1}, Region{128, 256, 512, 576}}) {
    const TileBox box = ProducerTiles(producer, s->tile, whole, r.row_begin, r.row_end, r.col_begin, r.col_end);
    EXPECT_EQ(box.m_begin, 0);
    EXPECT_EQ(box.m_end, 3);
    EXPECT_EQ(box.n_begin, 0);
    EXPECT_EQ(box.n_end, 3);
  }
}

TEST(LowerTest, RefusesMoreNodesThanTheJobCanName) {
  std::vector<NodeProblem> g(65536, Gemm(0, 0, 0));
  ExpectInvalid(Lower(g, Options()), "65536 nodes exceed 65535");
  g.pop_back();
  EXPECT_TRUE(Lower(g, Options()).ok());
}

// Three nodes split in two: 3 x 3 tiles whose last split sums, a node of no
// rows, and one tile reduced in parts.
absl::StatusOr<Schedule> LowerFlagLayoutGraph() {
  SchedulerOptions o = Options();
  o.split_k = 2;
  return Lower({Gemm(300, 600, 512), Gemm(0, 64, 64), Gemm(128, 256, 512)}, o);
}

TEST(LowerTest, FlagsAreConsecutivePerNodeThenPartials) {
  absl::StatusOr<Schedule> s = LowerFlagLayoutGraph();
  ASSERT_TRUE(s.ok()) << s.status();
  const NodeSchedule& a = s->nodes[0];
  const NodeSchedule& c = s->nodes[2];
  EXPECT_EQ(a.flag_base, 0);
  EXPECT_EQ(a.m_blocks * a.n_blocks, 3 * 3);
  EXPECT_EQ(s->nodes[1].flag_base, 9);
  EXPECT_EQ(c.flag_base, 9);  // the zero-size node has no flags
  // a has three row blocks, each tile summed by its last split: one partial
  // (flag and workspace slice) a tile, split 0's. c is one row block of 128
  // rows: both splits' partials, reduced in 8 parts of 16, one count word per
  // tile after its partial flags.
  EXPECT_EQ(a.reduce_parts, 0);
  EXPECT_EQ(PartialSlices(a), 1);
  EXPECT_EQ(a.partial_flag_base, 10);
  EXPECT_EQ(PartialFlagIndex(a, 2, 2, 0), 10 + 8);
  EXPECT_EQ(a.part_count_base, -1);
  EXPECT_EQ(c.reduce_parts, 8);
  EXPECT_EQ(PartialSlices(c), 2);
  EXPECT_EQ(c.partial_flag_base, 10 + 9);
  EXPECT_EQ(c.part_count_base, 10 + 9 + 2);
  EXPECT_EQ(ReducePartCountIndex(c, 0, 0), 10 + 9 + 2);
  EXPECT_EQ(s->num_flags, 10 + 9 + 2 + 1);
  EXPECT_EQ(a.workspace_offset, 0);
  EXPECT_EQ(c.workspace_offset, int64_t{1} * 3 * 128 * 3 * 256);
  EXPECT_EQ(s->workspace_elements, c.workspace_offset + int64_t{2} * 128 * 256);
  // With reduce jobs instead, every split writes a partial.
  SchedulerOptions o = Options();
  o.split_k = 2;
  o.sum_in_last_split = false;
  s = Lower({Gemm(300, 600, 512), Gemm(0, 64, 64), Gemm(128, 256, 512)}, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->nodes[0].reduce_parts, 1);
  EXPECT_EQ(s->nodes[2].partial_flag_base, 10 + 9 * 2);
  EXPECT_EQ(s->nodes[2].workspace_offset, int64_t{2} * 3 * 128 * 3 * 256);
  EXPECT_EQ(s->nodes[1].partial_flag_base, -1);
}

// The producers of one consumer's A, in the order of A's columns, share
// their flag rows (FlagGroupsOf): a row block's flags run from one producer
// into the next. Any other node's flags are its own, as above.
TEST(LowerTest, ProducersOfOneAShareTheirFlagRows) {
  SchedulerOptions o = Options();
  o.split_k = 1;
  // 0, 1: column slices of one 300 x 1024 buffer, 1 the left half (so A's
  // column order is 1, 0); 2 reads all of it; 3 reads 0 alone.
  const std::vector<NodeProblem> graph = {
      Gemm(300, 512, 256), Gemm(300, 512, 256),
      Gemm(300, 256, 1024,
           {Edge(0, DependencyOperand::kA, 0, -512), Edge(1, DependencyOperand::kA), Edge(0, DependencyOperand::kBias)}),
      Gemm(300, 256, 512, {Edge(0, DependencyOperand::kA)})};
  absl::StatusOr<Schedule> s = Lower(graph, o);
  ASSERT_TRUE(s.ok()) << s.status();
  const NodeSchedule& left = s->nodes[1];
  const NodeSchedule& right = s->nodes[0];
  ASSERT_EQ(left.m_blocks, 3);
  ASSERT_EQ(left.n_blocks, 2);
  EXPECT_EQ(left.flag_base, 0);
  EXPECT_EQ(right.flag_base, 2);
  EXPECT_EQ(left.flag_row_stride, 4);
  EXPECT_EQ(right.flag_row_stride, 4);
  EXPECT_EQ(OutputFlagIndex(left, 1, 1) + 1, OutputFlagIndex(right, 1, 0));  // row block 1 runs on
  EXPECT_EQ(s->nodes[2].flag_base, 12);
  EXPECT_EQ(s->nodes[2].flag_row_stride, s->nodes[2].n_blocks);
  EXPECT_EQ(s->nodes[3].flag_base, 12 + 3);
  EXPECT_EQ(s->num_flags, 12 + 3 + 3);
  // Every output tile its own flag, all below the count.
  std::set<int32_t> seen;
  for (const NodeSchedule& node : s->nodes) {
    for (int mb = 0; mb < node.m_blocks; ++mb) {
      for (int nb = 0; nb < node.n_blocks; ++nb) {
        const int32_t flag = OutputFlagIndex(node, mb, nb);
        EXPECT_TRUE(seen.insert(flag).second) << "flag " << flag << " twice";
        EXPECT_LT(flag, s->num_flags);
      }
    }
  }
  EXPECT_EQ(seen.size(), 18u);
  EXPECT_TRUE(CheckQueue(*s).ok()) << CheckQueue(*s);
}

// Which producers FlagGroupsOf lays out together, and which it leaves alone.
// Producers stacked in A's rows that meet in one row block through a single
// row (rows 0-128 from node 0, 129-255 from node 1: both in row block 1)
// share that block's tile column, so A's flags cannot be read as one run.
TEST(LowerTest, StackedProducersMeetingThroughOneRowHaveNoFlagRuns) {
  SchedulerOptions o = Options();
  o.tile = {128, 128, 64};
  o.cluster_size = 1;
  o.num_sms = 8;
  o.max_clusters = 8;
  absl::StatusOr<Schedule> s = Lower({Gemm(129, 128, 64), Gemm(127, 128, 64),
                                      Gemm(256, 128, 128, {Edge(0, DependencyOperand::kA),
                                                           Edge(1, DependencyOperand::kA, -129, 0)})},
                                     o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->nodes[2].a_flag_runs, 0);
}

TEST(LowerTest, FlagGroupsAreTheProducersOfOneA) {
  auto groups_of = [](const std::vector<NodeProblem>& graph) {
    SchedulerOptions o = Options();
    o.split_k = 1;
    absl::StatusOr<Schedule> s = Lower(graph, o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? FlagGroupsOf(graph, s->nodes) : std::vector<std::vector<int>>{};
  };
  using Groups = std::vector<std::vector<int>>;
  const DependencyOperand kA = DependencyOperand::kA;
  // A chain: every node alone.
  EXPECT_EQ(groups_of({Gemm(64, 256, 64), Gemm(64, 256, 256, {Edge(0, kA)})}), (Groups{{0}, {1}}));
  // Three producers of one A, taken by A's columns; the groups in the order
  // of their first node.
  EXPECT_EQ(groups_of({Gemm(64, 8, 8), Gemm(64, 256, 64), Gemm(64, 256, 64), Gemm(64, 256, 64),
                       Gemm(64, 64, 768, {Edge(3, kA), Edge(1, kA, 0, -512), Edge(2, kA, 0, -256)})}),
            (Groups{{0}, {3, 2, 1}, {4}}));
  // A producer the first consumer took stays in its group; the second
  // consumer's others stay alone.
  EXPECT_EQ(groups_of({Gemm(64, 256, 64), Gemm(64, 256, 64), Gemm(64, 256, 64),
                       Gemm(64, 64, 512, {Edge(0, kA), Edge(1, kA, 0, -256)}),
                       Gemm(64, 64, 512, {Edge(1, kA), Edge(2, kA, 0, -256)})}),
            (Groups{{0, 1}, {2}, {3}, {4}}));
  // Not joined: row blocks that differ; row offsets that differ; one
  // producer read twice; whole-tensor edges; a producer without tiles.
  EXPECT_EQ(groups_of({Gemm(64, 256, 64), Gemm(300, 256, 64),
                       Gemm(64, 64, 512, {Edge(0, kA), Edge(1, kA, 0, -256)})}),
            (Groups{{0}, {1}, {2}}));
  EXPECT_EQ(groups_of({Gemm(300, 256, 64), Gemm(300, 256, 64),
                       Gemm(64, 64, 512, {Edge(0, kA), Edge(1, kA, 128, -256)})}),
            (Groups{{0}, {1}, {2}}));
  EXPECT_EQ(groups_of({Gemm(64, 256, 64), Gemm(64, 64, 512, {Edge(0, kA), Edge(0, kA, 0, -256)})}),
            (Groups{{0}, {1}}));
  DependencyEdge whole = Edge(1, kA, 0, -256);
  whole.whole_tensor = 1;
  EXPECT_EQ(groups_of({Gemm(64, 256, 64), Gemm(64, 256, 64), Gemm(64, 64, 512, {Edge(0, kA), whole})}),
            (Groups{{0}, {1}, {2}}));
  EXPECT_EQ(groups_of({Gemm(64, 256, 64), Gemm(0, 256, 64),
                       Gemm(64, 64, 512, {Edge(0, kA), Edge(1, kA, 0, -256)})}),
            (Groups{{0}, {1}, {2}}));
}

TEST(LowerTest, DependenciesAreGroupedByConsumer) {
  std::vector<NodeProblem> g = {Gemm(256, 512, 256), Gemm(256, 256, 512, {Edge(0, DependencyOperand::kA)}),
                                Gemm(256, 512, 256, {Edge(1, DependencyOperand::kA), Edge(0, DependencyOperand::kResidual)})};
  absl::StatusOr<Schedule> s = Lower(g, Options());
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->dependencies.size(), 3u);
  EXPECT_EQ(s->nodes[0].dependency_count, 0);
  EXPECT_EQ(s->nodes[1].dependency_begin, 0);
  EXPECT_EQ(s->nodes[1].dependency_count, 1);
  EXPECT_EQ(s->nodes[2].dependency_begin, 1);
  EXPECT_EQ(s->nodes[2].dependency_count, 2);
  EXPECT_EQ(s->dependencies[2].operand, static_cast<uint8_t>(DependencyOperand::kResidual));
}

// NodeSchedule::producer_operands holds a bit for each operand some kept
// edge of the node is on, and none for an edge dropped with its zero-size
// producer: the kernel asks it instead of reading the edges.
TEST(LowerTest, ProducerOperandsNameTheOperandsOfTheKeptEdges) {
  std::vector<NodeProblem> g = {
      Gemm(256, 512, 256), Gemm(0, 512, 256), Gemm(256, 256, 512, {Edge(0, DependencyOperand::kA)}),
      Gemm(256, 512, 256,
           {Edge(2, DependencyOperand::kA), Edge(0, DependencyOperand::kResidual), Edge(1, DependencyOperand::kBias)}),
      Gemm(256, 256, 512, {Edge(0, DependencyOperand::kB), Edge(3, DependencyOperand::kBias)})};
  absl::StatusOr<Schedule> s = Lower(g, Options());
  ASSERT_TRUE(s.ok()) << s.status();
  auto bits = [](std::initializer_list<DependencyOperand> operands) {
    uint8_t b = 0;
    for (DependencyOperand o : operands) b |= static_cast<uint8_t>(1u << static_cast<int>(o));
    return b;
  };
  EXPECT_EQ(s->nodes[0].producer_operands, 0);
  EXPECT_EQ(s->nodes[1].producer_operands, 0);
  EXPECT_EQ(s->nodes[2].producer_operands, bits({DependencyOperand::kA}));
  // The bias edge on node 1 (no tiles) is dropped, so no bias bit.
  EXPECT_EQ(s->nodes[3].producer_operands, bits({DependencyOperand::kA, DependencyOperand::kResidual}));
  EXPECT_EQ(s->nodes[4].producer_operands, bits({DependencyOperand::kB, DependencyOperand::kBias}));
  for (int i = 0; i < static_cast<int>(s->nodes.size()); ++i) {
    const NodeSchedule& node = s->nodes[i];
    for (uint8_t o = 0; o <= static_cast<uint8_t>(DependencyOperand::kResidual); ++o) {
      bool any = false;
      for (int d = 0; d < node.dependency_count; ++d) any |= s->dependencies[node.dependency_begin + d].operand == o;
      EXPECT_EQ(HasProducerOperand(node, static_cast<DependencyOperand>(o)), any) << "node " << i << " operand " << int{o};
    }
  }
}

// ProducerTiles divides in 32 bits where its clipped bounds fit and in 64
// where they do not: either way the box is the 64-bit one, checked against
// the formula here around 2^31 and for offsets that clip.
TEST(LowerTest, ProducerTilesAgreeWithSixtyFourBitDivisionEitherSideOfTwoToThe31) {
  auto reference = [](const NodeSchedule& p, const TileShape& tile, const DependencyEdge& e, int64_t r0, int64_t r1,
                      int64_t c0, int64_t c1) {
    r0 = std::max<int64_t>(r0 + e.row_offset, 0);
    r1 = std::min<int64_t>(r1 + e.row_offset, p.m);
    c0 = std::max<int64_t>(c0 + e.col_offset, 0);
    c1 = std::min<int64_t>(c1 + e.col_offset, p.out_cols);
    if (r0 >= r1 || c0 >= c1) return TileBox{};
    return TileBox{static_cast<int32_t>(r0 / tile.m), static_cast<int32_t>((r1 - 1) / tile.m + 1),
                   static_cast<int32_t>(c0 / p.out_tile_n), static_cast<int32_t>((c1 - 1) / p.out_tile_n + 1)};
  };
  constexpr int64_t kTwo31 = int64_t{1} << 31;
  const TileShape tiles[] = {{128, 256, 64}, {64, 32, 64}, {40, 32, 64}};
  const int32_t widths[] = {16, 128, 256};
  const int64_t sizes[] = {1000, kTwo31 - 1, kTwo31, kTwo31 + 77, int64_t{3} << 31};
  const int64_t offsets[] = {0, 5, -100, kTwo31 - 64};
  int checked = 0;
  for (const TileShape& tile : tiles) {
    for (int32_t width : widths) {
      for (int64_t size : sizes) {
        NodeSchedule producer;
        producer.m = size;
        producer.out_cols = size;
        producer.out_tile_n = width;
        for (int64_t offset : offsets) {
          DependencyEdge edge = Edge(0, DependencyOperand::kA, offset, offset);
          for (int64_t start : {int64_t{0}, size / 2, size - 1, size - tile.m, kTwo31 - 70}) {
            const int64_t r0 = start, r1 = start + tile.m, c0 = start, c1 = start + 64;
            const TileBox got = ProducerTiles(producer, tile, edge, r0, r1, c0, c1);
            const TileBox want = reference(producer, tile, edge, r0, r1, c0, c1);
            if (want.empty()) {
              EXPECT_TRUE(got.empty()) << size << " " << offset << " " << start;
            } else {
              EXPECT_EQ(std::tie(got.m_begin, got.m_end, got.n_begin, got.n_end),
                        std::tie(want.m_begin, want.m_end, want.n_begin, want.n_end))
                  << "size " << size << " offset " << offset << " start " << start << " tile.m " << tile.m
                  << " width " << width;
            }
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 3 * 3 * 5 * 4 * 5);
}

TEST(LowerTest, ZeroSizeProducersProduceNoJobsAndNoWaits) {
  // m == 0: no output, no jobs; its consumer does not wait on it.
  std::vector<NodeProblem> g = {Gemm(0, 512, 256), Gemm(256, 256, 512, {Edge(0, DependencyOperand::kA)})};
  absl::StatusOr<Schedule> s = Lower(g, Options());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(NodeJobCount(*s, 0), 0);
  EXPECT_EQ(s->nodes[1].dependency_count, 0);
  for (const TileJob& job : s->queue) {
    EXPECT_EQ(job.node, 1);
  }
  EXPECT_TRUE(CheckQueue(*s).ok());
}

TEST(LowerTest, ZeroKProducersHaveEpilogueJobsThatConsumersWaitFor) {
  // k == 0 with m, n > 0: C = epilogue(0), one job a tile over no k-blocks,
  // published like any other; its consumer waits for it.
  std::vector<NodeProblem> g = {Gemm(256, 512, 0), Gemm(256, 256, 512, {Edge(0, DependencyOperand::kA)})};
  absl::StatusOr<Schedule> s = Lower(g, Options());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(NodeJobCount(*s, 0), 2);  // 2 x 2 tiles, clusters of 2
  for (const TileJob& job : s->queue) {
    if (job.node == 0) {
      EXPECT_EQ(job.k_block_end, job.k_block_begin);
    }
  }
  EXPECT_EQ(s->nodes[1].dependency_count, 1);
  EXPECT_TRUE(CheckQueue(*s).ok()) << CheckQueue(*s);
}

// Every tile of every node exactly once; with split-K each split of each tile
// exactly once and one reduce per tile; k ranges as SplitKRange says (with
// the node's longer last split).
class LowerCoverageTest : public testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, int, int>> {};

TEST_P(LowerCoverageTest, EveryTileAndSplitExactlyOnce) {
  const auto [m, n, k, cluster_size, split_k] = GetParam();
  SchedulerOptions o = Options();
  o.cluster_size = cluster_size;
  o.split_k = split_k;
  absl::StatusOr<Schedule> s = Lower({Gemm(m, n, k)}, o);
  ASSERT_TRUE(s.ok()) << s.status();
  const NodeSchedule& node = s->nodes[0];
  std::map<std::tuple<int, int, int>, int> gemm_count;  // (mb, nb, split)
  std::map<std::tuple<int, int, int>, int> reduce_count;  // (mb, nb, part)
  for (const TileJob& job : s->queue) {
    if (node.share == ClusterShare::kShareB) {
      EXPECT_EQ(job.m_block % cluster_size, 0u);
    } else {
      EXPECT_EQ(job.n_block % cluster_size, 0u);
    }
    for (int rank = 0; rank < cluster_size; ++rank) {
      const CtaTile t = CtaTileOf(job, node.share, rank);
      if (t.m_block >= node.m_blocks || t.n_block >= node.n_blocks) {
        EXPECT_GT(rank, 0) << "a cluster's first tile is always in range";
        continue;
      }
      if (job.kind == static_cast<uint8_t>(JobKind::kReduce)) {
        ++reduce_count[{t.m_block, t.n_block, job.split}];
        EXPECT_LT(job.split, node.reduce_parts);
        EXPECT_EQ(job.k_block_begin, 0);
        EXPECT_EQ(job.k_block_end, node.k_blocks);
      } else {
        ++gemm_count[{t.m_block, t.n_block, job.split}];
        const KBlockRange r = SplitKRange(node.k_blocks, node.split_k, job.split, node.last_split_extra_k_blocks);
        EXPECT_EQ(job.k_block_begin, r.begin);
        EXPECT_EQ(job.k_block_end, r.end);
      }
    }
  }
  const int64_t tiles = int64_t{node.m_blocks} * node.n_blocks;
  EXPECT_EQ(static_cast<int64_t>(gemm_count.size()), tiles * node.split_k);
  for (const auto& [key, count] : gemm_count) EXPECT_EQ(count, 1);
  EXPECT_EQ(static_cast<int64_t>(reduce_count.size()), node.split_k > 1 ? tiles * node.reduce_parts : 0);
  for (const auto& [key, count] : reduce_count) EXPECT_EQ(count, 1);
  if (split_k > 0) {
    EXPECT_EQ(node.split_k, std::min<int>(split_k, node.k_blocks));
  }
  EXPECT_TRUE(CheckQueue(*s).ok()) << CheckQueue(*s);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LowerCoverageTest,
                         testing::Combine(testing::Values(1, 63, 129, 1000), testing::Values(1, 255, 257, 4096),
                                          testing::Values(8, 520, 4096), testing::Values(1, 2),
                                          testing::Values(0, 1, 3)));

// The A loader checks A's producers only at a job's first k-block and at
// multiples of a_wait_k_blocks. That is sound only if every k-block reads a
// subset of the producer tiles of the k-block where it last checked: checked
// here over every job of graphs with aligned, offset, unaligned, SwiGLU and
// two-producer A edges.
TEST(LowerTest, AWaitGranuleCoversEveryKBlockItSkips) {
  struct Case {
    std::vector<NodeProblem> nodes;
    int32_t expected_granule;  // of the last node
  };
  const std::vector<Case> cases = {
      // Chain: A = the producer's [M, 4096] output in 256-column tiles: every 4 k-blocks.
      {{Gemm(1, 4096, 4096), Gemm(1, 4096, 4096, {Edge(0, DependencyOperand::kA)})}, 4},
      // SwiGLU producer: 128 output columns per tile: every 2 k-blocks.
      {{Gemm(16, 2048, 512, {}, /*swiglu=*/true), Gemm(16, 512, 1024, {Edge(0, DependencyOperand::kA)})}, 2},
      // A starts 64 columns into the producer's output: boundaries at 192, 448, ...: every k-block.
      {{Gemm(8, 1024, 512), Gemm(8, 512, 512, {Edge(0, DependencyOperand::kA, 0, 64)})}, 1},
      // 128 columns in: boundaries at 128, 384, ...: every 2 k-blocks.
      {{Gemm(8, 1024, 512), Gemm(8, 512, 512, {Edge(0, DependencyOperand::kA, 0, 128)})}, 2},
      // Two producers writing column halves of A (the second seen at offset -512): every 4.
      {{Gemm(8, 512, 256), Gemm(8, 512, 256),
        Gemm(8, 256, 1024, {Edge(0, DependencyOperand::kA), Edge(1, DependencyOperand::kA, 0, -512)})},
       4},
      // Only a residual dependency: A never waits after the first k-block.
      {{Gemm(8, 512, 256), Gemm(8, 512, 512, {Edge(0, DependencyOperand::kResidual)})}, 1 << 30},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    for (int split_k : {0, 1, 3}) {
      SchedulerOptions o = Options();
      o.split_k = split_k;
      absl::StatusOr<Schedule> s = Lower(cases[c].nodes, o);
      ASSERT_TRUE(s.ok()) << s.status();
      const int consumer = static_cast<int>(s->nodes.size()) - 1;
      const NodeSchedule& node = s->nodes[consumer];
      EXPECT_EQ(node.a_wait_k_blocks, cases[c].expected_granule) << "case " << c;
      const int granule = node.a_wait_k_blocks;
      for (const TileJob& job : s->queue) {
        if (job.node != consumer || job.kind != static_cast<uint8_t>(JobKind::kGemm)) continue;
        const int64_t row0 = int64_t{job.m_block} * o.tile.m;
        int checked = job.k_block_begin;
        for (int kb = job.k_block_begin; kb < job.k_block_end; ++kb) {
          if (kb % granule == 0) checked = kb;
          for (int d = 0; d < node.dependency_count; ++d) {
            const DependencyEdge& edge = s->dependencies[node.dependency_begin + d];
            if (edge.operand != static_cast<uint8_t>(DependencyOperand::kA)) continue;
            const NodeSchedule& producer = s->nodes[edge.producer];
            const TileBox read = ProducerTiles(producer, o.tile, edge, row0, row0 + o.tile.m, int64_t{kb} * o.tile.k,
                                               int64_t{kb + 1} * o.tile.k);
            const TileBox waited = ProducerTiles(producer, o.tile, edge, row0, row0 + o.tile.m,
                                                 int64_t{checked} * o.tile.k, int64_t{checked + 1} * o.tile.k);
            if (read.empty()) continue;
            EXPECT_TRUE(read.m_begin >= waited.m_begin && read.m_end <= waited.m_end &&
                        read.n_begin >= waited.n_begin && read.n_end <= waited.n_end)
                << "case " << c << " split_k " << split_k << ": k-block " << kb << " reads producer tile columns ["
                << read.n_begin << ", " << read.n_end << "), but the last wait (k-block " << checked
                << ") covered [" << waited.n_begin << ", " << waited.n_end << ")";
          }
        }
      }
    }
  }
}

// The granules a run of A's flags may cover, from the one k-block kb falls in
// to the one holding the job's last k-block: one a job ends inside (a split
// ending mid-granule) counts, so the kernels' runs reach it rather than stop
// a granule short.
TEST(LowerTest, GranulesLeftCountsTheGranuleAJobEndsInside) {
  EXPECT_EQ(GranulesLeft(0, 16, 4), 4);
  EXPECT_EQ(GranulesLeft(0, 21, 4), 6);  // k-block 20 is in granule 5
  EXPECT_EQ(GranulesLeft(6, 21, 4), 5);  // granules 1 to 5
  EXPECT_EQ(GranulesLeft(20, 21, 4), 1);
  EXPECT_EQ(GranulesLeft(3, 5, 1), 2);
}

// A run's granule is at most max_tiles_per_granule producer tiles (the
// kernel's poll finds a flag's granule with a shift over that many): eight
// 16-column tiles to a 128-column granule make no run where four is the
// most, and a run of two granules of eight where eight are allowed.
TEST(LowerTest, ARunHasNoMoreTilesAGranuleThanTheKernelPolls) {
  const TileBox box{0, 1, 0, 8};  // one row, eight tile columns: one granule's tiles
  const AFlagRun none = ARunOfBox(/*flag_base=*/100, /*flag_row_stride=*/16, /*n_blocks=*/16, /*out_tile_n=*/16,
                                  /*out_cols=*/256, box, /*granule_cols=*/128, /*granules_left=*/2,
                                  /*max_tiles_per_granule=*/4);
  EXPECT_EQ(none.granules, 0);
  const AFlagRun run = ARunOfBox(100, 16, 16, 16, 256, box, 128, 2, /*max_tiles_per_granule=*/8);
  EXPECT_EQ(run.granules, 2);
  EXPECT_EQ(run.first_flag, 100);
  EXPECT_EQ(run.tiles_per_granule, 8);
  EXPECT_EQ(run.tiles_shift, 3);
}

// A node whose output a later node reads gets 8-row reduce parts only
// within half a wave (ChooseReduceParts): in a 64-token chain of 4096 x 4096
// layers, the first layer is reduced in 4 parts of 16 rows, the last (no
// consumers) in 8 parts of 8.
TEST(LowerTest, NodesWithConsumersLeaveHalfTheWaveToThem) {
  absl::StatusOr<Schedule> s =
      Lower({Gemm(64, 4096, 4096), Gemm(64, 4096, 4096, {Edge(0, DependencyOperand::kA)})}, Options());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->nodes[0].reduce_parts, 4);
  EXPECT_EQ(s->nodes[0].reduce_part_rows, 16);
  EXPECT_EQ(s->nodes[1].reduce_parts, 8);
  EXPECT_EQ(s->nodes[1].reduce_part_rows, 8);
  EXPECT_TRUE(CheckQueue(*s).ok()) << CheckQueue(*s);
}

TEST(LowerTest, SmallMSplitsKToFillAWave) {
  // 8 cluster tiles (16 n-blocks, kShareA pairs): 66 / 8 = 8 splits would fill
  // the wave, but each split keeps >= 16 of the 64 k-blocks: 4 splits
  // (ChooseSplitK, below). A ragged N: its 64 rows are not reduced in parts
  // but each tile whole, by its last split, and for that sum 3 splits cost
  // less (SplitsSummedByLast); with reduce jobs, 4.
  absl::StatusOr<Schedule> s = Lower({Gemm(64, 4000, 4096)}, Options());
  ASSERT_TRUE(s.ok());
  const NodeSchedule& node = s->nodes[0];
  EXPECT_EQ(node.share, ClusterShare::kShareA);
  EXPECT_EQ(node.split_k, 3);
  EXPECT_EQ(node.reduce_parts, 0);
  EXPECT_EQ(s->queue.size(), 8u * 3);
  SchedulerOptions reduce_jobs = Options();
  reduce_jobs.sum_in_last_split = false;
  s = Lower({Gemm(64, 4000, 4096)}, reduce_jobs);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->nodes[0].split_k, 4);
  EXPECT_EQ(s->nodes[0].reduce_parts, 1);
  EXPECT_EQ(s->queue.size(), 8u * (4 + 1));
  // 17 rows of whole tiles: each tile reduced in three parts of 8 rows, so
  // >= 8 k-blocks a split: 8 splits.
  s = Lower({Gemm(17, 4096, 4096)}, Options());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->nodes[0].split_k, 8);
  EXPECT_EQ(s->nodes[0].reduce_parts, 3);
  EXPECT_EQ(s->nodes[0].reduce_part_rows, 8);
  EXPECT_EQ(s->queue.size(), 8u * (8 + 3));
  // With at most 16 rows (kFewRowReduceRows), >= 8 k-blocks: 8 splits.
  s = Lower({Gemm(16, 4096, 4096)}, Options());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->nodes[0].split_k, 8);
  // A longer K fills the wave: 1 x 4096 x 14336 (224 k-blocks) splits 8 ways.
  s = Lower({Gemm(1, 4096, 14336)}, Options());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->nodes[0].split_k, 8);
  // A large M does not split.
  s = Lower({Gemm(4096, 4096, 4096)}, Options());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->nodes[0].split_k, 1);
}

TEST(LowerTest, IdleClustersAtLaunchCountsTheFirstWaveThatCannotStart) {
  // The MLP block at 128 tokens: gate/up's 112 tiles are 56 cluster jobs, and
  // the 10 positions behind them in the first wave are down-projection jobs
  // that wait for gate/up.
  absl::StatusOr<Schedule> s = Lower(
      {Gemm(128, 28672, 4096, {}, /*swiglu=*/true), Gemm(128, 4096, 14336, {Edge(0, DependencyOperand::kA)})},
      Options());
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->nodes[0].split_k, 1);
  EXPECT_EQ(IdleClustersAtLaunch(*s, 66), 10);
  EXPECT_EQ(IdleClustersAtLaunch(*s, 56), 0);
  // A GEMM of 256 cluster jobs fills every wave.
  s = Lower({Gemm(4096, 4096, 4096)}, Options());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(IdleClustersAtLaunch(*s, 66), 0);
  // One cluster job (1 k-block: no split): 65 clusters find nothing.
  s = Lower({Gemm(128, 512, 64)}, Options());
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->queue.size(), 1u);
  EXPECT_EQ(IdleClustersAtLaunch(*s, 66), 65);
  // A node waiting on a residual from another node cannot start either.
  s = Lower({Gemm(128, 512, 64), Gemm(128, 512, 64, {Edge(0, DependencyOperand::kResidual)})}, Options());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(IdleClustersAtLaunch(*s, 2), 1);
  // Split K: the splits start, a summing last split too (it waits for the
  // others' partials only after its main loop); a reduce job does not.
  SchedulerOptions split = Options();
  split.split_k = 4;
  split.reduce_in_parts = false;
  s = Lower({Gemm(128, 512, 4096)}, split);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->queue.size(), 4u);
  EXPECT_EQ(IdleClustersAtLaunch(*s, 66), 62);
  split.sum_in_last_split = false;
  s = Lower({Gemm(128, 512, 4096)}, split);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->queue.size(), 5u);  // four splits and the reduce job
  EXPECT_EQ(IdleClustersAtLaunch(*s, 66), 62);
}

// The last split of a node whose last split sums takes kLastSplitExtraKBlocks
// more k-blocks than the others where its splits start together: the node's
// jobs and its producers' fit one wave (the 4096 chain at 200-512 rows), not
// behind a producer of several waves (the MLP block's down projection).
TEST(LowerTest, LastSplitIsLongerWhereTheSplitsStartTogether) {
  auto chain = [](int64_t m) {
    return std::vector<NodeProblem>{Gemm(m, 4096, 4096),
                                    Gemm(m, 4096, 4096, {Edge(0, DependencyOperand::kA)})};
  };
  auto extras = [](const std::vector<NodeProblem>& g, const SchedulerOptions& o) {
    absl::StatusOr<Schedule> s = Lower(g, o);
    EXPECT_TRUE(s.ok()) << s.status();
    std::vector<int32_t> out;
    if (!s.ok()) return out;
    for (const NodeSchedule& node : s->nodes) out.push_back(node.last_split_extra_k_blocks);
    // The jobs carry the ranges: the last split's is that much longer.
    for (const TileJob& job : s->queue) {
      const NodeSchedule& node = s->nodes[job.node];
      if (job.kind != static_cast<uint8_t>(JobKind::kGemm) || node.split_k <= 1) continue;
      const KBlockRange r = SplitKRange(node.k_blocks, node.split_k, job.split, node.last_split_extra_k_blocks);
      EXPECT_EQ(job.k_block_begin, r.begin);
      EXPECT_EQ(job.k_block_end, r.end);
    }
    return out;
  };
  using V = std::vector<int32_t>;
  const SchedulerOptions o = Options();
  EXPECT_EQ(extras(chain(300), o), V({kLastSplitExtraKBlocks, kLastSplitExtraKBlocks}));  // 48 jobs, split 2
  EXPECT_EQ(extras(chain(200), o), V({kLastSplitExtraKBlocks, kLastSplitExtraKBlocks}));  // 64 jobs, split 4
  // 300 tokens of the MLP block: gate/up is 168 jobs, so the down
  // projection's splits start as its tiles end.
  const std::vector<NodeProblem> mlp = {Gemm(300, 28672, 4096, {}, /*swiglu=*/true),
                                        Gemm(300, 4096, 14336, {Edge(0, DependencyOperand::kA)})};
  EXPECT_EQ(extras(mlp, o), V({0, 0}));
  EXPECT_EQ(extras({Gemm(300, 4096, 14336)}, o), V({kLastSplitExtraKBlocks}));  // on its own: at launch
  // Not where the last split does not sum, nor without a split.
  SchedulerOptions reduce_jobs = o;
  reduce_jobs.sum_in_last_split = false;
  EXPECT_EQ(extras(chain(300), reduce_jobs), V({0, 0}));
  EXPECT_EQ(extras({Gemm(8192, 4096, 4096)}, o), V({0}));
  // Splits that would keep fewer than 8 k-blocks each: even (256 rows: 64
  // jobs, within the wave, so that only this rule decides).
  SchedulerOptions four = o;
  four.split_k = 4;
  EXPECT_EQ(extras({Gemm(256, 4096, 2048)}, four), V({0}));                       // (32 - 8) / 4 = 6
  EXPECT_EQ(extras({Gemm(256, 4096, 2496)}, four), V({0}));                       // (39 - 8) / 4 = 7
  EXPECT_EQ(extras({Gemm(256, 4096, 2560)}, four), V({kLastSplitExtraKBlocks}));  // (40 - 8) / 4 = 8
  // Forced: that many wherever the last split sums, at most k_blocks - split_k.
  SchedulerOptions forced = o;
  forced.last_split_extra_k_blocks = 0;
  EXPECT_EQ(extras(chain(300), forced), V({0, 0}));
  forced.last_split_extra_k_blocks = 7;
  EXPECT_EQ(extras(mlp, forced), V({0, 7}));
  forced.last_split_extra_k_blocks = 1000;
  EXPECT_EQ(extras(chain(300), forced), V({62, 62}));  // 64 k-blocks, 2 splits: the first keeps one
}

// Nodes of one dependency depth run side by side, so their splits fill one
// wave between them: a layer built as two nodes over halves of its columns
// splits as the one node would, and its consumers (one depth down) count
// only themselves. Counted per node, each half split in 3 at 300 rows
// (bench/NOTES.md v1.69).
TEST(LowerTest, NodesOfOneDepthFillTheWaveTogether) {
  const SchedulerOptions o = Options();
  auto splits = [&](const std::vector<NodeProblem>& g) {
    absl::StatusOr<Schedule> s = Lower(g, o);
    EXPECT_TRUE(s.ok()) << s.status();
    std::vector<int32_t> out;
    if (s.ok()) {
      for (const NodeSchedule& node : s->nodes) out.push_back(node.split_k);
    }
    return out;
  };
  using V = std::vector<int32_t>;
  // One node of 300 x 4096: 24 cluster tiles, split 2 (the last sums).
  EXPECT_EQ(splits({Gemm(300, 4096, 4096), Gemm(300, 4096, 4096, {Edge(0, DependencyOperand::kA)})}), V({2, 2}));
  // The same layers as two nodes each (12 cluster tiles a node).
  const std::vector<NodeProblem> halves = {
      Gemm(300, 2048, 4096), Gemm(300, 2048, 4096),
      Gemm(300, 2048, 4096, {Edge(0, DependencyOperand::kA), Edge(1, DependencyOperand::kA, 0, -2048)}),
      Gemm(300, 2048, 4096, {Edge(0, DependencyOperand::kA), Edge(1, DependencyOperand::kA, 0, -2048)})};
  EXPECT_EQ(splits(halves), V({2, 2, 2, 2}));
  EXPECT_EQ(splits({halves[0]}), V({3}));  // alone, 12 cluster tiles split further
  // A small node beside a step of more than half a wave: not split.
  EXPECT_EQ(splits({Gemm(4096, 4096, 4096), Gemm(16, 4096, 4096)}), V({1, 1}));
  EXPECT_EQ(splits({Gemm(16, 4096, 4096)}), V({8}));
}

TEST(LowerTest, IsDeterministic) {
  std::vector<NodeProblem> g = {Gemm(512, 1024, 512), Gemm(512, 512, 1024, {Edge(0, DependencyOperand::kA)}),
                                Gemm(32, 2048, 2048)};
  absl::StatusOr<Schedule> a = Lower(g, Options()), b = Lower(g, Options());
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->queue.size(), b->queue.size());
  for (size_t i = 0; i < a->queue.size(); ++i) {
    EXPECT_EQ(std::memcmp(&a->queue[i], &b->queue[i], sizeof(TileJob)), 0) << i;
  }
}

TEST(ExplainTest, MentionsEveryNodeItsDependenciesAndTheQueue) {
  std::vector<NodeProblem> g = {Gemm(4096, 4096, 4096), Gemm(4096, 2 * 14336, 4096, {Edge(0, DependencyOperand::kA)}, true),
                                Gemm(4096, 4096, 14336, {Edge(1, DependencyOperand::kA), Edge(0, DependencyOperand::kResidual)}),
                                // At its own depth (below 'down'), so split.
                                Gemm(16, 4096, 4096, {Edge(2, DependencyOperand::kA)})};
  absl::StatusOr<Schedule> s = Lower(g, Options());
  ASSERT_TRUE(s.ok());
  const std::string text = ExplainSchedule(*s, {"o_proj", "up", "down"});
  for (const char* fragment : {"'o_proj'", "'up'", "'down'", "'node 3'", "reads A from 'up' (node 1)",
                               "reads residual from 'o_proj'", "split_k 8", "sharing B", "sharing A",
                               "raster along", "queue: ", "  order: ", "#0 ", "jobs at queue positions",
                               "A's producers: one granule of producer tiles every 2 k-blocks"}) {
    EXPECT_NE(text.find(fragment), std::string::npos) << "no \"" << fragment << "\" in\n" << text;
  }
  EXPECT_EQ(text.find("one granule at a time"), std::string::npos) << text;
}

// A node whose A's producers give no sound runs of flags (two producers over
// the same columns of one row block) says it waits granule by granule.
TEST(ExplainTest, SaysWhereAIsWaitedForOneGranuleAtATime) {
  // A [128, 512]: rows 0-63 from node 0, rows 64-127 from node 1, both all
  // columns; one 128-row block reads both.
  std::vector<NodeProblem> g = {
      Gemm(64, 512, 64), Gemm(64, 512, 64),
      Gemm(128, 256, 512, {Edge(0, DependencyOperand::kA), Edge(1, DependencyOperand::kA, -64, 0)})};
  absl::StatusOr<Schedule> s = Lower(g, Options());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->nodes[2].a_flag_runs, 0);
  const std::string text = ExplainSchedule(*s, {"top", "bottom", "consumer"});
  EXPECT_NE(text.find("waited for one granule at a time"), std::string::npos) << text;
}

// The numbers Explain states are the ones a time-out's "flag N" and a
// workspace size are looked up against: each node's output tile flags, its
// partial flags (one slice a tile fewer than splits where the last split
// sums), the totals of flags and workspace, and how many queue positions the
// listing leaves out.
TEST(ExplainTest, StatesEachNodesFlagRangesAndTheTotals) {
  absl::StatusOr<Schedule> s = LowerFlagLayoutGraph();
  ASSERT_TRUE(s.ok()) << s.status();
  const NodeSchedule& a = s->nodes[0];
  const NodeSchedule& c = s->nodes[2];
  // As LowerTest.FlagsAreConsecutivePerNodeThenPartials lays them out.
  ASSERT_EQ(a.reduce_parts, 0);
  ASSERT_EQ(a.partial_flag_base, 10);
  ASSERT_GT(c.reduce_parts, 1);
  ASSERT_GT(s->workspace_elements, 0);
  ASSERT_GT(s->queue.size(), 16u);
  const std::string text = ExplainSchedule(*s, {"a", "empty", "c"});
  const std::string c_partials = std::to_string(c.partial_flag_base);
  for (const std::string& fragment :
       {std::to_string(s->num_flags) + " flags, " + std::to_string(s->workspace_elements) + " fp32 workspace elements",
        // 3 x 3 tiles from flag 0; one partial a tile (split 0's) from flag 10.
        std::string("  flags [0, 9); partial flags [10, 19);"),
        // One tile, both splits' partials.
        "  flags [9, 10); partial flags [" + c_partials + ", " + std::to_string(c.partial_flag_base + 2) + ");",
        "  ... " + std::to_string(s->queue.size() - 16) + " more\n"}) {
    EXPECT_NE(text.find(fragment), std::string::npos) << "no \"" << fragment << "\" in\n" << text;
  }
}

}  // namespace
}  // namespace loom::sched
