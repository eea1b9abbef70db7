// baseline_kernels.h: the elementwise kernels of the cuBLAS baseline in
// graph_bench, the ones a PyTorch user's model runs between its GEMMs.
#ifndef LOOM_BENCH_BASELINE_KERNELS_H_
#define LOOM_BENCH_BASELINE_KERNELS_H_

#include <cuda_runtime_api.h>
#include <library_types.h>

#include <cstdint>

namespace loom::bench {

// SwiGLU over interleaved gate/up columns, 16-bit in and out (`type`:
// CUDA_R_16BF or CUDA_R_16F, the GEMMs' type), FP32 math:
//   out[i] = silu(gate_up[2i]) * gate_up[2i + 1],  i in [0, count)
// For a row-major gate_up [T, 2n] and out [T, n] this is, row by row,
// out[:, j] = silu(gate_up[:, 2j]) * gate_up[:, 2j + 1] with count = T * n.
// 16-byte loads when the pointers allow; launch errors are returned, and
// cudaErrorInvalidValue for any other `type`.
cudaError_t SwiGLUInterleaved(const void* gate_up, void* out, int64_t count, cudaDataType_t type,
                              cudaStream_t stream);

}  // namespace loom::bench

#endif  // LOOM_BENCH_BASELINE_KERNELS_H_
