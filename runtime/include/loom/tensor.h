// loom/tensor.h: views of matrices in device (or, for the CPU reference, host)
// memory.
//
// A TensorView does not own memory. It names a row-major matrix: `rows` rows of
// `cols` elements, consecutive rows `row_stride` elements apart. The name is
// used in every error message about the tensor.
//
//   loom::TensorView x = loom::TensorView::Dense("x", d_x, loom::DType::kBF16,
//                                                tokens, hidden);
//   loom::TensorView gate = x.Columns(0, hidden / 2).Named("x.left");
#ifndef LOOM_TENSOR_H_
#define LOOM_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

enum class DType : uint8_t { kBF16, kFP16, kFP8E4M3, kFP32 };

// Size of one element in bytes.
constexpr size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
    case DType::kFP16:
      return 2;
    case DType::kFP8E4M3:
      return 1;
    case DType::kFP32:
      return 4;
  }
  return 0;
}

// "bf16", "fp16", "fp8_e4m3", "fp32".
std::string_view DTypeName(DType dtype);

struct TensorView {
  std::string name;
  void* data = nullptr;
  DType dtype = DType::kBF16;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // in elements, >= cols
  // Set by Columns / Rows when the range asked for leaves the view it was
  // taken from (a sub-view that would read the next row, or past the end);
  // GemmGraph::Validate refuses a view that carries it, naming the view.
  std::string slice_error = {};

  // A matrix whose rows are packed back to back (row_stride == cols).
  static TensorView Dense(std::string name, void* data, DType dtype, int64_t rows,
                          int64_t cols) {
    return TensorView{std::move(name), data, dtype, rows, cols, cols};
  }

  // The sub-view of columns [first, first + count), same rows and stride.
  // A range outside [0, cols) gives a view that Validate refuses.
  TensorView Columns(int64_t first, int64_t count) const;
  // The sub-view of rows [first, first + count), same columns and stride.
  // A range outside [0, rows) gives a view that Validate refuses.
  TensorView Rows(int64_t first, int64_t count) const;
  // The same view under another name.
  TensorView Named(std::string new_name) const;

  size_t element_size() const { return DTypeSize(dtype); }
  int64_t row_stride_bytes() const { return row_stride * static_cast<int64_t>(element_size()); }
  bool empty() const { return rows == 0 || cols == 0; }
  // Address of element (row, col).
  std::byte* element(int64_t row, int64_t col) const {
    return static_cast<std::byte*>(data) +
           (row * row_stride + col) * static_cast<int64_t>(element_size());
  }
};

}  // namespace loom

#endif  // LOOM_TENSOR_H_
