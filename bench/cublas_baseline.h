// cublas_baseline.h: what loom's two benchmarks (gemm_bench.cc, graph_bench.cc)
// share on the cuBLAS side: CUDA and cuBLAS errors as absl::Status, the
// baseline's one cublasLt matmul, and the median both report.
//
//   cublasLtHandle_t lt = ...;  // one handle serves every LtMatmul
//   void* workspace = ...;      // at least kCublasWorkspaceBytes of device memory
//   LtMatmul gemm;
//   LOOM_RETURN_IF_ERROR(gemm.Init(lt, m, n, k));
//   LOOM_RETURN_IF_ERROR(gemm.Enqueue(a, b, d, /*beta=*/0.0f, workspace, stream));
//   BENCH_CUDA(cudaStreamSynchronize(stream));
#ifndef LOOM_BENCH_CUBLAS_BASELINE_H_
#define LOOM_BENCH_CUBLAS_BASELINE_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <source_location>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "loom/status.h"

namespace loom::bench {

// --- Errors. ---

// OK for cudaSuccess; otherwise Internal, naming the call site (file name and
// line), the call, the error's text and its name.
absl::Status CudaStatus(cudaError_t error, std::string_view call,
                        std::source_location where = std::source_location::current());

// OK for CUBLAS_STATUS_SUCCESS; otherwise Internal, as CudaStatus.
absl::Status CublasStatus(cublasStatus_t status, std::string_view call,
                          std::source_location where = std::source_location::current());

// Evaluate a CUDA runtime (BENCH_CUDA) or cuBLAS (BENCH_CUBLAS) call and return
// its error, as an absl::Status, from the enclosing function.
#define BENCH_CUDA(call) LOOM_RETURN_IF_ERROR(::loom::bench::CudaStatus((call), #call))
#define BENCH_CUBLAS(call) LOOM_RETURN_IF_ERROR(::loom::bench::CublasStatus((call), #call))

// --- The baseline's GEMM. ---

// The baseline's workspace: twice cuBLAS's recommended 32 MiB on Hopper, so
// that no algorithm is ruled out for want of workspace (a weaker baseline
// would flatter loom). Every LtMatmul picks its algorithm for this much
// workspace and hands this size to cublasLtMatmul, so the workspace given to
// Enqueue must be at least this large.
inline constexpr size_t kCublasWorkspaceBytes = size_t{64} << 20;

// One cublasLt matmul shape: row-major D[m, n] = A[m, k] · B[n, k]ᵀ + beta · D,
// bf16 (or fp16: Init's `type`) in and out, FP32 accumulate and scale (what torch.nn.functional.linear
// calls). cuBLAS is column-major, so it computes Dᵀ[n, m] = B · Aᵀ: its first
// operand is our B read transposed (stored [k, n] column-major, ld k), its
// second our A ([k, m], ld k), and D is [n, m] with ld n. beta = 1 with D
// holding a copy of x is a residual.
class LtMatmul {
 public:
  LtMatmul() = default;
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;
  ~LtMatmul();

  // Describes the shape and asks cublasLt's heuristic for one algorithm (with
  // kCublasWorkspaceBytes of workspace). `handle` is borrowed: it must outlive
  // this object. NotFound when cublasLt has no algorithm for the shape.
  absl::Status Init(cublasLtHandle_t handle, int64_t m, int64_t n, int64_t k, cudaDataType_t type = CUDA_R_16BF);

  // Enqueues D = A · Bᵀ + beta · D on `stream` (alpha is 1); `workspace` holds
  // at least kCublasWorkspaceBytes. May be captured into a CUDA graph.
  absl::Status Enqueue(const void* a, const void* b, void* d, float beta, void* workspace,
                       cudaStream_t stream) const;

 private:
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t layout_weight_ = nullptr;  // B as cuBLAS's first operand: [k, n], ld k
  cublasLtMatrixLayout_t layout_input_ = nullptr;   // A as cuBLAS's second operand: [k, m], ld k
  cublasLtMatrixLayout_t layout_output_ = nullptr;  // D: [n, m], ld n
  cublasLtMatmulPreference_t preference_ = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic_ = {};
};

// --- Timing. ---

// The median of `values`, which must not be empty: the middle value of an odd
// count, the mean of the two middle values of an even count.
double Median(std::vector<double> values);

}  // namespace loom::bench

#endif  // LOOM_BENCH_CUBLAS_BASELINE_H_
