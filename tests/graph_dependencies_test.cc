// graph_dependencies_test.cc: GemmGraph::Dependencies (CPU only).
//
// Checks which producer each consumer operand waits on and the translation
// that maps the operand's elements onto the producer's output: element (r, c)
// of the operand is element (r + row_offset, c + col_offset) of the producer's
// C, or whole_tensor when no single translation describes the mapping.
// Tensors point at fake device addresses; nothing is dereferenced.
#include <cstdint>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "loom/graph.h"
#include "loom/tensor.h"
#include "testbed/fake_views.h"

namespace loom {

// Comparison and printing for readable expectations.
bool operator==(const DataDependency& x, const DataDependency& y) {
  return std::tie(x.consumer, x.producer, x.operand, x.row_offset, x.col_offset, x.whole_tensor) ==
         std::tie(y.consumer, y.producer, y.operand, y.row_offset, y.col_offset, y.whole_tensor);
}
void PrintTo(const DataDependency& d, std::ostream* os) {
  *os << "{consumer " << d.consumer << ", producer " << d.producer << ", " << OperandName(d.operand)
      << ", offset (" << d.row_offset << ", " << d.col_offset << ")"
      << (d.whole_tensor ? ", whole tensor" : "") << "}";
}

namespace {

constexpr uintptr_t kX = 0x1000000;
constexpr uintptr_t kW = 0x2000000;
constexpr uintptr_t kBuffer = 0x3000000;
constexpr uintptr_t kW2 = 0x4000000;
constexpr uintptr_t kOut = 0x5000000;
constexpr uintptr_t kOut2 = 0x6000000;
constexpr uintptr_t kW3 = 0x7000000;

using testbed::At;
using testbed::WithBias;
using testbed::WithResidual;

TensorView Bf16(std::string name, uintptr_t address, int64_t rows, int64_t cols) {
  return TensorView::Dense(std::move(name), At(address), DType::kBF16, rows, cols);
}

DataDependency Translation(int consumer, int producer, Operand operand, int64_t row_offset,
                           int64_t col_offset) {
  return DataDependency{consumer, producer, operand, row_offset, col_offset, false};
}
DataDependency Whole(int consumer, int producer, Operand operand) {
  return DataDependency{
      .consumer = consumer, .producer = producer, .operand = operand, .whole_tensor = true};
}

TEST(DependenciesTest, IndependentNodesHaveNone) {
  GemmGraph graph;
  graph.AddGemm("a", Bf16("x", kX, 64, 128), Bf16("w", kW, 256, 128), Bf16("y", kOut, 64, 256));
  graph.AddGemm("b", Bf16("x", kX, 64, 128), Bf16("w2", kW2, 256, 128), Bf16("z", kOut2, 64, 256));
  EXPECT_TRUE(graph.Dependencies().empty());
}

TEST(DependenciesTest, Chain) {
  GemmGraph graph;
  graph.AddGemm("l1", Bf16("x", kX, 64, 128), Bf16("w", kW, 256, 128),
                Bf16("h1", kBuffer, 64, 256));
  graph.AddGemm("l2", Bf16("h1", kBuffer, 64, 256), Bf16("w2", kW2, 128, 256),
                Bf16("h2", kOut, 64, 128));
  graph.AddGemm("l3", Bf16("h2", kOut, 64, 128), Bf16("w3", kW3, 64, 128),
                Bf16("y", kOut2, 64, 64));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  EXPECT_EQ(graph.Dependencies(), (std::vector<DataDependency>{
                                      Translation(1, 0, Operand::kA, 0, 0),
                                      Translation(2, 1, Operand::kA, 0, 0),
                                  }));
}

TEST(DependenciesTest, DiamondIsOrderedByConsumerThenProducer) {
  const TensorView w = Bf16("w", kW, 128, 128);
  const TensorView h = Bf16("h", kBuffer, 64, 128);
  const TensorView u = Bf16("u", kOut, 64, 128);
  const TensorView v = Bf16("v", kOut2, 64, 128);
  GemmGraph graph;
  graph.AddGemm("p", Bf16("x", kX, 64, 128), w, h);
  graph.AddGemm("c1", h, w, u);
  graph.AddGemm("c2", h, w, v);
  // Reads v (node 2) through A and u (node 1) through the residual.
  graph.AddGemm("d", v, w, Bf16("out", kW3, 64, 128), WithResidual(u));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  EXPECT_EQ(graph.Dependencies(), (std::vector<DataDependency>{
                                      Translation(1, 0, Operand::kA, 0, 0),
                                      Translation(2, 0, Operand::kA, 0, 0),
                                      Translation(3, 1, Operand::kResidual, 0, 0),
                                      Translation(3, 2, Operand::kA, 0, 0),
                                  }));
}

TEST(DependenciesTest, OneProducerThroughSeveralOperands) {
  // The consumer reads the producer's output as A and as its residual.
  const TensorView h = Bf16("h", kBuffer, 64, 128);
  GemmGraph graph;
  graph.AddGemm("p", Bf16("x", kX, 64, 128), Bf16("w", kW, 128, 128), h);
  graph.AddGemm("c", h, Bf16("w2", kW2, 128, 128), Bf16("y", kOut, 64, 128), WithResidual(h));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  EXPECT_EQ(graph.Dependencies(), (std::vector<DataDependency>{
                                      Translation(1, 0, Operand::kA, 0, 0),
                                      Translation(1, 0, Operand::kResidual, 0, 0),
                                  }));
}

TEST(DependenciesTest, ProducedWeightsAndBias) {
  // A node computes a weight matrix and a bias row that a later node reads.
  GemmGraph graph;
  graph.AddGemm("make_w", Bf16("p", kX, 256, 64), Bf16("q", kW, 128, 64),
                Bf16("w_made", kBuffer, 256, 128));
  // The producer's C is [4, 256]; the bias is its row 2, as a dense [1, 256]
  // view whose own stride (256) matches anyway.
  const TensorView bias_rows = Bf16("bias_rows", kOut2, 4, 256);
  graph.AddGemm("make_bias", Bf16("r", kW3, 4, 64), Bf16("s", kW2, 256, 64), bias_rows);
  graph.AddGemm("use", Bf16("x", 0x8000000, 64, 128), Bf16("w_made", kBuffer, 256, 128),
                Bf16("y", kOut, 64, 256), WithBias(bias_rows.Rows(2, 1).Named("bias")));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  EXPECT_EQ(graph.Dependencies(), (std::vector<DataDependency>{
                                      Translation(2, 0, Operand::kB, 0, 0),
                                      Translation(2, 1, Operand::kBias, 2, 0),
                                  }));
}

TEST(DependenciesTest, ColumnSubViewOfTheProducer) {
  // The producer writes all of h [64, 256]; the consumer reads columns [96, 224).
  const TensorView h = Bf16("h", kBuffer, 64, 256);
  GemmGraph graph;
  graph.AddGemm("p", Bf16("x", kX, 64, 128), Bf16("w", kW, 256, 128), h);
  graph.AddGemm("c", h.Columns(96, 128), Bf16("w2", kW2, 64, 128), Bf16("y", kOut, 64, 64));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  EXPECT_EQ(graph.Dependencies(),
            (std::vector<DataDependency>{Translation(1, 0, Operand::kA, 0, 96)}));
}

TEST(DependenciesTest, RowSubViewOfTheProducer) {
  const TensorView h = Bf16("h", kBuffer, 256, 128);
  GemmGraph graph;
  graph.AddGemm("p", Bf16("x", kX, 256, 64), Bf16("w", kW, 128, 64), h);
  graph.AddGemm("c", h.Rows(128, 64), Bf16("w2", kW2, 32, 128), Bf16("y", kOut, 64, 32));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  EXPECT_EQ(graph.Dependencies(),
            (std::vector<DataDependency>{Translation(1, 0, Operand::kA, 128, 0)}));
}

TEST(DependenciesTest, RowAndColumnSubView) {
  const TensorView h = Bf16("h", kBuffer, 256, 128);
  GemmGraph graph;
  graph.AddGemm("p", Bf16("x", kX, 256, 64), Bf16("w", kW, 128, 64), h);
  graph.AddGemm("c", h.Rows(16, 32).Columns(8, 64), Bf16("w2", kW2, 32, 64),
                Bf16("y", kOut, 32, 32));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  EXPECT_EQ(graph.Dependencies(),
            (std::vector<DataDependency>{Translation(1, 0, Operand::kA, 16, 8)}));
}

TEST(DependenciesTest, ColumnSliceProducersFeedOneConsumer) {
  // "left" and "right" write the two halves of buf [64, 512]; "consumer" reads
  // all of it. Its element (r, c) is (r, c) of left's C and (r, c - 256) of
  // right's C.
  const TensorView buffer = Bf16("buf", kBuffer, 64, 512);
  GemmGraph graph;
  graph.AddGemm("left", Bf16("x", kX, 64, 128), Bf16("w", kW, 256, 128),
                buffer.Columns(0, 256).Named("buf.left"));
  graph.AddGemm("right", Bf16("x", kX, 64, 128), Bf16("w2", kW2, 256, 128),
                buffer.Columns(256, 256).Named("buf.right"));
  graph.AddGemm("consumer", buffer, Bf16("w3", kW3, 128, 512), Bf16("y", kOut, 64, 128));
  // A consumer of the right half only waits on "right".
  graph.AddGemm("right_only", buffer.Columns(320, 128), Bf16("w4", 0x8000000, 64, 128),
                Bf16("z", kOut2, 64, 64));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  EXPECT_EQ(graph.Dependencies(), (std::vector<DataDependency>{
                                      Translation(2, 0, Operand::kA, 0, 0),
                                      Translation(2, 1, Operand::kA, 0, -256),
                                      Translation(3, 1, Operand::kA, 0, 64),
                                  }));
}

TEST(DependenciesTest, PaddedStrideSubView) {
  // Producer's C has a padded stride (128 elements for 96 columns).
  const TensorView h{"h", At(kBuffer), DType::kBF16, 64, 96, 128};
  GemmGraph graph;
  graph.AddGemm("p", Bf16("x", kX, 64, 64), Bf16("w", kW, 96, 64), h);
  graph.AddGemm("c", h.Rows(8, 16).Columns(32, 64), Bf16("w2", kW2, 16, 64),
                Bf16("y", kOut, 16, 16));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  EXPECT_EQ(graph.Dependencies(),
            (std::vector<DataDependency>{Translation(1, 0, Operand::kA, 8, 32)}));
}

TEST(DependenciesTest, DifferentStrideFallsBackToWholeTensor) {
  // The consumer reinterprets the producer's [64, 128] output as [128, 64].
  GemmGraph graph;
  graph.AddGemm("p", Bf16("x", kX, 64, 64), Bf16("w", kW, 128, 64), Bf16("h", kBuffer, 64, 128));
  graph.AddGemm("c", Bf16("h.reshaped", kBuffer, 128, 64), Bf16("w2", kW2, 32, 64),
                Bf16("y", kOut, 128, 32));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  EXPECT_EQ(graph.Dependencies(), (std::vector<DataDependency>{Whole(1, 0, Operand::kA)}));
}

TEST(DependenciesTest, DifferentElementSizeFallsBackToWholeTensor) {
  // The producer writes fp32 [64, 64] (256-byte rows); the consumer reads the
  // same bytes as bf16 [64, 128]: same byte stride, different elements.
  GemmGraph graph;
  graph.AddGemm("p", Bf16("x", kX, 64, 64), Bf16("w", kW, 64, 64),
                TensorView::Dense("h", At(kBuffer), DType::kFP32, 64, 64));
  graph.AddGemm("c", Bf16("h.bits", kBuffer, 64, 128), Bf16("w2", kW2, 32, 128),
                Bf16("y", kOut, 64, 32));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  EXPECT_EQ(graph.Dependencies(), (std::vector<DataDependency>{Whole(1, 0, Operand::kA)}));
}

TEST(DependenciesTest, RowsThatStraddleTheProducersRowsFallBackToWholeTensor) {
  // Same stride, but the view starts 8 elements into a row and is a full row
  // wide, so each of its rows spans two of the producer's rows.
  const TensorView h = Bf16("h", kBuffer, 64, 128);
  GemmGraph graph;
  graph.AddGemm("p", Bf16("x", kX, 64, 64), Bf16("w", kW, 128, 64), h);
  const TensorView shifted{"h.shifted", h.element(0, 8), DType::kBF16, 63, 128, 128};
  graph.AddGemm("c", shifted, Bf16("w2", kW2, 32, 128), Bf16("y", kOut, 63, 32));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  EXPECT_EQ(graph.Dependencies(), (std::vector<DataDependency>{Whole(1, 0, Operand::kA)}));
}

// The view starts two rows above the producer's C (rows 2-3 of buf
// [4, 128]), 8 columns in, and is 121 wide, so each of its rows ends one
// element into the next buffer row: rows 1 and 2 of the view both meet C,
// through two translations exactly a stride apart, the first at the view's
// left edge (a row offset of exactly -2 strides: a floor division that
// rounded it down once more gave Translation(-2, 8), which misses C(0, 0)
// read by the view's row 1).
TEST(DependenciesTest, RowsThatStraddleFromAboveTheProducerFallBackToWholeTensor) {
  const TensorView buffer = Bf16("buf", kBuffer, 4, 128);
  GemmGraph graph;
  graph.AddGemm("p", Bf16("x", kX, 2, 64), Bf16("w", kW, 128, 64), buffer.Rows(2, 2).Named("buf.low"));
  const TensorView above{"buf.above", buffer.element(0, 8), DType::kBF16, 3, 121, 128};
  const TensorView w2{"w2", At(kW2), DType::kBF16, 32, 121, 128};  // rows padded to 256 bytes
  graph.AddGemm("c", above, w2, Bf16("y", kOut, 3, 32));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  EXPECT_EQ(graph.Dependencies(), (std::vector<DataDependency>{Whole(1, 0, Operand::kA)}));
}

// The view starts 8 columns before the end of a row of the producer's
// padded C ([64, 121], stride 128) and is 16 wide, so its rows run into the
// producer's next row: two translations (rows 0 and 1) meet it, exactly
// one stride apart at the edge of the output (one translation alone,
// (1, -8), would leave row 0's tile unwaited).
TEST(DependenciesTest, RowsThatStraddleByExactlyOneStrideFallBackToWholeTensor) {
  const TensorView h{"h", At(kBuffer), DType::kBF16, 64, 121, 128};
  GemmGraph graph;
  graph.AddGemm("p", Bf16("x", kX, 64, 64), Bf16("w", kW, 121, 64), h);
  const TensorView tail{"h.tail", h.element(0, 120), DType::kBF16, 2, 16, 128};
  graph.AddGemm("c", tail, Bf16("w2", kW2, 32, 16), Bf16("y", kOut, 2, 32));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  EXPECT_EQ(graph.Dependencies(), (std::vector<DataDependency>{Whole(1, 0, Operand::kA)}));
}

// Single rows of different element sizes: fp32 [1, 64] read as bf16
// [1, 128]; column c of the operand is not column c + offset of the output.
// The single-row path must not offer Translation(0, 0).
TEST(DependenciesTest, DifferentElementSizeOfSingleRowsFallsBackToWholeTensor) {
  GemmGraph graph;
  graph.AddGemm("p", Bf16("x", kX, 1, 64), Bf16("w", kW, 64, 64),
                TensorView::Dense("h", At(kBuffer), DType::kFP32, 1, 64));
  graph.AddGemm("c", Bf16("h.bits", kBuffer, 1, 128), Bf16("w2", kW2, 32, 128), Bf16("y", kOut, 1, 32));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  EXPECT_EQ(graph.Dependencies(), (std::vector<DataDependency>{Whole(1, 0, Operand::kA)}));
}

// A view starting inside the producer's last row, 8 columns in, a whole
// stride wide (so its first row runs past the padded C's row into memory
// the producer does not write) meets the output through one translation
// only (a candidate one row past the output does not meet it; counting it
// fell back to the whole tensor: a coarser wait, not a wrong one).
TEST(DependenciesTest, AViewFromTheLastRowOnIsOneTranslation) {
  const TensorView h{"h", At(kBuffer), DType::kBF16, 64, 121, 128};
  GemmGraph graph;
  graph.AddGemm("p", Bf16("x", kX, 64, 64), Bf16("w", kW, 121, 64), h);
  const TensorView last{"h.last", h.element(63, 8), DType::kBF16, 2, 128, 128};
  graph.AddGemm("c", last, Bf16("w2", kW2, 32, 128), Bf16("y", kOut, 2, 32));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  EXPECT_EQ(graph.Dependencies(), (std::vector<DataDependency>{Translation(1, 0, Operand::kA, 63, 8)}));
}

TEST(DependenciesTest, OnlyEarlierProducersCount) {
  // Dependencies() reports edges to earlier nodes only; Validate() refuses a
  // graph with an edge to a later one (a hazard).
  GemmGraph graph;
  graph.AddGemm("a", Bf16("x", kX, 64, 128), Bf16("w", kW, 256, 128), Bf16("y", kOut, 64, 256));
  graph.AddGemm("b", Bf16("h", kBuffer, 64, 256), Bf16("w2", kW2, 128, 256),
                Bf16("x", kX, 64, 128));
  EXPECT_FALSE(graph.Validate().ok());
  EXPECT_TRUE(graph.Dependencies().empty());
}

TEST(DependenciesTest, ZeroSizeViewsHaveNoDependencies) {
  const TensorView h = Bf16("h", kBuffer, 64, 128);
  GemmGraph graph;
  graph.AddGemm("p", Bf16("x", kX, 64, 64), Bf16("w", kW, 128, 64), h);
  graph.AddGemm("c", h.Rows(0, 0), Bf16("w2", kW2, 32, 128), Bf16("y", kOut, 0, 32));
  ASSERT_TRUE(graph.Validate().ok()) << graph.Validate();
  EXPECT_TRUE(graph.Dependencies().empty());
}

}  // namespace
}  // namespace loom
