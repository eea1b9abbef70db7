// The queue order of whole graphs, checked two ways: CheckQueue (topological,
// each job once) and simulated runs in which virtual SMs pull jobs in random
// interleavings (never deadlocks, never reads unfinished data, each tile once).
// Also checks that the simulator catches broken queues and broken flags.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "loom/scheduler/explain.h"
#include "loom/scheduler/job_access.h"
#include "loom/scheduler/queue.h"
#include "loom/scheduler/schedule.h"
#include "loom/scheduler/simulation.h"
#include "testbed/node_problems.h"
#include "testbed/testbed.h"

namespace loom::sched {
namespace {

using Op = DependencyOperand;

using testbed::Edge;
using testbed::Gemm;

SchedulerOptions Options(TileShape tile, int cluster_size, int max_clusters) {
  SchedulerOptions o;
  o.tile = tile;
  o.cluster_size = cluster_size;
  o.num_sms = max_clusters * cluster_size;
  o.max_clusters = max_clusters;
  return o;
}

struct GraphCase {
  std::string name;
  std::vector<NodeProblem> nodes;
  SchedulerOptions options;
  int seeds = 0;
};

// x -> o_proj -> up (SwiGLU, gate/up interleaved) -> down (+ residual x').
std::vector<NodeProblem> MlpBlock(int64_t m, int64_t hidden, int64_t intermediate) {
  return {Gemm(m, hidden, hidden),
          Gemm(m, 2 * intermediate, hidden, {Edge(0, Op::kA)}, /*swiglu=*/true),
          Gemm(m, hidden, intermediate, {Edge(1, Op::kA), Edge(0, Op::kResidual)})};
}

std::vector<GraphCase> Cases() {
  const TileShape small_tile{128, 128, 64};
  std::vector<GraphCase> cases;
  cases.push_back({"Chain", {Gemm(512, 512, 512), Gemm(512, 512, 512, {Edge(0, Op::kA)}),
                             Gemm(512, 384, 512, {Edge(1, Op::kA)}), Gemm(512, 512, 384, {Edge(2, Op::kA)})},
                   Options(small_tile, 2, 8), 4000});
  // Two consumers of one producer; one consumer of two producers (its A is
  // [C1 | C2] along K: C2's columns start at C1's width), plus a residual.
  cases.push_back({"Diamond",
                   {Gemm(384, 512, 256), Gemm(384, 256, 512, {Edge(0, Op::kA)}), Gemm(384, 128, 512, {Edge(0, Op::kA)}),
                    Gemm(384, 512, 384, {Edge(1, Op::kA), Edge(2, Op::kA, 0, -256), Edge(0, Op::kResidual)})},
                   Options(small_tile, 2, 6), 4000});
  cases.push_back({"DiamondCluster1",
                   {Gemm(384, 512, 256), Gemm(384, 256, 512, {Edge(0, Op::kA)}), Gemm(384, 128, 512, {Edge(0, Op::kA)}),
                    Gemm(384, 512, 384, {Edge(1, Op::kA), Edge(2, Op::kA, 0, -256), Edge(0, Op::kResidual)})},
                   Options(small_tile, 1, 12), 3000});
  cases.push_back({"MlpBlock", MlpBlock(256, 4096, 14336), Options({128, 256, 512}, 2, 66), 1500});
  cases.push_back({"IndependentBatch",
                   {Gemm(512, 512, 512), Gemm(64, 1024, 256), Gemm(1000, 129, 200), Gemm(16, 512, 2048),
                    Gemm(0, 512, 512), Gemm(256, 256, 0)},
                   Options(small_tile, 2, 8), 3000});
  // Ragged shapes, a consumer reading a row window of its producer, a bias
  // produced by another node, an operand B produced by another node.
  cases.push_back({"Ragged",
                   {Gemm(1000, 129, 65), Gemm(900, 63, 129, {Edge(0, Op::kA, 100, 0)}),
                    Gemm(1, 129, 63), Gemm(900, 129, 63, {Edge(1, Op::kA), Edge(2, Op::kBias), Edge(0, Op::kResidual, 100)}),
                    Gemm(63, 1000, 129, {Edge(0, Op::kB)}), Gemm(63, 65, 1000, {Edge(4, Op::kA)})},
                   Options(small_tile, 2, 5), 4000});
  // Decode: M = 16, the consumer splits K and waits on its producer per k-block.
  cases.push_back({"SmallMSplitK", MlpBlock(16, 2048, 4096), Options({128, 256, 128}, 2, 16), 3000});
  cases.push_back({"ForcedSplitKChain",
                   {Gemm(300, 256, 512), Gemm(300, 384, 256, {Edge(0, Op::kA)}), Gemm(300, 256, 384, {Edge(1, Op::kA)})},
                   [] {
                     SchedulerOptions o = Options({128, 128, 64}, 2, 4);
                     o.split_k = 3;
                     return o;
                   }(),
                   3000});
  // The narrow decode kernel's schedules (runtime.cc): 64 x 32 tiles over the
  // whole of K (no split), one CTA a job, 132 SMs: the 8-layer chain and the
  // MLP block at one token.
  {
    SchedulerOptions narrow = Options({64, 32, 64}, 1, 132);
    narrow.split_k = 1;
    std::vector<NodeProblem> chain = {Gemm(1, 4096, 4096)};
    for (int layer = 1; layer < 8; ++layer) chain.push_back(Gemm(1, 4096, 4096, {Edge(layer - 1, Op::kA)}));
    cases.push_back({"NarrowChain", chain, narrow, 120});
    cases.push_back({"NarrowMlpBlock", MlpBlock(1, 4096, 14336), narrow, 60});
  }
  cases.push_back({"WholeTensor",
                   {Gemm(256, 256, 256), Gemm(256, 256, 256, {Edge(0, Op::kA, 0, 0, /*whole_tensor=*/true)}),
                    Gemm(256, 256, 256, {Edge(1, Op::kA)})},
                   Options(small_tile, 2, 3), 3000});
  return cases;
}

class GraphTest : public testing::TestWithParam<GraphCase> {};

TEST_P(GraphTest, QueueIsTopologicalWithEveryJobOnce) {
  absl::StatusOr<Schedule> s = Lower(GetParam().nodes, GetParam().options);
  ASSERT_TRUE(s.ok()) << s.status();
  const absl::Status check = CheckQueue(*s);
  EXPECT_TRUE(check.ok()) << check << "\n" << ExplainSchedule(*s, {});
}

TEST_P(GraphTest, SimulatedRunsFinishAndNeverReadUnfinishedData) {
  absl::StatusOr<Schedule> s = Lower(GetParam().nodes, GetParam().options);
  ASSERT_TRUE(s.ok()) << s.status();
  const Simulator simulator(*s);
  const int max_clusters = GetParam().options.max_clusters;
  const int sm_counts[] = {1, 2, 3, 5, max_clusters, 2 * max_clusters + 1};
  int max_nodes_in_flight = 0;
  for (int seed = 0; seed < GetParam().seeds; ++seed) {
    const int sms = sm_counts[seed % 6];
    // Half the runs hand the first wave out statically, as the narrow kernel
    // does (worker i starts on job i).
    const bool static_first_wave = seed % 12 >= 6;
    const SimulationResult r = simulator.Run(sms, static_cast<uint64_t>(seed), static_first_wave);
    ASSERT_TRUE(r.ok()) << "seed " << seed << ", " << sms << " SMs" << (static_first_wave ? ", static first wave" : "")
                        << ": " << r.Summary();
    EXPECT_EQ(r.jobs_completed, static_cast<int64_t>(s->queue.size()));
    max_nodes_in_flight = std::max(max_nodes_in_flight, r.max_nodes_in_flight);
  }
  int nodes_with_jobs = 0;
  for (int i = 0; i < static_cast<int>(s->nodes.size()); ++i) nodes_with_jobs += NodeJobCount(*s, i) > 0;
  if (nodes_with_jobs > 1) {
    EXPECT_GE(max_nodes_in_flight, 2) << "no two nodes ever ran at once";
  }
}

INSTANTIATE_TEST_SUITE_P(Graphs, GraphTest, testing::ValuesIn(Cases()),
                         [](const testing::TestParamInfo<GraphCase>& info) { return info.param.name; });

// gate/up (SwiGLU, interleaved columns) -> down, as the runtime's MLP block.
std::vector<NodeProblem> GateUpDown(int64_t m, int64_t hidden, int64_t intermediate) {
  return {Gemm(m, 2 * intermediate, hidden, {}, /*swiglu=*/true),
          Gemm(m, hidden, intermediate, {Edge(0, Op::kA)})};
}

// Queue positions of a node's first and last kGemm job.
struct NodeSpan {
  int64_t first = -1;
  int64_t last = -1;
};
NodeSpan GemmSpanOf(const Schedule& s, int node) {
  NodeSpan span;
  for (int64_t p = 0; p < static_cast<int64_t>(s.queue.size()); ++p) {
    if (s.queue[p].node != node || s.queue[p].kind != static_cast<uint8_t>(JobKind::kGemm)) continue;
    if (span.first < 0) span.first = p;
    span.last = p;
  }
  return span;
}

// Clusters past one a job change nothing: INT_MAX of them is the makespan of
// as many clusters as jobs (it once filled a heap with 2^31 entries and threw
// bad_alloc), and below 1 counts as 1.
TEST(WavefrontTest, MakespanOfMoreClustersThanJobs) {
  absl::StatusOr<Schedule> s = Lower(GateUpDown(256, 512, 1024), Options({128, 256, 64}, 2, 66));
  ASSERT_TRUE(s.ok()) << s.status();
  const int32_t jobs = static_cast<int32_t>(s->queue.size());
  ASSERT_GT(jobs, 4);
  EXPECT_EQ(SimulatedMakespan(*s, s->queue, INT32_MAX), SimulatedMakespan(*s, s->queue, jobs));
  EXPECT_LT(SimulatedMakespan(*s, s->queue, jobs), SimulatedMakespan(*s, s->queue, 1));
  EXPECT_EQ(SimulatedMakespan(*s, s->queue, -5), SimulatedMakespan(*s, s->queue, 1));
}

TEST(WavefrontTest, FullSizeMlpInterleavesUpAndDown) {
  // hidden 4096, intermediate 14336, M = 8192: deepest-first simulates
  // shorter, so down's jobs for the first rows enter the queue long before
  // up's last jobs.
  const SchedulerOptions o = Options({128, 256, 64}, 2, 66);
  absl::StatusOr<Schedule> s = Lower(GateUpDown(8192, 4096, 14336), o);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(CheckQueue(*s).ok());
  const NodeSpan up = GemmSpanOf(*s, 0);
  const NodeSpan down = GemmSpanOf(*s, 1);
  EXPECT_LT(down.first, up.last - 1000) << ExplainSchedule(*s, {"up", "down"});
  EXPECT_LT(SimulatedMakespan(*s, s->queue, 66),
            SimulatedMakespan(*s, WavefrontQueue(*s, 66, NodePriority::kShallowestFirst), 66));
  const Simulator simulator(*s);
  for (uint64_t seed = 0; seed < 4; ++seed) {
    const SimulationResult r = simulator.Run(seed % 2 ? 66 : 132, seed);
    ASSERT_TRUE(r.ok()) << r.Summary();
    EXPECT_GE(r.max_nodes_in_flight, 2);
  }
}

TEST(WavefrontTest, MultiWaveProducerRunsBeforeItsSplitConsumer) {
  // hidden 8192, intermediate 28672, 128 tokens: gate/up is 112 cluster jobs
  // (1.7 waves), the down projection splits K four ways, each split reading a
  // quarter of gate/up's tiles. Deepest-first would put down jobs among
  // gate/up's second wave and push its last tiles (and the down jobs that
  // read them) a wave later; the queue takes all of gate/up first.
  const SchedulerOptions o = Options({128, 256, 64}, 2, 66);
  absl::StatusOr<Schedule> s = Lower(GateUpDown(128, 8192, 28672), o);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(CheckQueue(*s).ok());
  ASSERT_GT(s->nodes[1].split_k, 1);
  EXPECT_LT(GemmSpanOf(*s, 0).last, GemmSpanOf(*s, 1).first) << ExplainSchedule(*s, {"gate_up", "down"});
  const std::vector<TileJob> deepest = WavefrontQueue(*s, 66, NodePriority::kDeepestFirst);
  const int64_t deepest_time = SimulatedMakespan(*s, deepest, 66);
  const int64_t queue_time = SimulatedMakespan(*s, s->queue, 66);
  EXPECT_LT(queue_time * 10, deepest_time * 9) << queue_time << " against " << deepest_time;
  const std::string explained = ExplainSchedule(*s, {"gate_up", "down"});
  const std::string order_line = absl::StrCat("order: shallowest-first, simulated on 66 clusters at ", queue_time,
                                              " k-blocks against ", deepest_time, " for deepest-first");
  EXPECT_NE(explained.find(order_line), std::string::npos) << explained;
  const Simulator simulator(*s);
  for (uint64_t seed = 0; seed < 4; ++seed) {
    const SimulationResult r = simulator.Run(seed % 2 ? 66 : 132, seed);
    ASSERT_TRUE(r.ok()) << r.Summary();
  }
}

TEST(WavefrontTest, OrderQueueKeepsWhicheverOrderSimulatesShorter) {
  const SchedulerOptions o = Options({128, 256, 64}, 2, 66);
  std::vector<std::vector<NodeProblem>> graphs = {
      GateUpDown(128, 4096, 14336), GateUpDown(256, 4096, 14336), GateUpDown(512, 8192, 28672),
      GateUpDown(8192, 4096, 14336), MlpBlock(4096, 4096, 14336)};
  for (int64_t m : {1, 128, 2048}) {
    std::vector<NodeProblem> chain = {Gemm(m, 4096, 4096)};
    for (int l = 1; l < 8; ++l) chain.push_back(Gemm(m, 4096, 4096, {Edge(l - 1, Op::kA)}));
    graphs.push_back(chain);
  }
  int deepest_kept = 0, shallowest_kept = 0;
  for (size_t i = 0; i < graphs.size(); ++i) {
    absl::StatusOr<Schedule> s = Lower(graphs[i], o);
    ASSERT_TRUE(s.ok()) << s.status();
    const std::vector<TileJob> deep = WavefrontQueue(*s, 66, NodePriority::kDeepestFirst);
    const std::vector<TileJob> shallow = WavefrontQueue(*s, 66, NodePriority::kShallowestFirst);
    const int64_t deep_time = SimulatedMakespan(*s, deep, 66);
    const int64_t shallow_time = SimulatedMakespan(*s, shallow, 66);
    ASSERT_GT(deep_time, 0);
    ASSERT_GT(shallow_time, 0);
    const std::vector<TileJob>& expected = deep_time < shallow_time ? deep : shallow;
    ASSERT_EQ(s->queue.size(), expected.size()) << "graph " << i;
    EXPECT_TRUE(std::equal(s->queue.begin(), s->queue.end(), expected.begin(), [](const TileJob& a, const TileJob& b) {
      return std::memcmp(&a, &b, sizeof(TileJob)) == 0;
    })) << "graph " << i << ": deepest-first " << deep_time << ", shallowest-first " << shallow_time;
    deepest_kept += deep_time < shallow_time;
    shallowest_kept += deep_time > shallow_time;
  }
  // The set covers both outcomes.
  EXPECT_GE(deepest_kept, 1);
  EXPECT_GE(shallowest_kept, 1);
}

// SimulatedMakespan's units, by hand: a kGemm job costs its k-blocks + 4, a
// reduce job 4 + its fp32 partial bytes over 2 x a bf16 k-block's (tile.n x
// tile.k) bytes.
TEST(SimulatedMakespanTest, CountsKBlocksEpiloguesAndWaits) {
  const TileShape tile{128, 256, 64};
  // Four tiles of 10 k-blocks: 14 each, on 1 / 2 / 4 clusters.
  absl::StatusOr<Schedule> s = Lower({Gemm(128, 1024, 640)}, Options(tile, 1, 4));
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->queue.size(), 4u);
  EXPECT_EQ(SimulatedMakespan(*s, s->queue, 1), 56);
  EXPECT_EQ(SimulatedMakespan(*s, s->queue, 0), 56);  // below 1 counts as 1
  EXPECT_EQ(SimulatedMakespan(*s, s->queue, 2), 28);
  EXPECT_EQ(SimulatedMakespan(*s, s->queue, 4), 14);
  // A consumer of one 4-k-block tile waits for its producer: 14 + 8.
  s = Lower({Gemm(128, 256, 640), Gemm(128, 256, 256, {Edge(0, Op::kA)})}, Options(tile, 1, 4));
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->queue.size(), 2u);
  EXPECT_EQ(SimulatedMakespan(*s, s->queue, 4), 22);
  // Split in two (5 k-blocks each, 9 apiece, side by side), then one
  // whole-tile reduce: 2 x 128 rows x 4 bytes against 2 x 2 x 64 = 4, + 4.
  SchedulerOptions split = Options(tile, 1, 4);
  split.split_k = 2;
  split.reduce_in_parts = false;
  split.sum_in_last_split = false;
  s = Lower({Gemm(128, 256, 640)}, split);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->queue.size(), 3u);
  EXPECT_EQ(SimulatedMakespan(*s, s->queue, 4), 9 + 8);
  EXPECT_EQ(SimulatedMakespan(*s, s->queue, 1), 9 + 9 + 8);
  // The same summed by the last split: its main loop (5) beside split 0's
  // job (9); then split 0's partial (128 rows x 4 bytes against 256: 2), +
  // 4. On one cluster its main loop starts at 9.
  split.sum_in_last_split = true;
  s = Lower({Gemm(128, 256, 640)}, split);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->queue.size(), 2u);
  EXPECT_EQ(SimulatedMakespan(*s, s->queue, 4), 9 + 6);
  EXPECT_EQ(SimulatedMakespan(*s, s->queue, 1), 9 + 5 + 6);
  // Reduced in parts (each part's output flag has two writers) with a
  // consumer, every node split in two: the producer's splits (8 k-blocks,
  // 12) side by side, its two 8-row parts (2 x 8 rows x 4 bytes against
  // 256: 1, + 4 = 5) from 12 to 17, the consumer's splits (2 k-blocks, 6)
  // to 23, its parts to 28.
  SchedulerOptions parts = Options(tile, 1, 4);
  parts.split_k = 2;
  parts.reduce_part_rows = 8;
  s = Lower({Gemm(16, 256, 1024), Gemm(16, 256, 256, {Edge(0, Op::kA)})}, parts);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->nodes[0].reduce_parts, 2);
  ASSERT_EQ(s->queue.size(), 8u);
  EXPECT_EQ(SimulatedMakespan(*s, s->queue, 4), 28) << ExplainSchedule(*s, {});
  // A job the schedule does not have.
  std::vector<TileJob> foreign = s->queue;
  foreign[0].n_block = 7;
  EXPECT_EQ(SimulatedMakespan(*s, foreign, 4), -1);
}

TEST(WavefrontTest, ExplainSaysWhenBothOrdersAgree) {
  absl::StatusOr<Schedule> s = Lower({Gemm(512, 512, 512)}, Options({128, 128, 64}, 2, 8));
  ASSERT_TRUE(s.ok());
  const std::string explained = ExplainSchedule(*s, {});
  EXPECT_NE(explained.find("order: deepest-first and shallowest-first agree (8 clusters)"), std::string::npos)
      << explained;
  // A queue set by hand (here: its first two jobs swapped) is neither.
  std::swap(s->queue[0], s->queue[1]);
  EXPECT_NE(ExplainSchedule(*s, {}).find("order: neither wavefront order"), std::string::npos);
}

TEST(WavefrontTest, IndependentNodesAreConcatenated) {
  absl::StatusOr<Schedule> s =
      Lower({Gemm(512, 512, 512), Gemm(512, 512, 512), Gemm(512, 512, 512)}, Options({128, 128, 64}, 2, 8));
  ASSERT_TRUE(s.ok());
  for (size_t p = 1; p < s->queue.size(); ++p) EXPECT_GE(s->queue[p].node, s->queue[p - 1].node) << p;
}

// Among nodes of one depth the node with the longer remaining critical path
// goes first, in either priority: nodes 0 and 1 read nothing, but only node 1
// heads a chain (1 -> 2 -> 3), so its jobs lead the queue.
TEST(WavefrontTest, LongerCriticalPathGoesFirstAmongNodesOfOneDepth) {
  absl::StatusOr<Schedule> s = Lower({Gemm(256, 128, 64), Gemm(256, 128, 64), Gemm(256, 128, 128, {Edge(1, Op::kA)}),
                                      Gemm(256, 128, 128, {Edge(2, Op::kA)})},
                                     Options({128, 128, 64}, 1, 8));
  ASSERT_TRUE(s.ok()) << s.status();
  for (NodePriority priority : {NodePriority::kDeepestFirst, NodePriority::kShallowestFirst}) {
    EXPECT_EQ(WavefrontQueue(*s, 8, priority)[0].node, 1) << static_cast<int>(priority);
  }
}

// A consumer job becomes eligible exactly `lag` positions behind the last
// producer tile it reads: with lag 2, the consumer of row block 0 (queued
// first) takes position 2, not 3.
TEST(WavefrontTest, ConsumerEntersExactlyLagPositionsBehindItsProducer) {
  absl::StatusOr<Schedule> s =
      Lower({Gemm(512, 128, 64), Gemm(512, 128, 128, {Edge(0, Op::kA)})}, Options({128, 128, 64}, 1, 8));
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<TileJob> queue = WavefrontQueue(*s, 2, NodePriority::kDeepestFirst);
  ASSERT_EQ(queue.size(), 8u);
  EXPECT_EQ(queue[0].node, 0);
  EXPECT_EQ(queue[1].node, 0);
  EXPECT_EQ(queue[2].node, 1);
}

// A tile reduced in two parts is done only once both parts are: at every lag
// and in either priority, its consumer comes after the second part (with the
// tile released after its first part, deepest-first at lag 1 put the consumer
// between the two; the random graphs caught that in ~1 run of 5).
TEST(WavefrontTest, TileReducedInTwoPartsIsReleasedAfterBoth) {
  SchedulerOptions options = Options({128, 256, 64}, 2, 66);
  options.reduce_part_rows = 16;
  absl::StatusOr<Schedule> s = Lower({Gemm(32, 256, 4096), Gemm(32, 256, 256, {Edge(0, Op::kA)})}, options);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->nodes[0].reduce_parts, 2);
  for (int64_t lag : {0, 1, 2}) {
    for (NodePriority priority : {NodePriority::kDeepestFirst, NodePriority::kShallowestFirst}) {
      Schedule ordered = *s;
      ordered.queue = WavefrontQueue(ordered, lag, priority);
      const absl::Status checked = CheckQueue(ordered);
      EXPECT_TRUE(checked.ok()) << "lag " << lag << ", priority " << static_cast<int>(priority) << ": " << checked;
    }
  }
}

// Random DAGs of random shapes: a soak of Lower + CheckQueue + simulation.
TEST(RandomGraphTest, LowerCheckAndSimulate) {
  // A fresh seed each run, printed on failure; LOOM_TEST_SEED replays one.
  testbed::Rng seeded;
  std::mt19937_64& rng = seeded.engine();
  auto pick = [&](std::initializer_list<int64_t> values) {
    return *(values.begin() + rng() % values.size());
  };
  for (int graph = 0; graph < 500; ++graph) {
    std::vector<NodeProblem> nodes;
    const int count = 1 + static_cast<int>(rng() % 6);
    for (int i = 0; i < count; ++i) {
      NodeProblem p = Gemm(pick({1, 16, 63, 129, 300}), pick({64, 128, 129, 256, 520}), pick({8, 64, 65, 256, 700}));
      if (i > 0 && rng() % 3 != 0) {  // read an earlier node's output as A
        const int producer = static_cast<int>(rng() % i);
        const NodeProblem& q = nodes[producer];
        p.m = q.m;
        p.k = q.swiglu ? q.n / 2 : q.n;
        p.dependencies.push_back(Edge(producer, Op::kA, 0, 0, rng() % 8 == 0));
        if (rng() % 3 == 0 && p.n % 2 == 0) p.swiglu = true;
        const int other = static_cast<int>(rng() % i);
        const NodeProblem& r = nodes[other];
        if (other != producer && r.m == p.m && rng() % 2 == 0) {
          p.dependencies.push_back(Edge(other, Op::kResidual));  // shapes may differ: the box is clipped
        }
      }
      nodes.push_back(p);
    }
    SchedulerOptions o = Options({128, 128, 64}, 1 + static_cast<int>(rng() % 2), 1 + static_cast<int>(rng() % 10));
    o.split_k = static_cast<int>(rng() % 3) == 0 ? 2 : 0;
    o.interleave_split_producers = rng() % 2 == 0;  // the pair split's queue order
    absl::StatusOr<Schedule> s = Lower(nodes, o);
    ASSERT_TRUE(s.ok()) << "graph " << graph << ": " << s.status();
    ASSERT_TRUE(CheckQueue(*s).ok()) << "graph " << graph << ": " << CheckQueue(*s);
    const Simulator simulator(*s);
    for (uint64_t seed = 0; seed < 16; ++seed) {
      const SimulationResult r = simulator.Run(1 + static_cast<int>(seed * 3), seed);
      ASSERT_TRUE(r.ok()) << "graph " << graph << " seed " << seed << ": " << r.Summary() << "\n"
                          << ExplainSchedule(*s, {});
    }
  }
}

// The kernel's loader waits for a job's bias and residual producers before
// its first load in every kGemm job, split-K ones too (WaitForEpilogueInputs).
// So a split job of a consumer whose residual is its own producer's output
// must come after the producer tiles under its residual, or on a small grid
// the CTAs holding such jobs wait for tiles no free CTA will reach (the GPU
// option soak's deadlock: split_k 3 on 1 and 7 clusters). Checked here on
// the queue positions directly, not through job_access.
TEST(SplitKQueueTest, SplitJobsComeAfterTheirResidualProducers) {
  for (int clusters : {1, 2, 7, 66}) {
    for (int64_t rows : {14, 263}) {
      SCOPED_TRACE(testing::Message() << clusters << " clusters, " << rows << " rows");
      SchedulerOptions o = Options({128, 256, 64}, 2, clusters);
      o.split_k = 3;
      absl::StatusOr<Schedule> s =
          Lower({Gemm(rows, 520, 136), Gemm(rows, 520, 520, {Edge(0, Op::kA), Edge(0, Op::kResidual)})}, o);
      ASSERT_TRUE(s.ok()) << s.status();
      const NodeSchedule& producer = s->nodes[0];
      const NodeSchedule& consumer = s->nodes[1];
      ASSERT_GT(consumer.split_k, 1);
      // Where each producer output tile is complete: after its last writer.
      std::vector<size_t> done_at(static_cast<size_t>(producer.m_blocks) * producer.n_blocks, s->queue.size());
      std::vector<int> writers(done_at.size(), 0);
      for (size_t p = 0; p < s->queue.size(); ++p) {
        const TileJob& job = s->queue[p];
        if (job.node != 0 || !JobRunsEpilogue(producer, job)) continue;  // the job that completes its tiles
        for (int rank = 0; rank < s->cluster_size; ++rank) {
          const CtaTile cta = CtaTileOf(job, producer.share, rank);
          if (cta.m_block >= producer.m_blocks || cta.n_block >= producer.n_blocks) continue;
          const size_t t = static_cast<size_t>(cta.m_block) * producer.n_blocks + cta.n_block;
          if (++writers[t] == std::max(producer.reduce_parts, 1)) done_at[t] = p;
        }
      }
      for (size_t p = 0; p < s->queue.size(); ++p) {
        const TileJob& job = s->queue[p];
        if (job.node != 1 || job.kind != static_cast<uint8_t>(JobKind::kGemm)) continue;
        for (int rank = 0; rank < s->cluster_size; ++rank) {
          const CtaTile cta = CtaTileOf(job, consumer.share, rank);
          if (cta.m_block >= consumer.m_blocks || cta.n_block >= consumer.n_blocks) continue;
          // Same tile width and output columns: residual tile (mb, nb) is producer tile (mb, nb).
          const size_t t = static_cast<size_t>(cta.m_block) * producer.n_blocks + cta.n_block;
          EXPECT_LT(done_at[t], p) << "consumer split " << int{job.split} << " of tile (" << cta.m_block << ", "
                                   << cta.n_block << ") at queue position " << p;
        }
      }
      EXPECT_TRUE(CheckQueue(*s).ok()) << CheckQueue(*s);
      const Simulator simulator(*s);
      const SimulationResult r = simulator.Run(1, 5);
      EXPECT_TRUE(r.ok()) << r.Summary();
    }
  }
}

// --- The simulator's own checks must be able to fail. ---

Schedule ChainSchedule() {
  absl::StatusOr<Schedule> s = Lower({Gemm(512, 512, 256), Gemm(512, 512, 512, {Edge(0, Op::kA)})},
                                     Options({128, 128, 64}, 2, 4));
  EXPECT_TRUE(s.ok());
  return *s;
}

TEST(SimulatorChecksTest, ReversedQueueDeadlocks) {
  Schedule s = ChainSchedule();
  std::reverse(s.queue.begin(), s.queue.end());  // every consumer job before its producers
  EXPECT_FALSE(CheckQueue(s).ok());
  const Simulator simulator(s);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    // Node 1 has 8 jobs: with up to 8 SMs all of them wait on jobs nobody
    // dequeued, whether the first wave is handed out statically or not.
    const SimulationResult r = simulator.Run(1 + static_cast<int>(seed % 8), seed, /*static_first_wave=*/seed % 2 == 1);
    EXPECT_TRUE(r.deadlock) << r.Summary();
    EXPECT_FALSE(r.ok());
  }
}

TEST(SimulatorChecksTest, OneConsumerJobTooEarlyDeadlocksOnOneSm) {
  Schedule s = ChainSchedule();
  // Move the first consumer job to the front of the queue.
  auto consumer = std::find_if(s.queue.begin(), s.queue.end(), [](const TileJob& j) { return j.node == 1; });
  std::rotate(s.queue.begin(), consumer, consumer + 1);
  EXPECT_FALSE(CheckQueue(s).ok());
  const SimulationResult r = Simulate(s, 1, 7);
  EXPECT_TRUE(r.deadlock) << r.Summary();
  EXPECT_NE(r.Summary().find("waiting on node 0"), std::string::npos) << r.Summary();
}

// The checks see a producer that only the consumer's last k-block reads (the
// producer's columns are A's columns 64-127), queued after its consumer.
TEST(SimulatorChecksTest, ProducerReadOnlyByTheLastKBlockQueuedLateDeadlocks) {
  absl::StatusOr<Schedule> s =
      Lower({Gemm(128, 64, 64), Gemm(128, 128, 128, {Edge(0, Op::kA, 0, -64)})}, Options({128, 128, 64}, 1, 8));
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->queue.size(), 2u);
  std::reverse(s->queue.begin(), s->queue.end());
  EXPECT_FALSE(CheckQueue(*s).ok());
  const SimulationResult r = Simulate(*s, 1, 1);
  EXPECT_TRUE(r.deadlock) << r.Summary();
}

// ... and a last split that sums queued before the split whose partial it
// sums.
TEST(SimulatorChecksTest, SummingLastSplitQueuedBeforeItsPartialDeadlocks) {
  SchedulerOptions options = Options({128, 128, 64}, 1, 8);
  options.split_k = 2;
  options.reduce_in_parts = false;
  absl::StatusOr<Schedule> s = Lower({Gemm(128, 128, 4096)}, options);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->nodes[0].reduce_parts, 0);  // the last split sums
  ASSERT_EQ(s->queue.size(), 2u);
  std::reverse(s->queue.begin(), s->queue.end());
  ASSERT_EQ(s->queue[0].split, 1);
  EXPECT_FALSE(CheckQueue(*s).ok());
  const SimulationResult r = Simulate(*s, 1, 1);
  EXPECT_TRUE(r.deadlock) << r.Summary();
}

TEST(SimulatorChecksTest, AliasedFlagsLetAConsumerReadUnfinishedData) {
  // Producers 0 and 1 are independent; 2 reads 1. Node 1's flags are made to
  // alias node 0's, so 2 can pass its waits once node 0 is done.
  absl::StatusOr<Schedule> lowered = Lower({Gemm(256, 256, 256), Gemm(256, 256, 256),
                                            Gemm(256, 256, 256, {Edge(1, Op::kA)})},
                                           Options({128, 128, 64}, 1, 8));
  ASSERT_TRUE(lowered.ok());
  Schedule s = *lowered;
  s.nodes[1].flag_base = s.nodes[0].flag_base;
  const Simulator simulator(s);
  int64_t bad_runs = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const SimulationResult r = simulator.Run(12, seed);
    if (r.unfinished_reads > 0) ++bad_runs;
  }
  EXPECT_GT(bad_runs, 0);
}

TEST(SimulatorChecksTest, DuplicateAndMissingJobsAreReported) {
  Schedule s = ChainSchedule();
  s.queue[1] = s.queue[0];  // job 1 lost, job 0 twice
  EXPECT_FALSE(CheckQueue(s).ok());
  bool duplicate = false, incomplete = false;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const SimulationResult r = Simulate(s, 16, seed);
    EXPECT_FALSE(r.ok());
    duplicate |= r.duplicate_tiles > 0;
    incomplete |= r.missing_tiles > 0 || r.deadlock;
  }
  EXPECT_TRUE(duplicate);
  EXPECT_TRUE(incomplete);
}

}  // namespace
}  // namespace loom::sched
