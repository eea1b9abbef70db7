// plan_impl.h (internal): what a Plan owns.
#ifndef LOOM_RUNTIME_INTERNAL_PLAN_IMPL_H_
#define LOOM_RUNTIME_INTERNAL_PLAN_IMPL_H_

#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernel_params.h"
#include "loom/runtime.h"
#include "narrow_config.h"

namespace loom {

struct Plan::Impl {
  GemmGraph graph;
  CompileOptions options;
  DeviceDescription device;
  sched::Schedule schedule;
  int device_ordinal = -1;  // -1: host-only plan
  int grid_clusters = 0;
  bool has_split_k = false;  // some node splits K: launch the kernel's split-K instantiation
  // The A stage size Compile sized shared memory with: AStageBytesFor(graph)
  // on the tiled kernel, the narrow kernel's (NarrowRings) on it.
  uint32_t a_stage_bytes = 0;
  // The narrow decode kernel runs this plan (CompileOptions::kernel);
  // grid_clusters then counts CTAs.
  bool narrow = false;
  int a_stages = 0;  // the ring depths the kernel runs with: the options', or the narrow kernel's
  int b_stages = 0;
  int b_in_flight = 0;  // the narrow kernel's B loads in flight at most
  int narrow_consumers = 0;  // the narrow kernel's consumer warpgroups (CompileOptions::narrow_consumers)
  int narrow_claim_stages = 0;  // the narrow kernel's claim pacing (NarrowRings::claim_stages); 0: off
  int tile_n = 0;  // the tiled kernel's tile width (CompileOptions::tile_n); 0 on the narrow kernel
  // How the narrow kernel's jobs divide K: the pair split
  // (CompileOptions::narrow_pair_split and NarrowPairSplitApplies; 64-column
  // tiles, K in two halves), the wide split (narrow_wide_split and
  // NarrowWideSplitApplies; 128-column tiles, K in quarters), or not at all.
  kernel::NarrowConfig::Split narrow_split = kernel::NarrowConfig::Split::kNone;
  bool narrow_pair_split() const { return narrow_split == kernel::NarrowConfig::Split::kPair; }
  // The narrow kernel's tile width (NarrowConfig::TileN).
  int narrow_tile_n() const { return kernel::NarrowConfig::TileN(narrow_split); }
  // The graph's 16-bit type (HalfTypeOf, compile_choices.cc): the tiled kernel's
  // instantiation; bf16 on the narrow kernel.
  kernel::ElementType half = kernel::ElementType::kBF16;
  std::optional<TimeoutRecord> last_timeout;
  // The nodes whose B the kernel reads from the plan's own packed copy
  // (CompileOptions::pack_weights), each at `offset` bytes into
  // packed_weights. Nodes with the same B (same memory, shape and stride)
  // read one copy, made for the first of them (`copies`). Known without a
  // GPU too (Explain).
  struct PackedNode {
    int node = 0;
    int64_t offset = 0;
    int64_t bytes = 0;
    bool copies = true;  // false: an earlier node's copy of the same B
  };
  std::vector<PackedNode> packed_nodes;
  // The narrow kernel's tagged handoffs (CompileOptions::tagged_handoff),
  // one a (producer, consumer) pair: `consumer` reads its A from a tagged
  // copy of A (8-byte words of two columns and a launch's epoch), rows of
  // `pitch` words from word `offset` of tagged_copies, of which `producer`
  // writes the columns from `col0` on (its C: all of A, or A's columns from
  // col0). Consumers of the same view share its copy. Known without a GPU
  // too (Explain).
  struct TaggedHandoff {
    int producer = 0;
    int consumer = 0;
    int64_t offset = 0;
    int64_t pitch = 0;
    int64_t col0 = 0;
  };
  std::vector<TaggedHandoff> tagged_handoffs;
  int64_t tagged_words = 0;  // of every copy

  // Device resources (device_ordinal >= 0 and the schedule has jobs).
  kernel::KernelParams params = {};
  kernel::KernelNode* nodes = nullptr;
  sched::TileJob* queue = nullptr;
  sched::DependencyEdge* dependencies = nullptr;
  uint32_t* flags = nullptr;
  float* workspace = nullptr;
  kernel::LaunchState* state = nullptr;
  kernel::DeviceTimeoutRecord* timeout_host = nullptr;  // pinned, mapped
  kernel::DeviceJobTrace* trace = nullptr;              // options.trace only
  uint8_t* packed_weights = nullptr;                    // packed_nodes' copies of B
  uint64_t* tagged_copies = nullptr;                    // tagged_handoffs' copies of C

  ~Impl();
};

namespace internal {
// FailedPrecondition for `method` called on a moved-from Plan.
absl::Status MovedFromPlan(absl::string_view method);
// OK when the calling thread's current CUDA device is the plan's; else
// FailedPrecondition for `method` naming both ordinals. Launch and
// Synchronize act on the current device (a kernel launches on it, and the
// null stream is its), so a plan of device 0 launched while device 1 is
// current would run device 0's pointers on device 1.
absl::Status CheckCurrentDevice(absl::string_view method, int plan_device, int current_device);
// What a kernel::WaitKind waited on, in words ("unknown wait" for a value
// that is none of them), for the time-out status.
const char* WaitKindName(int32_t kind);
// The status Synchronize returns for the kernel's failure record: Internal
// for a job the launched kernel has no path for (WaitKind::kNoKernelPath),
// else DeadlineExceeded naming the SM, `job`, the wait, the flag, the epochs
// and the wait's limit (spin_timeout_ns for a dependency flag, four times it
// for the rest).
absl::Status DeviceFailureStatus(int32_t kind, const TimeoutRecord& record, absl::string_view job,
                                 int64_t spin_timeout_ns);
// KernelNode::a_producer of node `node`: its one A edge, when it has exactly
// one and that edge is not whole-tensor, with the producer's fields the
// kernel's AProducerRun reads; none (out_tile_n 0) otherwise.
kernel::KernelNode::AProducer AProducerOf(const sched::Schedule& schedule, int node);
// KernelNode::first_a_run of node `node` (tiles schedule.tile), whose
// a_producer is `copy`: for each row block, the run of A's producer flags
// from k-block 0 that the kernel's AProducerRun would find for a job
// spanning the node's K, and for a node with several A edges, joined with
// the next edges' runs while their flags follow on. `narrow`: row blocks 0
// and 1 (all a narrow plan has), each none (granules 0) where it finds none
// or where the run does not fit the record's 16 bits. Else (the tiled
// kernel, which moves row block 0's run on to row block r by r times the
// step from row block 0's first flag to row block 1's): both none unless
// every row block's run is that.
void FirstARunsOf(const sched::Schedule& schedule, int node, const kernel::KernelNode::AProducer& copy, bool narrow,
                  kernel::KernelNode::FirstARun (&runs)[2]);
}  // namespace internal

}  // namespace loom

#endif  // LOOM_RUNTIME_INTERNAL_PLAN_IMPL_H_
