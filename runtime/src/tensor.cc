// tensor.cc: names of element types and the sub-view helpers of TensorView.
//
// Sub-views are pure pointer arithmetic: nothing is dereferenced, so views
// of device memory are built on the host freely, and nothing is refused here:
// a range that leaves the view is recorded in the sub-view (slice_error), and
// GemmGraph::Validate refuses it.
#include "loom/tensor.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace loom {
namespace {

// The address `elements` elements past `view`'s base. Computed on integers so a
// sub-view of a null (empty) view stays well-defined.
void* Advance(const TensorView& view, int64_t elements) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(view.data);
  const int64_t bytes = elements * static_cast<int64_t>(view.element_size());
  return reinterpret_cast<void*>(base + static_cast<uintptr_t>(bytes));
}

// The slice error of taking [first, first + count) of `extent` `what` (rows
// or columns) of `view`: the view's own error if it has one, else "" when the
// range lies inside.
std::string SliceError(const TensorView& view, const char* call, int64_t first, int64_t count, int64_t extent,
                       const char* what) {
  if (!view.slice_error.empty()) return view.slice_error;
  if (first >= 0 && count >= 0 && first <= extent && count <= extent - first) return "";
  return std::string(call) + "(" + std::to_string(first) + ", " + std::to_string(count) + ") of a view of " +
         std::to_string(extent) + " " + what + " leaves it";
}

}  // namespace

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bf16";
    case DType::kFP16:
      return "fp16";
    case DType::kFP8E4M3:
      return "fp8_e4m3";
    case DType::kFP32:
      return "fp32";
  }
  return "unknown";
}

TensorView TensorView::Columns(int64_t first, int64_t count) const {
  TensorView view = *this;
  view.data = Advance(*this, first);
  view.cols = count;
  view.slice_error = SliceError(*this, "Columns", first, count, cols, "columns");
  return view;
}

TensorView TensorView::Rows(int64_t first, int64_t count) const {
  TensorView view = *this;
  view.data = Advance(*this, first * row_stride);
  view.rows = count;
  view.slice_error = SliceError(*this, "Rows", first, count, rows, "rows");
  return view;
}

TensorView TensorView::Named(std::string new_name) const {
  TensorView view = *this;
  view.name = std::move(new_name);
  return view;
}

}  // namespace loom
