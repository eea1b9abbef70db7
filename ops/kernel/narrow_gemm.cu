// narrow_gemm.cu: loom's narrow decode kernel, for plans whose every node has
// at most 64 rows, or up to 128 in two row blocks (why: narrow_config.h).
// Persistent like the tiled kernel (persistent_gemm.cu), with the same job
// queue, job slots, scheduler, dependency waits and watchdog
// (cta_context.cuh, dependencies.cuh, scheduler_role.cuh), and the same
// deadlock-freedom argument: jobs in queue order, every CTA co-resident, no
// finishing role waits on a later job.
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
//                one warpgroup's epilogue runs beside the other's main loop.
//                Each job: a 32-column tile over the job's whole K (for
//                at most 16 rows on mma.sync with the operands swapped,
//                RunMmaSyncJob; else on wgmma with both operands from shared
//                memory: 17-32 rows m64n64k16 over two k-blocks at once,
//                RunPairedWgmmaJob, 33-64 rows m64n32k16, RunWgmmaJob), then
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
//   publisher: waits publish_full (4 arrivals; acquire, CTA scope), then
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
#include "narrow_gemm.h"

#include <cuda/ptx>
#include <cuda_bf16.h>

#include <array>

#include "cta_context.cuh"
#include "dependencies.cuh"
#include "epilogue_role.cuh"
#include "scheduler_role.cuh"
#include "wgmma.cuh"

namespace loom::kernel {
namespace {

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
  // The job slots' waits in the shared protocol code (JobStream, RunScheduler;
  // this kernel's own ring waits call WaitPhase): no time limit, since every
  // role keeps reading and releasing slots until the job stream ends, even
  // after a time-out (a role whose bounded wait gives up drains: the top of
  // this file). No clusters here: the scope argument is always false.
  __device__ void WaitJobSlot(uint64_t* barrier, uint32_t parity, bool) const { WaitPhase(barrier, parity); }

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
  __device__ uint8_t* b_stage(int s) const { return b_ring + s * NarrowConfig::kBStageBytes; }
  // The scheduler's tile: m, the rows of the plan's row blocks (NarrowConfig::BlockRows).
  __device__ sched::TileShape tile() const { return {rows_per_block, NarrowConfig::kBlockN, NarrowConfig::kBlockK}; }
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
// v1.34-v1.35).
template <int kConsumers, bool kEveryLaneOnA>
__device__ void InitNarrowBarriers(NarrowBarriers* barriers, const KernelParams& params) {
  constexpr uint32_t kLanes = kEveryLaneOnA ? 32 : 1;
  for (int s = 0; s < params.a_stages; ++s) {
    cuda::ptx::mbarrier_init(&barriers->a_full[s], kLanes);
    cuda::ptx::mbarrier_init(&barriers->a_empty[s], NarrowConfig::kReleasingWarpsPerCta * kLanes);
  }
  for (int s = 0; s < params.b_stages; ++s) {
    cuda::ptx::mbarrier_init(&barriers->b_full[s], 1);
    cuda::ptx::mbarrier_init(&barriers->b_empty[s], NarrowConfig::kReleasingWarpsPerCta);
  }
  for (int s = 0; s < NarrowConfig::kJobSlots; ++s) {
    cuda::ptx::mbarrier_init(&barriers->job_full[s], 1);
    cuda::ptx::mbarrier_init(&barriers->job_empty[s], NarrowConfig::JobReleasesPerCta(kConsumers));
    cuda::ptx::mbarrier_init(&barriers->publish_full[s], NarrowConfig::kReleasingWarpsPerCta);
    cuda::ptx::mbarrier_init(&barriers->publish_empty[s], 1);
  }
  for (uint64_t& turn : barriers->consumer_turn) cuda::ptx::mbarrier_init(&turn, NarrowConfig::kReleasingWarpsPerCta);
  cuda::ptx::mbarrier_init(&barriers->epoch_ready, 1);
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}

// Loads the k-blocks [kb0, kb0 + kKBlocksPerStage) of rows [row0, + tile_bytes
// / 128) of an operand into a ring stage, one tile_bytes tile per k-block.
// `kblock_map` (the operand's K is a multiple of 64: runtime.cc encodes it
// with EncodeKBlockMap) loads them all at once; otherwise each k-block is a
// load of its own. Either way TMA zero-fills what lies past K, whole k-blocks
// too, so the consumer can run every k-block of every stage.
// kWeights: B, read once a launch (twice with two row blocks, by jobs next
// to each other in the queue): the loads carry `policy`
// (ptx::l2_evict_first_policy), so the weights streaming through L2 do not
// evict the activations, flags and outputs the next layer reads (the
// one-token chain -1 to -2 us, bench/NOTES.md v1.23). With two row blocks
// an evict-normal policy measured no better (v1.33).
template <bool kWeights>
__device__ __forceinline__ void LoadStage(const CUtensorMap* map, bool kblock_map, uint8_t* stage, uint64_t* full,
                                          uint32_t tile_bytes, int kb0, int32_t row0, uint64_t policy = 0) {
  cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                       full, NarrowConfig::kKBlocksPerStage * tile_bytes);
  if (kblock_map) {
    if constexpr (kWeights) {
      ptx::cp_async_bulk_tensor_3d_l2_hint(stage, map, 0, row0, kb0, full, policy);
    } else {
      const int32_t coords[3] = {0, row0, kb0};
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, stage, map, coords, full);
    }
    return;
  }
  for (int j = 0; j < NarrowConfig::kKBlocksPerStage; ++j) {
    uint8_t* tile = stage + j * tile_bytes;
    if constexpr (kWeights) {
      ptx::cp_async_bulk_tensor_2d_l2_hint(tile, map, (kb0 + j) * NarrowConfig::kBlockK, row0, full, policy);
    } else {
      const int32_t coords[2] = {(kb0 + j) * NarrowConfig::kBlockK, row0};
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, tile, map, coords, full);
    }
  }
}

// Loads the B stage that starts at k-block kb0 of tile n_block from packed
// weights (packed_layout.h): one bulk copy of a block already
// laid out as LoadStage's tensor load would write it, zeros included; with
// the weights' `policy`, as LoadStage<true>.
__device__ __forceinline__ void LoadPackedStage(const uint8_t* packed_b, int64_t stages_per_tile, uint8_t* stage,
                                                uint64_t* full, int64_t n_block, int kb0, uint64_t policy) {
  cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                       full, uint32_t{NarrowConfig::kBStageBytes});
  ptx::cp_async_bulk_l2_hint(stage, packed_b + NarrowConfig::Packed().StageOffset(n_block, kb0, stages_per_tile),
                             NarrowConfig::kBStageBytes, full, policy);
}

// Whether the node's operands have k-block maps (KernelNodesOf in runtime.cc).
__device__ __forceinline__ bool HasKBlockMaps(const sched::NodeSchedule& schedule) {
  return schedule.k % NarrowConfig::kBlockK == 0;
}

// The tagged handoff's words of one poll (LoadTaggedStages) for a node of
// kRows rows: a window of the next kStages stages (their first `stages`),
// in each row chunk t of 32 pairs (one a lane; chunk t is k-block t % 4 of
// stage t / 4): kRows x 16 words a lane.
template <int kRows>
struct TaggedPoll {
  static constexpr int kKBlocks = NarrowConfig::kKBlocksPerStage;
  static constexpr int kStages = NarrowConfig::kTaggedStagesPerPoll;
  static constexpr int kChunks = kStages * kKBlocks;
  static constexpr int kPairsPerChunk = NarrowConfig::kBlockK / 2;
  static_assert(kPairsPerChunk == 32 && kStages >= 1);
  const uint64_t* first;  // this lane's word of row 0, chunk 0
  int32_t pitch;          // words a row of the tagged copy
  int32_t pairs_left;     // this lane's pairs of a row from `first` to K's end
  int stages;
  uint64_t words[kRows][kChunks];

  __device__ bool Valid(int t) const { return t / kKBlocks < stages && kPairsPerChunk * t < pairs_left; }

  // Reads every valid word, all loads in flight together (a word past K or
  // past the window's stages reads as a zero pair tagged `epoch`); returns
  // how many of the window's stages, from its first, have every word (of
  // every lane) showing `epoch`.
  __device__ int Read(uint32_t epoch) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const uint64_t* row = first + r * pitch;
#pragma unroll
      for (int t = 0; t < kChunks; ++t) {
        words[r][t] = Valid(t) ? ptx::ld_relaxed_gpu_b64(row + kPairsPerChunk * t) : uint64_t{epoch} << 32;
      }
    }
    int ready = kStages;
#pragma unroll
    for (int t = kChunks - 1; t >= 0; --t) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (!FlagDone(static_cast<uint32_t>(words[r][t] >> 32), epoch)) ready = t / kKBlocks;
      }
    }
    return static_cast<int>(__reduce_min_sync(0xffffffffu, static_cast<uint32_t>(min(ready, stages))));
  }

  // The first pair (of a row, from the window's first chunk; lane + 32 t)
  // whose word this lane last read without `epoch`, and its tag; UINT32_MAX:
  // none.
  __device__ uint32_t Missing(uint32_t epoch, int lane, uint32_t* tag) const {
#pragma unroll
    for (int t = 0; t < kChunks; ++t) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        *tag = static_cast<uint32_t>(words[r][t] >> 32);
        if (!FlagDone(*tag, epoch)) return static_cast<uint32_t>(kPairsPerChunk * t + lane);
      }
    }
    return UINT32_MAX;
  }
};

// Reports a tagged-handoff wait that timed out (lane 0 decided; every lane
// calls): names the producer tile of the first column pair some lane last
// read without this launch's epoch, as a dependency-flag wait on that
// tile's flag, with the tag it saw. `pair0`: the window's first pair of a row.
template <int kRows>
__device__ void ReportTaggedTimeout(const NarrowContext& ctx, const KernelNode& node, int index, int lane,
                                    const TaggedPoll<kRows>& poll, int64_t pair0) {
  uint32_t tag = 0;
  const uint32_t missing = poll.Missing(ctx.epoch, lane, &tag);
  const uint32_t first = __reduce_min_sync(0xffffffffu, missing);
  tag = __shfl_sync(0xffffffffu, tag, static_cast<int>(first % 32));
  if (lane != 0) return;
  int flag = -1;
  const int64_t column = 2 * (pair0 + first);  // of A: the first one missing
  for (int d = 0; d < node.schedule.dependency_count && first != UINT32_MAX; ++d) {
    const sched::DependencyEdge& edge = ctx.params.dependencies[node.schedule.dependency_begin + d];
    if (edge.operand != static_cast<uint8_t>(sched::DependencyOperand::kA)) continue;
    const sched::NodeSchedule& producer = ctx.params.nodes[edge.producer].schedule;
    const int64_t producer_column = column + edge.col_offset;
    if (producer_column < 0 || producer_column >= producer.out_cols) continue;
    // The A edge whose producer writes that column (each column has one:
    // TaggedHandoffsOf).
    flag = sched::OutputFlagIndex(producer, 0, static_cast<int>(producer_column / producer.out_tile_n));
    break;
  }
  ctx.watchdog.Report(WaitKind::kDependencyFlag, index, flag, ctx.epoch, tag);
}

// The A loader's stages of a job whose A is a tagged copy (KernelNode::
// tagged_a, NarrowConfig::kTaggedMaxRows) of kRows rows (one row block):
// TaggedPoll's window of stages a poll, polled until its first stage's
// words all show this launch's epoch; then each of the window's leading
// stages found so, in turn, once its slot is free: the lanes' bf16 pairs
// written where a TMA load of A would put them (128B swizzle; zeros past K,
// as TMA fills them), and the slot's full barrier; the next window starts
// at the first stage not handed over. Rows past M keep what the slot held:
// on the mma.sync path a token row of A meets only its own accumulator
// column, which the epilogue never stores. Returns the first k-block not
// handed over: the job's end, or where the poll gave up (the launch is
// aborting; the caller drains the rest).
template <int kRows>
__device__ int LoadTaggedStages(const NarrowContext& ctx, const KernelNode& node, const sched::TileJob& job,
                                int index, int lane, RingCursor& ring, bool traced, uint64_t& waited_ns) {
  using Poll = TaggedPoll<kRows>;
  constexpr int kKBlocks = NarrowConfig::kKBlocksPerStage;
  Poll poll;
  poll.pitch = static_cast<int32_t>(NarrowConfig::TaggedWordsPerRow(node.schedule.k));  // K < 2^22 (a TileJob's)
  const uint32_t tile_bytes = ctx.params.a_stage_bytes / kKBlocks;
  for (int kb0 = job.k_block_begin; kb0 < job.k_block_end;) {
    const int32_t pair0 = kb0 * Poll::kPairsPerChunk;
    poll.first = node.tagged_a + pair0 + lane;
    poll.pairs_left = poll.pitch - pair0 - lane;
    poll.stages = min(Poll::kStages, NarrowConfig::StagesOf(int{job.k_block_end} - kb0));
    const uint64_t wait_start = traced ? ptx::globaltimer() : 0;
    int ready = 0;
    if (!ctx.watchdog.SpinUntilAsWarp([&] { return (ready = poll.Read(ctx.epoch)) > 0; },
                                      [&] { ReportTaggedTimeout(ctx, node, index, lane, poll, pair0); })) {
      return kb0;
    }
    if (traced) waited_ns += ptx::globaltimer() - wait_start;
#pragma unroll
    for (int s = 0; s < Poll::kStages; ++s) {
      if (s == ready) break;
      WaitPhase(&ctx.barriers->a_empty[ring.stage], ring.phase ^ 1);
      const uint32_t slot = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.a_stage(ring.stage)));
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int c = 0; c < kKBlocks; ++c) {
          ptx::st_shared(slot + c * tile_bytes + SwizzledPanelOffset(r, 4 * lane),
                         static_cast<uint32_t>(poll.words[r][kKBlocks * s + c]));
        }
      }
      // The slot is TMA's again for another job's stage: these generic
      // writes come before that async-proxy one. Then each lane releases
      // its own stores (the full barrier counts 32 arrivals in this
      // kernel: kEveryLaneOnA).
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      cuda::ptx::mbarrier_arrive(&ctx.barriers->a_full[ring.stage]);
      ring.Advance(ctx.params.a_stages);
    }
    kb0 += ready * kKBlocks;
  }
  return job.k_block_end;
}

__device__ int LoadTaggedStages(const NarrowContext& ctx, const KernelNode& node, const sched::TileJob& job,
                                int index, int lane, RingCursor& ring, bool traced, uint64_t& waited_ns) {
  static_assert(NarrowConfig::kTaggedMaxRows == 2, "a case per row count");
  // 1 to kTaggedMaxRows rows (runtime.cc, TaggedHandoffsOf)
  return node.schedule.m == 1 ? LoadTaggedStages<1>(ctx, node, job, index, lane, ring, traced, waited_ns)
                              : LoadTaggedStages<2>(ctx, node, job, index, lane, ring, traced, waited_ns);
}

// The A loader, a whole warp: the epilogue's inputs once per job, then per
// stage A's producers (polled by every lane, CompleteGranules<32>) and the
// load (lane 0). Every decision to go on or give up is the warp's: lanes that
// waited on their own agree first (__all_sync, or lane 0's answer).
// Once a wait gives up (the launch is aborting) it drains: each stage it owes
// the consumers, of this job and of every later one the stream still brings,
// is a plain arrival on the full barrier once the slot is free, with no load
// and no wait for producers.
// kTaggedA: the tagged handoff's path is compiled in (the one-consumer
// default kernels, NarrowConfig::kTaggedMaxRows), and every lane arrives on
// the A full barrier (kEveryLaneOnA).
template <bool kTaggedA>
__device__ void RunNarrowALoader(const NarrowContext& ctx, int lane) {
  const bool issuer = lane == 0;
  const bool traced = ctx.params.trace != nullptr;
  const auto poll = [&](const FlagRun& run) { return CompleteGranules<32>(ctx, run, lane); };
  JobStream jobs;
  RingCursor ring;
  DependencyMemo memo;
  KnownARun known;
  bool draining = false;
  int fenced_node = -1;  // the node whose maps the issuer last acquired
  for (;;) {
    // Converged (a wait's lanes may leave it apart): Next reads the slot
    // once a warp, by the lanes active.
    __syncwarp();
    const int index = jobs.Next(ctx);
    if (index < 0) return;
    const CtaWork work = ResolveJob(ctx, index);
    const sched::TileJob job = *work.job;  // in registers: the asm below clobbers memory
    const KernelNode& node = *work.node;
    if (issuer && job.node != fenced_node) {
      constexpr const CUtensorMap KernelNode::*kMaps[] = {&KernelNode::a_map};
      AcquireTensorMaps(node, kMaps);
      fenced_node = job.node;
    }
    const sched::NodeSchedule& schedule = node.schedule;
    const int32_t row0 = work.m_block * ctx.tile().m;
    memo.Reset();
    known.Reset();
    if (!draining && schedule.dependency_count > 0 &&
        !__all_sync(0xffffffffu, WaitForEpilogueInputs(ctx, node, index, row0, work.n_block, memo))) {
      draining = true;
    }
    int kb_begin = job.k_block_begin;
    if constexpr (kTaggedA) {
      if (node.tagged_a != nullptr && !draining) {
        uint64_t waited_ns = 0;  // for the trace
        kb_begin = LoadTaggedStages(ctx, node, job, index, lane, ring, traced, waited_ns);
        if (kb_begin == job.k_block_end) {
          if (DeviceJobTrace* trace = ctx.trace_of(index, traced && issuer)) {
            trace->a_dependency_ns = static_cast<uint32_t>(waited_ns);
          }
          continue;
        }
        draining = true;  // the rest of the job's stages below
      }
    }
    int a_ready_end =
        !draining && sched::HasProducerOperand(node.schedule, sched::DependencyOperand::kA) ? kb_begin : job.k_block_end;
    if (a_ready_end == 0 && job.k_block_end == schedule.k_blocks && work.m_block < 2) {
      const KernelNode::FirstARun& first = node.first_a_run[work.m_block];
      if (first.granules > 0) known.Seed(schedule.a_wait_k_blocks, first);
    }
    const bool kblock_map = HasKBlockMaps(schedule);
    const uint32_t tile_bytes = ctx.params.a_stage_bytes / NarrowConfig::kKBlocksPerStage;
    uint64_t a_dependency_ns = 0;  // for the trace
    for (int kb0 = kb_begin; kb0 < job.k_block_end; kb0 += NarrowConfig::kKBlocksPerStage) {
      const int kb_end = min(kb0 + NarrowConfig::kKBlocksPerStage, int{job.k_block_end});
      while (a_ready_end < kb_end) {
        const uint64_t start = traced ? ptx::globaltimer() : 0;
        a_ready_end = WaitForAProducersAhead(ctx, node, index, row0, a_ready_end, job.k_block_end, poll, known);
        a_ready_end = __shfl_sync(0xffffffffu, a_ready_end, 0);
        if (a_ready_end < 0) {
          draining = true;
          a_ready_end = job.k_block_end;
        }
        if (traced) a_dependency_ns += ptx::globaltimer() - start;
      }
      WaitPhase(&ctx.barriers->a_empty[ring.stage], ring.phase ^ 1);
      if (issuer && !draining) {
        LoadStage<false>(&node.a_map, kblock_map, ctx.a_stage(ring.stage), &ctx.barriers->a_full[ring.stage],
                         tile_bytes, kb0, row0);
      } else if (issuer || kTaggedA) {
        // Draining (no bytes to expect), or the full barrier counts every
        // lane (kEveryLaneOnA), the issuer's arrival carrying the load's bytes.
        cuda::ptx::mbarrier_arrive(&ctx.barriers->a_full[ring.stage]);
      }
      ring.Advance(ctx.params.a_stages);
    }
    if (DeviceJobTrace* trace = ctx.trace_of(index, traced && issuer)) {
      trace->a_dependency_ns = static_cast<uint32_t>(a_dependency_ns);
    }
  }
}

// The B loader: the weights, as far ahead as the ring allows, across A's
// waits and across jobs, with at most params.b_in_flight stages in flight at
// once, whatever the ring's depth.
// NOTE: a job's loads used to start only once the previous job's had all
// landed (so that the next layer's prefetch would not compete with the last
// stages of a tile the next layer waits for). That pause cost more than it
// saved: without it the one-token MLP block took 95.1-95.5 us against
// 99.7-99.8 and the one-token chain 118.4-119.5 against 122.4-123.2; the
// 16-token MLP 101.7-102.0 against 101.0-101.2 (bench/NOTES.md v1.19).
// kPackedB: the plan packed some node's B (KernelNode::packed_b); without it
// the loader never looks (a separate instantiation: the branch alone cost the
// unpacked chain ~1 us, bench/NOTES.md v1.23).
// Once a wait for B's producers gives up it drains, as the A loader does:
// each stage it owes is a plain arrival on the full barrier.
template <bool kPackedB>
__device__ void RunNarrowBLoader(NarrowContext& ctx) {
  JobStream jobs;
  bool draining = false;
  bool waited = false;  // AwaitPreviousLaunch made
  RingCursor ring;
  RingCursor oldest;       // the oldest stage issued that may not have landed
  int in_flight = 0;       // stages issued since `oldest`, itself included
  // At most b_stages - 1: the slot of `oldest` is then refilled only after
  // the next load, so its full barrier's phase is still the one we wait for.
  const int window = min(ctx.params.b_in_flight, ctx.params.b_stages - 1);
  DependencyMemo memo;
  int known_node = -1;
  bool b_has_producers = false, kblock_map = false;
  const uint8_t* packed_b = nullptr;
  int64_t packed_stages_per_tile = 0;
  const uint64_t policy = ptx::l2_evict_first_policy();
  for (;;) {
    const int index = jobs.Next(ctx);
    if (index < 0) return;
    // The job's own tile (one CTA a cluster here: CtaTileOf is the job's
    // blocks), and what the B loader needs of its node, looked up when the
    // node changes: read at every job, behind the A loader's acquire fences
    // that empty L1, the records cost the one-token MLP ~0.6 us and the
    // 16-token one ~0.8 (bench/NOTES.md v1.20).
    const sched::TileJob job = ctx.params.queue[index];
    const KernelNode& node = ctx.params.nodes[job.node];
    if (job.node != known_node) {
      constexpr const CUtensorMap KernelNode::*kMaps[] = {&KernelNode::b_map};
      AcquireTensorMaps(node, kMaps);
      known_node = job.node;
      b_has_producers = sched::HasProducerOperand(node.schedule, sched::DependencyOperand::kB);
      kblock_map = HasKBlockMaps(node.schedule);
      if constexpr (kPackedB) {
        packed_b = node.packed_b;
        packed_stages_per_tile = NarrowConfig::Packed().StagesPerTile(node.schedule.k);
      }
    }
    // Packed weights no node writes may stream in before the previous launch
    // has ended (the first job's, the only one handed out before it has):
    // the next launch's first stages then land while this one's last CTAs
    // still run. Anything else waits for it.
    if (!waited && !(kPackedB && packed_b != nullptr && !b_has_producers)) {
      ctx.AwaitPreviousLaunch();
      waited = true;
    }
    const int32_t n_row0 = static_cast<int32_t>(job.n_block) * NarrowConfig::kBlockN;
    memo.Reset();
    for (int kb0 = job.k_block_begin; kb0 < job.k_block_end; kb0 += NarrowConfig::kKBlocksPerStage) {
      const int kb_end = min(kb0 + NarrowConfig::kKBlocksPerStage, int{job.k_block_end});
      if (b_has_producers && !draining &&
          !WaitForProducers(ctx, node, index, sched::DependencyOperand::kB, n_row0, n_row0 + NarrowConfig::kBlockN,
                            int64_t{kb0} * NarrowConfig::kBlockK, int64_t{kb_end} * NarrowConfig::kBlockK, memo)) {
        draining = true;
      }
      // A ring full of stages the consumers take only once the previous
      // launch has ended: wait for that first (a wait the watchdog does not
      // time, however long that launch still runs).
      if (!waited && !cuda::ptx::mbarrier_test_wait_parity(&ctx.barriers->b_empty[ring.stage], ring.phase ^ 1)) {
        ctx.AwaitPreviousLaunch();
        waited = true;
      }
      WaitPhase(&ctx.barriers->b_empty[ring.stage], ring.phase ^ 1);
      if (in_flight == window) {
        WaitPhase(&ctx.barriers->b_full[oldest.stage], oldest.phase);
        oldest.Advance(ctx.params.b_stages);
        --in_flight;
      }
      if (draining) {
        cuda::ptx::mbarrier_arrive(&ctx.barriers->b_full[ring.stage]);
      } else if (kPackedB && packed_b != nullptr) {
        LoadPackedStage(packed_b, packed_stages_per_tile, ctx.b_stage(ring.stage), &ctx.barriers->b_full[ring.stage],
                        job.n_block, kb0, policy);
      } else {
        LoadStage<true>(&node.b_map, kblock_map, ctx.b_stage(ring.stage), &ctx.barriers->b_full[ring.stage],
                        NarrowConfig::kBTileBytes, kb0, n_row0, policy);
      }
      ++in_flight;
      ring.Advance(ctx.params.b_stages);
    }
  }
}

// The publisher: per job, the consumer warps' handoff of the finished tile,
// then the release of its flag (protocol at the top of the file).
__device__ void RunNarrowPublisher(const NarrowContext& ctx) {
  JobStream jobs;
  RingCursor handoff;
  for (;;) {
    const int index = jobs.Next(ctx);
    if (index < 0) return;
    const CtaWork work = ResolveJob(ctx, index);
    WaitPhase(&ctx.barriers->publish_full[handoff.stage], handoff.phase);
    if (work.node->has_dependents) {
      const sched::NodeSchedule& schedule = work.node->schedule;
      ptx::st_release_gpu(&ctx.params.flags[sched::OutputFlagIndex(schedule, work.m_block, work.n_block)],
                          ctx.epoch);
    }
    RecordTrace(ctx, index, true, &DeviceJobTrace::published);
    cuda::ptx::mbarrier_arrive(&ctx.barriers->publish_empty[handoff.stage]);
    handoff.Advance(NarrowConfig::kJobSlots);
  }
}

// C[row][col] = value, in C's element type: the plan's 16-bit type kHalf or
// fp32.
template <ElementType kHalf>
__device__ __forceinline__ void StoreOutput(const EpilogueFields& node, ElementType out_type, int64_t row, int64_t col,
                                            float value) {
  uint8_t* c = static_cast<uint8_t*>(node.c);
  if (out_type == kHalf) {
    StoreScalar<kHalf>(c + (row * node.c_stride + col) * 2, value);
  } else {
    StoreScalar<ElementType::kFP32>(c + (row * node.c_stride + col) * 4, value);
  }
}

// The fused epilogue of one 64 x 32 tile, from this thread's 16 accumulators
// straight into C: out = activation(acc + bias) + residual, or for SwiGLU
// silu(gate + bias) * (up + bias) + residual (gate and up in adjacent
// accumulator columns), in that order, as in epilogue_role.cuh. Register
// 4c + 2h + e holds row 16 * warp + lane / 4 + 8h, column 8c + 2 * (lane % 4)
// + e (wgmma.cuh). Only rows inside M and the job's row block and columns
// inside the output are stored.
// It is built when the job starts and reads its bias and residual values as
// soon as they may be read (Prefetch: after the job's first A stage is full,
// so after the A loader waited for their producers), all while the main loop
// runs: read after it, the node's fields and then those values were two
// round trips to L2 (~2 us traced) between a tile's last wgmma and its flag.
// kHalf: the plan's 16-bit type (a bias, residual or C not of it is fp32).
template <ElementType kHalf>
class NarrowEpilogue {
 public:
  // block_m: the rows of the plan's row blocks (NarrowContext::tile).
  __device__ NarrowEpilogue(const CtaWork& work, int32_t block_m, int warp, int lane)
      : node_(*work.node),
        out_type_(work.node->out_type),
        row0_(int64_t{work.m_block} * block_m + warp * 16 + lane / 4),
        col0_(int64_t{work.n_block} * NarrowConfig::kBlockN + 2 * (lane % 4)) {
    // A row block shorter than the wgmma's 64 rows stores only its own: the
    // rows past it are the next tile's rows of A, not the next block's
    // (node_.m clamped, rather than a register of its own across the main
    // loop). A constant kBlockM folds this away.
    if (block_m < NarrowConfig::kBlockM) node_.m = min(node_.m, (int64_t{work.m_block} + 1) * block_m);
  }

  __device__ void Prefetch() {
    const bool swiglu = node_.activation == EpilogueActivation::kSwiGLU;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t col = col0_ + 8 * c + e;
        bias_[c][e] =
            node_.bias != nullptr && col < node_.n ? LoadAsFloat<kHalf>(node_.bias_type, node_.bias, col) : 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t row = row0_ + 8 * h;
          const int64_t out_col = swiglu ? (col0_ + 8 * c) / 2 : col;
          const bool used =
              node_.residual != nullptr && row < node_.m && out_col < node_.out_cols && (!swiglu || e == 0);
          residual_[h][c][e] =
              used ? LoadAsFloat<kHalf>(node_.residual_type, node_.residual, row * node_.residual_stride + out_col)
                   : 0.0f;
        }
      }
    }
  }

  __device__ void Store(const float (&acc)[16]) const {
    const bool swiglu = node_.activation == EpilogueActivation::kSwiGLU;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0_ + 8 * h;
      if (row >= node_.m) continue;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t col = col0_ + 8 * c;  // accumulator column of register 4c + 2h; 4c + 2h + 1 holds col + 1
        float v[2] = {acc[4 * c + 2 * h] + bias_[c][0], acc[4 * c + 2 * h + 1] + bias_[c][1]};
        if (swiglu) {
          v[0] = Silu(v[0]) * v[1];
        } else {
          v[0] = Activate(node_.activation, v[0]);
          v[1] = Activate(node_.activation, v[1]);
        }
        const int64_t out_col = swiglu ? col / 2 : col;
        const int outputs = swiglu ? 1 : 2;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (e >= outputs || out_col + e >= node_.out_cols) break;
          StoreOutput<kHalf>(node_, out_type_, row, out_col + e, v[e] + residual_[h][c][e]);
        }
      }
    }
  }

 private:
  EpilogueFields node_;  // m: the end of the job's rows (M, or its row block's end)
  ElementType out_type_;
  int64_t row0_;  // this thread's first row (16 * warp + lane / 4 of the tile)
  int64_t col0_;  // this thread's first accumulator column (2 * (lane % 4) of the tile)
  float bias_[4][2];         // [c][e], 0 without a bias or past N
  float residual_[2][4][2];  // [h][c][e], 0 without a residual or outside the output
};

// The epilogue of RunMmaSyncJob's swapped tiles: lane t of the warp for
// weight block wb and token block tb holds, in acc[i], token 8 * tb + 2 * (t %
// 4) + i % 2 (a row of C) and weight row 16 * wb + t / 4 + 8 * (i / 2) of the
// tile (an accumulator column). The fused ops as in NarrowEpilogue; for
// SwiGLU, gate and up are adjacent weight rows, so the lanes t and t + 4 hold
// them and the gate's lane computes the output.
// Where SwappedEpilogue writes its tagged copy (KernelNode::tagged_c): only
// in the tagged handoff's instantiation (NarrowConfig::Instantiation::
// kTaggedHandoff); elsewhere nothing, so that the other kernels' code stays
// as it was (reading tagged_c cost the two-consumer kernel 8 bytes of spill).
template <bool kTagged>
struct TaggedTarget {
  __device__ explicit TaggedTarget(const KernelNode&) {}
};
template <>
struct TaggedTarget<true> {
  __device__ explicit TaggedTarget(const KernelNode& node)
      : tagged_c(node.tagged_c), tagged_c_pitch(node.tagged_c_pitch) {}
  uint64_t* tagged_c;
  int32_t tagged_c_pitch;
};

template <bool kTagged, ElementType kHalf>
class SwappedEpilogue : private TaggedTarget<kTagged> {
  static_assert(!kTagged || kHalf == ElementType::kBF16, "tagged words hold bf16 pairs");
 public:
  __device__ SwappedEpilogue(const CtaWork& work, int32_t block_m, int weight_block, int token_block, bool active,
                            int lane)
      : TaggedTarget<kTagged>(*work.node),
        node_(*work.node),
        out_type_(work.node->out_type),
        active_(active),
        gate_lane_((lane / 4) % 2 == 0),
        row0_(int64_t{work.m_block} * block_m + 8 * token_block + 2 * (lane % 4)),
        col0_(int64_t{work.n_block} * NarrowConfig::kBlockN + 16 * weight_block + lane / 4) {}

  __device__ void Prefetch() {
    if (!active_) return;
    const bool swiglu = node_.activation == EpilogueActivation::kSwiGLU;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t col = col0_ + 8 * h;
      bias_[h] = node_.bias != nullptr && col < node_.n ? LoadAsFloat<kHalf>(node_.bias_type, node_.bias, col) : 0.0f;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t row = row0_ + e;
        const int64_t out_col = swiglu ? col / 2 : col;
        const bool used = node_.residual != nullptr && row < node_.m && out_col < node_.out_cols &&
                          (!swiglu || gate_lane_);
        residual_[h][e] =
            used ? LoadAsFloat<kHalf>(node_.residual_type, node_.residual, row * node_.residual_stride + out_col) : 0.0f;
      }
    }
  }

  // `epoch`: the launch's, for the tagged copy, which goes out first: the
  // next layer waits for it.
  __device__ void Store(const float (&acc)[4], uint32_t epoch) const {
    if constexpr (kTagged) {
      if (this->tagged_c != nullptr) StoreTagged(acc, epoch);
    }
    const bool swiglu = node_.activation == EpilogueActivation::kSwiGLU;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = i / 2, e = i % 2;
      const float v = acc[i] + bias_[h];
      // Every lane takes part in the exchange, stored or not.
      const float up = __shfl_xor_sync(0xffffffffu, v, 4);
      const int64_t row = row0_ + e, col = col0_ + 8 * h;
      if (!active_ || row >= node_.m) continue;
      float value;
      int64_t out_col;
      if (swiglu) {
        if (!gate_lane_) continue;
        value = Silu(v) * up;
        out_col = col / 2;
      } else {
        value = Activate(node_.activation, v);
        out_col = col;
      }
      if (out_col >= node_.out_cols) continue;
      StoreOutput<kHalf>(node_, out_type_, row, out_col, value + residual_[h][e]);
    }
  }

 private:
  // The tagged copy of what Store writes (KernelNode::tagged_c; bf16 C),
  // the values worked out again in every lane (NOTE: not shared with Store
  // through a helper: that changed the code of the kernels without the
  // tagged copy, which must stay as measured): a word of two adjacent output
  // columns, written by the lane that holds the even one, which takes the
  // odd one from the lane 4 over (8 under SwiGLU, where every other lane's
  // weight rows are gates and hold an output).
  __device__ void StoreTagged(const float (&acc)[4], uint32_t epoch) const {
    const bool swiglu = node_.activation == EpilogueActivation::kSwiGLU;
    const bool tag_lane = (threadIdx.x & (swiglu ? 12 : 4)) == 0;  // its output column is even
    const int64_t pitch = this->tagged_c_pitch;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = i / 2, e = i % 2;
      const float v = acc[i] + bias_[h];
      const float up = __shfl_xor_sync(0xffffffffu, v, 4);
      const float out = (swiglu ? Silu(v) * up : Activate(node_.activation, v)) + residual_[h][e];
      const float odd = __shfl_xor_sync(0xffffffffu, out, swiglu ? 8 : 4);
      const int64_t row = row0_ + e, col = col0_ + 8 * h;
      const int64_t out_col = swiglu ? col / 2 : col;
      if (!tag_lane || !active_ || row >= node_.m || out_col >= node_.out_cols) continue;
      const uint32_t pair = PackBF16x2(out, out_col + 1 < node_.out_cols ? odd : 0.0f);
      ptx::st_relaxed_gpu_b64(this->tagged_c + row * pitch + out_col / 2, uint64_t{epoch} << 32 | pair);
    }
  }

  EpilogueFields node_;
  ElementType out_type_;
  bool active_;     // this warp has a token block
  bool gate_lane_;  // this lane's weight rows are even: gates, under SwiGLU
  int64_t row0_;    // this lane's first token (row of C)
  int64_t col0_;    // this lane's first accumulator column
  float bias_[2] = {0.0f, 0.0f};          // [h]
  float residual_[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // [h][e]
};

// RunWgmmaJob's main loop (33 to 64 rows): each k16 step one wgmma
// m64n32k16 with both operands from shared memory, A through a descriptor of
// all 64 rows of its k-block tile (rows past the plan's run into what follows
// the tile: NarrowConfig::ATileBytes). One wgmma into one accumulator waits for
// the last (a single chain of short wgmmas left the tensor cores idle,
// bench/NOTES.md v1.16), so the k16 steps of a k-block go to kChains
// independent accumulator sets, summed at the end (in a fixed order: the
// result does not depend on timing). A stage's 16 wgmmas are one group; its
// slots are freed once the next stage's group is issued and this one has
// retired (wgmma_wait_group<1>).
// NOTE: with A from registers (the RS form: each warp's 16 rows loaded with
// ldmatrix into one of two buffers, so one group a k-block and a wait after
// each) the MLP block at 64 tokens took 160 us and the 8-layer chain 177;
// with this loop 131 and 152 (bench/NOTES.md v1.18). Reading A from shared
// memory costs twice the bytes of B per wgmma; the waits cost more.
constexpr int kChains = NarrowConfig::kBlockK / 16;

// Frees the oldest stage's A and B slots once this warp's reads of them are
// done (one arrival per consumer warp, or on A one per lane:
// kEveryLaneOnA) and moves the cursors on.
template <bool kEveryLaneOnA>
__device__ __forceinline__ void ReleaseSlots(const NarrowContext& ctx, bool release_lane, RingCursor& a_release,
                                             RingCursor& b_release) {
  if (kEveryLaneOnA || release_lane) cuda::ptx::mbarrier_arrive(&ctx.barriers->a_empty[a_release.stage]);
  if (release_lane) cuda::ptx::mbarrier_arrive(&ctx.barriers->b_empty[b_release.stage]);
  a_release.Advance(ctx.params.a_stages);
  b_release.Advance(ctx.params.b_stages);
}

// What one consumer warpgroup keeps across jobs: which it is, its position
// in both rings, and the phase of its turn barrier, which keeps the two
// warpgroups' main loops in job order (ConsumeJobs).
struct ConsumerRings {
  int warpgroup;  // 0 or 1
  RingCursor a, b;
  uint32_t turn_phase = 0;

  // Its named barrier and partials buffer (RunMmaSyncJob, RunPairedWgmmaJob).
  __device__ uint32_t barrier() const { return static_cast<uint32_t>(NamedBarrier::kConsumer0) + warpgroup; }
  __device__ float4* partials(const NarrowContext& ctx) const {
    return ctx.partials + warpgroup * (NarrowConfig::kPartialsBytes / sizeof(float4));
  }
  // Its turn barrier (completes when the other warpgroup's main loop has
  // waited for its last stage), and the other's.
  __device__ uint64_t* turn(const NarrowContext& ctx) const { return &ctx.barriers->consumer_turn[warpgroup]; }
  __device__ uint64_t* next_turn(const NarrowContext& ctx) const {
    return &ctx.barriers->consumer_turn[warpgroup ^ 1];
  }
};

// This warp's main loop has waited for every stage of its job: the other
// warpgroup may wait for the next job's (one arrival per warp).
template <int kConsumers>
__device__ __forceinline__ void PassTurn(const NarrowContext& ctx, const ConsumerRings& rings, int lane) {
  if (kConsumers > 1 && lane == 0) cuda::ptx::mbarrier_arrive(rings.next_turn(ctx));
}

// Waits for the stage under the cursors to be full in both rings; on the
// job's first stage also stamps data_ready and lets the epilogue prefetch.
// The warp leaves converged: what follows (wgmma, ldmatrix, mma.sync) is
// warp-wide.
// NOTE: the __syncwarp costs a 64-row job at 33 CTAs 4-10% (nothing on the
// whole chip); waiting on a warp vote instead (`while (!__all_sync(...,
// try_wait))`) was slower still (bench/NOTES.md v1.48).
template <typename Epilogue>
__device__ __forceinline__ void WaitForStage(const NarrowContext& ctx, const ConsumerRings& rings, int index,
                                             bool first, bool leader, Epilogue& epilogue) {
  WaitPhase(&ctx.barriers->a_full[rings.a.stage], rings.a.phase);
  if (first) {
    RecordTrace(ctx, index, leader, &DeviceJobTrace::data_ready);
    epilogue.Prefetch();
  }
  WaitPhase(&ctx.barriers->b_full[rings.b.stage], rings.b.phase);
  __syncwarp();
}

// A job of 33 to 64 rows: wgmma m64n32k16 over the whole K, then the
// epilogue. kHalf: the plan's 16-bit type (NarrowGemmKernel).
template <int kConsumers, ElementType kHalf>
__device__ void RunWgmmaJob(const NarrowContext& ctx, const CtaWork& work, int index, bool leader, int warp,
                            int lane, ConsumerRings& rings) {
  const bool release_lane = lane == 0;
  const uint32_t a_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.a_ring));
  const uint32_t b_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.b_ring));
  const int k_blocks = work.job->k_block_end - work.job->k_block_begin;
  NarrowEpilogue<kHalf> epilogue(work, ctx.tile().m, warp, lane);
  float chains[kChains][16];
#pragma unroll
  for (int c = 0; c < kChains; ++c) {
#pragma unroll
    for (int r = 0; r < 16; ++r) chains[c][r] = 0.0f;
  }
  // The stage whose wgmmas were issued and whose slots are not yet released.
  RingCursor a_release = rings.a, b_release = rings.b;
  bool pending = false;
  const uint32_t a_tile_bytes = ctx.params.a_stage_bytes / NarrowConfig::kKBlocksPerStage;
  for (int kb0 = 0; kb0 < k_blocks; kb0 += NarrowConfig::kKBlocksPerStage) {
    WaitForStage(ctx, rings, index, kb0 == 0, leader, epilogue);
    const uint32_t a_stage = a_base + rings.a.stage * ctx.params.a_stage_bytes;
    const uint32_t b_stage = b_base + rings.b.stage * NarrowConfig::kBStageBytes;
    // Every k-block of the stage, those past K too (zero-filled: LoadStage):
    // wgmmas under a branch made ptxas fence the accumulators (C7519).
    ptx::wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < NarrowConfig::kKBlocksPerStage; ++kb) {
      const uint32_t desc_a = Swizzle128DescriptorLow(a_stage + kb * a_tile_bytes);
      const uint32_t desc_b = Swizzle128DescriptorLow(b_stage + kb * NarrowConfig::kBTileBytes);
#pragma unroll
      for (int k16 = 0; k16 < kChains; ++k16) {
        wgmma_m64n32k16_ss<kHalf>(chains[k16], AdvanceDescriptorLowK16(desc_a, k16),
                                AdvanceDescriptorLowK16(desc_b, k16));
      }
    }
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<1>();
    // The previous stage's group has retired: its slots are free.
    if (pending) ReleaseSlots<false>(ctx, release_lane, a_release, b_release);
    pending = true;
    rings.a.Advance(ctx.params.a_stages);
    rings.b.Advance(ctx.params.b_stages);
  }
  PassTurn<kConsumers>(ctx, rings, lane);
  ptx::wgmma_wait_group<0>();
  if (pending) ReleaseSlots<false>(ctx, release_lane, a_release, b_release);
  float acc[16];
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    acc[r] = chains[0][r];
#pragma unroll
    for (int c = 1; c < kChains; ++c) acc[r] += chains[c][r];
  }
  RecordTrace(ctx, index, leader, &DeviceJobTrace::mma_done);
  epilogue.Store(acc);
}

// A job of 17 to 32 rows (kRows, the A tile's rows: 24 or 32) on wgmma
// m64n64k16, two k-blocks a wgmma: its 64 rows are the tokens over k-block
// 2p (rows 0..kRows-1) and over k-block 2p + 1 (rows kRows..2 kRows-1),
// which lie one after the other in the A stage (rows past them read what
// follows and are never used); its 64 columns the tile's weights over the
// same two k-blocks, one after the other in the B stage. Of the product,
// rows 0..kRows-1 x columns 0-31 are the sums over k-block 2p, rows kRows..
// x columns 32-63 those over k-block 2p + 1; the rest mixes k-blocks and is
// never read. A stage is 8 wgmmas (two pairs x four k16 steps) into two
// accumulator sets, one group, its slots freed as in RunWgmmaJob (the same
// loop, written out: through a shared helper taking the stage's wgmmas as a
// lambda, the 24-token chain took 107.0-107.1 us against 106.3-106.6,
// bench/NOTES.md v1.24). Then the threads that hold the second k-block's
// sums hand them, through shared memory, to those that hold the first's for
// the same token, which add them
// (in a fixed order: the result does not depend on timing) and so hold the
// tile in RunWgmmaJob's layout, rows 0..kRows-1: the same epilogue stores it
// (it skips rows past M).
// NOTE: half as many wgmmas as RunWgmmaJob's m64n32k16 (which this replaced
// at 17-32 rows), each twice as wide: the MLP block at 24 / 32 tokens took
// 105.6-106.1 / 108.8-109.1 us against 111.7-112.0 / 115.2-115.5, the
// 8-layer chain 107.4-107.7 / 108.9-109.5 against 112.0-112.4 /
// 112.8-113.7. Four accumulator sets instead of two, or 32-row tiles at
// 17-24 rows, were no faster. The operands the other way round (weights as
// the 64 rows, the tokens of both k-blocks as N = 2 * rows) took 114.5 /
// 124.3 at 24 / 32 tokens, and at 48 / 64 tokens (N = 96 / 128) 149 / 167
// against 117 / 119 (bench/NOTES.md v1.24).
template <int kRows, int kConsumers, ElementType kHalf>
__device__ void RunPairedWgmmaJob(const NarrowContext& ctx, const CtaWork& work, int index, bool leader, int warp,
                                  int lane, ConsumerRings& rings) {
  constexpr int kPairChains = 2;
  constexpr int kHandoffPitch = NarrowConfig::kBlockN + 1;  // floats a token row, padded against bank conflicts
  static_assert(NarrowConfig::kKBlocksPerStage == 4 && NarrowConfig::kBlockN == 32, "two pairs of k-blocks a stage");
  static_assert(kRows % 8 == 0 && 2 * kRows <= 64, "both k-blocks' tokens in the 64 rows");
  static_assert(kRows * kHandoffPitch * 4 <= NarrowConfig::kPartialsBytes, "the handoff fits the partials");
  const uint32_t a_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.a_ring));
  const uint32_t b_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.b_ring));
  const uint32_t a_tile_bytes = NarrowConfig::ATileBytes(kRows);
  const int k_blocks = work.job->k_block_end - work.job->k_block_begin;
  NarrowEpilogue<kHalf> epilogue(work, ctx.tile().m, warp, lane);
  float chains[kPairChains][32] = {};
  RingCursor a_release = rings.a, b_release = rings.b;
  bool pending = false;
  for (int kb0 = 0; kb0 < k_blocks; kb0 += NarrowConfig::kKBlocksPerStage) {
    WaitForStage(ctx, rings, index, kb0 == 0, leader, epilogue);
    const uint32_t a_stage = a_base + rings.a.stage * ctx.params.a_stage_bytes;
    const uint32_t b_stage = b_base + rings.b.stage * NarrowConfig::kBStageBytes;
    ptx::wgmma_fence();
#pragma unroll
    for (int k16 = 0; k16 < NarrowConfig::kBlockK / 16; ++k16) {
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        const uint32_t tokens = Swizzle128DescriptorLow(a_stage + 2 * pair * a_tile_bytes);
        const uint32_t weights = Swizzle128DescriptorLow(b_stage + 2 * pair * NarrowConfig::kBTileBytes);
        wgmma_m64n64k16_ss<kHalf>(chains[pair], AdvanceDescriptorLowK16(tokens, k16),
                                AdvanceDescriptorLowK16(weights, k16));
      }
    }
    ptx::wgmma_commit_group();
    ptx::wgmma_wait_group<1>();
    if (pending) ReleaseSlots<false>(ctx, lane == 0, a_release, b_release);
    pending = true;
    rings.a.Advance(ctx.params.a_stages);
    rings.b.Advance(ctx.params.b_stages);
  }
  PassTurn<kConsumers>(ctx, rings, lane);
  ptx::wgmma_wait_group<0>();
  if (pending) ReleaseSlots<false>(ctx, lane == 0, a_release, b_release);
  // Register 4c + 2h + e holds row 16 * warp + lane / 4 + 8h, column 8c + 2 *
  // (lane % 4) + e (wgmma.cuh); every index below is a constant (a run-time
  // one would put the accumulators in local memory), only the stores and
  // loads are predicated on the row.
  float* handoff = reinterpret_cast<float*>(rings.partials(ctx));
  // The first barrier: the previous job's partials have all been read.
  ptx::barrier_at<128>(rings.barrier());
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = 16 * warp + lane / 4 + 8 * h;
    if (row < kRows || row >= 2 * kRows) continue;
#pragma unroll
    for (int c = 4; c < 8; ++c) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 4 * c + 2 * h + e;
        handoff[(row - kRows) * kHandoffPitch + 8 * (c - 4) + 2 * (lane % 4) + e] = chains[0][r] + chains[1][r];
      }
    }
  }
  ptx::barrier_at<128>(rings.barrier());
  float acc[16];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = 16 * warp + lane / 4 + 8 * h;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 4 * c + 2 * h + e;
        acc[r] = chains[0][r] + chains[1][r];
        if (row < kRows) acc[r] += handoff[row * kHandoffPitch + 8 * c + 2 * (lane % 4) + e];
      }
    }
  }
  RecordTrace(ctx, index, leader, &DeviceJobTrace::mma_done);
  epilogue.Store(acc);
}

// The same for a job of at most 16 rows, on mma.sync m16n8k16 with the
// operands swapped: the weights (the job's 32 columns of B, two 16-row
// blocks) are the 16-row operand, the tokens (one or two blocks of 8 rows of
// A) the 8-column one, so no instruction spends work on rows past M.
// Warp w multiplies k-block w of every stage, for every (weight block, token
// block) pair, one accumulator set per pair and k16 step (independent
// chains). Then the four warps' partial tiles meet in shared memory, and
// warp w sums pair w (weight block w % 2, token block w / 2) over the warps,
// in warp order (the result does not depend on timing), for its epilogue.
// Traced (bench/NOTES.md v1.17): with each warp on one pair over all of a
// stage's k-blocks, four mma.sync in a row into each chain, a one-token
// chain layer's main loop (64 k-blocks) took ~6.2 us; split by k-block,
// ~5 us.
// kTagged: the tagged handoff's instantiation (SwappedEpilogue).
template <int kTokenBlocks, int kConsumers, bool kTagged, ElementType kHalf>
__device__ void RunMmaSyncJob(const NarrowContext& ctx, const CtaWork& work, int index, bool leader, int warp,
                              int lane, ConsumerRings& rings) {
  const uint32_t a_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.a_ring));
  const uint32_t b_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.b_ring));
  const int k_blocks = work.job->k_block_end - work.job->k_block_begin;
  static_assert(NarrowConfig::kKBlocksPerStage == 4, "one k-block of each stage per consumer warp");
  const int weight_block = warp % 2, token_block = warp / 2;  // this warp's pair, for the epilogue
  const bool active = token_block < kTokenBlocks;
  SwappedEpilogue<kTagged, kHalf> epilogue(work, ctx.tile().m, weight_block, token_block, active, lane);
  const uint32_t a_tile_bytes = ctx.params.a_stage_bytes / NarrowConfig::kKBlocksPerStage;
  float chains[kTokenBlocks][2][4][4] = {};  // [token block][weight block][k16 step][register]
  for (int kb0 = 0; kb0 < k_blocks; kb0 += NarrowConfig::kKBlocksPerStage) {
    WaitForStage(ctx, rings, index, kb0 == 0, leader, epilogue);
    const uint32_t a_tile = a_base + rings.a.stage * ctx.params.a_stage_bytes + warp * a_tile_bytes;
    const uint32_t b_tile = b_base + rings.b.stage * NarrowConfig::kBStageBytes + warp * NarrowConfig::kBTileBytes;
    uint32_t tokens[kTokenBlocks][2][4];  // 16-byte chunks 0-3 and 4-7 of the token row (k 0-31, 32-63)
#pragma unroll
    for (int tb = 0; tb < kTokenBlocks; ++tb) {
      const int token_row = 8 * tb + (lane & 7);
      ptx::ldmatrix_x4(a_tile + SwizzledPanelOffset(token_row, 16 * ((lane >> 3) + 0)), tokens[tb][0]);
      ptx::ldmatrix_x4(a_tile + SwizzledPanelOffset(token_row, 16 * ((lane >> 3) + 4)), tokens[tb][1]);
    }
#pragma unroll
    for (int wb = 0; wb < 2; ++wb) {
      const int weight_row = 16 * wb + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
      for (int k16 = 0; k16 < 4; ++k16) {
        uint32_t weights[4];
        ptx::ldmatrix_x4(b_tile + SwizzledPanelOffset(weight_row, 16 * (2 * k16 + (lane >> 4))), weights);
#pragma unroll
        for (int tb = 0; tb < kTokenBlocks; ++tb) {
          ptx::mma_m16n8k16<kHalf>(chains[tb][wb][k16], weights, tokens[tb][k16 / 2][2 * (k16 % 2)],
                                 tokens[tb][k16 / 2][2 * (k16 % 2) + 1]);
        }
      }
    }
    // The stage's reads are done (ldmatrix is synchronous): free its slots.
    // With the tagged handoff, whose A loader refills the A slot with
    // generic stores, each lane releases its own reads of A.
    ReleaseSlots<kTagged>(ctx, lane == 0, rings.a, rings.b);
  }
  PassTurn<kConsumers>(ctx, rings, lane);
  // The first barrier: the previous job's partials have all been read.
  ptx::barrier_at<128>(rings.barrier());
#pragma unroll
  for (int tb = 0; tb < kTokenBlocks; ++tb) {
#pragma unroll
    for (int wb = 0; wb < 2; ++wb) {
      float4 sum;
      const float(&c)[4][4] = chains[tb][wb];
      sum.x = (c[0][0] + c[1][0]) + (c[2][0] + c[3][0]);
      sum.y = (c[0][1] + c[1][1]) + (c[2][1] + c[3][1]);
      sum.z = (c[0][2] + c[1][2]) + (c[2][2] + c[3][2]);
      sum.w = (c[0][3] + c[1][3]) + (c[2][3] + c[3][3]);
      rings.partials(ctx)[(warp * 4 + 2 * tb + wb) * 32 + lane] = sum;
    }
  }
  ptx::barrier_at<128>(rings.barrier());
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (active) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float4 part = rings.partials(ctx)[(w * 4 + 2 * token_block + weight_block) * 32 + lane];
      acc[0] += part.x;
      acc[1] += part.y;
      acc[2] += part.z;
      acc[3] += part.w;
    }
  }
  RecordTrace(ctx, index, leader, &DeviceJobTrace::mma_done);
  epilogue.Store(acc, ctx.epoch);
}

// A job's stages waited for and freed without a multiply, after recording a
// failure for the launch (WaitKind::kNoKernelPath: no wait timed out): for a
// job the kernel has no path for (ConsumeJobs). Every lane frees A (the
// tagged handoff's kEveryLaneOnA).
template <int kConsumers>
__device__ void PassOverJob(const NarrowContext& ctx, const CtaWork& work, int index, int lane,
                            ConsumerRings& rings) {
  if (threadIdx.x % 128 == 0) ctx.watchdog.Report(WaitKind::kNoKernelPath, index, -1, 0, 0);
  const int stages = NarrowConfig::StagesOf(work.job->k_block_end - work.job->k_block_begin);
  for (int s = 0; s < stages; ++s) {
    WaitPhase(&ctx.barriers->a_full[rings.a.stage], rings.a.phase);
    WaitPhase(&ctx.barriers->b_full[rings.b.stage], rings.b.phase);
    __syncwarp();
    ReleaseSlots<true>(ctx, lane == 0, rings.a, rings.b);
  }
  PassTurn<kConsumers>(ctx, rings, lane);
}

// A consumer warpgroup, every other job of the CTA (`warpgroup` 0 the first,
// third, ...; 1 the second, fourth, ...): the main loop over the whole K and
// the epilogue into C, then each warp hands its part of the tile to the
// publisher. The jobs of the other warpgroup it reads too, and moves its
// ring and handoff cursors past them: both rings and the handoffs hold the
// CTA's jobs in queue order. So while one warpgroup runs a job's epilogue,
// the other multiplies the next job's stages as they land.
// After a time-out it goes on as usual (its rings drain: the top of the
// file) until the job stream ends.
// kPath: 24 or 32, RunPairedWgmmaJob for A tiles of that many rows; 0, the
// others by the plan's rows (RunMmaSyncJob up to 16, RunWgmmaJob past 32).
// NOTE: the paired jobs chosen per job beside the others in one loop, ptxas
// spilled (255 registers, 24 bytes) and the MLP block at 24 / 32 tokens took
// 111.2-111.9 / 111.6-111.7 us against 106.7-107.7 / 109.2-110.0 with a
// loop of their own (bench/NOTES.md v1.24).
template <int kPath, int kConsumers, bool kTagged, ElementType kHalf>
__device__ void ConsumeJobs(const NarrowContext& ctx, int warpgroup, int warp, int lane, bool leader) {
  static_assert(kConsumers == 1 || kConsumers == 2, "the turn passes to the other warpgroup");
  const uint32_t tile_rows = NarrowConfig::ATileRows(ctx.params.a_stage_bytes);
  JobStream jobs;
  ConsumerRings rings{warpgroup};
  RingCursor handoff;
  for (int ordinal = 0;; ++ordinal) {
    const int index = jobs.Next(ctx);
    if (index < 0) return;
    if (kConsumers > 1 && ordinal % kConsumers != warpgroup) {
      const sched::TileJob& job = ctx.params.queue[index];
      const int stages = NarrowConfig::StagesOf(job.k_block_end - job.k_block_begin);
      rings.a.Skip(stages, ctx.params.a_stages);
      rings.b.Skip(stages, ctx.params.b_stages);
      handoff.Advance(NarrowConfig::kJobSlots);
      continue;
    }
    // A ring barrier's wait by parity tells its current phase only from the
    // one before: so the stages of this job are waited for only once the
    // other warpgroup has waited for its last job's (every job before this
    // one was its, or this warpgroup's own).
    if (kConsumers > 1 && ordinal > 0) {
      WaitPhase(rings.turn(ctx), rings.turn_phase);
      rings.turn_phase ^= 1;
    }
    StartTrace(ctx, index, leader);
    const CtaWork work = ResolveJob(ctx, index);
    if constexpr (kPath == 0) {
      if (tile_rows <= 8) {
        RunMmaSyncJob<1, kConsumers, kTagged, kHalf>(ctx, work, index, leader, warp, lane, rings);
      } else if (tile_rows <= NarrowConfig::kMmaSyncRows) {
        RunMmaSyncJob<2, kConsumers, kTagged, kHalf>(ctx, work, index, leader, warp, lane, rings);
      } else if constexpr (kTagged) {
        // Not reached: a plan with tagged handoffs multiplies on mma.sync
        // (runtime.cc, TaggedHandoffsOf). Rather than compile in a path it
        // never runs, the launch fails and the job's stages drain.
        PassOverJob<kConsumers>(ctx, work, index, lane, rings);
      } else {
        RunWgmmaJob<kConsumers, kHalf>(ctx, work, index, leader, warp, lane, rings);
      }
    } else {
      RunPairedWgmmaJob<kPath, kConsumers, kHalf>(ctx, work, index, leader, warp, lane, rings);
    }
    __syncwarp();  // the lanes' stores to C, before lane 0's arrival
    if (lane == 0) {
      WaitPhase(&ctx.barriers->publish_empty[handoff.stage], handoff.phase ^ 1);
      cuda::ptx::mbarrier_arrive(&ctx.barriers->publish_full[handoff.stage]);
    }
    __syncwarp();  // converged again: JobStream::Next reads the slot once a warp
    handoff.Advance(NarrowConfig::kJobSlots);
    RecordTrace(ctx, index, leader, &DeviceJobTrace::staged);
  }
}

template <bool kPaired, int kConsumers, bool kTagged, ElementType kHalf>
__device__ void RunNarrowConsumer(const NarrowContext& ctx) {
  const int lane = threadIdx.x % 32;
  const int warp = (threadIdx.x / 32) % 4;
  const int warpgroup = threadIdx.x / 128 - 1;
  const bool leader = threadIdx.x % 128 == 0;  // writes its jobs' traces (the publisher releases the flag)
  if constexpr (kPaired) {
    if (NarrowConfig::ATileRows(ctx.params.a_stage_bytes) <= 24) {
      ConsumeJobs<24, kConsumers, false, kHalf>(ctx, warpgroup, warp, lane, leader);
    } else {
      ConsumeJobs<32, kConsumers, false, kHalf>(ctx, warpgroup, warp, lane, leader);
    }
  } else {
    ConsumeJobs<0, kConsumers, kTagged, kHalf>(ctx, warpgroup, warp, lane, leader);
  }
}

// kKind (NarrowConfig::InstantiationFor): kPaired, the plan's A tiles are
// 17 to 32 rows (RunPairedWgmmaJob), its own instantiation, as kPackedB:
// with the paired path beside the others in one kernel, the one-token chain
// took 96.6-97.0 us against 95.2-95.4 and the 64-token one 116.3-117.6
// against 114.3-114.8, with their own paths unchanged (bench/NOTES.md
// v1.24); kShortRowBlocks, row blocks of KernelParams::block_m rows;
// kTaggedHandoff, the tagged handoff (one consumer warpgroup only).
// kConsumers: consumer warpgroups (NarrowConfig::kMaxConsumerWarpgroups).
// kHalf: the plan's 16-bit type, bf16 or fp16 (half_types.cuh; the tagged
// handoff's words hold bf16, so it has no fp16 instantiation).
template <bool kPackedB, NarrowConfig::Instantiation kKind, int kConsumers, ElementType kHalf>
__global__ void __launch_bounds__(NarrowConfig::Threads(kConsumers), 1)
    NarrowGemmKernel(const __grid_constant__ KernelParams params) {
  extern __shared__ uint8_t dynamic_smem[];
  // 128B-swizzled tiles need 1024-byte alignment; the layout reserved slack.
  // (Written out as in PersistentGemmKernel: the same two lines through a
  // shared helper changed the tiled kernel's register allocation, 464 -> 504
  // bytes of spill stores.)
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(dynamic_smem));
  uint8_t* smem = dynamic_smem + (((raw + 1023) & ~1023u) - raw);
  const NarrowSmemLayout layout =
      ComputeNarrowSmemLayout(params.a_stages, params.a_stage_bytes, params.b_stages, kConsumers);
  auto* barriers = reinterpret_cast<NarrowBarriers*>(smem + layout.barriers);
  // Set-up that reads nothing a launch writes, so that it overlaps the end
  // of the previous launch (NarrowContext::AwaitPreviousLaunch): the
  // barriers, and the prefetches of what every job's first steps read
  // (PrefetchPlanRecords).
  if (threadIdx.x == 0) {
    InitNarrowBarriers<kConsumers, kKind == NarrowConfig::Instantiation::kTaggedHandoff>(barriers, params);
  } else if (threadIdx.x / 32 == 3) {
    constexpr const CUtensorMap KernelNode::*kMaps[] = {&KernelNode::a_map, &KernelNode::b_map};
    PrefetchPlanRecords(params, static_cast<int>(threadIdx.x % 32), kMaps);
  }
  __syncthreads();

  NarrowContext ctx{params,
                    barriers,
                    smem + layout.a_ring,
                    smem + layout.b_ring,
                    reinterpret_cast<float4*>(smem + layout.partials),
                    reinterpret_cast<int32_t*>(smem + layout.job_slots),
                    0,
                    0,
                    Watchdog(params),
                    kKind == NarrowConfig::Instantiation::kShortRowBlocks ? params.block_m : NarrowConfig::kBlockM};
  if (threadIdx.x < 128) {
    if constexpr (kConsumers > 1) ptx::setmaxnreg_dec<NarrowConfig::kProducerRegisters>();
    const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
    if (warp == 0) {
      ctx.AwaitPreviousLaunch();
      RunNarrowALoader<kKind == NarrowConfig::Instantiation::kTaggedHandoff>(ctx, lane);
    } else if (lane == 0) {
      switch (warp) {
        case 1:
          RunNarrowBLoader<kPackedB>(ctx);  // waits when it must (packed weights stream in first)
          break;
        case 2:
          // The first wave is static, CTA i taking queue index i, so the
          // first job is handed out before the wait (and its packed weights
          // start streaming); fetches after it start past the grid.
          RunScheduler(ctx, static_cast<int>(blockIdx.x), gridDim.x, 0u, [&] { ctx.AwaitPreviousLaunchAsScheduler(); });
          FinishFetching(params, ctx.epoch);
          break;
        default:
          ctx.AwaitPreviousLaunch();
          RunNarrowPublisher(ctx);
          break;
      }
    }
    __syncwarp();
  } else {
    if constexpr (kConsumers > 1) ptx::setmaxnreg_inc<NarrowConfig::kConsumerRegisters>();
    ctx.AwaitPreviousLaunch();
    RunNarrowConsumer<kKind == NarrowConfig::Instantiation::kPaired, kConsumers,
                      kKind == NarrowConfig::Instantiation::kTaggedHandoff, kHalf>(ctx);
  }
  // Every TMA load this CTA issued has landed (its consumer waited for it)
  // before anyone leaves.
  __syncthreads();
}

}  // namespace

namespace {

using NarrowKernel = void (*)(KernelParams);

// A plan's instantiations by kind (NarrowConfig::InstantiationFor) and
// consumer warpgroups, for packed weights or not and the 16-bit type kHalf.
// (No tagged handoff with two consumer warpgroups, nor in fp16: those slots
// are the default kernel's; LaunchNarrowGemm refuses an fp16 one.)
template <bool kPackedB, ElementType kHalf>
constexpr std::array<std::array<NarrowKernel, 2>, 4> KernelsOf() {
  using K = NarrowConfig::Instantiation;
  constexpr K kTagged = kHalf == ElementType::kBF16 ? K::kTaggedHandoff : K::kDefault;
  return {{{NarrowGemmKernel<kPackedB, K::kDefault, 1, kHalf>, NarrowGemmKernel<kPackedB, K::kDefault, 2, kHalf>},
           {NarrowGemmKernel<kPackedB, K::kPaired, 1, kHalf>, NarrowGemmKernel<kPackedB, K::kPaired, 2, kHalf>},
           {NarrowGemmKernel<kPackedB, K::kShortRowBlocks, 1, kHalf>,
            NarrowGemmKernel<kPackedB, K::kShortRowBlocks, 2, kHalf>},
           {NarrowGemmKernel<kPackedB, kTagged, 1, kHalf>, NarrowGemmKernel<kPackedB, K::kDefault, 2, kHalf>}}};
}

// The instantiation for packed weights or not, the kind, one or two consumer
// warpgroups and the plan's 16-bit type.
NarrowKernel NarrowKernelFor(bool packed_b, NarrowConfig::Instantiation kind, int consumers, ElementType half) {
  constexpr std::array<std::array<std::array<std::array<NarrowKernel, 2>, 4>, 2>, 2> kKernels = {
      {{KernelsOf<false, ElementType::kBF16>(), KernelsOf<true, ElementType::kBF16>()},
       {KernelsOf<false, ElementType::kFP16>(), KernelsOf<true, ElementType::kFP16>()}}};
  return kKernels[half == ElementType::kFP16][packed_b][static_cast<int>(kind)][consumers - 1];
}

}  // namespace

cudaError_t MaxCoresidentNarrowCtas(uint32_t smem_bytes, int consumers, int* ctas) {
  *ctas = 0;
  if (consumers < 1 || consumers > NarrowConfig::kMaxConsumerWarpgroups) return cudaErrorInvalidValue;
  int device = 0;
  if (cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) return error;
  int max_smem = 0;
  int sms = 0;
  if (cudaError_t error = cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      error != cudaSuccess) {
    return error;
  }
  if (cudaError_t error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      error != cudaSuccess) {
    return error;
  }
  for (ElementType half : {ElementType::kBF16, ElementType::kFP16}) {
    for (bool packed_b : {false, true}) {
      for (NarrowConfig::Instantiation kind :
           {NarrowConfig::Instantiation::kDefault, NarrowConfig::Instantiation::kPaired,
            NarrowConfig::Instantiation::kShortRowBlocks, NarrowConfig::Instantiation::kTaggedHandoff}) {
        if (cudaError_t error = cudaFuncSetAttribute(NarrowKernelFor(packed_b, kind, consumers, half),
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem);
            error != cudaSuccess) {
          return error;
        }
      }
    }
  }
  // The instantiations with the same consumers differ only in the B
  // loader's branch and the consumer's path: one answer.
  int per_sm = 0;
  if (cudaError_t error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, NarrowKernelFor(false, NarrowConfig::Instantiation::kDefault, consumers, ElementType::kBF16),
          NarrowConfig::Threads(consumers), smem_bytes);
      error != cudaSuccess) {
    return error;
  }
  *ctas = per_sm * sms;
  return cudaSuccess;
}

cudaError_t LaunchNarrowGemm(const KernelParams& params, int ctas, bool packed_b, int consumers, bool tagged_handoffs,
                             ElementType half, bool overlap_previous, cudaStream_t stream) {
  if (consumers < 1 || consumers > NarrowConfig::kMaxConsumerWarpgroups) return cudaErrorInvalidValue;
  if (tagged_handoffs && half != ElementType::kBF16) return cudaErrorInvalidValue;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(ctas), 1, 1);
  config.blockDim = dim3(static_cast<unsigned>(NarrowConfig::Threads(consumers)), 1, 1);
  config.dynamicSmemBytes = NarrowSharedMemoryBytes(params.a_stages, params.a_stage_bytes, params.b_stages, consumers);
  config.stream = stream;
  cudaLaunchAttribute overlap;
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  if (overlap_previous) {
    config.attrs = &overlap;
    config.numAttrs = 1;
  }
  const NarrowConfig::Instantiation kind =
      NarrowConfig::InstantiationFor(NarrowConfig::ATileRows(params.a_stage_bytes), params.block_m, tagged_handoffs);
  return cudaLaunchKernelEx(&config, NarrowKernelFor(packed_b, kind, consumers, half), params);
}

}  // namespace loom::kernel
