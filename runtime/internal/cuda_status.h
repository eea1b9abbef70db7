// cuda_status.h (internal): turning CUDA runtime errors into absl::Status.
#ifndef LOOM_RUNTIME_INTERNAL_CUDA_STATUS_H_
#define LOOM_RUNTIME_INTERNAL_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <source_location>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace loom::internal {

// OK for cudaSuccess; otherwise Internal naming the call, the error and the call site.
inline absl::Status CudaStatus(cudaError_t error, std::string_view what,
                               std::source_location where = std::source_location::current()) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("%s failed: %s (%s) at %s:%d", what, cudaGetErrorName(error),
                                             cudaGetErrorString(error), where.file_name(), where.line()));
}

}  // namespace loom::internal

#define LOOM_CUDA_RETURN_IF_ERROR(call) LOOM_RETURN_IF_ERROR(::loom::internal::CudaStatus((call), #call))

#endif  // LOOM_RUNTIME_INTERNAL_CUDA_STATUS_H_
