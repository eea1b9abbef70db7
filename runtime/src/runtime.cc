// runtime.cc: Runtime (device discovery), Compile (validation, lowering,
// device resources) and Plan (launch, synchronize, explain). What Compile
// checks and chooses (kernel, tile width, rings) is compile_choices.cc; what
// a plan holds on its device, and how it is made and freed, is
// plan_resources.cc.
#include "loom/runtime.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <initializer_list>
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
#include "internal/plan_resources.h"
#include "internal/plan_impl.h"
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
using internal::CheckDevice;
using internal::CheckLockstepReadsNoProducedB;
using internal::CheckOptions;
using internal::ChooseNarrowRings;
using internal::ChooseTileWidth;
using internal::ChooseTiledRings;
using internal::ElementTypeOf;
using internal::FewestPairSplitJobs;
using internal::FirstZeroKNode;
using internal::HalfTypeOf;
using internal::IsChainOfOneWaveLayers;
using internal::MaxK;
using internal::MaxRows;
using internal::NarrowPairSplitApplies;
using internal::NarrowWideSplitApplies;
using internal::NarrowRings;
using internal::PairSplitLastExtraKBlocks;
using internal::ProblemsOf;
using internal::TiledRingsReadPackedWeights;
using internal::TiledSharedMemory;
using internal::TiledTile;
using internal::UsesNarrowKernel;
using internal::kClusterSize;
using internal::OwnStream;
using internal::PackedNodesOf;
using internal::TaggedHandoffsOf;
using internal::PackedCopyBytes;
using internal::PackWeights;
using internal::IdleClustersToSpread;
using internal::RestoreCurrentDevice;
using internal::AllocateDeviceResources;

// What the split kernels (RunPairSplitJob) take for granted of a schedule,
// beyond what Lower gives any split-K schedule: every node in `splits` parts
// of K (NarrowConfig::Splits: the pair split's two, the wide split's four),
// the last summing (no reduce jobs), and every job starting on a stage (its
// packed weights are laid out by stages). Lower gives that for the options
// Compile sets where NarrowPairSplitApplies or NarrowWideSplitApplies;
// anything else is a loom bug, refused here rather than run.
absl::Status CheckSplitSchedule(const sched::Schedule& schedule, int32_t splits) {
  for (const sched::TileJob& job : schedule.queue) {
    const sched::NodeSchedule& node = schedule.nodes[job.node];
    if (node.split_k != splits || node.reduce_parts != 0 || job.kind != static_cast<uint8_t>(sched::JobKind::kGemm) ||
        job.k_block_begin % NarrowConfig::kKBlocksPerStage != 0) {
      return absl::InternalError(absl::StrFormat(
          "scheduler: the split node %d has split_k %d, reduce_parts %d, and a job of kind %d, split %d, from "
          "k-block %d: not %d parts of K on stage boundaries, the last summing (a loom bug)",
          job.node, node.split_k, node.reduce_parts, job.kind, job.split, job.k_block_begin, splits));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// How the choices are spelled on a command line; the first is the default,
// which an out-of-range value is also spelled as.
template <typename Choice>
using Spellings = std::initializer_list<std::pair<Choice, absl::string_view>>;
const Spellings<KernelChoice> kKernelSpellings = {
    {KernelChoice::kAuto, "auto"}, {KernelChoice::kTiled, "tiled"}, {KernelChoice::kNarrow, "narrow"}};
const Spellings<PairSplitChoice> kPairSplitSpellings = {
    {PairSplitChoice::kAuto, "auto"}, {PairSplitChoice::kOn, "on"}, {PairSplitChoice::kOff, "off"}};

template <typename Choice>
bool ParseChoice(Spellings<Choice> spellings, absl::string_view what, absl::string_view text, Choice* choice,
                 std::string* error) {
  std::vector<absl::string_view> names;
  for (const auto& [candidate, name] : spellings) {
    if (text == name) {
      *choice = candidate;
      return true;
    }
    names.push_back(name);
  }
  *error = absl::StrFormat("%s must be %s or %s, got '%s'", what,
                           absl::StrJoin(names.begin(), names.end() - 1, ", "), names.back(), text);
  return false;
}

template <typename Choice>
std::string Spell(Spellings<Choice> spellings, Choice choice) {
  for (const auto& [candidate, name] : spellings) {
    if (candidate == choice) return std::string(name);
  }
  return std::string(spellings.begin()->second);
}

}  // namespace

bool AbslParseFlag(absl::string_view text, KernelChoice* choice, std::string* error) {
  return ParseChoice(kKernelSpellings, "the kernel", text, choice, error);
}

std::string AbslUnparseFlag(KernelChoice choice) { return Spell(kKernelSpellings, choice); }

bool AbslParseFlag(absl::string_view text, PairSplitChoice* choice, std::string* error) {
  return ParseChoice(kPairSplitSpellings, "the pair split", text, choice, error);
}

std::string AbslUnparseFlag(PairSplitChoice choice) { return Spell(kPairSplitSpellings, choice); }

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
    impl->narrow_split = NarrowWideSplitApplies(options, graph, rows) ? NarrowConfig::Split::kWide
                         : NarrowPairSplitApplies(options, graph, rows, device_.sm_count)
                             ? NarrowConfig::Split::kPair
                             : NarrowConfig::Split::kNone;
    if (options.pack_weights) {
      impl->packed_nodes = PackedNodesOf(graph, dependencies, /*tiled=*/nullptr, impl->narrow_tile_n());
    }
    LOOM_ASSIGN_OR_RETURN(const NarrowRings rings,
                          ChooseNarrowRings(options, device_, rows, MaxK(graph),
                                            IsChainOfOneWaveLayers(graph, dependencies, device_.sm_count),
                                            !impl->packed_nodes.empty(), impl->narrow_split));
    impl->a_stages = rings.a_stages;
    impl->b_stages = rings.b_stages;
    impl->b_in_flight = rings.b_in_flight;
    impl->narrow_consumers = rings.consumers;
    impl->narrow_claim_stages = rings.claim_stages;
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
  scheduler_options.tile = impl->narrow ? NarrowConfig::tile(rows, impl->narrow_tile_n()) : TiledTile(impl->tile_n);
  scheduler_options.cluster_size = cluster_size;
  scheduler_options.num_sms = device_.sm_count;
  scheduler_options.max_clusters = impl->grid_clusters;
  scheduler_options.split_k = impl->narrow ? 1 : options.split_k;
  scheduler_options.group_size = options.group_size;
  scheduler_options.reduce_in_parts = options.reduce_in_parts;
  scheduler_options.reduce_part_rows = options.reduce_part_rows;
  scheduler_options.sum_in_last_split = options.sum_in_last_split;
  scheduler_options.last_split_extra_k_blocks = options.last_split_extra_k_blocks;
  if (impl->narrow_split != NarrowConfig::Split::kNone) {
    // Each tile's two halves (four quarters) of K, the last summing
    // (RunPairSplitJob) and longer by PairSplitLastExtraKBlocks, on the
    // stage boundaries NarrowPairSplitApplies (NarrowWideSplitApplies)
    // checked.
    scheduler_options.split_k = NarrowConfig::Splits(impl->narrow_split);
    scheduler_options.reduce_in_parts = false;
    scheduler_options.sum_in_last_split = true;
    scheduler_options.last_split_extra_k_blocks = PairSplitLastExtraKBlocks(options);
    scheduler_options.interleave_split_producers = true;
    // Only the pair split's (CheckOptions refuses the option beside the wide split).
    scheduler_options.whole_leading_tiles = options.narrow_split_whole_tiles;
    scheduler_options.first_split_lead_k_blocks = options.narrow_split_lead_k_blocks;
    scheduler_options.split_granule_k_blocks = NarrowConfig::kKBlocksPerStage;  // halves start on stages
  }
  scheduler_options.name = "CompileOptions";  // Lower's option errors name the caller's options
  LOOM_ASSIGN_OR_RETURN(impl->schedule, sched::Lower(problems, scheduler_options));
  if (impl->narrow_split != NarrowConfig::Split::kNone) {
    LOOM_RETURN_IF_ERROR(CheckSplitSchedule(impl->schedule, NarrowConfig::Splits(impl->narrow_split)));
  }
  if (!impl->narrow && options.pack_weights && TiledRingsReadPackedWeights(options)) {
    impl->packed_nodes = PackedNodesOf(graph, dependencies, &impl->schedule);
  }

  if (has_gpu() && !impl->schedule.queue.empty()) LOOM_RETURN_IF_ERROR(AllocateDeviceResources(*impl));
  return Plan(std::move(impl));
}

namespace internal {

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
                                                 impl_->narrow_split, impl_->half, overlap, stream),
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
std::string ExplainNarrowMultiply(uint32_t tile_rows, NarrowConfig::Split split) {
  const bool pair_split = split == NarrowConfig::Split::kPair;
  if (split == NarrowConfig::Split::kWide) {
    return absl::StrFormat(
        "multiply: wgmma m64n64k16 in both consumer warpgroups, each 64 of the tile's 128 columns, the tokens (A "
        "tiles of %d rows) as the 64 rows, from the same A stages\n",
        tile_rows);
  }
  if (pair_split && NarrowConfig::TallPairSplit(tile_rows)) {
    return absl::StrFormat(
        "multiply: wgmma m64n64k16 in both consumer warpgroups, each 64 of the tokens (A tiles of %d rows) as its "
        "64 rows, from the same B stages\n",
        tile_rows);
  }
  if (pair_split) {
    return absl::StrFormat("multiply: wgmma m64n64k16, the tokens (A tiles of %d rows) as the 64 rows\n", tile_rows);
  }
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

// Explain's account of CompileOptions::narrow_pair_split where kAuto took
// it, or kOn asked for it and it does not apply (empty otherwise; the tile
// line says where it runs).
std::string ExplainPairSplit(const Plan::Impl& impl) {
  if (impl.options.narrow_pair_split == PairSplitChoice::kAuto && impl.narrow_pair_split()) {
    return absl::StrFormat(
        "pair split: chosen by the plan (%d-%d rows, and every node has at least three quarters of a wave of its "
        "jobs: %d at fewest on %d SMs)\n",
        NarrowConfig::kBlockM + 1, NarrowConfig::kMaxRows, FewestPairSplitJobs(impl.graph), impl.device.sm_count);
  }
  if (impl.options.narrow_pair_split != PairSplitChoice::kOn || impl.narrow_pair_split()) return "";
  const int32_t extra = PairSplitLastExtraKBlocks(impl.options);
  return absl::StrFormat(
      "pair split: not taken (it needs %d-%d rows, two consumer warpgroups past %d, and every node's K split in "
      "two at a multiple of %d, each half at least that%s)\n",
      NarrowConfig::kPairedRows + 1, NarrowConfig::kMaxRows, NarrowConfig::kBlockM,
      NarrowConfig::kKBlocksPerStage * NarrowConfig::kBlockK,
      extra > 0 ? absl::StrFormat(", the second %d k-blocks of %d longer", extra, NarrowConfig::kBlockK) : "");
}

// Explain's account of CompileOptions::narrow_wide_split where it was asked
// for and does not apply (empty otherwise; the tile line says where it runs).
std::string ExplainWideSplit(const Plan::Impl& impl) {
  if (!impl.options.narrow_wide_split || impl.narrow_split == NarrowConfig::Split::kWide) return "";
  const int32_t extra = PairSplitLastExtraKBlocks(impl.options);
  return absl::StrFormat(
      "wide split: not taken (it needs the narrow kernel, %d-%d rows, two consumer warpgroups, and every node's K "
      "split in four at multiples of %d, each quarter at least that%s)\n",
      NarrowConfig::kPairedRows + 1, NarrowConfig::kBlockM, NarrowConfig::kKBlocksPerStage * NarrowConfig::kBlockK,
      extra > 0 ? absl::StrFormat(", the last %d k-blocks of %d longer", extra, NarrowConfig::kBlockK) : "");
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
               "device: %s, narrow decode kernel (%d x %d tiles over %s), %d CTAs of %d consumer "
               "warpgroup%s, rings: A %d stages of %d bytes, B %d stages of %d bytes (%d in flight)%s\n",
               impl_->device.name, impl_->schedule.tile.m, impl_->narrow_tile_n(),
               impl_->narrow_split == NarrowConfig::Split::kWide
                   ? "each quarter of K, the last quarter summing (wide split)"
                   : (impl_->narrow_pair_split() ? "each half of K, the second half summing (pair split)"
                                                 : "the whole of K"),
               impl_->grid_clusters, impl_->narrow_consumers, impl_->narrow_consumers == 1 ? "" : "s",
               impl_->a_stages, impl_->a_stage_bytes, impl_->b_stages,
               NarrowConfig::BStageBytes(impl_->narrow_tile_n()), impl_->b_in_flight,
               impl_->narrow_claim_stages == 0
                   ? ""
                   : absl::StrFormat(", next job claimed at %d B stages left", impl_->narrow_claim_stages)) +
           ExplainNarrowMultiply(NarrowConfig::ATileRows(impl_->a_stage_bytes), impl_->narrow_split) +
           ExplainPairSplit(*impl_) + ExplainWideSplit(*impl_) + ExplainPackedWeights(*impl_) +
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
