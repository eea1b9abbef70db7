// narrow_loader_role.cuh: the narrow kernel's A and B loaders (protocol:
// narrow_context.cuh). The A loader waits for the producer tiles its k-blocks
// read (dependencies.cuh) or copies tagged words into its slots itself; the B
// loader streams the weights, from tensor maps or packed copies.
#ifndef LOOM_OPS_KERNEL_NARROW_LOADER_ROLE_CUH_
#define LOOM_OPS_KERNEL_NARROW_LOADER_ROLE_CUH_

#include <cuda/ptx>

#include "dependencies.cuh"
#include "epilogue_role.cuh"  // SwizzledPanelOffset, for the tagged copies into A slots
#include "narrow_context.cuh"

namespace loom::kernel {

// Loads the k-blocks [kb0, kb0 + kKBlocksPerStage) of rows [row0, + tile_bytes
// / 128) of an operand into a ring stage, one tile_bytes tile per k-block.
// `kblock_map` (the operand's K is a multiple of 64: plan_resources.cc encodes it
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

// Loads the B stage that starts at k-block kb0 of tile n_block (kTileN rows)
// from packed weights (packed_layout.h): one bulk copy of a block already
// laid out as LoadStage's tensor load would write it, zeros included; with
// the weights' `policy`, as LoadStage<true>.
template <int kTileN>
__device__ __forceinline__ void LoadPackedStage(const uint8_t* packed_b, int64_t stages_per_tile, uint8_t* stage,
                                                uint64_t* full, int64_t n_block, int kb0, uint64_t policy) {
  constexpr uint32_t kBytes = NarrowConfig::BStageBytes(kTileN);
  cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                       full, kBytes);
  ptx::cp_async_bulk_l2_hint(stage, packed_b + NarrowConfig::Packed(kTileN).StageOffset(n_block, kb0, stages_per_tile),
                             kBytes, full, policy);
}

// Whether the node's operands have k-block maps (KernelNodesOf in plan_resources.cc).
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
// stages found so, in turn, once its slot is free: the lanes' 16-bit pairs
// written where a TMA load of A would put them (128B swizzle; zeros past K,
// as TMA fills them), and the slot's full barrier; the next window starts
// at the first stage not handed over. Rows past M keep what the slot held:
// on the mma.sync path a token row of A meets only its own accumulator
// column, which the epilogue never stores. Returns the first k-block not
// handed over: the job's end, or where the poll gave up (the launch is
// aborting; the caller drains the rest).
template <int kRows>
__device__ inline int LoadTaggedStages(const NarrowContext& ctx, const KernelNode& node, const sched::TileJob& job,
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

__device__ inline int LoadTaggedStages(const NarrowContext& ctx, const KernelNode& node, const sched::TileJob& job,
                                int index, int lane, RingCursor& ring, bool traced, uint64_t& waited_ns) {
  static_assert(NarrowConfig::kTaggedMaxRows == 2, "a case per row count");
  // 1 to kTaggedMaxRows rows (plan_resources.cc, TaggedHandoffsOf)
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
        a_ready_end = WaitForAProducersAhead<32>(ctx, node, index, row0, a_ready_end, job.k_block_end, known, lane);
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
// kTileN: the tile's rows of B (NarrowConfig::kBlockN, or kPairSplitBlockN).
template <bool kPackedB, int kTileN>
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
        packed_stages_per_tile = NarrowConfig::Packed(kTileN).StagesPerTile(node.schedule.k);
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
    const int32_t n_row0 = static_cast<int32_t>(job.n_block) * kTileN;
    memo.Reset();
    for (int kb0 = job.k_block_begin; kb0 < job.k_block_end; kb0 += NarrowConfig::kKBlocksPerStage) {
      const int kb_end = min(kb0 + NarrowConfig::kKBlocksPerStage, int{job.k_block_end});
      if (b_has_producers && !draining &&
          !WaitForProducers(ctx, node, index, sched::DependencyOperand::kB, n_row0, n_row0 + kTileN,
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
        LoadPackedStage<kTileN>(packed_b, packed_stages_per_tile, ctx.b_stage(ring.stage),
                                &ctx.barriers->b_full[ring.stage], job.n_block, kb0, policy);
      } else {
        LoadStage<true>(&node.b_map, kblock_map, ctx.b_stage(ring.stage), &ctx.barriers->b_full[ring.stage],
                        kTileN * NarrowConfig::kBlockK * 2, kb0, n_row0, policy);
      }
      ++in_flight;
      ring.Advance(ctx.params.b_stages);
      ctx.LoaderNearing(index, job.k_block_end - kb_end);
    }
  }
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_NARROW_LOADER_ROLE_CUH_
