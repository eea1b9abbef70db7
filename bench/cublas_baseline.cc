// cublas_baseline.cc: see cublas_baseline.h.
#include "cublas_baseline.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"

namespace loom::bench {
namespace {

// "graph_bench.cc:123", not the full path the compiler was given.
std::string CallSite(const std::source_location& where) {
  std::string_view file = where.file_name();
  if (const size_t slash = file.find_last_of('/'); slash != std::string_view::npos) file.remove_prefix(slash + 1);
  return absl::StrFormat("%s:%d", file, where.line());
}

}  // namespace

absl::Status CudaStatus(cudaError_t error, std::string_view call, std::source_location where) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("%s: %s: %s (%s)", CallSite(where), call, cudaGetErrorString(error),
                                             cudaGetErrorName(error)));
}

absl::Status CublasStatus(cublasStatus_t status, std::string_view call, std::source_location where) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("%s: %s: %s (%s)", CallSite(where), call,
                                             cublasLtGetStatusString(status), cublasLtGetStatusName(status)));
}

LtMatmul::~LtMatmul() {
  if (preference_ != nullptr) cublasLtMatmulPreferenceDestroy(preference_);
  if (layout_weight_ != nullptr) cublasLtMatrixLayoutDestroy(layout_weight_);
  if (layout_input_ != nullptr) cublasLtMatrixLayoutDestroy(layout_input_);
  if (layout_output_ != nullptr) cublasLtMatrixLayoutDestroy(layout_output_);
  if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
}

absl::Status LtMatmul::Init(cublasLtHandle_t handle, int64_t m, int64_t n, int64_t k, cudaDataType_t type) {
  handle_ = handle;
  BENCH_CUBLAS(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)));
  BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)));
  BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&layout_weight_, type, k, n, k));
  BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&layout_input_, type, k, m, k));
  BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&layout_output_, type, n, m, n));
  BENCH_CUBLAS(cublasLtMatmulPreferenceCreate(&preference_));
  const size_t workspace_bytes = kCublasWorkspaceBytes;
  BENCH_CUBLAS(cublasLtMatmulPreferenceSetAttribute(preference_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes, sizeof(workspace_bytes)));
  int found = 0;
  BENCH_CUBLAS(cublasLtMatmulAlgoGetHeuristic(handle_, desc_, layout_weight_, layout_input_, layout_output_,
                                              layout_output_, preference_, 1, &heuristic_, &found));
  if (found == 0) {
    return absl::NotFoundError(absl::StrFormat("cublasLt has no algorithm for %d x %d x %d %s", m, n, k,
                                               type == CUDA_R_16F ? "fp16" : "bf16"));
  }
  return absl::OkStatus();
}

absl::Status LtMatmul::Enqueue(const void* a, const void* b, void* d, float beta, void* workspace,
                               cudaStream_t stream) const {
  const float alpha = 1.0f;
  BENCH_CUBLAS(cublasLtMatmul(handle_, desc_, &alpha, b, layout_weight_, a, layout_input_, &beta, d, layout_output_,
                              d, layout_output_, &heuristic_.algo, workspace, kCublasWorkspaceBytes, stream));
  return absl::OkStatus();
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace loom::bench
