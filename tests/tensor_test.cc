// tensor_test.cc: TensorView's sub-views and the dtype helpers (CPU only).
//
// Views point at fake device addresses; nothing is dereferenced.
#include "loom/tensor.h"

#include <cstdint>

#include "gtest/gtest.h"
#include "testbed/fake_views.h"

namespace loom {
namespace {

using testbed::At;
uintptr_t AddressOf(const TensorView& view) { return reinterpret_cast<uintptr_t>(view.data); }

TEST(DTypeTest, NamesAndSizes) {
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_EQ(DTypeName(DType::kFP16), "fp16");
  EXPECT_EQ(DTypeName(DType::kFP8E4M3), "fp8_e4m3");
  EXPECT_EQ(DTypeName(DType::kFP32), "fp32");
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFP16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFP8E4M3), 1u);
  EXPECT_EQ(DTypeSize(DType::kFP32), 4u);
}

TEST(TensorViewTest, DenseIsPacked) {
  const TensorView x = TensorView::Dense("x", At(0x10000), DType::kBF16, 64, 96);
  EXPECT_EQ(x.name, "x");
  EXPECT_EQ(x.rows, 64);
  EXPECT_EQ(x.cols, 96);
  EXPECT_EQ(x.row_stride, 96);
  EXPECT_EQ(x.row_stride_bytes(), 192);
  EXPECT_FALSE(x.empty());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.element(2, 3)), 0x10000u + (2 * 96 + 3) * 2);
}

TEST(TensorViewTest, ColumnsOffsetsByTheElementSize) {
  const TensorView bf16 = TensorView::Dense("h", At(0x10000), DType::kBF16, 8, 128);
  const TensorView right = bf16.Columns(64, 64);
  EXPECT_EQ(AddressOf(right), 0x10000u + 64 * 2);
  EXPECT_EQ(right.rows, 8);
  EXPECT_EQ(right.cols, 64);
  EXPECT_EQ(right.row_stride, 128);
  EXPECT_EQ(right.dtype, DType::kBF16);
  EXPECT_EQ(right.name, "h");

  const TensorView fp32 = TensorView::Dense("y", At(0x20000), DType::kFP32, 8, 128);
  EXPECT_EQ(AddressOf(fp32.Columns(5, 3)), 0x20000u + 5 * 4);
  const TensorView fp8 = TensorView::Dense("q", At(0x30000), DType::kFP8E4M3, 8, 128);
  EXPECT_EQ(AddressOf(fp8.Columns(5, 3)), 0x30000u + 5);
}

TEST(TensorViewTest, RowsOffsetsByTheStride) {
  TensorView padded{"p", At(0x10000), DType::kBF16, 32, 100, 128};
  const TensorView rows = padded.Rows(4, 10);
  EXPECT_EQ(AddressOf(rows), 0x10000u + 4 * 128 * 2);
  EXPECT_EQ(rows.rows, 10);
  EXPECT_EQ(rows.cols, 100);
  EXPECT_EQ(rows.row_stride, 128);
}

TEST(TensorViewTest, SubViewsCompose) {
  const TensorView x = TensorView::Dense("x", At(0x10000), DType::kFP32, 64, 256);
  const TensorView tile = x.Rows(16, 8).Columns(32, 16);
  EXPECT_EQ(AddressOf(tile), AddressOf(x) + (16 * 256 + 32) * 4);
  EXPECT_EQ(tile.data, x.element(16, 32));
  EXPECT_EQ(tile.rows, 8);
  EXPECT_EQ(tile.cols, 16);
  EXPECT_EQ(tile.row_stride, 256);
  // Same element, either order.
  EXPECT_EQ(x.Columns(32, 16).Rows(16, 8).data, tile.data);
}

// A range outside the view is still computed (nothing is refused here), and
// marked for GemmGraph::Validate to refuse; the first such range is kept
// through later sub-views and names.
TEST(TensorViewTest, SubViewsOutsideTheViewAreMarked) {
  const TensorView x = TensorView::Dense("x", At(0x10000), DType::kBF16, 4, 4);
  EXPECT_EQ(x.Columns(1, 3).slice_error, "");
  EXPECT_EQ(x.Columns(4, 0).slice_error, "");
  EXPECT_EQ(x.Rows(0, 4).Rows(3, 1).slice_error, "");
  const TensorView past = x.Columns(10, 20);
  EXPECT_EQ(AddressOf(past), 0x10000u + 10 * 2);
  EXPECT_EQ(past.cols, 20);
  EXPECT_EQ(past.slice_error, "Columns(10, 20) of a view of 4 columns leaves it");
  const TensorView before = x.Rows(-1, 1);
  EXPECT_EQ(AddressOf(before), 0x10000u - 4 * 2);
  EXPECT_EQ(before.slice_error, "Rows(-1, 1) of a view of 4 rows leaves it");
  EXPECT_EQ(x.Columns(2, 3).slice_error, "Columns(2, 3) of a view of 4 columns leaves it");
  EXPECT_EQ(x.Rows(1, -1).slice_error, "Rows(1, -1) of a view of 4 rows leaves it");
  EXPECT_EQ(x.Columns(2, 3).Rows(0, 1).Named("y").slice_error, "Columns(2, 3) of a view of 4 columns leaves it");
}

TEST(TensorViewTest, SubViewOfNullEmptyView) {
  const TensorView none = TensorView::Dense("none", nullptr, DType::kBF16, 0, 0);
  EXPECT_TRUE(none.empty());
  const TensorView sub = none.Columns(0, 0).Rows(0, 0);
  EXPECT_EQ(sub.data, nullptr);
  EXPECT_TRUE(sub.empty());
}

TEST(TensorViewTest, NamedKeepsEverythingElse) {
  const TensorView x = TensorView::Dense("x", At(0x10000), DType::kBF16, 8, 16);
  const TensorView left = x.Columns(0, 8).Named("x.left");
  EXPECT_EQ(left.name, "x.left");
  EXPECT_EQ(left.data, x.data);
  EXPECT_EQ(left.cols, 8);
  EXPECT_EQ(left.row_stride, 16);
  EXPECT_EQ(x.name, "x");  // the original is untouched
}

TEST(TensorViewTest, Empty) {
  EXPECT_TRUE(TensorView::Dense("a", At(0x10000), DType::kBF16, 0, 8).empty());
  EXPECT_TRUE(TensorView::Dense("b", At(0x10000), DType::kBF16, 8, 0).empty());
  EXPECT_FALSE(TensorView::Dense("c", At(0x10000), DType::kBF16, 1, 1).empty());
}

}  // namespace
}  // namespace loom
