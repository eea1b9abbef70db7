// The runs of A's producer flags that the kernels' A loaders poll, checked on
// the CPU against what each k-block reads. A run (sched::AFlagRun) lets the
// A loader trust granule j of A once the run's flags up to j are done; that
// is sound only where granule j reads no producer tile outside them. This
// test replays the A loader of every GEMM job of compiled plans
// (WaitForAProducersAhead, dependencies.cuh) with the kernels' own run
// function (kernel::AProducerRunOf) and each poll finding the fewest
// complete granules it may (one), and checks that every producer tile each
// k-block reads is among the flags known done by then.
//
// Two layouts broke it before NodeSchedule::a_flag_runs: A's rows stacked
// from two producers that give the same columns (a run followed one edge's
// tiles past where the other's begin), and a producer's output at a column
// offset inside its tile columns (a granule of whole tiles' width then
// straddles two, which a split starting mid-run did not wait for).
#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "internal/plan_impl.h"
#include "kernel_config.h"
#include "kernel_params.h"
#include "loom/graph.h"
#include "loom/runtime.h"
#include "loom/tensor.h"
#include "narrow_config.h"
#include "testbed/testbed.h"

namespace loom {
namespace {

constexpr DType kBf16 = DType::kBF16;

// A view of `rows` x `cols` bf16 at a made-up device address (Compile reads
// no memory); `stride` 0: dense.
TensorView View(const char* name, uint64_t address, int64_t rows, int64_t cols, int64_t stride = 0) {
  return TensorView{name, reinterpret_cast<void*>(address), kBf16, rows, cols, stride == 0 ? cols : stride};
}

absl::StatusOr<Plan> CompileOnH200(const GemmGraph& graph, const CompileOptions& options) {
  return Runtime::ForDescription(DeviceDescription::H200()).Compile(graph, options);
}

// The producer tile flags A's elements [row0, row1) x [col0, col1) read, over
// every A edge of `node`.
std::set<int32_t> FlagsRead(const sched::Schedule& schedule, const sched::NodeSchedule& node, int64_t row0,
                            int64_t row1, int64_t col0, int64_t col1) {
  std::set<int32_t> flags;
  for (int d = 0; d < node.dependency_count; ++d) {
    const sched::DependencyEdge& edge = schedule.dependencies[node.dependency_begin + d];
    if (edge.operand != static_cast<uint8_t>(sched::DependencyOperand::kA)) continue;
    const sched::NodeSchedule& producer = schedule.nodes[edge.producer];
    const sched::TileBox box = sched::ProducerTiles(producer, schedule.tile, edge, row0, row1, col0, col1);
    for (int m = box.m_begin; m < box.m_end; ++m) {
      for (int n = box.n_begin; n < box.n_end; ++n) flags.insert(sched::OutputFlagIndex(producer, m, n));
    }
  }
  return flags;
}

// Replays the A loader of one job's CTA (the row block from row0, k-blocks
// [kb_begin, kb_end)) and returns the first k-block that reads a producer
// tile not known done when it is loaded, as a message ("" when none).
template <class Config>
std::string ReplayALoader(const sched::Schedule& schedule, const kernel::KernelNode& record, int64_t row0,
                          int kb_begin, int kb_end, bool narrow) {
  const sched::NodeSchedule& node = record.schedule;
  const int wait = node.a_wait_k_blocks;
  auto producer_of = [&](int p) -> const sched::NodeSchedule& { return schedule.nodes[p]; };
  // KnownARun: the run and the k-block it was found at.
  int known_kb = -1;
  sched::AFlagRun known;
  // The narrow kernel seeds a job spanning K of row block 0 or 1 with the
  // runtime's first run (narrow_gemm.cu); the tiled one reads it in
  // AProducerRunOf.
  const int64_t m_block = row0 / schedule.tile.m;
  if (narrow && kb_begin == 0 && kb_end == node.k_blocks && m_block < 2 &&
      record.first_a_run[m_block].granules > 0) {
    const kernel::KernelNode::FirstARun& first = record.first_a_run[m_block];
    known_kb = 0;
    known = {first.first_flag, first.granules, 1 << first.tiles_shift, first.tiles_shift};
  }
  std::set<int32_t> done;
  for (int kb = kb_begin; kb < kb_end;) {
    if (known_kb < 0 || kb / wait - known_kb / wait >= known.granules) {
      known = kernel::AProducerRunOf<Config::kBlockM, Config::kBlockK, Config::kMaxTilesPerGranule>(
          record, schedule.dependencies.data(), producer_of, schedule.tile, row0, kb, kb_end);
      known_kb = kb;
    }
    const int skipped = kb / wait - known_kb / wait;
    if (known.granules - skipped <= 0) {
      // WaitForProducers over kb's own k-block, every edge.
      const std::set<int32_t> box =
          FlagsRead(schedule, node, row0, row0 + schedule.tile.m, int64_t{kb} * schedule.tile.k,
                    int64_t{kb + 1} * schedule.tile.k);
      done.insert(box.begin(), box.end());
    } else {
      // The poll found one granule complete: the run's next.
      const int32_t first = known.first_flag + skipped * known.tiles_per_granule;
      for (int t = 0; t < known.tiles_per_granule; ++t) done.insert(first + t);
    }
    const int next = std::min((kb / wait + 1) * wait, kb_end);
    for (; kb < next; ++kb) {
      // What the k-block's TMA load reads: A's rows and columns inside A.
      const int64_t row1 = std::min<int64_t>(row0 + schedule.tile.m, node.m);
      const int64_t col0 = int64_t{kb} * schedule.tile.k;
      const int64_t col1 = std::min<int64_t>(col0 + schedule.tile.k, node.k);
      if (row0 >= row1 || col0 >= col1) continue;
      for (int32_t flag : FlagsRead(schedule, node, row0, row1, col0, col1)) {
        if (!done.count(flag)) {
          return absl::StrCat("rows from ", row0, ", k-blocks [", kb_begin, ", ", kb_end, "): k-block ", kb,
                              " reads producer tile flag ", flag, ", not known done");
        }
      }
    }
  }
  return "";
}

// Every GEMM job of `plan`, each CTA of its cluster, replayed: the failures
// (at most a few), each naming the node.
std::vector<std::string> UnsoundWaits(const Plan& plan) {
  const sched::Schedule& schedule = plan.schedule();
  const bool narrow = plan.kernel() == KernelChoice::kNarrow;
  std::vector<std::string> failures;
  for (const sched::TileJob& job : schedule.queue) {
    if (job.kind != static_cast<uint8_t>(sched::JobKind::kGemm)) continue;
    const sched::NodeSchedule& node = schedule.nodes[job.node];
    if (!sched::HasProducerOperand(node, sched::DependencyOperand::kA)) continue;
    kernel::KernelNode record;
    record.schedule = node;
    record.a_producer = internal::AProducerOf(schedule, job.node);
    internal::FirstARunsOf(schedule, job.node, record.a_producer, narrow, record.first_a_run);
    for (int rank = 0; rank < schedule.cluster_size; ++rank) {
      const sched::CtaTile tile = sched::CtaTileOf(job, node.share, rank);
      const int64_t row0 = int64_t{tile.m_block} * schedule.tile.m;
      const std::string failure =
          narrow ? ReplayALoader<kernel::NarrowConfig>(schedule, record, row0, job.k_block_begin, job.k_block_end,
                                                       true)
                 : ReplayALoader<kernel::KernelConfig>(schedule, record, row0, job.k_block_begin, job.k_block_end,
                                                       false);
      if (!failure.empty() && failures.size() < 4) {
        failures.push_back(absl::StrCat("node ", plan.graph().nodes()[job.node].name, " ", failure));
      }
    }
  }
  return failures;
}

constexpr uint64_t kBuffer = 0x7f0000000000, kWeights = 0x7f4000000000, kInputs = 0x7f8000000000;

// A's rows stacked from two producers that give the same columns: p writes
// rows 0-63 of every column, q rows 64-127 of the right half (the rest of A
// is an input). One row block of the tiled kernel (128 rows) reads both; a
// run from p's tiles does not wait for q's.
GemmGraph StackedProducers() {
  GemmGraph graph;
  const TensorView a = View("a", kBuffer, 128, 1024);
  graph.AddGemm("p", View("x", kInputs, 64, 64), View("wp", kWeights, 1024, 64), a.Rows(0, 64).Named("a_top"));
  graph.AddGemm("q", View("x2", kInputs + (1 << 20), 64, 64), View("wq", kWeights + (1 << 20), 512, 64),
                a.Rows(64, 64).Columns(512, 512).Named("a_bottom_right"));
  graph.AddGemm("consumer", a, View("wc", kWeights + (2 << 20), 256, 1024), View("y", kInputs + (2 << 20), 128, 256));
  return graph;
}

// A SwiGLU output 32 columns into A (128-wide tiles give 64-column output
// tiles: every 64-column granule of A straddles two), read by a split
// consumer whose splits start inside the producer's run.
GemmGraph SwiGLUAtAColumnOffset(int64_t rows) {
  GemmGraph graph;
  const TensorView a = View("a", kBuffer, rows, 192, 256);
  graph.AddGemm("up", View("x", kInputs, rows, 64), View("w_gate_up", kWeights, 256, 64),
                a.Columns(32, 128).Named("h"), Epilogue{.activation = Activation::kSwiGLU});
  graph.AddGemm("down", a, View("w_down", kWeights + (1 << 20), 128, 192), View("y", kInputs + (1 << 20), rows, 128));
  return graph;
}

TEST(AFlagRunsTest, StackedProducersAreWaitedForEachOne) {
  for (const KernelChoice kernel : {KernelChoice::kTiled, KernelChoice::kNarrow}) {
    CompileOptions options;
    options.kernel = kernel;
    absl::StatusOr<Plan> plan = CompileOnH200(StackedProducers(), options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->kernel(), kernel);
    const std::vector<std::string> failures = UnsoundWaits(*plan);
    EXPECT_TRUE(failures.empty()) << failures.front();
    if (kernel == KernelChoice::kTiled) {
      // One row block reads both producers: no runs for the consumer.
      EXPECT_EQ(plan->schedule().nodes[2].a_flag_runs, 0);
    }
  }
}

TEST(AFlagRunsTest, AnOutputInsideATileColumnIsWaitedForWhole) {
  for (const int split_k : {1, 2, 3}) {
    for (const int tile_n : {128, 256}) {
      CompileOptions options;
      options.kernel = KernelChoice::kTiled;
      options.split_k = split_k;
      options.tile_n = tile_n;
      absl::StatusOr<Plan> plan = CompileOnH200(SwiGLUAtAColumnOffset(8), options);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const std::vector<std::string> failures = UnsoundWaits(*plan);
      EXPECT_TRUE(failures.empty()) << "split_k " << split_k << ", tile_n " << tile_n << ": " << failures.front();
      EXPECT_EQ(plan->schedule().nodes[1].a_flag_runs, 0) << "split_k " << split_k << ", tile_n " << tile_n;
    }
  }
}

// The layouts the bars run keep their runs: the MLP block's down projection
// (one producer, no offset) and a layer joined from column slices (fan-in).
TEST(AFlagRunsTest, AlignedProducersSideBySideKeepTheirRuns) {
  for (const int64_t tokens : {1, 64, 128, 512}) {
    GemmGraph graph;
    const TensorView h = View("h", kBuffer, tokens, 1024);
    graph.AddGemm("gate_up", View("x", kInputs, tokens, 512), View("w_gate_up", kWeights, 2048, 512), h,
                  Epilogue{.activation = Activation::kSwiGLU});
    graph.AddGemm("down", h, View("w_down", kWeights + (8 << 20), 512, 1024),
                  View("y", kInputs + (8 << 20), tokens, 512));
    // Two nodes over the column halves of one buffer, read whole.
    const TensorView z = View("z", kBuffer + (16 << 20), tokens, 1024);
    graph.AddGemm("left", View("x2", kInputs + (16 << 20), tokens, 512),
                  View("w_left", kWeights + (16 << 20), 512, 512), z.Columns(0, 512).Named("z_left"));
    graph.AddGemm("right", View("x3", kInputs + (20 << 20), tokens, 512),
                  View("w_right", kWeights + (20 << 20), 512, 512), z.Columns(512, 512).Named("z_right"));
    graph.AddGemm("joined", z, View("w_joined", kWeights + (24 << 20), 256, 1024),
                  View("y2", kInputs + (24 << 20), tokens, 256));
    for (const KernelChoice kernel : {KernelChoice::kTiled, KernelChoice::kAuto}) {
      CompileOptions options;
      options.kernel = kernel;
      absl::StatusOr<Plan> plan = CompileOnH200(graph, options);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const std::string where =
          absl::StrCat(tokens, " tokens, ", plan->kernel() == KernelChoice::kNarrow ? "narrow" : "tiled");
      EXPECT_EQ(plan->schedule().nodes[1].a_flag_runs, 1) << where;
      EXPECT_EQ(plan->schedule().nodes[4].a_flag_runs, 1) << where;
      const std::vector<std::string> failures = UnsoundWaits(*plan);
      EXPECT_TRUE(failures.empty()) << where << ": " << failures.front();
    }
  }
}

// Random layouts of producers over one A (row bands, column pieces of
// random widths and offsets, an input's columns first or not, SwiGLU or
// not, ragged or not), on both kernels
// and tile widths, with and without forced splits: every plan's waits sound.
TEST(AFlagRunsTest, RandomProducerLayoutsWaitForEveryTileRead) {
  // A fresh seed each run, printed on failure; LOOM_TEST_SEED replays one.
  testbed::Rng seeded;
  std::mt19937_64& rng = seeded.engine();
  auto uniform = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  int plans = 0, runs_refused = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int64_t rows = std::vector<int64_t>{1, 8, 16, 33, 64, 100, 128, 200, 256}[uniform(0, 8)];
    const int64_t k = 64 * uniform(1, 24);
    const TensorView a = View("a", kBuffer, rows, k, k + 64 * uniform(0, 1));
    GemmGraph graph;
    int producers = 0;
    const int64_t row_cut = rows > 1 && uniform(0, 1) == 1 ? uniform(1, rows - 1) : rows;
    for (int band = 0; band < (row_cut < rows ? 2 : 1); ++band) {
      const int64_t band_row0 = band == 0 ? 0 : row_cut, band_rows = band == 0 ? row_cut : rows - row_cut;
      // Now and then an input's columns first, less than a k-block of them.
      const int64_t lead = uniform(0, 1) == 1 ? 16 * uniform(0, 3) : 0;
      for (int64_t col = lead; col < k && producers < 4;) {
        const int64_t width = 16 * uniform(1, (k - col) / 16);
        if (uniform(0, 2) != 0) {
          const bool swiglu = uniform(0, 3) == 0;
          const uint64_t offset = static_cast<uint64_t>(producers) << 24;
          graph.AddGemm(absl::StrCat("p", producers), View("x", kInputs + offset, band_rows, 64),
                        View("w", kWeights + offset, swiglu ? 2 * width : width, 64),
                        a.Rows(band_row0, band_rows).Columns(col, width).Named(absl::StrCat("a", producers)),
                        Epilogue{.activation = swiglu ? Activation::kSwiGLU : Activation::kNone});
          ++producers;
        }
        col += width;
      }
    }
    if (producers == 0) continue;
    const int64_t n = 64 * uniform(1, 8);
    graph.AddGemm("consumer", a, View("wc", kWeights + (uint64_t{8} << 24), n, k),
                  View("y", kInputs + (uint64_t{8} << 24), rows, n));
    for (int variant = 0; variant < 4; ++variant) {
      CompileOptions options;
      options.kernel = variant == 1 ? KernelChoice::kNarrow : KernelChoice::kTiled;
      if (variant == 2) options.tile_n = 128;
      if (variant == 3) {
        options.split_k = static_cast<int>(uniform(2, 4));
        options.tile_n = trial % 2 == 0 ? 128 : 256;
      }
      absl::StatusOr<Plan> plan = CompileOnH200(graph, options);
      if (!plan.ok()) continue;  // e.g. rows past the narrow kernel's
      ++plans;
      runs_refused += plan->schedule().nodes.back().a_flag_runs == 0;
      const std::vector<std::string> failures = UnsoundWaits(*plan);
      ASSERT_TRUE(failures.empty()) << "trial " << trial << ", variant " << variant << ": " << failures.front();
    }
  }
  // The trials reach both kinds of plan.
  EXPECT_GT(plans, 1000);
  EXPECT_GT(runs_refused, 50);
  EXPECT_GT(plans - runs_refused, 100);
}

}  // namespace
}  // namespace loom
