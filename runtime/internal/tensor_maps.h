// tensor_maps.h (internal): encoding the TMA descriptors of a node.
#ifndef LOOM_RUNTIME_INTERNAL_TENSOR_MAPS_H_
#define LOOM_RUNTIME_INTERNAL_TENSOR_MAPS_H_

#include <cuda.h>

#include <cstdint>

#include "absl/status/status.h"
#include "loom/tensor.h"

namespace loom::internal {

// A 2-D, 128B-swizzled tensor map over `view` with a box of `box_cols`
// elements (128 bytes) by `box_rows` rows. Out-of-bounds loads fill zeros,
// out-of-bounds stores are dropped. FailedPrecondition if the driver entry
// point is missing; Internal if the driver refuses the encoding.
absl::Status EncodeTensorMap(const TensorView& view, uint32_t box_cols, uint32_t box_rows, CUtensorMap* map);

// The 3-D map of a split-K node's fp32 partials: {columns, rows, slices},
// rows `padded_rows` apart between slices, box {box_cols, box_rows, 1}.
absl::Status EncodeWorkspaceMap(float* base, int64_t columns, int64_t rows, int64_t padded_rows, int64_t slices,
                                uint32_t box_cols, uint32_t box_rows, CUtensorMap* map);

}  // namespace loom::internal

#endif  // LOOM_RUNTIME_INTERNAL_TENSOR_MAPS_H_
