// Runtime::Compile end to end on random graphs, random options and random
// devices, on the CPU (Runtime::ForDescription):
//  * a well-formed graph compiles, or the options or the device are refused
//    with InvalidArgument / FailedPrecondition and a message; on the H200 with
//    default options it always compiles;
//  * a compiled plan explains itself the same way twice, and its schedule,
//    run by the CPU reference on virtual SMs in a random interleaving,
//    writes every output element, node by node within TESTING.md's bound of a
//    naive loop over the same inputs, and nothing outside the outputs; and
//    the kernels' own waits, replayed (testbed/kernel_waits.h), come in queue
//    order and cover every A tile read;
//  * a graph with one broken rule is refused with InvalidArgument naming a
//    node, whatever the options.
// The scheduler's and the validator's own tests pin each rule and tiling
// case; this one looks for the combinations nobody wrote down. Every failure
// prints the seed (LOOM_TEST_SEED=<seed> replays it) and the case.
#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "loom/graph.h"
#include "loom/reference.h"
#include "loom/runtime.h"
#include "testbed/kernel_waits.h"
#include "testbed/random_options.h"
#include "testbed/testbed.h"

namespace loom {
namespace {

using testbed::HostMatrix;
using testbed::HostTensors;
using testbed::OneIn;
using testbed::Pick;
using testbed::Rng;

// A random well-formed graph over host buffers: chains (a node reads an
// earlier bf16 output as A: whole, a column slice, a row slice, or the same
// bytes as half the rows of twice the width, which maps to no translation
// and waits for the whole producer), fresh inputs, column joins and row joins
// (two nodes write the halves of one buffer that a later node may read
// whole), biases that are inputs or a one-row node's output, residuals that
// are inputs or earlier outputs, every activation, bf16 and fp32 outputs,
// padded row strides, and now and then K = 0 (the epilogue alone; its bias
// and residual then inputs, as the graph rules want).
class FuzzGraph {
 public:
  // `zero_k`: whether some nodes may have K = 0 (the broken graphs have none:
  // their A and B are then empty, and empty views are exempt from the rules
  // a breakage of A or B would break).
  explicit FuzzGraph(Rng& rng, bool zero_k = true) : rng_(rng), zero_k_(zero_k) {}

  void Build() {
    rows_ = Pick<int64_t>(rng_, {1, 2, 3, 8, 15, 16, 17, 31, 33, 64, 65, 100, 128, 129, 200});
    const int count = static_cast<int>(rng_.UniformInt(1, 6));
    for (int i = 0; i < count; ++i) {
      const int64_t kind = rng_.UniformInt(0, 9);
      if (kind == 0 && i + 2 <= count) {
        AddColumnJoin();
        ++i;
      } else if (kind == 1 && i + 2 <= count && rows_ >= 2) {
        AddRowJoin();
        ++i;
      } else if (kind == 2) {
        AddBiasProducer();
      } else {
        const TensorView a = NewA();
        AddNode(a, NewOutput(a.rows), /*readable=*/true);
      }
    }
  }

  GemmGraph& graph() { return graph_; }
  HostTensors& tensors() { return tensors_; }
  // The views nodes write (C of every node).
  std::vector<TensorView> outputs() const {
    std::vector<TensorView> views;
    for (const GemmNode& node : graph_.nodes()) views.push_back(node.c);
    return views;
  }
  int64_t multiply_adds() const {
    int64_t total = 0;
    for (const GemmNode& node : graph_.nodes()) total += node.m() * node.n() * node.k();
    return total;
  }

 private:
  // Widths are multiples of 8 (16 where SwiGLU halves them): every bf16 or
  // fp32 row then starts 16-byte aligned, as TMA needs.
  int64_t Width() { return Pick<int64_t>(rng_, {8, 16, 24, 40, 64, 72, 96, 128, 136, 200, 264}); }

  template <typename T>
  const T& Any(const std::vector<T>& values) {
    return values[rng_.UniformInt(0, static_cast<int64_t>(values.size()) - 1)];
  }

  TensorView NewInput(const std::string& prefix, DType dtype, int64_t rows, int64_t cols) {
    const std::string name = absl::StrCat(prefix, next_tensor_++);
    const int64_t stride = (rows > 1 && OneIn(rng_, 4)) ? cols + 8 : 0;
    TensorView view = tensors_.Add(name, dtype, rows, cols, stride);
    testbed::FillRandom(tensors_[name], rng_);
    return view;
  }

  // Earlier bf16 outputs of `rows` rows.
  std::vector<TensorView> ReadableA(int64_t rows) const {
    std::vector<TensorView> candidates;
    for (const TensorView& c : readable_) {
      if (c.dtype == DType::kBF16 && c.rows == rows) candidates.push_back(c);
    }
    return candidates;
  }

  // A of rows [first, first + rows) of the graph's rows: mostly an earlier
  // output (whole or a column slice), else a fresh input. Without `rows` (any
  // shape will do: C is made to fit) all rows, now and then reshaped.
  TensorView NewA(int64_t first = 0, int64_t rows = -1) {
    const bool any_shape = rows < 0;
    if (any_shape) rows = rows_;
    const std::vector<TensorView> candidates = ReadableA(rows_);
    if (candidates.empty() || OneIn(rng_, 4)) return NewInput("in", DType::kBF16, rows, Width());
    TensorView c = Any(candidates);
    if (rows != rows_) c = c.Rows(first, rows).Named(absl::StrCat(c.name, ".rows"));
    if (c.cols >= 16 && OneIn(rng_, 3)) {
      const int64_t col = 8 * rng_.UniformInt(0, c.cols / 8 - 1);
      const int64_t count = 8 * rng_.UniformInt(1, (c.cols - col) / 8);
      return c.Columns(col, count).Named(absl::StrCat(c.name, ".cols"));
    }
    if (any_shape && rows % 2 == 0 && c.row_stride == c.cols && OneIn(rng_, 4)) {
      return TensorView{c.name + ".reshaped", c.data, c.dtype, rows / 2, 2 * c.cols, 2 * c.cols};
    }
    return c;
  }

  TensorView NewOutput(int64_t rows) {
    // Often as wide as a produced bias, so that the node may add it.
    const int64_t n_out = !produced_biases_.empty() && OneIn(rng_, 2) ? Any(produced_biases_).cols : Width();
    const DType dtype = OneIn(rng_, 3) ? DType::kFP32 : DType::kBF16;
    const std::string name = absl::StrCat("out", next_tensor_++);
    const int64_t stride = (rows > 1 && OneIn(rng_, 4)) ? n_out + 8 : 0;
    return tensors_.Add(name, dtype, rows, n_out, stride);
  }

  // Two nodes write the left and right columns of one buffer, which later
  // nodes may read whole (a consumer of two producers).
  void AddColumnJoin() {
    const int64_t left = Width();
    const int64_t right = Width();
    const std::string name = absl::StrCat("cat", next_tensor_++);
    const TensorView cat = tensors_.Add(name, DType::kBF16, rows_, left + right);
    AddNode(NewA(0, rows_), cat.Columns(0, left).Named(name + ".left"), /*readable=*/false);
    AddNode(NewA(0, rows_), cat.Columns(left, right).Named(name + ".right"), /*readable=*/false);
    readable_.push_back(cat);
  }

  // Two nodes write the top and bottom rows of one buffer.
  void AddRowJoin() {
    const int64_t top = rng_.UniformInt(1, rows_ - 1);
    const std::string name = absl::StrCat("stack", next_tensor_++);
    const TensorView stack = tensors_.Add(name, DType::kBF16, rows_, Width());
    AddNode(NewA(0, top), stack.Rows(0, top).Named(name + ".top"), /*readable=*/false);
    AddNode(NewA(top, rows_ - top), stack.Rows(top, rows_ - top).Named(name + ".bottom"), /*readable=*/false);
    readable_.push_back(stack);
  }

  // A one-row node whose output later nodes of its width may take as bias.
  void AddBiasProducer() {
    const TensorView a = NewInput("in", DType::kBF16, 1, Width());
    const int64_t n = Width();
    const std::string name = absl::StrCat("biasout", next_tensor_++);
    const TensorView c = tensors_.Add(name, OneIn(rng_, 2) ? DType::kFP32 : DType::kBF16, 1, n);
    AddNode(a, c, /*readable=*/false);
    produced_biases_.push_back(c);
  }

  void AddNode(const TensorView& a, const TensorView& c, bool readable) {
    Epilogue epilogue;
    epilogue.activation =
        Pick(rng_, {Activation::kNone, Activation::kReLU, Activation::kGELU, Activation::kSiLU, Activation::kSwiGLU});
    const int64_t n = epilogue.activation == Activation::kSwiGLU ? 2 * c.cols : c.cols;
    std::vector<TensorView> produced;
    for (const TensorView& bias : produced_biases_) {
      if (bias.cols == n) produced.push_back(bias);
    }
    bool reads_produced = false;  // a bias or residual some node writes
    if (!produced.empty() && OneIn(rng_, 2)) {
      epilogue.bias = Any(produced);
      reads_produced = true;
    } else if (OneIn(rng_, 3)) {
      epilogue.bias = NewInput("bias", OneIn(rng_, 2) ? DType::kFP32 : DType::kBF16, 1, n);
    }
    if (OneIn(rng_, 3)) {
      std::vector<TensorView> same_shape;
      for (const TensorView& r : readable_) {
        if (r.rows == c.rows && r.cols == c.cols) same_shape.push_back(r);
      }
      const bool produced_residual = !same_shape.empty() && OneIn(rng_, 2);
      epilogue.residual = produced_residual
                              ? Any(same_shape)
                              : NewInput("res", OneIn(rng_, 2) ? DType::kFP32 : DType::kBF16, c.rows, c.cols);
      reads_produced |= produced_residual;
    }
    TensorView b = NewInput("w", DType::kBF16, n, a.cols);
    TensorView a_read = a;
    if (zero_k_ && !reads_produced && OneIn(rng_, 10)) {  // K = 0: no columns of A or B
      a_read = a.Columns(0, 0).Named(a.name + ".k0");
      b = b.Columns(0, 0).Named(b.name + ".k0");
    }
    graph_.AddGemm(absl::StrCat("node", graph_.size()), a_read, b, c, std::move(epilogue));
    if (readable) readable_.push_back(c);
  }

  Rng& rng_;
  const bool zero_k_;
  int64_t rows_ = 0;
  int next_tensor_ = 0;
  HostTensors tensors_;
  GemmGraph graph_;
  std::vector<TensorView> readable_;         // outputs later nodes may read as A or residual
  std::vector<TensorView> produced_biases_;  // one-row outputs later nodes may add as bias
};

// Mostly the H200; else fewer SMs, less shared memory, no cluster launch, or
// a description no GPU has.
DeviceDescription RandomDevice(Rng& rng) {
  DeviceDescription device = DeviceDescription::H200();
  if (OneIn(rng, 2)) return device;
  device.name = "fuzzed device";
  device.sm_count = Pick(rng, {-1, 0, 1, 2, 3, 16, 78, 114, 132, 144});
  device.shared_memory_per_block = Pick<int64_t>(rng, {0, 49152, 101376, 166912, 232448});
  device.cluster_launch = !OneIn(rng, 4);
  device.max_coresident_clusters = Pick(rng, {-1, 0, 1, 8, 57, 66});
  return device;
}

std::string Describe(const DeviceDescription& device, const CompileOptions& options) {
  return absl::StrFormat("device: %d SMs, %d B shared, clusters %d, %d co-resident; options: %s", device.sm_count,
                         device.shared_memory_per_block, device.cluster_launch, device.max_coresident_clusters,
                         testbed::DescribeOptions(options));
}

std::string DescribeGraph(const GemmGraph& graph) {
  std::string text;
  for (const GemmNode& node : graph.nodes()) {
    absl::StrAppendFormat(&text, "\n  %s: %s [%d x %d] . %s [%d x %d]^T -> %s [%d x %d] %s, %s%s%s", node.name,
                          node.a.name, node.a.rows, node.a.cols, node.b.name, node.b.rows, node.b.cols, node.c.name,
                          node.c.rows, node.c.cols, DTypeName(node.c.dtype), ActivationName(node.epilogue.activation),
                          node.epilogue.bias ? ", bias " + node.epilogue.bias->name : "",
                          node.epilogue.residual ? ", residual " + node.epilogue.residual->name : "");
  }
  return text;
}

// Row-by-row copies of a view's elements (padding untouched).
void CopyElements(const TensorView& from, const TensorView& to) {
  for (int64_t row = 0; row < from.rows; ++row) {
    std::memcpy(to.element(row, 0), from.element(row, 0), from.cols * from.element_size());
  }
}

// Runs the plan's schedule on `sms` virtual SMs, then checks each node's
// output against a naive loop over the inputs the run itself gave that node
// (so a later node is not blamed for an earlier node's last-bit rounding).
void ExpectPlanMatchesNaive(const Plan& plan, FuzzGraph& g, int sms, uint64_t seed) {
  const std::vector<TensorView> outputs = g.outputs();
  for (const TensorView& c : outputs) testbed::Poison(c);
  const absl::Status run = RunReference(plan, {.simulated_sms = sms, .seed = seed});
  ASSERT_TRUE(run.ok()) << run;

  std::vector<HostMatrix> computed;  // what the schedule wrote, node by node
  for (const TensorView& c : outputs) {
    computed.emplace_back(c.dtype, c.rows, c.cols);
    CopyElements(c, computed.back().view());
  }
  for (int i = 0; i < g.graph().size(); ++i) {
    const GemmNode& node = g.graph().nodes()[i];
    GemmGraph single;
    single.AddGemm(node.name, node.a, node.b, node.c, node.epilogue);
    const absl::Status naive = RunNaiveGraph(single);
    ASSERT_TRUE(naive.ok()) << node.name << ": " << naive;
    HostMatrix expected(node.c.dtype, node.c.rows, node.c.cols);
    CopyElements(node.c, expected.view());
    CopyElements(computed[i].view(), node.c);  // later nodes read the schedule's output
    EXPECT_TRUE(testbed::CompareNodeToReference(node, computed[i].view(node.c.name), expected.view("naive")))
        << node.name;
  }
  for (const auto& [name, matrix] : g.tensors().all()) EXPECT_TRUE(testbed::CheckGuards(*matrix, name));
}

bool IsRefusal(const absl::Status& status) {
  return (absl::IsInvalidArgument(status) || absl::IsFailedPrecondition(status)) && !status.message().empty();
}

TEST(CompileFuzzTest, WellFormedGraphsCompileOrAreRefusedAndRunLikeTheNaiveLoop) {
  Rng rng;
  int compiled = 0, refused = 0, narrow = 0, zero_k = 0;
  for (int iteration = 0; iteration < 400; ++iteration) {
    FuzzGraph g(rng);
    g.Build();
    if (g.multiply_adds() > 12'000'000) continue;  // keep the FP64 loops to seconds
    ASSERT_TRUE(g.graph().Validate().ok()) << g.graph().Validate() << DescribeGraph(g.graph());
    const DeviceDescription device = RandomDevice(rng);
    const CompileOptions options = testbed::RandomCompileOptions(rng, testbed::OptionRanges::kAny);
    SCOPED_TRACE(absl::StrCat("iteration ", iteration, "; ", Describe(device, options), DescribeGraph(g.graph())));

    const Runtime runtime = Runtime::ForDescription(device);
    absl::StatusOr<Plan> plan = runtime.Compile(g.graph(), options);
    if (!plan.ok()) {
      EXPECT_TRUE(IsRefusal(plan.status())) << plan.status();
      const absl::StatusOr<Plan> h200_default =
          Runtime::ForDescription(DeviceDescription::H200()).Compile(g.graph());
      ASSERT_TRUE(h200_default.ok()) << h200_default.status();
      ++refused;
      continue;
    }
    ++compiled;
    narrow += plan->kernel() == KernelChoice::kNarrow;
    for (const GemmNode& node : g.graph().nodes()) zero_k += node.k() == 0;
    const std::string explained = plan->Explain();
    EXPECT_FALSE(explained.empty());
    const absl::StatusOr<Plan> again = runtime.Compile(g.graph(), options);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->Explain(), explained) << "the same graph and options explained differently";
    // The kernels' own waits, replayed: each published earlier in the queue,
    // and every A tile a k-block loads among them.
    const std::vector<std::string> out_of_order = testbed::WaitsOutOfQueueOrder(*plan);
    EXPECT_TRUE(out_of_order.empty()) << out_of_order.front();
    const std::vector<std::string> unsound = testbed::UnsoundWaits(*plan);
    EXPECT_TRUE(unsound.empty()) << unsound.front();
    ExpectPlanMatchesNaive(*plan, g, static_cast<int>(rng.UniformInt(1, 140)), rng.seed() + iteration);
    if (HasFatalFailure() || HasNonfatalFailure()) return;  // one case is enough to read
  }
  std::printf("compiled %d plans (%d narrow, %d nodes with K = 0), %d refused\n", compiled, narrow, zero_k,
              refused);
  EXPECT_GT(compiled, 20);
  EXPECT_GT(zero_k, 5);
  EXPECT_GT(narrow, 5);
}

// One broken rule each, applied to one node of a well-formed graph.
struct Breakage {
  std::string what;
  std::function<void(GemmNode&, const GemmGraph&)> apply;
};

std::vector<Breakage> Breakages() {
  std::vector<Breakage> all;
  all.push_back({"negative rows", [](GemmNode& n, const GemmGraph&) { n.a.rows = -1; }});
  all.push_back({"K mismatch", [](GemmNode& n, const GemmGraph&) { n.b.cols = n.a.cols + 8; }});
  all.push_back({"C too wide", [](GemmNode& n, const GemmGraph&) { n.c.cols += 8; }});
  all.push_back({"null A", [](GemmNode& n, const GemmGraph&) {
                   n.a.data = nullptr;
                   n.a.cols = std::max<int64_t>(n.a.cols, 8);
                   n.b.cols = n.a.cols;
                 }});
  all.push_back({"misaligned B", [](GemmNode& n, const GemmGraph&) { n.b.data = n.b.element(0, 0) + 2; }});
  all.push_back({"K = 0 and a residual another node writes", [](GemmNode& n, const GemmGraph& g) {
                   n.a.cols = n.b.cols = 0;
                   // Another node's output of C's shape (rule 10), else C itself (in place: rule 6).
                   n.epilogue.residual = n.c;
                   for (const GemmNode& other : g.nodes()) {
                     if (other.name != n.name && other.c.rows == n.c.rows && other.c.cols == n.c.cols) {
                       n.epilogue.residual = other.c;
                     }
                   }
                 }});
  all.push_back({"a row slice past its view", [](GemmNode& n, const GemmGraph&) {
                   n.c = n.c.Rows(1, n.c.rows);
                   n.a = n.a.Rows(1, n.a.rows);
                 }});
  all.push_back({"fp16 A", [](GemmNode& n, const GemmGraph&) { n.a.dtype = DType::kFP16; }});
  all.push_back({"fp8 C", [](GemmNode& n, const GemmGraph&) { n.c.dtype = DType::kFP8E4M3; }});
  all.push_back({"stride below cols", [](GemmNode& n, const GemmGraph&) {
                   n.b.row_stride = n.b.cols - 1;
                   n.b.rows = std::max<int64_t>(n.b.rows, 2);
                 }});
  all.push_back({"SwiGLU on an odd N", [](GemmNode& n, const GemmGraph&) {
                   n.epilogue.activation = Activation::kSwiGLU;
                   n.b.rows = 2 * n.c.cols + 1;
                 }});
  all.push_back({"bias of the wrong width", [](GemmNode& n, const GemmGraph&) {
                   TensorView bias = n.b.Rows(0, 1).Named("bias_wrong");
                   bias.cols = n.n() + 8;
                   bias.row_stride = bias.cols;
                   n.epilogue.bias = bias;
                 }});
  all.push_back({"output over its own B", [](GemmNode& n, const GemmGraph&) {
                   n.c = n.b.Named("c_over_b");
                   n.c.rows = n.a.rows;
                   n.c.cols = n.out_cols();
                   n.c.row_stride = std::max(n.c.cols, n.b.row_stride);
                 }});
  all.push_back({"K past the job encoding", [](GemmNode& n, const GemmGraph&) {
                   n.a.cols = n.b.cols = 5'000'000;
                   n.a.row_stride = n.b.row_stride = 5'000'000;
                 }});
  all.push_back({"a second writer of node 0's output", [](GemmNode& n, const GemmGraph& graph) {
                   const TensorView& first = graph.nodes()[0].c;
                   n.epilogue = {};
                   n.c = first.Named("c_again");
                   n.b.rows = first.cols;
                   n.a.rows = first.rows;
                 }});
  return all;
}

TEST(CompileFuzzTest, BrokenGraphsAreInvalidArgumentNamingANode) {
  Rng rng;
  const std::vector<Breakage> breakages = Breakages();
  for (int iteration = 0; iteration < 400; ++iteration) {
    FuzzGraph g(rng, /*zero_k=*/false);
    g.Build();
    const Breakage& breakage = breakages[iteration % breakages.size()];
    std::vector<GemmNode> nodes = g.graph().nodes();
    // The second writer needs a node besides node 0 to be it.
    const int64_t first = breakage.what.starts_with("a second writer") ? 1 : 0;
    if (first >= static_cast<int64_t>(nodes.size())) continue;
    const int victim = static_cast<int>(rng.UniformInt(first, static_cast<int64_t>(nodes.size()) - 1));
    GemmGraph broken;
    for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
      if (i == victim) breakage.apply(nodes[i], g.graph());
      broken.AddGemm(nodes[i].name, nodes[i].a, nodes[i].b, nodes[i].c, nodes[i].epilogue);
    }
    const DeviceDescription device = RandomDevice(rng);
    const CompileOptions options = testbed::RandomCompileOptions(rng, testbed::OptionRanges::kAny);
    SCOPED_TRACE(absl::StrCat("iteration ", iteration, ": ", breakage.what, " in node", victim, "; ",
                              Describe(device, options), DescribeGraph(broken)));
    const absl::StatusOr<Plan> plan = Runtime::ForDescription(device).Compile(broken, options);
    ASSERT_FALSE(plan.ok()) << "a broken graph compiled";
    EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << plan.status();
    EXPECT_TRUE(absl::StrContains(plan.status().message(), "node \"")) << plan.status();
  }
}

}  // namespace
}  // namespace loom
