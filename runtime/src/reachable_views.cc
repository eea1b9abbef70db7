#include "internal/reachable_views.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/str_format.h"
#include "internal/cuda_status.h"
#include "internal/driver_entry.h"
#include "internal/view_overlap.h"
#include "loom/status.h"

namespace loom::internal {
namespace {

PFN_cuPointerGetAttribute_v4000 PointerAttributeFunction() {
  static const auto function = DriverFunction<PFN_cuPointerGetAttribute_v4000>("cuPointerGetAttribute", 4000);
  return function;
}

// cudaPointerGetAttributes of `address`: nullopt where the runtime cannot
// say (its error cleared, if it is the one left pending).
std::optional<cudaPointerAttributes> PointerAttributes(uint64_t address) {
  cudaPointerAttributes attributes;
  const cudaError_t queried = cudaPointerGetAttributes(&attributes, reinterpret_cast<const void*>(address));
  if (queried == cudaSuccess) return attributes;
  if (cudaPeekAtLastError() == queried) cudaGetLastError();
  return std::nullopt;
}

// Whether `device` (the current one) may touch the memory at `address`,
// whose runtime attributes are `attributes`, as the kernels do (`role` "C"
// is written, the rest read). A plain cudaMalloc allocation of `device`
// itself always passes. Device memory is refused where the driver reports no
// access (CU_POINTER_ATTRIBUTE_ACCESS_FLAGS: a pool's memory without
// cudaMemPoolSetAccess, a virtual-memory mapping without cuMemSetAccess) and,
// for another device's memory, where the runtime gives no address `device`
// may dereference (cudaPointerAttributes::devicePointer null, its documented
// sign; the case of peer memory without cudaDeviceEnablePeerAccess, which
// has not run on two GPUs). Any memory CUDA knows but managed memory is
// refused as C where the driver reports read-only access (a read-only
// mapping, host memory registered read-only).
absl::Status CheckAccessGranted(PFN_cuPointerGetAttribute_v4000 get, std::string_view who, std::string_view role,
                                uint64_t address, const cudaPointerAttributes& attributes,
                                bool own_plain_allocation, int device) {
  if (own_plain_allocation || attributes.type == cudaMemoryTypeUnregistered ||
      attributes.type == cudaMemoryTypeManaged) {
    return absl::OkStatus();
  }
  const bool device_memory = attributes.type == cudaMemoryTypeDevice;
  const auto no_access = [&] {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is memory of device %d that device %d has no access to at 0x%x (another device's memory without "
        "cudaDeviceEnablePeerAccess, a pool's without cudaMemPoolSetAccess, or a virtual-memory mapping "
        "without cuMemSetAccess for device %d)",
        who, attributes.device, device, address, device));
  };
  if (device_memory && attributes.device != device && attributes.devicePointer == nullptr) return no_access();
  unsigned int access = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
  if (get(&access, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, address) != CUDA_SUCCESS) return absl::OkStatus();
  if (device_memory && access == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE) return no_access();
  if (access == CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ && role == "C") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is the output, but device %d has only read access to it at 0x%x (a read-only mapping, or host "
        "memory registered read-only); the kernels write C and need read-write access",
        who, device, address));
  }
  return absl::OkStatus();
}

// Whether the kernels' TMA loads and stores on `view` stay inside memory that
// `device` can reach. Its first byte must be memory CUDA knows (allocated or
// registered), unless the device reads pageable host memory itself: a host
// pointer, or one at no allocation at all, would fault the context at the
// first launch. Its last byte: where the first lies in a plain cudaMalloc
// allocation (the driver's range is then exactly that allocation, and the
// next one is not promised to be adjacent), inside it; elsewhere (memory
// pools, virtual-memory mappings, which may legitimately span adjacent
// reservations, managed and pinned host memory), in mapped memory. Memory
// `device` was not given access to (read access, for C) is refused at both
// ends (CheckAccessGranted). Where the driver cannot say, the view passes
// (nothing refused on a guess).
absl::Status CheckViewIsReachable(std::string_view role, const TensorView& view, int device,
                                  bool reads_pageable_memory) {
  const uint64_t begin = reinterpret_cast<uint64_t>(view.data);
  // Past the last byte: 2^64 at most for a view Validate accepted (the
  // graph's rule 1), so the last byte fits 64 bits.
  const unsigned __int128 end = ViewEnd(view);
  const uint64_t last = static_cast<uint64_t>(end - 1);
  const std::string who = absl::StrFormat("%s \"%s\" [%s, %s)", role, view.name, HexAddress(begin), HexAddress(end));
  const std::optional<cudaPointerAttributes> first = PointerAttributes(begin);
  if (!first) return absl::OkStatus();
  if (first->type == cudaMemoryTypeUnregistered) {
    if (reads_pageable_memory) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s is not memory device %d can reach: CUDA neither allocated nor registered it (host memory from "
        "malloc or new, or no allocation at all), and the device does not read pageable host memory "
        "(cudaDevAttrPageableMemoryAccess = 0); pass device memory (cudaMalloc) or pinned host memory",
        who, device));
  }
  const PFN_cuPointerGetAttribute_v4000 get = PointerAttributeFunction();
  if (get == nullptr) return absl::OkStatus();
  int plain_allocation = 0;  // cudaMalloc / cuMemAlloc memory (IPC-capable the legacy way)
  if (get(&plain_allocation, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, begin) != CUDA_SUCCESS) {
    plain_allocation = 0;
  }
  const bool own_plain_allocation =
      plain_allocation != 0 && first->type == cudaMemoryTypeDevice && first->device == device;
  LOOM_RETURN_IF_ERROR(CheckAccessGranted(get, who, role, begin, *first, own_plain_allocation, device));
  CUdeviceptr range_begin = 0;
  size_t range_bytes = 0;
  if (plain_allocation != 0 && get(&range_begin, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, begin) == CUDA_SUCCESS &&
      get(&range_bytes, CU_POINTER_ATTRIBUTE_RANGE_SIZE, begin) == CUDA_SUCCESS && range_bytes > 0) {
    const unsigned __int128 range_end = static_cast<unsigned __int128>(range_begin) + range_bytes;
    if (end <= range_end) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s runs %d bytes past the end of the allocation it starts in, [0x%x, %s) (%d bytes)", who,
        static_cast<uint64_t>(end - range_end), static_cast<uint64_t>(range_begin), HexAddress(range_end),
        range_bytes));
  }
  const std::optional<cudaPointerAttributes> at_last = PointerAttributes(last);
  int mapped = 1;
  if ((at_last && at_last->type == cudaMemoryTypeUnregistered && !reads_pageable_memory) ||
      (at_last && get(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, last) == CUDA_SUCCESS && mapped == 0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s ends in memory that is not mapped (its last byte, 0x%x, lies past the memory it "
                        "starts in)",
                        who, last));
  }
  if (at_last) LOOM_RETURN_IF_ERROR(CheckAccessGranted(get, who, role, last, *at_last, false, device));
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckViewsAreReachable(const GemmGraph& graph, int device) {
  int pageable = 0;
  LOOM_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, device));
  return graph.CheckEachView([&](std::string_view role, const TensorView& view) {
    return CheckViewIsReachable(role, view, device, pageable != 0);
  });
}

}  // namespace loom::internal
