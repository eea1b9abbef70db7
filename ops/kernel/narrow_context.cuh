// narrow_context.cuh: the narrow decode kernel's roles and protocol (the
// kernel itself: narrow_gemm.cu), and NarrowContext, what each role reads.
//
// One CTA per SM, no clusters, 256 or 384 threads (one consumer warpgroup
// or two, CompileOptions::narrow_consumers):
//   warpgroup 0: warp 0 the A loader (every lane polls flags, lane 0 issues
//                the loads), warp 1 lane 0 the B loader (a tensor load a
//                stage, or one bulk copy a stage from packed weights:
//                packed_layout.h), warp 2 lane 0 the
//                scheduler, warp 3 lane 0 the publisher;
//   warpgroup 1 (and 2): the consumer(s); two take the CTA's jobs in turn
//                (the first, third, ... job the first; ConsumeJobs), so that
//                one warpgroup's epilogue runs beside the other's main loop
//                (but with the tall pair split, 65-128 rows: both multiply
//                every job, 64 rows each);
//                Each job: a 32-column tile over the job's whole K (for
//                at most 16 rows on mma.sync with the operands swapped,
//                RunMmaSyncJob; else on wgmma with both operands from shared
//                memory: 17-32 rows m64n64k16 over two k-blocks at once,
//                RunPairedWgmmaJob, 33-64 rows m64n32k16, RunWgmmaJob; or,
//                with the pair split, a 64-column tile over half of K,
//                m64n64k16, RunPairSplitJob, whose first half hands the
//                publisher its partial sums, not a tile), then
//                the fused epilogue straight from registers into C (no
//                staging, no TMA store), then the tile to the publisher.
// Rings: A and B each a ring of stages of kKBlocksPerStage k-blocks with full
// / empty barriers, as in cta_context.cuh, but local to the CTA: each warp of
// the consumer whose job the stage belongs to releases it (lane 0) once its
// reads are done; the other consumer moves its cursors past the job's stages.
// Publishing a tile (a ring of kJobSlots handoffs):
//   consumer warp: its generic stores to C; __syncwarp (orders the lanes'
//     stores before lane 0's later operations); lane 0 waits publish_empty,
//     arrives on publish_full (release, CTA scope); on to the next job.
//   publisher: waits publish_full (4 arrivals, 8 with the tall pair split;
//     acquire, CTA scope), then
//     st.release.gpu of the flag (cumulative: it releases the stores it
//     acquired), then arrives on publish_empty.
// A consumer node's A loader acquires the flag and fences the async proxy
// before its TMA loads read C (dependencies.cuh).
// The tagged handoff (NarrowConfig::kTaggedMaxRows; 1-2 rows, one consumer
// warpgroup): the consumer warps also write C as tagged words, two bf16 and
// the launch's epoch in one relaxed 64-bit store each (SwappedEpilogue), and
// the A loader of a node whose A is that C polls those words and writes the
// data into its A slots itself (LoadTaggedStages): a word that shows the
// epoch carries its data, so nothing waits for the stores to complete. The
// flag is still released as above (the scheduler's look-ahead, residual and
// bias readers, other consumers use it).
// NOTE: the release waits for the stores before it to complete (~2 us while
// HBM is busy, traced); made by a consumer thread, that wait stalled the
// consumer's next job.
// After a time-out (watchdog.cuh) the roles drain rather than leave. The
// waits that can give up by themselves are those on other CTAs' work
// (dependency flags, tagged copies, the scheduler's look at a held job),
// each bounded by the watchdog, and each gives up within microseconds once
// any wait of the launch has. A loader whose wait gave up goes on serving
// its ring without data: each stage it owes becomes a plain arrival on the
// full barrier, and it waits for no producer again. The consumers and the
// publisher go on as usual (storing whatever the stages held: a timed-out
// launch's outputs are unspecified), and the scheduler hands out the rest of
// the queue. So every ring phase a role waits for comes, and the ring waits
// (WaitPhase) have no clock: a bounded one cost a narrow CTA 7-12%
// (bench/NOTES.md v1.47-v1.48).
// NOTE: what that gives up: a ring phase that never comes for a reason of
// the kernel's own (a load's byte count that does not match its barrier's,
// say) hangs the launch instead of timing out.
// Consecutive launches overlap (programmatic dependent launch,
// LaunchNarrowGemm's overlap_previous): a launch's CTAs start on the SMs the
// previous kernel's CTAs leave. Until that kernel has ended (every role's
// NarrowContext::AwaitPreviousLaunch) they touch only shared memory, the
// plan's records and packed weights: the first wave of jobs is static (CTA i
// takes queue index i), so the B loader knows its first job and streams its
// packed weights into the ring under the previous launch's tail.
#ifndef LOOM_OPS_KERNEL_NARROW_CONTEXT_CUH_
#define LOOM_OPS_KERNEL_NARROW_CONTEXT_CUH_

#include <cuda/ptx>

#include "cta_context.cuh"
#include "narrow_config.h"

namespace loom::kernel {

// The narrow kernel's counterpart of CtaContext: what the shared protocol
// code (JobStream, ResolveJob, dependencies.cuh, RunScheduler) reads.
struct NarrowContext {
  using Config = NarrowConfig;
  const KernelParams& params;
  NarrowBarriers* barriers;
  uint8_t* a_ring;
  uint8_t* b_ring;
  float4* partials;  // [consumer warpgroup][4 warps][4 pairs][32 lanes]; none at 33-64 rows (UsesPartials)
  int32_t* job_slots;
  uint32_t rank;   // 0: no clusters
  uint32_t epoch;  // this launch's epoch, once AwaitPreviousLaunch has read it
  Watchdog watchdog;
  int32_t rows_per_block;  // the scheduler's tile.m: a constant but in the kShortRowBlocks kernels
  int32_t tile_n;          // the scheduler's tile.n: a constant, NarrowConfig::TileN of the kernel's split
  // The job slots' waits in the shared protocol code (JobStream, RunScheduler;
  // this kernel's own ring waits call WaitPhase): no time limit, since every
  // role keeps reading and releasing slots until the job stream ends, even
  // after a time-out (a role whose bounded wait gives up drains: the top of
  // this file). No clusters here: the scope argument is always false.
  __device__ void WaitJobSlot(uint64_t* barrier, uint32_t parity, bool) const { WaitPhase(barrier, parity); }
  // Claim pacing (KernelParams::claim_stages; RunScheduler): whether the
  // scheduler may claim the job after `job`, its last: the B loader has
  // issued all but at most claim_stages stages of `job`, so that the claim
  // lands a little before the loader needs it rather than a whole job
  // ahead. The B loader never passes the last claimed job, so the word
  // cannot move past `job` before the next claim; it is a hint that orders
  // nothing (a volatile shared word), so compute-sanitizer's racecheck
  // reports its store and this load as hazards: on the tall pair split at
  // 65 rows, the only ones it reported (bench/NOTES.md v2.04). Every narrow
  // job has at least one k-block (Compile keeps nodes with K = 0 off this
  // kernel), so the loader writes it for every job.
  static constexpr bool kPacesClaims = true;
  __device__ bool LoaderNear(int job) const {
    return params.claim_stages == 0 || *reinterpret_cast<const volatile int32_t*>(&barriers->b_loader_near) == job;
  }
  // Set by the scheduler thread before it posts its first job (so before
  // the B loader can write it). NOTE: made in InitNarrowBarriers instead,
  // the store alone made ptxas spill more in eight of the kernels (8 / 24
  // bytes instead of 4 / 8 in four, 4 / 8 instead of none in four).
  __device__ void ResetLoaderNear() const { *reinterpret_cast<volatile int32_t*>(&barriers->b_loader_near) = -1; }
  // What the B loader tells LoaderNear after each stage it issues for job
  // `job`, `k_blocks_left` of whose k-blocks are still to come: one
  // predicated shared store and no state carried through its loop. (A
  // count of stages left stored on every stage made the two-consumer
  // kernels spill 8 / 24 bytes instead of 4 / 8: bench/NOTES.md v1.95.)
  __device__ void LoaderNearing(int job, int k_blocks_left) const {
    if (k_blocks_left <= params.claim_stages * NarrowConfig::kKBlocksPerStage) {
      *reinterpret_cast<volatile int32_t*>(&barriers->b_loader_near) = job;
    }
  }

  // Waits until the launch before this one on the stream has ended and its
  // writes are visible, then reads this launch's epoch. Every role calls it
  // before it touches memory a launch writes (flags, activations, outputs,
  // the queue cursor and epoch): with programmatic dependent launch (a
  // narrow plan's launches, LaunchNarrowGemm) this launch's CTAs start on
  // the SMs the previous launch's CTAs leave, while its last CTAs still run.
  // What may come first reads only what no launch writes: shared memory, the
  // plan's records and packed weights. Without a previous launch (or the
  // launch attribute) the wait returns at once.
  // Then lets the next launch start its CTAs as this one's leave. Only after
  // the wait: the next launch's first packed stages then cannot overtake a
  // kernel before this launch that wrote them (its CTAs can start only once
  // every CTA here has passed the wait).
  // The epoch comes from the scheduler thread (AwaitPreviousLaunchAsScheduler),
  // not from the plan's state: the last scheduler to finish fetching moves
  // the state's epoch on for the next launch (FinishFetching), and a role
  // that reads it late, as the B loader may (it streams packed weights before
  // its wait, and waits only when it must), would read the next launch's.
  // A scheduler reads it before it can finish fetching, so before any can.
  __device__ void AwaitPreviousLaunch() {
    cudaGridDependencySynchronize();
    WaitPhase(&barriers->epoch_ready, 0);
    epoch = barriers->epoch;
    cudaTriggerProgrammaticLaunchCompletion();
  }
  // The scheduler thread's: reads this launch's epoch and hands it on.
  __device__ void AwaitPreviousLaunchAsScheduler() {
    cudaGridDependencySynchronize();
    epoch = params.state->epoch + 1;
    barriers->epoch = epoch;
    cuda::ptx::mbarrier_arrive(&barriers->epoch_ready);
    cudaTriggerProgrammaticLaunchCompletion();
  }

  __device__ uint8_t* a_stage(int s) const { return a_ring + s * params.a_stage_bytes; }
  __device__ uint8_t* b_stage(int s) const { return b_ring + s * NarrowConfig::BStageBytes(tile_n); }
  // The scheduler's tile: m, the rows of the plan's row blocks (NarrowConfig::BlockRows);
  // n, NarrowConfig::TileN of the plan's split.
  __device__ sched::TileShape tile() const { return {rows_per_block, tile_n, NarrowConfig::kBlockK}; }
  __device__ DeviceJobTrace* trace_of(int job, bool recorder) const {
    if (params.trace == nullptr || !recorder) return nullptr;
    return params.trace + job;
  }
};

// kEveryLaneOnA (the tagged handoff's instantiation, whose A loader writes
// A slots with generic stores): every lane of the A loader and of the
// consumer warps arrives on the A ring's barriers itself, so that each
// lane's reads of a slot are released by its own arrival before the
// loader's stores into it (with one lane's arrival after a __syncwarp,
// compute-sanitizer racecheck reported each pair as a hazard: bench/NOTES.md
// v1.34-v1.35). kBothWarpgroups: the tall pair split's
// (NarrowConfig::TallPairSplit) or the wide split's, whose every job both
// consumer warpgroups read, release and hand over.
template <int kConsumers, bool kEveryLaneOnA, bool kBothWarpgroups = false>
__device__ void InitNarrowBarriers(NarrowBarriers* barriers, const KernelParams& params) {
  constexpr uint32_t kLanes = kEveryLaneOnA ? 32 : 1;
  constexpr uint32_t kReleasingWarps = NarrowConfig::ReleasingWarpsPerCta(kBothWarpgroups);
  for (int s = 0; s < params.a_stages; ++s) {
    cuda::ptx::mbarrier_init(&barriers->a_full[s], kLanes);
    cuda::ptx::mbarrier_init(&barriers->a_empty[s], kReleasingWarps * kLanes);
  }
  for (int s = 0; s < params.b_stages; ++s) {
    cuda::ptx::mbarrier_init(&barriers->b_full[s], 1);
    cuda::ptx::mbarrier_init(&barriers->b_empty[s], kReleasingWarps);
  }
  for (int s = 0; s < NarrowConfig::kJobSlots; ++s) {
    cuda::ptx::mbarrier_init(&barriers->job_full[s], 1);
    cuda::ptx::mbarrier_init(&barriers->job_empty[s], NarrowConfig::JobReleasesPerCta(kConsumers));
    cuda::ptx::mbarrier_init(&barriers->publish_full[s], kReleasingWarps);
    cuda::ptx::mbarrier_init(&barriers->publish_empty[s], 1);
  }
  for (uint64_t& turn : barriers->consumer_turn) cuda::ptx::mbarrier_init(&turn, NarrowConfig::kReleasingWarpsPerCta);
  cuda::ptx::mbarrier_init(&barriers->epoch_ready, 1);
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_NARROW_CONTEXT_CUH_
