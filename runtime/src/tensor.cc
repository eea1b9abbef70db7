// tensor.cc: names of element types and the sub-view helpers of TensorView.
//
// Sub-views are pure pointer arithmetic: nothing is dereferenced, so views
// of device memory are built on the host freely, and nothing is refused here:
// a range that leaves the view is recorded in the sub-view (slice_error), and
// GemmGraph::Validate refuses it.
#include "loom/tensor.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace loom {
namespace {

// The address `first` times `step` elements past `view`'s base, in 128 bits
// (so a sub-view of a null (empty) view stays well-defined, and an offset
// past 64 bits is seen); nullopt where it leaves the address space.
std::optional<void*> Advance(const TensorView& view, int64_t first, int64_t step) {
  using Wide = __int128;
  const Wide elements = static_cast<Wide>(first) * step;  // |first * step| < 2^126
  Wide bytes = 0, address = 0;
  if (__builtin_mul_overflow(elements, static_cast<Wide>(view.element_size()), &bytes) ||
      __builtin_add_overflow(bytes, static_cast<Wide>(reinterpret_cast<uintptr_t>(view.data)), &address) ||
      address < 0 || address > static_cast<Wide>(UINTPTR_MAX)) {
    return std::nullopt;
  }
  return reinterpret_cast<void*>(static_cast<uintptr_t>(address));
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

// The sub-view of `view` at `first` x `step` elements on, through `call`
// ([first, first + count) of its `extent` `what`): its slice error is the
// range's own (SliceError), or else one for an address past the address
// space (a range inside a view no memory could hold).
TensorView SubView(const TensorView& view, const char* call, int64_t first, int64_t count, int64_t step,
                   int64_t extent, const char* what) {
  TensorView sub = view;
  const std::optional<void*> data = Advance(view, first, step);
  sub.data = data.value_or(nullptr);
  sub.slice_error = SliceError(view, call, first, count, extent, what);
  if (sub.slice_error.empty() && !data.has_value()) {
    sub.slice_error = std::string(call) + "(" + std::to_string(first) + ", " + std::to_string(count) +
                      ") of a view of " + std::to_string(extent) + " " + what + ", " + std::to_string(step) +
                      " elements apart, lies outside the 64-bit address space";
  }
  return sub;
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
  TensorView view = SubView(*this, "Columns", first, count, 1, cols, "columns");
  view.cols = count;
  return view;
}

TensorView TensorView::Rows(int64_t first, int64_t count) const {
  TensorView view = SubView(*this, "Rows", first, count, row_stride, rows, "rows");
  view.rows = count;
  return view;
}

TensorView TensorView::Named(std::string new_name) const {
  TensorView view = *this;
  view.name = std::move(new_name);
  return view;
}

}  // namespace loom
