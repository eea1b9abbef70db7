// reference_test.cc: the CPU reference executor (loom/reference.h) against the
// naive per-node loop, and the test bed's own checks. CPU only.
//
// How results are compared:
//  * Without split-K the executor and the naive loop must agree bit for bit:
//    both accumulate each output element in FP64 in k order 0..K-1 through the
//    same routine (ops::AccumulateTile) and apply the same epilogue, so any
//    difference is a scheduling bug (a tile computed from unfinished data, a
//    missed or doubled tile, a wrong k range).
//  * With split-K the executor sums split partials (each an FP64 sum in k
//    order) in split order, the naive loop one straight FP64 sum: the two FP64
//    values differ by at most ~2 K 2^-53 sum_k |a_k b_k|, which is far below
//    one ulp of the fp32 / bf16 output. After the output rounding they are
//    therefore equal unless a rounding boundary falls between them; then they
//    differ by exactly one output ulp. Accepted: every element within one ulp
//    of the output dtype, and at most 0.1% of elements (in practice none)
//    differing at all. Integer-valued data makes every partial sum exact, and
//    then split-K results must be bit-identical too.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "internal/host_memory.h"
#include "loom/graph.h"
#include "loom/ops/host_numeric.h"
#include "loom/ops/reference.h"
#include "loom/reference.h"
#include "loom/runtime.h"
#include "loom/scheduler/queue.h"
#include "loom/scheduler/schedule.h"
#include "loom/scheduler/tiling.h"
#include "testbed/testbed.h"

namespace loom {
namespace {

using testbed::HostMatrix;
using testbed::Rng;

constexpr int64_t kRaggedSizes[] = {1, 3, 63, 64, 65, 127, 129};

// Small tiles so ragged sizes up to 129 span several tiles and clusters.
sched::SchedulerOptions SmallTiles(int32_t split_k = 1, int32_t cluster_size = 2) {
  return sched::SchedulerOptions{.tile = {.m = 64, .n = 64, .k = 32},
                                 .cluster_size = cluster_size,
                                 .num_sms = 132,
                                 .max_clusters = 66,
                                 .split_k = split_k,
                                 .group_size = 0};
}

// Lowers `graph` with sched::Lower, the edges taken from GemmGraph::Dependencies().
absl::StatusOr<sched::Schedule> LowerGraph(const GemmGraph& graph,
                                           const sched::SchedulerOptions& options) {
  std::vector<sched::NodeProblem> problems;
  for (const GemmNode& node : graph.nodes()) {
    problems.push_back(sched::NodeProblem{.m = node.m(),
                                          .n = node.n(),
                                          .k = node.k(),
                                          .swiglu = node.epilogue.activation == Activation::kSwiGLU,
                                          .dependencies = {}});
  }
  for (const DataDependency& d : graph.Dependencies()) {
    problems[d.consumer].dependencies.push_back(
        sched::DependencyEdge{.producer = d.producer,
                              .operand = static_cast<uint8_t>(d.operand),
                              .whole_tensor = static_cast<uint8_t>(d.whole_tensor ? 1 : 0),
                              .row_offset = d.row_offset,
                              .col_offset = d.col_offset});
  }
  return sched::Lower(problems, options);
}

// A row stride whose byte size is a multiple of 16 (TMA's rule, which
// GemmGraph::Validate enforces), so ragged shapes stay valid graphs.
int64_t PaddedStride(DType dtype, int64_t cols) {
  const int64_t per_16_bytes = 16 / static_cast<int64_t>(DTypeSize(dtype));
  return std::max<int64_t>(per_16_bytes, (cols + per_16_bytes - 1) / per_16_bytes * per_16_bytes);
}

// A graph over host tensors, with helpers to run both executors on it.
class HostGraph {
 public:
  explicit HostGraph(Rng& rng, bool integers = false) : rng_(rng), integers_(integers) {}

  // A filled input (random in [-1, 1], or integers in [-2, 2]).
  TensorView Input(const std::string& name, DType dtype, int64_t rows, int64_t cols) {
    TensorView v = tensors_.Add(name, dtype, rows, cols, PaddedStride(dtype, cols));
    if (integers_) {
      testbed::FillIntegers(v, rng_);
    } else {
      testbed::FillRandom(v, rng_);
    }
    return v;
  }
  // An output (or intermediate) tensor, poisoned.
  TensorView Output(const std::string& name, DType dtype, int64_t rows, int64_t cols) {
    TensorView v = tensors_.Add(name, dtype, rows, cols, PaddedStride(dtype, cols));
    testbed::Poison(v);
    return v;
  }

  GemmGraph& graph() { return graph_; }
  testbed::HostTensors& tensors() { return tensors_; }

  void PoisonOutputs() {
    for (const GemmNode& node : graph_.nodes()) testbed::Poison(node.c);
  }

  // Runs RunNaiveGraph and keeps a copy of every node's output.
  std::vector<HostMatrix> NaiveOutputs() {
    PoisonOutputs();
    const absl::Status status = RunNaiveGraph(graph_);
    EXPECT_TRUE(status.ok()) << status;
    std::vector<HostMatrix> outputs;
    // Copied as bytes, so an element the loop left unwritten keeps the
    // poison pattern (CountUnwritten); a copy through set() would round a
    // bf16 poison NaN to another NaN.
    for (const GemmNode& node : graph_.nodes()) {
      HostMatrix& copy = outputs.emplace_back(node.c.dtype, node.c.rows, node.c.cols);
      const auto element_bytes = static_cast<int64_t>(node.c.element_size());
      for (int64_t r = 0; r < node.c.rows; ++r) {
        std::memcpy(copy.data() + r * copy.row_stride() * element_bytes,
                    static_cast<const std::byte*>(node.c.data) + r * node.c.row_stride * element_bytes,
                    static_cast<size_t>(node.c.cols * element_bytes));
      }
    }
    return outputs;
  }

  // Poisons the outputs, runs the executor, and expects every node's output to
  // equal `expected` exactly, with nothing outside the outputs touched.
  void ExpectExecutorMatches(const sched::Schedule& schedule, const ReferenceOptions& options,
                             const std::vector<HostMatrix>& expected) {
    SCOPED_TRACE(::testing::Message() << "simulated_sms " << options.simulated_sms << " seed "
                                      << options.seed);
    PoisonOutputs();
    const absl::Status status = RunReference(graph_, schedule, options);
    ASSERT_TRUE(status.ok()) << status;
    for (int i = 0; i < graph_.size(); ++i) {
      const GemmNode& node = graph_.nodes()[i];
      EXPECT_TRUE(testbed::CompareExactly(node.c, expected[i].view(node.c.name)))
          << "node " << i << " \"" << node.name << "\"";
    }
    ExpectGuardsIntact();
  }

  void ExpectGuardsIntact() {
    for (const auto& [name, matrix] : tensors_.all()) {
      EXPECT_TRUE(testbed::CheckGuards(*matrix, name));
    }
  }

 private:
  Rng& rng_;
  bool integers_;
  testbed::HostTensors tensors_;
  GemmGraph graph_;
};

// The value one ulp above |x| minus |x|, in `dtype` (bf16 or fp32).
double UlpOf(DType dtype, double x) {
  const float f = static_cast<float>(std::fabs(x));
  if (dtype == DType::kFP32) return std::nextafter(f, INFINITY) - f;
  const uint16_t bits = ops::DoubleToBF16(std::fabs(x));
  return ops::BF16ToFloat(static_cast<uint16_t>(bits + 1)) - ops::BF16ToFloat(bits);
}

// Split-K vs no split, as justified at the top of this file: every element
// within one output ulp, at most 0.1% of them different at all.
void ExpectWithinOneUlp(const TensorView& out, const TensorView& expected) {
  ASSERT_EQ(out.rows, expected.rows);
  ASSERT_EQ(out.cols, expected.cols);
  int64_t differing = 0;
  for (int64_t r = 0; r < out.rows; ++r) {
    for (int64_t c = 0; c < out.cols; ++c) {
      const double o = ops::LoadElement(out, r, c), e = ops::LoadElement(expected, r, c);
      ASSERT_FALSE(std::isnan(o)) << out.name << " (" << r << ", " << c << ") is NaN";
      if (o == e) continue;
      ++differing;
      EXPECT_LE(std::fabs(o - e), UlpOf(out.dtype, std::max(std::fabs(o), std::fabs(e))))
          << out.name << " (" << r << ", " << c << "): " << o << " vs " << e;
    }
  }
  EXPECT_LE(differing, std::max<int64_t>(1, out.rows * out.cols / 1000)) << out.name;
}

// --- The naive loop against hand-computed values -------------------------------

TEST(NaiveGraphTest, MatchesHandComputedProduct) {
  // A = [[1, 2, 3], [4, 5, 6]], B = [[1, 0, -1], [2, 1, 0]]: C = A·Bᵀ = [[-2, 4], [-2, 13]].
  HostMatrix a(DType::kBF16, 2, 3), b(DType::kBF16, 2, 3), c(DType::kFP32, 2, 2);
  const double av[2][3] = {{1, 2, 3}, {4, 5, 6}}, bv[2][3] = {{1, 0, -1}, {2, 1, 0}};
  for (int r = 0; r < 2; ++r) {
    for (int k = 0; k < 3; ++k) {
      a.set(r, k, av[r][k]);
      b.set(r, k, bv[r][k]);
    }
  }
  GemmGraph graph;
  graph.AddGemm("g", a.view("a"), b.view("b"), c.view("c"));
  ASSERT_TRUE(RunNaiveGraph(graph).ok());
  EXPECT_EQ(c.at(0, 0), -2.0);
  EXPECT_EQ(c.at(0, 1), 4.0);
  EXPECT_EQ(c.at(1, 0), -2.0);
  EXPECT_EQ(c.at(1, 1), 13.0);
}

// Shapes that do not chain (K 3 against 2) are refused before the loop,
// which would read past B.
TEST(NaiveGraphTest, RejectsShapesThatDoNotChain) {
  HostMatrix a(DType::kBF16, 2, 3), b(DType::kBF16, 2, 2), c(DType::kFP32, 2, 2);
  GemmGraph graph;
  graph.AddGemm("g", a.view("a"), b.view("b"), c.view("c"));
  const absl::Status status = RunNaiveGraph(graph);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find("node \"g\""), std::string::npos) << status;
}

TEST(NaiveGraphTest, RejectsMissingHostData) {
  GemmGraph graph;
  graph.AddGemm("g", TensorView::Dense("a", nullptr, DType::kBF16, 4, 8),
                TensorView::Dense("b", nullptr, DType::kBF16, 4, 8),
                TensorView::Dense("c", nullptr, DType::kFP32, 4, 4));
  const absl::Status status = RunNaiveGraph(graph);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("\"a\""), std::string::npos) << status;
}

// The loop RunNaiveGraph ran before it took C in column blocks over the
// host's cores: row by row, every element one AccumulateTile sum over all of
// K, B copied whole first.
void RowMajorNaiveNode(const GemmNode& node) {
  const int64_t m = node.m(), n = node.n(), k = node.k();
  const std::vector<double> a = ops::LoadBlock(node.a, 0, m, 0, k);
  const std::vector<double> b = ops::LoadBlock(node.b, 0, n, 0, k);
  std::vector<double> acc(static_cast<size_t>(n));
  for (int64_t row = 0; row < m; ++row) {
    std::fill(acc.begin(), acc.end(), 0.0);
    ops::AccumulateTile(a.data() + row * k, k, b.data(), k, 1, n, k, acc.data(), n);
    ops::StoreEpilogueRow(node, row, 0, acc.data(), n);
  }
}

// Column blocks of 64 (K 40; N 1000, the last block ragged), of 12 (K 40000,
// N 130) and a single block (N 2), spread over the host's cores: the bits of
// the row-major loop, with a bias and a residual, for plain, GELU and SwiGLU
// epilogues.
class NaiveBlocksTest : public ::testing::TestWithParam<std::tuple<std::pair<int64_t, int64_t>, Activation>> {};
TEST_P(NaiveBlocksTest, WriteTheRowMajorLoopsBits) {
  const auto [n_and_k, activation] = GetParam();
  const auto [n, k] = n_and_k;
  const int64_t m = 7, n_out = activation == Activation::kSwiGLU ? n / 2 : n;
  Rng rng;
  HostMatrix a(DType::kBF16, m, k), b(DType::kBF16, n, k), bias(DType::kFP32, 1, n);
  HostMatrix residual(DType::kBF16, m, n_out), c(DType::kBF16, m, n_out), expected(DType::kBF16, m, n_out);
  testbed::FillRandom(a, rng);
  testbed::FillRandom(b, rng);
  testbed::FillRandom(bias, rng);
  testbed::FillRandom(residual, rng);
  GemmGraph graph;
  graph.AddGemm("g", a.view("a"), b.view("b"), c.view("c"),
                {.activation = activation, .bias = bias.view("bias"), .residual = residual.view("residual")});
  ASSERT_TRUE(RunNaiveGraph(graph).ok());
  GemmNode row_major = graph.nodes()[0];
  row_major.c = expected.view("expected");
  RowMajorNaiveNode(row_major);
  EXPECT_TRUE(testbed::CompareExactly(c.view("c"), expected.view("expected")));
}
INSTANTIATE_TEST_SUITE_P(Shapes, NaiveBlocksTest,
                         ::testing::Combine(::testing::Values(std::pair<int64_t, int64_t>{1000, 40},
                                                              std::pair<int64_t, int64_t>{130, 40000},
                                                              std::pair<int64_t, int64_t>{2, 40}),
                                            ::testing::Values(Activation::kNone, Activation::kGELU,
                                                              Activation::kSwiGLU)));

// A C that lies over part of B (Validate refuses it; RunNaiveGraph checks
// shapes only): the node runs row by row over a copy of B taken before any
// element of C is written, as before the blocks. C covers B's rows 100-141,
// which the blocked loop would load after other blocks had written there.
TEST(NaiveGraphTest, OutputOverBIsWrittenAfterBIsRead) {
  const int64_t m = 5, n = 200, k = 24;
  Rng rng;
  HostMatrix a(DType::kBF16, m, k), b(DType::kBF16, n, k), b_before(DType::kBF16, n, k);
  HostMatrix expected(DType::kBF16, m, n);
  testbed::FillRandom(a, rng);
  testbed::FillRandom(b, rng);
  std::memcpy(b_before.data(), b.data(), static_cast<size_t>(b.body_bytes()));
  const TensorView c = TensorView::Dense("c", b.data() + 100 * b.row_stride() * 2, DType::kBF16, m, n);
  GemmGraph graph;
  graph.AddGemm("g", a.view("a"), b.view("b"), c);
  ASSERT_TRUE(RunNaiveGraph(graph).ok());
  GemmNode from_copy = graph.nodes()[0];
  from_copy.b = b_before.view("b_before");
  from_copy.c = expected.view("expected");
  RowMajorNaiveNode(from_copy);
  EXPECT_TRUE(testbed::CompareExactly(c, expected.view("expected")));
}

// --- Ragged shapes: one GEMM, every (M, N, K) of the ragged set ----------------

class RaggedShapeTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t>> {};

TEST_P(RaggedShapeTest, ExecutorMatchesNaiveLoop) {
  const auto [m, n, k] = GetParam();
  Rng rng;
  HostGraph g(rng);
  g.graph().AddGemm("gemm", g.Input("a", DType::kBF16, m, k), g.Input("b", DType::kBF16, n, k),
                    g.Output("c", DType::kBF16, m, n));
  ASSERT_TRUE(g.graph().Validate().ok()) << g.graph().Validate();
  const std::vector<HostMatrix> expected = g.NaiveOutputs();
  // The naive loop itself, within TESTING.md's tolerance of a product summed
  // here in long double: the naive loop and the executor share
  // ops::AccumulateTile, so comparing them alone would pass a k-range or
  // transposition slip in it.
  const TensorView a = g.tensors().view("a"), b = g.tensors().view("b");
  HostMatrix exact(DType::kFP32, m, n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      long double sum = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        sum += static_cast<long double>(ops::LoadElement(a, i, kk)) * ops::LoadElement(b, j, kk);
      }
      exact.set(i, j, static_cast<double>(sum));
    }
  }
  EXPECT_TRUE(testbed::CompareToReference(expected[0].view("naive"), exact.view("exact"), a, b));
  for (int32_t cluster : {1, 2}) {
    absl::StatusOr<sched::Schedule> schedule = LowerGraph(g.graph(), SmallTiles(1, cluster));
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    g.ExpectExecutorMatches(*schedule, {}, expected);
    g.ExpectExecutorMatches(*schedule, {.simulated_sms = 3, .seed = rng.seed()}, expected);
  }
}

INSTANTIATE_TEST_SUITE_P(AllRagged, RaggedShapeTest,
                         ::testing::Combine(::testing::ValuesIn(kRaggedSizes),
                                            ::testing::ValuesIn(kRaggedSizes),
                                            ::testing::ValuesIn(kRaggedSizes)),
                         [](const auto& info) {
                           return absl::StrCat("M", std::get<0>(info.param), "_N",
                                               std::get<1>(info.param), "_K", std::get<2>(info.param));
                         });

// --- Every epilogue, bf16 and fp32 outputs, with and without split-K ---------

struct EpilogueCase {
  std::string name;
  Activation activation = Activation::kNone;
  bool bias = false;
  DType bias_dtype = DType::kBF16;
  bool residual = false;
  DType residual_dtype = DType::kBF16;
};

std::vector<EpilogueCase> EpilogueCases() {
  return {
      {.name = "plain"},
      {.name = "bias_bf16", .bias = true},
      {.name = "bias_fp32", .bias = true, .bias_dtype = DType::kFP32},
      {.name = "relu", .activation = Activation::kReLU},
      {.name = "gelu", .activation = Activation::kGELU},
      {.name = "silu", .activation = Activation::kSiLU},
      {.name = "swiglu", .activation = Activation::kSwiGLU},
      {.name = "swiglu_bias", .activation = Activation::kSwiGLU, .bias = true},
      {.name = "residual_bf16", .residual = true},
      {.name = "residual_fp32", .residual = true, .residual_dtype = DType::kFP32},
      {.name = "bias_gelu_residual", .activation = Activation::kGELU, .bias = true,
       .bias_dtype = DType::kFP32, .residual = true},
      {.name = "swiglu_bias_residual", .activation = Activation::kSwiGLU, .bias = true,
       .residual = true, .residual_dtype = DType::kFP32},
  };
}

class EpilogueTest : public ::testing::TestWithParam<std::tuple<EpilogueCase, DType>> {};

TEST_P(EpilogueTest, ExecutorMatchesNaiveLoopWithAndWithoutSplitK) {
  const auto& [epilogue_case, out_dtype] = GetParam();
  constexpr int64_t m = 129, n = 130, k = 127;  // N even for SwiGLU
  const bool swiglu = epilogue_case.activation == Activation::kSwiGLU;
  const int64_t out_cols = swiglu ? n / 2 : n;
  Rng rng;
  HostGraph g(rng);
  Epilogue epilogue{.activation = epilogue_case.activation, .bias = {}, .residual = {}};
  if (epilogue_case.bias) epilogue.bias = g.Input("bias", epilogue_case.bias_dtype, 1, n);
  if (epilogue_case.residual) {
    epilogue.residual = g.Input("residual", epilogue_case.residual_dtype, m, out_cols);
  }
  const int node = g.graph().AddGemm("gemm", g.Input("a", DType::kBF16, m, k),
                                     g.Input("b", DType::kBF16, n, k),
                                     g.Output("c", out_dtype, m, out_cols), epilogue);
  ASSERT_TRUE(g.graph().Validate().ok()) << g.graph().Validate();
  const std::vector<HostMatrix> expected = g.NaiveOutputs();
  EXPECT_EQ(testbed::CountUnwritten(expected[0].view()), 0);

  absl::StatusOr<sched::Schedule> plain = LowerGraph(g.graph(), SmallTiles(1));
  ASSERT_TRUE(plain.ok()) << plain.status();
  g.ExpectExecutorMatches(*plain, {}, expected);

  for (int32_t split_k : {2, 3}) {
    SCOPED_TRACE(::testing::Message() << "split_k " << split_k);
    absl::StatusOr<sched::Schedule> split = LowerGraph(g.graph(), SmallTiles(split_k));
    ASSERT_TRUE(split.ok()) << split.status();
    ASSERT_EQ(split->nodes[node].split_k, split_k);
    for (const ReferenceOptions& options :
         {ReferenceOptions{}, ReferenceOptions{.simulated_sms = 5, .seed = rng.seed()}}) {
      g.PoisonOutputs();
      const absl::Status status = RunReference(g.graph(), *split, options);
      ASSERT_TRUE(status.ok()) << status;
      ExpectWithinOneUlp(g.graph().nodes()[node].c, expected[0].view("naive"));
    }
  }
  g.ExpectGuardsIntact();
}

INSTANTIATE_TEST_SUITE_P(AllEpilogues, EpilogueTest,
                         ::testing::Combine(::testing::ValuesIn(EpilogueCases()),
                                            ::testing::Values(DType::kBF16, DType::kFP32)),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param).name, "_",
                                               std::string(DTypeName(std::get<1>(info.param))));
                         });

// --- Split-K over ragged shapes ----------------------------------------------

class SplitKTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int32_t>> {};

TEST_P(SplitKTest, SameResultAsWithoutSplitWithinOneUlp) {
  const auto [m, k, split_k] = GetParam();
  // N = 129: a ragged last tile; 128: whole tiles, so that 17-64 rows are
  // reduced in parts (ChooseReduceParts).
  for (int64_t n : {129, 128}) {
    SCOPED_TRACE(::testing::Message() << "N " << n);
    Rng rng;
    HostGraph g(rng);
    g.graph().AddGemm("gemm", g.Input("a", DType::kBF16, m, k), g.Input("b", DType::kBF16, n, k),
                      g.Output("c", DType::kFP32, m, n));
    const std::vector<HostMatrix> expected = g.NaiveOutputs();
    absl::StatusOr<sched::Schedule> schedule = LowerGraph(g.graph(), SmallTiles(split_k));
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    const bool in_parts = n == 128 && m > 8 && m <= 64 && k > 32;
    EXPECT_EQ(schedule->nodes[0].reduce_parts > 1, in_parts);
    for (uint64_t seed : {uint64_t{0}, uint64_t{1}, rng.seed()}) {
      g.PoisonOutputs();
      const ReferenceOptions options{.simulated_sms = seed == 0 ? 0 : 7, .seed = seed};
      const absl::Status status = RunReference(g.graph(), *schedule, options);
      ASSERT_TRUE(status.ok()) << status;
      ExpectWithinOneUlp(g.graph().nodes()[0].c, expected[0].view("naive"));
    }
    g.ExpectGuardsIntact();
  }
}

INSTANTIATE_TEST_SUITE_P(RaggedSplits, SplitKTest,
                         ::testing::Combine(::testing::Values(1, 3, 40, 65, 129),  // 40: 3 reduce parts
                                            ::testing::Values(63, 64, 65, 129, 1000),
                                            ::testing::Values(2, 3, 4, 7)),
                         [](const auto& info) {
                           return absl::StrCat("M", std::get<0>(info.param), "_K",
                                               std::get<1>(info.param), "_split",
                                               std::get<2>(info.param));
                         });

// --- Integer-valued data: exact, with and without split-K ----------------------

TEST(IntegerDataTest, ExactWithAndWithoutSplitK) {
  Rng rng;
  for (int64_t m : {3, 65, 129}) {
    for (int64_t k : {1, 63, 129, 300}) {
      for (DType out_dtype : {DType::kFP32, DType::kBF16}) {
        SCOPED_TRACE(::testing::Message() << "M " << m << " K " << k << " out "
                                          << DTypeName(out_dtype));
        constexpr int64_t n = 65;
        HostGraph g(rng, /*integers=*/true);
        const TensorView a = g.Input("a", DType::kBF16, m, k);
        const TensorView b = g.Input("b", DType::kBF16, n, k);
        const TensorView bias = g.Input("bias", DType::kBF16, 1, n);
        const TensorView residual = g.Input("residual", DType::kFP32, m, n);
        const TensorView c = g.Output("c", out_dtype, m, n);
        g.graph().AddGemm("gemm", a, b, c, {.activation = Activation::kReLU, .bias = bias,
                                            .residual = residual});
        // The exact result in integers, rounded once to the output dtype.
        HostMatrix exact(out_dtype, m, n);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            int64_t sum = 0;
            for (int64_t kk = 0; kk < k; ++kk) {
              sum += static_cast<int64_t>(ops::LoadElement(a, i, kk)) *
                     static_cast<int64_t>(ops::LoadElement(b, j, kk));
            }
            sum += static_cast<int64_t>(ops::LoadElement(bias, 0, j));
            sum = std::max<int64_t>(sum, 0) + static_cast<int64_t>(ops::LoadElement(residual, i, j));
            exact.set(i, j, static_cast<double>(sum));
          }
        }
        const std::vector<HostMatrix> naive = g.NaiveOutputs();
        EXPECT_TRUE(testbed::CompareExactly(naive[0].view("naive"), exact.view("exact")));
        EXPECT_TRUE(testbed::CompareToReference(naive[0].view("naive"), exact.view("exact"), a, b,
                                                {.exact = true}));
        for (int32_t split_k : {1, 2, 5}) {
          absl::StatusOr<sched::Schedule> schedule = LowerGraph(g.graph(), SmallTiles(split_k));
          ASSERT_TRUE(schedule.ok()) << schedule.status();
          g.ExpectExecutorMatches(*schedule, {}, naive);
          g.ExpectExecutorMatches(*schedule, {.simulated_sms = 4, .seed = rng.seed() + split_k}, naive);
        }
      }
    }
  }
}

// --- Multi-node graphs ---------------------------------------------------------

// Runs the graph's schedule (plain and split-K) in queue order and on virtual
// SMs of several counts and seeds; every run must equal the naive loop.
void ExpectGraphMatchesNaive(HostGraph& g, Rng& rng) {
  ASSERT_TRUE(g.graph().Validate().ok()) << g.graph().Validate();
  const std::vector<HostMatrix> expected = g.NaiveOutputs();
  for (int i = 0; i < g.graph().size(); ++i) {
    EXPECT_EQ(testbed::CountUnwritten(expected[i].view()), 0) << g.graph().nodes()[i].name;
  }
  for (int32_t cluster : {1, 2}) {
    absl::StatusOr<sched::Schedule> schedule = LowerGraph(g.graph(), SmallTiles(1, cluster));
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    ASSERT_FALSE(schedule->dependencies.empty());
    g.ExpectExecutorMatches(*schedule, {}, expected);
    for (int sms : {1, 2, 7, 132}) {
      for (uint64_t seed : {uint64_t{1}, uint64_t{2}, rng.seed()}) {
        g.ExpectExecutorMatches(*schedule, {.simulated_sms = sms, .seed = seed}, expected);
      }
    }
  }
  // Split-K everywhere: within one ulp of the naive loop, node by node.
  absl::StatusOr<sched::Schedule> split = LowerGraph(g.graph(), SmallTiles(3));
  ASSERT_TRUE(split.ok()) << split.status();
  for (const ReferenceOptions& options :
       {ReferenceOptions{}, ReferenceOptions{.simulated_sms = 9, .seed = rng.seed()}}) {
    g.PoisonOutputs();
    const absl::Status status = RunReference(g.graph(), *split, options);
    ASSERT_TRUE(status.ok()) << status;
    // Later nodes read earlier outputs that may differ by an ulp, so compare
    // the first node exactly-within-ulp and the rest with TESTING.md's bound.
    ExpectWithinOneUlp(g.graph().nodes()[0].c, expected[0].view("naive"));
    for (int i = 1; i < g.graph().size(); ++i) {
      const GemmNode& node = g.graph().nodes()[i];
      EXPECT_TRUE(testbed::CompareNodeToReference(node, node.c, expected[i].view("naive")))
          << node.name;
    }
  }
  g.ExpectGuardsIntact();
}

TEST(GraphTest, Chain) {
  Rng rng;
  HostGraph g(rng);
  const TensorView x = g.Input("x", DType::kBF16, 129, 96);
  const TensorView h1 = g.Output("h1", DType::kBF16, 129, 130);
  const TensorView h2 = g.Output("h2", DType::kBF16, 129, 65);
  const TensorView y = g.Output("y", DType::kFP32, 129, 63);
  g.graph().AddGemm("l1", x, g.Input("w1", DType::kBF16, 130, 96), h1,
                    {.activation = Activation::kGELU, .bias = g.Input("b1", DType::kFP32, 1, 130),
                     .residual = {}});
  g.graph().AddGemm("l2", h1, g.Input("w2", DType::kBF16, 65, 130), h2,
                    {.activation = Activation::kReLU, .bias = {}, .residual = {}});
  g.graph().AddGemm("l3", h2, g.Input("w3", DType::kBF16, 63, 65), y);
  ExpectGraphMatchesNaive(g, rng);
}

TEST(GraphTest, Diamond) {
  // p feeds two consumers through column halves; q and r meet in one node
  // (q as A, r as the residual).
  Rng rng;
  HostGraph g(rng);
  const TensorView x = g.Input("x", DType::kBF16, 127, 64);
  const TensorView p = g.Output("p", DType::kBF16, 127, 160);
  const TensorView q = g.Output("q", DType::kBF16, 127, 72);
  const TensorView r = g.Output("r", DType::kBF16, 127, 65);
  const TensorView y = g.Output("y", DType::kBF16, 127, 65);
  g.graph().AddGemm("p", x, g.Input("wp", DType::kBF16, 160, 64), p);
  g.graph().AddGemm("q", p.Columns(0, 80).Named("p.left"), g.Input("wq", DType::kBF16, 72, 80), q,
                    {.activation = Activation::kSiLU, .bias = {}, .residual = {}});
  g.graph().AddGemm("r", p.Columns(80, 80).Named("p.right"), g.Input("wr", DType::kBF16, 65, 80),
                    r);
  g.graph().AddGemm("y", q, g.Input("wy", DType::kBF16, 65, 72), y,
                    {.activation = Activation::kNone, .bias = {}, .residual = r});
  ExpectGraphMatchesNaive(g, rng);
}

// Llama-style MLP block at `tokens`, hidden 128, intermediate 192 unless said:
// h = swiglu(x · W_gate_upᵀ), y = h · W_downᵀ + x.
void AddMlpBlock(HostGraph& g, int64_t tokens, int64_t hidden = 128, int64_t intermediate = 192) {
  const TensorView x = g.Input("x", DType::kBF16, tokens, hidden);
  const TensorView h = g.Output("h", DType::kBF16, tokens, intermediate);
  const TensorView y = g.Output("y", DType::kBF16, tokens, hidden);
  g.graph().AddGemm("gate_up", x, g.Input("w_gate_up", DType::kBF16, 2 * intermediate, hidden), h,
                    {.activation = Activation::kSwiGLU, .bias = {}, .residual = {}});
  g.graph().AddGemm("down", h, g.Input("w_down", DType::kBF16, hidden, intermediate), y,
                    {.activation = Activation::kNone, .bias = {}, .residual = x});
}

TEST(GraphTest, MlpBlock) {
  Rng rng;
  HostGraph g(rng);
  AddMlpBlock(g, /*tokens=*/65);
  ExpectGraphMatchesNaive(g, rng);
}

// The narrow decode kernel's lowering (Runtime::Compile with KernelChoice::kNarrow:
// 64 x 32 tiles over the whole K, no clusters, no split-K) of an MLP block at
// 5 tokens, whose down projection reads four 16-column SwiGLU tiles per
// k-block: in queue order and on virtual SMs it must equal the naive loop.
TEST(GraphTest, MlpBlockLoweredForTheNarrowKernel) {
  Rng rng;
  HostGraph g(rng);
  AddMlpBlock(g, /*tokens=*/5);
  CompileOptions options;
  options.kernel = KernelChoice::kNarrow;
  absl::StatusOr<Plan> plan = Runtime::ForDescription(DeviceDescription::H200()).Compile(g.graph(), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->schedule().tile.n, 32);
  ASSERT_EQ(plan->schedule().nodes[0].out_tile_n, 16);
  const std::vector<HostMatrix> expected = g.NaiveOutputs();
  g.ExpectExecutorMatches(plan->schedule(), {}, expected);
  for (int sms : {1, 7, 132}) {
    g.ExpectExecutorMatches(plan->schedule(), {.simulated_sms = sms, .seed = rng.seed() + sms}, expected);
  }
  g.ExpectGuardsIntact();
}

// A split's lowering of an MLP block at 48 tokens on the narrow kernel
// under `options`: `tile_n`-column tiles (the SwiGLU node's tile_n / 2
// output columns), each tile's K in `splits` even parts on stage
// boundaries, the earlier parts' jobs before the last's in the queue, the
// last summing (no reduce jobs). In queue order and on virtual SMs it must
// equal the naive loop.
void ExpectSplitLoweredMlpBlockMatchesNaive(const CompileOptions& options, int tile_n, int splits, int64_t hidden,
                                            int64_t intermediate, std::vector<int64_t> whole_tiles = {0, 0},
                                            std::vector<int32_t> leads = {0, 0}) {
  Rng rng;
  HostGraph g(rng);
  AddMlpBlock(g, /*tokens=*/48, hidden, intermediate);
  absl::StatusOr<Plan> plan = Runtime::ForDescription(DeviceDescription::H200()).Compile(g.graph(), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const sched::Schedule& schedule = plan->schedule();
  ASSERT_EQ(schedule.tile.n, tile_n);
  EXPECT_EQ(schedule.nodes[0].out_tile_n, tile_n / 2);
  std::map<std::tuple<int, uint32_t, uint32_t>, int> parts_seen;  // (node, m-block, n-block): earlier parts
  std::vector<int64_t> whole_seen(schedule.nodes.size(), 0);
  for (const sched::TileJob& job : schedule.queue) {
    const sched::NodeSchedule& node = schedule.nodes[job.node];
    ASSERT_EQ(node.split_k, splits);
    ASSERT_EQ(node.reduce_parts, 0);
    ASSERT_EQ(job.kind, static_cast<uint8_t>(sched::JobKind::kGemm));
    // Even parts, or (two splits) the first `lead` k-blocks longer.
    const int32_t lead = leads[job.node];
    EXPECT_EQ(node.last_split_extra_k_blocks, -lead);
    int& seen = parts_seen[std::make_tuple(int{job.node}, job.m_block, job.n_block)];
    if (sched::WholeTileOfSplitNode(node, job)) {  // the last split's index over all of K
      EXPECT_EQ(job.k_block_end, node.k_blocks);
      EXPECT_EQ(seen, 0) << "a whole tile also split: node " << job.node;
      seen = -1;  // no part of this tile may follow
      ++whole_seen[job.node];
      continue;
    }
    const int part = (node.k_blocks + lead) / splits;
    EXPECT_EQ(part % 4, 0) << "a part starts on a stage";
    EXPECT_EQ(job.k_block_begin, job.split * part);
    EXPECT_EQ(job.k_block_end, job.split == splits - 1 ? node.k_blocks : (job.split + 1) * part);
    if (job.split == splits - 1) {
      EXPECT_EQ(seen, splits - 1) << "the last part before an earlier one: node " << job.node;
    } else {
      EXPECT_GE(seen, 0) << "a part of a whole tile: node " << job.node;
      ++seen;
    }
  }
  EXPECT_EQ(whole_seen, whole_tiles);
  const std::vector<HostMatrix> expected = g.NaiveOutputs();
  g.ExpectExecutorMatches(schedule, {}, expected);
  for (int sms : {1, 7, 132}) {
    g.ExpectExecutorMatches(schedule, {.simulated_sms = sms, .seed = rng.seed() + sms}, expected);
  }
  g.ExpectGuardsIntact();
}

// The pair split (CompileOptions::narrow_pair_split): 64 x 64 tiles, K in
// halves; hidden 512, intermediate 1024.
TEST(GraphTest, MlpBlockLoweredForThePairSplit) {
  CompileOptions options;
  options.kernel = KernelChoice::kNarrow;
  options.narrow_pair_split = PairSplitChoice::kOn;
  ExpectSplitLoweredMlpBlockMatchesNaive(options, /*tile_n=*/64, /*splits=*/2, /*hidden=*/512,
                                         /*intermediate=*/1024);
}

// The same with CompileOptions::narrow_split_whole_tiles on a grid of 4
// CTAs: gate/up's 32 tiles (8 waves) are 28 whole and 4 split, the down
// projection's 8 (2 waves) 4 and 4.
TEST(GraphTest, MlpBlockLoweredForThePairSplitWithWholeTiles) {
  CompileOptions options;
  options.kernel = KernelChoice::kNarrow;
  options.narrow_pair_split = PairSplitChoice::kOn;
  options.narrow_split_whole_tiles = true;
  options.max_clusters = 4;
  ExpectSplitLoweredMlpBlockMatchesNaive(options, /*tile_n=*/64, /*splits=*/2, /*hidden=*/512,
                                         /*intermediate=*/1024, /*whole_tiles=*/{28, 4});
}

// The same with CompileOptions::narrow_split_lead_k_blocks on a grid of 32:
// the down projection's 32 jobs (hidden 1024) fit one wave, so its halves
// of K (16 k-blocks) are 12 and 4; gate/up's 64 jobs do not, so 8 and 8.
TEST(GraphTest, MlpBlockLoweredForThePairSplitWithALead) {
  CompileOptions options;
  options.kernel = KernelChoice::kNarrow;
  options.narrow_pair_split = PairSplitChoice::kOn;
  options.narrow_split_lead_k_blocks = 8;
  options.max_clusters = 32;
  ExpectSplitLoweredMlpBlockMatchesNaive(options, /*tile_n=*/64, /*splits=*/2, /*hidden=*/1024,
                                         /*intermediate=*/1024, /*whole_tiles=*/{0, 0}, /*leads=*/{0, 8});
}

// The wide split (CompileOptions::narrow_wide_split): 64 x 128 tiles, K in
// quarters; hidden 1024 and intermediate 2048, the smallest K that splits in
// four on stages and twice that.
TEST(GraphTest, MlpBlockLoweredForTheWideSplit) {
  CompileOptions options;
  options.kernel = KernelChoice::kNarrow;
  options.narrow_wide_split = true;
  ExpectSplitLoweredMlpBlockMatchesNaive(options, /*tile_n=*/128, /*splits=*/4, /*hidden=*/1024,
                                         /*intermediate=*/2048);
}

TEST(GraphTest, EveryOperandProducedInGraph) {
  // The consumer's A, B, bias and residual all come from other nodes; two of
  // them write the column halves of one tensor (a concat) read as A.
  Rng rng;
  HostGraph g(rng);
  constexpr int64_t m = 65, k = 48, n = 72;
  const TensorView x = g.Input("x", DType::kBF16, m, 40);
  const TensorView a = g.Output("a", DType::kBF16, m, k);
  const TensorView b = g.Output("b", DType::kBF16, n, k);
  const TensorView bias = g.Output("bias", DType::kFP32, 1, n);
  const TensorView res = g.Output("res", DType::kBF16, m, n);
  const TensorView y = g.Output("y", DType::kFP32, m, n);
  g.graph().AddGemm("a.left", x, g.Input("wa0", DType::kBF16, 24, 40), a.Columns(0, 24).Named("a.left"));
  g.graph().AddGemm("a.right", x, g.Input("wa1", DType::kBF16, 24, 40),
                    a.Columns(24, 24).Named("a.right"));
  g.graph().AddGemm("b", g.Input("u", DType::kBF16, n, 16), g.Input("wb", DType::kBF16, k, 16), b);
  g.graph().AddGemm("bias", g.Input("ones", DType::kBF16, 1, 8), g.Input("wbias", DType::kBF16, n, 8),
                    bias);
  g.graph().AddGemm("res", x, g.Input("wres", DType::kBF16, n, 40), res);
  g.graph().AddGemm("y", a, b, y, {.activation = Activation::kGELU, .bias = bias, .residual = res});
  ExpectGraphMatchesNaive(g, rng);
}

TEST(GraphTest, IndependentBatch) {
  Rng rng;
  HostGraph g(rng);
  for (int i = 0; i < 4; ++i) {
    const int64_t m = kRaggedSizes[i + 2], n = kRaggedSizes[6 - i], k = 64 + 8 * i;
    g.graph().AddGemm(absl::StrCat("g", i), g.Input(absl::StrCat("x", i), DType::kBF16, m, k),
                      g.Input(absl::StrCat("w", i), DType::kBF16, n, k),
                      g.Output(absl::StrCat("y", i), DType::kBF16, m, n));
  }
  // No dependencies here, so ExpectGraphMatchesNaive's edge check does not
  // apply; run the pieces directly.
  ASSERT_TRUE(g.graph().Validate().ok()) << g.graph().Validate();
  const std::vector<HostMatrix> expected = g.NaiveOutputs();
  absl::StatusOr<sched::Schedule> schedule = LowerGraph(g.graph(), SmallTiles(1));
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  g.ExpectExecutorMatches(*schedule, {}, expected);
  for (uint64_t seed : {uint64_t{3}, rng.seed()}) {
    g.ExpectExecutorMatches(*schedule, {.simulated_sms = 5, .seed = seed}, expected);
  }
}

// A node with K = 0 and an output: C = activation(bias) + residual, one job
// a tile over no k-blocks, and a consumer of that output, in queue order and
// on virtual SMs, against the naive loop (which sums nothing to 0).
TEST(GraphTest, ZeroKRunsItsEpilogueAlone) {
  Rng rng;
  HostGraph g(rng);
  HostMatrix empty(DType::kBF16, 1, 1);  // a valid address for the K = 0 views
  const TensorView a = TensorView{"a", empty.data(), DType::kBF16, 65, 0, 8};
  const TensorView b = TensorView{"b", empty.data(), DType::kBF16, 126, 0, 8};
  const TensorView h = g.Output("h", DType::kBF16, 65, 63);
  g.graph().AddGemm("zero_k", a, b, h,
                    {.activation = Activation::kSwiGLU,
                     .bias = g.Input("bias", DType::kFP32, 1, 126),
                     .residual = g.Input("r", DType::kBF16, 65, 63)});
  g.graph().AddGemm("plain_zero_k", a, TensorView{"b2", empty.data(), DType::kBF16, 70, 0, 8},
                    g.Output("p", DType::kFP32, 65, 70), {.activation = Activation::kGELU,
                                                          .bias = g.Input("bias2", DType::kBF16, 1, 70)});
  g.graph().AddGemm("consumer", h, g.Input("w", DType::kBF16, 40, 63), g.Output("y", DType::kFP32, 65, 40));
  ASSERT_TRUE(g.graph().Validate().ok()) << g.graph().Validate();
  const std::vector<HostMatrix> expected = g.NaiveOutputs();
  for (const int32_t split_k : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("split_k ", split_k));
    absl::StatusOr<sched::Schedule> schedule = LowerGraph(g.graph(), SmallTiles(split_k));
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    EXPECT_EQ(schedule->nodes[0].split_k, 1);  // nothing to split
    EXPECT_EQ(schedule->nodes[2].dependency_count, 1);
    g.ExpectExecutorMatches(*schedule, {}, expected);
    g.ExpectExecutorMatches(*schedule, {.simulated_sms = 3, .seed = rng.seed()}, expected);
  }
  // The naive loop's K = 0 output is the epilogue of 0, element by element.
  const GemmNode& node = g.graph().nodes()[1];
  for (int64_t r = 0; r < 65; r += 16) {
    for (int64_t c = 0; c < 70; c += 9) {
      const double want = ops::Gelu(ops::LoadElement(*node.epilogue.bias, 0, c));
      EXPECT_NEAR(ops::LoadElement(expected[1].view("naive"), r, c), want, 1e-6 * (1 + std::fabs(want)));
    }
  }
}

// --- A Plan compiled for a described H200 (no GPU needed) ----------------------

// Runs a compiled plan in queue order and on 66 / 132 virtual SMs.
void RunPlanAndCompare(HostGraph& g, const Plan& plan, const std::vector<HostMatrix>& expected,
                       Rng& rng) {
  for (const ReferenceOptions& options :
       {ReferenceOptions{}, ReferenceOptions{.simulated_sms = 66, .seed = rng.seed()},
        ReferenceOptions{.simulated_sms = 132, .seed = rng.seed() + 1}}) {
    SCOPED_TRACE(::testing::Message() << "simulated_sms " << options.simulated_sms);
    g.PoisonOutputs();
    const absl::Status status = RunReference(plan, options);
    ASSERT_TRUE(status.ok()) << status;
    ExpectWithinOneUlp(g.graph().nodes()[0].c, expected[0].view("naive"));
    const GemmNode& down = g.graph().nodes()[1];
    EXPECT_TRUE(testbed::CompareNodeToReference(down, down.c, expected[1].view("naive")));
  }
  g.ExpectGuardsIntact();
}

TEST(PlanTest, RunReferenceOnCompiledPlan) {
  // Decode-sized MLP: few output tiles, so the scheduler is free to split K.
  Rng rng;
  HostGraph g(rng);
  constexpr int64_t tokens = 3, hidden = 512, intermediate = 768;
  const TensorView x = g.Input("x", DType::kBF16, tokens, hidden);
  const TensorView h = g.Output("h", DType::kBF16, tokens, intermediate);
  const TensorView y = g.Output("y", DType::kBF16, tokens, hidden);
  g.graph().AddGemm("gate_up", x, g.Input("w_gate_up", DType::kBF16, 2 * intermediate, hidden), h,
                    {.activation = Activation::kSwiGLU, .bias = {}, .residual = {}});
  g.graph().AddGemm("down", h, g.Input("w_down", DType::kBF16, hidden, intermediate), y,
                    {.activation = Activation::kNone, .bias = {}, .residual = x});
  const std::vector<HostMatrix> expected = g.NaiveOutputs();
  const Runtime runtime = Runtime::ForDescription(DeviceDescription::H200());
  for (int split_k : {0, 4}) {  // 0: the scheduler's choice
    SCOPED_TRACE(::testing::Message() << "CompileOptions::split_k " << split_k);
    absl::StatusOr<Plan> plan = runtime.Compile(g.graph(), {.split_k = split_k});
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (const sched::NodeSchedule& node : plan->schedule().nodes) {
      std::printf("[ loom     ] plan node %dx%dx%d: split_k %d (%d jobs in the queue)\n",
                  static_cast<int>(node.m), static_cast<int>(node.n), static_cast<int>(node.k),
                  node.split_k, static_cast<int>(plan->schedule().queue.size()));
    }
    RunPlanAndCompare(g, *plan, expected, rng);
  }
}

// A moved-from Plan has no graph or schedule to run; a negative count of
// virtual SMs is refused, and any positive one runs.
TEST(PlanTest, RunReferenceRefusesAMovedFromPlanAndNegativeSms) {
  Rng rng;
  HostGraph g(rng);
  g.graph().AddGemm("g", g.Input("a", DType::kBF16, 8, 64), g.Input("b", DType::kBF16, 16, 64),
                    g.Output("c", DType::kBF16, 8, 16));
  absl::StatusOr<Plan> plan = Runtime::ForDescription(DeviceDescription::H200()).Compile(g.graph());
  ASSERT_TRUE(plan.ok()) << plan.status();
  const absl::Status negative = RunReference(*plan, {.simulated_sms = -1, .seed = 0});
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument) << negative;
  EXPECT_NE(std::string(negative.message()).find("simulated_sms must be >= 0, got -1"), std::string::npos)
      << negative;
  // Any positive count runs: at most one virtual SM a job is used (INT_MAX
  // of them once aborted the process, allocating a vector of each).
  EXPECT_TRUE(RunReference(*plan, {.simulated_sms = std::numeric_limits<int>::max(), .seed = 1}).ok());
  Plan taken = std::move(*plan);
  const absl::Status moved = RunReference(*plan);  // NOLINT(bugprone-use-after-move): the point of the test
  EXPECT_EQ(moved.code(), absl::StatusCode::kFailedPrecondition) << moved;
  EXPECT_NE(std::string(moved.message()).find("moved from"), std::string::npos) << moved;
  EXPECT_TRUE(RunReference(taken).ok());
}

// --- Broken schedules are reported, never silently computed -------------------

class BrokenScheduleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_ = std::make_unique<HostGraph>(rng_);
    const TensorView x = g_->Input("x", DType::kBF16, 129, 64);
    const TensorView h = g_->Output("h", DType::kBF16, 129, 128);
    g_->graph().AddGemm("up", x, g_->Input("w1", DType::kBF16, 128, 64), h);
    g_->graph().AddGemm("down", h, g_->Input("w2", DType::kBF16, 64, 128),
                        g_->Output("y", DType::kFP32, 129, 64));
    absl::StatusOr<sched::Schedule> s = LowerGraph(g_->graph(), SmallTiles(1));
    ASSERT_TRUE(s.ok()) << s.status();
    schedule_ = *std::move(s);
  }
  // The queue index of the first job of `node`.
  size_t FirstJobOf(int node) const {
    for (size_t i = 0; i < schedule_.queue.size(); ++i) {
      if (schedule_.queue[i].node == node) return i;
    }
    return schedule_.queue.size();
  }

  Rng rng_;
  std::unique_ptr<HostGraph> g_;
  sched::Schedule schedule_;
};

void ExpectInternal(const absl::Status& status, const std::string& needle) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_NE(status.message().find(needle), std::string::npos) << status;
}

TEST_F(BrokenScheduleTest, ConsumerBeforeProducerIsNotTopological) {
  // Move the first "down" job to the front of the queue.
  const size_t consumer = FirstJobOf(1);
  ASSERT_LT(consumer, schedule_.queue.size());
  std::rotate(schedule_.queue.begin(), schedule_.queue.begin() + consumer,
              schedule_.queue.begin() + consumer + 1);
  ExpectInternal(RunReference(g_->graph(), schedule_), "not a topological order");
  // One virtual SM holding that job can never proceed: a deadlock, reported.
  ExpectInternal(RunReference(g_->graph(), schedule_, {.simulated_sms = 1, .seed = 5}),
                 "deadlocked");
  // With enough SMs the GPU would get through it (the producer jobs are
  // dequeued by other SMs), and so does the simulation.
  EXPECT_TRUE(RunReference(g_->graph(), schedule_, {.simulated_sms = 64, .seed = 5}).ok());
}

TEST_F(BrokenScheduleTest, DuplicateJobIsReported) {
  schedule_.queue.push_back(schedule_.queue.front());
  ExpectInternal(RunReference(g_->graph(), schedule_), "a second time");
}

TEST_F(BrokenScheduleTest, MissingJobIsReported) {
  schedule_.queue.pop_back();
  ExpectInternal(RunReference(g_->graph(), schedule_), "never computed");
}

TEST_F(BrokenScheduleTest, PartialKRangeIsReported) {
  schedule_.queue.front().k_block_end = 1;
  ExpectInternal(RunReference(g_->graph(), schedule_),
                 "unsplit (split_k 1, or a whole tile of a split node) but covers k-blocks [0, 1)");
}

// A split count no schedule has is Internal, before the executor sizes its
// partials by it (1 << 30 splits of 129 x 128 once threw bad_alloc).
TEST_F(BrokenScheduleTest, SplitCountPastTheKBlocksIsReported) {
  schedule_.nodes[0].split_k = 1 << 30;
  ExpectInternal(RunReference(g_->graph(), schedule_), "split_k 1073741824");
  schedule_.nodes[0].split_k = schedule_.nodes[0].k_blocks + 1;
  ExpectInternal(RunReference(g_->graph(), schedule_), "split_k in [1, max(k_blocks, 1)]");
}

TEST_F(BrokenScheduleTest, MalformedJobsAreReported) {
  sched::Schedule reduce = schedule_;
  reduce.queue.front().kind = static_cast<uint8_t>(sched::JobKind::kReduce);
  ExpectInternal(RunReference(g_->graph(), reduce), "reduces a node without split-K");
  ExpectInternal(RunReference(g_->graph(), reduce, {.simulated_sms = 4, .seed = 1}),
                 "reduces a node without split-K");
  sched::Schedule node = schedule_;
  node.queue.front().node = 7;
  ExpectInternal(RunReference(g_->graph(), node), "names a node the graph does not have");
  sched::Schedule kind = schedule_;
  kind.queue.front().kind = 9;
  ExpectInternal(RunReference(g_->graph(), kind), "unknown kind");
}

TEST_F(BrokenScheduleTest, MissingDependencyEdgeIsCaughtOnTheData) {
  // Without its edges, "down" waits for nothing and may run before "up": the
  // flags cannot tell, the bytes it reads can.
  schedule_.nodes[1].dependency_count = 0;
  const size_t consumer = FirstJobOf(1);
  std::rotate(schedule_.queue.begin(), schedule_.queue.begin() + consumer,
              schedule_.queue.begin() + consumer + 1);
  ExpectInternal(RunReference(g_->graph(), schedule_), "reads A \"h\" element (0, 0), another node's output");
  ExpectInternal(RunReference(g_->graph(), schedule_, {.simulated_sms = 1, .seed = 3}),
                 "before any job wrote it");
  // Kept in queue order, the same schedule runs: the data was there in time.
  absl::StatusOr<sched::Schedule> in_order = LowerGraph(g_->graph(), SmallTiles(1));
  ASSERT_TRUE(in_order.ok()) << in_order.status();
  in_order->nodes[1].dependency_count = 0;
  EXPECT_TRUE(RunReference(g_->graph(), *in_order).ok());
}

// The epilogue's reads are followed too: a residual produced in the graph,
// its edge dropped and its consumer queued first.
TEST(BrokenEpilogueScheduleTest, ResidualReadBeforeItIsWrittenIsReported) {
  Rng rng;
  HostGraph g(rng);
  const TensorView r = g.Output("r", DType::kBF16, 64, 64);
  g.graph().AddGemm("first", g.Input("x", DType::kBF16, 64, 128), g.Input("w1", DType::kBF16, 64, 128), r);
  g.graph().AddGemm("second", g.Input("y", DType::kBF16, 64, 128), g.Input("w2", DType::kBF16, 64, 128),
                    g.Output("z", DType::kFP32, 64, 64), {.residual = r});
  for (const int split_k : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("split_k ", split_k));
    absl::StatusOr<sched::Schedule> s = LowerGraph(g.graph(), SmallTiles(split_k, 1));
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_EQ(s->nodes[1].dependency_count, 1);
    EXPECT_TRUE(RunReference(g.graph(), *s).ok());
    sched::Schedule broken = *s;
    broken.nodes[1].dependency_count = 0;
    std::stable_partition(broken.queue.begin(), broken.queue.end(),
                          [](const sched::TileJob& job) { return job.node == 1; });
    ExpectInternal(RunReference(g.graph(), broken), "reads residual \"r\" element (0, 0)");
  }
}

// The queue of `schedule` (cluster size 1: a job a tile) made of the jobs of
// (node, n_block) in `order`, each of row block 0; fails the test if one is missing.
std::vector<sched::TileJob> JobsInOrder(const sched::Schedule& schedule,
                                        const std::vector<std::pair<int, int>>& order) {
  std::vector<sched::TileJob> queue;
  for (const auto& [node, n_block] : order) {
    const auto job = std::find_if(schedule.queue.begin(), schedule.queue.end(), [&](const sched::TileJob& j) {
      return static_cast<int>(j.node) == node && j.m_block == 0 && static_cast<int>(j.n_block) == n_block;
    });
    EXPECT_NE(job, schedule.queue.end()) << "node " << node << " n_block " << n_block;
    if (job != schedule.queue.end()) queue.push_back(*job);
  }
  return queue;
}

// The data check of reads (OutputWrites) at the edges of what is read and of
// what was written, each a consumer whose edges are dropped and whose job runs
// before one of its producer's tiles: an unwritten column that is the last
// one read; a read that starts at an output's last element; a read that
// starts before the output's first byte (the output a column slice of a
// buffer the graph's input fills); a B produced by a node; a SwiGLU node's
// bias produced by a node, whose accumulator-wide columns (not the output's
// half-wide ones) are read.
TEST(BrokenEpilogueScheduleTest, ReadsAtTheEdgesOfOutputsAreFollowed) {
  const auto expect_caught = [](HostGraph& g, const std::vector<std::pair<int, int>>& order,
                                const std::string& needle) {
    ASSERT_TRUE(g.graph().Validate().ok()) << g.graph().Validate();
    absl::StatusOr<sched::Schedule> s = LowerGraph(g.graph(), SmallTiles(1, 1));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE(RunReference(g.graph(), *s).ok());
    sched::Schedule broken = *s;
    for (sched::NodeSchedule& node : broken.nodes) node.dependency_count = 0;
    broken.queue = JobsInOrder(*s, order);
    ASSERT_EQ(broken.queue.size(), s->queue.size());
    ExpectInternal(RunReference(g.graph(), broken), needle);
  };
  Rng rng;
  {
    SCOPED_TRACE("an unwritten last column");
    HostGraph g(rng);
    const TensorView h = g.Output("h", DType::kBF16, 1, 65);  // n_block 1: column 64 alone
    g.graph().AddGemm("up", g.Input("x", DType::kBF16, 1, 32), g.Input("w1", DType::kBF16, 65, 32), h);
    g.graph().AddGemm("down", h, g.Input("w2", DType::kBF16, 16, 65), g.Output("y", DType::kFP32, 1, 16));
    expect_caught(g, {{0, 0}, {1, 0}, {0, 1}}, "reads A \"h\" element (0, 64)");
  }
  {
    SCOPED_TRACE("a read from an output's last element");
    HostGraph g(rng);
    const TensorView h = g.Output("h", DType::kBF16, 1, 65);
    g.graph().AddGemm("up", g.Input("x", DType::kBF16, 1, 32), g.Input("w1", DType::kBF16, 65, 32), h);
    g.graph().AddGemm("tail", h.Columns(64, 1), g.Input("w2", DType::kBF16, 16, 1),
                      g.Output("y", DType::kFP32, 1, 16));
    expect_caught(g, {{0, 0}, {1, 0}, {0, 1}}, "element (0, 0), another node's output");
  }
  {
    SCOPED_TRACE("a read from before an output's first byte");
    HostGraph g(rng);
    const TensorView buf = g.Input("buf", DType::kBF16, 1, 128);  // columns 64-127: up's output
    g.graph().AddGemm("up", g.Input("x", DType::kBF16, 1, 32), g.Input("w1", DType::kBF16, 64, 32),
                      buf.Columns(64, 64));
    g.graph().AddGemm("down", buf, g.Input("w2", DType::kBF16, 16, 128), g.Output("y", DType::kFP32, 1, 16));
    expect_caught(g, {{1, 0}, {0, 0}}, "reads A \"buf\" element (0, 64)");
  }
  {
    SCOPED_TRACE("a B produced by a node");
    HostGraph g(rng);
    const TensorView hb = g.Output("hb", DType::kBF16, 16, 64);
    g.graph().AddGemm("up", g.Input("x", DType::kBF16, 16, 32), g.Input("w1", DType::kBF16, 64, 32), hb);
    g.graph().AddGemm("scores", g.Input("q", DType::kBF16, 1, 64), hb, g.Output("s", DType::kFP32, 1, 16));
    expect_caught(g, {{1, 0}, {0, 0}}, "reads B \"hb\" element (0, 0)");
  }
  {
    SCOPED_TRACE("a SwiGLU bias produced by a node");
    HostGraph g(rng);
    const TensorView bias = g.Output("bias", DType::kBF16, 1, 128);
    g.graph().AddGemm("bias_maker", g.Input("x", DType::kBF16, 1, 32), g.Input("w1", DType::kBF16, 128, 32), bias);
    g.graph().AddGemm("glu", g.Input("a", DType::kBF16, 1, 32), g.Input("w2", DType::kBF16, 128, 32),
                      g.Output("out", DType::kFP32, 1, 64), {.activation = Activation::kSwiGLU, .bias = bias});
    // glu's n_block 1 reads bias columns 64-127 (its output columns 32-63),
    // which bias_maker's n_block 1 writes.
    expect_caught(g, {{0, 0}, {1, 1}, {0, 1}, {1, 0}}, "reads bias \"bias\" element (0, 64)");
  }
}

TEST_F(BrokenScheduleTest, ScheduleOfAnotherGraphIsInvalidArgument) {
  sched::Schedule other = schedule_;
  other.nodes.pop_back();
  EXPECT_EQ(RunReference(g_->graph(), other).code(), absl::StatusCode::kInvalidArgument);
  other = schedule_;
  other.nodes[0].k += 1;
  const absl::Status status = RunReference(g_->graph(), other);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("\"up\""), std::string::npos) << status;
}

TEST(BrokenSplitScheduleTest, ReduceBeforePartialsAndBadSplitRanges) {
  Rng rng;
  HostGraph g(rng);
  g.graph().AddGemm("gemm", g.Input("a", DType::kBF16, 64, 128), g.Input("b", DType::kBF16, 64, 128),
                    g.Output("c", DType::kFP32, 64, 64));
  sched::SchedulerOptions options = SmallTiles(2, 1);
  options.reduce_in_parts = false;     // one reduce job (parts: the next test but one)
  options.sum_in_last_split = false;  // (the last split summing: the next test)
  absl::StatusOr<sched::Schedule> s = LowerGraph(g.graph(), options);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->queue.size(), 3u);  // split 0, split 1, reduce
  sched::Schedule reduce_first = *s;
  std::rotate(reduce_first.queue.begin(), reduce_first.queue.begin() + 2, reduce_first.queue.end());
  ExpectInternal(RunReference(g.graph(), reduce_first), "split-K partial 0");
  sched::Schedule gap = *s;
  gap.queue[1].k_block_begin += 1;  // split 1 no longer starts where split 0 ends
  ExpectInternal(RunReference(g.graph(), gap), "expected to start at");
}

TEST(BrokenSplitScheduleTest, LastSplitSumsOnlyAfterTheOthers) {
  Rng rng;
  HostGraph g(rng);
  g.graph().AddGemm("gemm", g.Input("a", DType::kBF16, 64, 192), g.Input("b", DType::kBF16, 64, 192),
                    g.Output("c", DType::kFP32, 64, 64));
  const std::vector<HostMatrix> expected = g.NaiveOutputs();
  sched::SchedulerOptions options = SmallTiles(3, 1);
  options.reduce_in_parts = false;
  absl::StatusOr<sched::Schedule> s = LowerGraph(g.graph(), options);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->nodes[0].reduce_parts, 0);
  ASSERT_EQ(s->queue.size(), 3u);  // splits 0, 1, 2; split 2 sums
  g.ExpectExecutorMatches(*s, {}, expected);
  sched::Schedule early = *s;
  std::swap(early.queue[1], early.queue[2]);  // the last split before split 1
  ExpectInternal(RunReference(g.graph(), early), "reads split-K partial 1 of its own tile");
  sched::Schedule reduce = *s;  // a reduce job where the last split sums
  reduce.queue.push_back(sched::TileJob{0, static_cast<uint8_t>(sched::JobKind::kReduce), 0, 0, 0, 0, 3});
  ExpectInternal(RunReference(g.graph(), reduce), "part 0 of reduce_parts 0");
}

TEST(BrokenSplitScheduleTest, EveryReducePartOnceAndTheTileWholeOnlyWithAll) {
  Rng rng;
  HostGraph g(rng);
  g.graph().AddGemm("gemm", g.Input("a", DType::kBF16, 40, 128), g.Input("b", DType::kBF16, 64, 128),
                    g.Output("c", DType::kFP32, 40, 64));
  const std::vector<HostMatrix> expected = g.NaiveOutputs();
  sched::SchedulerOptions options = SmallTiles(2, 1);
  options.reduce_part_rows = 16;
  absl::StatusOr<sched::Schedule> s = LowerGraph(g.graph(), options);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->nodes[0].reduce_parts, 3);  // rows 0-15, 16-31, 32-39
  ASSERT_EQ(s->queue.size(), 5u);          // split 0, split 1, part 0, part 1, part 2
  g.ExpectExecutorMatches(*s, {}, expected);
  sched::Schedule twice = *s;
  twice.queue[4] = twice.queue[3];
  ExpectInternal(RunReference(g.graph(), twice), "reduces tile (0, 0) a second time");
  sched::Schedule missing = *s;
  missing.queue.pop_back();
  ExpectInternal(RunReference(g.graph(), missing), "is never computed");
  sched::Schedule past = *s;
  past.queue[4].split = 3;
  ExpectInternal(RunReference(g.graph(), past), "part 3 of reduce_parts 3");
}

// Two nodes, "first" (40 x 64, K = 128) read as A by "second", lowered at
// split 2 on 8-row tiles: the scheduler reduces the first in 5 parts of 8 rows.
absl::StatusOr<sched::Schedule> AddPartedPair(HostGraph& g) {
  const TensorView h = g.Output("h", DType::kBF16, 40, 64);
  g.graph().AddGemm("first", g.Input("x", DType::kBF16, 40, 128), g.Input("w1", DType::kBF16, 64, 128), h);
  g.graph().AddGemm("second", h, g.Input("w2", DType::kBF16, 32, 64), g.Output("y", DType::kFP32, 40, 32));
  return LowerGraph(g.graph(), SmallTiles(2, 1));
}

// A consumer of a node reduced in parts waits for every part: with one part
// moved behind the consumer's first job, the queue is not topological.
TEST(BrokenSplitScheduleTest, ConsumerOfAPartedTileWaitsForEveryPart) {
  Rng rng;
  HostGraph g(rng);
  absl::StatusOr<sched::Schedule> s = AddPartedPair(g);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->nodes[0].reduce_parts, 5);  // 8 rows each (the scheduler's choice)
  EXPECT_TRUE(sched::CheckQueue(*s).ok()) << sched::CheckQueue(*s);
  EXPECT_TRUE(RunReference(g.graph(), *s, {.simulated_sms = 3, .seed = rng.seed()}).ok());
  // The first node's last part, moved to the end of the queue.
  sched::Schedule late = *s;
  size_t last_part = 0;
  for (size_t i = 0; i < late.queue.size(); ++i) {
    if (late.queue[i].node == 0 && late.queue[i].kind == static_cast<uint8_t>(sched::JobKind::kReduce)) last_part = i;
  }
  std::rotate(late.queue.begin() + last_part, late.queue.begin() + last_part + 1, late.queue.end());
  const absl::Status order = sched::CheckQueue(late);
  EXPECT_EQ(order.code(), absl::StatusCode::kInternal) << order;
  EXPECT_NE(order.message().find("before any job that writes it"), std::string::npos) << order;
  ExpectInternal(RunReference(g.graph(), late), "not a topological order");
}

// Each reduce part marks only its own rows written: a consumer whose edges
// are dropped, queued after every part but the first, is caught reading the
// first part's rows (the later parts' sums of them would be the same values,
// so only the data check can tell).
TEST(BrokenSplitScheduleTest, AReducePartWritesOnlyItsOwnRows) {
  Rng rng;
  HostGraph g(rng);
  absl::StatusOr<sched::Schedule> s = AddPartedPair(g);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->nodes[0].reduce_parts, 5);  // rows 0-7, 8-15, ..., 32-39
  sched::Schedule late = *s;
  late.nodes[1].dependency_count = 0;
  const auto part0 = std::find_if(late.queue.begin(), late.queue.end(), [](const sched::TileJob& job) {
    return job.node == 0 && job.kind == static_cast<uint8_t>(sched::JobKind::kReduce) && job.split == 0;
  });
  ASSERT_NE(part0, late.queue.end());
  std::rotate(part0, part0 + 1, late.queue.end());
  ExpectInternal(RunReference(g.graph(), late), "reads A \"h\" element (0, 0)");
}

// Reduce parts that leave rows of a tile unsummed, a cluster size no kernel
// runs, and a dependency edge outside what Lower accepts are Internal, not a
// run that reports OK over unwritten rows, a loop of 2^31 ranks or a signed
// overflow (found by review: RunReference takes hand-built schedules).
TEST(BrokenSplitScheduleTest, ScheduleFieldsOutsideLowersRangesAreReported) {
  Rng rng;
  HostGraph g(rng);
  absl::StatusOr<sched::Schedule> s = AddPartedPair(g);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->nodes[0].reduce_parts, 5);  // 8 rows each
  ASSERT_TRUE(RunReference(g.graph(), *s).ok());
  sched::Schedule short_parts = *s;
  short_parts.nodes[0].reduce_part_rows = 1;  // 5 parts of 1 row: rows 5-39 never summed
  ExpectInternal(RunReference(g.graph(), short_parts), "reduce_parts 5 of 1 rows (split_k 2), which do not cover");
  sched::Schedule wide_parts = *s;
  wide_parts.nodes[0].reduce_part_rows = sched::kFewRowReduceRows + 1;
  ExpectInternal(RunReference(g.graph(), wide_parts), "reduce_parts 5 of 17 rows");
  ASSERT_EQ(s->nodes[1].reduce_parts, 0);  // its last split sums
  sched::Schedule unsplit = *s;
  unsplit.nodes[1].split_k = 1;  // a last split that sums, without split-K
  ExpectInternal(RunReference(g.graph(), unsplit), "reduce_parts 0 of 0 rows (split_k 1)");
  sched::Schedule many_parts = *s;
  many_parts.nodes[0].reduce_parts = sched::kMaxReduceParts + 1;  // covers the rows, past the parts' bit mask
  ExpectInternal(RunReference(g.graph(), many_parts), "reduce_parts 9 of 8 rows");
  sched::Schedule wide_cluster = *s;
  wide_cluster.cluster_size = INT32_MAX;
  ExpectInternal(RunReference(g.graph(), wide_cluster), "cluster size 2147483647");
  ASSERT_EQ(s->nodes[1].dependency_count, 1);
  sched::Schedule far_edge = *s;
  far_edge.dependencies[s->nodes[1].dependency_begin].row_offset = INT64_MAX;
  ExpectInternal(RunReference(g.graph(), far_edge), "dependency 0 has row_offset 9223372036854775807, past +-2^62");
  sched::Schedule odd_operand = *s;
  odd_operand.dependencies[s->nodes[1].dependency_begin].operand = 9;
  ExpectInternal(RunReference(g.graph(), odd_operand), "dependency 0 has operand 9, not one of A, B, bias, residual");
}

// The same checks at their limits: reduce parts one row short of the tile's
// rows; splits that start where they should but stop a k-block short of K; a
// split index equal to split_k.
TEST(BrokenSplitScheduleTest, ScheduleFieldsJustOutsideTheirRangesAreReported) {
  Rng rng;
  {
    HostGraph g(rng);
    absl::StatusOr<sched::Schedule> s = AddPartedPair(g);
    ASSERT_TRUE(s.ok()) << s.status();
    sched::Schedule one_row_short = *s;
    one_row_short.nodes[0].reduce_parts = 3;
    one_row_short.nodes[0].reduce_part_rows = 13;  // 39 of the tile's 40 rows
    ExpectInternal(RunReference(g.graph(), one_row_short), "reduce_parts 3 of 13 rows (split_k 2), which do not cover");
  }
  HostGraph g(rng);
  g.graph().AddGemm("gemm", g.Input("a", DType::kBF16, 64, 128), g.Input("b", DType::kBF16, 64, 128),
                    g.Output("c", DType::kFP32, 64, 64));
  sched::SchedulerOptions options = SmallTiles(2, 1);
  options.reduce_in_parts = false;
  options.sum_in_last_split = false;
  absl::StatusOr<sched::Schedule> s = LowerGraph(g.graph(), options);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->queue.size(), 3u);  // split 0 (k-blocks 0-1), split 1 (2-3), reduce
  ASSERT_EQ(s->queue[1].k_block_end, 4);
  sched::Schedule short_k = *s;
  short_k.queue[1].k_block_end = 3;
  ExpectInternal(RunReference(g.graph(), short_k), "splits cover k-blocks [0, 3) of 4");
  sched::Schedule split_past = *s;
  split_past.queue[1].split = 2;
  ExpectInternal(RunReference(g.graph(), split_past), "split 2 of split_k 2");
}

// The schedule of `nodes` independent small split-K nodes (split 8, 64 x 64
// tiles) scaled to `side` x `side` FP32 outputs with K = 256, and a graph of
// that shape over made-up addresses: RunReference must refuse it before it
// reads any.
struct ScaledSplit {
  GemmGraph graph;
  sched::Schedule schedule;
};
ScaledSplit ScaledSplitSchedule(int64_t side, int nodes = 1) {
  Rng rng;
  HostGraph small(rng);
  for (int i = 0; i < nodes; ++i) {
    const std::string n = absl::StrCat(i);
    small.graph().AddGemm(absl::StrCat("gemm", n), small.Input("a" + n, DType::kBF16, 64, 256),
                          small.Input("b" + n, DType::kBF16, 64, 256), small.Output("c" + n, DType::kFP32, 64, 64));
  }
  absl::StatusOr<sched::Schedule> s = LowerGraph(small.graph(), SmallTiles(8, 1));
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return {};
  ScaledSplit scaled;
  scaled.schedule = *std::move(s);
  const auto at = [](int i, int operand) { return reinterpret_cast<void*>(static_cast<uint64_t>(3 * i + operand + 1) << 42); };
  for (int i = 0; i < nodes; ++i) {
    const std::string n = absl::StrCat(i);
    scaled.graph.AddGemm(absl::StrCat("gemm", n), TensorView::Dense("a" + n, at(i, 0), DType::kBF16, side, 256),
                         TensorView::Dense("b" + n, at(i, 1), DType::kBF16, side, 256),
                         TensorView::Dense("c" + n, at(i, 2), DType::kFP32, side, side));
    sched::NodeSchedule& node = scaled.schedule.nodes[i];
    EXPECT_EQ(node.split_k, 8);
    node.m = node.n = node.out_cols = side;
    node.m_blocks = static_cast<int32_t>(side / 64);
    node.n_blocks = static_cast<int32_t>(side / 64);
  }
  return scaled;
}

// A split whose FP64 partials host memory cannot hold is ResourceExhausted
// naming the node, not std::bad_alloc (Compile accepts split_k 256 of an
// output whose partials there take split_k x M x N doubles). A 2^22 x 2^22
// output at split 8: 2^47 doubles, 2^50 bytes, past any host's memory (the
// check before the fill refuses it) and past a 47-bit user address space.
// (The catches of a failed allocation, behind that check, have no test: no
// size passes it and fails to allocate on every host.)
TEST(BrokenSplitScheduleTest, PartialsPastHostMemoryAreResourceExhausted) {
  const ScaledSplit big = ScaledSplitSchedule(int64_t{1} << 22);
  if (HasFailure()) return;
  const absl::Status status = RunReference(big.graph, big.schedule);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("node \"gemm0\"'s tile flags (65536 x 65536 tiles) and split-K partials "
                                  "(split_k 8 x M 4194304 x N 4194304 doubles) do not fit in host memory: the "
                                  "nodes' state up to it takes "),
            std::string::npos)
      << status;
}

// Partials larger than the host's physical memory but inside the address
// space (2^20 x 2^20 at split 8: 2^46 bytes, 64 TiB) are refused before any
// is filled, by the host's memory size rather than a failed allocation,
// which a host that overcommits memory would not report.
TEST(BrokenSplitScheduleTest, PartialsPastPhysicalMemoryAreRefusedBeforeTheFill) {
  const ScaledSplit big = ScaledSplitSchedule(int64_t{1} << 20);
  if (HasFailure()) return;
  const absl::Status status = RunReference(big.graph, big.schedule);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("(split_k 8 x M 1048576 x N 1048576 doubles) do not fit in host memory: the "
                                  "nodes' state up to it takes 70388608401408 bytes, and this host has "),
            std::string::npos)
      << status;
}

// Two nodes whose partials each take ~60% of the memory this process can
// still be given: the second is refused, naming it, before the first's are
// filled (a check node by node would fill ~60% of it with NaN first).
TEST(BrokenSplitScheduleTest, NodesThatFitAloneButNotTogetherAreRefusedBeforeTheFill) {
  const std::optional<internal::HostMemoryBudget> budget =
      internal::HostMemoryBudgetOf(internal::ReadHostMemoryFacts());
  if (!budget) GTEST_SKIP() << "this host does not say how much memory it has";
  // 8 splits x side^2 doubles = 0.6 of the budget, side a multiple of 64.
  const int64_t side =
      std::max<int64_t>(64, static_cast<int64_t>(std::sqrt(0.6 * static_cast<double>(budget->bytes) / 64) / 64) * 64);
  const ScaledSplit big = ScaledSplitSchedule(side, /*nodes=*/2);
  if (HasFailure()) return;
  const auto start = std::chrono::steady_clock::now();
  const absl::Status status = RunReference(big.graph, big.schedule);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("node \"gemm1\"'s tile flags"), std::string::npos) << status;
  EXPECT_NE(status.message().find("this host has"), std::string::npos) << status;
  // It names the figure that bounded the budget (internal::HostMemoryBudget::source).
  EXPECT_NE(status.message().find("bytes for it ("), std::string::npos) << status;
  EXPECT_LT(seconds, 1.0) << "refused only after " << seconds << " s: the first node's partials were filled";
}

// --- The test bed's own checks -------------------------------------------------

TEST(TestbedTest, GuardsCatchStrayWrites) {
  HostMatrix m(DType::kBF16, 3, 5, /*row_stride=*/8);
  EXPECT_TRUE(testbed::CheckGuards(m, "m"));
  m.data()[-1] = std::byte{0};  // just before element (0, 0)
  EXPECT_FALSE(testbed::CheckGuards(m, "m"));
  HostMatrix padding(DType::kFP32, 3, 5, 8);
  std::memset(padding.view().element(1, 5), 0, 4);  // row 1, column 5: padding
  const ::testing::AssertionResult result = testbed::CheckGuards(padding, "padding");
  EXPECT_FALSE(result);
  EXPECT_NE(std::string(result.message()).find("row 1, column 5"), std::string::npos)
      << result.message();
  HostMatrix after(DType::kFP32, 2, 2);
  after.data()[after.body_bytes()] = std::byte{0};
  EXPECT_FALSE(testbed::CheckGuards(after));
}

TEST(TestbedTest, FillsArePoisonFreeAndNeverAllZero) {
  Rng rng;
  for (DType dtype : {DType::kBF16, DType::kFP16, DType::kFP8E4M3, DType::kFP32}) {
    HostMatrix m(dtype, 17, 9, 16);
    testbed::Poison(m);
    EXPECT_EQ(testbed::CountUnwritten(m.view()), 17 * 9);
    EXPECT_TRUE(std::isnan(m.at(3, 4)));
    testbed::FillRandom(m, rng);
    EXPECT_EQ(testbed::CountUnwritten(m.view()), 0);
    for (int64_t r = 0; r < 17; ++r) {
      for (int64_t c = 0; c < 9; ++c) {
        EXPECT_LE(std::fabs(m.at(r, c)), 1.0);
      }
    }
    testbed::FillIntegers(m, rng);
    for (int64_t r = 0; r < 17; ++r) {
      for (int64_t c = 0; c < 9; ++c) {
        EXPECT_EQ(m.at(r, c), std::round(m.at(r, c)));
        EXPECT_LE(std::fabs(m.at(r, c)), 2.0);
      }
    }
    EXPECT_TRUE(testbed::CheckGuards(m));
  }
  // A 1x1 fp8 matrix filled with values too small to represent still is not zero.
  HostMatrix tiny(DType::kFP8E4M3, 1, 1);
  testbed::FillRandom(tiny, rng, 0.0, 1e-6);
  EXPECT_NE(tiny.at(0, 0), 0.0);
}

// A fill of several chunks (2^20 elements a chunk: 1048 rows of 1000) is the
// same for the same seed, however the host's cores took the chunks, and its
// chunks are not copies of each other (each has its own engine). The padding
// of a strided view stays untouched.
TEST(TestbedTest, LargeFillsDependOnTheSeedAlone) {
  constexpr int64_t rows = 3000, cols = 1000;
  HostMatrix first(DType::kBF16, rows, cols, 1008), second(DType::kBF16, rows, cols, 1008);
  const uint64_t seed = testbed::TestSeed();
  Rng rng_first(seed), rng_second(seed);
  testbed::FillRandom(first, rng_first);
  testbed::FillRandom(second, rng_second);
  EXPECT_EQ(std::memcmp(first.data(), second.data(), static_cast<size_t>(first.body_bytes())), 0);
  EXPECT_TRUE(testbed::CheckGuards(first));
  int64_t same = 0;
  for (int64_t c = 0; c < cols; ++c) same += first.at(0, c) == first.at(1048, c) ? 1 : 0;
  EXPECT_LT(same, cols / 4) << "rows 0 and 1048, the first of chunks 0 and 1, agree in " << same << " of " << cols;
}

TEST(TestbedTest, CompareToReferenceAppliesTheTolerance) {
  Rng rng;
  constexpr int64_t m = 16, n = 24, k = 256;
  HostMatrix a(DType::kBF16, m, k), b(DType::kBF16, n, k), out(DType::kFP32, m, n),
      ref(DType::kFP32, m, n);
  testbed::FillRandom(a, rng);
  testbed::FillRandom(b, rng);
  GemmGraph graph;
  graph.AddGemm("g", a.view("a"), b.view("b"), ref.view("ref"));
  ASSERT_TRUE(RunNaiveGraph(graph).ok());
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) out.set(r, c, ref.at(r, c));
  }
  EXPECT_TRUE(testbed::CompareToReference(out, ref, a, b));
  // The bound of element (2, 3): 2^-8 |ref| + 4 sqrt(K) 2^-24 (|A||B|)_23.
  double ab = 0.0;
  for (int64_t kk = 0; kk < k; ++kk) ab += std::fabs(a.at(2, kk)) * std::fabs(b.at(3, kk));
  const double bound = 0x1p-8 * std::fabs(ref.at(2, 3)) + 4 * std::sqrt(256.0) * 0x1p-24 * ab;
  out.set(2, 3, ref.at(2, 3) + 0.9 * bound);
  EXPECT_TRUE(testbed::CompareToReference(out, ref, a, b));
  out.set(2, 3, ref.at(2, 3) + 1.1 * bound);
  testbed::Comparison bad = testbed::CompareToReference(out, ref, a, b);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.mismatches, 1);
  EXPECT_NE(bad.report.find("(2, 3)"), std::string::npos) << bad.report;
  // Unwritten elements are counted separately from mismatches.
  out.set(2, 3, ref.at(2, 3));
  testbed::Poison(out.view().Rows(5, 2));
  testbed::Comparison unwritten = testbed::CompareToReference(out, ref, a, b);
  EXPECT_EQ(unwritten.unwritten, 2 * n);
  EXPECT_EQ(unwritten.mismatches, 0);
  EXPECT_FALSE(unwritten.ok());
  // A bf16 output gets its output rounding on top: 2^-7 |ref| in all.
  HostMatrix out16(DType::kBF16, m, n), ref16(DType::kBF16, m, n);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      ref16.set(r, c, ref.at(r, c));
      out16.set(r, c, ref.at(r, c));
    }
  }
  out16.set(0, 0, ref16.at(0, 0) + UlpOf(DType::kBF16, ref16.at(0, 0)) *
                                       (ref16.at(0, 0) < 0 ? -1 : 1));
  EXPECT_TRUE(testbed::CompareToReference(out16, ref16, a, b));
}

TEST(TestbedTest, CompareNodeToReferenceCarriesErrorThroughSwiGLU) {
  Rng rng;
  constexpr int64_t m = 8, n = 16, k = 512;
  HostMatrix a(DType::kBF16, m, k), b(DType::kBF16, n, k), ref(DType::kFP32, m, n / 2),
      out(DType::kFP32, m, n / 2);
  testbed::FillRandom(a, rng);
  testbed::FillRandom(b, rng);
  GemmGraph graph;
  graph.AddGemm("swiglu", a.view("a"), b.view("b"), ref.view("ref"),
                {.activation = Activation::kSwiGLU, .bias = {}, .residual = {}});
  ASSERT_TRUE(RunNaiveGraph(graph).ok());
  // An FP32-accumulated version of the same node passes.
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n / 2; ++j) {
      float gate = 0.0f, up = 0.0f;
      for (int64_t kk = 0; kk < k; ++kk) {
        gate += static_cast<float>(a.at(i, kk)) * static_cast<float>(b.at(2 * j, kk));
        up += static_cast<float>(a.at(i, kk)) * static_cast<float>(b.at(2 * j + 1, kk));
      }
      out.set(i, j, static_cast<float>(gate / (1.0f + std::exp(-gate)) * up));
    }
  }
  EXPECT_TRUE(testbed::CompareNodeToReference(graph.nodes()[0], out.view("out"), ref.view("ref")));
  // Far outside: the carried term is a few 1e-2 at most here (|u| < ~20, e < ~1e-3).
  out.set(1, 1, ref.at(1, 1) + 0.25 + 0.05 * std::fabs(ref.at(1, 1)));
  EXPECT_FALSE(testbed::CompareNodeToReference(graph.nodes()[0], out.view("out"), ref.view("ref")).ok());
}

// Each element's bound uses its own |A||B|, also for an element in the second
// chunk of rows and the third block of columns that CompareNodeToReference
// computes them in (4 Mi elements a chunk: 20971 rows of 200; blocks of 64
// columns). Element (20990, 150) is an exact zero whose |A||B| is 64, where
// any other row of A with column 150 of B gives at most 16 and any other
// column with row 20990 at most 8, so only its own products give the bound
// that 0.9x stays inside and 1.1x falls outside of.
TEST(TestbedTest, CompareNodeToReferenceBoundsEachElementByItsOwnProducts) {
  constexpr int64_t m = 21000, n = 200, k = 8, row = 20990, col = 150;
  Rng rng;
  HostMatrix a(DType::kBF16, m, k), b(DType::kBF16, n, k), ref(DType::kFP32, m, n), out(DType::kFP32, m, n);
  testbed::FillRandom(a, rng);
  testbed::FillRandom(b, rng);
  for (int64_t kk = 0; kk < k; ++kk) {
    a.set(row, kk, kk < 2 ? 4.0 : 0.0);
    b.set(col, kk, kk == 0 ? 8.0 : kk == 1 ? -8.0 : 0.0);
  }
  GemmGraph graph;
  graph.AddGemm("g", a.view("a"), b.view("b"), ref.view("ref"));
  ASSERT_TRUE(RunNaiveGraph(graph).ok());
  ASSERT_EQ(ref.at(row, col), 0.0);
  std::memcpy(out.data(), ref.data(), static_cast<size_t>(ref.body_bytes()));
  const GemmNode& node = graph.nodes()[0];
  EXPECT_TRUE(testbed::CompareNodeToReference(node, out.view("out"), ref.view("ref")));
  const double bound = 4 * std::sqrt(static_cast<double>(k)) * 0x1p-24 * 64.0;
  out.set(row, col, 0.9 * bound);
  EXPECT_TRUE(testbed::CompareNodeToReference(node, out.view("out"), ref.view("ref")));
  out.set(row, col, 1.1 * bound);
  const testbed::Comparison bad = testbed::CompareNodeToReference(node, out.view("out"), ref.view("ref"));
  EXPECT_EQ(bad.mismatches, 1);
  EXPECT_NE(bad.report.find("(20990, 150)"), std::string::npos) << bad.report;
}

// An infinite reference (fp16 A = B = 256 at K = 1: 65536, past fp16's
// range) is matched only by the same infinity: its relative bound is
// infinite, and every finite value, or -Inf, passed it before. Exact
// comparisons take equal infinities as equal.
TEST(TestbedTest, AnInfiniteReferenceIsMatchedOnlyByItself) {
  HostMatrix a(DType::kFP16, 1, 8), b(DType::kFP16, 1, 8), ref(DType::kFP16, 1, 1), out(DType::kFP16, 1, 1);
  for (int64_t kk = 0; kk < 8; ++kk) {
    a.set(0, kk, kk == 0 ? 256.0 : 0.0);
    b.set(0, kk, kk == 0 ? 256.0 : 0.0);
  }
  GemmGraph graph;
  graph.AddGemm("overflow", a.view("a"), b.view("b"), ref.view("ref"));
  ASSERT_TRUE(RunNaiveGraph(graph).ok());
  ASSERT_TRUE(std::isinf(ref.at(0, 0)) && ref.at(0, 0) > 0) << ref.at(0, 0);
  const auto matches = [&](double value) {
    out.set(0, 0, value);
    return testbed::CompareNodeToReference(graph.nodes()[0], out.view("out"), ref.view("ref")).ok();
  };
  EXPECT_TRUE(matches(std::numeric_limits<double>::infinity()));
  EXPECT_FALSE(matches(-std::numeric_limits<double>::infinity()));
  EXPECT_FALSE(matches(65504.0));
  EXPECT_FALSE(matches(0.0));
  out.set(0, 0, std::numeric_limits<double>::infinity());
  EXPECT_TRUE(testbed::CompareExactly(out.view("out"), ref.view("ref")).ok());
}

TEST(TestbedTest, SkipsWithoutHopperGpu) {
  std::string why;
  if (testbed::HasHopperGpu(&why)) {
    GTEST_SKIP() << "this machine has a Hopper GPU; the no-GPU path is not exercised";
  }
  EXPECT_FALSE(why.empty());
  LOOM_SKIP_WITHOUT_GPU();
  ADD_FAILURE() << "LOOM_SKIP_WITHOUT_GPU did not skip";
}

TEST(TestbedTest, DeviceBufferRoundTrip) {
  LOOM_SKIP_WITHOUT_GPU();
  Rng rng;
  HostMatrix host(DType::kBF16, 33, 20, 24);
  testbed::FillRandom(host, rng);
  absl::StatusOr<testbed::DeviceBuffer> device = testbed::DeviceBuffer::CopyOf(host);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(device->view("d").data) % 16, 0u);
  HostMatrix back(DType::kBF16, 33, 20, 24);
  ASSERT_TRUE(device->CopyTo(back).ok());
  EXPECT_TRUE(testbed::CompareExactly(back.view("back"), host.view("host")));
  EXPECT_TRUE(testbed::CheckGuards(back));
}

}  // namespace
}  // namespace loom
