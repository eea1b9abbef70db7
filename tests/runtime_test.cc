// CPU tests of the host runtime: lowering without a GPU, the refusals of
// Compile for device limits, Launch on a host-only plan, Explain.
#include "loom/runtime.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "internal/plan_impl.h"
#include "internal/plan_resources.h"
#include "internal/testing_hooks.h"
#include "internal/timeline.h"
#include "loom/scheduler/tiling.h"
#include "kernel_config.h"
#include "narrow_config.h"
#include "persistent_gemm.h"

namespace loom {
namespace {

TensorView Fake(const std::string& name, uintptr_t address, int64_t rows, int64_t cols) {
  return TensorView::Dense(name, reinterpret_cast<void*>(address), DType::kBF16, rows, cols);
}

GemmGraph OneGemm() {
  GemmGraph graph;
  graph.AddGemm("proj", Fake("x", 0x100000, 512, 1024), Fake("w", 0x10000000, 768, 1024),
                Fake("y", 0x20000000, 512, 768));
  return graph;
}

// `status` has `code` and its message contains every fragment (the value,
// the option or the rule it names).
::testing::AssertionResult HasStatus(const absl::Status& status, absl::StatusCode code,
                                     const std::vector<std::string>& fragments) {
  if (status.code() != code) {
    return ::testing::AssertionFailure() << "expected code " << absl::StatusCodeToString(code) << ", got " << status;
  }
  for (const std::string& fragment : fragments) {
    if (std::string(status.message()).find(fragment) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks \"" << fragment << "\": " << status;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(RuntimeTest, CompilesWithoutGpuAndExplains) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  EXPECT_FALSE(runtime.has_gpu());
  absl::StatusOr<Plan> plan = runtime.Compile(OneGemm());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->grid_clusters(), 66);
  EXPECT_FALSE(plan->schedule().queue.empty());
  const std::string explain = plan->Explain();
  EXPECT_NE(explain.find("proj"), std::string::npos) << explain;
  EXPECT_NE(explain.find("66 clusters"), std::string::npos) << explain;
}

// CompileOptions::tile_n = 128: the scheduler tiles the plan in 128 x 128
// tiles (twice the tiles of 256-wide ones), and the shared memory it asks
// for has B stages of 16 KiB: 4 A and 8 B stages fit where 4 and 4 of 32 KiB
// fill the H200's 227 KiB.
TEST(RuntimeTest, TilesOf128ColumnsWhereAsked) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  CompileOptions options;
  options.tile_n = 128;
  absl::StatusOr<Plan> plan = runtime.Compile(OneGemm(), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<Plan> wide = runtime.Compile(OneGemm(), CompileOptions{.tile_n = 256});
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(plan->schedule().tile.n, 128);
  EXPECT_EQ(wide->schedule().tile.n, 256);
  EXPECT_EQ(plan->schedule().nodes[0].n_blocks, 2 * wide->schedule().nodes[0].n_blocks);
  EXPECT_NE(plan->Explain().find("tile 128x128x64"), std::string::npos) << plan->Explain();
  options.b_stages = 8;
  EXPECT_TRUE(runtime.Compile(OneGemm(), options).ok());
  options.tile_n = 256;
  EXPECT_TRUE(HasStatus(runtime.Compile(OneGemm(), options).status(), absl::StatusCode::kFailedPrecondition,
                        {"shared memory", "b_stages=8 (tiles 256 wide)"}));
}

// Ring depths left 0 are chosen by the plan: 7 A and 5 B stages on 128-wide
// tiles in split rings, 4 and 4 on 256-wide tiles and in lockstep rings.
// One depth given: the other is the same in lockstep, else its chosen depth
// lowered until shared memory fits. Depths given are kept.
TEST(RuntimeTest, RingDepthsLeftZeroAreChosenByTheTileWidth) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  const auto rings_of = [&](CompileOptions options) {
    absl::StatusOr<Plan> plan = runtime.Compile(OneGemm(), options);
    if (!plan.ok()) return std::string(plan.status().message());
    const std::string explain = plan->Explain();
    const size_t begin = explain.find("rings: ");
    return explain.substr(begin, explain.find(')', begin) + 1 - begin);
  };
  EXPECT_EQ(rings_of({.tile_n = 128}), "rings: split (A 7 stages of 16384 bytes, B 5 stages)");
  EXPECT_EQ(rings_of({.tile_n = 256}), "rings: split (A 4 stages of 16384 bytes, B 4 stages)");
  EXPECT_EQ(rings_of({.ring_mode = RingMode::kLockstep, .tile_n = 128}),
            "rings: lockstep (A 4 stages of 16384 bytes, B 4 stages)");
  EXPECT_EQ(rings_of({.ring_mode = RingMode::kLockstep, .b_stages = 6, .tile_n = 128}),
            "rings: lockstep (A 6 stages of 16384 bytes, B 6 stages)");
  EXPECT_EQ(rings_of({.a_stages = 3, .tile_n = 128}), "rings: split (A 3 stages of 16384 bytes, B 5 stages)");
  EXPECT_EQ(rings_of({.a_stages = 5, .b_stages = 3, .tile_n = 128}),
            "rings: split (A 5 stages of 16384 bytes, B 3 stages)");
  // 8 B stages of 16 KiB leave room for 4 A stages, not 7.
  EXPECT_EQ(rings_of({.b_stages = 8, .tile_n = 128}), "rings: split (A 4 stages of 16384 bytes, B 8 stages)");
  // 256-wide B stages of 32 KiB: 5 leave room for 2 A stages of 16 KiB.
  EXPECT_EQ(rings_of({.b_stages = 5, .tile_n = 256}), "rings: split (A 2 stages of 16384 bytes, B 5 stages)");
  // Lowered to 2 and still too big: refused, naming both depths.
  absl::StatusOr<Plan> plan = runtime.Compile(OneGemm(), {.b_stages = 7, .tile_n = 256});
  EXPECT_TRUE(HasStatus(plan.status(), absl::StatusCode::kFailedPrecondition,
                        {"shared memory", "a_stages=2 (of 16384 bytes), b_stages=7 (tiles 256 wide)"}));
}

// Lockstep rings' A loader carries B without waiting for B's producers, so a
// graph in which a node's B is another node's output is refused there, naming
// the consumer, its B and the producer; split rings (whose B loader waits)
// compile it. A produced bias is not B: lockstep takes it.
TEST(RuntimeTest, LockstepRingsRefuseABThatANodeWrites) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  GemmGraph graph;
  graph.AddGemm("keys", Fake("x", 0x100000, 256, 512), Fake("w", 0x10000000, 512, 512),
                Fake("keys", 0x20000000, 256, 512));
  graph.AddGemm("scores", Fake("q", 0x30000000, 300, 512), Fake("keys", 0x20000000, 256, 512),
                Fake("scores", 0x40000000, 300, 256));
  const CompileOptions lockstep{.ring_mode = RingMode::kLockstep};
  EXPECT_TRUE(HasStatus(runtime.Compile(graph, lockstep).status(), absl::StatusCode::kInvalidArgument,
                        {"CompileOptions.ring_mode: lockstep", "node \"scores\" reads its B (\"keys\") from node "
                         "\"keys\"'s output", "use kSplit"}));
  EXPECT_TRUE(runtime.Compile(graph, CompileOptions{}).ok());

  GemmGraph bias_graph;
  bias_graph.AddGemm("bias", Fake("v", 0x100000, 1, 512), Fake("wv", 0x10000000, 512, 512),
                     Fake("b", 0x20000000, 1, 512));
  bias_graph.AddGemm("proj", Fake("x", 0x30000000, 300, 512), Fake("w", 0x40000000, 512, 512),
                     Fake("y", 0x50000000, 300, 512), Epilogue{.bias = Fake("b", 0x20000000, 1, 512)});
  const absl::StatusOr<Plan> plan = runtime.Compile(bias_graph, lockstep);
  EXPECT_TRUE(plan.ok()) << plan.status();
}

// The tiled kernel spreads its first fetches where its first wave leaves
// clusters without a job to start (sched::IdleClustersAtLaunch); Explain
// says so. The narrow kernel never does (its first wave is static).
TEST(RuntimeTest, FirstFetchesSpreadWhereTheFirstWaveLeavesClustersIdle) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  const auto mlp = [](int64_t tokens) {
    GemmGraph graph;
    const TensorView x = Fake("x", 0x100000, tokens, 4096);
    const TensorView h = Fake("h", 0x30000000, tokens, 14336);
    graph.AddGemm("gate_up", x, Fake("w_gate_up", 0x40000000, 28672, 4096), h,
                  Epilogue{.activation = Activation::kSwiGLU});
    graph.AddGemm("down", h, Fake("w_down", 0x80000000, 4096, 14336), Fake("y", 0xA0000000, tokens, 4096),
                  Epilogue{.residual = x});
    return graph;
  };
  absl::StatusOr<Plan> plan = runtime.Compile(mlp(128));  // gate/up: 56 cluster jobs of 66
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->Explain().find("first fetches spread over the SMs: 10 of 66 clusters"), std::string::npos)
      << plan->Explain();
  plan = runtime.Compile(mlp(8192));  // gate/up fills every wave
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->Explain().find("first fetches spread"), std::string::npos) << plan->Explain();
  plan = runtime.Compile(mlp(16));  // the narrow kernel
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->Explain().find("first fetches spread"), std::string::npos) << plan->Explain();
}

TEST(RuntimeTest, MovedFromPlanRefusesCalls) {
  absl::StatusOr<Plan> plan = Runtime::ForDescription(DeviceDescription::H200()).Compile(OneGemm());
  ASSERT_TRUE(plan.ok()) << plan.status();
  Plan taken = std::move(*plan);
  EXPECT_NE(taken.Explain().find("proj"), std::string::npos);
  Plan& moved = *plan;  // NOLINT(bugprone-use-after-move): the point of the test
  EXPECT_TRUE(HasStatus(moved.Launch(), absl::StatusCode::kFailedPrecondition, {"Plan::Launch", "moved from"}));
  EXPECT_TRUE(HasStatus(moved.Synchronize(), absl::StatusCode::kFailedPrecondition, {"Plan::Synchronize"}));
  EXPECT_TRUE(HasStatus(moved.RepackWeights(), absl::StatusCode::kFailedPrecondition, {"Plan::RepackWeights"}));
  EXPECT_TRUE(HasStatus(moved.Timeline().status(), absl::StatusCode::kFailedPrecondition, {"Plan::Timeline"}));
  EXPECT_TRUE(HasStatus(moved.ExplainTimeline().status(), absl::StatusCode::kFailedPrecondition, {"Plan::Timeline"}));
  EXPECT_EQ(moved.Explain(), "a moved-from loom::Plan\n");
  EXPECT_FALSE(moved.valid());
  EXPECT_TRUE(taken.valid());
  EXPECT_FALSE(moved.last_timeout().has_value());
  moved = std::move(taken);  // assigned to, it is a plan again
  EXPECT_NE(moved.Explain().find("proj"), std::string::npos);
}

TEST(RuntimeTest, LaunchOfHostOnlyPlanIsFailedPrecondition) {
  absl::StatusOr<Plan> plan = Runtime::ForDescription(DeviceDescription::H200()).Compile(OneGemm());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(HasStatus(plan->Launch(nullptr), absl::StatusCode::kFailedPrecondition, {"without a GPU"}));
}
// Synchronize on a host-only plan is refused by name, as Launch is (with or without a GPU).
TEST(RuntimeTest, SynchronizeOfHostOnlyPlanIsFailedPrecondition) {
  absl::StatusOr<Plan> plan = Runtime::ForDescription(DeviceDescription::H200()).Compile(OneGemm());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(HasStatus(plan->Synchronize(nullptr), absl::StatusCode::kFailedPrecondition,
                        {"Plan::Synchronize", "host-only plan"}));
}

// The test hook that marks a node's tiles published names what it refuses:
// a node or a tile out of range, and a plan with no device flags.
TEST(RuntimeTest, PublishFlagsForTestingRefusesBadArguments) {
  absl::StatusOr<Plan> plan =
      Runtime::ForDescription(DeviceDescription::H200()).Compile(OneGemm(), CompileOptions{.tile_n = 256});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(HasStatus(internal::PublishFlagsForTesting(*plan, 1, 0), absl::StatusCode::kInvalidArgument,
                        {"node 1 is not in [0, 1)"}));
  // 512 x 768 in 128 x 256 tiles: 4 x 3.
  EXPECT_TRUE(HasStatus(internal::PublishFlagsForTesting(*plan, 0, 12), absl::StatusCode::kInvalidArgument,
                        {"except_tile 12 is not in [0, 12)"}));
  EXPECT_TRUE(HasStatus(internal::PublishFlagsForTesting(*plan, 0, 11), absl::StatusCode::kFailedPrecondition,
                        {"host-only plan"}));
}

TEST(RuntimeTest, TimelineNeedsATracedLaunchedPlan) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  absl::StatusOr<Plan> plan = runtime.Compile(OneGemm());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(HasStatus(plan->Timeline().status(), absl::StatusCode::kFailedPrecondition, {"trace = true"}));

  CompileOptions options;
  options.trace = true;
  absl::StatusOr<Plan> traced = runtime.Compile(OneGemm(), options);
  ASSERT_TRUE(traced.ok()) << traced.status();
  EXPECT_TRUE(HasStatus(traced->ExplainTimeline().status(), absl::StatusCode::kFailedPrecondition, {"host-only"}));
}

JobTrace Trace(int job, int node, bool reduce, double fetched, double data_ready, double mma_done, double staged,
               double published) {
  JobTrace t;
  t.job = job;
  t.node = node;
  t.reduce = reduce;
  t.fetched = fetched;
  t.data_ready = data_ready;
  t.mma_done = mma_done;
  t.staged = staged;
  t.published = published;
  return t;
}

// ExplainTimeline's table from made-up traces: ranges, medians over the jobs
// where both events happened, a slightly negative span kept (two threads
// stamp it), "-" where no job has the span, and no row for a node without
// jobs.
TEST(RuntimeTest, TimelineTableSummarisesEachNodeAndKind) {
  std::vector<JobTrace> timeline = {
      Trace(0, 0, false, 0.0, 2.0, 12.0, 14.0, 15.0),
      Trace(1, 0, false, 1.0, 5.0, 25.0, 27.0, 26.5),  // store stamped before staged: -0.5
      Trace(2, 0, false, 1.0, 3.0, 13.0, -1, -1),      // rows past M: nothing staged or stored
      Trace(3, 1, true, 4.0, 30.0, 33.0, 35.0, 36.0),
  };
  timeline[0].a_dependency = 0.5;
  timeline[1].a_dependency = 3.0;
  timeline[2].a_dependency = 1.5;
  const std::string table = internal::FormatTimeline(timeline, {"gate_up", "down", "unused"});
  EXPECT_NE(table.find("4 CTA-jobs, last store at 36.0 us"), std::string::npos) << table;
  // gate_up gemm: 3 jobs, fetched 0-1, published 15-26.5; median wait of
  // {2, 4, 2} = 2, main loop of {10, 20, 10} = 10, epilogue of {2, 2} (job 2
  // staged nothing) = 2, store of {1, -0.5} = 1, A deps of {0.5, 3, 1.5} = 1.5.
  EXPECT_NE(table.find("gate_up      gemm           3  0.0-1.0        15.0-26.5"), std::string::npos) << table;
  EXPECT_NE(table.find("2.0 us    10.0 us    2.0 us 1.0 us  1.5 us"), std::string::npos) << table;
  EXPECT_NE(table.find("down         reduce         1  4.0-4.0        36.0-36.0"), std::string::npos) << table;
  EXPECT_EQ(table.find("down         gemm"), std::string::npos) << table;
  EXPECT_EQ(table.find("unused"), std::string::npos) << table;

  const std::vector<JobTrace> unstored = {Trace(0, 0, false, 0.0, 1.0, 2.0, -1, -1)};
  const std::string partial = internal::FormatTimeline(unstored, {"only"});
  EXPECT_NE(partial.find("last store at -"), std::string::npos) << partial;
  EXPECT_NE(partial.find("1.0 us     1.0 us         -      -       -"), std::string::npos) << partial;
}

// A span whose first event never happened (time -1) is left out of the
// medians, not measured from -1: a job with no data-ready stamp has no wait
// and no main-loop span, only its epilogue and store.
// A split node's jobs by part of K (JobTrace::part): a row for its whole
// tiles ("gemm"), one for each part, in that order.
TEST(RuntimeTest, TimelineTableGivesEachPartOfKItsRow) {
  std::vector<JobTrace> timeline = {
      Trace(0, 0, false, 0.0, 1.0, 11.0, 12.0, 13.0),   // a whole tile
      Trace(1, 0, false, 1.0, 2.0, 7.0, 7.1, 8.0),      // part 0
      Trace(2, 0, false, 6.0, 8.0, 13.0, 16.0, 17.0),   // part 1
      Trace(3, 0, false, 7.0, 9.0, 14.0, 17.0, 18.0),   // part 1
  };
  timeline[1].part = 0;
  timeline[2].part = timeline[3].part = 1;
  const std::string table = internal::FormatTimeline(timeline, {"down"});
  const size_t whole = table.find("down         gemm           1  0.0-0.0        13.0-13.0");
  const size_t first = table.find("down         part 0         1  1.0-1.0        8.0-8.0");
  const size_t last = table.find("down         part 1         2  6.0-7.0        17.0-18.0");
  EXPECT_NE(whole, std::string::npos) << table;
  EXPECT_NE(first, std::string::npos) << table;
  EXPECT_NE(last, std::string::npos) << table;
  EXPECT_LT(whole, first);
  EXPECT_LT(first, last);
  // Part 1's epilogue (staged - mma_done) of {3, 3}.
  EXPECT_NE(table.find("3.0 us 1.0 us"), std::string::npos) << table;
}

TEST(RuntimeTest, TimelineLeavesOutSpansWhoseFirstEventIsMissing) {
  const std::vector<JobTrace> timeline = {Trace(0, 0, false, 5.0, -1, 8.0, 9.0, 10.0)};
  const std::string table = internal::FormatTimeline(timeline, {"only"});
  // wait, main loop, epilogue, store, A deps, as the table prints them.
  EXPECT_NE(table.find(absl::StrFormat("%12s %10s %9s %6s %7s", "-", "-", "1.0 us", "1.0 us", "-")), std::string::npos)
      << table;
}

TEST(RuntimeTest, GridLargerThanCoresidentIsRefused) {
  CompileOptions options;
  options.max_clusters = 67;
  absl::StatusOr<Plan> plan = Runtime::ForDescription(DeviceDescription::H200()).Compile(OneGemm(), options);
  EXPECT_TRUE(HasStatus(plan.status(), absl::StatusCode::kFailedPrecondition, {"max_clusters 67", "66"}));
}
// A grid of exactly the co-resident clusters is accepted, and launches that many.
TEST(RuntimeTest, GridOfExactlyCoresidentIsAccepted) {
  CompileOptions options;
  options.max_clusters = 66;
  absl::StatusOr<Plan> plan = Runtime::ForDescription(DeviceDescription::H200()).Compile(OneGemm(), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->grid_clusters(), 66);
}
// Two SMs hold one cluster of two CTAs: the tiled kernel compiles for them.
TEST(RuntimeTest, TwoSmsHoldOneTiledCluster) {
  DeviceDescription device = DeviceDescription::H200();
  device.sm_count = 2;
  device.max_coresident_clusters = 1;
  absl::StatusOr<Plan> plan = Runtime::ForDescription(device).Compile(OneGemm());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kernel(), KernelChoice::kTiled);
  EXPECT_EQ(plan->grid_clusters(), 1);
}

TEST(RuntimeTest, SharedMemoryOverTheDeviceLimitIsRefused) {
  CompileOptions options;
  options.a_stages = 8;
  options.b_stages = 8;
  absl::StatusOr<Plan> plan = Runtime::ForDescription(DeviceDescription::H200()).Compile(OneGemm(), options);
  EXPECT_TRUE(HasStatus(plan.status(), absl::StatusCode::kFailedPrecondition, {"shared memory", "232448"}));
}

// Two chained decode GEMMs of `rows` rows (up 1024 -> 768, down 768 -> 256).
GemmGraph DecodePair(int64_t rows) {
  GemmGraph graph;
  const TensorView h = Fake("h", 0x30000000, rows, 768);
  graph.AddGemm("up", Fake("x", 0x100000, rows, 1024), Fake("w", 0x10000000, 768, 1024), h);
  graph.AddGemm("down", h, Fake("v", 0x18000000, 256, 768), Fake("y", 0x20000000, rows, 256));
  return graph;
}
// Explain names the narrow kernel's consumer warpgroups in the right number: one, or two.
TEST(RuntimeTest, ExplainCountsNarrowConsumerWarpgroups) {
  for (const int consumers : {1, 2}) {
    CompileOptions options;
    options.kernel = KernelChoice::kNarrow;
    options.narrow_consumers = consumers;
    absl::StatusOr<Plan> plan = Runtime::ForDescription(DeviceDescription::H200()).Compile(DecodePair(1), options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::string expected =
        consumers == 1 ? "CTAs of 1 consumer warpgroup, rings" : "CTAs of 2 consumer warpgroups, rings";
    EXPECT_NE(plan->Explain().find(expected), std::string::npos) << plan->Explain();
  }
}

// A described device no plan can be lowered for is refused by name, before
// the scheduler sees it (found by compile_fuzz_test).
TEST(RuntimeTest, ImpossibleDeviceDescriptionsAreRefused) {
  const auto compile = [](void (*change)(DeviceDescription&)) {
    DeviceDescription device = DeviceDescription::H200();
    device.name = "my gpu";
    change(device);
    return Runtime::ForDescription(device).Compile(OneGemm()).status();
  };
  EXPECT_TRUE(HasStatus(compile([](DeviceDescription& d) { d.sm_count = 0; }), absl::StatusCode::kInvalidArgument,
                        {"DeviceDescription \"my gpu\"", "sm_count 0 is not positive"}));
  EXPECT_TRUE(HasStatus(compile([](DeviceDescription& d) { d.sm_count = -4; }), absl::StatusCode::kInvalidArgument,
                        {"sm_count -4 is not positive"}));
  EXPECT_TRUE(HasStatus(compile([](DeviceDescription& d) { d.shared_memory_per_block = 0; }),
                        absl::StatusCode::kInvalidArgument, {"shared_memory_per_block 0 is not positive"}));
  EXPECT_TRUE(HasStatus(compile([](DeviceDescription& d) { d.l2_bytes = -1; }), absl::StatusCode::kInvalidArgument,
                        {"l2_bytes -1 is negative"}));
  EXPECT_TRUE(HasStatus(compile([](DeviceDescription& d) { d.max_coresident_clusters = -2; }),
                        absl::StatusCode::kInvalidArgument, {"max_coresident_clusters -2 is negative"}));
  // More co-resident clusters of two CTAs than the SMs hold.
  EXPECT_TRUE(HasStatus(compile([](DeviceDescription& d) { d.max_coresident_clusters = 67; }),
                        absl::StatusCode::kInvalidArgument,
                        {"DeviceDescription \"my gpu\"", "max_coresident_clusters 67 clusters of 2 CTAs need 134 SMs",
                         "sm_count is 132"}));
  // One SM holds no cluster of two CTAs (the tiled kernel's), and the
  // message says so rather than blame shared memory; nor does a device
  // without cluster launch.
  EXPECT_TRUE(HasStatus(compile([](DeviceDescription& d) {
                          d.sm_count = 1;
                          d.max_coresident_clusters = 0;
                        }),
                        absl::StatusCode::kFailedPrecondition,
                        {"my gpu", "sm_count 1, but the tiled kernel runs in clusters of 2 CTAs"}));
  EXPECT_TRUE(HasStatus(compile([](DeviceDescription& d) { d.cluster_launch = false; }),
                        absl::StatusCode::kFailedPrecondition, {"my gpu cannot launch clusters"}));
  // The narrow kernel needs neither.
  EXPECT_TRUE(Runtime::ForDescription([] {
                DeviceDescription d = DeviceDescription::H200();
                d.sm_count = 1;
                d.max_coresident_clusters = 0;
                d.cluster_launch = false;
                return d;
              }())
                  .Compile(DecodePair(4))
                  .ok());
}

// Too little shared memory for two B stages beside the narrow kernel's A
// ring: the message says what is left, not a negative stage count.
TEST(RuntimeTest, NarrowRingsThatDoNotFitSayWhatIsLeft) {
  DeviceDescription device = DeviceDescription::H200();
  device.shared_memory_per_block = 49152;
  const absl::Status status = Runtime::ForDescription(device).Compile(DecodePair(4)).status();
  EXPECT_TRUE(HasStatus(status, absl::StatusCode::kFailedPrecondition,
                        {"shared memory", "chosen (CompileOptions.narrow_a_stages = 0)", "leave",
                         "of the 49152 bytes per block", "less than two B stages of 16384"}));
  EXPECT_EQ(std::string(status.message()).find("narrow_b_stages"), std::string::npos) << status;
}

// A plan whose nodes all have at most 64 rows (decode) gets half-size A
// stages, so a fifth 256-wide B stage fits in shared memory; with one node
// of 65 rows it does not.
TEST(RuntimeTest, DecodePlansHaveHalfAStages) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  CompileOptions options;
  options.kernel = KernelChoice::kTiled;
  options.tile_n = 256;
  options.a_stages = 4;
  options.b_stages = 5;
  absl::StatusOr<Plan> plan = runtime.Compile(DecodePair(64), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->Explain().find("A 4 stages of 8192 bytes"), std::string::npos) << plan->Explain();
  plan = runtime.Compile(DecodePair(65), options);
  EXPECT_TRUE(HasStatus(plan.status(), absl::StatusCode::kFailedPrecondition,
                        {"shared memory", "a_stages=4 (of 16384 bytes), b_stages=5 (tiles 256 wide)"}));
}

// A decode graph with one node `n` columns wide: ceil(n / 32) narrow tiles.
GemmGraph WideDecodeGraph(int64_t rows, int64_t n) {
  GemmGraph graph;
  const TensorView h = Fake("h", 0x30000000, rows, 768);
  graph.AddGemm("up", Fake("x", 0x100000, rows, 1024), Fake("w", 0x10000000, 768, 1024), h);
  graph.AddGemm("wide", h, Fake("v", 0x18000000, n, 768), Fake("y", 0x40000000, rows, n));
  return graph;
}

// KernelChoice::kAuto (the default) takes the narrow kernel up to 16 rows,
// up to 64 where every node's narrow tiles fit in three waves (3 x 132 on
// the H200: N <= 12672), and up to 128 (two row blocks) where they fit in
// one (N <= 4224: two waves of jobs) and hold at most 32 MiB, unless split_k
// asks for splits or ring_mode for lockstep rings; kTiled never does;
// kNarrow up to 128 rows.
// A graph with a node of K = 0 (and an output) runs on the tiled kernel:
// kAuto keeps it at any row count, kNarrow is refused naming the node; the
// node has one job a tile, over no k-blocks.
TEST(RuntimeTest, ZeroKNodesKeepTheTiledKernel) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  for (const int64_t rows : {int64_t{1}, int64_t{64}, int64_t{128}}) {
    SCOPED_TRACE(rows);
    GemmGraph graph = WideDecodeGraph(rows, 4096);
    graph.AddGemm("zero_k", Fake("x", 0x100000, rows, 1024).Columns(0, 0),
                  Fake("z", 0x50000000, 512, 8).Columns(0, 0), Fake("c", 0x60000000, rows, 512),
                  {.bias = Fake("bias", 0x70000000, 1, 512)});
    absl::StatusOr<Plan> plan = runtime.Compile(graph, CompileOptions{});
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->kernel(), KernelChoice::kTiled);
    int zero_k_jobs = 0;
    for (const sched::TileJob& job : plan->schedule().queue) {
      if (job.node != 2) continue;
      EXPECT_EQ(job.k_block_end, job.k_block_begin);
      ++zero_k_jobs;
    }
    EXPECT_EQ(zero_k_jobs, 512 / (2 * plan->schedule().tile.n));  // a cluster's two tiles a job
    CompileOptions narrow;
    narrow.kernel = KernelChoice::kNarrow;
    EXPECT_TRUE(HasStatus(runtime.Compile(graph, narrow).status(), absl::StatusCode::kInvalidArgument,
                          {"CompileOptions.kernel: kNarrow", "node \"zero_k\" has K = 0"}));
  }
}

// A node without jobs (M or N zero, and K zero so its views are empty, whose
// other dimension Validate then leaves unbounded) changes nothing: neither
// the kernel nor the tile width, and Compile's counts do not overflow on its
// INT64_MAX (bench/NOTES.md v1.75).
TEST(RuntimeTest, NodesWithoutJobsDoNotSteerThePlan) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  for (const int64_t rows : {int64_t{1}, int64_t{64}, int64_t{200}}) {
    SCOPED_TRACE(rows);
    const absl::StatusOr<Plan> plain = runtime.Compile(WideDecodeGraph(rows, 4096));
    ASSERT_TRUE(plain.ok()) << plain.status();
    for (const bool tall : {false, true}) {
      SCOPED_TRACE(tall ? "M = INT64_MAX, N = 0" : "M = 0, N = INT64_MAX");
      GemmGraph graph = WideDecodeGraph(rows, 4096);
      const int64_t m = tall ? kHuge : 0, n = tall ? 0 : kHuge;
      graph.AddGemm("nothing", TensorView::Dense("a", nullptr, DType::kBF16, m, 0),
                    TensorView::Dense("b", nullptr, DType::kBF16, n, 0),
                    TensorView::Dense("c", nullptr, DType::kBF16, m, n));
      const absl::StatusOr<Plan> plan = runtime.Compile(graph);
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_EQ(plan->kernel(), plain->kernel());
      EXPECT_EQ(plan->schedule().tile.n, plain->schedule().tile.n);
      EXPECT_EQ(plan->schedule().queue.size(), plain->schedule().queue.size());
    }
    // A no-op node of 200 rows (N = 0) leaves a one-token graph narrow.
    GemmGraph graph = WideDecodeGraph(rows, 4096);
    graph.AddGemm("rows_only", Fake("a2", 0x50000000, 200, 64), TensorView::Dense("b2", nullptr, DType::kBF16, 0, 64),
                  TensorView::Dense("c2", nullptr, DType::kBF16, 200, 0));
    const absl::StatusOr<Plan> plan = runtime.Compile(graph);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->kernel(), plain->kernel());
  }
  // Nor do no-op nodes whose other sides are real (K > 0): not the tiled A
  // stage (1000 rows of A, N = 0: half stages stay half), not the narrow
  // rings (K = 2^20, M = 0) and not the kernel (M = 0 over 128 MiB of
  // weights, past the two-row-block rule's 32 MiB). The device line of
  // Explain says all three.
  const auto device_line = [](const Plan& plan) {
    const std::string explain = plan.Explain();
    return explain.substr(0, explain.find('\n'));
  };
  for (const KernelChoice kernel : {KernelChoice::kAuto, KernelChoice::kTiled, KernelChoice::kNarrow}) {
    for (const int64_t rows : {int64_t{1}, int64_t{64}, int64_t{100}}) {
      SCOPED_TRACE(absl::StrCat(AbslUnparseFlag(kernel), ", ", rows, " rows"));
      const CompileOptions options{.kernel = kernel};
      const absl::StatusOr<Plan> plain = runtime.Compile(WideDecodeGraph(rows, 4096), options);
      ASSERT_TRUE(plain.ok()) << plain.status();
      GemmGraph graph = WideDecodeGraph(rows, 4096);
      graph.AddGemm("rows_only", Fake("a2", 0x50000000, 1000, 64),
                    TensorView::Dense("b2", nullptr, DType::kBF16, 0, 64),
                    TensorView::Dense("c2", nullptr, DType::kBF16, 1000, 0));
      graph.AddGemm("long_k_only", TensorView::Dense("a3", nullptr, DType::kBF16, 0, int64_t{1} << 20),
                    Fake("b3", uint64_t{1} << 40, 64, int64_t{1} << 20),
                    TensorView::Dense("c3", nullptr, DType::kBF16, 0, 64));
      graph.AddGemm("weights_only", TensorView::Dense("a4", nullptr, DType::kBF16, 0, 16384),
                    Fake("b4", uint64_t{2} << 40, 4096, 16384), TensorView::Dense("c4", nullptr, DType::kBF16, 0, 4096));
      const absl::StatusOr<Plan> plan = runtime.Compile(graph, options);
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_EQ(plan->kernel(), plain->kernel());
      EXPECT_EQ(device_line(*plan), device_line(*plain));
    }
  }
}

// `text` parses as the command-line choice `want` (AbslParseFlag).
template <typename Choice>
void ExpectParsesAs(absl::string_view text, Choice want) {
  Choice parsed{};
  std::string error;
  EXPECT_TRUE(AbslParseFlag(text, &parsed, &error)) << error;
  EXPECT_EQ(parsed, want) << text;
}

TEST(RuntimeTest, KernelChoiceFollowsRowsAndSplits) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  ASSERT_EQ(runtime.device().sm_count, 132);
  struct Case {
    int64_t rows;
    int64_t n;  // of the graph's wide node
    KernelChoice kernel;
    int split_k;
    bool narrow;
  };
  for (const Case& c :
       {Case{1, 12680, KernelChoice::kAuto, 0, true}, Case{16, 28672, KernelChoice::kAuto, 1, true},
        Case{17, 12672, KernelChoice::kAuto, 0, true}, Case{64, 12672, KernelChoice::kAuto, 0, true},
        Case{17, 12680, KernelChoice::kAuto, 0, false}, Case{64, 28672, KernelChoice::kAuto, 0, false},
        Case{65, 256, KernelChoice::kAuto, 0, true}, Case{128, 4224, KernelChoice::kAuto, 0, true},
        Case{65, 4256, KernelChoice::kAuto, 0, false}, Case{128, 4256, KernelChoice::kAuto, 0, false},
        Case{129, 256, KernelChoice::kAuto, 0, false}, Case{100, 256, KernelChoice::kAuto, 2, false},
        Case{1, 256, KernelChoice::kAuto, 2, false}, Case{1, 256, KernelChoice::kTiled, 0, false},
        Case{64, 28672, KernelChoice::kNarrow, 0, true}, Case{128, 28672, KernelChoice::kNarrow, 0, true},
        Case{129, 256, KernelChoice::kNarrow, 0, false}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << " rows, N " << c.n << ", " << AbslUnparseFlag(c.kernel)
                                      << ", split_k " << c.split_k);
    CompileOptions options;
    options.kernel = c.kernel;
    options.split_k = c.split_k;
    absl::StatusOr<Plan> plan = runtime.Compile(WideDecodeGraph(c.rows, c.n), options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->kernel(), c.narrow ? KernelChoice::kNarrow : KernelChoice::kTiled);
    EXPECT_EQ(plan->schedule().tile.n == 32, c.narrow) << plan->schedule().tile.n;
  }
  // Past 64 rows a node of more than 32 MiB of weights keeps the tiled kernel.
  for (const auto& [k, narrow] : {std::pair{4096, true}, std::pair{4160, false}}) {
    SCOPED_TRACE(k);
    GemmGraph graph;
    graph.AddGemm("long_k", Fake("x", 0x100000, 100, k), Fake("w", 0x10000000, 4096, k),
                  Fake("y", 0x20000000, 100, 4096));
    absl::StatusOr<Plan> plan = runtime.Compile(graph, CompileOptions{});
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->kernel(), narrow ? KernelChoice::kNarrow : KernelChoice::kTiled);
  }
  CompileOptions lockstep;
  lockstep.ring_mode = RingMode::kLockstep;
  absl::StatusOr<Plan> plan = runtime.Compile(DecodePair(1), lockstep);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kernel(), KernelChoice::kTiled) << "lockstep rings are the tiled kernel's";
  ExpectParsesAs("narrow", KernelChoice::kNarrow);
  ExpectParsesAs("tiled", KernelChoice::kTiled);
  KernelChoice parsed = KernelChoice::kAuto;
  std::string error;
  EXPECT_FALSE(AbslParseFlag("fast", &parsed, &error));
  EXPECT_EQ(error, "the kernel must be auto, tiled or narrow, got 'fast'");
  ExpectParsesAs("on", PairSplitChoice::kOn);
  ExpectParsesAs("off", PairSplitChoice::kOff);
  ExpectParsesAs("auto", PairSplitChoice::kAuto);
  PairSplitChoice pair_split = PairSplitChoice::kAuto;
  EXPECT_FALSE(AbslParseFlag("true", &pair_split, &error));
  EXPECT_EQ(error, "the pair split must be auto, on or off, got 'true'");
}

// An MLP-shaped decode graph: "up" (4096 -> 28672), then "down" (28672 ->
// 4096), which reads up's output when `dependent`, else a tensor of its own.
GemmGraph UpDownGraph(int64_t rows, bool dependent) {
  GemmGraph graph;
  const TensorView h = Fake("h", 0x30000000, rows, 28672);
  graph.AddGemm("up", Fake("x", 0x100000, rows, 4096), Fake("w", 0x10000000, 28672, 4096), h);
  graph.AddGemm("down", dependent ? h : Fake("h2", 0x38000000, rows, 28672), Fake("v", 0x40000000, 4096, 28672),
                Fake("y", 0x60000000, rows, 4096));
  return graph;
}

// `count` independent [rows x k] x [n x k] GEMMs, or a chain of them (each
// reading the one before: n must be k), in buffers 1 GiB apart.
GemmGraph Layers(int count, int64_t rows, int64_t n, bool chained, int64_t k = 4096) {
  GemmGraph graph;
  const auto at = [](int i, uintptr_t offset) { return (uintptr_t{1} << 30) * (i + 1) + offset; };
  TensorView x = Fake("x", at(0, 0), rows, k);
  for (int i = 0; i < count; ++i) {
    const TensorView y = Fake(absl::StrCat("y", i), at(i, 0x20000000), rows, n);
    graph.AddGemm(absl::StrCat("layer", i), chained ? x : Fake(absl::StrCat("x", i), at(i, 0), rows, k),
                  Fake(absl::StrCat("w", i), at(i, 0x10000000), n, k), y);
    x = y;
  }
  return graph;
}

// Two independent [256 x k] x [4096 x k] GEMMs, one step: K 4096, then
// `second_k`.
GemmGraph TwoLayersOfK(int64_t second_k) {
  GemmGraph graph;
  const auto at = [](int i, uintptr_t offset) { return (uintptr_t{1} << 30) * (i + 1) + offset; };
  int i = 0;
  for (const int64_t k : {int64_t{4096}, second_k}) {
    graph.AddGemm(absl::StrCat("layer", i), Fake(absl::StrCat("x", i), at(i, 0), 256, k),
                  Fake(absl::StrCat("w", i), at(i, 0x10000000), 4096, k),
                  Fake(absl::StrCat("y", i), at(i, 0x20000000), 256, 4096));
    ++i;
  }
  return graph;
}

// CompileOptions::tile_n = 0 (the default): 128 where, at every step of the
// graph (the nodes of one dependency depth), 128-wide tiles fit in half the
// grid, or fill at least nine tenths of it with K at most 5120; else 256. A
// width the options set is kept.
TEST(RuntimeTest, TileWidthFollowsTheTilesOfEachStep) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  ASSERT_EQ(runtime.device().sm_count, 132);
  struct Case {
    std::string name;
    GemmGraph graph;
    int max_clusters;
    int tile_n;  // chosen
  };
  const std::vector<Case> cases = {
      {"200 rows: 64 tiles, half the grid", Layers(1, 200, 4096, false), 0, 128},
      {"256 rows x 4352: 68 tiles, past half", Layers(1, 256, 4352, false), 0, 256},
      {"640 x 2048: 80 tiles", Layers(1, 640, 2048, false), 0, 256},
      {"448 rows: 128 tiles, nine tenths", Layers(1, 448, 4096, false), 0, 128},
      {"256 rows x 7680: 120 tiles, nine tenths", Layers(1, 256, 7680, false), 0, 128},
      {"256 rows x 7424: 116 tiles", Layers(1, 256, 7424, false), 0, 256},
      {"448 rows, K 5120: 128 tiles, nine tenths", Layers(1, 448, 4096, false, 5120), 0, 128},
      {"448 rows, K 5184: 128 tiles, K too long to leave unsplit", Layers(1, 448, 4096, false, 5184), 0, 256},
      {"512 rows, K 14336: 128 tiles, K too long", Layers(1, 512, 4096, false, 14336), 0, 256},
      {"256 rows, K 14336: 64 tiles, half the grid", Layers(1, 256, 4096, false, 14336), 0, 128},
      {"640 rows: 160 tiles, past one wave", Layers(1, 640, 4096, false), 0, 256},
      {"a chain at 256 rows: 64 tiles a step", Layers(8, 256, 4096, true), 0, 128},
      {"two independent layers at 256 rows: 128 tiles in one step", Layers(2, 256, 4096, false), 0, 128},
      {"three: 192", Layers(3, 256, 4096, false), 0, 256},
      {"two layers, 128 tiles, the second's K 8192", TwoLayersOfK(8192), 0, 256},
      {"the MLP block at 128 rows: up's 224 tiles", UpDownGraph(128, true), 0, 256},
      {"200 rows on 8 clusters: 64 tiles, 16 CTAs", Layers(1, 200, 4096, false), 8, 256},
      {"200 rows x 512 on 8 clusters: 8 tiles", Layers(1, 200, 512, false), 8, 128},
      // The bounds themselves: nine tenths of the grid exactly, one wave
      // exactly, and one tile past a wave (256).
      {"128 x 1152 on 5 clusters: 9 tiles of 10 CTAs, nine tenths exactly", Layers(1, 128, 1152, false), 5, 128},
      {"512 x 4224: 132 tiles, one wave exactly", Layers(1, 512, 4224, false), 0, 128},
      {"896 x 2432: 133 tiles, one past the wave", Layers(1, 896, 2432, false), 0, 256},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    CompileOptions options;
    options.kernel = KernelChoice::kTiled;
    options.max_clusters = c.max_clusters;
    absl::StatusOr<Plan> plan = runtime.Compile(c.graph, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->schedule().tile.n, c.tile_n);
    EXPECT_NE(plan->Explain().find(absl::StrFormat("tile 128x%dx64", c.tile_n)), std::string::npos)
        << plan->Explain();
    for (const int asked : {128, 256}) {
      options.tile_n = asked;
      plan = runtime.Compile(c.graph, options);
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_EQ(plan->schedule().tile.n, asked);
    }
  }
}

// From 17 rows kAuto also takes the narrow kernel for a graph past the
// three-wave rule when its nodes past three waves (up) hold at most twice
// the weights of the nodes that read another's output and would have their
// K split on the tiled kernel (down: 16 tiles of 256 columns); the same
// nodes without the dependency stay tiled.
TEST(RuntimeTest, KernelChoiceAvoidsSplittingDependentNodes) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  for (const int64_t rows : {17, 64}) {
    for (const bool dependent : {true, false}) {
      SCOPED_TRACE(::testing::Message() << rows << " rows, dependent " << dependent);
      const GemmGraph graph = UpDownGraph(rows, dependent);
      ASSERT_EQ(graph.Dependencies().size(), dependent ? 1u : 0u);
      absl::StatusOr<Plan> plan = runtime.Compile(graph, CompileOptions{});
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_EQ(plan->kernel(), dependent ? KernelChoice::kNarrow : KernelChoice::kTiled);
      if (dependent) continue;
      CompileOptions tiled;
      tiled.kernel = KernelChoice::kTiled;
      plan = runtime.Compile(UpDownGraph(rows, true), tiled);
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_GT(plan->schedule().nodes[1].split_k, 1) << "the rule's premise: the tiled kernel splits down";
    }
  }
}

// The rule above asks whether the tiled kernel would split a dependent node
// as Lower does, counting the nodes of its dependency depth together. Here
// one or two nodes read `up`'s output (past three waves of narrow tiles):
// each alone is 20 cluster tiles of 256-column tiles (split, to fill the
// 66 clusters), two together are 40 (more than half the wave: neither split).
// With one reader the narrow kernel; with two nothing dependent would be
// split, so the tiled one.
TEST(RuntimeTest, KernelChoiceCountsTheNodesOfADepthTogether) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  constexpr uintptr_t kGiB = uintptr_t{1} << 30;
  for (const int readers : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << readers << " readers of up");
    GemmGraph graph;
    const TensorView h = Fake("h", 1 * kGiB, 64, 28672);
    graph.AddGemm("up", Fake("x", 2 * kGiB, 64, 4096), Fake("w", 3 * kGiB, 28672, 4096), h);
    for (int i = 0; i < readers; ++i) {
      graph.AddGemm(absl::StrCat("down", i), h, Fake(absl::StrCat("v", i), (4 + 2 * i) * kGiB, 10240, 28672),
                    Fake(absl::StrCat("y", i), (5 + 2 * i) * kGiB, 64, 10240));
    }
    absl::StatusOr<Plan> plan = runtime.Compile(graph, CompileOptions{});
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->kernel(), readers == 1 ? KernelChoice::kNarrow : KernelChoice::kTiled);
    CompileOptions tiled;
    tiled.kernel = KernelChoice::kTiled;
    tiled.tile_n = 256;
    plan = runtime.Compile(graph, tiled);
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (int i = 1; i <= readers; ++i) {
      EXPECT_EQ(plan->schedule().nodes[i].split_k > 1, readers == 1) << "the rule's premise, node " << i;
    }
  }
}

// A node without jobs counts nothing towards the tile width, its K neither:
// 128 tiles at K = 4096 (nine tenths, 128 wide) stay 128 wide beside a
// no-op node of K = 8192 at the same depth (counted, the no-op's K would make
// the step's K too long for the nearly-full-wave rule).
TEST(RuntimeTest, NodesWithoutJobsDoNotSteerTheTileWidth) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  CompileOptions options;
  options.kernel = KernelChoice::kTiled;
  GemmGraph graph = Layers(1, 448, 4096, false);
  const absl::StatusOr<Plan> plain = runtime.Compile(graph, options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_EQ(plain->schedule().tile.n, 128);
  graph.AddGemm("long_k_only", TensorView::Dense("a", nullptr, DType::kBF16, 0, 8192),
                Fake("b", uint64_t{1} << 40, 64, 8192), TensorView::Dense("c", nullptr, DType::kBF16, 0, 64));
  const absl::StatusOr<Plan> plan = runtime.Compile(graph, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->schedule().tile.n, 128);
}

// Rings that need exactly the device's shared memory per block fit; one
// byte less does not.
TEST(RuntimeTest, RingsThatNeedExactlyTheSharedMemoryFit) {
  CompileOptions options;
  options.kernel = KernelChoice::kTiled;
  options.tile_n = 256;
  options.a_stages = 4;
  options.b_stages = 4;
  const int64_t need = kernel::SharedMemoryBytes(4, 4, kernel::KernelConfig::kAStageBytes, 256);
  DeviceDescription device = DeviceDescription::H200();
  device.shared_memory_per_block = need;
  const absl::StatusOr<Plan> plan = Runtime::ForDescription(device).Compile(OneGemm(), options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  device.shared_memory_per_block = need - 1;
  EXPECT_TRUE(HasStatus(Runtime::ForDescription(device).Compile(OneGemm(), options).status(),
                        absl::StatusCode::kFailedPrecondition,
                        {"shared memory", absl::StrCat("need ", need, " bytes per block")}));
}

// The dependent-split rule counts a node's 256-column tiles rounded up: a
// dependent node 128 columns wide is one tile, which the tiled kernel splits
// (448 k-blocks on 66 clusters), so at 32 rows its weights (128 x 28672)
// outweigh half of the wide node's (28672 x 64) and kAuto takes the narrow
// kernel (rounded down, the narrow node would have no tiles, never be split,
// and the plan would go tiled).
TEST(RuntimeTest, KernelChoiceCountsANarrowDependentNodeAsOneTile) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  GemmGraph graph;
  const TensorView h = Fake("h", 0x30000000, 32, 28672);
  graph.AddGemm("up", Fake("x", 0x100000, 32, 64), Fake("w", 0x10000000, 28672, 64), h);
  graph.AddGemm("down", h, Fake("v", 0x40000000, 128, 28672), Fake("y", 0x60000000, 32, 128));
  absl::StatusOr<Plan> plan = runtime.Compile(graph, CompileOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kernel(), KernelChoice::kNarrow);
  CompileOptions tiled;
  tiled.kernel = KernelChoice::kTiled;
  tiled.tile_n = 256;
  plan = runtime.Compile(graph, tiled);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT(plan->schedule().nodes[1].split_k, 1) << "the rule's premise: the tiled kernel splits down";
}

// A narrow plan whose longest K is one stage (K <= 256) still gets two A
// stages (a ring of one would wait for itself; CheckOptions refuses 1 as
// narrow_a_stages).
TEST(RuntimeTest, NarrowRingsOfOneStageOfKHaveTwoAStages) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  for (const int64_t k : {int64_t{64}, int64_t{256}}) {
    SCOPED_TRACE(k);
    GemmGraph graph;
    graph.AddGemm("proj", Fake("x", 0x100000, 1, k), Fake("w", 0x10000000, 768, k), Fake("y", 0x20000000, 1, 768));
    const absl::StatusOr<Plan> plan = runtime.Compile(graph, CompileOptions{});
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->kernel(), KernelChoice::kNarrow);
    EXPECT_NE(plan->Explain().find("A 2 stages of 4096 bytes"), std::string::npos) << plan->Explain();
  }
}

// An fp16 graph takes the kernel a bf16 graph of the same shapes takes (each
// kernel has fp16 instantiations), the tagged handoff too (its words hold
// pairs of the plan's type); a graph that mixes fp16 and bf16 nodes is
// refused (one plan, one 16-bit type).
TEST(RuntimeTest, Fp16GraphsChooseTheirKernelAsBf16OnesDo) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  const auto view = [](const std::string& name, uintptr_t address, DType dtype, int64_t rows, int64_t cols) {
    return TensorView::Dense(name, reinterpret_cast<void*>(address), dtype, rows, cols);
  };
  const auto layer = [&](DType dtype, int64_t rows) {
    GemmGraph graph;
    graph.AddGemm("proj", view("x", 0x100000, dtype, rows, 4096), view("w", 0x10000000, dtype, 4096, 4096),
                  view("y", 0x20000000, dtype, rows, 4096));
    return graph;
  };
  for (const int64_t rows : {1, 16, 64, 512}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows");
    absl::StatusOr<Plan> bf16 = runtime.Compile(layer(DType::kBF16, rows));
    absl::StatusOr<Plan> fp16 = runtime.Compile(layer(DType::kFP16, rows));
    ASSERT_TRUE(bf16.ok()) << bf16.status();
    ASSERT_TRUE(fp16.ok()) << fp16.status();
    EXPECT_EQ(fp16->kernel(), bf16->kernel());
    EXPECT_EQ(fp16->kernel(), rows <= 64 ? KernelChoice::kNarrow : KernelChoice::kTiled);
  }

  // A one-token pair of layers: tagged in fp16 as in bf16.
  GemmGraph pair;
  const TensorView h = view("h", 0x30000000, DType::kFP16, 1, 768);
  pair.AddGemm("up", view("x", 0x100000, DType::kFP16, 1, 1024), view("w", 0x10000000, DType::kFP16, 768, 1024), h);
  pair.AddGemm("down", h, view("v", 0x18000000, DType::kFP16, 256, 768), view("y", 0x20000000, DType::kFP16, 1, 256));
  absl::StatusOr<Plan> plan = runtime.Compile(pair, {.kernel = KernelChoice::kNarrow});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->Explain().find("tagged handoffs"), std::string::npos) << plan->Explain();
  plan = runtime.Compile(DecodePair(1), {.kernel = KernelChoice::kNarrow});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->Explain().find("tagged handoffs"), std::string::npos) << plan->Explain();

  GemmGraph mixed = layer(DType::kFP16, 16);
  mixed.AddGemm("other", view("a", 0x30000000, DType::kBF16, 16, 256), view("b", 0x31000000, DType::kBF16, 256, 256),
                view("c", 0x32000000, DType::kBF16, 16, 256));
  const absl::Status mixed_status = runtime.Compile(mixed).status();
  EXPECT_EQ(mixed_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mixed_status.message(),
            "graph: node \"proj\" has fp16 inputs but node \"other\" has bf16; one plan runs one 16-bit type "
            "(compile each as its own plan)");
}

// A layer, another that reads it (split on the tiled kernel), then an LM
// head of `vocab` columns that reads the second: within three waves of
// narrow tiles (8192), or past them but itself split on the tiled kernel
// (12800: 50 tiles of 256), the narrow kernel; past them and unsplit (32000,
// 128000: more than twice the split layer's weights), the tiled one.
TEST(RuntimeTest, KernelChoiceKeepsTiledForAWideHead) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  for (const auto& [vocab, narrow] :
       {std::pair<int64_t, bool>{8192, true}, {12800, true}, {32000, false}, {128000, false}}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    GemmGraph graph;
    const TensorView h1 = Fake("h1", 0x30000000, 64, 4096);
    const TensorView h2 = Fake("h2", 0x31000000, 64, 4096);
    graph.AddGemm("layer1", Fake("x", 0x100000, 64, 4096), Fake("w1", 0x10000000, 4096, 4096), h1);
    graph.AddGemm("layer2", h1, Fake("w2", 0x12000000, 4096, 4096), h2);
    graph.AddGemm("head", h2, Fake("w3", 0x40000000, vocab, 4096), Fake("logits", 0x32000000, 64, vocab));
    absl::StatusOr<Plan> plan = runtime.Compile(graph, CompileOptions{});
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->kernel(), narrow ? KernelChoice::kNarrow : KernelChoice::kTiled);
  }
}

// KernelChoice::kNarrow: a graph of at most 64 rows is lowered for the narrow kernel
// (64 x 32 tiles, no clusters, no split-K, one CTA per SM), its rings sized
// from its rows and K; one of 65 rows stays tiled.
// Explain names the narrow kernel's multiply for the plan's A tile rows:
// mma.sync up to 16, two k-blocks a wgmma m64n64k16 at 17-32 (A tiles of 24
// or 32 rows), wgmma m64n32k16 past.
TEST(RuntimeTest, NarrowPlansExplainHowTheyMultiply) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  CompileOptions options;
  options.kernel = KernelChoice::kNarrow;
  constexpr const char* kMmaSync = "multiply: mma.sync m16n8k16, the weights as the 16-row operand";
  constexpr const char* kPaired = "multiply: wgmma m64n64k16 over two k-blocks at once";
  constexpr const char* kWgmma = "multiply: wgmma m64n32k16";
  for (const auto& [rows, multiply, tile_rows] :
       {std::tuple{1, kMmaSync, 8}, std::tuple{16, kMmaSync, 16}, std::tuple{17, kPaired, 24},
        std::tuple{25, kPaired, 32}, std::tuple{33, kWgmma, 40}, std::tuple{64, kWgmma, 64}}) {
    SCOPED_TRACE(rows);
    absl::StatusOr<Plan> plan = runtime.Compile(DecodePair(rows), options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::string explain = plan->Explain();
    const size_t line = explain.find(multiply);
    ASSERT_NE(line, std::string::npos) << explain;
    EXPECT_NE(explain.find(absl::StrFormat("A tiles of %d rows", tile_rows), line), std::string::npos) << explain;
  }
}

// CompileOptions::tagged_handoff: which dependencies Explain lists as tagged
// handoffs. A node of 1 or 2 rows whose A is the whole of one producer's
// output on the narrow kernel with one consumer warpgroup; not at 3 rows,
// nor with two consumer warpgroups, nor on the
// tiled kernel, nor with the option off, nor for a consumer of two
// producers (the column halves of one buffer), but for a consumer of one of
// those halves (its A is that producer's whole C); two consumers of one
// producer share one copy (8-byte words for every two columns of each row).
// A producer of more 32-column tiles than the grid has CTAs (several waves)
// stays on flags; one of exactly a wave (132 on the H200) hands off.
TEST(RuntimeTest, TaggedHandoffsFollowTheirRule) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  const auto explain = [&](const GemmGraph& graph, const CompileOptions& options) {
    absl::StatusOr<Plan> plan = runtime.Compile(graph, options);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? plan->Explain() : std::string();
  };
  CompileOptions narrow;
  narrow.kernel = KernelChoice::kNarrow;
  for (const int64_t rows : {1, 2}) {
    const std::string text = explain(DecodePair(rows), narrow);
    EXPECT_NE(text.find(absl::StrFormat("tagged handoffs (A polled as tagged words, %.1f KiB of copies): up -> down",
                                        rows * 384 * 8 / 1024.0)),
              std::string::npos)
        << text;
  }
  EXPECT_EQ(explain(DecodePair(3), narrow).find("tagged"), std::string::npos);
  CompileOptions two_consumers = narrow;
  two_consumers.narrow_consumers = 2;
  EXPECT_EQ(explain(DecodePair(1), two_consumers).find("tagged"), std::string::npos);
  CompileOptions off = narrow;
  off.tagged_handoff = false;
  EXPECT_EQ(explain(DecodePair(1), off).find("tagged"), std::string::npos);
  CompileOptions tiled;
  tiled.kernel = KernelChoice::kTiled;
  EXPECT_EQ(explain(DecodePair(1), tiled).find("tagged"), std::string::npos);

  // Two producers of the column halves of h: a consumer of all of h reads
  // one copy of h both write (left from column 0, right from 384); a
  // consumer of h's left half alone reads a copy of that half; with both
  // consumers, left can write only the first copy, so the second stays on
  // flags.
  const TensorView h = Fake("h", 0x30000000, 2, 768);
  auto halves = [&](bool down, bool slice) {
    GemmGraph g;
    g.AddGemm("left", Fake("x", 0x100000, 2, 1024), Fake("w", 0x10000000, 384, 1024), h.Columns(0, 384));
    g.AddGemm("right", Fake("x", 0x100000, 2, 1024), Fake("w2", 0x14000000, 384, 1024), h.Columns(384, 384));
    if (down) g.AddGemm("down", h, Fake("v", 0x18000000, 256, 768), Fake("y", 0x20000000, 2, 256));
    if (slice) {
      g.AddGemm("slice", h.Columns(0, 384), Fake("u", 0x1c000000, 256, 384), Fake("z", 0x24000000, 2, 256));
    }
    return explain(g, narrow);
  };
  const std::string both = halves(true, true);
  EXPECT_NE(both.find(absl::StrFormat("%.1f KiB of copies): left -> down, right -> down\n", 2 * 384 * 8 / 1024.0)),
            std::string::npos)
      << both;
  const std::string slice_only = halves(false, true);
  EXPECT_NE(slice_only.find(absl::StrFormat("%.1f KiB of copies): left -> slice\n", 2 * 192 * 8 / 1024.0)),
            std::string::npos)
      << slice_only;
  // Slices that leave a gap (A's columns 0-127 written by no node): flags.
  {
    GemmGraph g;
    g.AddGemm("left", Fake("x", 0x100000, 2, 1024), Fake("w", 0x10000000, 256, 1024), h.Columns(128, 256));
    g.AddGemm("right", Fake("x", 0x100000, 2, 1024), Fake("w2", 0x14000000, 384, 1024), h.Columns(384, 384));
    g.AddGemm("down", h, Fake("v", 0x18000000, 256, 768), Fake("y", 0x20000000, 2, 256));
    EXPECT_EQ(explain(g, narrow).find("tagged"), std::string::npos) << explain(g, narrow);
  }

  for (const auto& [width, handoff] : {std::pair{132 * 32, true}, std::pair{132 * 32 + 8, false}}) {
    SCOPED_TRACE(width);
    GemmGraph wave;
    const TensorView g = Fake("g", 0x30000000, 1, width);
    wave.AddGemm("wide", Fake("x", 0x100000, 1, 1024), Fake("w", 0x10000000, width, 1024), g);
    wave.AddGemm("narrow", g, Fake("v", 0x18000000, 256, width), Fake("y", 0x20000000, 1, 256));
    EXPECT_EQ(explain(wave, narrow).find("tagged handoffs") != std::string::npos, handoff) << explain(wave, narrow);
  }

  GemmGraph shared = DecodePair(2);
  shared.AddGemm("down2", Fake("h", 0x30000000, 2, 768), Fake("v2", 0x1a000000, 256, 768),
                 Fake("y2", 0x22000000, 2, 256));
  const std::string text = explain(shared, narrow);
  EXPECT_NE(text.find(absl::StrFormat("%.1f KiB of copies): up -> down, up -> down2", 2 * 384 * 8 / 1024.0)),
            std::string::npos)
      << text;
}

TEST(RuntimeTest, NarrowDecodePlansUseNarrowTiles) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  CompileOptions options;
  options.kernel = KernelChoice::kNarrow;
  // K = 1024 at most: four stages of 256 k hold a job's A, whatever the rows.
  for (const auto& [rows, a_stages, a_bytes] : {std::tuple{1, 4, 4096}, std::tuple{9, 4, 8192},
                                                std::tuple{64, 4, 32768}}) {
    SCOPED_TRACE(rows);
    absl::StatusOr<Plan> plan = runtime.Compile(DecodePair(rows), options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const sched::Schedule& schedule = plan->schedule();
    EXPECT_EQ(schedule.tile.m, 64);
    EXPECT_EQ(schedule.tile.n, 32);
    EXPECT_EQ(schedule.tile.k, 64);
    EXPECT_EQ(schedule.cluster_size, 1);
    EXPECT_EQ(plan->grid_clusters(), 132);
    EXPECT_EQ(schedule.workspace_elements, 0);
    for (const sched::NodeSchedule& node : schedule.nodes) EXPECT_EQ(node.split_k, 1);
    EXPECT_EQ(schedule.nodes[0].n_blocks, 24);  // 768 / 32
    EXPECT_EQ(schedule.queue.size(), 24u + 8u);
    const std::string explain = plan->Explain();
    EXPECT_NE(explain.find("narrow decode kernel"), std::string::npos) << explain;
    EXPECT_NE(explain.find(absl::StrFormat("A %d stages of %d bytes", a_stages, a_bytes)), std::string::npos)
        << explain;
  }
  // A long K: at most 16 stages, and at most 128 KiB of them (96 KiB for
  // 9-32 rows).
  for (const auto& [rows, a_stages] : {std::pair{1, 16}, std::pair{16, 12}, std::pair{17, 8}, std::pair{32, 6},
                                       std::pair{33, 6}, std::pair{64, 4}}) {
    GemmGraph graph;
    graph.AddGemm("long_k", Fake("x", 0x100000, rows, 8192), Fake("w", 0x10000000, 256, 8192),
                  Fake("y", 0x20000000, rows, 256));
    absl::StatusOr<Plan> plan = runtime.Compile(graph, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_NE(plan->Explain().find(absl::StrFormat("A %d stages of", a_stages)), std::string::npos)
        << plan->Explain();
  }
  // With packed weights at most 16 rows take 6 A stages, and B the rest.
  CompileOptions packed = options;
  packed.pack_weights = true;
  for (const auto& [rows, a_stages, a_bytes] : {std::tuple{1, 6, 4096}, std::tuple{16, 6, 8192},
                                                std::tuple{17, 8, 12288}}) {
    SCOPED_TRACE(rows);
    GemmGraph graph;
    graph.AddGemm("long_k", Fake("x", 0x100000, rows, 8192), Fake("w", 0x10000000, 256, 8192),
                  Fake("y", 0x20000000, rows, 256));
    absl::StatusOr<Plan> plan = runtime.Compile(graph, packed);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_NE(plan->Explain().find(absl::StrFormat("A %d stages of %d bytes", a_stages, a_bytes)),
              std::string::npos)
        << plan->Explain();
  }
  // 65-128 rows: two row blocks of half the rows (rounded up to 8), each
  // with A tiles of that many rows; past 128 the tiled kernel.
  for (const auto& [rows, block_rows] : {std::pair{65, 40}, std::pair{100, 56}, std::pair{128, 64}}) {
    SCOPED_TRACE(rows);
    absl::StatusOr<Plan> plan = runtime.Compile(DecodePair(rows), options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const sched::Schedule& schedule = plan->schedule();
    EXPECT_EQ(schedule.tile.m, block_rows);
    EXPECT_EQ(schedule.tile.n, 32);
    for (const sched::NodeSchedule& node : schedule.nodes) EXPECT_EQ(node.m_blocks, 2);
    EXPECT_EQ(schedule.queue.size(), 2 * (24u + 8u));
    const std::string explain = plan->Explain();
    EXPECT_NE(explain.find(absl::StrFormat("narrow decode kernel (%d x 32 tiles", block_rows)), std::string::npos)
        << explain;
    EXPECT_NE(explain.find(absl::StrFormat("A tiles of %d rows", block_rows)), std::string::npos) << explain;
  }
  absl::StatusOr<Plan> tall = runtime.Compile(DecodePair(129), options);
  ASSERT_TRUE(tall.ok()) << tall.status();
  EXPECT_EQ(tall->kernel(), KernelChoice::kTiled);
  EXPECT_EQ(tall->Explain().find("narrow"), std::string::npos) << tall->Explain();
}

// The narrow kernel's B ring: at most 6 stages for a chain of layers of at
// most one wave of narrow tiles each (132 on the H200) and at most 16 rows;
// what shared memory leaves (9 stages of 16 KiB beside one-row A tiles for
// K = 4096) for a single node, for a graph with a wider node, and from 17
// rows.
TEST(RuntimeTest, OneWaveChainsGetAShallowerBRing) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  auto b_stages_of = [&](const GemmGraph& graph) {
    absl::StatusOr<Plan> plan = runtime.Compile(graph, CompileOptions{});
    EXPECT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->kernel(), KernelChoice::kNarrow);
    const std::string explain = plan->Explain();
    const size_t at = explain.find(", B ");
    return at == std::string::npos ? std::string("?") : explain.substr(at + 4, explain.find(' ', at + 4) - at - 4);
  };
  auto chain = [](int64_t rows, int64_t width2) {
    GemmGraph graph;
    const TensorView h = Fake("h", 0x30000000, rows, 4096);
    graph.AddGemm("layer1", Fake("x", 0x100000, rows, 4096), Fake("w1", 0x10000000, 4096, 4096), h);
    graph.AddGemm("layer2", h, Fake("w2", 0x12000000, width2, 4096), Fake("y", 0x31000000, rows, width2));
    return graph;
  };
  EXPECT_EQ(b_stages_of(chain(1, 4096)), "6");
  EXPECT_EQ(b_stages_of(chain(16, 4224)), "6");  // 132 tiles: still one wave
  EXPECT_EQ(b_stages_of(chain(1, 4256)), "9");   // 133 tiles
  GemmGraph single;
  single.AddGemm("layer", Fake("x", 0x100000, 1, 4096), Fake("w", 0x10000000, 4096, 4096),
                 Fake("y", 0x31000000, 1, 4096));
  EXPECT_EQ(b_stages_of(single), "9");
  CompileOptions deep;
  deep.narrow_b_stages = 9;
  absl::StatusOr<Plan> plan = runtime.Compile(chain(1, 4096), deep);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->Explain().find(", B 9 stages"), std::string::npos) << "narrow_b_stages still sets the depth";
}

// At 33-64 rows (m64n32k16, no partials buffers: NarrowConfig::UsesPartials)
// the B ring takes the partials' shared memory: 6 stages beside 4 A stages
// of 32 KiB (64 rows) or 5 of 24 KiB (48 rows); with the partials there, 5.
// At 17-32 rows the paired path keeps its partials.
TEST(RuntimeTest, WgmmaRowsGiveThePartialsRoomToTheBRing) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  auto explain_of = [&](int64_t rows) {
    absl::StatusOr<Plan> plan = runtime.Compile(UpDownGraph(rows, /*dependent=*/true), CompileOptions{});
    EXPECT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->kernel(), KernelChoice::kNarrow);
    return plan.ok() ? plan->Explain() : std::string();
  };
  for (int64_t rows : {48, 64}) {
    const std::string explain = explain_of(rows);
    EXPECT_NE(explain.find(", B 6 stages"), std::string::npos) << rows << " rows:\n" << explain;
  }
  // The layouts: two partials buffers at 32 rows (the paired path's), none
  // at 64.
  const kernel::NarrowSmemLayout paired =
      kernel::ComputeNarrowSmemLayout(6, kernel::NarrowConfig::AStageBytes(32), 7, 2);
  EXPECT_EQ(paired.barriers - paired.partials, 2 * kernel::NarrowConfig::kPartialsBytes);
  const kernel::NarrowSmemLayout wgmma =
      kernel::ComputeNarrowSmemLayout(4, kernel::NarrowConfig::AStageBytes(64), 6, 2);
  EXPECT_EQ(wgmma.barriers, wgmma.partials);
}

// CompileOptions::narrow_consumers: by default two consumer warpgroups for
// 17-64 rows, one for the mma.sync path (at most 16 rows) and for a chain of
// one-wave layers; the option overrides both ways. Explain says which.
TEST(RuntimeTest, NarrowConsumerWarpgroupsFollowTheGraph) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  auto consumers_of = [&](const GemmGraph& graph, int option) {
    CompileOptions options;
    options.narrow_consumers = option;
    absl::StatusOr<Plan> plan = runtime.Compile(graph, options);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return std::string("?");
    EXPECT_EQ(plan->kernel(), KernelChoice::kNarrow);
    const std::string explain = plan->Explain();
    const size_t at = explain.find("CTAs of ");
    return at == std::string::npos ? std::string("?") : explain.substr(at + 8, 1);
  };
  auto wide_pair = [](int64_t rows) {  // 448 tiles of gate/up: many jobs a CTA
    GemmGraph graph;
    const TensorView h = Fake("h", 0x30000000, rows, 14336);
    graph.AddGemm("up", Fake("x", 0x100000, rows, 4096), Fake("w1", 0x10000000, 14336, 4096), h);
    graph.AddGemm("down", h, Fake("w2", 0x20000000, 4096, 14336), Fake("y", 0x40000000, rows, 4096));
    return graph;
  };
  auto chain = [](int64_t rows) {  // 128 tiles a layer: one wave
    GemmGraph graph;
    const TensorView h = Fake("h", 0x30000000, rows, 4096);
    graph.AddGemm("layer1", Fake("x", 0x100000, rows, 4096), Fake("w1", 0x10000000, 4096, 4096), h);
    graph.AddGemm("layer2", h, Fake("w2", 0x12000000, 4096, 4096), Fake("y", 0x31000000, rows, 4096));
    return graph;
  };
  EXPECT_EQ(consumers_of(wide_pair(64), 0), "2");
  EXPECT_EQ(consumers_of(wide_pair(17), 0), "2");
  EXPECT_EQ(consumers_of(wide_pair(16), 0), "1");
  EXPECT_EQ(consumers_of(chain(64), 0), "1");
  EXPECT_EQ(consumers_of(wide_pair(64), 1), "1");
  EXPECT_EQ(consumers_of(wide_pair(1), 2), "2");
  EXPECT_EQ(consumers_of(chain(64), 2), "2");
}

// CompileOptions::pack_weights: the narrow kernel packs every B that no node
// writes, and Explain names them and the copy's size; a B another node writes
// is read in place, as is every B on the tiled kernel.
TEST(RuntimeTest, PackedWeightsAreExplained) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  GemmGraph graph;
  const TensorView h = Fake("h", 0x30000000, 8, 4096);
  graph.AddGemm("layer1", Fake("x", 0x100000, 8, 4096), Fake("w1", 0x10000000, 4096, 4096), h);
  graph.AddGemm("layer2", h, Fake("w2", 0x12000000, 128, 4096), Fake("y", 0x31000000, 8, 128));
  graph.AddGemm("scores", Fake("q", 0x200000, 1, 4096), h, Fake("s", 0x32000000, 1, 8));  // B = layer1's output
  CompileOptions options;
  options.kernel = KernelChoice::kNarrow;
  options.pack_weights = true;
  absl::StatusOr<Plan> plan = runtime.Compile(graph, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // w1: 128 tiles of 32 rows x 16 stages of 16 KiB = 32 MiB; w2: 4 tiles = 1 MiB.
  EXPECT_NE(plan->Explain().find("weights: packed in stage order, a copy of 33.0 MiB made at Compile, for layer1, "
                                 "layer2\n"),
            std::string::npos)
      << plan->Explain();
  EXPECT_TRUE(HasStatus(plan->RepackWeights(nullptr), absl::StatusCode::kFailedPrecondition, {"host-only"}));
  // A chain of one-wave layers keeps four B loads in flight; other packed
  // plans three (NarrowConfig::kPackedBStagesInFlight), unpacked ones four.
  EXPECT_NE(plan->Explain().find("(4 in flight)"), std::string::npos) << plan->Explain();
  GemmGraph wide;
  wide.AddGemm("wide", Fake("x", 0x100000, 16, 4096), Fake("w", 0x10000000, 8192, 4096),
               Fake("y", 0x30000000, 16, 8192));
  absl::StatusOr<Plan> wide_plan = runtime.Compile(wide, options);
  ASSERT_TRUE(wide_plan.ok()) << wide_plan.status();
  EXPECT_NE(wide_plan->Explain().find("(3 in flight)"), std::string::npos) << wide_plan->Explain();
  options.pack_weights = false;
  wide_plan = runtime.Compile(wide, options);
  ASSERT_TRUE(wide_plan.ok()) << wide_plan.status();
  EXPECT_NE(wide_plan->Explain().find("(4 in flight)"), std::string::npos) << wide_plan->Explain();
  options.pack_weights = true;

  options.pack_weights = false;
  plan = runtime.Compile(graph, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->Explain().find("weights:"), std::string::npos) << plan->Explain();

  // The tiled kernel packs in its own stage order (KernelConfig::Packed):
  // w1, 16 tiles of 256 rows x 64 stages of 32 KiB = 32 MiB; w2's 128 rows
  // one tile padded to 256, 2 MiB.
  auto explains = [&](const GemmGraph& g, const std::string& text) -> ::testing::AssertionResult {
    absl::StatusOr<Plan> compiled = runtime.Compile(g, options);
    if (!compiled.ok()) return ::testing::AssertionFailure() << compiled.status();
    const std::string explain = compiled->Explain();
    if (explain.find(text) == std::string::npos) {
      return ::testing::AssertionFailure() << "no \"" << text << "\" in\n" << explain;
    }
    return ::testing::AssertionSuccess();
  };
  options.pack_weights = true;
  options.kernel = KernelChoice::kTiled;
  options.tile_n = 256;
  EXPECT_TRUE(explains(graph, "weights: packed in stage order, a copy of 34.0 MiB made at Compile, for layer1, "
                              "layer2\n"));
  // Not for nodes of more than two row blocks (256 rows); at 256 rows B is
  // shared by the cluster's two row blocks. Not with lockstep rings (the A
  // loader carries B there; `graph`, whose "scores" reads layer1's output as
  // B, they refuse: LockstepRingsRefuseABThatANodeWrites).
  GemmGraph tall;
  tall.AddGemm("tall", Fake("x", 0x100000, 257, 4096), Fake("w", 0x10000000, 4096, 4096),
               Fake("y", 0x30000000, 257, 4096));
  EXPECT_TRUE(explains(tall, "weights: read in place (the tiled kernel packs the B of nodes of at most 256 rows "
                             "that no node writes; there are none)"));
  GemmGraph two_blocks;
  two_blocks.AddGemm("two_blocks", Fake("x", 0x100000, 256, 4096), Fake("w", 0x10000000, 4096, 4096),
                     Fake("y", 0x30000000, 256, 4096));
  EXPECT_TRUE(explains(two_blocks, "weights: packed in stage order, a copy of 32.0 MiB made at Compile, for "
                                   "two_blocks\n"));
  options.ring_mode = RingMode::kLockstep;
  EXPECT_TRUE(
      explains(two_blocks, "weights: read in place (the tiled kernel reads packed weights with split rings only)"));
  options.ring_mode = RingMode::kSplit;
  options.kernel = KernelChoice::kNarrow;

  // Two nodes reading the same B (one layer applied twice) share one copy.
  GemmGraph twice;
  const TensorView w = Fake("w", 0x10000000, 4096, 4096);
  const TensorView h1 = Fake("h1", 0x30000000, 1, 4096);
  twice.AddGemm("first", Fake("x", 0x100000, 1, 4096), w, h1);
  twice.AddGemm("second", h1, w, Fake("h2", 0x31000000, 1, 4096));
  options.kernel = KernelChoice::kNarrow;
  plan = runtime.Compile(twice, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->Explain().find("a copy of 32.0 MiB made at Compile, for first, second\n"), std::string::npos)
      << plan->Explain();

  // Ragged shapes round up to whole tiles and stages: on the narrow kernel
  // 33 rows are two tiles, K = 100 one stage (zeros past K), K = 1025 five;
  // on the tiled kernel a stage is one k-block: 257 rows are two tiles, K =
  // 100 two stages, K = 1025 seventeen.
  constexpr kernel::PackedLayout kNarrow = kernel::NarrowConfig::Packed();
  EXPECT_EQ(kNarrow.Bytes(33, 100), 2 * 16384);
  EXPECT_EQ(kNarrow.Bytes(32, 1025), 5 * 16384);
  EXPECT_EQ(kNarrow.StageOffset(3, 8, 5), (3 * 5 + 2) * 16384);
  constexpr kernel::PackedLayout kTiled = kernel::KernelConfig::Packed();
  EXPECT_EQ(kTiled.Bytes(257, 100), 2 * 2 * 32768);
  EXPECT_EQ(kTiled.Bytes(256, 1025), 17 * 32768);
  EXPECT_EQ(kTiled.StageOffset(3, 8, 17), (3 * 17 + 8) * 32768);
}

// Where each packed B lies in the copy, known on the host (PackedNodesOf):
// copies back to back in node order; a node whose B is the same view as an
// earlier node's (same memory, shape and stride) at that node's copy, copying
// nothing; the same memory under another row stride is another matrix, with
// its own copy. Explain shows only the total, which a copy laid over another
// (every offset 0) or a shared copy pointing past its own keeps.
TEST(RuntimeTest, PackedWeightsLieBackToBack) {
  GemmGraph graph;
  const TensorView w1 = Fake("w1", 0x10000000, 4096, 4096);
  const TensorView w1_left = w1.Columns(0, 2048).Named("w1_left");  // w1's columns 0-2047: stride 4096
  const TensorView w1_dense = Fake("w1_dense", 0x10000000, 4096, 2048);  // the same data, rows, cols; stride 2048
  const TensorView h = Fake("h", 0x30000000, 1, 4096);
  graph.AddGemm("first", Fake("x", 0x100000, 1, 4096), w1, h);
  graph.AddGemm("small", h, Fake("w2", 0x12000000, 128, 4096), Fake("y", 0x31000000, 1, 128));
  graph.AddGemm("again", h, w1, Fake("z", 0x32000000, 1, 4096));  // first's B again
  graph.AddGemm("left", Fake("x2", 0x200000, 1, 2048), w1_left, Fake("s", 0x33000000, 1, 4096));
  graph.AddGemm("dense", Fake("x3", 0x300000, 1, 2048), w1_dense, Fake("d", 0x34000000, 1, 4096));
  constexpr kernel::PackedLayout kNarrow = kernel::NarrowConfig::Packed();
  const int64_t big = kNarrow.Bytes(4096, 4096), small = kNarrow.Bytes(128, 4096), half = kNarrow.Bytes(4096, 2048);
  const std::vector<Plan::Impl::PackedNode> packed =
      internal::PackedNodesOf(graph, graph.Dependencies(), /*tiled=*/nullptr);
  ASSERT_EQ(packed.size(), 5u);
  const int64_t expected[5][3] = {{0, big, 1}, {big, small, 1}, {0, big, 0}, {big + small, half, 1},
                                  {big + small + half, half, 1}};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(packed[i].node, i);
    EXPECT_EQ(packed[i].offset, expected[i][0]) << graph.nodes()[i].name;
    EXPECT_EQ(packed[i].bytes, expected[i][1]) << graph.nodes()[i].name;
    EXPECT_EQ(packed[i].copies, expected[i][2] == 1) << graph.nodes()[i].name;
  }
  EXPECT_EQ(internal::PackedCopyBytes(packed), big + small + 2 * half);
}

// The tagged handoffs' fields, known on the host (TaggedHandoffsOf): two
// producers of h's column halves and a consumer of all of h share one copy,
// each producer writing from its own first column; a second consumer of the
// right half alone (right's C exactly, another buffer start: another copy)
// stays on flags, since right writes one copy only. Explain shows neither
// col0 nor a handoff that a producer could not write.
TEST(RuntimeTest, TaggedHandoffsGiveEachProducerItsColumns) {
  const TensorView h = Fake("h", 0x30000000, 2, 768);
  GemmGraph graph;
  graph.AddGemm("left", Fake("x", 0x100000, 2, 1024), Fake("w", 0x10000000, 384, 1024), h.Columns(0, 384));
  graph.AddGemm("right", Fake("x", 0x100000, 2, 1024), Fake("w2", 0x14000000, 384, 1024), h.Columns(384, 384));
  graph.AddGemm("down", h, Fake("v", 0x18000000, 256, 768), Fake("y", 0x20000000, 2, 256));
  graph.AddGemm("right_only", h.Columns(384, 384), Fake("u", 0x1c000000, 256, 384), Fake("z", 0x24000000, 2, 256));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  int64_t words = -1;
  const std::vector<Plan::Impl::TaggedHandoff> handoffs =
      internal::TaggedHandoffsOf(graph, graph.Dependencies(), kernel::NarrowConfig::AStageBytes(2),
                                 /*consumers=*/1, /*grid_ctas=*/132, &words);
  ASSERT_EQ(handoffs.size(), 2u);
  EXPECT_EQ(words, 2 * 384);  // one copy: 2 rows of 384 words
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(handoffs[i].producer, i);
    EXPECT_EQ(handoffs[i].consumer, 2);
    EXPECT_EQ(handoffs[i].offset, 0);
    EXPECT_EQ(handoffs[i].pitch, 384);
    EXPECT_EQ(handoffs[i].col0, 384 * i);
  }
}

// The narrow kernel's options are checked, each refusal naming the option,
// the value and the rule.
TEST(RuntimeTest, BadNarrowOptionsAreRefused) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  auto compile = [&](auto&& set) {
    CompileOptions options;
    options.kernel = KernelChoice::kNarrow;
    set(options);
    return runtime.Compile(DecodePair(16), options).status();
  };
  EXPECT_TRUE(HasStatus(compile([](CompileOptions& o) { o.split_k = 2; }), absl::StatusCode::kInvalidArgument,
                        {"split_k: 2", "never splits K"}));
  EXPECT_TRUE(HasStatus(compile([](CompileOptions& o) { o.ring_mode = RingMode::kLockstep; }),
                        absl::StatusCode::kInvalidArgument, {"ring_mode: lockstep", "split rings only"}));
  EXPECT_TRUE(HasStatus(compile([](CompileOptions& o) { o.narrow_a_stages = 33; }),
                        absl::StatusCode::kInvalidArgument, {"narrow_a_stages: 33", "{0} and [2, 16]"}));
  EXPECT_TRUE(HasStatus(compile([](CompileOptions& o) { o.narrow_a_stages = 1; }),
                        absl::StatusCode::kInvalidArgument, {"narrow_a_stages: 1", "{0} and [2, 16]"}));
  EXPECT_TRUE(HasStatus(compile([](CompileOptions& o) { o.narrow_b_stages = 1; }),
                        absl::StatusCode::kInvalidArgument, {"narrow_b_stages: 1", "[2, 16]"}));
  EXPECT_TRUE(HasStatus(compile([](CompileOptions& o) { o.narrow_b_stages = 17; }),
                        absl::StatusCode::kInvalidArgument, {"narrow_b_stages: 17"}));
  // 16 A stages of 8 KiB and 16 B stages of 16 KiB: 384 KiB.
  EXPECT_TRUE(HasStatus(compile([](CompileOptions& o) {
                          o.narrow_a_stages = 16;
                          o.narrow_b_stages = 16;
                        }),
                        absl::StatusCode::kFailedPrecondition,
                        {"shared memory", "CompileOptions.narrow_a_stages = 16, of 8192 bytes each",
                         "CompileOptions.narrow_b_stages = 16", "232448"}));
  EXPECT_TRUE(HasStatus(compile([](CompileOptions& o) { o.narrow_b_in_flight = -1; }),
                        absl::StatusCode::kInvalidArgument, {"narrow_b_in_flight: -1", "[0, 15]"}));
  EXPECT_TRUE(HasStatus(compile([](CompileOptions& o) {
                          o.narrow_b_stages = 4;
                          o.narrow_b_in_flight = 4;
                        }),
                        absl::StatusCode::kInvalidArgument, {"narrow_b_in_flight: 4", "B ring's 4 stages - 1"}));
  EXPECT_TRUE(HasStatus(compile([](CompileOptions& o) { o.max_clusters = 133; }),
                        absl::StatusCode::kFailedPrecondition,
                        {"max_clusters 133", "132 CTAs of the narrow decode kernel"}));
  // Set by hand, both depths are used as given.
  CompileOptions options;
  options.kernel = KernelChoice::kNarrow;
  options.narrow_a_stages = 4;
  options.narrow_b_stages = 2;
  absl::StatusOr<Plan> plan = runtime.Compile(DecodePair(16), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->Explain().find("A 4 stages of 8192 bytes, B 2 stages of 16384 bytes (1 in flight)"),
            std::string::npos)
      << plan->Explain();
  options.narrow_b_stages = 8;
  options.narrow_b_in_flight = 7;
  plan = runtime.Compile(DecodePair(16), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NE(plan->Explain().find("B 8 stages of 16384 bytes (7 in flight)"), std::string::npos) << plan->Explain();
}

// Claim pacing is the narrow kernel's: a narrow plan's Explain names the
// value given (the largest too) and says nothing of pacing without one; a
// tiled plan takes the option and ignores it.
TEST(RuntimeTest, NarrowClaimPacingIsExplained) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  constexpr char kPaced[] = ", next job claimed at";
  absl::StatusOr<Plan> plan = runtime.Compile(DecodePair(16));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->kernel(), KernelChoice::kNarrow);
  EXPECT_EQ(plan->Explain().find(kPaced), std::string::npos) << plan->Explain();
  for (const int stages : {1, 8, kMaxNarrowClaimStages}) {
    CompileOptions options;
    options.narrow_claim_stages = stages;
    plan = runtime.Compile(DecodePair(16), options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_NE(plan->Explain().find(absl::StrFormat("%s %d B stages left\n", kPaced, stages)), std::string::npos)
        << plan->Explain();
  }
  CompileOptions options;
  options.narrow_claim_stages = 8;
  plan = runtime.Compile(OneGemm(), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->kernel(), KernelChoice::kTiled);
  EXPECT_EQ(plan->Explain().find(kPaced), std::string::npos) << plan->Explain();
}

// `plan` is lowered as a narrow split of K: on the narrow kernel, tiles of
// `tile_m` x `tile_n` in one row block, every node's K in `splits` even
// parts, the last summing (no reduce jobs).
void ExpectNarrowSplitPlan(const Plan& plan, int32_t tile_m, int32_t tile_n, int32_t splits) {
  ASSERT_EQ(plan.kernel(), KernelChoice::kNarrow);
  EXPECT_EQ(plan.schedule().tile.m, tile_m);
  EXPECT_EQ(plan.schedule().tile.n, tile_n);
  for (const sched::NodeSchedule& node : plan.schedule().nodes) {
    EXPECT_EQ(node.m_blocks, 1);
    EXPECT_EQ(node.split_k, splits);
    EXPECT_EQ(node.reduce_parts, 0);
    EXPECT_EQ(node.last_split_extra_k_blocks, 0);
  }
}

// `graph` under `options` is not lowered as a split of K: the plan keeps
// 32-column tiles over the whole of K, and Explain holds `not_taken`, the
// split's reason. Returns the plan's Explain.
std::string ExpectNarrowSplitNotTaken(const Runtime& runtime, const GemmGraph& graph, const CompileOptions& options,
                                      const std::string& not_taken) {
  absl::StatusOr<Plan> plan = runtime.Compile(graph, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return "";
  EXPECT_EQ(plan->schedule().tile.n, kernel::NarrowConfig::kBlockN);
  for (const sched::NodeSchedule& node : plan->schedule().nodes) EXPECT_EQ(node.split_k, 1);
  const std::string explain = plan->Explain();
  EXPECT_NE(explain.find(not_taken), std::string::npos) << explain;
  return explain;
}

// The pair split (CompileOptions::narrow_pair_split) is taken where it
// applies: 33-64 rows on the narrow kernel, every node's K split in two on
// a stage boundary. There the plan's tiles are 64 wide, every node splits K
// in two with the second half summing, the B stages are 32 KiB, and Explain
// says so; elsewhere the plan is the one without the option, and Explain
// says the split was not taken and why. Off, Explain says nothing of it.
TEST(RuntimeTest, NarrowPairSplitIsTakenWhereItApplies) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  constexpr char kTaken[] = "x 64 tiles over each half of K, the second half summing (pair split)";
  constexpr char kNotTaken[] = "pair split: not taken (it needs 33-128 rows, two consumer warpgroups past 64, and "
                               "every node's K split in two at a multiple of 256";
  CompileOptions options;
  options.narrow_pair_split = PairSplitChoice::kOn;
  for (const int64_t rows : {33, 48, 64}) {
    SCOPED_TRACE(absl::StrCat(rows, " rows"));
    absl::StatusOr<Plan> plan = runtime.Compile(UpDownGraph(rows, /*dependent=*/true), options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ExpectNarrowSplitPlan(*plan, kernel::NarrowConfig::kBlockM, kernel::NarrowConfig::kPairSplitBlockN, 2);
    if (HasFatalFailure()) return;
    // up (448 column tiles), which down reads, is queued from its halves of
    // columns in turn: its first tiles are 0 and 224.
    EXPECT_EQ(plan->schedule().column_runs, (std::vector<int32_t>{2, 1}));
    EXPECT_NE(plan->Explain().find("group 1, cluster columns from 2 runs in turn; split_k 2"), std::string::npos)
        << plan->Explain();
    std::vector<uint32_t> up_tiles;
    for (const sched::TileJob& job : plan->schedule().queue) {
      if (job.node == 0 && up_tiles.size() < 3 &&
          std::find(up_tiles.begin(), up_tiles.end(), job.n_block) == up_tiles.end()) {
        up_tiles.push_back(job.n_block);
      }
    }
    EXPECT_EQ(up_tiles, (std::vector<uint32_t>{0, 224, 1}));
    EXPECT_NE(plan->Explain().find(kTaken), std::string::npos) << plan->Explain();
    EXPECT_NE(plan->Explain().find("B 4 stages of 32768 bytes (2 in flight)"), std::string::npos)
        << plan->Explain();
    EXPECT_EQ(plan->Explain().find("not taken"), std::string::npos) << plan->Explain();
    // Claim pacing 8 unless the options set it.
    EXPECT_NE(plan->Explain().find(", next job claimed at 8 B stages left\n"), std::string::npos) << plan->Explain();
    CompileOptions paced = options;
    paced.narrow_claim_stages = 3;
    plan = runtime.Compile(UpDownGraph(rows, /*dependent=*/true), paced);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_NE(plan->Explain().find(", next job claimed at 3 B stages left\n"), std::string::npos) << plan->Explain();
  }
  // Not taken: 32 rows (the paired wgmma path), 65 on one consumer
  // warpgroup (the tall pair split needs two); K of 768 (12 k-blocks: halves
  // of 6, not on a stage) and of 4160 (65: 33 and 32).
  struct Case {
    std::string what;
    GemmGraph graph;
    int consumers = 0;
  };
  const std::vector<Case> cases = {{"32 rows", UpDownGraph(32, true)},
                                   {"65 rows, one consumer", UpDownGraph(65, true), 1},
                                   {"K of 768", DecodePair(64)},
                                   {"K of 4160", Layers(2, 64, 4160, /*chained=*/true, /*k=*/4160)}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    options.kernel = KernelChoice::kNarrow;
    options.narrow_consumers = c.consumers;
    const std::string explain = ExpectNarrowSplitNotTaken(runtime, c.graph, options, kNotTaken);
    EXPECT_EQ(explain.find("next job claimed"), std::string::npos) << explain;
  }
  options.narrow_consumers = 0;
  // Even halves by default (up's 64 k-blocks as 32 + 32, down's 448 as 224
  // + 224); CompileOptions::last_split_extra_k_blocks lengthens the second:
  // 8 gives 28 + 36 and 220 + 228, both on a stage; 4 would start it off a
  // stage (30), so the split is not taken, and Explain says with what extra.
  options.kernel = KernelChoice::kAuto;
  for (const int extra : {-1, 8}) {
    SCOPED_TRACE(absl::StrCat("extra ", extra));
    options.last_split_extra_k_blocks = extra;
    absl::StatusOr<Plan> split = runtime.Compile(UpDownGraph(64, true), options);
    ASSERT_TRUE(split.ok()) << split.status();
    ASSERT_EQ(split->schedule().tile.n, kernel::NarrowConfig::kPairSplitBlockN);
    for (const sched::TileJob& job : split->schedule().queue) {
      if (job.n_block != 0) continue;
      const int32_t first = (job.node == 0 ? 64 : 448) / 2 - std::max(extra, 0) / 2;
      EXPECT_EQ(job.k_block_begin, job.split == 0 ? 0 : first) << "node " << job.node << " split " << int{job.split};
      EXPECT_EQ(job.k_block_end, job.split == 0 ? first : (job.node == 0 ? 64 : 448));
    }
  }
  options.last_split_extra_k_blocks = 4;
  absl::StatusOr<Plan> off_stage = runtime.Compile(UpDownGraph(64, true), options);
  ASSERT_TRUE(off_stage.ok()) << off_stage.status();
  EXPECT_EQ(off_stage->schedule().tile.n, kernel::NarrowConfig::kBlockN);
  EXPECT_NE(off_stage->Explain().find("the second 4 k-blocks of 64 longer)"), std::string::npos)
      << off_stage->Explain();
  options.last_split_extra_k_blocks = -1;
  absl::StatusOr<Plan> plan = runtime.Compile(UpDownGraph(64, true));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->Explain().find("pair split"), std::string::npos) << plan->Explain();
}

// The wide split (CompileOptions::narrow_wide_split) is taken where it
// applies: 33-64 rows on the narrow kernel with two consumer warpgroups,
// every node's K split in four on stage boundaries (K a multiple of 1024).
// There the plan's tiles are 64 x 128, every node splits K in four with the
// last quarter summing, the B stages are 64 KiB, two of them, and Explain
// says so; the kernel's wide instantiation. Elsewhere the plan keeps its
// other tiles and Explain says the split was not taken and why. Asked for
// beside the pair split (kOn), Compile refuses the pair of options.
TEST(RuntimeTest, NarrowWideSplitIsTakenWhereItApplies) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  constexpr char kTaken[] = "x 128 tiles over each quarter of K, the last quarter summing (wide split)), 132 CTAs "
                            "of 2 consumer warpgroups";
  constexpr char kNotTaken[] = "wide split: not taken (it needs the narrow kernel, 33-64 rows, two consumer "
                               "warpgroups, and every node's K split in four at multiples of 256";
  CompileOptions options;
  options.narrow_wide_split = true;
  struct Taken {
    std::string what;
    GemmGraph graph;
    int k_blocks;  // the first node's
  };
  const std::vector<Taken> taken = {{"33 rows", UpDownGraph(33, true), 64},
                                    {"48 rows", UpDownGraph(48, true), 64},
                                    {"64 rows", UpDownGraph(64, true), 64},
                                    {"K of 3072", Layers(2, 64, 3072, /*chained=*/true, /*k=*/3072), 48}};
  for (const Taken& c : taken) {
    SCOPED_TRACE(c.what);
    absl::StatusOr<Plan> plan = runtime.Compile(c.graph, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ExpectNarrowSplitPlan(*plan, kernel::NarrowConfig::kBlockM, kernel::NarrowConfig::kWideSplitBlockN, 4);
    if (HasFatalFailure()) return;
    for (const sched::TileJob& job : plan->schedule().queue) {
      if (job.node != 0 || job.n_block != 0) continue;
      EXPECT_EQ(job.k_block_begin, job.split * c.k_blocks / 4);
      EXPECT_EQ(job.k_block_end, (job.split + 1) * c.k_blocks / 4);
    }
    const std::string explain = plan->Explain();
    EXPECT_NE(explain.find(kTaken), std::string::npos) << explain;
    EXPECT_NE(explain.find("B 2 stages of 65536 bytes (1 in flight), next job claimed at 8 B stages left"),
              std::string::npos)
        << explain;
    EXPECT_NE(explain.find("multiply: wgmma m64n64k16 in both consumer warpgroups, each 64 of the tile's 128 "
                           "columns"),
              std::string::npos)
        << explain;
    EXPECT_EQ(explain.find("not taken"), std::string::npos) << explain;
    const uint32_t tile_rows = kernel::NarrowConfig::ATileRows(
        static_cast<uint32_t>(kernel::NarrowConfig::AStageBytes(plan->schedule().nodes[0].m)));
    EXPECT_EQ(kernel::NarrowConfig::InstantiationFor(tile_rows, plan->schedule().tile.m, /*tagged_handoffs=*/false,
                                                     kernel::NarrowConfig::Split::kWide),
              kernel::NarrowConfig::Instantiation::kWideSplit);
  }
  // Not taken: 32 rows (the paired wgmma path), 65 rows (two row blocks or
  // the tall pair split), one consumer warpgroup; K of 1536 (24 k-blocks:
  // quarters of 6, off a stage) and of 768 (quarters of 3, under a stage).
  struct NotTaken {
    std::string what;
    GemmGraph graph;
    int consumers = 0;
  };
  const std::vector<NotTaken> cases = {{"32 rows", UpDownGraph(32, true)},
                                       {"65 rows", UpDownGraph(65, true)},
                                       {"64 rows, one consumer", UpDownGraph(64, true), 1},
                                       {"K of 1536", Layers(2, 64, 1536, /*chained=*/true, /*k=*/1536)},
                                       {"K of 768", DecodePair(64)}};
  options.kernel = KernelChoice::kNarrow;
  options.narrow_pair_split = PairSplitChoice::kOff;
  for (const NotTaken& c : cases) {
    SCOPED_TRACE(c.what);
    options.narrow_consumers = c.consumers;
    ExpectNarrowSplitNotTaken(runtime, c.graph, options, kNotTaken);
  }
  options.narrow_consumers = 0;
  options.narrow_pair_split = PairSplitChoice::kOn;
  const absl::StatusOr<Plan> both = runtime.Compile(UpDownGraph(64, true), options);
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(both.status().message().find("narrow_wide_split and narrow_pair_split = kOn"), absl::string_view::npos)
      << both.status();
  absl::StatusOr<Plan> plan = runtime.Compile(UpDownGraph(64, true));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->Explain().find("wide split"), std::string::npos) << plan->Explain();
}

// CompileOptions::narrow_split_whole_tiles: with the pair split at 64 rows
// on the H200's 132 SMs, the 28672-column node's 448 tiles are 264 whole
// (one job each over all of K) and 184 split; the 4096-column node's 64
// (under two waves) all split; Explain says so. Where no split is taken it
// changes nothing; without the pair split asked for, or beside the wide
// split, Compile refuses it.
TEST(RuntimeTest, NarrowSplitWholeTilesKeepAllButTheLastWavesWhole) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  CompileOptions options;
  options.narrow_pair_split = PairSplitChoice::kOn;
  options.narrow_split_whole_tiles = true;
  absl::StatusOr<Plan> plan = runtime.Compile(UpDownGraph(64, true), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const sched::Schedule& schedule = plan->schedule();
  ASSERT_EQ(schedule.tile.n, kernel::NarrowConfig::kPairSplitBlockN);
  std::vector<int64_t> whole(2, 0), parts(2, 0);
  for (const sched::TileJob& job : schedule.queue) {
    ++(sched::WholeTileOfSplitNode(schedule.nodes[job.node], job) ? whole : parts)[job.node];
  }
  EXPECT_EQ(whole, (std::vector<int64_t>{264, 0}));
  EXPECT_EQ(parts, (std::vector<int64_t>{2 * 184, 2 * 64}));
  // The first wave is whole tiles.
  for (int i = 0; i < 132; ++i) {
    EXPECT_TRUE(sched::WholeTileOfSplitNode(schedule.nodes[0], schedule.queue[i])) << "queue position " << i;
  }
  EXPECT_NE(plan->Explain().find("but the first 264 cluster tiles multiplied whole, one job each"), std::string::npos)
      << plan->Explain();
  // kAuto takes no pair split at 64 rows: the plan is the one without the option.
  options.narrow_pair_split = PairSplitChoice::kAuto;
  absl::StatusOr<Plan> unsplit = runtime.Compile(UpDownGraph(64, true), options);
  ASSERT_TRUE(unsplit.ok()) << unsplit.status();
  EXPECT_EQ(unsplit->schedule().tile.n, kernel::NarrowConfig::kBlockN);
  EXPECT_TRUE(unsplit->schedule().whole_tiles.empty());
  // Refused without the pair split, and beside the wide split.
  for (const auto& [pair, wide, why] : {std::tuple{PairSplitChoice::kOff, false, "narrow_pair_split is kOff"},
                                        std::tuple{PairSplitChoice::kAuto, true, "narrow_wide_split is set too"}}) {
    options.narrow_pair_split = pair;
    options.narrow_wide_split = wide;
    EXPECT_TRUE(HasStatus(runtime.Compile(UpDownGraph(64, true), options).status(),
                          absl::StatusCode::kInvalidArgument,
                          {absl::StrCat("CompileOptions.narrow_split_whole_tiles: set, but ", why)}));
  }
}

// CompileOptions::narrow_split_lead_k_blocks: with the pair split, the down
// projection at 64 rows (64 tiles, 128 jobs: one wave on 132 SMs) splits K
// of 448 k-blocks at 236; gate/up (448 tiles) keeps even halves. A lead
// that would start the second half off a ring stage is rounded down: 10
// (the split at 229) to 8 (228), 4 (226) to none. Refused outside
// [0, 65535] (TileJob's 16-bit k-blocks), and beside what else sets the
// halves' lengths or no pair split.
TEST(RuntimeTest, NarrowSplitLeadLengthensTheFirstHalfOnNodesOfOneWave) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  CompileOptions options;
  options.narrow_pair_split = PairSplitChoice::kOn;
  options.narrow_split_lead_k_blocks = 24;
  absl::StatusOr<Plan> plan = runtime.Compile(UpDownGraph(64, true), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const sched::Schedule& schedule = plan->schedule();
  ASSERT_EQ(schedule.tile.n, kernel::NarrowConfig::kPairSplitBlockN);
  const int32_t split_at[] = {32, 236};
  for (const sched::TileJob& job : schedule.queue) {
    EXPECT_EQ(job.k_block_begin, job.split == 0 ? 0 : split_at[job.node]) << "node " << job.node;
    EXPECT_EQ(job.k_block_end, job.split == 0 ? split_at[job.node] : schedule.nodes[job.node].k_blocks);
  }
  EXPECT_NE(plan->Explain().find("(24 k-blocks shorter than the first)"), std::string::npos) << plan->Explain();
  for (const auto& [lead, taken] : {std::pair{10, 8}, {4, 0}}) {
    options.narrow_split_lead_k_blocks = lead;
    absl::StatusOr<Plan> rounded = runtime.Compile(UpDownGraph(64, true), options);
    ASSERT_TRUE(rounded.ok()) << rounded.status();
    EXPECT_EQ(rounded->schedule().tile.n, kernel::NarrowConfig::kPairSplitBlockN);
    EXPECT_EQ(rounded->schedule().nodes[1].last_split_extra_k_blocks, -taken) << "lead " << lead;
    EXPECT_EQ(rounded->schedule().nodes[0].last_split_extra_k_blocks, 0) << "lead " << lead;
  }
  for (const int lead : {-8, 65536}) {
    options.narrow_split_lead_k_blocks = lead;
    EXPECT_TRUE(HasStatus(runtime.Compile(UpDownGraph(64, true), options).status(),
                          absl::StatusCode::kInvalidArgument,
                          {absl::StrCat("CompileOptions.narrow_split_lead_k_blocks: ", lead, " is outside [0, 65535]")}));
  }
  options.narrow_split_lead_k_blocks = 8;
  for (const auto& [pair, wide, extra, why] :
       {std::tuple{PairSplitChoice::kOff, false, -1, "narrow_pair_split is kOff"},
        std::tuple{PairSplitChoice::kAuto, true, -1, "narrow_wide_split is set too"},
        std::tuple{PairSplitChoice::kOn, false, 8, "last_split_extra_k_blocks lengthens it"}}) {
    options.narrow_pair_split = pair;
    options.narrow_wide_split = wide;
    options.last_split_extra_k_blocks = extra;
    EXPECT_TRUE(HasStatus(runtime.Compile(UpDownGraph(64, true), options).status(),
                          absl::StatusCode::kInvalidArgument,
                          {absl::StrCat("CompileOptions.narrow_split_lead_k_blocks: 8, but ", why)}));
  }
}

// Past 64 rows the pair split is one row block of up to 128 rows (the
// scheduler's tile 128 x 64, so one m block), both consumer warpgroups on
// every job (two by default even for a chain of one-wave layers, which
// otherwise gets one), A stages of all the rows (rounded up to 8: 36 KiB
// at 65 rows, 64 KiB at 128), as many as leave three B stages of 32 KiB
// (3 at 65 rows, 2 at 100 and 128), and B stages in what is left (3); the
// kernel's tall instantiation. Not taken where the options ask for one
// consumer warpgroup (the 65-row case above).
TEST(RuntimeTest, TallPairSplitIsOneRowBlockOnBothWarpgroups) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  CompileOptions options;
  options.kernel = KernelChoice::kNarrow;
  options.narrow_pair_split = PairSplitChoice::kOn;
  for (const auto& [rows, a_stages] : {std::pair<int64_t, int>{65, 3}, {100, 2}, {128, 2}}) {
    SCOPED_TRACE(absl::StrCat(rows, " rows"));
    for (const bool chain : {false, true}) {
      SCOPED_TRACE(chain ? "8-layer chain" : "MLP");
      const GemmGraph graph = chain ? Layers(8, rows, 4096, /*chained=*/true) : UpDownGraph(rows, true);
      absl::StatusOr<Plan> plan = runtime.Compile(graph, options);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ExpectNarrowSplitPlan(*plan, kernel::NarrowConfig::kMaxRows, kernel::NarrowConfig::kPairSplitBlockN, 2);
      if (HasFatalFailure()) return;
      const int64_t tile_rows = (rows + 7) / 8 * 8;
      const std::string explain = plan->Explain();
      EXPECT_NE(explain.find(absl::StrCat("narrow decode kernel (128 x 64 tiles over each half of K, the second half "
                                          "summing (pair split)), 132 CTAs of 2 consumer warpgroups, rings: A ",
                                          a_stages, " stages of ", 4 * tile_rows * 128,
                                          " bytes, B 3 stages of 32768 bytes (2 in flight)")),
                std::string::npos)
          << explain;
      EXPECT_NE(explain.find(absl::StrCat("multiply: wgmma m64n64k16 in both consumer warpgroups, each 64 of the "
                                          "tokens (A tiles of ",
                                          tile_rows, " rows)")),
                std::string::npos)
          << explain;
      EXPECT_EQ(kernel::NarrowConfig::InstantiationFor(static_cast<uint32_t>(tile_rows), plan->schedule().tile.m,
                                                       /*tagged_handoffs=*/false, kernel::NarrowConfig::Split::kPair),
                kernel::NarrowConfig::Instantiation::kTallPairSplit);
    }
  }
  EXPECT_EQ(kernel::NarrowConfig::InstantiationFor(64, kernel::NarrowConfig::kBlockM, false,
                                                   kernel::NarrowConfig::Split::kPair),
            kernel::NarrowConfig::Instantiation::kPairSplit);
}

// PairSplitChoice::kAuto (the default) takes the pair split only past 64
// rows, and only where every node has at least three quarters of a wave of
// its jobs (99 on the H200's 132 SMs; a node's jobs are two a 64-column
// tile): the 8-layer 4096 chain (128 jobs a layer) at 65-128 rows, as
// KernelChoice::kAuto picks the narrow kernel for it, and the MLP block on
// the narrow kernel; not the chain at 64 rows, nor nodes of 3136 columns (98
// jobs; 3200 have 100) or 2048, nor with one consumer warpgroup asked for,
// nor under kOff. Explain says where the plan chose it and with how many
// jobs at fewest; where kAuto leaves it off, Explain says nothing of it.
TEST(RuntimeTest, PairSplitChoiceAutoTakesTheTallSplitWhereEveryNodeFillsTheChip) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  const auto pair_split = [](const Plan& plan) {
    return plan.schedule().tile.n == kernel::NarrowConfig::kPairSplitBlockN;
  };
  for (const int64_t rows : {65, 100, 128}) {
    SCOPED_TRACE(absl::StrCat(rows, " rows"));
    absl::StatusOr<Plan> plan = runtime.Compile(Layers(8, rows, 4096, /*chained=*/true));
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->kernel(), KernelChoice::kNarrow);
    EXPECT_TRUE(pair_split(*plan));
    EXPECT_EQ(plan->schedule().tile.m, kernel::NarrowConfig::kMaxRows);
    EXPECT_NE(plan->Explain().find("pair split: chosen by the plan (65-128 rows, and every node has at least three "
                                   "quarters of a wave of its jobs: 128 at fewest on 132 SMs)\n"),
              std::string::npos)
        << plan->Explain();
    absl::StatusOr<Plan> mlp = runtime.Compile(UpDownGraph(rows, true), {.kernel = KernelChoice::kNarrow});
    ASSERT_TRUE(mlp.ok()) << mlp.status();
    EXPECT_TRUE(pair_split(*mlp));
    EXPECT_NE(mlp->Explain().find("128 at fewest on 132 SMs"), std::string::npos) << mlp->Explain();
    // 3200 columns: 50 tiles, 100 jobs; 3136: 49 tiles, 98 jobs.
    absl::StatusOr<Plan> wide = runtime.Compile(Layers(2, rows, 3200, /*chained=*/false));
    ASSERT_TRUE(wide.ok()) << wide.status();
    EXPECT_TRUE(pair_split(*wide));
    EXPECT_NE(wide->Explain().find("100 at fewest on 132 SMs"), std::string::npos) << wide->Explain();
    struct Case {
      std::string what;
      GemmGraph graph;
      CompileOptions options;
    };
    const std::vector<Case> off = {
        {"3136 columns", Layers(2, rows, 3136, /*chained=*/false), {}},
        {"2048 columns", Layers(8, rows, 2048, /*chained=*/true, /*k=*/2048), {}},
        {"one consumer", Layers(8, rows, 4096, /*chained=*/true), {.narrow_consumers = 1}},
        {"kOff", Layers(8, rows, 4096, /*chained=*/true), {.narrow_pair_split = PairSplitChoice::kOff}}};
    for (const Case& c : off) {
      SCOPED_TRACE(c.what);
      absl::StatusOr<Plan> not_split = runtime.Compile(c.graph, c.options);
      ASSERT_TRUE(not_split.ok()) << not_split.status();
      ASSERT_EQ(not_split->kernel(), KernelChoice::kNarrow);
      EXPECT_FALSE(pair_split(*not_split));
      EXPECT_EQ(not_split->schedule().tile.m, ((rows + 1) / 2 + 7) / 8 * 8);
      EXPECT_EQ(not_split->Explain().find("pair split"), std::string::npos) << not_split->Explain();
    }
  }
  // 33-64 rows: off under kAuto, even for the chain.
  absl::StatusOr<Plan> plan = runtime.Compile(Layers(8, 64, 4096, /*chained=*/true));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(pair_split(*plan));
  EXPECT_EQ(plan->Explain().find("pair split"), std::string::npos) << plan->Explain();
}

// The pair split's B stages are 32 KiB: A stages that leave room for fewer
// than two of them are refused, naming the option, the bytes left and the
// pair split's stage size; without the pair split the same A ring fits.
TEST(RuntimeTest, PairSplitRingsThatDoNotFitSayTheirStageSize) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  CompileOptions options;
  options.narrow_a_stages = 6;  // 6 x 32 KiB at 64 rows
  ASSERT_TRUE(runtime.Compile(UpDownGraph(64, true), options).ok());
  options.narrow_pair_split = PairSplitChoice::kOn;
  EXPECT_TRUE(HasStatus(runtime.Compile(UpDownGraph(64, true), options).status(),
                        absl::StatusCode::kFailedPrecondition,
                        {"CompileOptions.narrow_a_stages = 6", "less than two B stages of 32768 bytes"}));
}

TEST(RuntimeTest, BadRingOptionsAreInvalidArgument) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  CompileOptions lockstep;
  lockstep.ring_mode = RingMode::kLockstep;
  lockstep.a_stages = 4;
  lockstep.b_stages = 3;
  absl::StatusOr<Plan> plan = runtime.Compile(OneGemm(), lockstep);
  EXPECT_TRUE(HasStatus(plan.status(), absl::StatusCode::kInvalidArgument, {"a_stages == b_stages"}));

  CompileOptions negative_stages;
  negative_stages.a_stages = -1;
  plan = runtime.Compile(OneGemm(), negative_stages);
  EXPECT_TRUE(HasStatus(plan.status(), absl::StatusCode::kInvalidArgument, {"a_stages: -1", "{0} and [2, 8]"}));
}

// Every option is range-checked whichever kernel the plan runs on, the
// other kernel's options too: on the tiled kernel (OneGemm) and the narrow
// one (a one-row graph, KernelChoice::kAuto).
TEST(RuntimeTest, BadOptionsAreRefusedOnEitherKernel) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  ASSERT_EQ(runtime.Compile(OneGemm())->kernel(), KernelChoice::kTiled);
  ASSERT_EQ(runtime.Compile(DecodePair(1))->kernel(), KernelChoice::kNarrow);
  struct Case {
    void (*set)(CompileOptions&);
    std::vector<std::string> message;
  };
  const Case cases[] = {
      {[](CompileOptions& o) { o.spin_timeout_ns = 0; }, {"spin_timeout_ns: 0", "[1, 1152921504606846976]"}},
      {[](CompileOptions& o) { o.spin_timeout_ns = -5; }, {"spin_timeout_ns: -5", "[1, 1152921504606846976]"}},
      // Four times this wraps in the kernel's 64-bit arithmetic: every wait
      // would give up at once.
      {[](CompileOptions& o) { o.spin_timeout_ns = int64_t{1} << 62; },
       {"spin_timeout_ns: 4611686018427387904", "[1, 1152921504606846976]"}},
      {[](CompileOptions& o) { o.max_clusters = -1; }, {"max_clusters: -1", "negative"}},
      // A narrow plan's scheduler gets a split_k of its own, so this one is
      // checked before.
      {[](CompileOptions& o) { o.split_k = -1; }, {"CompileOptions.split_k must be in [0, 256]", "got -1"}},
      {[](CompileOptions& o) { o.a_stages = 9; }, {"a_stages: 9", "{0} and [2, 8]"}},
      {[](CompileOptions& o) { o.b_stages = -3; }, {"b_stages: -3", "{0} and [2, 8]"}},
      // One slot would wait for itself (the consumers free a slot once the
      // next is full): a hang the watchdog reported, before this check.
      {[](CompileOptions& o) { o.a_stages = 1; }, {"a_stages: 1", "[2, 8]"}},
      {[](CompileOptions& o) { o.b_stages = 1; }, {"b_stages: 1", "[2, 8]"}},
      {[](CompileOptions& o) { o.ring_mode = static_cast<RingMode>(7); },
       {"ring_mode: 7", "not one of kSplit (0), kLockstep (1)"}},
      {[](CompileOptions& o) { o.kernel = static_cast<KernelChoice>(5); },
       {"kernel: 5", "not one of kAuto, kTiled, kNarrow"}},
      {[](CompileOptions& o) { o.narrow_pair_split = static_cast<PairSplitChoice>(3); },
       {"narrow_pair_split: 3", "not one of kAuto, kOn, kOff"}},
      {[](CompileOptions& o) { o.tile_n = 64; }, {"tile_n: 64", "not 0, 128 or 256"}},
      {[](CompileOptions& o) { o.tile_n = -256; }, {"tile_n: -256", "not 0, 128 or 256"}},
      {[](CompileOptions& o) { o.narrow_a_stages = -1; }, {"narrow_a_stages: -1", "{0} and [2, 16]"}},
      {[](CompileOptions& o) { o.narrow_a_stages = 1; }, {"narrow_a_stages: 1", "{0} and [2, 16]"}},
      {[](CompileOptions& o) { o.narrow_b_stages = -1; }, {"narrow_b_stages: -1", "[2, 16]"}},
      {[](CompileOptions& o) { o.narrow_b_in_flight = 1000; }, {"narrow_b_in_flight: 1000", "[0, 15]"}},
      {[](CompileOptions& o) { o.narrow_b_stages = 17; }, {"narrow_b_stages: 17", "[2, 16]"}},
      {[](CompileOptions& o) { o.narrow_consumers = 3; }, {"narrow_consumers: 3", "[0, 2]"}},
      {[](CompileOptions& o) { o.narrow_consumers = -1; }, {"narrow_consumers: -1", "[0, 2]"}},
      {[](CompileOptions& o) { o.narrow_claim_stages = 100000; }, {"narrow_claim_stages: 100000", "[0, 4096]"}},
      // Each range's first value outside it (the cases above are far
      // outside).
      {[](CompileOptions& o) { o.spin_timeout_ns = kMaxSpinTimeoutNs + 1; },
       {"spin_timeout_ns: 1152921504606846977", "[1, 1152921504606846976]"}},
      {[](CompileOptions& o) { o.narrow_b_in_flight = 16; }, {"narrow_b_in_flight: 16", "[0, 15]"}},
      {[](CompileOptions& o) { o.narrow_claim_stages = -1; }, {"narrow_claim_stages: -1", "[0, 4096]"}},
      {[](CompileOptions& o) { o.narrow_claim_stages = kMaxNarrowClaimStages + 1; },
       {"narrow_claim_stages: 4097", "[0, 4096]"}},
      {[](CompileOptions& o) { o.split_k = 257; }, {"CompileOptions.split_k must be in [0, 256]", "got 257"}},
      // Checked by the scheduler, whose options carry the same names; the
      // message names CompileOptions.
      {[](CompileOptions& o) { o.group_size = -1; }, {"CompileOptions.group_size must be >= 0, got -1"}},
      {[](CompileOptions& o) { o.reduce_part_rows = 17; },
       {"CompileOptions.reduce_part_rows must be in [0, 16]", "got 17"}},
      {[](CompileOptions& o) { o.last_split_extra_k_blocks = -2; },
       {"CompileOptions.last_split_extra_k_blocks", "got -2"}},
  };
  for (const GemmGraph& graph : {OneGemm(), DecodePair(1)}) {
    for (const Case& c : cases) {
      CompileOptions options;
      c.set(options);
      EXPECT_TRUE(HasStatus(runtime.Compile(graph, options).status(), absl::StatusCode::kInvalidArgument, c.message))
          << c.message[0] << " on " << graph.nodes().size() << " node(s)";
    }
  }
}

TEST(RuntimeTest, SplitKOptionIsHonouredAndBoundsChecked) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  CompileOptions split;
  split.split_k = 3;
  absl::StatusOr<Plan> plan = runtime.Compile(OneGemm(), split);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->schedule().nodes[0].split_k, 3);
  EXPECT_GT(plan->schedule().workspace_elements, 0);

  for (const int bad : {-1, 1000}) {
    CompileOptions options;
    options.split_k = bad;
    plan = runtime.Compile(OneGemm(), options);
    EXPECT_TRUE(HasStatus(plan.status(), absl::StatusCode::kInvalidArgument, {"split_k", std::to_string(bad)}))
        << bad;
  }
}

TEST(RuntimeTest, ReducePartOptionsAreHonouredAndBoundsChecked) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  GemmGraph decode;  // 64 tokens, whole 256-column tiles: reduced in parts when split
  decode.AddGemm("proj", Fake("x", 0x100000, 64, 1024), Fake("w", 0x10000000, 768, 1024),
                 Fake("y", 0x20000000, 64, 768));
  CompileOptions options;
  options.split_k = 3;
  absl::StatusOr<Plan> plan = runtime.Compile(decode, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->schedule().nodes[0].reduce_parts, 8);
  EXPECT_EQ(plan->schedule().nodes[0].reduce_part_rows, 8);
  options.reduce_part_rows = 16;
  plan = runtime.Compile(decode, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->schedule().nodes[0].reduce_parts, 4);
  EXPECT_EQ(plan->schedule().nodes[0].reduce_part_rows, 16);
  options.reduce_in_parts = false;  // each tile summed whole: by its last split, or one reduce job
  plan = runtime.Compile(decode, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->schedule().nodes[0].reduce_parts, 0);
  options.sum_in_last_split = false;
  plan = runtime.Compile(decode, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->schedule().nodes[0].reduce_parts, 1);

  for (const int bad : {-1, 17}) {
    options.reduce_part_rows = bad;
    plan = runtime.Compile(decode, options);
    EXPECT_TRUE(HasStatus(plan.status(), absl::StatusCode::kInvalidArgument,
                          {"reduce_part_rows", "[0, 16]", std::to_string(bad)}))
        << bad;
  }
}

// CompileOptions::last_split_extra_k_blocks reaches the schedule (the jobs'
// k ranges with it: scheduler_lower_test) and is bounds-checked by Compile.
TEST(RuntimeTest, LastSplitExtraIsHonouredAndBoundsChecked) {
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  GemmGraph layer;  // 300 rows: three row blocks split in two, the last split sums
  layer.AddGemm("proj", Fake("x", 0x100000, 300, 4096), Fake("w", 0x10000000, 4096, 4096),
                Fake("y", 0x20000000, 300, 4096));
  CompileOptions options;
  absl::StatusOr<Plan> plan = runtime.Compile(layer, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->schedule().nodes[0].last_split_extra_k_blocks, sched::kLastSplitExtraKBlocks);
  options.last_split_extra_k_blocks = 9;
  plan = runtime.Compile(layer, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->schedule().nodes[0].last_split_extra_k_blocks, 9);
  for (const int bad : {-2, 65536}) {
    options.last_split_extra_k_blocks = bad;
    plan = runtime.Compile(layer, options);
    EXPECT_TRUE(HasStatus(plan.status(), absl::StatusCode::kInvalidArgument,
                          {"last_split_extra_k_blocks", std::to_string(bad)}))
        << bad;
  }
}

TEST(RuntimeTest, InvalidGraphIsRefusedByCompile) {
  GemmGraph graph;
  graph.AddGemm("bad", Fake("x", 0x100000, 64, 128), Fake("w", 0x10000000, 64, 96), Fake("y", 0x20000000, 64, 64));
  absl::StatusOr<Plan> plan = Runtime::ForDescription(DeviceDescription::H200()).Compile(graph);
  EXPECT_TRUE(HasStatus(plan.status(), absl::StatusCode::kInvalidArgument, {"\"bad\""}));
}

// A graph past the node limit is refused before Validate, whose checks
// across nodes take minutes at this size.
TEST(RuntimeTest, TooManyNodesAreRefusedBeforeValidation) {
  GemmGraph graph;
  for (int64_t i = 0; i <= sched::kMaxNodes; ++i) {
    const uintptr_t base = 0x100000 + static_cast<uintptr_t>(i) * 0x10000;
    graph.AddGemm("n", Fake("x", base, 1, 64), Fake("w", base + 0x1000, 8, 64), Fake("y", base + 0x8000, 1, 8));
  }
  absl::StatusOr<Plan> plan = Runtime::ForDescription(DeviceDescription::H200()).Compile(graph);
  EXPECT_TRUE(HasStatus(plan.status(), absl::StatusCode::kInvalidArgument, {"65536 nodes exceed 65535"}));
}

// A node of 2^31 - 1 rows and 25600 columns has ~8.4e8 cluster jobs: refused
// by its count, naming the node, before the queue is built (building it ran
// Compile out of host memory).
TEST(RuntimeTest, TooManyJobsAreRefusedBeforeTheQueueIsBuilt) {
  const int64_t rows = std::numeric_limits<int32_t>::max();
  GemmGraph graph;
  graph.AddGemm("huge", Fake("x", uintptr_t{1} << 40, rows, 64), Fake("w", uintptr_t{1} << 39, 25600, 64),
                Fake("y", uintptr_t{1} << 42, rows, 25600));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  absl::StatusOr<Plan> plan = Runtime::ForDescription(DeviceDescription::H200()).Compile(graph);
  EXPECT_TRUE(HasStatus(plan.status(), absl::StatusCode::kInvalidArgument,
                        {"jobs exceed 16777216", "the most a plan queues", "node \"huge\" has"}));
}

// A consumer of whole producer rows waits on a unit a row block while the
// queue is ordered, not on each tile it reads: a two-layer chain of 262144
// rows, 131072 wide (1048576 jobs, 172 GB of device data) compiled in
// 75 s and 8.6 GB of host memory with a unit a tile, and 1.8 s and 0.2 GB
// with one a row block (this machine, Release). The bound leaves a
// loaded CI machine room, not the old cost.
TEST(RuntimeTest, LargeChainsCompileInSeconds) {
  const int64_t rows = 262144, width = 131072;
  const auto view = [](const char* name, int shift, int64_t r, int64_t c) {
    return Fake(name, uintptr_t{1} << shift, r, c);
  };
  GemmGraph graph;
  graph.AddGemm("producer", view("x", 44, rows, 64), view("w1", 45, width, 64), view("h", 46, rows, width));
  graph.AddGemm("consumer", view("h", 46, rows, width), view("w2", 47, width, width), view("y", 48, rows, width));
  const auto start = std::chrono::steady_clock::now();
  const absl::StatusOr<Plan> plan = Runtime::ForDescription(DeviceDescription::H200()).Compile(graph);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->schedule().queue.size(), size_t{1048576});
  EXPECT_LT(seconds, 30.0);
}

// More output tiles than the int32 flag indices hold: the message names the
// node and the count it reaches.
TEST(RuntimeTest, TooManyTileFlagsNameTheNode) {
  const int64_t rows = std::numeric_limits<int32_t>::max();
  GemmGraph graph;
  graph.AddGemm("small", Fake("a", 0x100000, 64, 64), Fake("b", 0x200000, 64, 64), Fake("c", 0x300000, 64, 64));
  graph.AddGemm("huge", Fake("x", uintptr_t{1} << 40, rows, 64), Fake("w", uintptr_t{1} << 39, 40960, 64),
                Fake("y", uintptr_t{1} << 42, rows, 40960));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  absl::StatusOr<Plan> plan = Runtime::ForDescription(DeviceDescription::H200()).Compile(graph);
  EXPECT_TRUE(HasStatus(plan.status(), absl::StatusCode::kInvalidArgument,
                        {"more than 2147483647 tile flags", "node \"huge\"'s output tiles (2684354560)",
                         "take the count to 2684354561"}));
}

TEST(RuntimeTest, CreateWithoutGpuIsFailedPrecondition) {
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0) GTEST_SKIP() << "a GPU is present";
  absl::StatusOr<Runtime> runtime = Runtime::Create(0);
  EXPECT_EQ(runtime.status().code(), absl::StatusCode::kFailedPrecondition);
}

// A time-out names what was waited on: every kind the kernel reports has its
// own words, and a value past them reads as unknown rather than as another's.
TEST(RuntimeTest, EveryWaitKindHasItsOwnName) {
  std::set<std::string> names;
  const int last = static_cast<int>(kernel::WaitKind::kNoKernelPath);
  for (int kind = static_cast<int>(kernel::WaitKind::kDependencyFlag); kind <= last; ++kind) {
    const std::string name = internal::WaitKindName(kind);
    EXPECT_NE(name, "unknown wait") << "WaitKind " << kind;
    names.insert(name);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(last));
  EXPECT_STREQ(internal::WaitKindName(static_cast<int>(kernel::WaitKind::kNone)), "unknown wait");
  EXPECT_STREQ(internal::WaitKindName(last + 1), "unknown wait");
}

// Launch and Synchronize run on the calling thread's current device, so a
// plan refuses them while another device is current instead of running its
// pointers there.
TEST(RuntimeTest, LaunchNeedsThePlansDeviceCurrent) {
  EXPECT_TRUE(internal::CheckCurrentDevice("Launch", 0, 0).ok());
  EXPECT_TRUE(internal::CheckCurrentDevice("Synchronize", 3, 3).ok());
  const absl::Status other = internal::CheckCurrentDevice("Launch", 0, 1);
  EXPECT_TRUE(HasStatus(other, absl::StatusCode::kFailedPrecondition,
                        {"Plan::Launch", "current CUDA device is 1", "compiled for device 0", "cudaSetDevice(0)"}))
      << other;
}

// A job the launched kernel has no path for is a loom bug, not a time-out:
// Internal, naming the job; every real wait stays DeadlineExceeded.
TEST(RuntimeTest, NoKernelPathIsInternalNotATimeout) {
  TimeoutRecord record;
  record.sm = 17;
  record.what = internal::WaitKindName(static_cast<int>(kernel::WaitKind::kNoKernelPath));
  const absl::Status no_path = internal::DeviceFailureStatus(static_cast<int>(kernel::WaitKind::kNoKernelPath),
                                                             record, "5 (node \"down\", m-block 0, n-block 3)", 1000);
  EXPECT_TRUE(HasStatus(no_path, absl::StatusCode::kInternal, {"no path", "job 5", "\"down\"", "SM 17"}))
      << no_path;
  for (int kind = static_cast<int>(kernel::WaitKind::kDependencyFlag);
       kind < static_cast<int>(kernel::WaitKind::kNoKernelPath); ++kind) {
    record.what = internal::WaitKindName(kind);
    record.flag = 9;
    const absl::Status waited = internal::DeviceFailureStatus(kind, record, "5", 1000);
    // A dependency flag's wait has the option's limit; every other, four
    // times it (watchdog.cuh).
    const std::string after =
        kind == static_cast<int>(kernel::WaitKind::kDependencyFlag) ? "after 1000 ns" : "after 4000 ns";
    EXPECT_TRUE(HasStatus(waited, absl::StatusCode::kDeadlineExceeded, {after, "job 5", "flag 9"})) << waited;
  }
  // The option is 64-bit: a limit past 2^31 ns is reported as set.
  const absl::Status long_wait = internal::DeviceFailureStatus(
      static_cast<int>(kernel::WaitKind::kDependencyFlag), record, "5", int64_t{3'000'000'000});
  EXPECT_TRUE(HasStatus(long_wait, absl::StatusCode::kDeadlineExceeded, {"after 3000000000 ns"})) << long_wait;
}

// The schedule of `graph` on tiles `tile`, unsplit, in clusters of
// `cluster_size`, as the tests of the runs of A flags below lower it.
absl::StatusOr<sched::Schedule> LowerUnsplit(const std::vector<sched::NodeProblem>& graph,
                                             const sched::TileShape& tile, int cluster_size) {
  sched::SchedulerOptions options;
  options.tile = tile;
  options.cluster_size = cluster_size;
  options.split_k = 1;
  return sched::Lower(graph, options);
}

// KernelNode::a_producer, the copy of a node's one A edge and its producer
// that the narrow kernel's A loader reads instead of the two records: for
// every node with one A edge (offsets into the producer's output included),
// the producer tiles the copy gives are the ones the edge and the producer's
// schedule give, for every row block and k-block; a node with no A edge, or
// with A read from two producers, gets no copy.
TEST(RuntimeTest, AProducerCopiesGiveTheProducerTilesOfTheEdge) {
  using sched::DependencyOperand;
  auto edge = [](int producer, DependencyOperand operand, int64_t row_offset = 0, int64_t col_offset = 0) {
    sched::DependencyEdge e;
    e.producer = producer;
    e.operand = static_cast<uint8_t>(operand);
    e.row_offset = row_offset;
    e.col_offset = col_offset;
    return e;
  };
  // 0: gate/up (SwiGLU); 1: down, A = 0's output; 2: A a column slice of 1's
  // output starting 96 columns in, residual 0; 3: A from both 1 and 2 (two
  // column halves of one buffer); 4: B from 2, no A edge.
  const std::vector<sched::NodeProblem> graph = {
      {.m = 100, .n = 2048, .k = 512, .swiglu = true, .dependencies = {}},
      {.m = 100, .n = 512, .k = 1024, .dependencies = {edge(0, DependencyOperand::kA)}},
      {.m = 100,
       .n = 256,
       .k = 320,
       .dependencies = {edge(1, DependencyOperand::kA, 0, 96), edge(0, DependencyOperand::kResidual)}},
      {.m = 100,
       .n = 64,
       .k = 768,
       .dependencies = {edge(1, DependencyOperand::kA), edge(2, DependencyOperand::kA, 0, -512)}},
      {.m = 100, .n = 128, .k = 256, .dependencies = {edge(2, DependencyOperand::kB)}},
  };
  for (const sched::TileShape tile : {sched::TileShape{64, 32, 64}, sched::TileShape{128, 256, 64}}) {
    absl::StatusOr<sched::Schedule> schedule = LowerUnsplit(graph, tile, /*cluster_size=*/1);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    for (int i = 0; i < static_cast<int>(graph.size()); ++i) {
      const kernel::KernelNode::AProducer copy = internal::AProducerOf(*schedule, i);
      const sched::NodeSchedule& node = schedule->nodes[i];
      if (i == 0 || i >= 3) {
        EXPECT_EQ(copy.out_tile_n, 0) << "node " << i << " has no single A edge";
        continue;
      }
      ASSERT_NE(copy.out_tile_n, 0) << "node " << i;
      const sched::DependencyEdge& e = schedule->dependencies[node.dependency_begin];
      const sched::NodeSchedule& producer = schedule->nodes[e.producer];
      EXPECT_EQ(std::tie(copy.flag_base, copy.n_blocks, copy.out_tile_n, copy.m, copy.out_cols),
                std::tie(producer.flag_base, producer.n_blocks, producer.out_tile_n, producer.m, producer.out_cols))
          << "node " << i;
      EXPECT_EQ(std::tie(copy.row_offset, copy.col_offset), std::tie(e.row_offset, e.col_offset)) << "node " << i;
      for (int mb = 0; mb < node.m_blocks; ++mb) {
        for (int kb = 0; kb < node.k_blocks; ++kb) {
          const int64_t r0 = int64_t{mb} * tile.m, c0 = int64_t{kb} * tile.k;
          const sched::TileBox want = sched::ProducerTiles(producer, tile, e, r0, r0 + tile.m, c0, c0 + tile.k);
          const sched::TileBox got = sched::ProducerTilesOffset(copy.m, copy.out_cols, copy.out_tile_n, tile.m,
                                                                copy.row_offset, copy.col_offset, r0, r0 + tile.m,
                                                                c0, c0 + tile.k);
          EXPECT_EQ(std::tie(got.m_begin, got.m_end, got.n_begin, got.n_end),
                    std::tie(want.m_begin, want.m_end, want.n_begin, want.n_end))
              << "node " << i << " m-block " << mb << " k-block " << kb << " tile.m " << tile.m;
        }
      }
    }
  }
}

// The narrow kernel's first runs of A flags, worked out at Compile: each
// granule the run covers reads exactly its tiles_per_granule flags, found
// from the node's real edge, one row of whole producer tiles; none where the
// edge walk would find more than one producer (two A edges) or no single
// edge.
TEST(RuntimeTest, FirstARunsAreTheProducerTilesEachGranuleReads) {
  using sched::DependencyOperand;
  auto edge = [](int producer, DependencyOperand operand, int64_t col_offset = 0) {
    sched::DependencyEdge e;
    e.producer = producer;
    e.operand = static_cast<uint8_t>(operand);
    e.col_offset = col_offset;
    return e;
  };
  for (const int64_t rows : {1, 16, 64, 100, 128}) {
    // 0: gate/up (SwiGLU, 16-column output tiles); 1: down, A = 0's output;
    // 2: A a slice of 1's output 96 columns in (ragged: 1's last tile column
    // is cut); 3: A from both 1 and 2 (a run from 1's edge, where k-block 0
    // reads); 4: a chain layer on 1's output, 1000 wide (ragged last tile).
    const std::vector<sched::NodeProblem> graph = {
        {.m = rows, .n = 2048, .k = 512, .swiglu = true, .dependencies = {}},
        {.m = rows, .n = 500, .k = 1024, .dependencies = {edge(0, DependencyOperand::kA)}},
        {.m = rows, .n = 256, .k = 320, .dependencies = {edge(1, DependencyOperand::kA, 96)}},
        {.m = rows,
         .n = 64,
         .k = 768,
         .dependencies = {edge(1, DependencyOperand::kA), edge(2, DependencyOperand::kA, -512)}},
        {.m = rows, .n = 1000, .k = 500, .dependencies = {edge(1, DependencyOperand::kA)}},
        // 5, 6: the two column halves of one buffer; 7 reads all of it, so its
        // run goes from 5's flags on into 6's, which follow on in each row
        // block (Lower lays out the flags of 7's producers together).
        {.m = rows, .n = 256, .k = 128, .dependencies = {}},
        {.m = rows, .n = 256, .k = 128, .dependencies = {}},
        {.m = rows,
         .n = 64,
         .k = 512,
         .dependencies = {edge(5, DependencyOperand::kA), edge(6, DependencyOperand::kA, -256)}},
    };
    absl::StatusOr<sched::Schedule> schedule =
        LowerUnsplit(graph, kernel::NarrowConfig::tile(rows), /*cluster_size=*/1);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    const sched::TileShape tile = schedule->tile;
    int runs_found = 0;
    for (int i = 0; i < static_cast<int>(graph.size()); ++i) {
      const sched::NodeSchedule& node = schedule->nodes[i];
      kernel::KernelNode::FirstARun runs[2];
      internal::FirstARunsOf(*schedule, i, internal::AProducerOf(*schedule, i), /*narrow=*/true, runs);
      for (int mb = 0; mb < 2; ++mb) {
        const kernel::KernelNode::FirstARun& run = runs[mb];
        if (i == 0 || i == 5 || i == 6 || mb >= node.m_blocks) {
          EXPECT_EQ(run.granules, 0) << rows << " rows, node " << i << " row block " << mb;
          continue;
        }
        ASSERT_GT(run.granules, 0) << rows << " rows, node " << i << " row block " << mb;
        ++runs_found;
        if (i == 7) {
          // The whole of K, in each row block.
          EXPECT_EQ(int64_t{run.granules} * node.a_wait_k_blocks * tile.k, 512) << rows << " rows, row block " << mb;
        }
        const int tiles = 1 << run.tiles_shift;
        const int64_t granule_cols = int64_t{node.a_wait_k_blocks} * tile.k;
        for (int j = 0; j < run.granules; ++j) {
          const int64_t r0 = int64_t{mb} * tile.m, c0 = j * granule_cols;
          ASSERT_LE(c0 + granule_cols, node.k) << rows << " rows, node " << i << ": granule " << j << " past K";
          // The one A edge whose producer the granule reads (node 3 has two:
          // its run is the first edge's, up to that producer's last whole tile).
          const sched::DependencyEdge* read = nullptr;
          for (int d = 0; d < node.dependency_count; ++d) {
            const sched::DependencyEdge& e = schedule->dependencies[node.dependency_begin + d];
            if (!sched::ProducerTiles(schedule->nodes[e.producer], tile, e, r0, r0 + tile.m, c0, c0 + granule_cols)
                     .empty()) {
              EXPECT_EQ(read, nullptr) << rows << " rows, node " << i << " granule " << j << " reads two edges";
              read = &e;
            }
          }
          ASSERT_NE(read, nullptr) << rows << " rows, node " << i << " granule " << j << " reads no producer";
          const sched::DependencyEdge& e = *read;
          const sched::NodeSchedule& producer = schedule->nodes[e.producer];
          const sched::TileBox box = sched::ProducerTiles(producer, tile, e, r0, r0 + tile.m, c0, c0 + granule_cols);
          EXPECT_EQ(box.m_end - box.m_begin, 1) << rows << " rows, node " << i << " granule " << j;
          EXPECT_EQ(box.n_end - box.n_begin, tiles) << rows << " rows, node " << i << " granule " << j;
          EXPECT_EQ(sched::OutputFlagIndex(producer, box.m_begin, box.n_begin), run.first_flag + j * tiles)
              << rows << " rows, node " << i << " granule " << j;
          // Whole tiles: the granule's columns are the tiles' own.
          EXPECT_EQ(int64_t{box.n_begin} * producer.out_tile_n, c0 + e.col_offset)
              << rows << " rows, node " << i << " granule " << j;
          EXPECT_LE(int64_t{box.n_end} * producer.out_tile_n, producer.out_cols)
              << rows << " rows, node " << i << " granule " << j << " reads a ragged tile";
        }
      }
    }
    EXPECT_EQ(runs_found, rows > 64 ? 10 : 5) << rows << " rows";
  }
}

// A run joins the next edge's only where that edge's flags follow on exactly
// (FirstARunOfRowBlock): four consumers whose A joins producer 0's output
// with producer 1's or 2's, either side first, cannot all find their second
// producer's flags right after their first's; those that do not must stop at
// the seam, not go on over the flags of whatever tiles lie there (after the
// first producer's, or before them).
TEST(RuntimeTest, FirstARunsJoinOnlyFlagsThatFollowOn) {
  using sched::DependencyOperand;
  auto edge = [](int producer, int64_t col_offset = 0) {
    sched::DependencyEdge e;
    e.producer = producer;
    e.operand = static_cast<uint8_t>(DependencyOperand::kA);
    e.col_offset = col_offset;
    return e;
  };
  for (const int64_t rows : {1, 16}) {
    const std::vector<sched::NodeProblem> graph = {
        {.m = rows, .n = 256, .k = 128, .dependencies = {}},
        {.m = rows, .n = 256, .k = 128, .dependencies = {}},
        {.m = rows, .n = 256, .k = 128, .dependencies = {}},
        {.m = rows, .n = 64, .k = 512, .dependencies = {edge(0), edge(2, -256)}},
        {.m = rows, .n = 64, .k = 512, .dependencies = {edge(0), edge(1, -256)}},
        {.m = rows, .n = 64, .k = 512, .dependencies = {edge(1), edge(0, -256)}},
        {.m = rows, .n = 64, .k = 512, .dependencies = {edge(2), edge(0, -256)}},
    };
    absl::StatusOr<sched::Schedule> schedule =
        LowerUnsplit(graph, kernel::NarrowConfig::tile(rows), /*cluster_size=*/1);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    const sched::TileShape tile = schedule->tile;
    for (int i = 3; i < 7; ++i) {
      const sched::NodeSchedule& node = schedule->nodes[i];
      kernel::KernelNode::FirstARun runs[2];
      internal::FirstARunsOf(*schedule, i, internal::AProducerOf(*schedule, i), /*narrow=*/true, runs);
      const kernel::KernelNode::FirstARun& run = runs[0];
      ASSERT_GT(run.granules, 0) << rows << " rows, node " << i;
      const int tiles = 1 << run.tiles_shift;
      const int64_t granule_cols = int64_t{node.a_wait_k_blocks} * tile.k;
      for (int j = 0; j < run.granules; ++j) {
        const int64_t c0 = j * granule_cols;
        ASSERT_LE(c0 + granule_cols, node.k) << rows << " rows, node " << i << ": granule " << j << " past K";
        int boxes = 0;
        for (int d = 0; d < node.dependency_count; ++d) {
          const sched::DependencyEdge& e = schedule->dependencies[node.dependency_begin + d];
          const sched::NodeSchedule& producer = schedule->nodes[e.producer];
          const sched::TileBox box = sched::ProducerTiles(producer, tile, e, 0, tile.m, c0, c0 + granule_cols);
          if (box.empty()) continue;
          ++boxes;
          EXPECT_EQ(box.n_end - box.n_begin, tiles) << rows << " rows, node " << i << " granule " << j;
          EXPECT_EQ(sched::OutputFlagIndex(producer, box.m_begin, box.n_begin), run.first_flag + j * tiles)
              << rows << " rows, node " << i << " granule " << j;
        }
        EXPECT_EQ(boxes, 1) << rows << " rows, node " << i << " granule " << j;
      }
    }
  }
}

// The tiled kernel's first runs: row block r's run is row block 0's moved on
// by r times the step to row block 1's (AProducerRun), from any granule.
// Every granule of every row block's run must read exactly the one producer
// tile it names, found from the node's real edges; nodes whose row blocks do
// not step evenly (an A read from a row offset inside a tile) get none.
TEST(RuntimeTest, TiledFirstARunsStepEvenlyOverTheRowBlocks) {
  using sched::DependencyOperand;
  auto edge = [](int producer, int64_t row_offset = 0, int64_t col_offset = 0) {
    sched::DependencyEdge e;
    e.producer = producer;
    e.operand = static_cast<uint8_t>(DependencyOperand::kA);
    e.row_offset = row_offset;
    e.col_offset = col_offset;
    return e;
  };
  for (const int tile_n : {128, 256}) {
    for (const int64_t rows : {100, 300, 512}) {
      // 0: gate/up (SwiGLU); 1: down on 0's output; 2, 3: the column halves
      // of one buffer, 4 reads all of it (one run through both); 5: A from
      // 1's rows 64 on (past one row block, its row blocks straddle 1's: no
      // run); 6: 1000 columns on 4's output, 7 on 6's (the run stops before
      // 6's ragged tile).
      const std::vector<sched::NodeProblem> graph = {
          {.m = rows, .n = 2048, .k = 512, .swiglu = true, .dependencies = {}},
          {.m = rows, .n = 1024, .k = 1024, .dependencies = {edge(0)}},
          {.m = rows, .n = 512, .k = 256, .dependencies = {}},
          {.m = rows, .n = 512, .k = 256, .dependencies = {}},
          {.m = rows, .n = 256, .k = 1024, .dependencies = {edge(2), edge(3, 0, -512)}},
          {.m = rows - 64, .n = 256, .k = 1024, .dependencies = {edge(1, 64)}},
          {.m = rows, .n = 1000, .k = 256, .dependencies = {edge(4)}},
          {.m = rows, .n = 256, .k = 1000, .dependencies = {edge(6)}},
          // 10: A's rows 0-127 from 8, the rest from 9: row block 1's run is
          // a whole row of 8's tiles past row block 0's, row block 2's a row
          // of 9's (twice as wide) past row block 1's: uneven, none.
          {.m = 128, .n = 256, .k = 64, .dependencies = {}},
          {.m = 256, .n = 512, .k = 64, .dependencies = {}},
          {.m = 384, .n = 128, .k = 256, .dependencies = {edge(8), edge(9, -128)}},
      };
      absl::StatusOr<sched::Schedule> schedule = LowerUnsplit(
          graph, {kernel::KernelConfig::kBlockM, tile_n, kernel::KernelConfig::kBlockK}, /*cluster_size=*/2);
      ASSERT_TRUE(schedule.ok()) << schedule.status();
      const sched::TileShape tile = schedule->tile;
      int runs_found = 0;
      for (int i = 0; i < static_cast<int>(graph.size()); ++i) {
        const sched::NodeSchedule& node = schedule->nodes[i];
        const std::string where = absl::StrCat(rows, " rows, ", tile_n, " wide, node ", i);
        kernel::KernelNode::FirstARun runs[2];
        internal::FirstARunsOf(*schedule, i, internal::AProducerOf(*schedule, i), /*narrow=*/false, runs);
        if (i == 0 || i == 2 || i == 3 || (i == 5 && rows > tile.m) || i >= 8) {
          EXPECT_EQ(runs[0].granules, 0) << where;
          EXPECT_EQ(runs[1].granules, 0) << where;
          continue;
        }
        ASSERT_GT(runs[0].granules, 0) << where;
        EXPECT_EQ(runs[1].granules, node.m_blocks > 1 ? runs[0].granules : 0) << where;
        EXPECT_EQ(runs[0].tiles_shift, 0) << where;
        ++runs_found;
        const int64_t granule_cols = int64_t{node.a_wait_k_blocks} * tile.k;
        if (i == 4) {
          EXPECT_EQ(runs[0].granules * granule_cols, 1024) << where << ": one run through both producers";
        }
        if (i == 7) {
          EXPECT_EQ(runs[0].granules * granule_cols, 1000 / tile_n * tile_n) << where;
        }
        for (int mb = 0; mb < node.m_blocks; ++mb) {
          const int32_t first_flag = runs[0].first_flag + mb * (runs[1].first_flag - runs[0].first_flag);
          for (int j = 0; j < runs[0].granules; ++j) {
            const int64_t r0 = int64_t{mb} * tile.m, c0 = j * granule_cols;
            ASSERT_LE(c0 + granule_cols, node.k) << where << ": granule " << j << " past K";
            int boxes = 0;
            for (int d = 0; d < node.dependency_count; ++d) {
              const sched::DependencyEdge& e = schedule->dependencies[node.dependency_begin + d];
              const sched::NodeSchedule& producer = schedule->nodes[e.producer];
              const sched::TileBox box =
                  sched::ProducerTiles(producer, tile, e, r0, r0 + tile.m, c0, c0 + granule_cols);
              if (box.empty()) continue;
              ++boxes;
              EXPECT_EQ(box.m_end - box.m_begin, 1) << where << " row block " << mb << " granule " << j;
              EXPECT_EQ(box.n_end - box.n_begin, 1) << where << " row block " << mb << " granule " << j;
              EXPECT_EQ(sched::OutputFlagIndex(producer, box.m_begin, box.n_begin), first_flag + j)
                  << where << " row block " << mb << " granule " << j;
              EXPECT_EQ(int64_t{box.n_begin} * producer.out_tile_n, c0 + e.col_offset)
                  << where << " row block " << mb << " granule " << j;
              EXPECT_LE(int64_t{box.n_end} * producer.out_tile_n, producer.out_cols)
                  << where << " row block " << mb << " granule " << j << " reads a ragged tile";
            }
            EXPECT_EQ(boxes, 1) << where << " row block " << mb << " granule " << j;
          }
        }
      }
      EXPECT_EQ(runs_found, rows > tile.m ? 4 : 5) << rows << " rows, " << tile_n << " wide";
    }
  }
}

}  // namespace
}  // namespace loom
