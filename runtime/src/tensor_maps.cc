#include "internal/tensor_maps.h"

#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include <string>

#include "absl/strings/str_format.h"
#include "internal/driver_entry.h"

namespace loom::internal {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 EncodeFunction() {
  static const auto function =
      DriverFunction<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled", 12000);
  return function;
}

CUtensorMapDataType DataTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case DType::kFP16:
      return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    case DType::kFP8E4M3:
      return CU_TENSOR_MAP_DATA_TYPE_UINT8;
    case DType::kFP32:
      return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  }
  return CU_TENSOR_MAP_DATA_TYPE_UINT8;
}

// cuTensorMapEncodeTiled of a 128B-swizzled map with unit element strides
// (rank 2 or 3). `refused` describes the tensor for the error message.
absl::Status EncodeTiled(CUtensorMapDataType type, cuuint32_t rank, void* base, const cuuint64_t* dims,
                         const cuuint64_t* strides, const cuuint32_t* box, const std::string& refused,
                         CUtensorMap* map) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = EncodeFunction();
  if (encode == nullptr) {
    return absl::FailedPreconditionError("the CUDA driver has no cuTensorMapEncodeTiled (driver too old?)");
  }
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result =
      encode(map, type, rank, base, dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    return absl::InternalError(
        absl::StrFormat("%s: cuTensorMapEncodeTiled refused it: CUresult %d", refused, static_cast<int>(result)));
  }
  return absl::OkStatus();
}

// The row stride to give TMA for `view`. A single-row view's stride is
// never used and is not validated: give TMA a legal one (the row's own size,
// rounded up to 16 bytes).
int64_t TmaRowStrideBytes(const TensorView& view) {
  if (view.rows > 1) return view.row_stride_bytes();
  return (view.cols * static_cast<int64_t>(view.element_size()) + 15) / 16 * 16;
}

}  // namespace

absl::Status EncodeTensorMap(const TensorView& view, uint32_t box_cols, uint32_t box_rows, CUtensorMap* map) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(view.cols), static_cast<cuuint64_t>(view.rows)};
  const int64_t stride_bytes = TmaRowStrideBytes(view);
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride_bytes)};
  const cuuint32_t box[2] = {box_cols, box_rows};
  return EncodeTiled(DataTypeOf(view.dtype), 2, view.data, dims, strides, box,
                     absl::StrFormat("%s [%d, %d] (stride %d bytes, box %dx%d)", view.name, view.rows, view.cols,
                                     stride_bytes, box_rows, box_cols),
                     map);
}

absl::Status EncodeKBlockMap(const TensorView& view, uint32_t box_rows, uint32_t k_blocks, CUtensorMap* map) {
  constexpr int64_t kKBlock = 64;  // elements: one 128-byte swizzle row of bf16
  if (view.cols % kKBlock != 0 || view.element_size() != 2) {
    return absl::InternalError(absl::StrFormat(
        "%s [%d, %d]: a k-block map needs 16-bit elements and a multiple of %d columns", view.name, view.rows,
        view.cols, kKBlock));
  }
  const int64_t stride_bytes = TmaRowStrideBytes(view);
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kKBlock), static_cast<cuuint64_t>(view.rows),
                              static_cast<cuuint64_t>(view.cols / kKBlock)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(stride_bytes), static_cast<cuuint64_t>(kKBlock * 2)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(kKBlock), box_rows, k_blocks};
  return EncodeTiled(DataTypeOf(view.dtype), 3, view.data, dims, strides, box,
                     absl::StrFormat("%s [%d, %d] as k-blocks (stride %d bytes, box %d rows x %d k-blocks)",
                                     view.name, view.rows, view.cols, stride_bytes, box_rows, k_blocks),
                     map);
}

absl::Status EncodeWorkspaceMap(float* base, int64_t columns, int64_t rows, int64_t padded_rows, int64_t slices,
                                uint32_t box_cols, uint32_t box_rows, CUtensorMap* map) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(columns), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(slices)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(columns * 4),
                                 static_cast<cuuint64_t>(columns * padded_rows * 4)};
  const cuuint32_t box[3] = {box_cols, box_rows, 1};
  return EncodeTiled(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, base, dims, strides, box,
                     absl::StrFormat("split-K workspace {%d, %d, %d} (padded rows %d)", columns, rows, slices,
                                     padded_rows),
                     map);
}

}  // namespace loom::internal
