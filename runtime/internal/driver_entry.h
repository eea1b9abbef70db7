// driver_entry.h (internal): CUDA driver API functions through the runtime's
// driver entry point, so that loom links only cudart.
#ifndef LOOM_RUNTIME_INTERNAL_DRIVER_ENTRY_H_
#define LOOM_RUNTIME_INTERNAL_DRIVER_ENTRY_H_

#include <cuda_runtime_api.h>

namespace loom::internal {

// The driver's `symbol` as it was at CUDA version `version` (e.g. 12000),
// as a `Function` (the cudaTypedefs.h PFN_ type of that version); null where
// the driver does not give it. Callers keep the result (a function-local
// static): the lookup is a driver call.
template <typename Function>
Function DriverFunction(const char* symbol, unsigned int version) {
  void* pointer = nullptr;
  cudaDriverEntryPointQueryResult result;
  if (cudaGetDriverEntryPointByVersion(symbol, &pointer, version, cudaEnableDefault, &result) != cudaSuccess ||
      result != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return reinterpret_cast<Function>(pointer);
}

}  // namespace loom::internal

#endif  // LOOM_RUNTIME_INTERNAL_DRIVER_ENTRY_H_
