// loader_role.cuh: the A and B loaders. Each is one thread that walks the job
// stream and feeds its ring with TMA loads (protocol: cta_context.cuh).
//
// The A loader also owns dependencies: before each k-block it waits until the
// producer tiles holding that slice of A are done this launch (acquire), then
// fences the async proxy so its TMA load sees the producer's TMA stores; each
// wait also reads ahead, so finished producers cost one wait per batch. The B
// loader has its own ring, so the weight stream runs ahead while A waits.
// Once a wait for producers gives up (the launch is aborting), a loader
// drains (watchdog.cuh): it waits for no producer again and goes on
// loading, whatever the producers left, until the job stream ends.
//
// Cluster sharing: boxes are half tiles. When the cluster shares an operand,
// each CTA loads its half once and multicasts it into both CTAs (same smem
// offset, each CTA's own full barrier gets complete_tx). Otherwise a CTA loads
// both halves itself. Either way each CTA's full barrier expects the whole slot.
#ifndef LOOM_OPS_KERNEL_LOADER_ROLE_CUH_
#define LOOM_OPS_KERNEL_LOADER_ROLE_CUH_

#include "cta_context.cuh"
#include "dependencies.cuh"

namespace loom::kernel {

// Issues the TMA loads of one operand slot: rows [row0, row0 + halves *
// box_rows) at k offset `k0`, into `slot` (the first `halves` of its two
// boxes of box_rows x 128 B). Shared by the cluster: this CTA's half, for both
// CTAs. Otherwise both halves in one load through `slot_map` (box 2 x
// box_rows): each TMA load costs the loader time of its own, more than its
// rows do (bench/NOTES.md, v1.12). evict_first: the load carries `policy`
// (ptx::l2_evict_first_policy); for operands no other job reads (not
// multicast: only a B that no cluster shares).
template <class Config>
__device__ inline void LoadOperandSlot(const CtaContext<Config>& ctx, const CUtensorMap* half_map,
                                       const CUtensorMap* slot_map, uint8_t* slot, uint64_t* full_barrier,
                                       int32_t k0, int32_t row0, int32_t box_rows, bool shared_by_cluster,
                                       int halves = 2, bool evict_first = false, uint64_t policy = 0) {
  const uint32_t box_bytes = static_cast<uint32_t>(box_rows) * Config::kPanelBytes;
  if (evict_first && !shared_by_cluster) {
    ptx::cp_async_bulk_tensor_2d_l2_hint(slot, halves == 2 ? slot_map : half_map, k0, row0, full_barrier, policy);
    return;
  }
  if (shared_by_cluster) {
    if (static_cast<int>(ctx.rank) >= halves) return;
    const int32_t coords[2] = {k0, row0 + static_cast<int32_t>(ctx.rank) * box_rows};
    const uint16_t every_cta = static_cast<uint16_t>((1u << ctx.params.cluster_size) - 1);
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                    slot + ctx.rank * box_bytes, half_map, coords, full_barrier, every_cta);
  } else {
    const int32_t coords[2] = {k0, row0};
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, slot,
                                    halves == 2 ? slot_map : half_map, coords, full_barrier);
  }
}

template <class Config>
__device__ inline bool SharesOperand(const CtaContext<Config>& ctx, const KernelNode& node,
                                     sched::ClusterShare operand) {
  return ctx.params.cluster_size > 1 && node.schedule.share == operand;
}

// The A loader. In lockstep mode it also loads B into the same slot index,
// under A's barriers.
template <class Config>
__device__ inline void RunALoader(const CtaContext<Config>& ctx) {
  constexpr int kBlockK = Config::kBlockK;
  const bool lockstep = ctx.params.lockstep != 0;
  const bool traced = ctx.params.trace != nullptr;
  JobStream jobs;
  RingCursor ring;
  DependencyMemo memo;
  KnownARun known;
  bool draining = false;
  {
    // B's maps too, which this thread uses in lockstep mode. (Only there:
    // but with the B maps under `lockstep`, ptxas spilled 20-24 bytes more
    // stores and 56-72 more loads in the tiled kernels than with them always,
    // as measured in bench/NOTES.md v1.76's m1.)
    constexpr const CUtensorMap KernelNode::*kMaps[] = {&KernelNode::a_map, &KernelNode::a_slot_map,
                                                         &KernelNode::b_map, &KernelNode::b_slot_map};
    AcquireEveryNodesTensorMaps(ctx.params, kMaps);
  }
  for (;;) {
    const int index = jobs.Next(ctx);
    if (index < 0) return;
    const CtaWork work = ResolveJob(ctx, index);
    // NOTE: job and node fields are copied into registers once per job: the
    // loop's asm statements clobber memory, so fields read through pointers
    // would be reloaded from global memory on every k-block.
    const sched::TileJob job = *work.job;
    if (job.kind != static_cast<uint8_t>(sched::JobKind::kGemm)) continue;
    const KernelNode& node = *work.node;
    const sched::NodeSchedule& schedule = node.schedule;
    const bool has_dependencies = schedule.dependency_count > 0;
    const bool share_a = SharesOperand(ctx, node, sched::ClusterShare::kShareA);
    const bool share_b = SharesOperand(ctx, node, sched::ClusterShare::kShareB);
    const int32_t row0 = work.m_block * Config::kBlockM;
    const int32_t n_row0 = work.n_block * Config::kBlockN;
    // A tile whose second half of rows lies wholly past M (decode) loads only
    // the first: those rows are the second consumer warpgroup's, which then
    // issues no wgmma (RunMainLoop), so no load of all-zero rows is needed.
    // A plan with half-size A stages (KernelParams::a_stage_bytes) has only
    // nodes of at most 64 rows, so a_halves is 1 throughout it.
    static_assert(Config::kABoxRows == Config::kRowsPerConsumer, "an A half is one warpgroup's rows");
    const int a_halves = row0 + Config::kABoxRows < schedule.m ? 2 : 1;
    const uint32_t slot_bytes =
        a_halves * Config::kAStageBytes / 2 + (lockstep ? Config::kBStageBytes : 0);
    memo.Reset();
    known.Reset();
    if (!draining && has_dependencies && !WaitForEpilogueInputs(ctx, node, index, row0, work.n_block, memo)) {
      draining = true;
    }
    // A's producers are known complete for the k-blocks below a_ready_end;
    // each wait looks many producer tile columns ahead.
    int a_ready_end = !draining && sched::HasProducerOperand(node.schedule, sched::DependencyOperand::kA) ? job.k_block_begin
                                                                                          : job.k_block_end;
    uint64_t a_dependency_ns = 0;  // for the trace
    for (int kb = job.k_block_begin; kb < job.k_block_end; ++kb) {
      const int32_t k0 = kb * kBlockK;
      if (kb >= a_ready_end) {
        const uint64_t start = traced ? ptx::globaltimer() : 0;
        a_ready_end = WaitForAProducersAhead<1>(ctx, node, index, row0, kb, job.k_block_end, known);
        if (a_ready_end < 0) {
          draining = true;
          a_ready_end = job.k_block_end;
        }
        if (traced) a_dependency_ns += ptx::globaltimer() - start;
      }
      WaitPhase(&ctx.barriers->a_empty[ring.stage], ring.phase ^ 1);
      uint64_t* full = &ctx.barriers->a_full[ring.stage];
      cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                           cuda::ptx::space_shared, full, slot_bytes);
      LoadOperandSlot(ctx, &node.a_map, &node.a_slot_map, ctx.a_stage(ring.stage), full, k0, row0,
                      Config::kABoxRows, share_a, a_halves);
      if (lockstep) {
        LoadOperandSlot(ctx, &node.b_map, &node.b_slot_map, ctx.b_stage(ring.stage), full, k0, n_row0,
                        Config::kBBoxRows, share_b);
      }
      ring.Advance(ctx.params.a_stages);
    }
    if (DeviceJobTrace* trace = ctx.trace_of(index, traced)) trace->a_dependency_ns = static_cast<uint32_t>(a_dependency_ns);
  }
}

// The B loader (split-ring mode only). B normally has no producer in the
// graph, so this thread runs ahead of A by up to b_stages slots, across job
// boundaries and across A's dependency waits.
template <class Config>
__device__ inline void RunBLoader(const CtaContext<Config>& ctx) {
  constexpr int kBlockK = Config::kBlockK;
  const bool lockstep = ctx.params.lockstep != 0;
  JobStream jobs;
  RingCursor ring;
  DependencyMemo memo;
  bool draining = false;
  {
    constexpr const CUtensorMap KernelNode::*kMaps[] = {&KernelNode::b_map, &KernelNode::b_slot_map};
    AcquireEveryNodesTensorMaps(ctx.params, kMaps);
  }
  const uint64_t policy = ptx::l2_evict_first_policy();
  for (;;) {
    const int index = jobs.Next(ctx);
    if (index < 0) return;
    if (lockstep) continue;  // the A loader carries B
    const CtaWork work = ResolveJob(ctx, index);
    const sched::TileJob job = *work.job;  // in registers; see the A loader
    if (job.kind != static_cast<uint8_t>(sched::JobKind::kGemm)) continue;
    const KernelNode& node = *work.node;
    // Looked up once per job, not per k-block.
    const bool b_has_producers = sched::HasProducerOperand(node.schedule, sched::DependencyOperand::kB);
    const bool share_b = SharesOperand(ctx, node, sched::ClusterShare::kShareB);
    // B read by this job only (one row block: no other job reads this tile
    // of it): its lines go first from L2, ahead of the activations, partials
    // and flags that are read again (128 tokens: MLP block 132.7 -> 128.2 us,
    // bench/NOTES.md v1.23). With more row blocks, other jobs re-read B.
    const bool read_once = node.schedule.m_blocks == 1;
    const int32_t n_row0 = work.n_block * Config::kBlockN;
    // Packed weights (Config::Packed): a stage is kBStageBytes contiguous
    // (32 KiB at 256 columns) instead of kBlockN rows K apart, one bulk copy,
    // or, with B shared by the cluster, one of half that (the CTA's half of
    // the rows) to both CTAs. The
    // runtime packs the nodes of at most two row blocks whose B no node
    // writes (plan_resources.cc, PackedNodesOf). Measured on the MLP block at 128
    // tokens: gate/up's main loops 58.5 us against 60.5, the down
    // projection's 27.2 against 29.4 (bench/NOTES.md v1.40). A stage per
    // k-block: the job's stages follow each other; with B shared, this CTA's
    // half sits at the same offset in the copy's stage as in the ring's. B
    // not shared means one row block (read once: evict-first, as the tensor
    // path). A cluster peer whose tile lies past N (it still runs the job's
    // ring steps) has no packed stages; its tensor loads read zeros.
    constexpr uint32_t kHalfStage = Config::kBStageBytes / 2;
    const uint32_t packed_half = share_b ? ctx.rank * kHalfStage : 0;
    const uint8_t* packed_stage =
        node.packed_b == nullptr || work.n_block >= node.schedule.n_blocks
            ? nullptr
            : node.packed_b + packed_half +
                  Config::Packed().StageOffset(work.n_block, job.k_block_begin,
                                               Config::Packed().StagesPerTile(node.schedule.k));
    memo.Reset();
    for (int kb = job.k_block_begin; kb < job.k_block_end; ++kb) {
      const int32_t k0 = kb * kBlockK;
      if (b_has_producers && !draining &&
          !WaitForProducers(ctx, node, index, sched::DependencyOperand::kB, n_row0,
                            n_row0 + Config::kBlockN, k0, k0 + kBlockK, memo)) {
        draining = true;
      }
      WaitPhase(&ctx.barriers->b_empty[ring.stage], ring.phase ^ 1);
      uint64_t* full = &ctx.barriers->b_full[ring.stage];
      const uint32_t slot_bytes = Config::kBStageBytes;
      cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta,
                                           cuda::ptx::space_shared, full, slot_bytes);
      if (packed_stage != nullptr) {
        if (share_b) {
          static_assert(Config::kMaxClusterSize == 2, "a shared B stage is two halves");
          cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                   ctx.b_stage(ring.stage) + packed_half, packed_stage, kHalfStage, full,
                                   uint16_t{0b11});
        } else {
          ptx::cp_async_bulk_l2_hint(ctx.b_stage(ring.stage), packed_stage, slot_bytes, full, policy);
        }
        packed_stage += slot_bytes;
      } else {
        LoadOperandSlot(ctx, &node.b_map, &node.b_slot_map, ctx.b_stage(ring.stage), full, k0, n_row0,
                        Config::kBBoxRows, share_b, 2, read_once, policy);
      }
      ring.Advance(ctx.params.b_stages);
    }
  }
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_LOADER_ROLE_CUH_
