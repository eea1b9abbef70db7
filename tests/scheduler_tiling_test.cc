// Per-node tiling, split-K ranges and rasterization of loom's scheduler.
#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "loom/scheduler/raster.h"
#include "loom/scheduler/schedule.h"
#include "loom/scheduler/tiling.h"

namespace loom::sched {
namespace {

NodeProblem Gemm(int64_t m, int64_t n, int64_t k, bool swiglu = false) {
  NodeProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.swiglu = swiglu;
  return p;
}

SchedulerOptions Options(int cluster_size = 2) {
  SchedulerOptions o;
  o.tile = {128, 256, 64};
  o.cluster_size = cluster_size;
  o.num_sms = 132;
  o.max_clusters = 66;
  return o;
}

TEST(TileNodeTest, CeilDivAndClusterShare) {
  NodeProblem p = Gemm(1000, 129, 65);
  absl::StatusOr<NodeSchedule> node = TileNode(p, 0, Options());
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->m_blocks, 8);
  EXPECT_EQ(node->n_blocks, 1);
  EXPECT_EQ(node->k_blocks, 2);
  EXPECT_EQ(node->out_cols, 129);
  EXPECT_EQ(node->out_tile_n, 256);
  EXPECT_EQ(node->share, ClusterShare::kShareB);  // >= 2 m-blocks: weights multicast
  const ClusterGrid grid = ClusterGridOf(*node, 2);
  EXPECT_EQ(grid.rows, 4);
  EXPECT_EQ(grid.cols, 1);
}

TEST(TileNodeTest, SingleMBlockSharesA) {
  absl::StatusOr<NodeSchedule> node = TileNode(Gemm(16, 4096, 4096), 0, Options());
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(node->share, ClusterShare::kShareA);
  const ClusterGrid grid = ClusterGridOf(*node, 2);
  EXPECT_EQ(grid.rows, 1);
  EXPECT_EQ(grid.cols, 8);
  EXPECT_EQ(FirstTileOfCluster(ClusterShare::kShareA, 2, 0, 3).n_block, 6);
  EXPECT_EQ(FirstTileOfCluster(ClusterShare::kShareB, 2, 3, 1).m_block, 6);
}

TEST(TileNodeTest, OddRowBlocksShareAWhereThatIdlesFewerCtas) {
  // 300 rows: 3 m-blocks. Pairs along M would idle one CTA of the last
  // cluster row in every column; pairs along N idle none (112 n-blocks).
  absl::StatusOr<NodeSchedule> node = TileNode(Gemm(300, 28672, 4096), 0, Options());
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->m_blocks, 3);
  EXPECT_EQ(node->share, ClusterShare::kShareA);
  EXPECT_EQ(ClusterGridOf(*node, 2).rows, 3);
  EXPECT_EQ(ClusterGridOf(*node, 2).cols, 56);
  // Even m-blocks idle nothing along M: the weights stay multicast.
  EXPECT_EQ(ChooseShare(2, 112), ClusterShare::kShareB);
  EXPECT_EQ(ChooseShare(64, 16), ClusterShare::kShareB);
  // Odd up to kMaxOddRowBlocksSharingA, then multicast again.
  EXPECT_EQ(ChooseShare(kMaxOddRowBlocksSharingA, 16), ClusterShare::kShareA);
  EXPECT_EQ(ChooseShare(kMaxOddRowBlocksSharingA + 2, 16), ClusterShare::kShareB);
  // Odd n-blocks too: the share that pads fewer CTA tiles, ties multicast B.
  EXPECT_EQ(ChooseShare(3, 5), ClusterShare::kShareA);  // 18 CTA tiles against 20
  EXPECT_EQ(ChooseShare(5, 3), ClusterShare::kShareB);  // 20 against 18
  EXPECT_EQ(ChooseShare(3, 3), ClusterShare::kShareB);  // 12 and 12
  EXPECT_EQ(ChooseShare(1, 7), ClusterShare::kShareA);
}

TEST(TileNodeTest, SwiGLUHalvesOutputColumns) {
  absl::StatusOr<NodeSchedule> node = TileNode(Gemm(256, 2 * 14336, 4096, true), 0, Options());
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(node->out_cols, 14336);
  EXPECT_EQ(node->out_tile_n, 128);
  EXPECT_EQ(node->n_blocks, 112);
}

TEST(TileNodeTest, ZeroSizeNodesHaveNoTiles) {
  for (NodeProblem p : {Gemm(0, 64, 64), Gemm(64, 0, 64), Gemm(0, 0, 0)}) {
    absl::StatusOr<NodeSchedule> node = TileNode(p, 0, Options());
    ASSERT_TRUE(node.ok());
    EXPECT_EQ(int64_t{node->m_blocks} * node->n_blocks, 0) << p.m << "x" << p.n << "x" << p.k;
  }
}

// K = 0 still has an output (epilogue(0)): its tiles as usual, no k-blocks,
// never split.
TEST(TileNodeTest, ZeroKNodesKeepTheirTiles) {
  SchedulerOptions o = Options();
  o.split_k = 4;
  absl::StatusOr<NodeSchedule> node = TileNode(Gemm(200, 600, 0), 0, o);
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->m_blocks, 2);
  EXPECT_EQ(node->n_blocks, 3);
  EXPECT_EQ(node->k_blocks, 0);
  EXPECT_EQ(node->split_k, 1);
}

TEST(TileNodeTest, RefusesWhatTheJobCannotEncode) {
  absl::StatusOr<NodeSchedule> node = TileNode(Gemm(64, 64, int64_t{65536} * 64), 7, Options());
  ASSERT_EQ(node.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(node.status().message().find("node 7"), std::string::npos) << node.status();
  EXPECT_NE(node.status().message().find("65536"), std::string::npos) << node.status();

  node = TileNode(Gemm(64, 63, 64, true), 2, Options());
  ASSERT_EQ(node.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(node.status().message().find("node 2"), std::string::npos);
  EXPECT_NE(node.status().message().find("63"), std::string::npos);

  node = TileNode(Gemm(-1, 64, 64), 4, Options());
  ASSERT_EQ(node.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(node.status().message().find("node 4: M"), std::string::npos) << node.status();
}

TEST(ChooseSplitKTest, SplitsOnlyWellUnderAWaveAndKeepsSixteenBlocks) {
  EXPECT_EQ(ChooseSplitK(/*clusters=*/8, /*k_blocks=*/224, /*max_clusters=*/66, 0), 8);  // 8 * 8 = 64 <= 66
  EXPECT_EQ(ChooseSplitK(8, 64, 66, 0), 4);                                            // >= 16 k-blocks each
  EXPECT_EQ(ChooseSplitK(8, 31, 66, 0), 1);                                            // two splits would get 15
  EXPECT_EQ(ChooseSplitK(40, 64, 66, 0), 1);                                           // over half a wave
  EXPECT_EQ(ChooseSplitK(1, 7, 66, 0), 1);                                             // too little K
  EXPECT_EQ(ChooseSplitK(1, 4096, 66, 0), 66);
  EXPECT_EQ(ChooseSplitK(100, 64, 66, 3), 3);                                          // forced
  EXPECT_EQ(ChooseSplitK(100, 2, 66, 5), 2);                                           // forced, clamped to K
}

TEST(ChooseSplitKTest, FewRowReducesKeepEightBlocks) {
  EXPECT_EQ(ChooseSplitK(8, 64, 66, 0, /*few_row_reduce=*/true), 8);
  EXPECT_EQ(ChooseSplitK(8, 64, 66, 0, /*few_row_reduce=*/false), 4);  // >= 16 blocks
  EXPECT_EQ(ChooseSplitK(8, 15, 66, 0, true), 1);    // two splits would get 7
  EXPECT_EQ(ChooseSplitK(8, 224, 66, 0, true), 8);   // the wave, not K, limits it
  EXPECT_EQ(ChooseSplitK(40, 64, 66, 0, true), 1);   // over half a wave
}

// Depth: one more than the deepest node read, through any operand; an edge
// from a node not earlier in the list (which Lower refuses) counts nothing.
TEST(NodeDepthsTest, OneMoreThanTheDeepestProducer) {
  auto reads = [](std::vector<int> producers) {
    NodeProblem p = Gemm(16, 64, 64);
    for (int producer : producers) {
      DependencyEdge e;
      e.producer = producer;
      e.operand = static_cast<uint8_t>(producer % 2 == 0 ? DependencyOperand::kA : DependencyOperand::kResidual);
      p.dependencies.push_back(e);
    }
    return p;
  };
  // 0, 1: sources; 2 reads 0; 3 reads 1 and 2; 4 reads 0 and (wrongly) 5.
  const std::vector<NodeProblem> g = {Gemm(16, 64, 64), Gemm(16, 64, 64), reads({0}), reads({1, 2}),
                                      reads({0, 5}), Gemm(16, 64, 64)};
  EXPECT_EQ(NodeDepths(g), std::vector<int32_t>({0, 0, 1, 2, 1, 0}));
  EXPECT_TRUE(NodeDepths({}).empty());
}

// The nodes of one dependency depth fill the wave together: the rule counts
// their cluster tiles (the step's), never fewer than the node's own.
TEST(ChooseSplitKTest, CountsTheStepsClusterTiles) {
  EXPECT_EQ(ChooseSplitK(8, 224, 66, 0, false, /*step_cluster_tiles=*/16), 4);  // 16 * 4 = 64 <= 66
  EXPECT_EQ(ChooseSplitK(8, 224, 66, 0, false, 8), 8);                          // the node alone
  EXPECT_EQ(ChooseSplitK(8, 224, 66, 0, false, 0), 8);                          // not given: alone
  EXPECT_EQ(ChooseSplitK(8, 224, 66, 0, false, 4), 8);                          // fewer than its own
  EXPECT_EQ(ChooseSplitK(8, 224, 66, 0, false, 34), 1);                         // over half a wave
  EXPECT_EQ(ChooseSplitK(8, 224, 66, 0, true, 33), 2);                          // exactly half
  EXPECT_EQ(ChooseSplitK(8, 224, 66, 3, false, 200), 3);                        // forced stays forced
}

// Which nodes TileNode treats as few-row reduces: one row block of at most 16
// rows, or a node reduced in parts.
TEST(TileNodeTest, FewRowAndPartedNodesKeepEightBlocksASplit) {
  auto split = [](int64_t m, int64_t n) {
    absl::StatusOr<NodeSchedule> node = TileNode(Gemm(m, n, 4096), 0, Options());
    EXPECT_TRUE(node.ok()) << node.status();
    return node.ok() ? node->split_k : -1;
  };
  EXPECT_EQ(split(1, 4096), 8);
  EXPECT_EQ(split(16, 4096), 8);
  EXPECT_EQ(split(16, 4000), 8);   // ragged, so not in parts: 16 rows is still a few-row reduce
  EXPECT_EQ(split(17, 4096), 8);   // reduced in 3 parts
  EXPECT_EQ(split(64, 4096), 8);   // reduced in 8 parts
  // Ragged: its tiles summed whole, >= 16 blocks a split (4), and by the last
  // split, for which 3 cost less (SplitsSummedByLast).
  EXPECT_EQ(split(64, 4000), 3);
  EXPECT_EQ(split(129, 4096), 3);  // two row blocks: the same
}

// The last split's main loop plus its sum of the others' partials, each
// counted as kPartialCostKBlocks k-blocks: the split count that minimises it.
TEST(TileNodeTest, SplitsSummedByLastWeighMainLoopAgainstPartials) {
  static_assert(kPartialCostKBlocks == 9, "the expectations below count 9 k-blocks a partial");
  EXPECT_EQ(SplitsSummedByLast(64, 4), 3);    // 16 + 27, 22 + 18, 32 + 9: 43, 40, 41
  EXPECT_EQ(SplitsSummedByLast(64, 2), 2);
  EXPECT_EQ(SplitsSummedByLast(224, 4), 4);   // 56 + 27 against 75 + 18
  EXPECT_EQ(SplitsSummedByLast(32, 4), 2);    // 8 + 27, 11 + 18, 16 + 9
  EXPECT_EQ(SplitsSummedByLast(54, 3), 3);    // 18 + 18 against 27 + 9: a tie keeps 3
  EXPECT_EQ(SplitsSummedByLast(36, 3), 2);    // 12 + 18 against 18 + 9
  EXPECT_EQ(SplitsSummedByLast(2, 2), 2);
  auto split = [](int64_t m, int64_t k, int forced, bool sum_in_last_split = true) {
    SchedulerOptions o = Options();
    o.split_k = forced;
    o.sum_in_last_split = sum_in_last_split;
    absl::StatusOr<NodeSchedule> node = TileNode(Gemm(m, 4096, k), 0, o);
    EXPECT_TRUE(node.ok()) << node.status();
    return node.ok() ? node->split_k : -1;
  };
  EXPECT_EQ(split(200, 4096, 0), 3);          // the chain at 200 rows
  EXPECT_EQ(split(200, 14336, 0), 4);         // the MLP block's down projection at 200 tokens
  EXPECT_EQ(split(200, 4096, 4), 4);          // forced splits stay
  EXPECT_EQ(split(200, 4096, 0, false), 4);   // reduce jobs: ChooseSplitK's
}

// A split node of one row block is reduced in parts of 8 or 16 rows when
// every part can go straight into C (whole non-SwiGLU tiles) and the parts of
// all its tiles fit one wave.
TEST(ChooseReducePartsTest, EightRowsWhereTheyFitElseSixteenWithinAWave) {
  auto parts = [](int64_t m, int64_t n, int64_t k, bool swiglu = false, bool allowed = true, int rows = 0,
                  bool has_consumers = false) {
    SchedulerOptions o = Options();
    o.reduce_in_parts = allowed;
    o.reduce_part_rows = rows;
    o.sum_in_last_split = false;  // whole tiles as one reduce job: one part (the next test)
    absl::StatusOr<NodeSchedule> node = TileNode(Gemm(m, n, k, swiglu), 0, o, has_consumers);
    EXPECT_TRUE(node.ok()) << node.status();
    if (!node.ok()) return std::pair{-1, -1};
    EXPECT_EQ(node->reduce_part_rows == 0, node->reduce_parts == 1);
    return std::pair{node->reduce_parts, node->reduce_part_rows};
  };
  using P = std::pair<int, int>;
  EXPECT_EQ(parts(64, 4096, 14336), P(8, 8));    // 8 cluster tiles x 8 parts <= 66
  EXPECT_EQ(parts(128, 4096, 14336), P(8, 16));  // 16 parts of 8 would be too many
  EXPECT_EQ(parts(17, 4096, 4096), P(3, 8));     // the last part has 1 row
  EXPECT_EQ(parts(100, 4096, 4096), P(7, 16));   // the last part has 4 rows
  EXPECT_EQ(parts(16, 4096, 4096), P(2, 8));
  EXPECT_EQ(parts(8, 4096, 4096), P(1, 0));      // one few-row job already
  EXPECT_EQ(parts(129, 4096, 4096), P(1, 0));    // two row blocks
  EXPECT_EQ(parts(64, 4000, 4096), P(1, 0));     // a ragged last tile is staged
  EXPECT_EQ(parts(64, 8192, 4096, /*swiglu=*/true), P(1, 0));
  EXPECT_EQ(parts(64, 4096, 64), P(1, 0));       // one k-block: no split
  EXPECT_EQ(parts(64, 4096, 14336, false, /*allowed=*/false), P(1, 0));
  EXPECT_EQ(parts(128, 14336, 4096), P(1, 0));   // 28 cluster tiles x 8 parts: past a wave
  EXPECT_EQ(parts(32, 14336, 4096), P(2, 16));   // 28 x 4 parts of 8 do not fit, 28 x 2 do
  // A node with consumers: 8-row parts only within half a wave (the next
  // node's jobs need SMs too); 16-row parts within a wave, as before.
  EXPECT_EQ(parts(16, 4096, 4096, false, true, 0, /*has_consumers=*/true), P(2, 8));    // 16 jobs
  EXPECT_EQ(parts(32, 4096, 4096, false, true, 0, /*has_consumers=*/true), P(4, 8));    // 32 jobs
  EXPECT_EQ(parts(64, 4096, 4096, false, true, 0, /*has_consumers=*/true), P(4, 16));   // 64 would not fit
  EXPECT_EQ(parts(128, 4096, 4096, false, true, 0, /*has_consumers=*/true), P(8, 16));
  // Forced rows: used where they fit, else no parts.
  EXPECT_EQ(parts(64, 4096, 14336, false, true, /*rows=*/16), P(4, 16));
  EXPECT_EQ(parts(64, 4096, 14336, false, true, /*rows=*/5), P(1, 0));  // 13 parts
  EXPECT_EQ(parts(16, 4096, 4096, false, true, /*rows=*/16), P(1, 0));  // one part
}

// A split node's tiles that would each be summed whole by one reduce job
// (not in parts, not a few-row decode tile) are summed by their last split.
TEST(TileNodeTest, WholeTilesAreSummedByTheirLastSplit) {
  auto reduce_parts = [](int64_t m, int64_t n, int64_t k, bool sum_in_last_split = true, int split_k = 0) {
    SchedulerOptions o = Options();
    o.sum_in_last_split = sum_in_last_split;
    o.split_k = split_k;
    absl::StatusOr<NodeSchedule> node = TileNode(Gemm(m, n, k), 0, o);
    EXPECT_TRUE(node.ok()) << node.status();
    return node.ok() ? node->reduce_parts : -1;
  };
  EXPECT_EQ(reduce_parts(300, 4096, 4096), 0);           // three row blocks, split 2
  EXPECT_EQ(reduce_parts(200, 4096, 14336), 0);          // two row blocks, split 4
  EXPECT_EQ(reduce_parts(64, 4000, 4096), 0);            // a ragged last tile is not reduced in parts
  EXPECT_EQ(reduce_parts(128, 4096, 14336), 8);          // in parts
  EXPECT_EQ(reduce_parts(8, 4096, 4096), 1);             // a few-row decode tile keeps its reduce job
  EXPECT_EQ(reduce_parts(300, 4096, 4096, false), 1);    // the option off: reduce jobs
  EXPECT_EQ(reduce_parts(300, 4096, 4096, true, 1), 1);  // no split: nothing to sum
  EXPECT_EQ(reduce_parts(300, 4096, 4096, true, kMaxSplitsSummedByLast), 0);
  EXPECT_EQ(reduce_parts(300, 4096, 4096, true, kMaxSplitsSummedByLast + 1), 1);  // more: reduce jobs
  EXPECT_EQ(reduce_parts(8192, 4096, 4096), 1);          // many tiles: no split
}

TEST(ChooseReducePartsTest, OptionOutsideAFewRowReduceIsRefused) {
  SchedulerOptions o = Options();
  o.reduce_part_rows = 17;
  const absl::Status status = ValidateOptions(o);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("reduce_part_rows must be in [0, 16]"), std::string::npos) << status;
  EXPECT_NE(status.message().find("got 17"), std::string::npos) << status;
  o.reduce_part_rows = -1;
  EXPECT_EQ(ValidateOptions(o).code(), absl::StatusCode::kInvalidArgument);
}

class SplitKRangeTest : public testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(SplitKRangeTest, PartitionsKExactlyInOrderWithSizesWithinOne) {
  const auto [k_blocks, split_k] = GetParam();
  int32_t expected_begin = 0, smallest = k_blocks, largest = 0;
  for (int s = 0; s < split_k; ++s) {
    const KBlockRange r = SplitKRange(k_blocks, split_k, s);
    EXPECT_EQ(r.begin, expected_begin) << "split " << s;
    EXPECT_GE(r.end, r.begin);
    smallest = std::min(smallest, r.end - r.begin);
    largest = std::max(largest, r.end - r.begin);
    expected_begin = r.end;
  }
  EXPECT_EQ(expected_begin, k_blocks);
  EXPECT_LE(largest - smallest, 1);
}

// A longer last split: the others share k_blocks - last_extra evenly, the last
// takes its share of that and last_extra more, and the ranges still partition
// K in order; with two splits, a shorter one.
TEST(SplitKRangeTest, LastSplitTakesItsExtraKBlocks) {
  auto sizes = [](int32_t k_blocks, int32_t split_k, int32_t extra) {
    std::vector<int32_t> out;
    int32_t expected_begin = 0;
    for (int s = 0; s < split_k; ++s) {
      const KBlockRange r = SplitKRange(k_blocks, split_k, s, extra);
      EXPECT_EQ(r.begin, expected_begin) << k_blocks << "/" << split_k << "+" << extra << " split " << s;
      expected_begin = r.end;
      out.push_back(r.end - r.begin);
    }
    EXPECT_EQ(expected_begin, k_blocks);
    return out;
  };
  using V = std::vector<int32_t>;
  EXPECT_EQ(sizes(64, 2, 4), V({30, 34}));
  EXPECT_EQ(sizes(64, 4, 4), V({15, 15, 15, 19}));
  EXPECT_EQ(sizes(65, 2, 4), V({31, 34}));  // 61 shared: the first split's extra block
  EXPECT_EQ(sizes(224, 2, 0), V({112, 112}));
  EXPECT_EQ(sizes(64, 2, 62), V({1, 63}));  // the most: every other split keeps one
  EXPECT_EQ(sizes(7, 3, 4), V({1, 1, 5}));
  EXPECT_EQ(sizes(10, 1, 0), V({10}));
  // Two splits, a negative extra: the first longer by that much
  // (SchedulerOptions::first_split_lead_k_blocks), or by one more where the
  // sum is odd; at most k_blocks - 2, the last keeping one.
  EXPECT_EQ(sizes(448, 2, -24), V({236, 212}));
  EXPECT_EQ(sizes(25, 2, -8), V({17, 8}));
  EXPECT_EQ(sizes(64, 2, -62), V({63, 1}));
}

INSTANTIATE_TEST_SUITE_P(Shapes, SplitKRangeTest,
                         testing::Combine(testing::Values(1, 4, 7, 16, 63, 64, 65, 224, 4096, 65535),
                                          testing::Values(1, 2, 3, 5, 8, 16, 66, 256)),
                         [](const auto& info) {
                           std::string name = "k";
                           name += std::to_string(std::get<0>(info.param));
                           name += "_s";
                           name += std::to_string(std::get<1>(info.param));
                           return name;
                         });

TEST(RasterTest, AlongMWalksDownBandsOfColumns) {
  // 3 rows x 5 cols, bands of 2 columns: {0,1}, {2,3}, {4}.
  const std::vector<ClusterCoord> order = RasterizeClusterTiles({.rows = 3, .cols = 5}, RasterOrder::kAlongM, 2);
  const std::vector<ClusterCoord> expected = {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 0}, {2, 1},
                                              {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 2}, {2, 3},
                                              {0, 4}, {1, 4}, {2, 4}};
  EXPECT_EQ(order, expected);
}

TEST(RasterTest, AlongNWalksAcrossBandsOfRows) {
  const std::vector<ClusterCoord> order = RasterizeClusterTiles({.rows = 3, .cols = 2}, RasterOrder::kAlongN, 2);
  const std::vector<ClusterCoord> expected = {{0, 0}, {1, 0}, {0, 1}, {1, 1}, {2, 0}, {2, 1}};
  EXPECT_EQ(order, expected);
}

TEST(RasterTest, ChoosesTheLongerDimensionAndAGroupNearSqrtWave) {
  EXPECT_EQ(ChooseRaster({.rows = 16, .cols = 4}), RasterOrder::kAlongM);
  EXPECT_EQ(ChooseRaster({.rows = 16, .cols = 112}), RasterOrder::kAlongN);
  EXPECT_EQ(ChooseGroupSize({.rows = 16, .cols = 112}, RasterOrder::kAlongN, 66, 1 << 20), 8);
  EXPECT_EQ(ChooseGroupSize({.rows = 1, .cols = 112}, RasterOrder::kAlongN, 66, 1 << 20), 1);
  // Huge K: a cross panel of 8 MiB leaves room for 2 in the L2 slice.
  EXPECT_EQ(ChooseGroupSize({.rows = 64, .cols = 64}, RasterOrder::kAlongN, 66, 8 << 20), 2);
}

// A square grid walks along N (kAlongM needs more rows than columns), and a
// wave of more than 66 clusters (clusters of one CTA on a 132-SM device) gets
// a band near its square root, capped at 16.
TEST(RasterTest, ASquareGridWalksAlongNAndAWideWaveGroupsUpToSixteen) {
  EXPECT_EQ(ChooseRaster({.rows = 8, .cols = 8}), RasterOrder::kAlongN);
  EXPECT_EQ(ChooseRaster({.rows = 1, .cols = 1}), RasterOrder::kAlongN);
  EXPECT_EQ(ChooseGroupSize({.rows = 64, .cols = 64}, RasterOrder::kAlongN, 132, 1 << 20), 11);  // sqrt(132)
  EXPECT_EQ(ChooseGroupSize({.rows = 64, .cols = 64}, RasterOrder::kAlongN, 400, 1 << 20), 16);  // sqrt 20, capped
  EXPECT_EQ(ChooseGroupSize({.rows = 64, .cols = 64}, RasterOrder::kAlongM, 1024, 1 << 10), 16);
}

class RasterBijectionTest
    : public testing::TestWithParam<std::tuple<int, int, RasterOrder, int>> {};

TEST_P(RasterBijectionTest, VisitsEveryClusterTileOnceBandByBand) {
  const auto [rows, cols, order, group] = GetParam();
  const ClusterGrid grid{rows, cols};
  const std::vector<ClusterCoord> tiles = RasterizeClusterTiles(grid, order, group);
  ASSERT_EQ(static_cast<int64_t>(tiles.size()), grid.size());
  std::set<std::pair<int, int>> seen;
  const bool along_m = order == RasterOrder::kAlongM;
  const int walk_len = along_m ? rows : cols;
  const int cross_len = along_m ? cols : rows;
  const int g = std::clamp(group, 1, std::max(cross_len, 1));
  int previous_band = 0, previous_walk = -1;
  for (size_t i = 0; i < tiles.size(); ++i) {
    const ClusterCoord c = tiles[i];
    ASSERT_TRUE(c.row >= 0 && c.row < rows && c.col >= 0 && c.col < cols) << i;
    EXPECT_TRUE(seen.insert({c.row, c.col}).second) << "tile visited twice at " << i;
    const int cross = along_m ? c.col : c.row;
    const int walk = along_m ? c.row : c.col;
    const int band = cross / g;
    // The band of position i is i / (walk_len * g): bands are contiguous in the order.
    EXPECT_EQ(band, static_cast<int>(i / (static_cast<size_t>(walk_len) * g))) << i;
    EXPECT_GE(band, previous_band);
    if (band != previous_band) previous_walk = -1;
    EXPECT_GE(walk, previous_walk) << "the walk goes backwards inside band " << band << " at " << i;
    previous_band = band;
    previous_walk = walk;
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), grid.size());
}

INSTANTIATE_TEST_SUITE_P(
    Grids, RasterBijectionTest,
    testing::Combine(testing::Values(1, 2, 7, 16, 33), testing::Values(1, 3, 8, 56, 112),
                     testing::Values(RasterOrder::kAlongM, RasterOrder::kAlongN), testing::Values(1, 2, 3, 8, 16, 200)));

}  // namespace
}  // namespace loom::sched
