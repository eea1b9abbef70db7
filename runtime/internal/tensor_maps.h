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

// A bf16 matrix [rows, cols] seen as k-blocks for the narrow decode kernel:
// the 3-D map {64 columns, rows, cols / 64 k-blocks} (strides: the row
// stride, then 128 bytes), box {64, box_rows, k_blocks}, 128B swizzle. One
// load brings k_blocks consecutive k-blocks of box_rows rows, each k-block
// its own box_rows x 128 B swizzled tile, one after another in shared memory.
// Needs cols to be a multiple of 64 (else the last k-block would run into the
// next row instead of being zero-filled): Internal otherwise.
absl::Status EncodeKBlockMap(const TensorView& view, uint32_t box_rows, uint32_t k_blocks, CUtensorMap* map);

// The 3-D map of a split-K node's fp32 partials: {columns, rows, slices},
// rows `padded_rows` apart between slices, box {box_cols, box_rows, 1}.
absl::Status EncodeWorkspaceMap(float* base, int64_t columns, int64_t rows, int64_t padded_rows, int64_t slices,
                                uint32_t box_cols, uint32_t box_rows, CUtensorMap* map);

}  // namespace loom::internal

#endif  // LOOM_RUNTIME_INTERNAL_TENSOR_MAPS_H_
