// runtime.cc: Runtime (device discovery), Compile (validation, lowering,
// device resources) and Plan (launch, synchronize, explain).
#include "loom/runtime.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "internal/compile_choices.h"
#include "internal/cuda_status.h"
#include "internal/plan_impl.h"
#include "internal/reachable_views.h"
#include "internal/tensor_maps.h"
#include "internal/testing_hooks.h"
#include "kernel_config.h"
#include "loom/scheduler/explain.h"
#include "loom/scheduler/queue.h"
#include "loom/scheduler/tiling.h"
#include "loom/status.h"
#include "narrow_gemm.h"
#include "pack_weights.h"
#include "persistent_gemm.h"

namespace loom {
namespace {

using kernel::KernelConfig;
using kernel::KernelConfigN128;
using kernel::NarrowConfig;
using internal::AStageBytesFor;
using internal::ActivationOf;
using internal::CheckDevice;
using internal::CheckLockstepReadsNoProducedB;
using internal::CheckOptions;
using internal::ChooseNarrowRings;
using internal::ChooseTileWidth;
using internal::ChooseTiledRings;
using internal::ElementTypeOf;
using internal::FirstZeroKNode;
using internal::HalfTypeOf;
using internal::HasJobs;
using internal::IsChainOfOneWaveLayers;
using internal::LoadsOperands;
using internal::MaxK;
using internal::MaxRows;
using internal::NarrowRings;
using internal::NarrowTiles;
using internal::ProblemsOf;
using internal::TiledRingsReadPackedWeights;
using internal::TiledSharedMemory;
using internal::TiledTile;
using internal::UsesNarrowKernel;
using internal::kClusterSize;

// Every device and mapped host allocation a plan owns is made and freed
// through these, which count the live ones (LiveAllocationsForTesting): a
// plan's destructor that forgot one is seen by the count however small the
// allocation, where free device memory moves only by whole pages.
std::atomic<int64_t> live_allocations{0};

template <typename T>
cudaError_t CountedMalloc(T** pointer, size_t bytes) {
  const cudaError_t error = cudaMalloc(reinterpret_cast<void**>(pointer), bytes);
  if (error == cudaSuccess) live_allocations.fetch_add(1, std::memory_order_relaxed);
  return error;
}

template <typename T>
cudaError_t CountedHostAlloc(T** pointer, size_t bytes, unsigned int flags) {
  const cudaError_t error = cudaHostAlloc(reinterpret_cast<void**>(pointer), bytes, flags);
  if (error == cudaSuccess) live_allocations.fetch_add(1, std::memory_order_relaxed);
  return error;
}

void CountedFree(void* pointer) {
  if (pointer != nullptr && cudaFree(pointer) == cudaSuccess) live_allocations.fetch_sub(1, std::memory_order_relaxed);
}

void CountedFreeHost(void* pointer) {
  if (pointer != nullptr && cudaFreeHost(pointer) == cudaSuccess) {
    live_allocations.fetch_sub(1, std::memory_order_relaxed);
  }
}

template <typename T>
absl::Status Upload(const std::vector<T>& host, T** device, cudaStream_t stream) {
  if (host.empty()) return absl::OkStatus();
  LOOM_CUDA_RETURN_IF_ERROR(CountedMalloc(device, host.size() * sizeof(T)));
  LOOM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(*device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  return absl::OkStatus();
}

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

// The tensor maps through which `node`'s jobs load A and B (K > 0). The
// narrow kernel's (`narrow`): A boxes of the rows of its A k-block tiles
// (a_stage_bytes / 128 / kKBlocksPerStage), B boxes of 32 rows, a stage of
// k-blocks at a time where K is a multiple of 64, else one k-block a load (the
// kernel tells them apart the same way). The tiled kernel's: half-tile boxes
// and whole-slot boxes of each.
absl::Status EncodeOperandMaps(const GemmNode& node, bool narrow, uint32_t a_stage_bytes, int tile_n,
                               kernel::KernelNode& out) {
  if (narrow) {
    const uint32_t a_rows = NarrowConfig::ATileRows(a_stage_bytes);
    if (node.k() % NarrowConfig::kBlockK == 0) {
      LOOM_RETURN_IF_ERROR(internal::EncodeKBlockMap(node.a, a_rows, NarrowConfig::kKBlocksPerStage, &out.a_map));
      return internal::EncodeKBlockMap(node.b, NarrowConfig::kBlockN, NarrowConfig::kKBlocksPerStage, &out.b_map);
    }
    LOOM_RETURN_IF_ERROR(internal::EncodeTensorMap(node.a, NarrowConfig::kBlockK, a_rows, &out.a_map));
    return internal::EncodeTensorMap(node.b, NarrowConfig::kBlockK, NarrowConfig::kBlockN, &out.b_map);
  }
  LOOM_RETURN_IF_ERROR(internal::EncodeTensorMap(node.a, KernelConfig::kBlockK, KernelConfig::kABoxRows, &out.a_map));
  const int b_box_rows = kernel::WithTiledConfig(tile_n, [](auto config) { return decltype(config)::kBBoxRows; });
  LOOM_RETURN_IF_ERROR(internal::EncodeTensorMap(node.b, KernelConfig::kBlockK, b_box_rows, &out.b_map));
  LOOM_RETURN_IF_ERROR(
      internal::EncodeTensorMap(node.a, KernelConfig::kBlockK, 2 * KernelConfig::kABoxRows, &out.a_slot_map));
  return internal::EncodeTensorMap(node.b, KernelConfig::kBlockK, 2 * b_box_rows, &out.b_slot_map);
}

// The nodes as the kernel reads them. `narrow`: for the narrow decode kernel
// (its A and B maps: EncodeOperandMaps), which stores C itself and has no
// partials; else for the tiled kernel with tiles `tile_n` wide.
absl::StatusOr<std::vector<kernel::KernelNode>> KernelNodesOf(const GemmGraph& graph,
                                                              const sched::Schedule& schedule, float* workspace,
                                                              bool narrow, uint32_t a_stage_bytes, int tile_n) {
  std::vector<kernel::KernelNode> nodes(graph.nodes().size());
  std::vector<bool> has_dependents(nodes.size(), false);
  for (const sched::DependencyEdge& edge : schedule.dependencies) has_dependents[edge.producer] = true;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const GemmNode& node = graph.nodes()[i];
    kernel::KernelNode& out = nodes[i];
    out.schedule = schedule.nodes[i];
    out.has_dependents = has_dependents[i] ? 1 : 0;
    out.a_producer = internal::AProducerOf(schedule, static_cast<int>(i));
    internal::FirstARunsOf(schedule, static_cast<int>(i), out.a_producer, narrow, out.first_a_run);
    out.activation = ActivationOf(node.epilogue.activation);
    out.out_type = ElementTypeOf(node.c.dtype);
    out.c = node.c.data;
    out.c_stride = node.c.row_stride;
    const int64_t per_16_bytes = 16 / static_cast<int64_t>(node.c.element_size());
    out.c_tma_cols = node.c.cols / per_16_bytes * per_16_bytes;
    if (node.epilogue.bias) {
      out.bias = node.epilogue.bias->data;
      out.bias_type = ElementTypeOf(node.epilogue.bias->dtype);
    }
    if (node.epilogue.residual) {
      out.residual = node.epilogue.residual->data;
      out.residual_type = ElementTypeOf(node.epilogue.residual->dtype);
      out.residual_stride = node.epilogue.residual->row_stride;
    }
    if (!HasJobs(node)) continue;  // no tensor maps
    if (LoadsOperands(node)) LOOM_RETURN_IF_ERROR(EncodeOperandMaps(node, narrow, a_stage_bytes, tile_n, out));
    if (narrow) continue;  // it stores C itself and has no partials
    const sched::NodeSchedule& lowered = schedule.nodes[i];
    if (lowered.split_k > 1) {
      LOOM_RETURN_IF_ERROR(internal::EncodeWorkspaceMap(
          workspace + lowered.workspace_offset, int64_t{lowered.n_blocks} * tile_n, lowered.m,
          int64_t{lowered.m_blocks} * KernelConfig::kBlockM, sched::PartialSlices(lowered),
          KernelConfig::kPanelBytes / 4, KernelConfig::kRowsPerConsumer, &out.partial_map));
    }
    if (lowered.reduce_parts > 1 && out.c_tma_cols < int64_t{lowered.n_blocks} * lowered.out_tile_n) {
      // The kernel stores a reduce part straight into C, never through TMA.
      return absl::InternalError(absl::StrFormat(
          "schedule: node %d \"%s\" is reduced in %d parts, but its last output tile reaches column %d, past "
          "C's %d TMA columns",
          i, node.name, lowered.reduce_parts, int64_t{lowered.n_blocks} * lowered.out_tile_n, out.c_tma_cols));
    }
    if (out.c_tma_cols > 0) {
      const uint32_t panel_cols = KernelConfig::kPanelBytes / static_cast<uint32_t>(node.c.element_size());
      TensorView aligned = node.c;
      aligned.cols = out.c_tma_cols;
      LOOM_RETURN_IF_ERROR(
          internal::EncodeTensorMap(aligned, panel_cols, KernelConfig::kRowsPerConsumer, &out.c_map));
    }
  }
  return nodes;
}

// The stage order a kernel's packed weights take (packed_layout.h): the
// narrow kernel's, or the tiled kernel's for tiles `tile_n` wide.
kernel::PackedLayout PackedLayoutFor(bool narrow, int tile_n) {
  return narrow ? NarrowConfig::Packed()
                : kernel::WithTiledConfig(tile_n, [](auto config) { return decltype(config)::Packed(); });
}

// The nodes whose B the plan reads packed (CompileOptions::pack_weights), in
// the layout of its kernel (the narrow one when `tiled` is null): those with
// jobs whose B no node writes; on the tiled kernel (`tiled`: its schedule)
// only those of at most KernelConfig::kMaxPackedRowBlocks row blocks, whose
// weights' stream bounds them (with more, the multiply does, and a copy
// would only cost memory). A B that an earlier node packed already (the same
// view of the same memory) is not copied again.
std::vector<Plan::Impl::PackedNode> PackedNodesOf(const GemmGraph& graph,
                                                  const std::vector<DataDependency>& dependencies,
                                                  const sched::Schedule* tiled) {
  const kernel::PackedLayout layout =
      PackedLayoutFor(/*narrow=*/tiled == nullptr, tiled == nullptr ? 0 : static_cast<int>(tiled->tile.n));
  std::vector<bool> b_written(graph.nodes().size(), false);
  for (const DataDependency& dependency : dependencies) {
    if (dependency.operand == Operand::kB) b_written[dependency.consumer] = true;
  }
  auto same_view = [](const TensorView& x, const TensorView& y) {
    return x.data == y.data && x.rows == y.rows && x.cols == y.cols && x.row_stride == y.row_stride;
  };
  std::vector<Plan::Impl::PackedNode> packed;
  int64_t offset = 0;
  for (int i = 0; i < graph.size(); ++i) {
    const GemmNode& node = graph.nodes()[i];
    if (b_written[i] || !LoadsOperands(node)) continue;
    if (tiled != nullptr && tiled->nodes[i].m_blocks > KernelConfig::kMaxPackedRowBlocks) continue;
    const int64_t bytes = layout.Bytes(node.n(), node.k());
    const auto earlier = std::find_if(packed.begin(), packed.end(), [&](const Plan::Impl::PackedNode& other) {
      return same_view(graph.nodes()[other.node].b, node.b);
    });
    if (earlier != packed.end()) {
      packed.push_back({i, earlier->offset, bytes, /*copies=*/false});
      continue;
    }
    packed.push_back({i, offset, bytes, /*copies=*/true});
    offset += bytes;
  }
  return packed;
}

// The narrow kernel's tagged handoffs (CompileOptions::tagged_handoff): in
// a plan on the mma.sync path (whose A slots are read by generic loads,
// which the A loader's own stores feed) with one consumer warpgroup (the
// plan then launches NarrowConfig::Instantiation::kTaggedHandoff), each
// node of at most kTaggedMaxRows rows whose bf16 A is written whole by its A
// producers: one whose C is exactly A, or several whose Cs are column slices
// of it that tile it (each from an even column, each but the last an even
// number of columns wide, so that no tagged word has two writers), all with
// jobs and all their 32-column tiles in one wave (at most `grid_ctas`). The
// copy is of A (rows of (K + 1) / 2 words), made once for all consumers of
// the same view; a producer writes one copy only, so a second consumer whose
// A is another view of the producer's C stays on flags.
// NOTE: a producer of several waves has finished most of its tiles long
// before its consumer waits for the last: the handoff's shorter hop saves
// nothing there and its polled words cost more than a TMA load of C. With
// the MLP block's gate/up (896 tiles) on tagged words, the block at 1 token
// took 80.8-80.9 us against 80.5-80.6 on flags (bench/NOTES.md v1.34); with
// this rule, at 1 / 2 tokens 79.3-79.5 / 79.7-79.8 against 79.5-79.8 /
// 80.6-80.9 before it (v1.35). Several producers: the 8-layer 4096 chain
// built as two nodes a layer took 82 us at one token on flags (v1.69).
std::vector<Plan::Impl::TaggedHandoff> TaggedHandoffsOf(const GemmGraph& graph,
                                                         const std::vector<DataDependency>& dependencies,
                                                         uint32_t a_stage_bytes, int consumers, int grid_ctas,
                                                         int64_t* words) {
  *words = 0;
  std::vector<Plan::Impl::TaggedHandoff> handoffs;
  if (NarrowConfig::MultiplyFor(NarrowConfig::ATileRows(a_stage_bytes)) != NarrowConfig::Multiply::kMmaSync ||
      consumers != 1) {
    return handoffs;
  }
  const int num_nodes = static_cast<int>(graph.nodes().size());
  std::vector<std::vector<const DataDependency*>> a_edges(num_nodes);
  for (const DataDependency& dependency : dependencies) {
    if (dependency.operand == Operand::kA) a_edges[dependency.consumer].push_back(&dependency);
  }
  struct Copy {
    const void* data;
    int64_t rows, cols, offset;
  };
  std::vector<Copy> copies;
  std::vector<int64_t> tagged_c(num_nodes, -1);  // the word each producer's copy starts at, once chosen
  for (int consumer_index = 0; consumer_index < num_nodes; ++consumer_index) {
    const GemmNode& consumer = graph.nodes()[consumer_index];
    const TensorView& a = consumer.a;
    if (a_edges[consumer_index].empty() || consumer.m() > NarrowConfig::kTaggedMaxRows || !HasJobs(consumer) ||
        a.dtype != DType::kBF16 || NarrowConfig::TaggedWordsPerRow(a.cols) > UINT16_MAX) {
      continue;  // (the pitch is KernelNode::tagged_c_pitch's 16 bits)
    }
    // The producers' slices (first column of A, producer), in column order.
    std::vector<std::pair<int64_t, int>> slices;
    int64_t tiles = 0;
    bool usable = true;
    for (const DataDependency* dependency : a_edges[consumer_index]) {
      const GemmNode& producer = graph.nodes()[dependency->producer];
      const TensorView& c = producer.c;
      const int64_t col0 = -dependency->col_offset;
      usable = !dependency->whole_tensor && dependency->row_offset == 0 && col0 >= 0 && col0 % 2 == 0 &&
               HasJobs(producer) && c.dtype == DType::kBF16 && c.rows == a.rows && c.row_stride == a.row_stride &&
               c.data == static_cast<const uint8_t*>(a.data) + col0 * static_cast<int64_t>(a.element_size());
      if (!usable) break;
      tiles += NarrowTiles(producer);
      slices.emplace_back(col0, dependency->producer);
    }
    if (!usable || tiles > grid_ctas) continue;
    std::sort(slices.begin(), slices.end());
    int64_t covered = 0;  // A's columns written, from 0
    for (size_t i = 0; i < slices.size() && usable; ++i) {
      const int64_t cols = graph.nodes()[slices[i].second].c.cols;
      usable = slices[i].first == covered && (i + 1 == slices.size() || cols % 2 == 0);
      covered += cols;
    }
    if (!usable || covered != a.cols) continue;
    // One copy a buffer, and one copy a producer.
    auto copy = std::find_if(copies.begin(), copies.end(), [&](const Copy& c) { return c.data == a.data; });
    if (copy != copies.end() && (copy->rows != a.rows || copy->cols != a.cols)) continue;
    const int64_t offset = copy != copies.end() ? copy->offset : *words;
    for (const auto& [col0, producer] : slices) {
      if (tagged_c[producer] >= 0 && tagged_c[producer] != offset + col0 / 2) usable = false;
    }
    if (!usable) continue;
    const int64_t pitch = NarrowConfig::TaggedWordsPerRow(a.cols);
    if (copy == copies.end()) {
      copies.push_back({a.data, a.rows, a.cols, offset});
      *words += a.rows * pitch;
    }
    for (const auto& [col0, producer] : slices) {
      tagged_c[producer] = offset + col0 / 2;
      handoffs.push_back({producer, consumer_index, offset, pitch, col0});
    }
  }
  return handoffs;
}

// Bytes of the packed copies (each B once).
int64_t PackedCopyBytes(const std::vector<Plan::Impl::PackedNode>& packed_nodes) {
  int64_t bytes = 0;
  for (const Plan::Impl::PackedNode& packed : packed_nodes) bytes += packed.copies ? packed.bytes : 0;
  return bytes;
}

// Enqueues the copy of every packed B on `stream`.
absl::Status PackWeights(const Plan::Impl& impl, cudaStream_t stream) {
  for (const Plan::Impl::PackedNode& packed : impl.packed_nodes) {
    if (!packed.copies) continue;
    const TensorView& b = impl.graph.nodes()[packed.node].b;
    LOOM_RETURN_IF_ERROR(internal::CudaStatus(
        kernel::PackWeights(b.data, b.rows, b.cols, b.row_stride, PackedLayoutFor(impl.narrow, impl.tile_n),
                            impl.packed_weights + packed.offset, stream),
        absl::StrCat("packing the weights ", b.name)));
  }
  return absl::OkStatus();
}

// The clusters the tiled kernel's first wave leaves without a job that can
// start (0 on the narrow kernel). Above 0, the kernel spreads its first
// fetches over the chip (KernelConfig::kFirstFetchSpreadCycles).
int32_t IdleClustersToSpread(const Plan::Impl& impl) {
  return impl.narrow ? 0 : sched::IdleClustersAtLaunch(impl.schedule, impl.grid_clusters);
}

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

// cudaMalloc of `bytes` for `what`: ResourceExhausted naming it where the
// device's free memory is too small (that error is not sticky: cleared, so
// that the caller's next cudaGetLastError does not report it).
absl::Status AllocateOrExhausted(void** pointer, size_t bytes, int device, const std::string& what) {
  const cudaError_t allocated = CountedMalloc(pointer, bytes);
  if (allocated == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s, %d bytes, does not fit in device %d's free memory", what, bytes, device));
  }
  return internal::CudaStatus(allocated, absl::StrCat("cudaMalloc of ", what));
}

// Needs the plan's device current (Compile makes it so).
absl::Status AllocateDeviceResources(Plan::Impl& impl) {
  OwnStream setup;
  LOOM_RETURN_IF_ERROR(setup.Create());
  if (impl.schedule.workspace_elements > 0) {
    const size_t workspace_bytes = static_cast<size_t>(impl.schedule.workspace_elements) * sizeof(float);
    LOOM_RETURN_IF_ERROR(AllocateOrExhausted(
        reinterpret_cast<void**>(&impl.workspace), workspace_bytes, impl.device_ordinal,
        absl::StrFormat("the split-K partials' workspace (CompileOptions.split_k = %d; 0: the scheduler's choice)",
                        impl.options.split_k)));
    // NaN everywhere (0xFFFFFFFF): a partial the split jobs' TMA stores failed
    // to write would turn the reduce's output into NaN instead of reading
    // whatever fresh memory held (often zeros, which would go unnoticed). On
    // the first launch only: a few-row sum then drops the lines it read from
    // L2 (DiscardWarpPartials), leaving their contents undefined, so on later
    // launches a missing partial reads whatever is there (FreshPartialsTest
    // gives each launch new activations to catch that).
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(impl.workspace, 0xFF, workspace_bytes, setup.get()));
  }
  LOOM_ASSIGN_OR_RETURN(std::vector<kernel::KernelNode> nodes,
                        KernelNodesOf(impl.graph, impl.schedule, impl.workspace, impl.narrow, impl.a_stage_bytes,
                                      impl.tile_n));
  if (!impl.packed_nodes.empty()) {
    LOOM_RETURN_IF_ERROR(AllocateOrExhausted(reinterpret_cast<void**>(&impl.packed_weights),
                                             PackedCopyBytes(impl.packed_nodes), impl.device_ordinal,
                                             "the packed weights' copy (CompileOptions.pack_weights)"));
  }
  // After the allocations (what does not fit is ResourceExhausted whatever
  // the views hold) and before anything reads or writes a view: the pack
  // below, the first launch.
  LOOM_RETURN_IF_ERROR(internal::CheckViewsAreReachable(impl.graph, impl.device_ordinal));
  if (!impl.packed_nodes.empty()) {
    // On the legacy stream, so that the copy reads B after what the caller's
    // blocking streams wrote into it before Compile. Made before Compile
    // returns, so a launch on any stream (non-blocking ones too) reads B as
    // it was at Compile.
    LOOM_RETURN_IF_ERROR(PackWeights(impl, nullptr));
    LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(nullptr));
    for (const Plan::Impl::PackedNode& packed : impl.packed_nodes) {
      nodes[packed.node].packed_b = impl.packed_weights + packed.offset;
    }
  }
  if (impl.tagged_words > 0) {
    // Zero tags: no launch's epoch (epochs start at 1).
    const size_t bytes = static_cast<size_t>(impl.tagged_words) * sizeof(uint64_t);
    LOOM_CUDA_RETURN_IF_ERROR(CountedMalloc(&impl.tagged_copies, bytes));
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(impl.tagged_copies, 0, bytes, setup.get()));
    for (const Plan::Impl::TaggedHandoff& handoff : impl.tagged_handoffs) {
      nodes[handoff.producer].tagged_c = impl.tagged_copies + handoff.offset + handoff.col0 / 2;
      nodes[handoff.producer].tagged_c_pitch = static_cast<uint16_t>(handoff.pitch);
      nodes[handoff.consumer].tagged_a = impl.tagged_copies + handoff.offset;
    }
  }
  LOOM_RETURN_IF_ERROR(Upload(nodes, &impl.nodes, setup.get()));
  LOOM_RETURN_IF_ERROR(Upload(impl.schedule.queue, &impl.queue, setup.get()));
  LOOM_RETURN_IF_ERROR(Upload(impl.schedule.dependencies, &impl.dependencies, setup.get()));
  // Rounded up to whole 16-byte words: the A loader polls flags four at a time.
  const size_t flag_count = (std::max<int64_t>(impl.schedule.num_flags, 1) + 3) / 4 * 4;
  LOOM_CUDA_RETURN_IF_ERROR(CountedMalloc(&impl.flags, flag_count * sizeof(uint32_t)));
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(impl.flags, 0, flag_count * sizeof(uint32_t), setup.get()));
  LOOM_CUDA_RETURN_IF_ERROR(CountedMalloc(&impl.state, sizeof(kernel::LaunchState)));
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(impl.state, 0, sizeof(kernel::LaunchState), setup.get()));
  LOOM_CUDA_RETURN_IF_ERROR(
      CountedHostAlloc(&impl.timeout_host, sizeof(kernel::DeviceTimeoutRecord), cudaHostAllocMapped));
  std::memset(impl.timeout_host, 0, sizeof(kernel::DeviceTimeoutRecord));
  kernel::DeviceTimeoutRecord* timeout_device = nullptr;
  LOOM_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(reinterpret_cast<void**>(&timeout_device), impl.timeout_host, 0));

  kernel::KernelParams& params = impl.params;
  params.nodes = impl.nodes;
  params.queue = impl.queue;
  params.dependencies = impl.dependencies;
  params.num_jobs = static_cast<int32_t>(impl.schedule.queue.size());
  params.num_nodes = static_cast<int32_t>(impl.graph.size());
  params.cluster_size = impl.schedule.cluster_size;
  params.a_stages = impl.a_stages;
  params.b_stages = impl.b_stages;
  params.b_in_flight = impl.b_in_flight;
  params.a_stage_bytes = impl.a_stage_bytes;
  params.block_m = impl.schedule.tile.m;
  params.lockstep = impl.options.ring_mode == RingMode::kLockstep ? 1 : 0;
  params.first_fetch_spread_cycles =
      IdleClustersToSpread(impl) > 0 ? kernel::KernelConfig::kFirstFetchSpreadCycles : 0;
  impl.has_split_k = false;
  for (const sched::NodeSchedule& node : impl.schedule.nodes) impl.has_split_k |= node.split_k > 1;
  params.flags = impl.flags;
  params.workspace = impl.workspace;
  params.state = impl.state;
  params.timeout = timeout_device;
  params.spin_timeout_ns = static_cast<uint64_t>(impl.options.spin_timeout_ns);
  if (impl.options.trace) {
    const size_t bytes = impl.schedule.queue.size() * impl.schedule.cluster_size * sizeof(kernel::DeviceJobTrace);
    LOOM_CUDA_RETURN_IF_ERROR(CountedMalloc(&impl.trace, bytes));
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(impl.trace, 0, bytes, setup.get()));
  }
  params.trace = impl.trace;
  // `nodes` (copied from pageable memory) lives until here, and every buffer
  // above is set before the plan is returned.
  return setup.Wait();
}

}  // namespace

bool AbslParseFlag(absl::string_view text, KernelChoice* choice, std::string* error) {
  for (KernelChoice candidate : {KernelChoice::kAuto, KernelChoice::kTiled, KernelChoice::kNarrow}) {
    if (text == AbslUnparseFlag(candidate)) {
      *choice = candidate;
      return true;
    }
  }
  *error = absl::StrFormat("the kernel must be auto, tiled or narrow, got '%s'", text);
  return false;
}

std::string AbslUnparseFlag(KernelChoice choice) {
  switch (choice) {
    case KernelChoice::kTiled:
      return "tiled";
    case KernelChoice::kNarrow:
      return "narrow";
    case KernelChoice::kAuto:
      break;
  }
  return "auto";
}

DeviceDescription DeviceDescription::H200() {
  DeviceDescription device;
  device.name = "NVIDIA H200 (described)";
  device.sm_count = 132;
  device.shared_memory_per_block = 232448;
  device.l2_bytes = 60 * 1024 * 1024;
  device.cluster_launch = true;
  device.max_coresident_clusters = 66;
  return device;
}

absl::StatusOr<Runtime> Runtime::Create(int device_ordinal) {
  int count = 0;
  if (cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no CUDA GPU available (%s)", error == cudaSuccess ? "0 devices" : cudaGetErrorString(error)));
  }
  if (device_ordinal < 0 || device_ordinal >= count) {
    return absl::FailedPreconditionError(
        absl::StrFormat("device ordinal %d: only %d CUDA devices", device_ordinal, count));
  }
  cudaDeviceProp properties;
  LOOM_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&properties, device_ordinal));
  if (properties.major != 9) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "device %d (%s) is sm_%d%d; loom's kernel needs Hopper (sm_90)", device_ordinal, properties.name,
        properties.major, properties.minor));
  }
  DeviceDescription device;
  device.name = properties.name;
  device.sm_count = properties.multiProcessorCount;
  device.shared_memory_per_block = static_cast<int64_t>(properties.sharedMemPerBlockOptin);
  device.l2_bytes = properties.l2CacheSize;
  int cluster_launch = 0;
  LOOM_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&cluster_launch, cudaDevAttrClusterLaunch, device_ordinal));
  device.cluster_launch = cluster_launch != 0;
  return Runtime(std::move(device), device_ordinal);
}

Runtime Runtime::ForDescription(DeviceDescription device) { return Runtime(std::move(device), -1); }

absl::StatusOr<Plan> Runtime::Compile(const GemmGraph& graph, const CompileOptions& options) const {
  // Before Validate, whose checks across nodes take time quadratic in their
  // number (minutes at this limit).
  if (graph.size() > sched::kMaxNodes) {
    return absl::InvalidArgumentError(absl::StrFormat("graph: %d nodes exceed %d, the most a plan holds",
                                                      graph.size(), sched::kMaxNodes));
  }
  LOOM_RETURN_IF_ERROR(graph.Validate());
  LOOM_RETURN_IF_ERROR(CheckOptions(options));
  LOOM_RETURN_IF_ERROR(CheckDevice(device_));
  auto impl = std::make_unique<Plan::Impl>();
  const int64_t rows = MaxRows(graph);
  const std::vector<DataDependency> dependencies = graph.Dependencies();
  const std::vector<sched::NodeProblem> problems = ProblemsOf(graph, dependencies);
  const std::vector<int32_t> depth = sched::NodeDepths(problems);  // the graph's steps, for both rules below
  LOOM_ASSIGN_OR_RETURN(const DType half, HalfTypeOf(graph));
  impl->half = ElementTypeOf(half);
  impl->narrow = UsesNarrowKernel(options, graph, dependencies, depth, rows, device_.sm_count);
  if (const GemmNode* zero_k = FirstZeroKNode(graph); impl->narrow && zero_k != nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CompileOptions.kernel: kNarrow, but %s has K = 0 (its jobs are its epilogue alone), which only "
        "the tiled kernel runs; use kAuto or kTiled",
        graph.NodeLabel(static_cast<int>(zero_k - graph.nodes().data()))));
  }
  int cluster_size = kClusterSize;
  int coresident = 0;  // clusters (CTAs for the narrow kernel)
  int64_t smem_bytes = 0;  // a CTA's
  std::optional<RestoreCurrentDevice> restore;
  if (has_gpu()) {
    restore.emplace();
    LOOM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_ordinal_));
  }
  if (impl->narrow) {
    if (options.pack_weights) {
      impl->packed_nodes = PackedNodesOf(graph, dependencies, /*tiled=*/nullptr);
    }
    LOOM_ASSIGN_OR_RETURN(const NarrowRings rings,
                          ChooseNarrowRings(options, device_, rows, MaxK(graph),
                                            IsChainOfOneWaveLayers(graph, dependencies, device_.sm_count),
                                            !impl->packed_nodes.empty()));
    impl->a_stages = rings.a_stages;
    impl->b_stages = rings.b_stages;
    impl->b_in_flight = rings.b_in_flight;
    impl->narrow_consumers = rings.consumers;
    impl->a_stage_bytes = rings.a_stage_bytes;
    cluster_size = 1;
    smem_bytes = rings.smem_bytes;
    coresident = device_.sm_count;
    if (has_gpu()) {
      LOOM_CUDA_RETURN_IF_ERROR(kernel::MaxCoresidentNarrowCtas(rings.smem_bytes, rings.consumers, &coresident));
    }
  } else {
    if (!device_.cluster_launch) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s cannot launch clusters, and the tiled kernel runs in clusters of %d CTAs (the narrow decode kernel, "
          "for graphs of at most %d rows, needs none)",
          device_.name, kClusterSize, NarrowConfig::kMaxRows));
    }
    if (options.ring_mode == RingMode::kLockstep) {
      LOOM_RETURN_IF_ERROR(CheckLockstepReadsNoProducedB(graph, dependencies));
    }
    impl->a_stage_bytes = AStageBytesFor(graph);
    impl->tile_n = ChooseTileWidth(options, problems, depth,
                                   options.max_clusters > 0 ? int64_t{options.max_clusters} * kClusterSize
                                                            : device_.sm_count);
    std::tie(impl->a_stages, impl->b_stages) =
        ChooseTiledRings(options, device_, impl->a_stage_bytes, impl->tile_n);
    LOOM_ASSIGN_OR_RETURN(smem_bytes, TiledSharedMemory(impl->a_stages, impl->b_stages, device_,
                                                        impl->a_stage_bytes, impl->tile_n));
    coresident = device_.max_coresident_clusters > 0 ? device_.max_coresident_clusters
                                                     : device_.sm_count / kClusterSize;
    if (has_gpu()) {
      LOOM_CUDA_RETURN_IF_ERROR(kernel::MaxCoresidentClusters(impl->a_stages, impl->b_stages,
                                                              impl->a_stage_bytes, kClusterSize, impl->tile_n,
                                                              impl->half, &coresident));
    }
  }
  if (!impl->narrow && device_.sm_count < kClusterSize) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: sm_count %d, but the tiled kernel runs in clusters of %d CTAs, one an SM (the narrow decode kernel, "
        "for graphs of at most %d rows, needs one SM)",
        device_.name, device_.sm_count, kClusterSize, NarrowConfig::kMaxRows));
  }
  if (coresident < 1) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: not even one %s with %d bytes of shared memory fits", device_.name,
        impl->narrow ? std::string("CTA of the narrow decode kernel")
                     : absl::StrFormat("cluster of %d CTAs", kClusterSize),
        smem_bytes));
  }
  if (options.max_clusters > coresident) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "grid: max_clusters %d exceeds the %d %s that can be co-resident on %s (a spin-waiting CTA "
        "must never keep a producer from running)",
        options.max_clusters, coresident, impl->narrow ? "CTAs of the narrow decode kernel" : "clusters",
        device_.name));
  }

  impl->graph = graph;
  impl->options = options;
  impl->device = device_;
  impl->device_ordinal = device_ordinal_;
  impl->grid_clusters = options.max_clusters > 0 ? options.max_clusters : coresident;
  if (impl->narrow && options.tagged_handoff) {
    impl->tagged_handoffs = TaggedHandoffsOf(graph, dependencies, impl->a_stage_bytes, impl->narrow_consumers,
                                             impl->grid_clusters, &impl->tagged_words);
  }

  sched::SchedulerOptions scheduler_options;
  scheduler_options.tile = impl->narrow ? NarrowConfig::tile(rows) : TiledTile(impl->tile_n);
  scheduler_options.cluster_size = cluster_size;
  scheduler_options.num_sms = device_.sm_count;
  scheduler_options.max_clusters = impl->grid_clusters;
  scheduler_options.split_k = impl->narrow ? 1 : options.split_k;
  scheduler_options.group_size = options.group_size;
  scheduler_options.reduce_in_parts = options.reduce_in_parts;
  scheduler_options.reduce_part_rows = options.reduce_part_rows;
  scheduler_options.sum_in_last_split = options.sum_in_last_split;
  scheduler_options.last_split_extra_k_blocks = options.last_split_extra_k_blocks;
  scheduler_options.name = "CompileOptions";  // Lower's option errors name the caller's options
  LOOM_ASSIGN_OR_RETURN(impl->schedule, sched::Lower(problems, scheduler_options));
  if (!impl->narrow && options.pack_weights && TiledRingsReadPackedWeights(options)) {
    impl->packed_nodes = PackedNodesOf(graph, dependencies, &impl->schedule);
  }

  if (has_gpu() && !impl->schedule.queue.empty()) LOOM_RETURN_IF_ERROR(AllocateDeviceResources(*impl));
  return Plan(std::move(impl));
}

Plan::Impl::~Impl() {
  // Freed on the plan's device, which need not be the caller's current one
  // (a plan may be destroyed on any thread, with any device current).
  std::optional<RestoreCurrentDevice> restore;
  if (device_ordinal >= 0) {
    restore.emplace();
    cudaSetDevice(device_ordinal);
  }
  CountedFree(nodes);
  CountedFree(queue);
  CountedFree(dependencies);
  CountedFree(flags);
  CountedFree(workspace);
  CountedFree(state);
  CountedFree(trace);
  CountedFree(packed_weights);
  CountedFree(tagged_copies);
  CountedFreeHost(timeout_host);
}

namespace internal {

kernel::KernelNode::AProducer AProducerOf(const sched::Schedule& schedule, int node_index) {
  const sched::NodeSchedule& node = schedule.nodes[node_index];
  const sched::DependencyEdge* a_edge = nullptr;
  for (int d = 0; d < node.dependency_count; ++d) {
    const sched::DependencyEdge& edge = schedule.dependencies[node.dependency_begin + d];
    if (edge.operand != static_cast<uint8_t>(sched::DependencyOperand::kA)) continue;
    if (a_edge != nullptr) return {};
    a_edge = &edge;
  }
  if (a_edge == nullptr || a_edge->whole_tensor) return {};
  const sched::NodeSchedule& producer = schedule.nodes[a_edge->producer];
  kernel::KernelNode::AProducer copy;
  copy.row_offset = a_edge->row_offset;
  copy.col_offset = a_edge->col_offset;
  copy.m = producer.m;
  copy.out_cols = producer.out_cols;
  copy.flag_base = producer.flag_base;
  copy.flag_row_stride = producer.flag_row_stride;
  copy.n_blocks = producer.n_blocks;
  copy.out_tile_n = producer.out_tile_n;
  return copy;
}

namespace {
// The run of A's producer flags from k-block 0 that a kernel's AProducerRun
// (kBlockK, kMaxTilesPerGranule: its Config's) would find for row block `mb`
// of a job spanning the node's K: from the one-edge copy, or else from the
// edges themselves (A joining several nodes' outputs: the run of the edge
// k-block 0 reads, joined with the next edges' while their flags follow on).
template <int kBlockK, int kMaxTilesPerGranule>
sched::AFlagRun FirstARunOfRowBlock(const sched::Schedule& schedule, const sched::NodeSchedule& node,
                                    const kernel::KernelNode::AProducer& copy, int mb) {
  // A has no producer tile boundary to wait on (AWaitKBlocks), or its
  // producers' tiles do not make sound runs (AFlagRunsAllowed): no run.
  if (node.k_blocks == 0 || node.a_wait_k_blocks > INT32_MAX / kBlockK || !node.a_flag_runs) return {};
  const int64_t row0 = int64_t{mb} * schedule.tile.m;
  if (copy.out_tile_n != 0) {
    return kernel::ARunOfCopy<kBlockK, kMaxTilesPerGranule>(copy, node.a_wait_k_blocks, schedule.tile.m, row0, 0,
                                                            node.k_blocks);
  }
  auto edge_run_at = [&](int kb) {
    return kernel::ARunOfEdges<kBlockK, kMaxTilesPerGranule>(
        node, schedule.dependencies.data(),
        [&](int producer) -> const sched::NodeSchedule& { return schedule.nodes[producer]; }, schedule.tile, row0,
        kb, node.k_blocks);
  };
  sched::AFlagRun run = edge_run_at(0);
  // Where the run ends at its producer's last tile and the next edge's goes
  // on with the very next flags (the producers of one A, whose flags Lower
  // lays out together row block by row block: FlagGroupsOf), one run: the A
  // loader's first poll then covers both, and it does not stop at the seam
  // to work out the next edge's run (the device joins none: it cost the
  // narrow kernel 4-8 bytes of spills). Each edge's run reaches its
  // producer's end, so one more run an edge at most.
  for (int d = 1; d < node.dependency_count && run.granules > 0; ++d) {
    const int next_kb = run.granules * node.a_wait_k_blocks;
    if (next_kb >= node.k_blocks) break;
    const sched::AFlagRun next = edge_run_at(next_kb);
    if (next.granules == 0 || next.tiles_shift != run.tiles_shift ||
        next.first_flag != run.first_flag + run.granules * run.tiles_per_granule) {
      break;
    }
    run.granules += next.granules;
  }
  return run;
}

// Whether `run` is one and fits KernelNode::FirstARun; if so, stored in
// `out` (else `out` is left as it was).
bool StoreFirstARun(const sched::AFlagRun& run, kernel::KernelNode::FirstARun& out) {
  if (run.granules <= 0 || run.granules > UINT16_MAX) return false;
  out.first_flag = run.first_flag;
  out.granules = static_cast<uint16_t>(run.granules);
  out.tiles_shift = static_cast<uint8_t>(run.tiles_shift);
  return true;
}
}  // namespace

void FirstARunsOf(const sched::Schedule& schedule, int node_index, const kernel::KernelNode::AProducer& copy,
                  bool narrow, kernel::KernelNode::FirstARun (&runs)[2]) {
  const sched::NodeSchedule& node = schedule.nodes[node_index];
  runs[0] = runs[1] = {};
  if (narrow) {
    for (int mb = 0; mb < 2 && mb < node.m_blocks; ++mb) {
      StoreFirstARun(
          FirstARunOfRowBlock<NarrowConfig::kBlockK, NarrowConfig::kMaxTilesPerGranule>(schedule, node, copy, mb),
          runs[mb]);
    }
    return;
  }
  // The tiled kernel: row block r's run is row block 0's moved on by r times
  // the flags from row block 0's to row block 1's, so every row block's run
  // must be that (the same granules, its first flag a whole step on).
  auto run_of = [&](int mb) {
    return FirstARunOfRowBlock<KernelConfig::kBlockK, KernelConfig::kMaxTilesPerGranule>(schedule, node, copy, mb);
  };
  if (node.m_blocks == 0) return;
  const sched::AFlagRun first = run_of(0);
  if (first.granules <= 0) return;
  sched::AFlagRun second;  // row block 1's, where there is one
  for (int mb = 1; mb < node.m_blocks; ++mb) {
    const sched::AFlagRun run = run_of(mb);
    if (mb == 1) second = run;
    if (run.granules != first.granules || run.tiles_shift != first.tiles_shift ||
        int64_t{run.first_flag} - first.first_flag != mb * (int64_t{second.first_flag} - first.first_flag)) {
      return;
    }
  }
  // The same granules: both fit, or neither.
  if (StoreFirstARun(first, runs[0]) && node.m_blocks > 1) StoreFirstARun(second, runs[1]);
}

const char* WaitKindName(int32_t kind) {
  switch (static_cast<kernel::WaitKind>(kind)) {
    case kernel::WaitKind::kDependencyFlag:
      return "dependency flag";
    case kernel::WaitKind::kHeldJobInputs:
      return "its inputs, held back by the scheduler";
    case kernel::WaitKind::kFirstFetches:
      return "every cluster's first fetch, before the scheduler's second";
    case kernel::WaitKind::kNoKernelPath:
      return "nothing: the launched kernel has no path for the job";
    default:
      return "unknown wait";
  }
}

absl::Status DeviceFailureStatus(int32_t kind, const TimeoutRecord& record, absl::string_view job,
                                 int64_t spin_timeout_ns) {
  if (kind == static_cast<int32_t>(kernel::WaitKind::kNoKernelPath)) {
    return absl::InternalError(absl::StrFormat(
        "the launched kernel has no path for job %s (SM %d): a loom bug; the launch's results are not valid",
        job, record.sm));
  }
  const uint64_t limit_ns =
      kernel::WaitLimitNs(static_cast<kernel::WaitKind>(kind), static_cast<uint64_t>(spin_timeout_ns));
  return absl::DeadlineExceededError(absl::StrFormat(
      "device wait timed out after %d ns: SM %d, job %s waited on %s, flag %d, expected epoch %u, saw %u",
      limit_ns, record.sm, job, record.what, record.flag, record.expected, record.seen));
}

absl::Status MovedFromPlan(absl::string_view method) {
  return absl::FailedPreconditionError(
      absl::StrCat("Plan::", method, ": this Plan was moved from (a moved-from Plan can only be assigned to)"));
}

absl::Status CheckCurrentDevice(absl::string_view method, int plan_device, int current_device) {
  if (current_device == plan_device) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "Plan::%s: the current CUDA device is %d, but this plan was compiled for device %d "
      "(call cudaSetDevice(%d) first)",
      method, current_device, plan_device, plan_device));
}
}  // namespace internal

namespace {
// internal::CheckCurrentDevice for the calling thread's current device.
absl::Status CheckPlanDeviceIsCurrent(absl::string_view method, const Plan::Impl& impl) {
  int current = -1;
  LOOM_CUDA_RETURN_IF_ERROR(cudaGetDevice(&current));
  return internal::CheckCurrentDevice(method, impl.device_ordinal, current);
}

// A launch's result. Where it failed on a stream of another device than the
// plan's (CUDA launches only onto the current device's streams), that is
// said by name rather than as the launch's generic error, which is cleared:
// asked only after a failure, so launches that succeed pay nothing for it.
absl::Status LaunchStatus(cudaError_t launched, std::string_view what, const Plan::Impl& impl,
                          cudaStream_t stream) {
  if (launched == cudaSuccess) return absl::OkStatus();
  int stream_device = -1;
  if (stream != nullptr && stream != cudaStreamLegacy && stream != cudaStreamPerThread &&
      cudaStreamGetDevice(stream, &stream_device) == cudaSuccess && stream_device != impl.device_ordinal) {
    cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrFormat(
        "Plan::Launch: the stream belongs to device %d, and this plan was compiled for device %d (%s); launch "
        "it on a stream of device %d",
        stream_device, impl.device_ordinal, cudaGetErrorName(launched), impl.device_ordinal));
  }
  return internal::CudaStatus(launched, what);
}
}  // namespace

Plan::Plan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Plan::Plan(Plan&&) noexcept = default;
Plan& Plan::operator=(Plan&&) noexcept = default;
Plan::~Plan() = default;

absl::Status Plan::Launch(cudaStream_t stream) {
  if (impl_ == nullptr) return internal::MovedFromPlan("Launch");
  if (impl_->device_ordinal < 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "Plan::Launch: this plan was compiled for %s without a GPU (Runtime::ForDescription); it can be "
        "explained or run by the CPU reference, not launched",
        impl_->device.name));
  }
  LOOM_RETURN_IF_ERROR(CheckPlanDeviceIsCurrent("Launch", *impl_));
  if (impl_->schedule.queue.empty()) return absl::OkStatus();  // zero-size graph: nothing to do
  // Over a RepackWeights just before too: its packs end with an empty kernel
  // that starts only once they have completed (OrderAfterPacking), and the
  // narrow kernel, which streams packed weights in before the kernel before
  // it has ended, overlaps that one.
  const bool overlap = impl_->options.overlap_launches;
  if (impl_->narrow) {
    return LaunchStatus(kernel::LaunchNarrowGemm(impl_->params, impl_->grid_clusters, impl_->packed_weights != nullptr,
                                                 impl_->narrow_consumers, !impl_->tagged_handoffs.empty(),
                                                 impl_->half, overlap, stream),
                        "launching the narrow decode kernel", *impl_, stream);
  }
  return LaunchStatus(kernel::LaunchPersistentGemm(impl_->params, impl_->grid_clusters, impl_->tile_n, impl_->half,
                                                   impl_->has_split_k, overlap, stream),
                      "launching the persistent kernel", *impl_, stream);
}

absl::Status Plan::Synchronize(cudaStream_t stream) {
  if (impl_ == nullptr) return internal::MovedFromPlan("Synchronize");
  if (impl_->device_ordinal < 0) {
    return absl::FailedPreconditionError("Plan::Synchronize: host-only plan");
  }
  LOOM_RETURN_IF_ERROR(CheckPlanDeviceIsCurrent("Synchronize", *impl_));
  LOOM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  if (impl_->timeout_host == nullptr) return absl::OkStatus();
  volatile kernel::DeviceTimeoutRecord* record = impl_->timeout_host;
  if (record->timed_out == 0) return absl::OkStatus();
  TimeoutRecord timeout;
  timeout.sm = record->sm;
  timeout.job = record->job;
  timeout.flag = record->flag;
  timeout.expected = record->expected;
  timeout.seen = record->seen;
  const int32_t record_kind = record->wait_kind;
  timeout.what = internal::WaitKindName(record_kind);
  impl_->last_timeout = timeout;
  std::memset(impl_->timeout_host, 0, sizeof(kernel::DeviceTimeoutRecord));
  // The kernel leaves the abort flag set (FinishFetching, cta_context.cuh):
  // cleared here, once the stream has drained, the plan runs again.
  {
    OwnStream reset;
    LOOM_RETURN_IF_ERROR(reset.Create());
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(&impl_->state->abort, 0, sizeof(impl_->state->abort), reset.get()));
    LOOM_RETURN_IF_ERROR(reset.Wait());
  }
  std::string job = "?";
  if (timeout.job >= 0 && timeout.job < static_cast<int>(impl_->schedule.queue.size())) {
    const sched::TileJob& tile_job = impl_->schedule.queue[timeout.job];
    job = absl::StrFormat("%d (%s, m-block %d, n-block %d)", timeout.job, impl_->graph.NodeLabel(tile_job.node),
                          tile_job.m_block, tile_job.n_block);
  } else if (timeout.job >= 0) {
    job = absl::StrCat(timeout.job);
  }
  return internal::DeviceFailureStatus(record_kind, timeout, job, impl_->options.spin_timeout_ns);
}

absl::Status Plan::RepackWeights(cudaStream_t stream) {
  if (impl_ == nullptr) return internal::MovedFromPlan("RepackWeights");
  if (impl_->device_ordinal < 0) {
    return absl::FailedPreconditionError("Plan::RepackWeights: host-only plan");
  }
  if (impl_->packed_weights == nullptr) return absl::OkStatus();
  // Refused rather than switched to: `stream` belongs to the current device,
  // and the caller's current device is the caller's (Launch does the same).
  LOOM_RETURN_IF_ERROR(CheckPlanDeviceIsCurrent("RepackWeights", *impl_));
  LOOM_RETURN_IF_ERROR(PackWeights(*impl_, stream));
  // Not a host flag that the next Launch reads (a failed or captured launch
  // in between consumed it, and the launch after overlapped the packs).
  return internal::CudaStatus(kernel::OrderAfterPacking(stream), "ordering launches after the packed weights");
}

std::optional<TimeoutRecord> Plan::last_timeout() const {
  return impl_ == nullptr ? std::nullopt : impl_->last_timeout;
}

namespace {

// Explain's line on how the narrow kernel multiplies A tiles of `tile_rows`
// rows (NarrowConfig::MultiplyFor).
std::string ExplainNarrowMultiply(uint32_t tile_rows) {
  switch (NarrowConfig::MultiplyFor(tile_rows)) {
    case NarrowConfig::Multiply::kMmaSync:
      return absl::StrFormat(
          "multiply: mma.sync m16n8k16, the weights as the 16-row operand, the tokens (A tiles of %d rows) as the "
          "8-column one\n",
          tile_rows);
    case NarrowConfig::Multiply::kPairedWgmma:
      return absl::StrFormat(
          "multiply: wgmma m64n64k16 over two k-blocks at once (the tokens of both, A tiles of %d rows, as the 64 "
          "rows; the weights of both as the 64 columns)\n",
          tile_rows);
    case NarrowConfig::Multiply::kWgmma:
      return absl::StrFormat("multiply: wgmma m64n32k16, the tokens (A tiles of %d rows) as the 64 rows\n",
                             tile_rows);
  }
  return "";
}

// Explain's account of CompileOptions::pack_weights (empty when not asked).
std::string ExplainPackedWeights(const Plan::Impl& impl) {
  if (!impl.options.pack_weights) return "";
  if (!impl.narrow && !TiledRingsReadPackedWeights(impl.options)) {
    return "weights: read in place (the tiled kernel reads packed weights with split rings only)\n";
  }
  if (impl.packed_nodes.empty()) {
    return impl.narrow ? "weights: read in place (every node's B is written by another node)\n"
                       : absl::StrFormat("weights: read in place (the tiled kernel packs the B of nodes of at "
                                         "most %d rows that no node writes; there are none)\n",
                                         KernelConfig::kMaxPackedRowBlocks * KernelConfig::kBlockM);
  }
  std::vector<std::string> names;
  for (const Plan::Impl::PackedNode& packed : impl.packed_nodes) {
    names.push_back(impl.graph.nodes()[packed.node].name);
  }
  return absl::StrFormat("weights: packed in stage order, a copy of %.1f MiB made at Compile, for %s\n",
                         static_cast<double>(PackedCopyBytes(impl.packed_nodes)) / (1 << 20),
                         absl::StrJoin(names, ", "));
}

// Explain's account of the tagged handoffs (CompileOptions::tagged_handoff;
// empty when there are none).
std::string ExplainTaggedHandoffs(const Plan::Impl& impl) {
  if (impl.tagged_handoffs.empty()) return "";
  std::vector<std::string> pairs;
  for (const Plan::Impl::TaggedHandoff& handoff : impl.tagged_handoffs) {
    pairs.push_back(absl::StrCat(impl.graph.nodes()[handoff.producer].name, " -> ",
                                 impl.graph.nodes()[handoff.consumer].name));
  }
  return absl::StrFormat("tagged handoffs (A polled as tagged words, %.1f KiB of copies): %s\n",
                         static_cast<double>(impl.tagged_words * sizeof(uint64_t)) / 1024,
                         absl::StrJoin(pairs, ", "));
}

}  // namespace

std::string Plan::Explain() const {
  if (impl_ == nullptr) return "a moved-from loom::Plan\n";
  std::vector<std::string> names;
  for (const GemmNode& node : impl_->graph.nodes()) names.push_back(node.name);
  if (impl_->narrow) {
    return absl::StrFormat(
               "device: %s, narrow decode kernel (%d x %d tiles over the whole of K), %d CTAs of %d consumer "
               "warpgroup%s, rings: A %d stages of %d bytes, B %d stages of %d bytes (%d in flight)\n",
               impl_->device.name, impl_->schedule.tile.m, NarrowConfig::kBlockN, impl_->grid_clusters,
               impl_->narrow_consumers, impl_->narrow_consumers == 1 ? "" : "s", impl_->a_stages,
               impl_->a_stage_bytes, impl_->b_stages, NarrowConfig::kBStageBytes, impl_->b_in_flight) +
           ExplainNarrowMultiply(NarrowConfig::ATileRows(impl_->a_stage_bytes)) + ExplainPackedWeights(*impl_) +
           ExplainTaggedHandoffs(*impl_) + sched::ExplainSchedule(impl_->schedule, names);
  }
  const int32_t idle = IdleClustersToSpread(*impl_);
  return absl::StrFormat("device: %s, %d clusters of %d CTAs, rings: %s (A %d stages of %d bytes, B %d stages)\n",
                         impl_->device.name, impl_->grid_clusters, impl_->schedule.cluster_size,
                         impl_->options.ring_mode == RingMode::kSplit ? "split" : "lockstep",
                         impl_->a_stages, impl_->a_stage_bytes, impl_->b_stages) +
         (idle > 0
              ? absl::StrFormat("first fetches spread over the SMs: %d of %d clusters have no job to start at "
                                "launch\n",
                                idle, impl_->grid_clusters)
              : "") +
         ExplainPackedWeights(*impl_) + sched::ExplainSchedule(impl_->schedule, names);
}

const GemmGraph& Plan::graph() const { return impl_->graph; }
const sched::Schedule& Plan::schedule() const { return impl_->schedule; }
const CompileOptions& Plan::options() const { return impl_->options; }
int Plan::grid_clusters() const { return impl_->grid_clusters; }
KernelChoice Plan::kernel() const { return impl_->narrow ? KernelChoice::kNarrow : KernelChoice::kTiled; }

}  // namespace loom

namespace loom::internal {

absl::Status SuppressFlagPublishingForTesting(Plan& plan, int node) {
  Plan::Impl& impl = *plan.impl_;
  if (impl.nodes == nullptr || node < 0 || node >= impl.graph.size()) {
    return absl::InvalidArgumentError("SuppressFlagPublishingForTesting: no such device node");
  }
  const uint8_t zero = 0;
  LOOM_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(reinterpret_cast<uint8_t*>(&impl.nodes[node]) +
                                                 offsetof(kernel::KernelNode, has_dependents),
                                             &zero, 1, cudaMemcpyHostToDevice),
                                  "clearing has_dependents"));
  // Nor its tagged copy (the tagged handoff's consumers poll that).
  uint64_t* const no_copy = nullptr;
  return CudaStatus(cudaMemcpy(reinterpret_cast<uint8_t*>(&impl.nodes[node]) + offsetof(kernel::KernelNode, tagged_c),
                               &no_copy, sizeof(no_copy), cudaMemcpyHostToDevice),
                    "clearing tagged_c");
}

int64_t LiveAllocationsForTesting() { return live_allocations.load(std::memory_order_relaxed); }

absl::Status PublishFlagsForTesting(Plan& plan, int node, int except_tile) {
  Plan::Impl& impl = *plan.impl_;
  const int nodes = static_cast<int>(impl.schedule.nodes.size());
  if (node < 0 || node >= nodes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PublishFlagsForTesting: node %d is not in [0, %d)", node, nodes));
  }
  const sched::NodeSchedule& schedule = impl.schedule.nodes[node];
  const int tiles = schedule.m_blocks * schedule.n_blocks;
  if (except_tile < 0 || except_tile >= tiles) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PublishFlagsForTesting: except_tile %d is not in [0, %d)", except_tile, tiles));
  }
  if (impl.flags == nullptr) {
    return absl::FailedPreconditionError("PublishFlagsForTesting: a host-only plan has no tile flags");
  }
  kernel::LaunchState state;
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpy(&state, impl.state, sizeof(state), cudaMemcpyDeviceToHost));
  // A row of tiles at a time: the rows need not follow on
  // (NodeSchedule::flag_row_stride).
  std::vector<uint32_t> flags(static_cast<size_t>(schedule.n_blocks));
  for (int mb = 0; mb < schedule.m_blocks; ++mb) {
    for (int nb = 0; nb < schedule.n_blocks; ++nb) {
      // The next launch's epoch, but this launch's for the missing tile.
      flags[nb] = mb * schedule.n_blocks + nb == except_tile ? state.epoch : state.epoch + 1;
    }
    LOOM_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(impl.flags + sched::OutputFlagIndex(schedule, mb, 0), flags.data(),
                                               flags.size() * sizeof(uint32_t), cudaMemcpyHostToDevice),
                                    "writing tile flags"));
  }
  // Its tagged copy the same way (the values zero): every word the next
  // launch's epoch but those of the missing tile's columns.
  const auto handoff = std::find_if(impl.tagged_handoffs.begin(), impl.tagged_handoffs.end(),
                                    [&](const Plan::Impl::TaggedHandoff& h) { return h.producer == node; });
  if (handoff == impl.tagged_handoffs.end()) return absl::OkStatus();
  // Only this producer's words (the columns from col0 of each row).
  const int64_t missing_m = except_tile / schedule.n_blocks, missing_n = except_tile % schedule.n_blocks;
  std::vector<uint64_t> words(static_cast<size_t>(NarrowConfig::TaggedWordsPerRow(schedule.out_cols)));
  for (int64_t row = 0; row < schedule.m; ++row) {
    std::fill(words.begin(), words.end(), uint64_t{state.epoch + 1} << 32);
    if (row / impl.schedule.tile.m == missing_m) {
      for (int64_t col = missing_n * schedule.out_tile_n;
           col < std::min((missing_n + 1) * schedule.out_tile_n, schedule.out_cols); col += 2) {
        words[static_cast<size_t>(col / 2)] = 0;
      }
    }
    LOOM_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(impl.tagged_copies + handoff->offset + row * handoff->pitch + handoff->col0 / 2, words.data(),
                   words.size() * sizeof(uint64_t), cudaMemcpyHostToDevice),
        "writing the tagged copy"));
  }
  return absl::OkStatus();
}

}  // namespace loom::internal
