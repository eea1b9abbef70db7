// loom/runtime.h: compiling a GemmGraph into a Plan and launching it as one
// persistent kernel.
//
//   absl::StatusOr<loom::Runtime> rt = loom::Runtime::Create(/*device_ordinal=*/0);
//   absl::StatusOr<loom::Plan> plan = rt->Compile(graph);
//   LOOM_RETURN_IF_ERROR(plan->Launch(stream));      // one kernel launch
//   LOOM_RETURN_IF_ERROR(plan->Synchronize(stream)); // reports device time-outs
//   std::cout << plan->Explain();
//
// Lowering is host work and needs no GPU: Runtime::ForDescription gives a
// runtime for a described device, whose plans can be explained and run by the
// CPU reference (loom/reference.h) but not launched.
#ifndef LOOM_RUNTIME_H_
#define LOOM_RUNTIME_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "loom/graph.h"
#include "loom/scheduler/schedule.h"

namespace loom {

class Plan;
namespace internal {
absl::Status SuppressFlagPublishingForTesting(Plan& plan, int node);  // tests only
absl::Status PublishFlagsForTesting(Plan& plan, int node, int except_tile);  // tests only
}  // namespace internal

// The facts about a GPU that lowering depends on.
struct DeviceDescription {
  std::string name;
  int sm_count = 0;
  int64_t shared_memory_per_block = 0;  // opt-in maximum, bytes
  int64_t l2_bytes = 0;
  bool cluster_launch = false;
  // Clusters of loom's kernel that can be co-resident (occupancy API); 0 when
  // unknown, then sm_count / cluster size is assumed.
  int max_coresident_clusters = 0;

  // The H200 this project measures on (132 SMs, 232448 B, 60 MB L2).
  static DeviceDescription H200();
};

// How the A and B operands flow through shared memory.
//   kSplit: separate A and B rings with their own barriers and loaders; B (the
//           weights) runs ahead while A waits on a dependency.
//   kLockstep: one ring, one loader, one barrier pair per stage for A and B.
enum class RingMode : uint8_t { kSplit, kLockstep };

// The kernel a plan runs on (CompileOptions::kernel).
enum class KernelChoice {
  // The narrow decode kernel for a graph of at most 16 rows (its mma.sync
  // path), and of 17 to 64 rows (its wgmma path) where every node's 32-
  // column tiles fit in three waves of the device's SMs, or where the nodes
  // past three waves hold at most twice the weights of the nodes that read
  // another's output and would have their K split on the tiled kernel (the
  // MLP block), unless the options ask for what only the tiled kernel has
  // (split_k above 1, lockstep rings); else the tiled one. Measured on the H200
  // (bench/NOTES.md v1.17-v1.21): at 1 and 16 tokens the MLP block and the
  // 8-layer chain take 95-100 us on it against 118-176 us tiled; at 32 and
  // 64 tokens the chain 118-119 against 184-210 and the MLP block 117-124
  // against 121-125; single nodes wider than three waves (28672 x 4096 at
  // 64 rows: 0.78 of cuBLAS against 0.94) stay tiled. From 65 to 128 rows
  // (two row blocks, or the tall pair split where PairSplitChoice::kAuto
  // takes it) where every node is at most one wave of 32-column tiles and
  // 32 MiB of weights: the 8-layer 4096 chain at 65-128 rows 170-178 us
  // against 215-246 tiled (bench/NOTES.md v1.33); the MLP block at 128
  // tokens stays tiled.
  kAuto,
  kTiled,   // the persistent tiled kernel (256-column tiles, split-K, clusters)
  kNarrow,  // the narrow decode kernel wherever every node has at most 128 rows, else tiled
};

// KernelChoice on a command line (Abseil flags find these by argument-
// dependent lookup): "auto", "tiled" or "narrow".
bool AbslParseFlag(absl::string_view text, KernelChoice* choice, std::string* error);
std::string AbslUnparseFlag(KernelChoice choice);

// Whether the narrow kernel runs the pair split (CompileOptions::
// narrow_pair_split).
enum class PairSplitChoice : uint8_t {
  // Where it applies and the plan is of 65-128 rows (the tall pair split),
  // has two consumer warpgroups, and every node with jobs has at least
  // three quarters of a wave of them (two halves of K a 64-column tile; the
  // 8-layer 4096 chain's 128 on 132 SMs): on H100s the chain at 65 / 100 /
  // 128 tokens took 155.7 / 159.0 / 161.5 us against 182 / 185 / 189 in two
  // row blocks; in an earlier form of the kernel 128 x 4096 x 4096 ran at
  // 0.76 of cuBLAS against 0.73, while nodes of 1024-2048 columns, half a
  // wave of jobs or less, were far slower (128 x 2048 x 8192 0.65 against
  // 0.94; bench/NOTES.md v2.03). Off elsewhere: at 33-64 rows it was ~1-1.7
  // us slower on the MLP block at 64 tokens on H100s (v2.02), ~0.3 us
  // faster on the H200 and 27 us slower on the 64-token chain (v2.07).
  kAuto,
  kOn,   // wherever it applies (CompileOptions::narrow_pair_split)
  kOff,  // never
};

// PairSplitChoice on a command line: "auto", "on" or "off".
bool AbslParseFlag(absl::string_view text, PairSplitChoice* choice, std::string* error);
std::string AbslUnparseFlag(PairSplitChoice choice);

// The largest CompileOptions::narrow_claim_stages: a whole job's B stages
// at K = 2^20 (a value past a job's stages paces its claim to the job's
// first stage).
inline constexpr int kMaxNarrowClaimStages = 4096;

// The longest CompileOptions::spin_timeout_ns (2^60 ns, ~36 years): the
// device computes four times it (kernel::WaitLimitNs), and the time waited,
// in unsigned 64 bits.
inline constexpr int64_t kMaxSpinTimeoutNs = int64_t{1} << 60;

struct CompileOptions {
  RingMode ring_mode = RingMode::kSplit;
  // The tiled kernel's ring depths, each 0 or [2, 8]; with kLockstep, equal
  // where both are given. 0: chosen by Compile (7 A and 5 B stages on
  // 128-wide tiles in split rings, 4 and 4 otherwise; one 0 beside a given
  // depth: the same depth in lockstep, else its chosen depth lowered until
  // shared memory fits). Explain() says what the plan took.
  int a_stages = 0;
  int b_stages = 0;
  // Clusters to launch; 0: every co-resident cluster. More than are co-resident
  // is refused (a spin-waiting CTA must never keep a producer from running).
  int max_clusters = 0;
  int split_k = 0;     // 0: per node, chosen by the scheduler; >= 1: forced
  int group_size = 0;  // 0: chosen by the scheduler
  // A split-K node of one row block (decode, up to 128 tokens) has each
  // tile's partials summed in parts of a few rows, one job and cluster each
  // (true), or all rows by one job (false; for comparisons).
  bool reduce_in_parts = true;
  int reduce_part_rows = 0;  // rows of each part; 0: chosen by the scheduler (8 or 16); at most 16
  // A split-K node of at most four splits whose tiles would each be summed
  // whole by one reduce job (129 rows and more, or not reduced in parts) has
  // each tile's last split add the other splits' partials to its
  // accumulators and run the epilogue (true), or has the reduce jobs (false;
  // for comparisons).
  bool sum_in_last_split = true;
  // Where a tile's last split sums: how many k-blocks it takes beyond an even
  // share, so that the other splits' partials are ready when its main loop
  // ends. -1: the scheduler decides (8 where a node's splits start together:
  // its jobs and its producers' fit one wave; else 0; with the narrow
  // kernel's pair split, 0); >= 0: that many wherever the last split sums
  // (at most the node's k-blocks less its splits). Above 65535 is refused.
  int last_split_extra_k_blocks = -1;
  // Which kernel runs the plan (KernelChoice). The narrow decode kernel
  // (ops/kernel/narrow_config.h): 64 x 32 tiles over the whole of K, no
  // split-K, rings of stages of four k-blocks, for graphs of at most 64 rows
  // (up to 128 in two row blocks of half the rows, rounded up to 8).
  // On it a_stages, b_stages, ring_mode and the reduce options do not apply,
  // split_k must be 0 or 1, and max_clusters counts CTAs (it has no
  // clusters).
  KernelChoice kernel = KernelChoice::kAuto;
  // The tiled kernel's tile width: 256 (128 x 256 tiles, m64n256k16) or 128
  // (128 x 128, m64n128k16: twice the tiles of a node, so fewer splits of K
  // where 256-wide tiles would leave SMs without a tile, at ~70% of the
  // tensor pipe's rate a k-block; bench/NOTES.md v1.60-v1.61, v1.64). 0: Compile
  // chooses: 128 where, at every step of the graph (the nodes of one
  // dependency depth, which can run at once), 128-wide tiles fit in half the
  // grid's CTAs or fill at least nine tenths of it; 256 otherwise (the MLP
  // block at 128 tokens and up, large GEMMs). Plan::schedule().tile.n says
  // which. Does not apply on the narrow kernel.
  int tile_n = 0;
  // The narrow kernel's A ring depth; 0: the longest job's A, within 128 KiB
  // (96 KiB for 9-32 rows), and at most 6 stages with packed weights at up
  // to 16 rows (the rest of shared memory to B). 2 to 16.
  int narrow_a_stages = 0;
  int narrow_b_stages = 0;  // narrow kernel's B ring depth; 0: what shared memory leaves (at most 16)
  // The narrow kernel's B loads in flight at once (issued, not yet landed),
  // whatever the ring's depth; 0: 4, or 3 with packed weights unless every
  // node is one wave of tiles and some node reads another's output (a chain
  // of decode layers). 1 to the B ring's depth - 1.
  int narrow_b_in_flight = 0;
  // The narrow kernel's consumer warpgroups: 1, or 2 taking each CTA's jobs
  // in turn, so that one's epilogue runs beside the other's next multiply
  // (the MLP block 4096/14336 at 32 / 64 tokens 89.3-90.0 / 104.7-105.4 us
  // instead of 95.1-95.8 / 110.3-110.6, bench/NOTES.md v1.29); 0: 2 for
  // graphs of 17-128 rows unless every node is one wave of tiles and some
  // node reads another's output (a chain of decode layers: one job a CTA a
  // layer, nothing to overlap), else 1.
  int narrow_consumers = 0;
  // Claim pacing on the narrow kernel: 0 (off: each CTA claims its next job
  // from the queue as soon as one of its two job slots frees, about a whole
  // job before it can start it), or a CTA claims its next job only once its
  // B loader has at most this many B stages (four k-blocks each) of its
  // last claimed job left to issue, so that the queue's last jobs go to the
  // CTAs that will start them first. Measured on H100s (bench/NOTES.md
  // v1.95-v1.99), 8 against 0 in one binary: the 8-layer 4096 chain at one
  // token ~1.5-1.7 us faster, the MLP block 4096/14336 at 1-64 tokens 0-1.8
  // us faster, the chain at 64 tokens level to ~0.5 us slower, by card; 4
  // makes that chain ~6 us slower. Not yet measured on an H200. 0 to
  // kMaxNarrowClaimStages; does not apply on the tiled kernel. With the
  // pair split (below), 0 means 8: unpaced, it was 5-7 us slower on H100s.
  int narrow_claim_stages = 0;
  // The pair split on the narrow kernel, for graphs of 33-128 rows: each
  // job a 64 x 64 tile over half of K, the two halves of a tile two jobs
  // (the first earlier in the queue), the second adding the first's fp32
  // partial sums (16 KiB a tile, through the plan's workspace) before the
  // fused epilogue; the same bits every run. A CTA then takes in one byte
  // of A per weight byte instead of two, and a node keeps its count of
  // jobs. Past 64 rows the plan is one row block and each job's tile 128 x
  // 64, both consumer warpgroups multiplying it, 64 rows each, from the same
  // weights (32 KiB of partial sums; two bytes of A per weight byte, where
  // two row blocks read each weight tile twice and four); not with
  // narrow_consumers = 1. A node whose output another reads as A is queued
  // from its two halves of columns in turn, so that both halves of its
  // consumer's K fill at one pace. Applies where every node's K splits in
  // two at a multiple of 256 (each half at least 256); elsewhere the plan
  // keeps 32-column tiles over the whole of K. Explain says which. Does not
  // apply on the tiled kernel. kAuto (PairSplitChoice) takes it only past
  // 64 rows, on nodes of three quarters of a wave of jobs or more.
  PairSplitChoice narrow_pair_split = PairSplitChoice::kAuto;
  // The wide split on the narrow kernel, for graphs of 33-64 rows with two
  // consumer warpgroups: each job a 64 x 128 tile over a quarter of K, both
  // consumer warpgroups multiplying it, 64 columns each, from the same A;
  // the last quarter of a tile (the latest in the queue) adds the other
  // three's fp32 partial sums (32 KiB each, through the plan's workspace)
  // to its own before the fused epilogue; the same bits every run. A CTA
  // then takes in half a byte of A per weight byte (the pair split one, 32
  // columns over the whole of K two), and a node keeps its count of jobs.
  // Producers are queued as for the pair split. Applies where every node's
  // K splits in four even quarters that start at multiples of 256, each at
  // least 256 (K a multiple of 1024 does); elsewhere the plan keeps its
  // other tiles, and Explain says why.
  // Taken before the pair split at 33-64 rows under kAuto; with
  // narrow_pair_split = kOn, Compile refuses the pair of options
  // (InvalidArgument: two splits of K asked for). Does not apply on the
  // tiled kernel. Off by default: the 64-token MLP block took ~139 us with
  // it against ~118 without on an H100 (bench/NOTES.md v2.06), ~120
  // against ~96.7 on the H200 (v2.07).
  bool narrow_wide_split = false;
  // With the pair split (above) taken, a node of two waves
  // of tiles or more (on the grid's CTAs) splits only the tiles of its last
  // one to two waves: the others are each one job over the whole of K that
  // writes no partial sums (the MLP block 4096/14336's gate/up at 64 tokens
  // on 132 SMs: 264 of its 448 tiles whole, 184 split in two). Fewer
  // partials through memory, and the split still evens out the node's end.
  // Where the pair split is not taken it changes nothing; with
  // narrow_pair_split = kOff or narrow_wide_split set, Compile refuses it
  // (InvalidArgument; the kernel would keep the wide split's tiles whole
  // the same way, but that has not run on a GPU). With the pair split, the 64-token MLP block took
  // 94.9-95.1 us on the H200 against 96.2-96.5 without and 96.6-96.8 for
  // the default plan; on an H100 ~2.2 us slower than the default
  // (bench/NOTES.md v2.07), so off by default.
  bool narrow_split_whole_tiles = false;
  // With the pair split, on a node whose split jobs fit one wave (the MLP
  // block's down projection at 33-64 rows: 64 tiles, 128 jobs), each tile's
  // first half of K takes this many k-blocks (of 64 columns) more than its
  // second: the first halves are queued, so fetched, before every second
  // half, which then ends sooner (SchedulerOptions::
  // first_split_lead_k_blocks). 0: even halves. The second half still
  // starts on a ring stage (4 k-blocks) and keeps one: the lead a node takes
  // is rounded down to a multiple of 8 and clamped so (Explain says how
  // much). With narrow_pair_split = kOff, narrow_wide_split set or
  // last_split_extra_k_blocks > 0, or outside [0, 65535], Compile refuses
  // it (InvalidArgument).
  // Traced on the H200 (bench/NOTES.md v2.08), the 64-token block's second
  // halves are fetched ~5 us after the first and end it ~8 us after them;
  // a lead of ~24 k-blocks would even them out. On an H100 (v2.09) its GPU
  // tests pass (NarrowSplitLeadTest) and a lead of 24 takes 0.5-1 us off
  // whole tiles at 64 tokens (118.6-118.9 us against 119.3-119.6; main
  // 117.8-117.9), still slower than main there; never timed on an H200,
  // so off by default.
  int narrow_split_lead_k_blocks = 0;
  // The kernel reads each node's B (the weights) from a copy the plan makes
  // at Compile, laid out in the order its B loader streams them: one bulk
  // copy a ring stage instead of a tensor load. On the narrow kernel, at 1
  // and 16 tokens the MLP block 4096/14336 takes 86-88 us instead of 94-96
  // (bench/NOTES.md v1.23); on the tiled kernel, at 128 tokens 117 instead
  // of 123 (v1.40). Applies to the nodes whose B no node of the graph
  // writes; on the tiled kernel only to nodes of at most 256 rows (two row
  // blocks: there the weights' stream bounds a node) and with split rings
  // (RingMode::kSplit). Explain says which. Nodes with the same B share one
  // copy. The copy takes device memory the size of those weights, and the
  // plan reads it instead of B: Compile copies B as it is when Compile is
  // called (writes to B still in flight on another stream must be finished
  // first) and waits for the copy; after changing B's values, call
  // Plan::RepackWeights.
  bool pack_weights = false;
  // On the narrow kernel with one consumer warpgroup (the default at 1-16
  // rows), a node of 1 or 2 rows whose A is exactly another node's output
  // (the same view, bf16), when that node's 32-column tiles are one wave at
  // most (a producer of several waves finished most of its tiles long
  // before: there the handoff measured slower), reads it from a tagged
  // copy the producer writes beside its output:
  // 8-byte words of two values and the launch's epoch, which the consumer
  // polls directly instead of waiting for the producer's tile flag and then
  // loading A (ops/kernel/narrow_config.h, kTaggedMaxRows): the 8-layer
  // 4096 chain at one token 75.5-76.9 us instead of 84.8-85.2, at two 82.6
  // instead of 84.6-85.0 (bench/NOTES.md v1.34).
  // Costs device memory of twice that output (M x N bf16 values in 4 x M x N
  // bytes). Explain lists the handoffs. false: every dependency through
  // tile flags.
  bool tagged_handoff = true;
  // Launches overlap the end of the kernel before them on the stream
  // (programmatic dependent launch): the plan's CTAs start on the SMs that
  // kernel's CTAs leave, and read nothing it writes until it has ended; on
  // the narrow kernel, packed weights (pack_weights) start streaming before
  // that. Back to back (no event between launches), the one-token MLP block
  // 4096/14336 takes 80.8-80.9 us a launch instead of 84.9-85.7 (bench/
  // NOTES.md v1.27). false: every launch starts once the stream has drained.
  // Either way a plan lets the kernel after it start early if that kernel is
  // launched with programmatic stream serialization: such a kernel must call
  // cudaGridDependencySynchronize before it reads what the plan writes (the
  // CUDA rule for that attribute; kernels launched without it just wait).
  bool overlap_launches = true;
  // A device spin wait on a dependency flag gives up after this long and
  // reports a time-out; the scheduler's waits on a held job's inputs and on
  // the first fetches (downstream of some dependency wait) after four times
  // this long. Waits on a CTA's own rings have no limit: after a time-out
  // every role drains. 1 to kMaxSpinTimeoutNs.
  int64_t spin_timeout_ns = 2'000'000'000;
  // Record every job's timeline on the device (Plan::Timeline). Costs a few
  // global stores per job, and the store thread waits for each tile's stores
  // to complete before the next job; off for production launches.
  bool trace = false;
};

// One job on one CTA of its cluster, from a traced launch (CompileOptions::
// trace). Times in microseconds from the launch's first job fetch; %globaltimer
// ticks about once a microsecond. A negative time: the event did not happen
// (a CTA whose tile lies outside the output stores nothing).
struct JobTrace {
  int job = -1;   // queue index
  int rank = 0;   // CTA of the cluster
  int node = -1;  // graph node
  int sm = -1;
  bool reduce = false;     // a split-K reduce job
  // A gemm job's part of K where its node splits K: its split, 0 the first
  // (the last sums the others' partials, or a reduce job does); -1 where it
  // covers all of K (an unsplit node, a whole tile) and for reduce jobs.
  int part = -1;
  double fetched = -1;     // the consumers received the job
  double data_ready = -1;  // first A slot full (gemm) / every partial published (reduce)
  double mma_done = -1;    // main loop (or partial sum) finished
  double staged = -1;      // last output panel handed to the store thread
  double published = -1;   // stores complete, tile flag released
  // Time this CTA's A loader spent checking and waiting for the job's A
  // producers, in us (gemm jobs; 0 without producers, -1 for reduce jobs).
  double a_dependency = -1;
};

// Why a launch stopped early: filled in by the kernel when a bounded wait ran
// out, returned to the host inside a DeadlineExceeded status.
struct TimeoutRecord {
  int sm = -1;
  int job = -1;          // queue index of the job that waited
  int flag = -1;         // flag index waited on (-1: not a dependency flag)
  uint32_t expected = 0; // epoch the waiter needed
  uint32_t seen = 0;     // value it last read
  std::string what;      // the wait that timed out
};

// Move-only. A moved-from Plan can be assigned to or destroyed; its
// Status-returning methods return FailedPrecondition, Explain says what it
// is, and graph(), schedule(), options(), grid_clusters() and kernel() must
// not be called.
//
// Threads: Runtime::Compile may run on several threads at once; a Plan's
// methods must not (one thread at a time per plan). Compile, Synchronize
// after a time-out, RepackWeights and ~Plan allocate, set or free device
// memory, so none of them may run while a thread captures a CUDA graph in
// the global capture mode (Launch alone may be captured).
class Plan {
 public:
  Plan(Plan&&) noexcept;
  Plan& operator=(Plan&&) noexcept;
  ~Plan();

  // Enqueues one launch of the persistent kernel on `stream`. Needs no host
  // work beyond the launch itself, so it can be captured in a CUDA graph.
  // Launch and Synchronize need the plan's device current on the calling
  // thread (cudaSetDevice; FailedPrecondition otherwise), and `stream` of
  // that device. One plan's launches must run one after another (one stream,
  // or streams ordered by events): its epoch, job queue, flags and split-K
  // workspace serve one launch at a time, and two of its launches running at
  // once give unspecified outputs or a time-out.
  // Two plans may be launched at once (on two streams). Each launch asks for
  // one CTA an SM, so the GPU runs their CTAs as SMs free up; a launch
  // finishes as long as all of its CTAs can become resident in time. Its CTAs
  // wait on one another (its producers, the narrow kernel's first jobs, which
  // go by CTA index, and where the tiled kernel's first wave leaves clusters
  // idle, every cluster's first fetch), so beside work that keeps some of its
  // CTAs from starting for longer than CompileOptions::spin_timeout_ns (a
  // persistent kernel that does not end, a launch that waits on this one) it
  // times out (DeadlineExceeded) instead.
  absl::Status Launch(cudaStream_t stream = nullptr);
  // Waits for `stream`; turns a device time-out into DeadlineExceeded naming
  // the SM, job, flag, expected and seen values (and a job the launched
  // kernel has no path for, a loom bug, into Internal). After a time-out
  // every launch of the plan runs its jobs through without waiting for
  // producers (its outputs are unspecified) until Synchronize has reported
  // it; then the plan runs normally again.
  absl::Status Synchronize(cudaStream_t stream = nullptr);
  // Copies B again into the plan's packed weights (CompileOptions::
  // pack_weights), enqueued on `stream`: call it after changing the values of
  // a packed node's B, and keep it apart from launches of this plan on other
  // streams (it rewrites what they read). OK and nothing to do when the plan
  // packed no weights; FailedPrecondition for a host-only plan, and, as
  // Launch, when the plan's device is not current.
  absl::Status RepackWeights(cudaStream_t stream = nullptr);
  // The record of the last time-out, if one happened.
  std::optional<TimeoutRecord> last_timeout() const;
  // The job timelines of the last launch (call after Synchronize).
  // FailedPrecondition unless the plan was compiled with trace = true.
  absl::StatusOr<std::vector<JobTrace>> Timeline() const;
  // A per-node summary of Timeline(): when the node's jobs ran and the
  // median wait for data, main loop and epilogue per job.
  absl::StatusOr<std::string> ExplainTimeline() const;

  // A readable account of the schedule: nodes, tile and cluster shapes, job
  // counts, queue order, dependencies.
  std::string Explain() const;

  const GemmGraph& graph() const;
  const sched::Schedule& schedule() const;
  const CompileOptions& options() const;
  int grid_clusters() const;  // clusters the kernel is launched with
  // False for a moved-from Plan (whose accessors must not be called).
  bool valid() const { return impl_ != nullptr; }
  // The kernel the plan runs on: KernelChoice::kNarrow or kTiled (what
  // CompileOptions::kernel chose).
  KernelChoice kernel() const;

  struct Impl;

 private:
  friend class Runtime;
  friend absl::Status internal::SuppressFlagPublishingForTesting(Plan& plan, int node);
  friend absl::Status internal::PublishFlagsForTesting(Plan& plan, int node, int except_tile);
  explicit Plan(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class Runtime {
 public:
  // A runtime on GPU `device_ordinal`. FailedPrecondition if there is no such
  // GPU or it is not Hopper (sm_90).
  static absl::StatusOr<Runtime> Create(int device_ordinal = 0);
  // A host-only runtime for a described device: Compile and Explain work,
  // Launch returns FailedPrecondition.
  static Runtime ForDescription(DeviceDescription device);

  // Validates the graph and lowers it into a Plan. InvalidArgument for a bad
  // graph, and (on a GPU runtime) for a view the device cannot reach: host
  // memory CUDA neither allocated nor registered, on a device that does not
  // read pageable memory, or a view running past the end of the allocation
  // it starts in (what the driver cannot tell about a view is not refused);
  // FailedPrecondition when the options exceed the device's limits (shared
  // memory per block, co-resident clusters); ResourceExhausted when the
  // plan's workspace or packed weights do not fit. Allocates on the
  // runtime's device and leaves the calling thread's current device as it
  // was (the plan's Launch needs its device current: Plan::Launch).
  absl::StatusOr<Plan> Compile(const GemmGraph& graph, const CompileOptions& options = {}) const;

  const DeviceDescription& device() const { return device_; }
  bool has_gpu() const { return device_ordinal_ >= 0; }
  int device_ordinal() const { return device_ordinal_; }

 private:
  Runtime(DeviceDescription device, int device_ordinal)
      : device_(std::move(device)), device_ordinal_(device_ordinal) {}
  DeviceDescription device_;
  int device_ordinal_ = -1;
};

}  // namespace loom

#endif  // LOOM_RUNTIME_H_
