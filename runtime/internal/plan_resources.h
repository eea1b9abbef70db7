// plan_resources.h (internal): what a compiled plan holds on its device and
// how Compile makes it: the packed weights and tagged copies it chooses, the
// allocations and uploads of AllocateDeviceResources (every one counted:
// LiveAllocationsForTesting), and the RAII helpers Compile and the plan's
// destructor use.
#ifndef LOOM_RUNTIME_INTERNAL_PLAN_RESOURCES_H_
#define LOOM_RUNTIME_INTERNAL_PLAN_RESOURCES_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "internal/cuda_status.h"
#include "internal/plan_impl.h"
#include "loom/graph.h"
#include "loom/scheduler/schedule.h"
#include "loom/status.h"

namespace loom::internal {

// A non-blocking stream of the runtime's own for the copies and memsets
// that set up a plan's buffers (its records, queue, flags, state,
// workspace), which the caller waits for (Wait) before the plan can be
// launched: on the legacy stream, cudaMemcpy from pageable memory and
// cudaMemset may still be in flight when they return, and a launch on a
// non-blocking stream is not ordered after them. Its own stream also keeps
// the setup from waiting for, or holding up, other work on the legacy
// stream. Destroyed with the object (work still queued then completes).
class OwnStream {
 public:
  OwnStream() = default;
  OwnStream(const OwnStream&) = delete;
  OwnStream& operator=(const OwnStream&) = delete;
  ~OwnStream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  absl::Status Create() {
    LOOM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return absl::OkStatus();
  }
  absl::Status Wait() {
    LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Puts the calling thread's current CUDA device back as it found it: Compile
// works on the runtime's device without leaving the caller on it (Launch,
// Synchronize and RepackWeights check the current device, never set it).
class RestoreCurrentDevice {
 public:
  RestoreCurrentDevice() {
    if (cudaGetDevice(&device_) != cudaSuccess) device_ = -1;
  }
  ~RestoreCurrentDevice() {
    int now = -1;
    if (device_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != device_) cudaSetDevice(device_);
  }
  RestoreCurrentDevice(const RestoreCurrentDevice&) = delete;
  RestoreCurrentDevice& operator=(const RestoreCurrentDevice&) = delete;

 private:
  int device_ = -1;
};

// The nodes whose B the plan reads packed (CompileOptions::pack_weights), in
// the layout of its kernel (the narrow one, of tiles `narrow_tile_n` wide,
// when `tiled` is null): those with
// jobs whose B no node writes; on the tiled kernel (`tiled`: its schedule)
// only those of at most KernelConfig::kMaxPackedRowBlocks row blocks, whose
// weights' stream bounds them (with more, the multiply does, and a copy
// would only cost memory). A B that an earlier node packed already (the same
// view of the same memory) is not copied again.
std::vector<Plan::Impl::PackedNode> PackedNodesOf(const GemmGraph& graph,
                                                  const std::vector<DataDependency>& dependencies,
                                                  const sched::Schedule* tiled,
                                                  int narrow_tile_n = kernel::NarrowConfig::kBlockN);

// The narrow kernel's tagged handoffs (CompileOptions::tagged_handoff): in
// a plan on the mma.sync path (whose A slots are read by generic loads,
// which the A loader's own stores feed) with one consumer warpgroup (the
// plan then launches NarrowConfig::Instantiation::kTaggedHandoff), each
// node of at most kTaggedMaxRows rows whose A (bf16 or fp16, as their C) is
// written whole by its A producers: one whose C is exactly A, or several
// whose Cs are column slices of it that tile it (each from an even column,
// each but the last an even number of columns wide, so that no tagged word
// has two writers), all with jobs and all their 32-column tiles in one wave
// (at most `grid_ctas`). The
// copy is of A (rows of (K + 1) / 2 words), made once for all consumers of
// the same view; a producer writes one copy only, so a second consumer whose
// A is another view of the producer's C stays on flags. `words`: the tagged
// words of all the copies together.
std::vector<Plan::Impl::TaggedHandoff> TaggedHandoffsOf(const GemmGraph& graph,
                                                         const std::vector<DataDependency>& dependencies,
                                                         uint32_t a_stage_bytes, int consumers, int grid_ctas,
                                                         int64_t* words);

// Bytes of the packed copies (each B once).
int64_t PackedCopyBytes(const std::vector<Plan::Impl::PackedNode>& packed_nodes);

// Enqueues the copy of every packed B on `stream`.
absl::Status PackWeights(const Plan::Impl& impl, cudaStream_t stream);

// The clusters the tiled kernel's first wave leaves without a job that can
// start (0 on the narrow kernel). Above 0, the kernel spreads its first
// fetches over the chip (KernelConfig::kFirstFetchSpreadCycles).
int32_t IdleClustersToSpread(const Plan::Impl& impl);

// Needs the plan's device current (Compile makes it so).
absl::Status AllocateDeviceResources(Plan::Impl& impl);

}  // namespace loom::internal

#endif  // LOOM_RUNTIME_INTERNAL_PLAN_RESOURCES_H_
