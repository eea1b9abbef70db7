// cta_context.cuh: what every role of one CTA shares, the shared-memory rings
// and barriers, and the protocols between them.
//
// Warp roles (384 threads, three warpgroups):
//   warpgroup 0 (producer, 56 registers)
//     warp 0 lane 0  A loader   (in lockstep mode: loads A and B)
//     warp 1 lane 0  B loader   (idle in lockstep mode)
//     warp 2 lane 0  store      (TMA stores of staged output, tile flags)
//     warp 3 lane 0  scheduler  (cluster rank 0 only: takes jobs from the queue)
//   warpgroups 1, 2 (consumers, 224 registers): wgmma + fused epilogue,
//     each owning 64 rows of the 128 x 256 (or 128 x 128) tile.
//
// Job slots (kJobSlots deep; slot data lives in every CTA of the cluster,
// job_empty only in rank 0):
//   scheduler: wait job_empty[s] (parity ph ^ 1), then until the last job it
//              fetched can start (scheduler_role.cuh)
//              -> idx = atomicAdd(cursor) -> st.shared::cluster idx into slot s of each CTA
//              -> mbarrier.arrive.release.cluster on job_full[s] of each CTA     (count 1)
//   readers:   wait job_full[s] (CTA scope: JobStream::Next says why that suffices)
//              -> one lane per warp reads idx -> that lane arrives on rank 0's
//                 job_empty[s] (CTA-scope release; count kJobReleasesPerCta *
//                 cluster) -> shfl to the warp
//   idx < 0 ends the stream. Phase bits flip when s wraps.
//
// Operand rings (A: a_stages slots, B: b_stages slots), per slot s:
//   loader:    wait x_empty[s] (parity ph ^ 1: a fresh barrier passes at once)
//              -> arrive.expect_tx(x_full[s], bytes of the whole slot)
//              -> TMA load (its half multicast to both CTAs when the cluster
//                 shares this operand, else both halves locally)
//   consumer:  wait x_full[s] (parity ph) -> wgmma ... commit
//              -> after wgmma.wait_group<1> says slot s's reads are done,
//                 the first thread of each consumer warpgroup arrives on
//                 x_empty[s] of EVERY CTA in the cluster (count
//                 kReleasingArrivalsPerCta * cluster): a peer may multicast
//                 into this slot, so it must wait for both CTAs' consumers.
//   Lockstep mode: A's barriers guard both operands (one expect_tx of A+B bytes).
//
// Staging (per consumer warpgroup w, kStagingBuffers panels):
//   consumer:  wait staging_empty[w][b] -> st.shared the panel -> fence.proxy.async.shared::cta
//              -> arrive staging_full[w][b]                     (count 128)
//   store:     wait staging_full[w][b] -> TMA store -> commit -> wait_group.read 0
//              -> arrive staging_empty[w][b]                    (count 1)
//   After a tile's last panel: cp.async.bulk.wait_group 0 (the writes are done,
//   not just the reads) -> fence.proxy.async.global (async-proxy writes visible
//   to generic-proxy readers) -> st.release.gpu flag = epoch.
//   Generic stores straight to global (the ragged last columns of C, direct
//   split-K partials) come before the consumer's arrival on staging_full,
//   whose release the store thread acquires before it releases the flag.
#ifndef LOOM_OPS_KERNEL_CTA_CONTEXT_CUH_
#define LOOM_OPS_KERNEL_CTA_CONTEXT_CUH_

#include <cuda/ptx>

#include <cstddef>
#include <cstdint>

#include "kernel_config.h"
#include "kernel_params.h"
#include "ptx.cuh"
#include "watchdog.cuh"

namespace loom::kernel {

// A position in a ring of barriers: the slot index and the parity of the
// phase being waited for. The parity flips each time the index wraps.
struct RingCursor {
  int stage = 0;
  uint32_t phase = 0;
  __device__ void Advance(int stages) {
    if (++stage == stages) {
      stage = 0;
      phase ^= 1;
    }
  }
  // Moves `count` slots on at once.
  __device__ void Skip(int count, int stages) {
    const int moved = stage + count;
    const int wraps = moved / stages;
    stage = moved - wraps * stages;
    phase ^= static_cast<uint32_t>(wraps) & 1u;
  }
  // The slot before this one (recomputed rather than carried: the main loop
  // has no registers to spare).
  __device__ int Previous(int stages) const { return stage == 0 ? stages - 1 : stage - 1; }
};

// Config: a TiledConfig (the tile's width and the plan's 16-bit type).
template <class ConfigT>
struct CtaContext {
  using Config = ConfigT;  // the tile the shared protocol code (JobStream, dependencies.cuh) works in
  const KernelParams& params;
  SmemBarriers* barriers;
  uint8_t* a_ring;    // [a_stages][kBlockM][kBlockK] 16-bit, 128B swizzle
  uint8_t* b_ring;    // [b_stages][kBlockN][kBlockK] 16-bit, 128B swizzle
  uint8_t* staging;   // [2 warpgroups][kStagingBuffers][64 rows][128 B], 128B swizzle
  int32_t* job_slots; // [kJobSlots]
  uint32_t rank;      // CTA rank in the cluster
  uint32_t epoch;     // this launch's epoch (flags equal to it are done)
  Watchdog watchdog;
  // Only the waits on other CTAs' work have a time limit (dependency and
  // partial flags, the scheduler's look at a held job and at the first
  // fetches). A role whose bounded wait gives up drains, as in the narrow
  // kernel (watchdog.cuh): it stops waiting for other CTAs and keeps its side
  // of every ring going, loads and all, until the job stream ends; the
  // scheduler hands out the rest of the queue (RunScheduler), whose jobs then
  // wait for nothing. So the waits on this CTA's own rings (and the peer's,
  // which drains too) need no clock: they are WaitPhase, a bare try-wait
  // loop. A draining loader still issues its TMA loads (of whatever the
  // producers left): with the cluster sharing an operand, each CTA's full
  // barrier expects the peer's multicast half, so a loader that skipped its
  // loads would leave the peer's barrier short. What the bounded ring waits
  // cost: spills in the main loop and 1-2% on the 200-row chain
  // (bench/NOTES.md v1.49, v1.58).

  // The job slots' waits in the shared protocol code (JobStream,
  // RunScheduler): no time limit, as for the rings. At cluster scope where
  // the peer wrote shared memory with generic stores before arriving (the
  // scheduler's wait for the releases of a slot that spans the cluster).
  static constexpr bool kPacesClaims = false;  // claim pacing is the narrow kernel's (RunScheduler)
  __device__ void WaitJobSlot(uint64_t* barrier, uint32_t parity, bool cluster_scope) const {
    if (cluster_scope) {
      WaitPhaseCluster(barrier, parity);
    } else {
      WaitPhase(barrier, parity);
    }
  }

  __device__ uint8_t* a_stage(int s) const { return a_ring + s * params.a_stage_bytes; }
  __device__ uint8_t* b_stage(int s) const { return b_ring + s * Config::kBStageBytes; }
  // The scheduler's tile (the shared protocol code asks the context: the
  // narrow kernel's rows vary by plan).
  __device__ static constexpr sched::TileShape tile() { return Config::tile(); }
  __device__ uint8_t* staging_panel(int warpgroup, int buffer) const {
    return staging +
           (warpgroup * KernelConfig::kStagingBuffers + buffer) * KernelConfig::kStagingPanelBytes;
  }

  // This CTA's trace record of queue entry `job`, or null when the plan does
  // not trace or the calling thread does not record.
  __device__ DeviceJobTrace* trace_of(int job, bool recorder) const {
    if (params.trace == nullptr || !recorder) return nullptr;
    return params.trace + job * params.cluster_size + rank;
  }

  // Releases a ring slot: arrives on the barrier at the same offset in every
  // CTA of the cluster.
  __device__ void ArriveOnEveryCta(uint64_t* barrier) const {
    const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(barrier));
    // Bounded by the compile-time maximum so the loop unrolls to a couple of
    // arrivals (a runtime bound compiled to a 16-way unrolled loop in the
    // main loop's release path).
#pragma unroll
    for (int r = 0; r < KernelConfig::kMaxClusterSize; ++r) {
      if (r < params.cluster_size) ptx::mbarrier_arrive_remote(ptx::mapa_shared_cluster(local, r));
    }
  }
};

// The launch's schedulers: one a cluster (the CTA of rank 0's).
__device__ inline uint32_t SchedulerCount(const KernelParams& params) {
  return gridDim.x / static_cast<uint32_t>(max(params.cluster_size, 1));
}

// Made by each scheduler (one a cluster) once its fetches are over (the end
// of the queue, or an abort): the last of the launch resets the queue cursor
// and publishes the epoch, so the next launch (a CUDA-graph replay too) needs
// no host work. No scheduler fetches after its call, and the next launch
// reads the state only once this one has ended (stream order), so nothing
// has to wait for it: made when the CTA ended instead, it put a fence and an
// atomic round trip on every launch's tail (the one-token chain and MLP
// block ~0.5-1.3 us slower, bench/NOTES.md v1.22).
// The abort flag is not reset: a wait may still time out after this call.
// It stays set until Plan::Synchronize reports the time-out and clears it,
// so a launch enqueued behind a timed-out one runs its jobs through without
// waiting for producers (every role drains: watchdog.cuh), and that
// Synchronize reports the time-out too.
__device__ inline void FinishFetching(const KernelParams& params, uint32_t epoch) {
  __threadfence();  // this thread's fetches, before its count
  if (atomicAdd(&params.state->finished_fetching, 1u) + 1 == SchedulerCount(params)) {
    // Every other scheduler's count (and its fetches and epoch read before
    // it), before these stores: the count's answer alone orders them only
    // through the branch, which the memory model does not count (found by
    // review). One fence a launch, by one thread, after its last fetch.
    __threadfence();
    params.state->cursor = 0;
    params.state->finished_fetching = 0;
    params.state->epoch = epoch;
  }
}

// Whether a flag value read in this launch says its tile is done: it holds
// this launch's epoch. Epochs only move forward, and the comparison is
// modular, so it stays right when the 32-bit epoch wraps.
__device__ __forceinline__ bool FlagDone(uint32_t value, uint32_t epoch) {
  return static_cast<int32_t>(value - epoch) >= 0;
}

// Waits until tile flag `flag_index` holds this launch's epoch (flags only
// move forward), then acquires it: what the producer wrote before releasing
// the flag is visible to this thread's later reads.
// NOTE: it polls with relaxed loads and then acquires with fence.acquire.gpu
// (a relaxed load that saw the release, then an acquire fence: an acquire
// pattern). Not a poll loop of ld.acquire.gpu: on sm_90 each one invalidates
// the SM's whole L1 (CCTL.IVALL), which kept every other role's job, node and
// dependency reads missing L1 for as long as a wait lasted (decode traces:
// ~1.2 us per A k-block, bench/NOTES.md v1.7). The fence also spares the
// second trip to L2 that a final ld.acquire made (no change measured on its
// own, v1.10; it lets WaitForPartials poll every split at once).
template <typename Ctx>
__device__ inline bool WaitForFlag(const Ctx& ctx, int flag_index, int job_index) {
  const uint32_t* flag = &ctx.params.flags[flag_index];
  const uint32_t epoch = ctx.epoch;
  const bool done = ctx.watchdog.SpinUntil(
      [&] {
        if (FlagDone(ptx::ld_relaxed_gpu(flag), epoch)) return true;
        __nanosleep(64);
        return false;
      },
      WaitKind::kDependencyFlag, job_index, flag_index, epoch, flag);
  if (done) cuda::ptx::fence(cuda::ptx::sem_acquire, cuda::ptx::scope_gpu);
  return done;
}

// Staging, consumer side (protocol above): waits until the buffer under the
// cursor is free, and hands a written one to the store thread (generic-proxy
// writes that the TMA store, async proxy, will read; then the arrival).
template <class Config>
__device__ __forceinline__ void PublishPanel(const CtaContext<Config>& ctx, int warpgroup, RingCursor& staging) {
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
  cuda::ptx::mbarrier_arrive(&ctx.barriers->staging_full[warpgroup][staging.stage]);
  staging.Advance(KernelConfig::kStagingBuffers);
}

template <class Config>
__device__ __forceinline__ void WaitForStaging(const CtaContext<Config>& ctx, int warpgroup,
                                               const RingCursor& staging) {
  WaitPhase(&ctx.barriers->staging_empty[warpgroup][staging.stage], staging.phase ^ 1);
}

// Stamps one event of a job's trace (CompileOptions::trace).
template <typename Ctx>
__device__ inline void RecordTrace(const Ctx& ctx, int job, bool recorder, uint64_t DeviceJobTrace::*event) {
  if (DeviceJobTrace* trace = ctx.trace_of(job, recorder)) trace->*event = ptx::globaltimer();
}

// Starts a job's trace when its consumer fetched it: clears every event of
// the last launch but the A loader's a_dependency_ns (the loader may have
// finished this job already), stamps `fetched` and the SM.
template <typename Ctx>
__device__ inline void StartTrace(const Ctx& ctx, int job, bool recorder) {
  if (DeviceJobTrace* trace = ctx.trace_of(job, recorder)) {
    trace->data_ready = trace->mma_done = trace->staged = trace->published = 0;
    trace->fetched = ptx::globaltimer();
    trace->sm = static_cast<int32_t>(ptx::smid());
  }
}

// The stream of job indices a role of this CTA receives from the scheduler.
class JobStream {
 public:
  // The next queue index, or -1 at the end of the queue (or on abort). Called
  // by every thread of the role. In each calling warp one lane (the lowest
  // active) reads the slot, frees it (one release per warp,
  // Config::kJobReleasesPerCta; in rank 0 where the slots span a cluster,
  // Config::kJobSlotsAcrossCluster) and hands the index to the others.
  // NOTE: one reader per warp, the thread that releases: its read precedes its
  // own release in program order, so the scheduler's next write to the slot
  // cannot overtake it. With every lane reading and lane 0 releasing after a
  // __syncwarp, compute-sanitizer racecheck reported WAR hazards on the slot
  // (v1.9, two job slots).
  // NOTE: the wait acquires and the release releases at CTA scope, also where
  // the slots span a cluster. The slot is a word of this CTA's shared memory
  // (no cache holds it); the scheduler's st.shared::cluster to it is
  // performed at cluster scope before its release.cluster arrival completes
  // the phase this wait observes, and the read follows the wait in program
  // order. The release follows a read that has returned its value (the
  // arrival is under `index >= 0`), as the ring releases follow reads
  // completed by wgmma.wait_group (ptx::mbarrier_arrive_remote). What cluster
  // scope cost:
  // on sm_90 an acquire at cluster scope empties the SM's L1 (CCTL.IVALL
  // after the try_wait in the SASS), so every role's fetch threw out the
  // job, node and dependency records every role reads from L1, and a release
  // at cluster scope waits for the thread's earlier stores (a consumer
  // warp's, after its epilogue). On the narrow kernel at CTA scope: the
  // 8-layer chain at one token 87.9-88.4 us against 91.1-91.5 packed, the
  // MLP block at 32 tokens 98.1-98.5 against 101.7-102.0 (bench/NOTES.md
  // v1.25). On the tiled kernel at 8192 tokens: from a tile's staged output
  // to the next job's fetch 0.45 us (median, traced) against 1.00, and
  // 8192 x 28672 x 4096 0.979-0.981 of cuBLAS against 0.950-0.962 (v1.54).
  template <typename Ctx>
  __device__ int Next(const Ctx& ctx) {
    const int s = cursor_.stage;
    ctx.WaitJobSlot(&ctx.barriers->job_full[s], cursor_.phase, /*cluster_scope=*/false);
    const unsigned lanes = __activemask();
    const int reader = __ffs(lanes) - 1;
    int index = 0;
    if (static_cast<int>(threadIdx.x % 32) == reader) {
      index = *reinterpret_cast<volatile int32_t*>(&ctx.job_slots[s]);
      if (index >= 0) {
        if constexpr (Ctx::Config::kJobSlotsAcrossCluster) {
          const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(&ctx.barriers->job_empty[s]));
          ptx::mbarrier_arrive_remote(ptx::mapa_shared_cluster(local, 0));
        } else {
          cuda::ptx::mbarrier_arrive(&ctx.barriers->job_empty[s]);
        }
      }
    }
    index = __shfl_sync(lanes, index, reader);
    cursor_.Advance(Ctx::Config::kJobSlots);
    return index;
  }

 private:
  RingCursor cursor_;
};

// The CTA tile a job gives this CTA, and whether any of it is inside the output.
struct CtaWork {
  const sched::TileJob* job;
  const KernelNode* node;
  int32_t m_block;
  int32_t n_block;
  bool in_range;
};

template <typename Ctx>
__device__ inline CtaWork ResolveJob(const Ctx& ctx, int index) {
  const sched::TileJob* job = &ctx.params.queue[index];
  const KernelNode* node = &ctx.params.nodes[job->node];
  const sched::CtaTile tile = sched::CtaTileOf(*job, node->schedule.share, static_cast<int>(ctx.rank));
  const bool in_range = tile.m_block < node->schedule.m_blocks && tile.n_block < node->schedule.n_blocks;
  return CtaWork{job, node, tile.m_block, tile.n_block, in_range};
}

// The plan's tensor maps live in global memory (KernelNode, copied there by
// the host when the plan is compiled), not in the kernel's parameters, so a
// thread acquires a map through the tensormap proxy before its TMA
// operations use it (HOPPER.md; the PTX ISA's fence.proxy.tensormap::generic),
// at system scope since the host wrote it. AcquireTensorMaps fences `node`'s
// `maps`; the narrow kernel's roles call it when their jobs move to another
// node.
template <int kMaps>
__device__ __forceinline__ void AcquireTensorMaps(const KernelNode& node,
                                                  const CUtensorMap KernelNode::* const (&maps)[kMaps]) {
#pragma unroll
  for (int i = 0; i < kMaps; ++i) {
    cuda::ptx::fence_proxy_tensormap_generic(cuda::ptx::sem_acquire, cuda::ptx::scope_sys, &(node.*maps[i]),
                                             cuda::ptx::n32_t<128>{});
  }
}

// The tiled kernel's roles fence every node's `maps` once, before their
// first job. Fenced at each change of node instead, the 128-token MLP block
// took 114.4-114.5 us against 111.3-112.3 without fences and 111.9-112.5
// this way (bench/NOTES.md v1.76): there a CTA's jobs change node at every
// job, and the fences sat between one job and the next. (A role fences 2
// to 4 maps a node, one after another: a graph of many nodes pays for them at
// the start of every launch, not measured past 8 nodes.)
template <int kMaps>
__device__ __forceinline__ void AcquireEveryNodesTensorMaps(const KernelParams& params,
                                                          const CUtensorMap KernelNode::* const (&maps)[kMaps]) {
  for (int n = 0; n < params.num_nodes; ++n) AcquireTensorMaps(params.nodes[n], maps);
}

// Asks L2 for the job queue and the node records past their tensor maps
// (schedules, epilogue fields), and the TMA unit for each node's `maps`, one
// warp at the start of a launch: after a launch has streamed its weights
// through L2 they are gone, and the first job of every role reads them one
// round trip after another (queue entry, node, descriptor). Nodes that load
// nothing (M, N or K of 0) have no A or B maps (plan_resources.cc) and are skipped.
// NOTE: with this and the scheduler's first fetch beside the epoch read, the
// one-token MLP block (narrow kernel) took 99.5-99.7 us against 100.7-100.8
// (bench/NOTES.md v1.19).
template <int kMaps>
__device__ inline void PrefetchPlanRecords(const KernelParams& params, int lane,
                                           const CUtensorMap KernelNode::* const (&maps)[kMaps]) {
  constexpr int kLine = 128;
  const int queue_lines = (params.num_jobs * static_cast<int>(sizeof(sched::TileJob)) + kLine - 1) / kLine;
  for (int l = lane; l < queue_lines; l += 32) {
    ptx::prefetch_global_l2(reinterpret_cast<const uint8_t*>(params.queue) + l * kLine);
  }
  constexpr int kFirstLine = static_cast<int>(offsetof(KernelNode, schedule)) / kLine;
  constexpr int kLines = (static_cast<int>(sizeof(KernelNode)) + kLine - 1) / kLine;
  for (int n = lane; n < params.num_nodes; n += 32) {
    const KernelNode& node = params.nodes[n];
    for (int l = kFirstLine; l < kLines; ++l) {
      ptx::prefetch_global_l2(reinterpret_cast<const uint8_t*>(&node) + l * kLine);
    }
    const sched::NodeSchedule& schedule = node.schedule;
    if (schedule.m == 0 || schedule.n == 0 || schedule.k == 0) continue;
#pragma unroll
    for (int i = 0; i < kMaps; ++i) ptx::prefetch_tensormap(&(node.*maps[i]));
  }
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_CTA_CONTEXT_CUH_
