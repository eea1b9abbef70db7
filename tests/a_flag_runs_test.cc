// The runs of A's producer flags that the kernels' A loaders poll, checked on
// the CPU against what each k-block reads. A run (sched::AFlagRun) lets the
// A loader trust granule j of A once the run's flags up to j are done; that
// is sound only where granule j reads no producer tile outside them. This
// test replays the A loader of every GEMM job of compiled plans
// (WaitForAProducersAhead, dependencies.cuh) with the kernels' own run
// function (kernel::AProducerRunOf) and each poll finding the fewest
// complete granules it may (one), and checks that every producer tile each
// k-block reads is among the flags known done by then. It also checks the
// order of every wait the kernels make against the queue (QueueOrderTest).
// The replay is testbed/kernel_waits.h's, which compile_fuzz_test runs on its
// random plans too.
//
// Two layouts broke it before NodeSchedule::a_flag_runs: A's rows stacked
// from two producers that give the same columns (a run followed one edge's
// tiles past where the other's begin), and a producer's output at a column
// offset inside its tile columns (a granule of whole tiles' width then
// straddles two, which a split starting mid-run did not wait for).
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "loom/graph.h"
#include "loom/runtime.h"
#include "loom/tensor.h"
#include "testbed/kernel_waits.h"
#include "testbed/testbed.h"

namespace loom {
namespace {

using testbed::UnsoundWaits;
using testbed::WaitsOutOfQueueOrder;

constexpr DType kBf16 = DType::kBF16;

// A view of `rows` x `cols` bf16 at a made-up device address (Compile reads
// no memory); `stride` 0: dense.
TensorView View(const char* name, uint64_t address, int64_t rows, int64_t cols, int64_t stride = 0) {
  return TensorView{name, reinterpret_cast<void*>(address), kBf16, rows, cols, stride == 0 ? cols : stride};
}

absl::StatusOr<Plan> CompileOnH200(const GemmGraph& graph, const CompileOptions& options) {
  return Runtime::ForDescription(DeviceDescription::H200()).Compile(graph, options);
}

constexpr uint64_t kBuffer = 0x7f0000000000, kWeights = 0x7f4000000000, kInputs = 0x7f8000000000;

// A's rows stacked from two producers that give the same columns: p writes
// rows 0 to top_rows - 1 of every column, q the next 64 rows of the right
// half (the rest of A is an input). With top_rows 64, one row block of the
// tiled kernel (128 rows) reads both, and a run from p's tiles does not wait
// for q's; with 192, only row block 1 does (the second CTA of a cluster
// sharing B).
GemmGraph StackedProducers(int64_t top_rows = 64) {
  GemmGraph graph;
  const int64_t rows = top_rows + 64;
  const TensorView a = View("a", kBuffer, rows, 1024);
  graph.AddGemm("p", View("x", kInputs, top_rows, 64), View("wp", kWeights, 1024, 64),
                a.Rows(0, top_rows).Named("a_top"));
  graph.AddGemm("q", View("x2", kInputs + (1 << 20), 64, 64), View("wq", kWeights + (1 << 20), 512, 64),
                a.Rows(top_rows, 64).Columns(512, 512).Named("a_bottom_right"));
  graph.AddGemm("consumer", a, View("wc", kWeights + (2 << 20), 256, 1024), View("y", kInputs + (2 << 20), rows, 256));
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

// The replay is not blind: the stacked layout with the consumer's runs of A
// flags turned back on (as before NodeSchedule::a_flag_runs) follows p's tiles
// past where q's begin, and UnsoundWaits says so for the row block that reads q.
TEST(AFlagRunsTest, RunsOverStackedProducersAreReportedUnsound) {
  CompileOptions options;
  options.kernel = KernelChoice::kTiled;
  absl::StatusOr<Plan> plan = CompileOnH200(StackedProducers(/*top_rows=*/192), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->schedule().nodes[2].a_flag_runs, 0);
  EXPECT_TRUE(UnsoundWaits(*plan).empty());
  sched::Schedule runs_on = plan->schedule();
  runs_on.nodes[2].a_flag_runs = 1;
  const std::vector<std::string> failures = UnsoundWaits(*plan, runs_on);
  ASSERT_FALSE(failures.empty());
  EXPECT_NE(failures.front().find("node consumer rows from 128"), std::string::npos) << failures.front();
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
      const std::vector<std::string> out_of_order = WaitsOutOfQueueOrder(*plan);
      ASSERT_TRUE(out_of_order.empty()) << "trial " << trial << ", variant " << variant << ": "
                                        << out_of_order.front();
    }
  }
  // The trials reach both kinds of plan.
  EXPECT_GT(plans, 1000);
  EXPECT_GT(runs_refused, 50);
  EXPECT_GT(plans - runs_refused, 100);
}


// Made-up device addresses for the views of one graph, each 1 MiB past the
// last view's end (Compile reads no memory).
class Addresses {
 public:
  TensorView Next(const std::string& name, int64_t rows, int64_t cols) {
    const TensorView view = View(name.c_str(), next_, rows, cols);
    next_ += (static_cast<uint64_t>(rows * cols * 2) + (2 << 20)) & ~uint64_t{(1 << 20) - 1};
    return view;
  }

 private:
  uint64_t next_ = kInputs;
};

// A producer of `rows` x 64 bf16 into `out` behind a chain of `chain` nodes
// (so that it comes late in the queue), named `name`.
void AddLateProducer(GemmGraph& graph, Addresses& memory, const std::string& name, int chain, const TensorView& out) {
  TensorView a = memory.Next(name + "_in", out.rows, 64);
  const TensorView w = memory.Next(name + "_w", 64, 64);
  for (int i = 0; i < chain; ++i) {
    const TensorView h = memory.Next(absl::StrCat(name, "_h", i), out.rows, 64);
    graph.AddGemm(absl::StrCat(name, "_", i), a, w, h);
    a = h;
  }
  graph.AddGemm(name, a, w, out);
}

// A stack of `stack_rows` x 64 written by two producers, its rows from
// `top_rows` on behind a chain of `chain` nodes; "p" multiplies it into
// stack_rows x p_cols; `consumers` nodes each read rows [first, first +
// rows) of p as A, into rows x consumer_cols.
struct SlicedStack {
  int64_t stack_rows, top_rows;
  int chain;
  int64_t p_cols;
  int consumers;
  int64_t first, rows, consumer_cols;
};
GemmGraph SlicedStackGraph(const SlicedStack& c) {
  GemmGraph graph;
  Addresses memory;
  const TensorView stack = View("stack", kBuffer, c.stack_rows, 64);
  AddLateProducer(graph, memory, "top", 0, stack.Rows(0, c.top_rows).Named("stack_top"));
  AddLateProducer(graph, memory, "bottom", c.chain,
                  stack.Rows(c.top_rows, c.stack_rows - c.top_rows).Named("stack_bottom"));
  const TensorView p = memory.Next("p_out", c.stack_rows, c.p_cols);
  graph.AddGemm("p", stack, memory.Next("p_w", c.p_cols, 64), p);
  for (int i = 0; i < c.consumers; ++i) {
    graph.AddGemm(absl::StrCat("q", i), p.Rows(c.first, c.rows).Named("p_slice"),
                  memory.Next(absl::StrCat("q_w", i), c.consumer_cols, c.p_cols),
                  memory.Next(absl::StrCat("q_out", i), c.rows, c.consumer_cols));
  }
  return graph;
}

// Operands that are slices of larger outputs, ending inside a producer tile:
// the kernels wait for the producer tiles of the consumer's whole tile, and
// the queue must place those first. Before the scheduler's model of what a
// job reads took whole tiles (job_access.h), each of these queued a
// consumer ahead of a producer tile its loader waited for, and on small
// grids every CTA could end up holding such a consumer (a deadlock the GPU
// reports as DeadlineExceeded).
TEST(QueueOrderTest, SlicesOfLargerOutputsAreWaitedForInQueueOrder) {
  struct Case {
    std::string name;
    GemmGraph graph;
    KernelChoice kernel;
  };
  const Case cases[] = {
      // Rows 192-255 of 512: all in p's row block 1 (to row 256), while the
      // loaders ask for the whole 128-row tile from row 192 (row blocks 1, 2).
      {"middle rows", SlicedStackGraph({512, 256, 2, 128, 1, 192, 64, 2048}), KernelChoice::kTiled},
      // The top 300 rows of 640 by four consumers: three row blocks paired
      // along M, the pair's second CTA of the last (rows 384-511) past the
      // consumer, its loader still waiting for p's row block 3.
      {"a cluster past M", SlicedStackGraph({640, 384, 7, 512, 4, 0, 300, 256}), KernelChoice::kTiled},
      // Rows 32-63 of 128 on the narrow kernel (row blocks of 64).
      {"narrow middle rows", SlicedStackGraph({128, 64, 2, 128, 1, 32, 32, 2048}), KernelChoice::kNarrow}};
  for (const Case& c : cases) {
    for (const int max_clusters : {1, 2, 0}) {
      SCOPED_TRACE(absl::StrCat(c.name, ", max_clusters ", max_clusters));
      CompileOptions options;
      options.kernel = c.kernel;
      options.max_clusters = max_clusters;
      absl::StatusOr<Plan> plan = CompileOnH200(c.graph, options);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_EQ(plan->kernel(), c.kernel);
      const std::vector<std::string> out_of_order = WaitsOutOfQueueOrder(*plan);
      EXPECT_TRUE(out_of_order.empty()) << out_of_order.front();
      const std::vector<std::string> unsound = UnsoundWaits(*plan);
      EXPECT_TRUE(unsound.empty()) << unsound.front();
    }
  }
}

// The queue check is not blind: a consumer's job moved ahead of the producer
// of its residual is reported, as the first job, waiting for a flag
// published later.
TEST(QueueOrderTest, AJobQueuedBeforeItsResidualsProducerIsReported) {
  GemmGraph graph;
  const TensorView r = View("r", kBuffer, 128, 256);
  graph.AddGemm("p", View("x", kInputs, 128, 64), View("wp", kWeights, 256, 64), r);
  graph.AddGemm("consumer", View("x2", kInputs + (1 << 20), 128, 64), View("wc", kWeights + (1 << 20), 256, 64),
                View("y", kInputs + (2 << 20), 128, 256), Epilogue{.residual = r});
  CompileOptions options;
  options.kernel = KernelChoice::kTiled;
  absl::StatusOr<Plan> plan = CompileOnH200(graph, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(WaitsOutOfQueueOrder(*plan).empty());
  // The consumer's first job moved to the front of a copy of the queue.
  sched::Schedule reordered = plan->schedule();
  std::vector<sched::TileJob>& queue = reordered.queue;
  const auto consumer =
      std::find_if(queue.begin(), queue.end(), [](const sched::TileJob& job) { return job.node == 1; });
  ASSERT_NE(consumer, queue.end());
  std::rotate(queue.begin(), consumer, consumer + 1);
  const std::vector<std::string> failures = WaitsOutOfQueueOrder(*plan, reordered);
  ASSERT_FALSE(failures.empty());
  EXPECT_NE(failures.front().find("queue #0 (node consumer"), std::string::npos) << failures.front();
  EXPECT_NE(failures.front().find("published at #"), std::string::npos) << failures.front();
}

// Random slices of produced outputs (rows and columns anywhere inside,
// producers in two row bands, one behind a chain) read as A, B, residual or
// bias by one to three consumers, on both kernels, both tile widths, forced
// splits and small grids: every wait of every plan in queue order, and every
// A read waited for.
TEST(QueueOrderTest, RandomSlicesOfProducedOutputs) {
  // A fresh seed each run, printed on failure; LOOM_TEST_SEED replays one.
  testbed::Rng seeded;
  std::mt19937_64& rng = seeded.engine();
  auto uniform = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  int plans = 0;
  int by_operand[4] = {};  // consumers of plans that compiled: A, B, residual, bias
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t rows = std::vector<int64_t>{8, 40, 64, 100, 128, 200, 300, 513, 640}[uniform(0, 8)];
    const int64_t width = 64 * uniform(1, 6);
    GemmGraph graph;
    Addresses memory;
    const TensorView out = View("out", kBuffer, rows, 64);
    const int64_t cut = uniform(0, 1) == 1 ? uniform(1, rows - 1) : rows;
    AddLateProducer(graph, memory, "top", static_cast<int>(uniform(0, 2)), out.Rows(0, cut).Named("out_top"));
    if (cut < rows) {
      AddLateProducer(graph, memory, "bottom", static_cast<int>(uniform(0, 4)),
                      out.Rows(cut, rows - cut).Named("out_bottom"));
    }
    // What the consumers slice: `out` itself, or (wider than its 64
    // columns) a node's product of all of it.
    TensorView produced = out;
    if (width > 64) {
      produced = memory.Next("wide", rows, width);
      graph.AddGemm("widen", out, memory.Next("widen_w", width, 64), produced);
    }
    std::vector<int> operands;
    const int consumers = static_cast<int>(uniform(1, 3));
    for (int c = 0; c < consumers; ++c) {
      const std::string name = absl::StrCat("c", c);
      const int64_t r0 = uniform(0, rows - 1), r = uniform(1, rows - r0);
      const int64_t c0 = 8 * uniform(0, width / 8 - 1), cols = 8 * uniform(1, (width - c0) / 8);
      const TensorView slice = produced.Rows(r0, r).Columns(c0, cols).Named(name + "_slice");
      const int operand = static_cast<int>(uniform(0, 3));
      const int64_t n = 64 * uniform(1, 40);
      switch (operand) {
        case 0:  // A [r, cols]
          graph.AddGemm(name, slice, memory.Next(name + "_w", n, cols), memory.Next(name + "_out", r, n));
          break;
        case 1: {  // B [r, cols]: r output columns (8 of them at least, for 16-byte rows)
          const int64_t b_rows = std::max<int64_t>(8, r / 8 * 8);
          if (r0 + b_rows > rows) continue;
          const int64_t m = uniform(1, 300);
          graph.AddGemm(name, memory.Next(name + "_x", m, cols),
                        produced.Rows(r0, b_rows).Columns(c0, cols).Named(name + "_slice"),
                        memory.Next(name + "_out", m, b_rows));
          break;
        }
        case 2:  // residual [r, cols]
          graph.AddGemm(name, memory.Next(name + "_x", r, 64), memory.Next(name + "_w", cols, 64),
                        memory.Next(name + "_out", r, cols), Epilogue{.residual = slice});
          break;
        default: {  // bias [1, cols]: one row of the slice
          const int64_t m = uniform(1, 300);
          graph.AddGemm(name, memory.Next(name + "_x", m, 64), memory.Next(name + "_w", cols, 64),
                        memory.Next(name + "_out", m, cols),
                        Epilogue{.bias = produced.Rows(r0, 1).Columns(c0, cols).Named(name + "_bias")});
          break;
        }
      }
      operands.push_back(operand);
    }
    CompileOptions options;
    options.kernel = std::vector<KernelChoice>{KernelChoice::kAuto, KernelChoice::kTiled,
                                               KernelChoice::kNarrow}[uniform(0, 2)];
    options.tile_n = std::vector<int>{0, 128, 256}[uniform(0, 2)];
    options.split_k = options.kernel == KernelChoice::kNarrow ? 0 : static_cast<int>(uniform(0, 3));
    options.max_clusters = static_cast<int>(uniform(0, 3));
    absl::StatusOr<Plan> plan = CompileOnH200(graph, options);
    if (!plan.ok()) {
      // Only the narrow kernel's row limit refuses these graphs.
      ASSERT_EQ(options.kernel, KernelChoice::kNarrow) << "trial " << trial << ": " << plan.status();
      continue;
    }
    ++plans;
    for (const int operand : operands) ++by_operand[operand];
    const std::vector<std::string> out_of_order = WaitsOutOfQueueOrder(*plan);
    ASSERT_TRUE(out_of_order.empty()) << "trial " << trial << ": " << out_of_order.front() << "\n"
                                      << plan->Explain();
    const std::vector<std::string> unsound = UnsoundWaits(*plan);
    ASSERT_TRUE(unsound.empty()) << "trial " << trial << ": " << unsound.front();
  }
  // The trials reach every kind of consumer.
  EXPECT_GT(plans, 200);
  for (const int count : by_operand) EXPECT_GT(count, 30);
}

}  // namespace
}  // namespace loom
