// plan_resources.cc: what a plan holds on its device, made and freed
// (plan_resources.h): the kernel's node records, the packed weights, the
// tagged copies, and the allocations behind them.
#include "internal/plan_resources.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "internal/compile_choices.h"
#include "internal/cuda_status.h"
#include "internal/reachable_views.h"
#include "internal/tensor_maps.h"
#include "internal/testing_hooks.h"
#include "kernel_config.h"
#include "loom/scheduler/queue.h"
#include "loom/scheduler/tiling.h"
#include "loom/status.h"
#include "narrow_gemm.h"
#include "pack_weights.h"
#include "persistent_gemm.h"

namespace loom {
namespace internal {

using kernel::KernelConfig;
using kernel::KernelConfigN128;
using kernel::NarrowConfig;

namespace {

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

// The row stride (elements) the kernels and the pack are given for `view`:
// its own, or for a single row, whose stride Validate ignores (any value,
// INT64_MAX too), the row's width, so that no address arithmetic on rows
// the kernels mask off can overflow. (The tensor maps take the same rule in
// bytes, rounded up to TMA's 16: TmaRowStrideBytes, tensor_maps.cc.)
int64_t UsedRowStride(const TensorView& view) { return view.rows > 1 ? view.row_stride : view.cols; }

void CountedFree(void* pointer) {
  if (pointer != nullptr && cudaFree(pointer) == cudaSuccess) live_allocations.fetch_sub(1, std::memory_order_relaxed);
}

void CountedFreeHost(void* pointer) {
  if (pointer != nullptr && cudaFreeHost(pointer) == cudaSuccess) {
    live_allocations.fetch_sub(1, std::memory_order_relaxed);
  }
}

// The tensor maps through which `node`'s jobs load A and B (K > 0). The
// narrow kernel's (`narrow`): A boxes of the rows of its A k-block tiles
// (a_stage_bytes / 128 / kKBlocksPerStage), B boxes of its tile's `tile_n` rows, a stage of
// k-blocks at a time where K is a multiple of 64, else one k-block a load (the
// kernel tells them apart the same way). The tiled kernel's: half-tile boxes
// and whole-slot boxes of each.
absl::Status EncodeOperandMaps(const GemmNode& node, bool narrow, uint32_t a_stage_bytes, int tile_n,
                               kernel::KernelNode& out) {
  if (narrow) {
    const uint32_t a_rows = NarrowConfig::ATileRows(a_stage_bytes);
    if (node.k() % NarrowConfig::kBlockK == 0) {
      LOOM_RETURN_IF_ERROR(internal::EncodeKBlockMap(node.a, a_rows, NarrowConfig::kKBlocksPerStage, &out.a_map));
      return internal::EncodeKBlockMap(node.b, tile_n, NarrowConfig::kKBlocksPerStage, &out.b_map);
    }
    LOOM_RETURN_IF_ERROR(internal::EncodeTensorMap(node.a, NarrowConfig::kBlockK, a_rows, &out.a_map));
    return internal::EncodeTensorMap(node.b, NarrowConfig::kBlockK, tile_n, &out.b_map);
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
// partials in a tensor map (the pair split's go through plain stores); else
// for the tiled kernel; either with tiles `tile_n` wide.
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
    out.c_stride = UsedRowStride(node.c);
    const int64_t per_16_bytes = 16 / static_cast<int64_t>(node.c.element_size());
    out.c_tma_cols = node.c.cols / per_16_bytes * per_16_bytes;
    if (node.epilogue.bias) {
      out.bias = node.epilogue.bias->data;
      out.bias_type = ElementTypeOf(node.epilogue.bias->dtype);
    }
    if (node.epilogue.residual) {
      out.residual = node.epilogue.residual->data;
      out.residual_type = ElementTypeOf(node.epilogue.residual->dtype);
      out.residual_stride = UsedRowStride(*node.epilogue.residual);
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
// narrow kernel's or the tiled kernel's, for tiles `tile_n` wide.
kernel::PackedLayout PackedLayoutFor(bool narrow, int tile_n) {
  return narrow ? NarrowConfig::Packed(tile_n)
                : kernel::WithTiledConfig(tile_n, [](auto config) { return decltype(config)::Packed(); });
}

// cudaMalloc of `bytes` for `what`: ResourceExhausted naming it where the
// device's free memory is too small (that error is not sticky: cleared, so
// that the caller's next cudaGetLastError does not report it).
template <typename T>
absl::Status AllocateOrExhausted(T** pointer, size_t bytes, int device, const std::string& what) {
  const cudaError_t allocated = CountedMalloc(pointer, bytes);
  if (allocated == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s, %d bytes, does not fit in device %d's free memory", what, bytes, device));
  }
  return internal::CudaStatus(allocated, absl::StrCat("cudaMalloc of ", what));
}

// `host` copied into a new device array `*device` (none for an empty one),
// on `stream`; `what` names it where it does not fit (AllocateOrExhausted).
template <typename T>
absl::Status Upload(const std::vector<T>& host, T** device, int ordinal, const std::string& what,
                    cudaStream_t stream) {
  if (host.empty()) return absl::OkStatus();
  LOOM_RETURN_IF_ERROR(AllocateOrExhausted(device, host.size() * sizeof(T), ordinal, what));
  LOOM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(*device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  return absl::OkStatus();
}

}  // namespace

std::vector<Plan::Impl::PackedNode> PackedNodesOf(const GemmGraph& graph,
                                                  const std::vector<DataDependency>& dependencies,
                                                  const sched::Schedule* tiled, int narrow_tile_n) {
  const int tile_n = tiled == nullptr ? narrow_tile_n : static_cast<int>(tiled->tile.n);
  const kernel::PackedLayout layout = PackedLayoutFor(/*narrow=*/tiled == nullptr, tile_n);
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
        (a.dtype != DType::kBF16 && a.dtype != DType::kFP16) || NarrowConfig::TaggedWordsPerRow(a.cols) > UINT16_MAX) {
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
               HasJobs(producer) && c.dtype == a.dtype && c.rows == a.rows && c.row_stride == a.row_stride &&
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

int64_t PackedCopyBytes(const std::vector<Plan::Impl::PackedNode>& packed_nodes) {
  int64_t bytes = 0;
  for (const Plan::Impl::PackedNode& packed : packed_nodes) bytes += packed.copies ? packed.bytes : 0;
  return bytes;
}

absl::Status PackWeights(const Plan::Impl& impl, cudaStream_t stream) {
  for (const Plan::Impl::PackedNode& packed : impl.packed_nodes) {
    if (!packed.copies) continue;
    const TensorView& b = impl.graph.nodes()[packed.node].b;
    LOOM_RETURN_IF_ERROR(internal::CudaStatus(
        kernel::PackWeights(b.data, b.rows, b.cols, UsedRowStride(b),
                            PackedLayoutFor(impl.narrow, impl.narrow ? impl.narrow_tile_n() : impl.tile_n),
                            impl.packed_weights + packed.offset, stream),
        absl::StrCat("packing the weights ", b.name)));
  }
  return absl::OkStatus();
}

int32_t IdleClustersToSpread(const Plan::Impl& impl) {
  return impl.narrow ? 0 : sched::IdleClustersAtLaunch(impl.schedule, impl.grid_clusters);
}

absl::Status AllocateDeviceResources(Plan::Impl& impl) {
  OwnStream setup;
  LOOM_RETURN_IF_ERROR(setup.Create());
  if (impl.schedule.workspace_elements > 0) {
    const size_t workspace_bytes = static_cast<size_t>(impl.schedule.workspace_elements) * sizeof(float);
    LOOM_RETURN_IF_ERROR(AllocateOrExhausted(
        &impl.workspace, workspace_bytes, impl.device_ordinal,
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
                                      impl.narrow ? impl.narrow_tile_n() : impl.tile_n));
  if (!impl.packed_nodes.empty()) {
    LOOM_RETURN_IF_ERROR(AllocateOrExhausted(&impl.packed_weights, PackedCopyBytes(impl.packed_nodes),
                                             impl.device_ordinal,
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
    LOOM_RETURN_IF_ERROR(
        AllocateOrExhausted(&impl.tagged_copies, bytes, impl.device_ordinal, "the tagged copies of small outputs"));
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(impl.tagged_copies, 0, bytes, setup.get()));
    for (const Plan::Impl::TaggedHandoff& handoff : impl.tagged_handoffs) {
      nodes[handoff.producer].tagged_c = impl.tagged_copies + handoff.offset + handoff.col0 / 2;
      nodes[handoff.producer].tagged_c_pitch = static_cast<uint16_t>(handoff.pitch);
      nodes[handoff.consumer].tagged_a = impl.tagged_copies + handoff.offset;
    }
  }
  LOOM_RETURN_IF_ERROR(Upload(nodes, &impl.nodes, impl.device_ordinal, "the node records", setup.get()));
  LOOM_RETURN_IF_ERROR(Upload(impl.schedule.queue, &impl.queue, impl.device_ordinal, "the job queue", setup.get()));
  LOOM_RETURN_IF_ERROR(Upload(impl.schedule.dependencies, &impl.dependencies, impl.device_ordinal,
                              "the dependency edges", setup.get()));
  // Rounded up to whole 16-byte words: the A loader polls flags four at a time.
  const size_t flag_count = (std::max<int64_t>(impl.schedule.num_flags, 1) + 3) / 4 * 4;
  LOOM_RETURN_IF_ERROR(
      AllocateOrExhausted(&impl.flags, flag_count * sizeof(uint32_t), impl.device_ordinal, "the tile flags"));
  LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(impl.flags, 0, flag_count * sizeof(uint32_t), setup.get()));
  LOOM_RETURN_IF_ERROR(
      AllocateOrExhausted(&impl.state, sizeof(kernel::LaunchState), impl.device_ordinal, "the launch state"));
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
  params.claim_stages = impl.narrow_claim_stages;
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
    LOOM_RETURN_IF_ERROR(
        AllocateOrExhausted(&impl.trace, bytes, impl.device_ordinal, "the job trace (CompileOptions.trace)"));
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(impl.trace, 0, bytes, setup.get()));
  }
  params.trace = impl.trace;
  // `nodes` (copied from pageable memory) lives until here, and every buffer
  // above is set before the plan is returned.
  return setup.Wait();
}

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

int64_t LiveAllocationsForTesting() { return live_allocations.load(std::memory_order_relaxed); }

}  // namespace internal

Plan::Impl::~Impl() {
  // Freed on the plan's device, which need not be the caller's current one
  // (a plan may be destroyed on any thread, with any device current).
  std::optional<internal::RestoreCurrentDevice> restore;
  if (device_ordinal >= 0) {
    restore.emplace();
    cudaSetDevice(device_ordinal);
  }
  internal::CountedFree(nodes);
  internal::CountedFree(queue);
  internal::CountedFree(dependencies);
  internal::CountedFree(flags);
  internal::CountedFree(workspace);
  internal::CountedFree(state);
  internal::CountedFree(trace);
  internal::CountedFree(packed_weights);
  internal::CountedFree(tagged_copies);
  internal::CountedFreeHost(timeout_host);
}

}  // namespace loom
