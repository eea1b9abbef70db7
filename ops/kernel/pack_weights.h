// pack_weights.h: rearranging a weight matrix into a kernel's stage order
// (CompileOptions::pack_weights; the layout: packed_layout.h). Plain host
// code may include this.
#ifndef LOOM_OPS_KERNEL_PACK_WEIGHTS_H_
#define LOOM_OPS_KERNEL_PACK_WEIGHTS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "packed_layout.h"

namespace loom::kernel {

// B [n, k] bf16 (row_stride elements between rows; b and row_stride * 2
// multiples of 16 bytes, as a tensor map needs) into `packed`
// (layout.Bytes(n, k) bytes, 16-byte aligned), enqueued on `stream`.
cudaError_t PackWeights(const void* b, int64_t n, int64_t k, int64_t row_stride, PackedLayout layout, void* packed,
                        cudaStream_t stream);

// Enqueues an empty kernel on `stream`, launched without programmatic
// stream serialization, so it starts only once the packs before it have
// completed: a launch after it that overlaps the kernel before it
// (CompileOptions::overlap_launches, whose narrow kernel streams packed
// weights in before that kernel ends) overlaps this one, never a pack.
cudaError_t OrderAfterPacking(cudaStream_t stream);

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_PACK_WEIGHTS_H_
