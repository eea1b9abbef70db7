// GPU tests of the persistent kernel: single GEMMs over the tile and cluster
// edge cases, fused epilogues, both ring modes, independent batches in one
// launch, replay determinism, and the bounded-wait time-out. Each compares
// against the FP64 CPU reference on fresh random data with poisoned outputs
// and guard bands. Skips (saying why) without a Hopper GPU.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu_harness.h"
#include "gtest/gtest.h"
#include "internal/driver_entry.h"    // runtime/internal
#include "internal/testing_hooks.h"  // runtime/internal
#include "loom/runtime.h"
#include "narrow_config.h"

namespace loom::testbed {
namespace {

struct Shape {
  int64_t m, n, k;
};

std::string ShapeName(const Shape& s) {
  return absl::StrCat("M", s.m, "_N", s.n, "_K", s.k);
}

// One plain GEMM, C = A · Bᵀ: A [m, k] and B [n, k] bf16 of fresh random
// values, C [m, n] of `out_type`.
void AddPlainGemm(GpuHarness& h, Rng& rng, const Shape& shape, DType out_type = DType::kBF16) {
  h.Input("A", DType::kBF16, shape.m, shape.k, rng);
  h.Input("B", DType::kBF16, shape.n, shape.k, rng);
  h.Output("C", out_type, shape.m, shape.n);
  h.Build([](const auto& t, GemmGraph& g) { g.AddGemm("gemm", t("A"), t("B"), t("C")); });
}

// A kernel and, on the tiled kernel, a tile width (0: the plan's choice).
struct KernelWidth {
  KernelChoice kernel;
  int tile_n;
};

class SingleGemmTest : public ::testing::TestWithParam<std::tuple<Shape, DType, KernelWidth>> {};

TEST_P(SingleGemmTest, MatchesReference) {
  LOOM_SKIP_WITHOUT_GPU();
  const auto [shape, out_type, kernel] = GetParam();
  Rng rng;
  GpuHarness h;
  AddPlainGemm(h, rng, shape, out_type);
  CompileOptions options;
  options.kernel = kernel.kernel;
  options.tile_n = kernel.tile_n;
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  // kNarrow runs the narrow kernel up to NarrowConfig::kMaxRows rows, the
  // tiled one past them.
  const bool narrow = kernel.kernel == KernelChoice::kNarrow && shape.m <= kernel::NarrowConfig::kMaxRows;
  EXPECT_EQ(h.plan().kernel(), narrow ? KernelChoice::kNarrow : KernelChoice::kTiled);
  h.ExpectMatchesReference();
}

// M, N from TESTING.md's edge list; K around one ring's worth of k-blocks
// (64 * 4 stages +- 8), tiny K and a long K. On both kernels (kNarrow runs
// 65 and 127 rows in two row blocks, the shapes of more than 128 tiled); the
// tiled kernel at the width it chooses (128 at all these sizes: at most 64
// tiles of 128 columns) and at 256.
INSTANTIATE_TEST_SUITE_P(
    EdgeShapes, SingleGemmTest,
    ::testing::Combine(::testing::Values(Shape{1, 1, 8}, Shape{3, 63, 16}, Shape{63, 64, 248},
                                         Shape{64, 65, 264}, Shape{65, 127, 64}, Shape{127, 129, 4096},
                                         Shape{129, 1000, 264}, Shape{1000, 3, 4096}, Shape{1000, 1000, 248},
                                         Shape{256, 512, 1024}, Shape{129, 257, 520}),
                       ::testing::Values(DType::kBF16, DType::kFP32),
                       ::testing::Values(KernelWidth{KernelChoice::kTiled, 0}, KernelWidth{KernelChoice::kTiled, 256},
                                         KernelWidth{KernelChoice::kNarrow, 0})),
    [](const auto& info) {
      const KernelWidth kernel = std::get<2>(info.param);
      return ShapeName(std::get<0>(info.param)) + (std::get<1>(info.param) == DType::kBF16 ? "_bf16" : "_fp32") +
             "_" + AbslUnparseFlag(kernel.kernel) + (kernel.tile_n != 0 ? std::to_string(kernel.tile_n) : "");
    });

// 0.5, 1.25 and 2.5 waves of CTA tiles with the grid capped at 8 clusters (16
// CTAs), on 256-wide tiles (the plan would take 128-wide ones at 512 x 512:
// a whole wave).
struct WavesCase {
  Shape shape;
  double waves;
};
class WavesTest : public ::testing::TestWithParam<WavesCase> {};
TEST_P(WavesTest, MatchesReference) {
  LOOM_SKIP_WITHOUT_GPU();
  const Shape shape = GetParam().shape;
  Rng rng;
  GpuHarness h;
  AddPlainGemm(h, rng, shape);
  CompileOptions options = WideTiledOptions();
  options.max_clusters = 8;
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  const sched::Schedule& schedule = h.plan().schedule();
  const int64_t ctas = int64_t{h.plan().grid_clusters()} * schedule.cluster_size;
  const int64_t cta_tiles = (shape.m + schedule.tile.m - 1) / schedule.tile.m *
                            ((shape.n + schedule.tile.n - 1) / schedule.tile.n);
  ASSERT_EQ(ctas, 16);
  EXPECT_EQ(static_cast<double>(cta_tiles), GetParam().waves * static_cast<double>(ctas))
      << cta_tiles << " CTA tiles of " << schedule.tile.m << " x " << schedule.tile.n;
  h.ExpectMatchesReference();
}
INSTANTIATE_TEST_SUITE_P(Waves, WavesTest,
                         ::testing::Values(WavesCase{{512, 512, 512}, 0.5}, WavesCase{{640, 1024, 512}, 1.25},
                                           WavesCase{{1280, 1024, 512}, 2.5}),
                         [](const auto& info) { return ShapeName(info.param.shape); });

// K at 64 x stages +- 8 for the tiled kernel's default ring depths on each
// tile width (TESTING.md): 7 A and 5 B stages on 128-wide tiles, 4 and 4 on
// 256-wide ones, unsplit, so that a job's k-blocks end one short of a ring's
// depth, exactly at it, or one past it (the ring wrapping inside the job).
struct RingEdgeCase {
  int tile_n;
  int64_t k;
};
class RingDepthEdgeTest : public ::testing::TestWithParam<RingEdgeCase> {};
TEST_P(RingDepthEdgeTest, MatchesReference) {
  LOOM_SKIP_WITHOUT_GPU();
  const RingEdgeCase& c = GetParam();
  Rng rng;
  GpuHarness h;
  AddPlainGemm(h, rng, Shape{300, 520, c.k});
  CompileOptions options;
  options.kernel = KernelChoice::kTiled;
  options.tile_n = c.tile_n;
  options.split_k = 1;
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  const std::string stages = c.tile_n == 128 ? "(A 7 stages" : "(A 4 stages";
  EXPECT_NE(h.plan().Explain().find(stages), std::string::npos) << h.plan().Explain();
  ExpectMatchesReferenceAndReplayIdentical(h);
}
INSTANTIATE_TEST_SUITE_P(Depths, RingDepthEdgeTest,
                         ::testing::Values(RingEdgeCase{128, 440}, RingEdgeCase{128, 456}, RingEdgeCase{128, 312},
                                           RingEdgeCase{128, 328}, RingEdgeCase{256, 248}, RingEdgeCase{256, 264}),
                         [](const auto& info) {
                           return absl::StrCat("tile_n", info.param.tile_n, "_K", info.param.k);
                         });

TEST(GemmTest, IntegerDataIsExact) {
  LOOM_SKIP_WITHOUT_GPU();
  Rng rng;
  GpuHarness h;
  // |sum| <= 4 * 520 = 2080: exact in FP32 accumulation and in the fp32 output.
  h.Input("A", DType::kBF16, 300, 520, rng, /*integers=*/true);
  h.Input("B", DType::kBF16, 700, 520, rng, /*integers=*/true);
  h.Output("C", DType::kFP32, 300, 700);
  h.Build([](const auto& t, GemmGraph& g) { g.AddGemm("gemm", t("A"), t("B"), t("C")); });
  LOOM_ASSERT_OK(h.Run(TestRuntime()));
  h.ExpectMatchesReference(/*exact=*/true);
}

// Every fused op with and without bias and residual, on tiles of either width.
class EpilogueTest : public ::testing::TestWithParam<std::tuple<Activation, bool, bool, DType, int>> {};
TEST_P(EpilogueTest, MatchesReference) {
  LOOM_SKIP_WITHOUT_GPU();
  const auto [activation, with_bias, with_residual, out_type, tile_n] = GetParam();
  Rng rng;
  GpuHarness h;
  const int64_t m = 200, n = 520, k = 320;
  const int64_t out_cols = activation == Activation::kSwiGLU ? n / 2 : n;
  h.Input("A", DType::kBF16, m, k, rng);
  h.Input("B", DType::kBF16, n, k, rng);
  h.Input("bias", DType::kFP32, 1, n, rng);
  h.Input("residual", DType::kBF16, m, out_cols, rng);
  h.Output("C", out_type, m, out_cols);
  h.Build([&](const auto& t, GemmGraph& g) {
    Epilogue epilogue;
    epilogue.activation = activation;
    if (with_bias) epilogue.bias = t("bias");
    if (with_residual) epilogue.residual = t("residual");
    g.AddGemm("gemm", t("A"), t("B"), t("C"), epilogue);
  });
  LOOM_ASSERT_OK(h.Run(TestRuntime(), CompileOptions{.tile_n = tile_n}));
  h.ExpectMatchesReference();
}
INSTANTIATE_TEST_SUITE_P(
    Epilogues, EpilogueTest,
    ::testing::Combine(::testing::Values(Activation::kNone, Activation::kReLU, Activation::kGELU,
                                         Activation::kSiLU, Activation::kSwiGLU),
                       ::testing::Bool(), ::testing::Bool(), ::testing::Values(DType::kBF16, DType::kFP32),
                       ::testing::Values(128, 256)));

// fp16 inputs (the kernels' fp16 instantiations, half_types.cuh): the
// output, bias and residual in fp16 or fp32, through each epilogue path of
// the tiled kernel (plain tiles through stmatrix, the fused passes, the
// staged residual, ragged last columns, the last split's sum, the few-row
// reduce straight into C) and each multiply of the narrow one (mma.sync at 1
// and 16 rows, paired k-blocks at 24, wgmma m64n32k16 at 64, two row blocks
// at 100; packed weights; two consumer warpgroups).
struct Fp16Case {
  std::string name;
  Shape shape;
  DType out;
  Activation activation;
  std::optional<DType> bias, residual;  // none, or its type
  int tile_n;       // 0: the plan's choice
  int split_k = 0;  // 0: the plan's choice
  KernelChoice kernel = KernelChoice::kTiled;
  bool pack_weights = false;
  int narrow_consumers = 0;  // 0: the plan's choice
};

void PrintTo(const Fp16Case& c, std::ostream* os) { *os << c.name; }

class Fp16GemmTest : public ::testing::TestWithParam<Fp16Case> {};
TEST_P(Fp16GemmTest, MatchesReference) {
  LOOM_SKIP_WITHOUT_GPU();
  const Fp16Case& c = GetParam();
  Rng rng;
  GpuHarness h;
  const int64_t out_cols = c.activation == Activation::kSwiGLU ? c.shape.n / 2 : c.shape.n;
  h.Input("A", DType::kFP16, c.shape.m, c.shape.k, rng);
  h.Input("B", DType::kFP16, c.shape.n, c.shape.k, rng);
  if (c.bias) h.Input("bias", *c.bias, 1, c.shape.n, rng);
  if (c.residual) h.Input("residual", *c.residual, c.shape.m, out_cols, rng);
  h.Output("C", c.out, c.shape.m, out_cols);
  h.Build([&](const auto& t, GemmGraph& g) {
    Epilogue epilogue;
    epilogue.activation = c.activation;
    if (c.bias) epilogue.bias = t("bias");
    if (c.residual) epilogue.residual = t("residual");
    g.AddGemm("gemm", t("A"), t("B"), t("C"), epilogue);
  });
  CompileOptions options;
  options.kernel = c.kernel;
  options.tile_n = c.tile_n;
  options.split_k = c.split_k;
  options.pack_weights = c.pack_weights;
  options.narrow_consumers = c.narrow_consumers;
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  EXPECT_EQ(h.plan().kernel(), c.kernel);
  ExpectMatchesReferenceAndReplayIdentical(h);
}
constexpr DType kFP16 = DType::kFP16;
constexpr DType kFP32 = DType::kFP32;
INSTANTIATE_TEST_SUITE_P(
    Paths, Fp16GemmTest,
    ::testing::Values(
        Fp16Case{"plain_fp16", {256, 512, 1024}, kFP16, Activation::kNone, {}, {}, 256},
        Fp16Case{"plain_fp32", {256, 512, 1024}, kFP32, Activation::kNone, {}, {}, 128},
        Fp16Case{"ragged", {129, 1000, 264}, kFP16, Activation::kNone, {}, {}, 0},
        Fp16Case{"bias_relu", {200, 520, 320}, kFP16, Activation::kReLU, kFP16, {}, 256},
        Fp16Case{"gelu_fp32_bias_residual", {200, 520, 320}, kFP32, Activation::kGELU, kFP32, kFP16, 128},
        Fp16Case{"staged_residual", {256, 512, 320}, kFP16, Activation::kNone, kFP16, kFP16, 256, 1},
        Fp16Case{"fp32_residual", {256, 512, 320}, kFP16, Activation::kNone, {}, kFP32, 128, 1},
        Fp16Case{"swiglu", {200, 520, 320}, kFP16, Activation::kSwiGLU, kFP32, kFP16, 256},
        Fp16Case{"last_split_sums", {300, 1024, 4096}, kFP16, Activation::kNone, kFP16, kFP16, 128, 3},
        // The 256-wide split-K instantiation: a last split that sums, and
        // few-row sums in parts.
        Fp16Case{"last_split_sums_256", {300, 1024, 4096}, kFP16, Activation::kGELU, kFP32, kFP16, 256, 3},
        Fp16Case{"few_row_parts_256", {16, 1000, 4096}, kFP16, Activation::kSiLU, kFP16, kFP16, 256, 8},
        // An fp16 residual beside an fp32 output (pair loads, not staged).
        Fp16Case{"fp32_out_fp16_residual", {256, 512, 320}, kFP32, Activation::kNone, {}, kFP16, 128, 1},
        Fp16Case{"fp32_out_fp16_residual_256", {256, 512, 320}, kFP32, Activation::kNone, {}, kFP16, 256, 1},
        Fp16Case{"decode_one_token", {1, 4096, 4096}, kFP16, Activation::kNone, {}, {}, 0},
        Fp16Case{"decode_silu_bias_residual", {16, 2048, 8192}, kFP16, Activation::kSiLU, kFP16, kFP16, 0},
        Fp16Case{"decode_swiglu", {64, 1000, 4096}, kFP16, Activation::kSwiGLU, {}, {}, 0},
        Fp16Case{"decode_fp32", {16, 2048, 8192}, kFP32, Activation::kNone, kFP32, kFP32, 0},
        Fp16Case{"narrow_one_row_silu", {1, 1000, 4096}, kFP16, Activation::kSiLU, kFP16, {}, 0, 0,
                 KernelChoice::kNarrow},
        Fp16Case{"narrow_16_rows_swiglu", {16, 520, 1024}, kFP16, Activation::kSwiGLU, kFP32, kFP16, 0, 0,
                 KernelChoice::kNarrow},
        Fp16Case{"narrow_paired_24_rows", {24, 1000, 4096}, kFP32, Activation::kNone, {}, kFP32, 0, 0,
                 KernelChoice::kNarrow},
        Fp16Case{"narrow_wgmma_64_rows_packed", {64, 1000, 4096}, kFP16, Activation::kGELU, kFP16, kFP16, 0, 0,
                 KernelChoice::kNarrow, true},
        Fp16Case{"narrow_two_row_blocks", {100, 512, 1024}, kFP16, Activation::kReLU, kFP16, {}, 0, 0,
                 KernelChoice::kNarrow},
        Fp16Case{"narrow_two_consumers", {48, 2048, 4096}, kFP16, Activation::kNone, {}, kFP16, 0, 0,
                 KernelChoice::kNarrow, false, 2}),
    [](const auto& info) { return info.param.name; });

// Integers in [-300, 300] are exact in fp16 but past 256 most are not in
// bf16, so a path that read or rounded the inputs as bf16 would show here;
// |sum| <= 300 * 2 * 520 is exact in FP32 accumulation and output.
TEST(GemmTest, Fp16IntegerDataIsExact) {
  LOOM_SKIP_WITHOUT_GPU();
  Rng rng;
  GpuHarness h;
  h.Input("A", DType::kFP16, 300, 520, rng);
  h.Input("B", DType::kFP16, 700, 520, rng);
  FillIntegers(h.host("A"), rng, -300, 300);
  FillIntegers(h.host("B"), rng, -2, 2);
  h.Output("C", DType::kFP32, 300, 700);
  h.Build([](const auto& t, GemmGraph& g) { g.AddGemm("gemm", t("A"), t("B"), t("C")); });
  LOOM_ASSERT_OK(h.Run(TestRuntime()));
  h.ExpectMatchesReference(/*exact=*/true);
}

// Integer data whose fp32 results are exact (B in [-2, 2], A in [-a_range,
// a_range], an integer bias in [-2, 2] and residual in [-256, 256]) but need
// rounding in a 16-bit output: bf16 past 256, fp16 past 2048. Each kernel's
// cast must round to nearest even, as the reference does, bit for bit: the
// tolerance of the other tests is at least an ulp of a 16-bit output, so a
// cast that truncated would pass them. Each case checks that at least 2% of
// its outputs lie past its type's exact integers (7-23% do; a range too
// narrow for its K would round nothing). The paths: the tiled kernel's register stores
// (ReLU) and staged bf16 residual, a few-row split-K sum written straight
// into C, the narrow kernel's mma.sync (8 rows) and wgmma (40 rows) stores,
// and an fp16 output.
struct RoundedCase {
  std::string name;
  Shape shape;
  DType type;  // of every matrix
  bool residual;
  int split_k;
  KernelChoice kernel;
  Activation activation = Activation::kNone;
  int a_range = 2;
};
class RoundedOutputTest : public ::testing::TestWithParam<RoundedCase> {};
TEST_P(RoundedOutputTest, IntegerSumsRoundToNearestEven) {
  LOOM_SKIP_WITHOUT_GPU();
  const RoundedCase& c = GetParam();
  Rng rng;
  GpuHarness h;
  h.Input("A", c.type, c.shape.m, c.shape.k, rng);
  h.Input("B", c.type, c.shape.n, c.shape.k, rng);
  h.Input("bias", c.type, 1, c.shape.n, rng);
  FillIntegers(h.host("A"), rng, -c.a_range, c.a_range);
  FillIntegers(h.host("B"), rng, -2, 2);
  FillIntegers(h.host("bias"), rng, -2, 2);
  if (c.residual) {
    h.Input("R", c.type, c.shape.m, c.shape.n, rng);
    FillIntegers(h.host("R"), rng, -256, 256);
  }
  h.Output("C", c.type, c.shape.m, c.shape.n);
  h.Build([c](const auto& t, GemmGraph& g) {
    Epilogue epilogue{.activation = c.activation, .bias = t("bias")};
    if (c.residual) epilogue.residual = t("R");
    g.AddGemm("gemm", t("A"), t("B"), t("C"), epilogue);
  });
  CompileOptions options;
  options.kernel = c.kernel;
  options.split_k = c.split_k;
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  ASSERT_EQ(h.plan().kernel(), c.kernel);
  h.ExpectMatchesReference(/*exact=*/true);
  const double exact_up_to = c.type == DType::kBF16 ? 256 : 2048;
  const HostMatrix& out = h.host("C");
  int64_t past = 0;
  for (int64_t r = 0; r < out.rows(); ++r) {
    for (int64_t col = 0; col < out.cols(); ++col) past += std::abs(out.at(r, col)) > exact_up_to;
  }
  EXPECT_GE(past * 50, out.rows() * out.cols())
      << past << " of " << out.rows() * out.cols() << " outputs past " << exact_up_to;
}
INSTANTIATE_TEST_SUITE_P(
    Paths, RoundedOutputTest,
    ::testing::Values(
        RoundedCase{"tiled_bf16_relu", {300, 704, 520}, DType::kBF16, false, 1, KernelChoice::kTiled,
                    Activation::kReLU, 16},
        RoundedCase{"tiled_bf16_staged_residual", {300, 512, 520}, DType::kBF16, true, 1, KernelChoice::kTiled},
        RoundedCase{"tiled_bf16_few_row_split", {16, 1000, 1024}, DType::kBF16, true, 4, KernelChoice::kTiled},
        RoundedCase{"narrow_bf16_mma_sync", {8, 1000, 520}, DType::kBF16, true, 0, KernelChoice::kNarrow},
        RoundedCase{"narrow_bf16_wgmma", {40, 1000, 520}, DType::kBF16, true, 0, KernelChoice::kNarrow},
        RoundedCase{"tiled_fp16", {300, 704, 1024}, kFP16, true, 1, KernelChoice::kTiled, Activation::kNone, 64}),
    [](const auto& info) { return info.param.name; });

// A bf16 residual of a bf16 output on whole tiles goes through the staging
// buffers in 16-byte row chunks (StoreFragmentsAddingResidual): here the
// residual is a column view of a wider buffer, so its rows are 768 columns
// apart and start 128 columns in; M = 300 leaves the third row block's
// first warpgroup (rows 256..299 of its 64) on the register path. With and
// without a bias, on tiles of either width, against the reference.
class StagedResidualTest : public ::testing::TestWithParam<std::tuple<bool, int>> {};
TEST_P(StagedResidualTest, ColumnViewResidualMatchesReference) {
  LOOM_SKIP_WITHOUT_GPU();
  const auto [with_bias, tile_n] = GetParam();
  Rng rng;
  GpuHarness h;
  const int64_t m = 300, n = 512, k = 192;
  h.Input("A", DType::kBF16, m, k, rng);
  h.Input("B", DType::kBF16, n, k, rng);
  h.Input("bias", DType::kBF16, 1, n, rng);
  h.Input("R", DType::kBF16, m, 768, rng);
  h.Output("C", DType::kBF16, m, n);
  h.Build([with_bias = with_bias](const auto& t, GemmGraph& g) {
    Epilogue epilogue;
    if (with_bias) epilogue.bias = t("bias");
    epilogue.residual = t("R").Columns(128, 512).Named("R.mid");
    g.AddGemm("gemm", t("A"), t("B"), t("C"), epilogue);
  });
  CompileOptions options;
  options.kernel = KernelChoice::kTiled;
  options.tile_n = tile_n;
  options.split_k = 1;  // the unsplit kernel, whose whole tiles take this path
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  h.ExpectMatchesReference();
}
INSTANTIATE_TEST_SUITE_P(Tiles, StagedResidualTest, ::testing::Combine(::testing::Bool(), ::testing::Values(128, 256)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "bias" : "no_bias") + "_n" +
                                  std::to_string(std::get<1>(info.param));
                         });

// The tiled kernel's SwiGLU pass (SwiGLURange) shares one reciprocal among
// four outputs of a thread (rows r and r + 8, output columns c and c + 4).
// Gates set one by one (A = e_0, so acc = B's column 0): zero, both signs,
// the far tails where silu's exponent flushes (|g| past 87), and one NaN,
// which must stay in its own column. FP32 out, checked against silu in FP64.
TEST(GemmTest, TiledSwiGLUAtExtremeGates) {
  LOOM_SKIP_WITHOUT_GPU();
  constexpr int64_t kM = 200, kOutCols = 64, kK = 64;
  constexpr int64_t kNanGate = 21;
  const double gates[] = {0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 5.0, -5.0, 20.0, -20.0, 44.0, -44.0, 50.0,
                          -50.0, 87.0, -87.0, 88.0, -88.0, 100.0, -100.0, 1000.0, -1000.0, 3.0, -3.0};
  Rng rng;
  GpuHarness h;
  h.Input("A", DType::kBF16, kM, kK, rng);
  h.Input("B", DType::kBF16, 2 * kOutCols, kK, rng);
  h.Output("C", DType::kFP32, kM, kOutCols);
  HostMatrix& a = h.host("A");
  HostMatrix& b = h.host("B");
  for (int64_t r = 0; r < kM; ++r) {
    for (int64_t k = 0; k < kK; ++k) a.set(r, k, k == 0 ? 1.0 : 0.0);
  }
  std::vector<double> gate(kOutCols), up(kOutCols);
  for (int64_t j = 0; j < kOutCols; ++j) {
    gate[j] = j == kNanGate ? std::numeric_limits<double>::quiet_NaN() : gates[j % std::size(gates)];
    up[j] = 1.0 + static_cast<double>(j % 3);
    for (int64_t k = 0; k < kK; ++k) {
      b.set(2 * j, k, k == 0 ? gate[j] : 0.0);
      b.set(2 * j + 1, k, k == 0 ? up[j] : 0.0);
    }
  }
  h.Build([](const auto& t, GemmGraph& g) {
    g.AddGemm("gemm", t("A"), t("B"), t("C"), {.activation = Activation::kSwiGLU});
  });
  CompileOptions options = WideTiledOptions();
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  const HostMatrix& c = h.host("C");
  int64_t wrong = 0;
  for (int64_t r = 0; r < kM; ++r) {
    for (int64_t j = 0; j < kOutCols; ++j) {
      const double got = c.at(r, j);
      const double want = gate[j] * up[j] / (1.0 + std::exp(-gate[j]));
      // The NaN column must be written: the poison pattern is a NaN too.
      const bool ok = j == kNanGate ? std::isnan(got) && !IsPoison(c.view(), r, j)
                                    : std::isfinite(got) && std::abs(got - want) <= 1e-5 * std::abs(want) + 1e-30;
      if (!ok && wrong++ < 8) {
        ADD_FAILURE() << "C(" << r << ", " << j << ") = " << got << " for gate " << gate[j] << ", up " << up[j]
                      << "; want " << want;
      }
    }
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_TRUE(CheckGuards(c, "C"));
}

TEST(GemmTest, LockstepRingMatchesReference) {
  LOOM_SKIP_WITHOUT_GPU();
  Rng rng;
  GpuHarness h;
  AddPlainGemm(h, rng, Shape{513, 777, 1000});
  CompileOptions options;
  options.ring_mode = RingMode::kLockstep;
  options.a_stages = options.b_stages = 3;
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  h.ExpectMatchesReference();
}

TEST(GemmTest, IndependentBatchInOneLaunch) {
  LOOM_SKIP_WITHOUT_GPU();
  Rng rng;
  GpuHarness h;
  const Shape shapes[] = {{100, 300, 200}, {1, 4000, 512}, {700, 64, 1000}, {256, 256, 64}, {65, 1500, 72}};
  for (int i = 0; i < 5; ++i) {
    const std::string id = std::to_string(i);
    h.Input("A" + id, DType::kBF16, shapes[i].m, shapes[i].k, rng);
    h.Input("B" + id, DType::kBF16, shapes[i].n, shapes[i].k, rng);
    h.Output("C" + id, i % 2 == 0 ? DType::kBF16 : DType::kFP32, shapes[i].m, shapes[i].n);
  }
  h.Build([](const auto& t, GemmGraph& g) {
    for (int i = 0; i < 5; ++i) {
      const std::string id = std::to_string(i);
      g.AddGemm("gemm" + id, t("A" + id), t("B" + id), t("C" + id));
    }
  });
  LOOM_ASSERT_OK(h.Run(TestRuntime()));
  h.ExpectMatchesReference();
}

// A one-row GEMM whose C and residual carry a row stride Validate ignores
// (a single row's stride is never used; INT64_MAX here), on both kernels:
// the plan gives the kernels the row's width instead, and the row is right.
TEST(GemmTest, SingleRowViewsIgnoreTheirStrides) {
  LOOM_SKIP_WITHOUT_GPU();
  for (const KernelChoice kernel : {KernelChoice::kTiled, KernelChoice::kNarrow}) {
    SCOPED_TRACE(kernel == KernelChoice::kTiled ? "tiled" : "narrow");
    Rng rng;
    GpuHarness h;
    h.Input("A", DType::kBF16, 1, 520, rng);
    h.Input("B", DType::kBF16, 300, 520, rng);
    h.Input("residual", DType::kBF16, 1, 300, rng);
    h.Output("C", DType::kBF16, 1, 300);
    h.Build([](const auto& t, GemmGraph& g) {
      TensorView c = t("C"), residual = t("residual");
      c.row_stride = residual.row_stride = std::numeric_limits<int64_t>::max();
      g.AddGemm("gemm", t("A"), t("B"), c, {.activation = Activation::kReLU, .residual = residual});
    });
    CompileOptions options;
    options.kernel = kernel;
    LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
    EXPECT_EQ(h.plan().kernel(), kernel);
    ExpectMatchesReferenceAndReplayIdentical(h);
  }
}

TEST(GemmTest, ReplayIsBitIdentical) {
  LOOM_SKIP_WITHOUT_GPU();
  Rng rng;
  GpuHarness h;
  AddPlainGemm(h, rng, Shape{1000, 1500, 2000}, DType::kFP32);
  LOOM_ASSERT_OK(h.Run(TestRuntime()));
  EXPECT_TRUE(ReplayIsBitIdentical(h));
  h.ExpectMatchesReference();
}

TEST(GemmTest, ModelShapeAt128Tokens) {
  LOOM_SKIP_WITHOUT_GPU();
  // hidden 4096 -> intermediate 14336 at 128 tokens; the CPU checks all of it
  // (7.5 G multiply-adds in FP64 take a few seconds).
  Rng rng;
  GpuHarness h;
  h.Input("x", DType::kBF16, 128, 4096, rng);
  h.Input("w", DType::kBF16, 14336, 4096, rng);
  h.Output("y", DType::kBF16, 128, 14336);
  h.Build([](const auto& t, GemmGraph& g) { g.AddGemm("up", t("x"), t("w"), t("y")); });
  LOOM_ASSERT_OK(h.Run(TestRuntime()));
  h.ExpectMatchesReference();
}

// Two dependent GEMMs: x[m, 256] -> "first" -> h[m, width] -> "second" ->
// y[m, 256].
void AddTwoGemmChain(GpuHarness& h, Rng& rng, int64_t m, int64_t width) {
  h.Input("x", DType::kBF16, m, 256, rng);
  h.Input("w1", DType::kBF16, width, 256, rng);
  h.Input("w2", DType::kBF16, 256, width, rng);
  h.Output("h", DType::kBF16, m, width);
  h.Output("y", DType::kBF16, m, 256);
  h.Build([](const auto& t, GemmGraph& g) {
    g.AddGemm("first", t("x"), t("w1"), t("h"));
    g.AddGemm("second", t("h"), t("w2"), t("y"));
  });
}

// Launches the plan once more with node `producer`'s tile flags all counted
// as published by the host but `missing`'s (the kernel publishes none of the
// node's), and returns what Synchronize reports. A consumer that waits for
// every producer tile it reads must time out on `missing`'s flag.
absl::Status LaunchWithOneProducerTileMissing(GpuHarness& h, int producer, int missing) {
  if (absl::Status s = internal::SuppressFlagPublishingForTesting(h.plan(), producer); !s.ok()) return s;
  if (absl::Status s = internal::PublishFlagsForTesting(h.plan(), producer, missing); !s.ok()) return s;
  if (absl::Status s = h.plan().Launch(nullptr); !s.ok()) return s;
  return h.plan().Synchronize(nullptr);
}

// The record of a time-out on one of node `producer`'s tile flags: the flag
// is one of that node's output tiles', the epoch its waiter last saw is not
// the one it needed, and the SM is one of the device's. (The waiting job's
// node is in Synchronize's message, which the tests check by name.)
void ExpectProducerFlagTimeoutRecord(const Plan& plan, int producer) {
  const std::optional<TimeoutRecord> last = plan.last_timeout();  // a copy
  ASSERT_TRUE(last.has_value());
  const TimeoutRecord& record = *last;
  const sched::NodeSchedule& node = plan.schedule().nodes[producer];
  bool producers_flag = false;
  for (int32_t mb = 0; mb < node.m_blocks; ++mb) {
    for (int32_t nb = 0; nb < node.n_blocks; ++nb) {
      producers_flag |= record.flag == sched::OutputFlagIndex(node, mb, nb);
    }
  }
  EXPECT_TRUE(producers_flag) << "flag " << record.flag << " is not one of node " << producer << "'s tiles'";
  EXPECT_NE(record.seen, record.expected) << "a wait that saw its epoch timed out";
  EXPECT_GE(record.sm, 0);
  EXPECT_LT(record.sm, TestRuntime().device().sm_count);
  EXPECT_GE(record.job, 0);
  EXPECT_LT(record.job, static_cast<int>(plan.schedule().queue.size()));
}

// A dependency that is never satisfied: the producer is told not to publish
// its tile flags, so the consumer's loader waits until the watchdog fires.
TEST(GemmTest, UnsatisfiedDependencyTimesOutWithRecord) {
  LOOM_SKIP_WITHOUT_GPU();
  Rng rng;
  GpuHarness h;
  AddTwoGemmChain(h, rng, /*m=*/128, /*width=*/256);
  CompileOptions options;
  options.spin_timeout_ns = 20'000'000;  // 20 ms
  // Run once normally to build the plan, then break it and replay.
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  LOOM_ASSERT_OK(internal::SuppressFlagPublishingForTesting(h.plan(), /*node=*/0));
  LOOM_ASSERT_OK(h.plan().Launch(nullptr));
  const absl::Status status = h.plan().Synchronize(nullptr);
  ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(std::string(status.message()).find("dependency flag"), std::string::npos) << status;
  EXPECT_NE(std::string(status.message()).find("node \"second\""), std::string::npos) << status;
  ExpectProducerFlagTimeoutRecord(h.plan(), /*producer=*/0);
  // The context is still usable: a fresh plan of the same graph runs and is right.
  GpuHarness again;
  again.Input("x", DType::kBF16, 128, 256, rng);
  again.Input("w", DType::kBF16, 256, 256, rng);
  again.Output("y", DType::kBF16, 128, 256);
  again.Build([](const auto& t, GemmGraph& g) { g.AddGemm("gemm", t("x"), t("w"), t("y")); });
  LOOM_ASSERT_OK(again.Run(TestRuntime()));
  again.ExpectMatchesReference();
}

// After a time-out every launch of the plan drains (its roles wait for no
// other CTA and run their jobs through, watchdog.cuh) until Synchronize has
// reported it; then the plan runs again (FinishFetching, cta_context.cuh).
// On both kernels, and on the narrow one with two consumer warpgroups
// (whose turns must keep going too): two launches of a plan whose producer
// never publishes, then one Synchronize, which reports the time-out.
// Launched once more, the plan must wait and time out again: had
// Synchronize not cleared the abort flag, that launch would drain at once,
// report nothing, and Synchronize would return OK. "tiled_in_parts": the
// consumer split eight ways and reduced in parts of 16 rows, which both
// consumer warpgroups sum together (ConsumersMeet, splitk_reduce.cuh), so
// their meetings are reached in an aborting launch too, and with no time
// limit of their own they must all be met.
class TimedOutPlanTest : public ::testing::TestWithParam<std::string> {};
TEST_P(TimedOutPlanTest, RunsAgainOnceSynchronizeReportedIt) {
  LOOM_SKIP_WITHOUT_GPU();
  const bool narrow = GetParam().rfind("narrow", 0) == 0;
  const bool two_consumers = GetParam() == "narrow_two_consumers";
  const bool in_parts = GetParam() == "tiled_in_parts";
  Rng rng;
  GpuHarness h;
  // At 2 rows the narrow plan's consumer polls a tagged copy
  // (CompileOptions::tagged_handoff), which the producer stops writing too.
  AddTwoGemmChain(h, rng, /*m=*/two_consumers ? 40 : (narrow ? 2 : 128), /*width=*/in_parts ? 4096 : 256);
  CompileOptions options;
  options.kernel = narrow ? KernelChoice::kNarrow : KernelChoice::kTiled;
  options.narrow_consumers = two_consumers ? 2 : 0;
  // Long enough that host-side jitter is small beside it (the drain check).
  constexpr int64_t kTimeoutMs = 100;
  options.spin_timeout_ns = kTimeoutMs * 1'000'000;
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  h.ExpectEachNodeMatchesReference();
  ASSERT_EQ(h.plan().kernel(), options.kernel);
  if (two_consumers) {
    ASSERT_NE(h.plan().Explain().find("of 2 consumer warpgroups"), std::string::npos) << h.plan().Explain();
  }
  if (in_parts) {
    const sched::NodeSchedule& second = h.plan().schedule().nodes[1];
    ASSERT_GT(second.split_k, 1) << h.plan().Explain();
    ASSERT_GT(second.reduce_parts, 1) << h.plan().Explain();
    ASSERT_GT(second.reduce_part_rows, 1) << h.plan().Explain();  // both warpgroups sum a part
  }
  LOOM_ASSERT_OK(internal::SuppressFlagPublishingForTesting(h.plan(), /*node=*/0));
  using Clock = std::chrono::steady_clock;
  const Clock::time_point two_start = Clock::now();
  LOOM_ASSERT_OK(h.plan().Launch(nullptr));
  LOOM_ASSERT_OK(h.plan().Launch(nullptr));  // enqueued behind the one that times out
  absl::Status status = h.plan().Synchronize(nullptr);
  const Clock::duration two_launches = Clock::now() - two_start;
  ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(std::string(status.message()).find("node \"second\""), std::string::npos) << status;
  const Clock::time_point one_start = Clock::now();
  LOOM_ASSERT_OK(h.plan().Launch(nullptr));
  status = h.plan().Synchronize(nullptr);
  const Clock::duration one_launch = Clock::now() - one_start;
  ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(std::string(status.message()).find("dependency flag"), std::string::npos) << status;
  // The launch behind the one that timed out drained at once: had it waited
  // out its own time-out, the pair would take a whole time-out longer than
  // the single launch, which waits the same way the first of the pair did.
  const auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  EXPECT_LT(ms(two_launches), ms(one_launch) + 0.5 * kTimeoutMs)
      << "two launches took " << ms(two_launches) << " ms, one " << ms(one_launch) << " ms, time-out "
      << kTimeoutMs << " ms";
}
INSTANTIATE_TEST_SUITE_P(Kernels, TimedOutPlanTest,
                         ::testing::Values("tiled", "tiled_in_parts", "narrow", "narrow_two_consumers"),
                         [](const auto& info) { return info.param; });

// A B that another node writes ("scores" reads "keys" as its B operand):
// each kernel's B loader waits for its producer tiles (on the tiled kernel,
// split rings; lockstep rings refuse such a graph: RuntimeTest.
// LockstepRingsRefuseABThatANodeWrites). The first launch must match the
// reference. Then "keys" never publishes: a role whose wait gives up drains
// (it keeps its side of each ring going, without data, until the job stream
// ends, since the waits on the rings have no clock of their own), so the
// launch must end, name that wait, and leave the plan runnable. Param: the
// kernel; the tiled one at 300 query rows (its kernel choice for them).
class BLoaderTest : public ::testing::TestWithParam<KernelChoice> {};
TEST_P(BLoaderTest, WaitsForBsProducerAndTimesOutWhenItNeverPublishes) {
  LOOM_SKIP_WITHOUT_GPU();
  const KernelChoice kernel = GetParam();
  const int64_t queries = kernel == KernelChoice::kNarrow ? 3 : 300;
  Rng rng;
  GpuHarness h;
  h.Input("x", DType::kBF16, 8, 256, rng);
  h.Input("W", DType::kBF16, 256, 256, rng);
  h.Input("q", DType::kBF16, queries, 256, rng);
  h.Output("keys", DType::kBF16, 8, 256);
  h.Output("scores", DType::kFP32, queries, 8);
  h.Build([](const auto& t, GemmGraph& g) {
    g.AddGemm("keys", t("x"), t("W"), t("keys"));
    g.AddGemm("scores", t("q"), t("keys"), t("scores"));
  });
  CompileOptions options;
  options.kernel = kernel;
  options.spin_timeout_ns = 20'000'000;  // 20 ms
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  h.ExpectEachNodeMatchesReference();
  ASSERT_EQ(h.plan().kernel(), kernel);
  LOOM_ASSERT_OK(internal::SuppressFlagPublishingForTesting(h.plan(), /*node=*/0));
  LOOM_ASSERT_OK(h.plan().Launch(nullptr));
  absl::Status status = h.plan().Synchronize(nullptr);
  ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(std::string(status.message()).find("dependency flag"), std::string::npos) << status;
  EXPECT_NE(std::string(status.message()).find("node \"scores\""), std::string::npos) << status;
  ExpectProducerFlagTimeoutRecord(h.plan(), /*producer=*/0);
  // Once reported, the plan runs again (and waits again: its producer still
  // does not publish).
  LOOM_ASSERT_OK(h.plan().Launch(nullptr));
  status = h.plan().Synchronize(nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
}
INSTANTIATE_TEST_SUITE_P(Kernels, BLoaderTest, ::testing::Values(KernelChoice::kNarrow, KernelChoice::kTiled),
                         [](const auto& info) { return AbslUnparseFlag(info.param); });

// The A loader reads its producers' flags many tile columns ahead, four to a
// 16-byte word (dependencies.cuh). Every tile it reads must still be waited
// for: here all of the producer's tiles count as published but one, 15 tile
// columns into the second row, whose first flag (17) is not 16-byte aligned.
// The consumer must wait for that tile, and time out naming its flag.
TEST(GemmTest, ConsumerWaitsForEachProducerTileItReadsAhead) {
  LOOM_SKIP_WITHOUT_GPU();
  Rng rng;
  GpuHarness h;
  // 17 producer tile columns: 68 k-blocks for the consumer.
  AddTwoGemmChain(h, rng, /*m=*/256, /*width=*/17 * 256);
  CompileOptions options;
  // Long enough for the first, normal launch under compute-sanitizer.
  options.spin_timeout_ns = 2'000'000'000;  // 2 s
  options.split_k = 1;                      // one job per row reads all 17 tile columns
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  h.ExpectMatchesReference();
  const sched::NodeSchedule& first = h.plan().schedule().nodes[0];
  ASSERT_EQ(first.n_blocks, 17);
  const int missing = 1 * first.n_blocks + 15;  // row 1, tile column 15
  const absl::Status status = LaunchWithOneProducerTileMissing(h, /*producer=*/0, missing);
  ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  ASSERT_TRUE(h.plan().last_timeout().has_value());
  EXPECT_EQ(h.plan().last_timeout()->flag, first.flag_base + missing) << status;
}

// The A loader takes consecutive producer tiles, one a k-block (or a power
// of two of them), for a run it polls at once (dependencies.cuh,
// AProducerRun). A run must end before a producer's ragged last tile: the
// k-block that reads it also reads what follows it, here the second
// producer's columns. A SwiGLU producer writes h[:, 0:left] (on 128-wide
// tiles, 64-column output tiles: the third holds 8 columns; on the narrow
// kernel, 16-column ones: the twelfth holds 8), a second producer the rest
// of h[:, 0:192]; the consumer reads all of h, so its third k-block reads
// both. With every tile of the second producer left unpublished, the
// consumer must time out on that producer's flag (before the fix it read
// the unfinished columns and completed). Param: kernel, tile width, left.
class RaggedProducerRunTest : public ::testing::TestWithParam<std::tuple<KernelChoice, int, int64_t>> {};
TEST_P(RaggedProducerRunTest, RunOfProducerTilesEndsAtARaggedTile) {
  LOOM_SKIP_WITHOUT_GPU();
  const auto [kernel, tile_n, left] = GetParam();
  const int64_t m = kernel == KernelChoice::kNarrow ? 40 : 100, right = 192 - left;
  Rng rng;
  GpuHarness h;
  h.Input("x", DType::kBF16, m, 64, rng);
  h.Input("z", DType::kBF16, m, 128, rng);
  h.Input("w_left", DType::kBF16, 2 * left, 64, rng);
  h.Input("w_right", DType::kBF16, right, 128, rng);
  h.Input("w2", DType::kBF16, 256, 192, rng);
  h.Output("h", DType::kBF16, m, 192);
  h.Output("y", DType::kBF16, m, 256);
  h.Build([left = left, right](const auto& t, GemmGraph& g) {
    g.AddGemm("left", t("x"), t("w_left"), t("h").Columns(0, left).Named("h.left"),
              {.activation = Activation::kSwiGLU});
    g.AddGemm("right", t("z"), t("w_right"), t("h").Columns(left, right).Named("h.right"));
    g.AddGemm("consumer", t("h"), t("w2"), t("y"));
  });
  CompileOptions options;
  options.kernel = kernel;
  options.tile_n = tile_n;
  options.split_k = 1;
  options.spin_timeout_ns = 2'000'000'000;  // 2 s: the first launch may run under compute-sanitizer
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  h.ExpectEachNodeMatchesReference();
  const sched::NodeSchedule& right_node = h.plan().schedule().nodes[1];
  const absl::Status status = LaunchWithOneProducerTileMissing(h, /*producer=*/1, /*missing=*/0);
  ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(std::string(status.message()).find("node \"consumer\""), std::string::npos) << status;
  ASSERT_TRUE(h.plan().last_timeout().has_value());
  EXPECT_EQ(h.plan().last_timeout()->flag, right_node.flag_base) << status;
}
// Two producers of the column halves of h ([m, 2 * half]), "right" (node 0,
// h[:, half:]) added before "left" (node 1, h[:, :half]), each from its own
// [m, 64] input, and "consumer" (node 2) reading all of h: y = h w2ᵀ, 256
// columns.
void BuildRightThenLeftHalves(GpuHarness& h, Rng& rng, int64_t m, int64_t half) {
  h.Input("x", DType::kBF16, m, 64, rng);
  h.Input("z", DType::kBF16, m, 64, rng);
  h.Input("w_left", DType::kBF16, half, 64, rng);
  h.Input("w_right", DType::kBF16, half, 64, rng);
  h.Input("w2", DType::kBF16, 256, 2 * half, rng);
  h.Output("h", DType::kBF16, m, 2 * half);
  h.Output("y", DType::kBF16, m, 256);
  h.Build([half](const auto& t, GemmGraph& g) {
    g.AddGemm("right", t("z"), t("w_right"), t("h").Columns(half, half).Named("h.right"));
    g.AddGemm("left", t("x"), t("w_left"), t("h").Columns(0, half).Named("h.left"));
    g.AddGemm("consumer", t("h"), t("w2"), t("y"));
  });
}

// A tagged handoff from two producers (one copy of h, each writing its
// columns): with a tile of the producer of h's first half never published,
// the one-token consumer times out naming that tile's flag. The first A edge
// is the other producer's (added first, it has the lower node index and
// flags), so a report that took the first edge for every column named a
// tile of the wrong node.
TEST(GemmTest, TaggedHandoffFromTwoProducersTimesOutOnTheMissingTile) {
  LOOM_SKIP_WITHOUT_GPU();
  Rng rng;
  GpuHarness h;
  BuildRightThenLeftHalves(h, rng, /*m=*/1, /*half=*/128);
  CompileOptions options;
  options.kernel = KernelChoice::kNarrow;
  options.spin_timeout_ns = 2'000'000'000;  // 2 s: the first launch may run under compute-sanitizer
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  h.ExpectEachNodeMatchesReference();
  ASSERT_NE(h.plan().Explain().find("left -> consumer, right -> consumer"), std::string::npos)
      << h.plan().Explain();
  const sched::NodeSchedule& left = h.plan().schedule().nodes[1];
  const absl::Status status = LaunchWithOneProducerTileMissing(h, /*producer=*/1, /*missing=*/2);
  ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(std::string(status.message()).find("node \"consumer\""), std::string::npos) << status;
  ASSERT_TRUE(h.plan().last_timeout().has_value());
  EXPECT_EQ(h.plan().last_timeout()->flag, left.flag_base + 2) << status;
}

// Two producers of one A in two row blocks: Lower lays their flags out row
// block by row block (NodeSchedule::flag_row_stride), so a producer's second
// row of tiles is not where its first ends. With one tile of the left
// producer's second row block left unpublished (its flags written row by row
// by PublishFlagsForTesting), the consumer must compute right first, then
// time out naming that tile's flag: on the narrow kernel the first of its
// k-block's two 32-column tiles, on the tiled kernel its own. Param: kernel.
class SharedFlagRowsTest : public ::testing::TestWithParam<KernelChoice> {};
TEST_P(SharedFlagRowsTest, ConsumerWaitsForTheMissingTileOfTheSecondRowBlock) {
  LOOM_SKIP_WITHOUT_GPU();
  const KernelChoice kernel = GetParam();
  const bool narrow = kernel == KernelChoice::kNarrow;
  const int64_t m = narrow ? 100 : 200, half = narrow ? 256 : 512;
  Rng rng;
  GpuHarness h;
  BuildRightThenLeftHalves(h, rng, m, half);
  CompileOptions options;
  options.kernel = kernel;
  options.tile_n = narrow ? 0 : 128;
  options.split_k = 1;
  options.spin_timeout_ns = 2'000'000'000;  // 2 s: the first launch may run under compute-sanitizer
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  h.ExpectEachNodeMatchesReference();
  const sched::NodeSchedule& left = h.plan().schedule().nodes[1];
  const sched::NodeSchedule& right = h.plan().schedule().nodes[0];
  ASSERT_EQ(left.m_blocks, 2);
  ASSERT_EQ(left.flag_row_stride, left.n_blocks + right.n_blocks) << h.plan().Explain();
  ASSERT_EQ(right.flag_base, left.flag_base + left.n_blocks);
  const int missing_column = 2;  // narrow: k-block 1's first tile; tiled: k-blocks 4-5
  const absl::Status status =
      LaunchWithOneProducerTileMissing(h, /*producer=*/1, /*missing=*/left.n_blocks + missing_column);
  ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(std::string(status.message()).find("node \"consumer\""), std::string::npos) << status;
  ASSERT_TRUE(h.plan().last_timeout().has_value());
  EXPECT_EQ(h.plan().last_timeout()->flag, sched::OutputFlagIndex(left, 1, missing_column)) << status;
}
INSTANTIATE_TEST_SUITE_P(Kernels, SharedFlagRowsTest,
                         ::testing::Values(KernelChoice::kNarrow, KernelChoice::kTiled),
                         [](const auto& info) { return AbslUnparseFlag(info.param); });

// The narrow kernel's epoch, read by every role of a launch: the last
// scheduler to finish fetching moves the plan's epoch on for the next
// launch, so a role that read it from the plan's state after that waited
// for flags no producer of this launch writes, until the watchdog fired.
// The B loader reads it late by design (it streams packed weights first and
// waits for the previous launch only when it must). Here 140 one-stage
// packed jobs ("p") fill the first wave, and each of the few CTAs whose
// second job is "q", whose B "r" produces, reaches B's flags just as the
// schedulers run out of jobs. Many launches, each must end without a
// time-out; the first must be right.
TEST(GemmTest, NarrowBLoaderWaitsForThisLaunchsEpoch) {
  LOOM_SKIP_WITHOUT_GPU();
  Rng rng;
  GpuHarness h;
  h.Input("x_r", DType::kBF16, 64, 64, rng);
  h.Input("w_r", DType::kBF16, 64, 64, rng);
  h.Input("x_p", DType::kBF16, 1, 64, rng);
  h.Input("w_p", DType::kBF16, 4480, 64, rng);
  h.Input("x_q", DType::kBF16, 1, 64, rng);
  h.Output("b_q", DType::kBF16, 64, 64);
  h.Output("y_p", DType::kBF16, 1, 4480);
  h.Output("y_q", DType::kBF16, 1, 64);
  h.Build([](const auto& t, GemmGraph& g) {
    g.AddGemm("r", t("x_r"), t("w_r"), t("b_q"));
    g.AddGemm("p", t("x_p"), t("w_p"), t("y_p"));
    g.AddGemm("q", t("x_q"), t("b_q"), t("y_q"));
  });
  CompileOptions options;
  options.kernel = KernelChoice::kNarrow;
  options.pack_weights = true;
  options.spin_timeout_ns = 50'000'000;  // 50 ms
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  h.ExpectEachNodeMatchesReference();
  ASSERT_EQ(h.plan().kernel(), KernelChoice::kNarrow);
  // The graph's premise: the first wave all "p", "q" fetched second.
  const std::vector<sched::TileJob>& queue = h.plan().schedule().queue;
  ASSERT_EQ(queue.size(), 144u) << h.plan().Explain();
  for (int i = 0; i < h.plan().grid_clusters(); ++i) ASSERT_EQ(queue[i].node, 1) << h.plan().Explain();
  for (int launch = 0; launch < 500; ++launch) {
    LOOM_ASSERT_OK(h.plan().Launch(nullptr));
    const absl::Status status = h.plan().Synchronize(nullptr);
    ASSERT_TRUE(status.ok()) << "launch " << launch << ": " << status;
  }
}

// A's rows stacked from two producers that give the same columns: "top"
// writes rows 0-63 of every column, "bottom" rows 64-127 of the right half
// ("bottom_left" the left half). One row block of the tiled kernel reads both,
// and a run of the top producer's flags through all of K once left the
// bottom one's tiles unwaited (NodeSchedule::a_flag_runs; the CPU test
// a_flag_runs_test replays every job's waits). With one of the bottom
// producer's tiles never published, the consumer must time out on its flag;
// the first launch, normal, must be right. Param: kernel (the narrow one's
// 64-row blocks read one producer each).
class StackedProducersTest : public ::testing::TestWithParam<KernelChoice> {};
TEST_P(StackedProducersTest, ConsumerWaitsForTheBottomProducersTiles) {
  LOOM_SKIP_WITHOUT_GPU();
  const KernelChoice kernel = GetParam();
  const bool narrow = kernel == KernelChoice::kNarrow;
  Rng rng;
  GpuHarness h;
  h.Input("x_top", DType::kBF16, 64, 64, rng);
  h.Input("x_bottom", DType::kBF16, 64, 64, rng);
  h.Input("w_top", DType::kBF16, 1024, 64, rng);
  h.Input("w_bottom_left", DType::kBF16, 512, 64, rng);
  h.Input("w_bottom", DType::kBF16, 512, 64, rng);
  h.Input("w", DType::kBF16, 256, 1024, rng);
  // A is written whole by three nodes (an Output: the harness copies it back
  // and checks each node's part); the run of flags from k-block 0 follows
  // "top" over all of K and must not stand for "bottom"'s tiles.
  h.Output("a", DType::kBF16, 128, 1024);
  h.Output("y", DType::kBF16, 128, 256);
  h.Build([](const auto& t, GemmGraph& g) {
    g.AddGemm("top", t("x_top"), t("w_top"), t("a").Rows(0, 64).Named("a.top"));
    g.AddGemm("bottom_left", t("x_bottom"), t("w_bottom_left"),
              t("a").Rows(64, 64).Columns(0, 512).Named("a.bottom_left"));
    g.AddGemm("bottom", t("x_bottom"), t("w_bottom"), t("a").Rows(64, 64).Columns(512, 512).Named("a.bottom_right"));
    g.AddGemm("consumer", t("a"), t("w"), t("y"));
  });
  CompileOptions options;
  options.kernel = kernel;
  options.split_k = narrow ? 0 : 1;
  options.spin_timeout_ns = 2'000'000'000;  // 2 s: the first launch may run under compute-sanitizer
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  h.ExpectEachNodeMatchesReference();
  ASSERT_EQ(h.plan().kernel(), kernel);
  const sched::NodeSchedule& bottom = h.plan().schedule().nodes[2];
  const int missing = narrow ? 4 : 1;  // narrow: the first of k-block 10's two tiles; tiled: A's last 256 columns
  const absl::Status status = LaunchWithOneProducerTileMissing(h, /*producer=*/2, missing);
  ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(std::string(status.message()).find("node \"consumer\""), std::string::npos) << status;
  ASSERT_TRUE(h.plan().last_timeout().has_value());
  EXPECT_EQ(h.plan().last_timeout()->flag, sched::OutputFlagIndex(bottom, 0, missing)) << status;
}
INSTANTIATE_TEST_SUITE_P(Kernels, StackedProducersTest,
                         ::testing::Values(KernelChoice::kNarrow, KernelChoice::kTiled),
                         [](const auto& info) { return AbslUnparseFlag(info.param); });

INSTANTIATE_TEST_SUITE_P(Producers, RaggedProducerRunTest,
                         ::testing::Values(std::tuple{KernelChoice::kTiled, 128, int64_t{136}},
                                           std::tuple{KernelChoice::kTiled, 256, int64_t{136}},
                                           std::tuple{KernelChoice::kNarrow, 0, int64_t{184}}),
                         [](const auto& info) {
                           return AbslUnparseFlag(std::get<0>(info.param)) + std::to_string(std::get<1>(info.param)) +
                                  "_left" + std::to_string(std::get<2>(info.param));
                         });

// The narrow decode kernel's A loader reads many producer flags per poll too,
// two 32-column producer tiles per k-block (four of a SwiGLU producer's
// 16-column ones). All but one of the producer's tiles count as published;
// the consumer must wait for that one (flag 17 of 32: not 16-byte aligned),
// and time out naming its k-block. The first launch, normal, must be right.
// At 5 rows (the mma.sync path) and 40 (the wgmma path); at 2 the consumer
// polls the producer's tagged copy instead (CompileOptions::tagged_handoff,
// all of it published but the missing tile's columns), and names that tile.
class NarrowReadAheadTest : public ::testing::TestWithParam<std::tuple<bool, int64_t>> {};
TEST_P(NarrowReadAheadTest, ConsumerWaitsForEachProducerTile) {
  LOOM_SKIP_WITHOUT_GPU();
  const auto [swiglu, m] = GetParam();
  Rng rng;
  GpuHarness h;
  const int64_t width = swiglu ? 512 : 1000;  // producer tiles: 32 of 16 or of 32 columns
  h.Input("x", DType::kBF16, m, 256, rng);
  h.Input("w1", DType::kBF16, swiglu ? 2 * width : width, 256, rng);
  h.Input("w2", DType::kBF16, 256, width, rng);
  h.Output("h", DType::kBF16, m, width);
  h.Output("y", DType::kBF16, m, 256);
  h.Build([swiglu](const auto& t, GemmGraph& g) {
    g.AddGemm("first", t("x"), t("w1"), t("h"), {.activation = swiglu ? Activation::kSwiGLU : Activation::kNone});
    g.AddGemm("second", t("h"), t("w2"), t("y"));
  });
  CompileOptions options;
  options.kernel = KernelChoice::kNarrow;
  options.spin_timeout_ns = 2'000'000'000;  // 2 s: the first launch may run under compute-sanitizer
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  h.ExpectEachNodeMatchesReference();
  const sched::NodeSchedule& first = h.plan().schedule().nodes[0];
  ASSERT_EQ(first.n_blocks, 32);
  ASSERT_EQ(first.out_tile_n, swiglu ? 16 : 32);
  const int missing = 17;
  const absl::Status status = LaunchWithOneProducerTileMissing(h, /*producer=*/0, missing);
  ASSERT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_NE(std::string(status.message()).find("node \"second\""), std::string::npos) << status;
  ASSERT_TRUE(h.plan().last_timeout().has_value());
  const bool tagged = m <= kernel::NarrowConfig::kTaggedMaxRows;
  EXPECT_EQ(h.plan().Explain().find("tagged handoffs") != std::string::npos, tagged) << h.plan().Explain();
  if (tagged) {
    EXPECT_EQ(h.plan().last_timeout()->flag, first.flag_base + missing) << status;
    return;
  }
  // The wait names the first flag of the k-block it waits for: tiles 16-17
  // (16-19 of a SwiGLU producer).
  const int tiles_per_k_block = 64 / first.out_tile_n;
  EXPECT_EQ(h.plan().last_timeout()->flag, first.flag_base + missing / tiles_per_k_block * tiles_per_k_block)
      << status;
}
INSTANTIATE_TEST_SUITE_P(Producers, NarrowReadAheadTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(int64_t{2}, int64_t{5}, int64_t{40})),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "swiglu" : "plain") + "_M" +
                                  std::to_string(std::get<1>(info.param));
                         });

// One GEMM with every fused op (the activation, a bias and a residual), its
// split-K forced (1: unsplit): the first launch checked against the CPU
// reference, then a replay against it bit for bit.
// `narrow`: on the narrow decode kernel (KernelChoice::kNarrow; the
// shape must have at most 128 rows, and split_k must be 0 or 1).
void AddFusedGemm(GpuHarness& h, Rng& rng, const Shape& shape, Activation activation, DType out_type,
                  DType bias_type, DType residual_type) {
  const int64_t out_cols = activation == Activation::kSwiGLU ? shape.n / 2 : shape.n;
  h.Input("A", DType::kBF16, shape.m, shape.k, rng);
  h.Input("B", DType::kBF16, shape.n, shape.k, rng);
  h.Input("bias", bias_type, 1, shape.n, rng);
  h.Input("residual", residual_type, shape.m, out_cols, rng);
  h.Output("C", out_type, shape.m, out_cols);
  // By value: the harness runs the builder after this function has returned.
  h.Build([activation](const auto& t, GemmGraph& g) {
    Epilogue epilogue;
    epilogue.activation = activation;
    epilogue.bias = t("bias");
    epilogue.residual = t("residual");
    g.AddGemm("gemm", t("A"), t("B"), t("C"), epilogue);
  });
}

// `tile_n`: the tiled kernel's tile width (CompileOptions::tile_n).
// `pair_split`: whether the narrow kernel's plan is expected to take the
// pair split (PairSplitChoice::kAuto's rule: 64-column tiles over two
// halves of K, through the workspace).
void RunFusedGemm(const Shape& shape, int split_k, Activation activation, DType out_type, DType bias_type,
                  DType residual_type, bool narrow = false, int tile_n = 256, bool pack_weights = false,
                  bool pair_split = false) {
  Rng rng;
  GpuHarness h;
  AddFusedGemm(h, rng, shape, activation, out_type, bias_type, residual_type);
  CompileOptions options;
  options.split_k = split_k;
  options.kernel = narrow ? KernelChoice::kNarrow : KernelChoice::kTiled;
  options.tile_n = tile_n;
  options.pack_weights = pack_weights;
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  EXPECT_EQ(h.plan().schedule().workspace_elements > 0, split_k > 1 || pair_split)
      << "split_k " << split_k << ", pair split " << pair_split;
  EXPECT_EQ(h.plan().schedule().tile.n, narrow ? (pair_split ? 64 : 32) : tile_n)
      << "narrow " << narrow << ", pair split " << pair_split;
  ExpectMatchesReferenceAndReplayIdentical(h);
}

// Lockstep rings (one ring, the A loader loading both operands; A's barriers
// guard both) under fused ops, both tile widths, a cluster sharing B, and
// split K: a bias and a residual everywhere; GELU at 512 x 1024 on 256-wide
// tiles (four row blocks: the pair shares B); SiLU at 16 rows in eight
// splits (one A half: the second consumer warpgroup multiplies nothing,
// reduced in parts); SwiGLU at 300 rows in two (a last split that sums).
struct LockstepCase {
  std::string name;
  Shape shape;
  Activation activation;
  int tile_n;
  int split_k;
};
void PrintTo(const LockstepCase& c, std::ostream* os) { *os << c.name; }
class LockstepRingTest : public ::testing::TestWithParam<LockstepCase> {};
TEST_P(LockstepRingTest, FusedOpsMatchTheReference) {
  LOOM_SKIP_WITHOUT_GPU();
  const LockstepCase& c = GetParam();
  Rng rng;
  GpuHarness h;
  AddFusedGemm(h, rng, c.shape, c.activation, DType::kBF16, DType::kBF16, DType::kFP32);
  CompileOptions options;
  options.kernel = KernelChoice::kTiled;
  options.ring_mode = RingMode::kLockstep;
  options.a_stages = options.b_stages = 3;
  options.tile_n = c.tile_n;
  options.split_k = c.split_k;
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  EXPECT_NE(h.plan().Explain().find("rings: lockstep"), std::string::npos) << h.plan().Explain();
  EXPECT_EQ(h.plan().schedule().nodes[0].split_k, c.split_k) << h.plan().Explain();
  ExpectMatchesReferenceAndReplayIdentical(h);
}
INSTANTIATE_TEST_SUITE_P(
    Cases, LockstepRingTest,
    ::testing::Values(LockstepCase{"gelu_256_wide", {512, 1024, 1000}, Activation::kGELU, 256, 1},
                      LockstepCase{"silu_16_rows_split8", {16, 1000, 4096}, Activation::kSiLU, 256, 8},
                      LockstepCase{"swiglu_300_rows_split2", {300, 512, 1024}, Activation::kSwiGLU, 128, 2}),
    [](const auto& info) { return info.param.name; });

// Test names of the split-K suites: the shape and the split count.
const auto SplitCaseName = [](const auto& info) {
  return ShapeName(std::get<0>(info.param)) + "_split" + std::to_string(std::get<1>(info.param));
};

// Split-K: partials to the workspace, summed in split order by the tile's
// last split (129 rows and more, or a ragged N) or by reduce jobs (in parts,
// or few rows), then the fused epilogue.
class SplitKTest : public ::testing::TestWithParam<std::tuple<Shape, int, Activation, DType>> {};
TEST_P(SplitKTest, MatchesReference) {
  LOOM_SKIP_WITHOUT_GPU();
  const auto [shape, split_k, activation, out_type] = GetParam();
  RunFusedGemm(shape, split_k, activation, out_type, /*bias_type=*/DType::kBF16, /*residual_type=*/DType::kFP32);
}
INSTANTIATE_TEST_SUITE_P(
    Splits, SplitKTest,
    ::testing::Values(std::tuple{Shape{1, 1000, 4096}, 8, Activation::kNone, DType::kBF16},
                      std::tuple{Shape{129, 257, 520}, 3, Activation::kReLU, DType::kFP32},
                      std::tuple{Shape{300, 512, 1024}, 2, Activation::kSwiGLU, DType::kBF16},
                      std::tuple{Shape{64, 4096, 14336}, 7, Activation::kNone, DType::kBF16},
                      std::tuple{Shape{16, 520, 264}, 4, Activation::kGELU, DType::kFP32},
                      // Few-row reduces (<= 16 rows: SumFewRowPartials, one column
                      // pair per thread, the rows halved between the warpgroups):
                      // 2 x 8, 1 x 16 (warpgroup 0 alone), 5 x 4 (3 + 2 rows),
                      // 11 x 3, 16 x 8 (8 + 8 rows, 2 a step).
                      std::tuple{Shape{2, 1000, 4096}, 8, Activation::kSiLU, DType::kBF16},
                      std::tuple{Shape{1, 1000, 4096}, 16, Activation::kReLU, DType::kFP32},
                      std::tuple{Shape{5, 1000, 4096}, 4, Activation::kNone, DType::kFP32},
                      std::tuple{Shape{11, 1000, 4096}, 3, Activation::kGELU, DType::kBF16},
                      std::tuple{Shape{16, 1000, 4096}, 8, Activation::kSiLU, DType::kFP32},
                      // Reduced in parts (one row block, whole tiles): 16 = 8 +
                      // 8, 17 = 8 + 8 + 1 (warpgroup 0 alone in the last part),
                      // 40 = 5 x 8, 100 = 6 x 16 + 4, 128 = 8 x 16 (rows of
                      // both warpgroups' halves of the tile).
                      std::tuple{Shape{16, 1024, 4096}, 8, Activation::kNone, DType::kFP32},
                      std::tuple{Shape{17, 1024, 4096}, 8, Activation::kGELU, DType::kBF16},
                      std::tuple{Shape{40, 512, 4096}, 4, Activation::kSiLU, DType::kFP32},
                      std::tuple{Shape{100, 512, 2048}, 3, Activation::kNone, DType::kFP32},
                      std::tuple{Shape{128, 1024, 4096}, 8, Activation::kReLU, DType::kBF16}),
    SplitCaseName);

// Tiles of 128 columns (CompileOptions::tile_n = 128: m64n128k16, 64
// accumulators a thread, B boxes and packed stages of 64 and 128 rows):
// every path of the 256-wide tests above. Ragged N (257, 778, 1000) and K
// (4104); unsplit; a tile summed by its last split (129 rows and more, or a
// ragged N); few-row reduces (16 and 2 rows: the warpgroup's first 64
// threads, one column pair each); reduces in parts (100 and 128 rows);
// partials of at most 64 live rows straight from registers (17, 64 rows);
// SwiGLU (an output tile of 64 columns). Packed weights in the cases marked.
class TileWidth128Test
    : public ::testing::TestWithParam<std::tuple<Shape, int, Activation, DType, bool>> {};
TEST_P(TileWidth128Test, MatchesReference) {
  LOOM_SKIP_WITHOUT_GPU();
  const auto [shape, split_k, activation, out_type, packed] = GetParam();
  const DType other = out_type == DType::kBF16 ? DType::kFP32 : DType::kBF16;
  RunFusedGemm(shape, split_k, activation, out_type, /*bias_type=*/other, /*residual_type=*/out_type,
               /*narrow=*/false, /*tile_n=*/128, packed);
}
INSTANTIATE_TEST_SUITE_P(
    Paths, TileWidth128Test,
    ::testing::Values(std::tuple{Shape{1, 1, 8}, 1, Activation::kNone, DType::kBF16, false},
                      std::tuple{Shape{129, 257, 520}, 1, Activation::kReLU, DType::kFP32, false},
                      std::tuple{Shape{1000, 1000, 248}, 1, Activation::kGELU, DType::kBF16, false},
                      std::tuple{Shape{200, 1024, 4096}, 1, Activation::kNone, DType::kBF16, true},
                      std::tuple{Shape{300, 520, 1024}, 2, Activation::kSwiGLU, DType::kBF16, false},
                      std::tuple{Shape{200, 778, 4104}, 4, Activation::kSiLU, DType::kFP32, false},
                      std::tuple{Shape{16, 1000, 4096}, 8, Activation::kSiLU, DType::kFP32, false},
                      std::tuple{Shape{2, 1000, 4096}, 8, Activation::kNone, DType::kBF16, true},
                      std::tuple{Shape{100, 512, 2048}, 3, Activation::kNone, DType::kFP32, false},
                      std::tuple{Shape{128, 1024, 4096}, 8, Activation::kReLU, DType::kBF16, true},
                      std::tuple{Shape{17, 778, 640}, 3, Activation::kGELU, DType::kBF16, false},
                      std::tuple{Shape{64, 778, 640}, 3, Activation::kSwiGLU, DType::kFP32, false}),
    [](const auto& info) {
      return ShapeName(std::get<0>(info.param)) + "_split" + std::to_string(std::get<1>(info.param)) + "_" +
             std::string(ActivationName(std::get<2>(info.param))) + (std::get<4>(info.param) ? "_packed" : "");
    });

// Two dependent GEMMs on 128-wide tiles: the consumer's loader waits per
// k-slice on producer tiles of 128 columns (the dependency boxes follow the
// tile), at 200 rows (two row blocks) and 100 (one, the down GEMM split).
TEST(GemmTest, DependentGemmsOnTilesOf128Columns) {
  LOOM_SKIP_WITHOUT_GPU();
  for (const int64_t m : {int64_t{200}, int64_t{100}}) {
    SCOPED_TRACE(absl::StrCat("m ", m));
    Rng rng;
    GpuHarness h;
    AddTwoGemmChain(h, rng, m, /*width=*/1000);
    CompileOptions options;
    options.kernel = KernelChoice::kTiled;
    options.tile_n = 128;
    options.pack_weights = true;
    LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
    EXPECT_EQ(h.plan().schedule().tile.n, 128);
    ExpectNodesRightAndReplayIdentical(h);
  }
}

// Decode-size tiles, every fused op on both paths (unsplit; split, whose
// partials of at most 64 live rows go straight from registers to the
// workspace). N = 778: the last tile is ragged and out_cols is odd under
// SwiGLU. M = 17 is the first size whose reduce is the general one (a ragged
// tile is not reduced in parts); M = 129 has a one-row tile after a full one
// (its partials staged for TMA stores).
class DecodeEpilogueTest : public ::testing::TestWithParam<std::tuple<int64_t, int, Activation, DType>> {};
TEST_P(DecodeEpilogueTest, MatchesReference) {
  LOOM_SKIP_WITHOUT_GPU();
  const auto [m, split_k, activation, out_type] = GetParam();
  // The bias in the other dtype than the output, the residual in the same.
  const DType other = out_type == DType::kBF16 ? DType::kFP32 : DType::kBF16;
  RunFusedGemm(Shape{m, 778, 640}, split_k, activation, out_type, /*bias_type=*/other, /*residual_type=*/out_type);
}
INSTANTIATE_TEST_SUITE_P(
    DecodeTiles, DecodeEpilogueTest,
    ::testing::Combine(::testing::Values(int64_t{1}, int64_t{16}, int64_t{17}, int64_t{129}), ::testing::Values(1, 3),
                       ::testing::Values(Activation::kNone, Activation::kGELU, Activation::kSwiGLU),
                       ::testing::Values(DType::kBF16, DType::kFP32)),
    [](const auto& info) {
      return absl::StrCat("M", std::get<0>(info.param), "_split", std::get<1>(info.param), "_",
                          std::string(ActivationName(std::get<2>(info.param))), "_",
                          std::string(DTypeName(std::get<3>(info.param))));
    });

// The narrow decode kernel (64 x 32 tiles over the whole K, straight from
// registers into C): every fused op, both output types, rows from 1 to 128:
// A tiles of 8 and 16 rows (mma.sync), of 24 and 32 (17 and 25 rows: two
// k-blocks a wgmma) and of 40, 56 and 64 (m64n32k16); 7, 17, 25, 33 and 49
// leave rows of the tile that TMA fills with zeros. 65, 100 and 128 rows
// run in two row blocks of 40, 56 and 64 rows (the second holding 25, 44
// and 64 of them). N = 778 (a ragged last tile, odd out_cols under
// SwiGLU), K = 640 (10 k-blocks: the last stage holds two k-blocks past K,
// a pair of zeros).
class NarrowEpilogueTest : public ::testing::TestWithParam<std::tuple<int64_t, Activation, DType>> {};
TEST_P(NarrowEpilogueTest, MatchesReference) {
  LOOM_SKIP_WITHOUT_GPU();
  const auto [m, activation, out_type] = GetParam();
  const DType other = out_type == DType::kBF16 ? DType::kFP32 : DType::kBF16;
  RunFusedGemm(Shape{m, 778, 640}, /*split_k=*/0, activation, out_type, /*bias_type=*/other,
               /*residual_type=*/out_type, /*narrow=*/true);
}
INSTANTIATE_TEST_SUITE_P(
    NarrowTiles, NarrowEpilogueTest,
    ::testing::Combine(::testing::Values(int64_t{1}, int64_t{7}, int64_t{16}, int64_t{17}, int64_t{25},
                                         int64_t{33}, int64_t{49}, int64_t{64}, int64_t{65}, int64_t{100},
                                         int64_t{128}),
                       ::testing::Values(Activation::kNone, Activation::kReLU, Activation::kGELU, Activation::kSiLU,
                                         Activation::kSwiGLU),
                       ::testing::Values(DType::kBF16, DType::kFP32)),
    [](const auto& info) {
      return absl::StrCat("M", std::get<0>(info.param), "_", std::string(ActivationName(std::get<1>(info.param))),
                          "_", std::string(DTypeName(std::get<2>(info.param))));
    });

// Decode shapes of the benchmarks on the narrow kernel: long K (the jobs'
// weights are several times the B ring), K not a multiple of 64, N not a
// multiple of 32. The plans kAuto gives: 128 x 4096 x 4096 takes the tall
// pair split (past 64 rows, 128 jobs of two halves of K, at least three
// quarters of a wave on any Hopper); 97 x 2000 x 4104 does not (K splits
// in two off a multiple of 256, and its 64 jobs would fill less than three
// quarters of a wave), nor does any plan of at most 64 rows.
class NarrowShapeTest : public ::testing::TestWithParam<std::tuple<Shape, Activation, bool>> {};
TEST_P(NarrowShapeTest, MatchesReference) {
  LOOM_SKIP_WITHOUT_GPU();
  const auto [shape, activation, pair_split] = GetParam();
  RunFusedGemm(shape, /*split_k=*/1, activation, DType::kBF16, DType::kFP32, DType::kBF16, /*narrow=*/true,
               /*tile_n=*/256, /*pack_weights=*/false, pair_split);
}
INSTANTIATE_TEST_SUITE_P(
    NarrowShapes, NarrowShapeTest,
    ::testing::Values(std::tuple{Shape{1, 4096, 4096}, Activation::kNone, false},
                      std::tuple{Shape{16, 4096, 14336}, Activation::kNone, false},
                      std::tuple{Shape{8, 28672, 4096}, Activation::kSwiGLU, false},
                      std::tuple{Shape{64, 1000, 4104}, Activation::kGELU, false},
                      std::tuple{Shape{3, 100, 72}, Activation::kReLU, false},
                      std::tuple{Shape{128, 4096, 4096}, Activation::kNone, true},
                      std::tuple{Shape{97, 2000, 4104}, Activation::kSwiGLU, false}),
    [](const auto& info) { return ShapeName(std::get<0>(info.param)); });

// The narrow kernel at the row counts where its path or its tiles change,
// beside those NarrowEpilogueTest runs (1, 7, 16, 17, 25, 33, 49, 64, 65,
// 100, 128): 2 / 3 (in a graph, the tagged handoff's limit; here one
// mma.sync token block), 8 / 9 (one or two token blocks), 15, the paired
// path's A tiles of 24 and 32 rows (24, 31, 32), m64n32k16's tiles of 40-64
// rows (40 / 41, 48, 56 / 57, 63), two row blocks of 40 or 48 rows (80 /
// 81) and the last row before 128 (127). K = 2056 (33 k-blocks, the last
// one 8 wide): longer than either ring, so every slot is refilled. Plain
// bf16 output from unpacked weights, and SwiGLU to fp32 from packed ones
// (N = 778: a ragged last tile and odd out_cols).
class NarrowRowEdgeTest : public ::testing::TestWithParam<std::tuple<int64_t, bool>> {};
TEST_P(NarrowRowEdgeTest, MatchesReference) {
  LOOM_SKIP_WITHOUT_GPU();
  const auto [m, swiglu_packed] = GetParam();
  Rng rng;
  GpuHarness h;
  if (swiglu_packed) {
    AddFusedGemm(h, rng, Shape{m, 778, 2056}, Activation::kSwiGLU, DType::kFP32, DType::kBF16, DType::kFP32);
  } else {
    AddFusedGemm(h, rng, Shape{m, 778, 2056}, Activation::kNone, DType::kBF16, DType::kFP32, DType::kBF16);
  }
  CompileOptions options;
  options.kernel = KernelChoice::kNarrow;
  options.pack_weights = swiglu_packed;
  LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
  const std::string explain = h.plan().Explain();
  EXPECT_EQ(h.plan().schedule().tile.n, 32) << explain;
  EXPECT_EQ(explain.find("weights: packed in stage order") != std::string::npos, swiglu_packed) << explain;
  ExpectMatchesReferenceAndReplayIdentical(h);
}
INSTANTIATE_TEST_SUITE_P(
    NarrowRowEdges, NarrowRowEdgeTest,
    ::testing::Combine(::testing::Values(int64_t{2}, int64_t{3}, int64_t{8}, int64_t{9}, int64_t{15}, int64_t{24},
                                         int64_t{31}, int64_t{32}, int64_t{40}, int64_t{41}, int64_t{48},
                                         int64_t{56}, int64_t{57}, int64_t{63}, int64_t{80}, int64_t{81},
                                         int64_t{127}),
                       ::testing::Bool()),
    [](const auto& info) {
      return absl::StrCat("M", std::get<0>(info.param), std::get<1>(info.param) ? "_swiglu_packed" : "_plain");
    });

// The two bit-identity tests below: C = act(A Bᵀ + bias) + residual, fp32 out,
// K = kBitsK, 8 splits (kBitsN: whole tiles). AddBitsGemm builds one into `h`;
// CopyInputs gives `to` the first rows of `from`'s inputs; SameBits compares
// the first `rows` rows of the two outputs bit for bit.
constexpr int64_t kBitsN = 1024, kBitsK = 4096;

void AddBitsGemm(GpuHarness& h, Rng& rng, int64_t m, int64_t n, Activation activation) {
  h.Input("A", DType::kBF16, m, kBitsK, rng);
  h.Input("B", DType::kBF16, n, kBitsK, rng);
  h.Input("bias", DType::kBF16, 1, n, rng);
  h.Input("residual", DType::kFP32, m, n, rng);
  h.Output("C", DType::kFP32, m, n);
  h.Build([activation](const auto& t, GemmGraph& g) {
    Epilogue epilogue;
    epilogue.activation = activation;
    epilogue.bias = t("bias");
    epilogue.residual = t("residual");
    g.AddGemm("gemm", t("A"), t("B"), t("C"), epilogue);
  });
}

void CopyInputs(GpuHarness& from, GpuHarness& to) {
  for (const char* name : {"A", "B", "bias", "residual"}) {
    HostMatrix& into = to.host(name);
    const HostMatrix& source = from.host(name);
    for (int64_t r = 0; r < into.rows(); ++r) {
      for (int64_t c = 0; c < into.cols(); ++c) into.set(r, c, source.at(r, c));
    }
  }
}

::testing::AssertionResult SameBits(GpuHarness& a, const char* a_name, GpuHarness& b, const char* b_name,
                                    int64_t rows) {
  const HostMatrix& ca = a.host("C");
  const HostMatrix& cb = b.host("C");
  if (ca.dtype() != cb.dtype() || ca.cols() != cb.cols()) {
    return ::testing::AssertionFailure() << a_name << " and " << b_name << " have outputs of different types or widths";
  }
  // The bytes, not the values: +0 and -0 (or two NaNs) compare equal as values.
  const TensorView va = ca.view(), vb = cb.view();
  int64_t differing = 0, first_row = -1, first_col = -1;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < ca.cols(); ++c) {
      if (std::memcmp(va.element(r, c), vb.element(r, c), va.element_size()) != 0 && differing++ == 0) {
        first_row = r;
        first_col = c;
      }
    }
  }
  if (differing == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << differing << " elements whose bits differ; the first is (" << first_row
                                       << ", " << first_col << "): " << ca.at(first_row, first_col) << " ("
                                       << a_name << ") against " << cb.at(first_row, first_col) << " (" << b_name
                                       << ")";
}

// The few-row reduce (SumFewRowPartials: at most 16 rows inside M, fused ops
// in its own pass) must give the bits of the general one (SumPartials, then
// StageTile): the same partials, summed in the same order, the same fused
// ops. The first rows of a 17-row GEMM (N = 1000, ragged: the general
// reduce) against those rows alone (1 or 16 rows x 8 splits).
class DecodeReduceBitsTest : public ::testing::TestWithParam<std::tuple<Activation, int64_t>> {};
TEST_P(DecodeReduceBitsTest, MatchTheGeneralReduce) {
  LOOM_SKIP_WITHOUT_GPU();
  const auto [activation, rows] = GetParam();
  constexpr int64_t kN = 1000;
  Rng rng;
  GpuHarness general, decode;
  AddBitsGemm(general, rng, 17, kN, activation);
  AddBitsGemm(decode, rng, rows, kN, activation);
  CopyInputs(general, decode);
  CompileOptions options;
  options.split_k = 8;
  options.sum_in_last_split = false;  // the general reduce job
  LOOM_ASSERT_OK(general.Run(TestRuntime(), options));
  LOOM_ASSERT_OK(decode.Run(TestRuntime(), options));
  general.ExpectMatchesReference();
  decode.ExpectMatchesReference();
  EXPECT_TRUE(SameBits(decode, "few rows", general, "general", rows));
}
INSTANTIATE_TEST_SUITE_P(
    Activations, DecodeReduceBitsTest,
    ::testing::Combine(::testing::Values(Activation::kNone, Activation::kReLU, Activation::kGELU, Activation::kSiLU),
                       ::testing::Values(int64_t{1}, int64_t{16})),
    [](const auto& info) {
      return std::string(ActivationName(std::get<0>(info.param))) + "_M" + std::to_string(std::get<1>(info.param));
    });

// A tile reduced in parts (NodeSchedule::reduce_parts: a few rows a job,
// each summed one column pair per thread straight into C) must give the bits
// of the one-job reduce of the same tile (SumPartials, then StageTile): the
// same inputs compiled both ways (whole tiles, N = 1024).
class ReducePartsBitsTest : public ::testing::TestWithParam<std::tuple<Activation, int64_t>> {};
TEST_P(ReducePartsBitsTest, MatchTheOneJobReduce) {
  LOOM_SKIP_WITHOUT_GPU();
  const auto [activation, rows] = GetParam();
  Rng rng;
  GpuHarness parts, whole;
  AddBitsGemm(parts, rng, rows, kBitsN, activation);
  AddBitsGemm(whole, rng, rows, kBitsN, activation);
  CopyInputs(parts, whole);
  CompileOptions options;
  options.split_k = 8;
  LOOM_ASSERT_OK(parts.Run(TestRuntime(), options));
  options.reduce_in_parts = false;
  options.sum_in_last_split = false;  // one reduce job a tile
  LOOM_ASSERT_OK(whole.Run(TestRuntime(), options));
  const sched::NodeSchedule& parted = parts.plan().schedule().nodes[0];
  ASSERT_GT(parted.reduce_part_rows, 0);
  EXPECT_EQ(parted.reduce_parts, (rows + parted.reduce_part_rows - 1) / parted.reduce_part_rows);
  EXPECT_EQ(whole.plan().schedule().nodes[0].reduce_parts, 1);
  parts.ExpectMatchesReference();
  whole.ExpectMatchesReference();
  EXPECT_TRUE(SameBits(parts, "in parts", whole, "one job", rows));
  EXPECT_TRUE(ReplayIsBitIdentical(parts));
}
INSTANTIATE_TEST_SUITE_P(
    Activations, ReducePartsBitsTest,
    ::testing::Combine(::testing::Values(Activation::kNone, Activation::kGELU, Activation::kSiLU),
                       ::testing::Values(int64_t{40}, int64_t{128})),
    [](const auto& info) {
      return std::string(ActivationName(std::get<0>(info.param))) + "_M" + std::to_string(std::get<1>(info.param));
    });

// A tile summed by its last split (NodeSchedule::reduce_parts == 0, the
// default wherever a tile would be reduced whole) against one reduce job a
// tile (CompileOptions::sum_in_last_split = false), on the same inputs: both
// match the reference and replay to the same bits, and with two splits they
// agree value for value (the same two partials, added in the other order).
// Shapes: a one-row last row block (its partials stored from registers),
// SwiGLU over three row blocks, a ragged N of 64 rows (not reduced in parts),
// four splits (kMaxSplitsSummedByLast) over a ragged K.
class LastSplitSumsTest : public ::testing::TestWithParam<std::tuple<Shape, int, Activation, DType>> {};
TEST_P(LastSplitSumsTest, MatchesTheReduceJob) {
  LOOM_SKIP_WITHOUT_GPU();
  const auto [shape, split_k, activation, out_type] = GetParam();
  Rng rng;
  GpuHarness last, reduce;
  AddFusedGemm(last, rng, shape, activation, out_type, DType::kBF16, DType::kFP32);
  AddFusedGemm(reduce, rng, shape, activation, out_type, DType::kBF16, DType::kFP32);
  CopyInputs(last, reduce);
  CompileOptions options = WideTiledOptions();
  options.split_k = split_k;
  LOOM_ASSERT_OK(last.Run(TestRuntime(), options));
  options.sum_in_last_split = false;
  LOOM_ASSERT_OK(reduce.Run(TestRuntime(), options));
  ASSERT_EQ(last.plan().schedule().nodes[0].reduce_parts, 0);
  ASSERT_EQ(reduce.plan().schedule().nodes[0].reduce_parts, 1);
  {
    SCOPED_TRACE("summed by the last split");
    ExpectMatchesReferenceAndReplayIdentical(last);
  }
  {
    SCOPED_TRACE("summed by a reduce job");
    ExpectMatchesReferenceAndReplayIdentical(reduce);
  }
  if (split_k == 2) {
    EXPECT_TRUE(SameBits(last, "last split", reduce, "reduce job", shape.m));
  }
}
INSTANTIATE_TEST_SUITE_P(
    Splits, LastSplitSumsTest,
    ::testing::Values(std::tuple{Shape{129, 257, 520}, 3, Activation::kReLU, DType::kFP32},
                      std::tuple{Shape{300, 512, 1024}, 2, Activation::kSwiGLU, DType::kBF16},
                      std::tuple{Shape{300, 768, 1024}, 2, Activation::kNone, DType::kFP32},
                      std::tuple{Shape{64, 1000, 4096}, 4, Activation::kGELU, DType::kBF16},
                      std::tuple{Shape{200, 512, 4104}, 4, Activation::kSiLU, DType::kFP32}),
    SplitCaseName);

// A last split that sums and takes more k-blocks than the others
// (CompileOptions::last_split_extra_k_blocks): from even up to every other
// split keeping one k-block, over two splits and over four of a ragged K.
TEST(GemmTest, LongerLastSplitMatchesTheReference) {
  LOOM_SKIP_WITHOUT_GPU();
  struct Case {
    Shape shape;
    int split_k;
    int extra;
  };
  for (const Case c : {Case{{300, 768, 1024}, 2, 0}, Case{{300, 768, 1024}, 2, 5}, Case{{300, 768, 1024}, 2, 14},
                       Case{{200, 512, 4104}, 4, 20}}) {
    SCOPED_TRACE(absl::StrCat(c.shape.m, "x", c.shape.n, "x", c.shape.k, " split ", c.split_k, " extra ", c.extra));
    Rng rng;
    GpuHarness h;
    AddFusedGemm(h, rng, c.shape, Activation::kGELU, DType::kBF16, DType::kBF16, DType::kFP32);
    CompileOptions options = WideTiledOptions();
    options.split_k = c.split_k;
    options.last_split_extra_k_blocks = c.extra;
    LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
    const sched::NodeSchedule& node = h.plan().schedule().nodes[0];
    ASSERT_EQ(node.reduce_parts, 0);
    ASSERT_EQ(node.last_split_extra_k_blocks, c.extra);
    for (const sched::TileJob& job : h.plan().schedule().queue) {
      if (job.split == c.split_k - 1) {
        const int even = (node.k_blocks - c.extra) / c.split_k;
        EXPECT_GE(job.k_block_end - job.k_block_begin, even + c.extra);
      }
    }
    ExpectMatchesReferenceAndReplayIdentical(h);
  }
}

// A decode GEMM replayed gives the same bits: on the tiled kernel with the
// split-K the scheduler chooses for M = 7, and on the narrow one (what
// KernelChoice::kAuto picks for it), whose four consumer warps' partial sums
// meet in a fixed order.
TEST(GemmTest, SplitKReplayIsBitIdentical) {
  LOOM_SKIP_WITHOUT_GPU();
  Rng rng;
  for (const KernelChoice kernel : {KernelChoice::kTiled, KernelChoice::kAuto}) {
    SCOPED_TRACE(AbslUnparseFlag(kernel));
    GpuHarness h;
    AddPlainGemm(h, rng, Shape{7, 2048, 8192}, DType::kFP32);
    CompileOptions options;
    options.kernel = kernel;
    LOOM_ASSERT_OK(h.Run(TestRuntime(), options));
    if (kernel == KernelChoice::kTiled) {
      ASSERT_GT(h.plan().schedule().workspace_elements, 0) << "expected the scheduler to split this decode GEMM";
    } else {
      ASSERT_EQ(h.plan().schedule().tile.n, 32) << "expected the narrow kernel";
    }
    for (int replay = 0; replay < 3; ++replay) EXPECT_TRUE(ReplayIsBitIdentical(h)) << "replay " << replay;
    h.ExpectMatchesReference();
  }
}

// A forced split whose workspace cannot fit (256 partials of 16384 x 16384
// fp32: 275 GB) is ResourceExhausted naming the bytes and the option, not
// cudaMalloc's Internal error.
TEST(GemmTest, AWorkspacePastTheDevicesMemoryIsResourceExhausted) {
  LOOM_SKIP_WITHOUT_GPU();
  constexpr int64_t kSize = 16384;
  GemmGraph g;
  g.AddGemm("gemm", TensorView::Dense("A", reinterpret_cast<void*>(uintptr_t{1} << 40), DType::kBF16, kSize, kSize),
            TensorView::Dense("B", reinterpret_cast<void*>(uintptr_t{1} << 41), DType::kBF16, kSize, kSize),
            TensorView::Dense("C", reinterpret_cast<void*>(uintptr_t{1} << 42), DType::kBF16, kSize, kSize));
  CompileOptions options = WideTiledOptions();
  options.split_k = 256;
  options.sum_in_last_split = false;
  const absl::StatusOr<Plan> plan = TestRuntime().Compile(g, options);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
  EXPECT_NE(std::string(plan.status().message()).find("274877906944 bytes"), std::string::npos) << plan.status();
  EXPECT_NE(std::string(plan.status().message()).find("CompileOptions.split_k = 256"), std::string::npos)
      << plan.status();
  // The context is still usable.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// So is a packed copy of the weights that cannot fit (two nodes of 2^20 x
// 2^16 bf16 weights, 128 GiB each; the views' addresses are never read),
// naming the bytes and the option, with no error left pending.
TEST(GemmTest, APackedCopyPastTheDevicesMemoryIsResourceExhausted) {
  LOOM_SKIP_WITHOUT_GPU();
  constexpr int64_t kN = int64_t{1} << 20, kK = int64_t{1} << 16;
  const auto at = [](uint64_t address) { return reinterpret_cast<void*>(address); };
  GemmGraph g;
  for (uint64_t i = 0; i < 2; ++i) {
    g.AddGemm(absl::StrCat("gemm", i), TensorView::Dense("x", at(uint64_t{1} << 40), DType::kBF16, 1, kK),
              TensorView::Dense(absl::StrCat("w", i), at((uint64_t{1} << 41) + (i << 38)), DType::kBF16, kN, kK),
              TensorView::Dense(absl::StrCat("y", i), at((uint64_t{1} << 42) + (i << 30)), DType::kBF16, 1, kN));
  }
  CompileOptions options;
  options.kernel = KernelChoice::kTiled;
  options.pack_weights = true;
  const absl::StatusOr<Plan> plan = TestRuntime().Compile(g, options);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
  EXPECT_NE(std::string(plan.status().message()).find("CompileOptions.pack_weights"), std::string::npos)
      << plan.status();
  EXPECT_NE(std::string(plan.status().message()).find(" bytes, does not fit"), std::string::npos) << plan.status();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// So is any of the plan's own buffers (node records, queue, flags, launch
// state, trace) when the device's memory is taken: with the views allocated
// and all but ~4 MiB of the rest held here, a plan of 131072 tiles with its
// trace on (~6 MiB of trace) cannot get its buffers, and Compile says which
// one did not fit, with no error left pending.
TEST(GemmTest, PlanBuffersPastFreeMemoryAreResourceExhausted) {
  LOOM_SKIP_WITHOUT_GPU();
  constexpr int64_t kM = int64_t{1} << 16, kN = int64_t{1} << 16, kK = 64;
  absl::StatusOr<DeviceBuffer> a = DeviceBuffer::Allocate(kM * kK * 2);
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(kN * kK * 2);
  absl::StatusOr<DeviceBuffer> c = DeviceBuffer::Allocate(kM * kN * 2);  // 8 GiB
  LOOM_ASSERT_OK(a.status());
  LOOM_ASSERT_OK(b.status());
  LOOM_ASSERT_OK(c.status());
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  constexpr size_t kLeft = size_t{4} << 20, kStep = size_t{2} << 20;
  ASSERT_GT(free_bytes, 64 * kLeft);
  absl::StatusOr<DeviceBuffer> hog = absl::UnknownError("not allocated");
  for (size_t bytes = free_bytes - kLeft; !hog.ok() && bytes > free_bytes - 64 * kLeft; bytes -= kStep) {
    hog = DeviceBuffer::Allocate(static_cast<int64_t>(bytes));
    if (!hog.ok()) cudaGetLastError();
  }
  LOOM_ASSERT_OK(hog.status());
  GemmGraph g;
  g.AddGemm("gemm", TensorView::Dense("A", a->data(), DType::kBF16, kM, kK),
            TensorView::Dense("B", b->data(), DType::kBF16, kN, kK),
            TensorView::Dense("C", c->data(), DType::kBF16, kM, kN));
  CompileOptions options = WideTiledOptions();
  options.trace = true;
  const absl::StatusOr<Plan> plan = TestRuntime().Compile(g, options);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
  EXPECT_NE(std::string(plan.status().message()).find(" bytes, does not fit in device 0's free memory"),
            std::string::npos)
      << plan.status();
  std::printf("[ loom     ] %s\n", plan.status().ToString().c_str());  // which buffer it was
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// One node, proj: y = x · wᵀ + b (64 x 64 by 128 x 64, bf16), each view in
// a cudaMalloc allocation of its own of 2 MiB (the driver's granularity, so
// the allocation's range is the size asked for whatever it rounds to), each
// followed by a spare allocation, so that a view run past its allocation
// lands in memory no other view of the node uses (else Validate would
// refuse it first, as an in-place GEMM). Compile(shift, moved, moved_data)
// starts each view shift[i] bytes into its allocation (A, B, C, bias), but
// the view of role `moved` at `moved_data`.
class ReachableViewsTest : public ::testing::Test {
 protected:
  static constexpr int64_t kM = 64, kN = 128, kK = 64;
  static constexpr int64_t kAllocationBytes = int64_t{2} << 20;
  struct Role {
    const char* label;  // how messages name the view
    int64_t rows, cols;
    absl::StatusOr<DeviceBuffer> buffer = absl::UnknownError("not allocated");
    absl::StatusOr<DeviceBuffer> spare = absl::UnknownError("not allocated");
  };

  void SetUp() override {
    LOOM_SKIP_WITHOUT_GPU();
    for (Role& role : roles_) {
      role.buffer = DeviceBuffer::Allocate(kAllocationBytes);
      LOOM_ASSERT_OK(role.buffer.status());
      role.spare = DeviceBuffer::Allocate(kAllocationBytes);
      LOOM_ASSERT_OK(role.spare.status());
    }
  }

  absl::StatusOr<Plan> Compile(std::array<int64_t, 4> shift, int moved = -1, void* moved_data = nullptr) const {
    std::array<TensorView, 4> views;
    for (int i = 0; i < 4; ++i) {
      void* data = static_cast<std::byte*>(roles_[i].buffer->data()) + shift[i];
      views[i] = TensorView::Dense(std::string(1, "xwyb"[i]), i == moved ? moved_data : data, DType::kBF16,
                                   roles_[i].rows, roles_[i].cols);
    }
    GemmGraph g;
    g.AddGemm("proj", views[0], views[1], views[2], Epilogue{.bias = views[3]});
    return TestRuntime().Compile(g, CompileOptions{});
  }

  // The node with role `role`'s view (0 A, 1 B, 2 C, 3 bias) at `data`, the
  // others at their allocations' starts.
  absl::StatusOr<Plan> CompileWithViewAt(int role, void* data) const { return Compile({0, 0, 0, 0}, role, data); }

  // InvalidArgument whose message holds every one of `parts`.
  static void ExpectRefused(const absl::StatusOr<Plan>& plan, std::initializer_list<std::string> parts) {
    ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(plan.status().message()).find(part), std::string::npos)
          << "expected \"" << part << "\" in: " << plan.status();
    }
  }

  Role roles_[4] = {{"A \"x\"", kM, kK}, {"B \"w\"", kN, kK}, {"C \"y\"", kM, kN}, {"bias \"b\"", 1, kN}};
};

// A view of each role that runs past the allocation it starts in is refused
// by name; the same views at their allocations' starts compile.
TEST_F(ReachableViewsTest, AViewPastItsAllocationIsRefused) {
  LOOM_ASSERT_OK(Compile({0, 0, 0, 0}).status());
  // Each view ending exactly at its allocation's end.
  std::array<int64_t, 4> at_end;
  for (int i = 0; i < 4; ++i) at_end[i] = kAllocationBytes - roles_[i].rows * roles_[i].cols * 2;
  LOOM_ASSERT_OK(Compile(at_end).status());
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(roles_[i].label);
    // Starting 16 bytes before its allocation's end (TMA's alignment kept).
    std::array<int64_t, 4> shift = {0, 0, 0, 0};
    shift[i] = kAllocationBytes - 16;
    ExpectRefused(Compile(shift), {absl::StrCat("node \"proj\": ", roles_[i].label, " [0x"),
                                   "bytes past the end of the allocation it starts in"});
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Host memory CUDA did not allocate (here from std::vector), or an address
// with no allocation at all, is refused on a device that does not read
// pageable host memory (the H100 and H200 on x86 hosts); a launch would fault
// the context.
TEST_F(ReachableViewsTest, HostMemoryIsRefused) {
  int pageable = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0), cudaSuccess);
  if (pageable != 0) GTEST_SKIP() << "device 0 reads pageable host memory: host views are legal there";
  std::vector<uint16_t> host(kM * kK);
  ExpectRefused(CompileWithViewAt(0, host.data()),
                {"node \"proj\": A \"x\" [0x", "neither allocated nor registered", "pageable"});
  ExpectRefused(CompileWithViewAt(0, reinterpret_cast<void*>(uintptr_t{1} << 45)),
                {"A \"x\" [0x200000000000, 0x200000002000)", "neither allocated nor registered"});
  // A view within TMA's limits whose last byte lies past 2^63 (2^23 + 2 rows
  // 2^40 - 16 bytes apart): its end is worked out in 128 bits (it overflowed
  // int64 once) and printed whole. B and C lie below it, never touched.
  constexpr int64_t kRows = (int64_t{1} << 23) + 2;
  GemmGraph g;
  g.AddGemm("proj",
            TensorView{"x", reinterpret_cast<void*>(uintptr_t{1} << 45), DType::kBF16, kRows, kK,
                       (int64_t{1} << 39) - 8},
            TensorView::Dense("w", reinterpret_cast<void*>(uintptr_t{0x8000000}), DType::kBF16, kN, kK),
            TensorView::Dense("y", reinterpret_cast<void*>(uintptr_t{0x10000000}), DType::kBF16, kRows, kN));
  ExpectRefused(TestRuntime().Compile(g, CompileOptions{}),
                {"A \"x\" [0x200000000000, 0x800020fff8000070)", "neither allocated nor registered"});
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Memory that is not a plain cudaMalloc allocation is not refused where the
// views lie inside it: a stream-ordered pool's (cudaMallocAsync) and pinned
// host memory (cudaHostAlloc, mapped) as A both compile, and pinned host
// memory as C (which the kernels write) too.
TEST_F(ReachableViewsTest, PoolAndPinnedMemoryAreAccepted) {
  const int64_t a_bytes = kM * kK * 2, c_bytes = kM * kN * 2;
  void* pooled = nullptr;
  ASSERT_EQ(cudaMallocAsync(&pooled, a_bytes, nullptr), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  void* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, c_bytes, cudaHostAllocMapped), cudaSuccess);
  const absl::Status from_pool = CompileWithViewAt(0, pooled).status();
  const absl::Status from_pinned = CompileWithViewAt(0, pinned).status();
  EXPECT_TRUE(from_pool.ok()) << from_pool;
  EXPECT_TRUE(from_pinned.ok()) << from_pinned;
  const absl::Status into_pinned = CompileWithViewAt(2, pinned).status();
  EXPECT_TRUE(into_pinned.ok()) << into_pinned;
  EXPECT_EQ(cudaFreeAsync(pooled, nullptr), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Device memory mapped through the virtual-memory API (cuMemCreate,
// cuMemAddressReserve, cuMemMap) on device 0: `bytes` rounded up to the
// allocation granularity, with `access` granted to device 0 by cuMemSetAccess,
// or none where it is CU_MEM_ACCESS_FLAGS_PROT_NONE (the range is then mapped
// but not accessible). `status` says whether each step succeeded.
class VirtualMapping {
 public:
  VirtualMapping(int64_t bytes, CUmemAccess_flags access) {
    using loom::internal::DriverFunction;
    static const auto granularity_of = DriverFunction<PFN_cuMemGetAllocationGranularity_v10020>(
        "cuMemGetAllocationGranularity", 10020);
    static const auto create = DriverFunction<PFN_cuMemCreate_v10020>("cuMemCreate", 10020);
    static const auto reserve = DriverFunction<PFN_cuMemAddressReserve_v10020>("cuMemAddressReserve", 10020);
    static const auto map = DriverFunction<PFN_cuMemMap_v10020>("cuMemMap", 10020);
    static const auto set_access = DriverFunction<PFN_cuMemSetAccess_v10020>("cuMemSetAccess", 10020);
    if (!granularity_of || !create || !reserve || !map || !set_access) {
      status = absl::UnavailableError("the driver gives no virtual-memory API");
      return;
    }
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    size_t granularity = 0;
    if (granularity_of(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) {
      status = absl::InternalError("cuMemGetAllocationGranularity failed");
      return;
    }
    bytes_ = (static_cast<size_t>(bytes) + granularity - 1) / granularity * granularity;
    if (create(&handle_, bytes_, &prop, 0) != CUDA_SUCCESS) {
      status = absl::InternalError("cuMemCreate failed");
      return;
    }
    created_ = true;
    if (reserve(&address_, bytes_, 0, 0, 0) != CUDA_SUCCESS) {
      status = absl::InternalError("cuMemAddressReserve failed");
      return;
    }
    if (map(address_, bytes_, 0, handle_, 0) != CUDA_SUCCESS) {
      status = absl::InternalError("cuMemMap failed");
      return;
    }
    mapped_ = true;
    if (access == CU_MEM_ACCESS_FLAGS_PROT_NONE) return;
    const CUmemAccessDesc grant = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, access};
    if (const CUresult granted = set_access(address_, bytes_, &grant, 1); granted != CUDA_SUCCESS) {
      status = absl::UnimplementedError(absl::StrCat("cuMemSetAccess with flags ", access, " failed: ", granted));
    }
  }
  ~VirtualMapping() {
    using loom::internal::DriverFunction;
    static const auto unmap = DriverFunction<PFN_cuMemUnmap_v10020>("cuMemUnmap", 10020);
    static const auto free_address = DriverFunction<PFN_cuMemAddressFree_v10020>("cuMemAddressFree", 10020);
    static const auto release = DriverFunction<PFN_cuMemRelease_v10020>("cuMemRelease", 10020);
    if (mapped_) {
      EXPECT_EQ(unmap(address_, bytes_), CUDA_SUCCESS);
    }
    if (address_ != 0) {
      EXPECT_EQ(free_address(address_, bytes_), CUDA_SUCCESS);
    }
    if (created_) {
      EXPECT_EQ(release(handle_), CUDA_SUCCESS);
    }
  }
  VirtualMapping(const VirtualMapping&) = delete;
  VirtualMapping& operator=(const VirtualMapping&) = delete;

  void* data() const { return reinterpret_cast<void*>(address_); }

  absl::Status status;

 private:
  size_t bytes_ = 0;
  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr address_ = 0;
  bool created_ = false, mapped_ = false;
};

// Device memory the device was given no access to (a virtual-memory mapping
// without cuMemSetAccess; another device's memory without peer access is
// SecondGpuMemoryTest's) is refused as any view, and read-only memory as the
// output; read-only memory as an input and read-write memory compile.
TEST_F(ReachableViewsTest, MemoryWithoutAccessIsRefused) {
  const int64_t a_bytes = kM * kK * 2;
  VirtualMapping unreachable(a_bytes, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  LOOM_ASSERT_OK(unreachable.status);
  ExpectRefused(CompileWithViewAt(0, unreachable.data()),
                {"node \"proj\": A \"x\" [0x", "is memory of device 0 that device 0 has no access to",
                 "cuMemSetAccess"});
  VirtualMapping writable(a_bytes, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  LOOM_ASSERT_OK(writable.status);
  const absl::Status from_writable = CompileWithViewAt(0, writable.data()).status();
  EXPECT_TRUE(from_writable.ok()) << from_writable;

  VirtualMapping read_only(kM * kN * 2, CU_MEM_ACCESS_FLAGS_PROT_READ);
  if (!read_only.status.ok()) GTEST_SKIP() << "read-only mappings not given by this driver: " << read_only.status;
  const absl::Status read_only_input = CompileWithViewAt(0, read_only.data()).status();
  EXPECT_TRUE(read_only_input.ok()) << read_only_input;
  ExpectRefused(CompileWithViewAt(2, read_only.data()),
                {"node \"proj\": C \"y\" [0x", "device 0 has only read access to it", "need read-write access"});
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Host memory registered read-only (cudaHostRegisterReadOnly) compiles as
// an input and is refused as C, which the kernels write.
TEST_F(ReachableViewsTest, ReadOnlyHostMemoryIsRefusedAsTheOutput) {
  int read_only_supported = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&read_only_supported, cudaDevAttrHostRegisterReadOnlySupported, 0), cudaSuccess);
  if (read_only_supported == 0) GTEST_SKIP() << "device 0 cannot register host memory read-only";
  constexpr size_t kBytes = size_t{64} << 10;  // whole pages, more than C's 16 KiB
  void* host = std::aligned_alloc(4096, kBytes);
  ASSERT_NE(host, nullptr);
  ASSERT_EQ(cudaHostRegister(host, kBytes, cudaHostRegisterMapped | cudaHostRegisterReadOnly), cudaSuccess);
  const absl::Status as_input = CompileWithViewAt(0, host).status();
  EXPECT_TRUE(as_input.ok()) << as_input;
  ExpectRefused(CompileWithViewAt(2, host),
                {"node \"proj\": C \"y\" [0x", "device 0 has only read access to it", "need read-write access"});
  EXPECT_EQ(cudaHostUnregister(host), cudaSuccess);
  std::free(host);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(GemmTest, TooManyClustersIsRefused) {
  LOOM_SKIP_WITHOUT_GPU();
  GemmGraph g;
  g.AddGemm("gemm", TensorView::Dense("A", reinterpret_cast<void*>(0x10000), DType::kBF16, 64, 64),
            TensorView::Dense("B", reinterpret_cast<void*>(0x20000), DType::kBF16, 64, 64),
            TensorView::Dense("C", reinterpret_cast<void*>(0x30000), DType::kBF16, 64, 64));
  CompileOptions options;
  options.max_clusters = 100000;
  const absl::StatusOr<Plan> plan = TestRuntime().Compile(g, options);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(plan.status().message()).find("100000"), std::string::npos);
}

}  // namespace
}  // namespace loom::testbed
