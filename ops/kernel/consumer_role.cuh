// consumer_role.cuh: the two consumer warpgroups' job loop. Per job: the
// main loop (mma_role.cuh) or, for a split-K reduce job, the sum of the
// partials (splitk_reduce.cuh); then the fused epilogue into C
// (epilogue_role.cuh), or the raw accumulators into the workspace for a
// split-K partial (but the last split of a node whose last split sums: the
// other splits' partials added to its accumulators, then the epilogue).
#ifndef LOOM_OPS_KERNEL_CONSUMER_ROLE_CUH_
#define LOOM_OPS_KERNEL_CONSUMER_ROLE_CUH_

#include "cta_context.cuh"
#include "epilogue_role.cuh"
#include "mma_role.cuh"
#include "splitk_reduce.cuh"

namespace loom::kernel {

// The consumer warpgroup, job after job: the main loop (or, for a split-K
// reduce job, the sum of the partials), then the epilogue: fused ops into the
// output, or the raw accumulators into the workspace for a split-K partial.
// NOTE: ptxas serialises every wgmma of the kernel (C7515) when it cannot
// prove that no other instruction writes the accumulator registers while a
// wgmma group is in flight. The reduce path writes an accumulator array with
// ordinary adds, so (1) it has its own array, scoped to the reduce branch,
// (2) the main loop's array is zeroed per job rather than overwritten by the
// first wgmma's scale-d predicate, so it is dead between jobs and the two
// arrays share registers instead of spilling, and (3) plans without split-K
// launch the kSplitK = false instantiation, which has no reduce path at all.
// The build refuses a kernel with C7515 (tests/kernel_codegen_check.cmake).
// Forced inline: once outlined by nvcc (it happened as the reduce path grew),
// the consumers' state crossed a call and the kernel spilled more.
template <bool kSplitK, class Config>
__device__ __forceinline__ void RunConsumer(const CtaContext<Config>& ctx, int warpgroup) {
  const bool recorder = warpgroup == 0 && threadIdx.x % 128 == 0;  // writes the job traces
  JobStream jobs;
  RingCursor a_ring, b_ring, staging;
  for (;;) {
    // Converged, as the narrow kernel's consumers are: Next reads the slot
    // and arrives once a warp, by the lanes active, so a warp that reached
    // it split would arrive twice and free the slot early. (ptxas
    // reconverges the warp here by itself today; this says so.)
    __syncwarp();
    const int index = jobs.Next(ctx);
    if (index < 0) return;
    StartTrace(ctx, index, recorder);
    const CtaWork work = ResolveJob(ctx, index);
    const KernelNode& node = *work.node;
    const int64_t row0 = WarpgroupRow0(work, warpgroup);
    // A gemm job's HandsOverRows (the store thread expects its staging).
    const bool rows_in_range = work.in_range && row0 < node.schedule.m;
    if (kSplitK && work.job->kind == static_cast<uint8_t>(sched::JobKind::kReduce)) {
      // A few-row job's rows (its tile's, or its part's) are taken as
      // warpgroup 0's; warpgroup 1 helps sum them when there are two or
      // more. A launch that is aborting sums whatever the partials hold
      // (partials_ready false: their waits gave up), as every role drains.
      const bool few_rows = work.in_range && SumsFewRows(node.schedule, work.m_block);
      const bool helps = few_rows && SumsWithBothWarpgroups(node.schedule, work.m_block, work.job->split);
      if (!HandsOverRows(work, warpgroup) && !helps) continue;
      const bool partials_ready = WaitForPartials(ctx, work, node.schedule.split_k, warpgroup, index);
      RecordTrace(ctx, index, recorder, &DeviceJobTrace::data_ready);
      float sums[Config::kAccumulators];
      bool stored = false;  // by the decode path, straight into C
      if (few_rows) {
        SumFewRowPartials(ctx, work, warpgroup, staging, partials_ready, sums, &stored);
        if (warpgroup == 1) continue;  // warpgroup 0 finishes the tile
      } else {
        SumPartials(ctx, work, warpgroup, sums);
      }
      RecordTrace(ctx, index, recorder, &DeviceJobTrace::mma_done);
      if (stored) {
        // The handshake orders every thread's stores before the store
        // thread's flag release.
        WaitForStaging(ctx, warpgroup, staging);
        PublishPanel(ctx, warpgroup, staging);
      } else {
        StageOutput<!kSplitK>(ctx, work, node, warpgroup, staging, sums);
      }
    } else {
      if (ctx.params.trace != nullptr && recorder && work.job->k_block_end > work.job->k_block_begin) {
        // Waiting for the first slot here too is harmless: the main loop's
        // wait on the same phase then returns at once.
        WaitPhase(&ctx.barriers->a_full[a_ring.stage], a_ring.phase);
        RecordTrace(ctx, index, recorder, &DeviceJobTrace::data_ready);
      }
      float accumulators[Config::kAccumulators];
      RunMainLoop(ctx, work, warpgroup, rows_in_range, a_ring, b_ring, accumulators);
      RecordTrace(ctx, index, recorder, &DeviceJobTrace::mma_done);
      if (!rows_in_range) continue;
      // NOTE: the job is resolved again (a few cached loads) rather than kept
      // in registers across the main loop, where every register is an
      // accumulator or ring state (spilled ring cursors cost ~5% at 8192^3).
      const CtaWork tile = ResolveJob(ctx, index);
      const bool sums_tile = kSplitK && sched::FinishesSplitTile(tile.node->schedule, *tile.job);
      if (kSplitK && tile.node->schedule.split_k > 1 && !sums_tile) {
        // A partial: the raw accumulators of the whole padded tile (no fused
        // op, every column inside the workspace map), or, for a tile of at
        // most 64 rows, only its live rows, straight from registers.
        if (StoresPartialDirectly(tile.node->schedule, tile.m_block)) {
          StorePartialDirectly(ctx, tile, warpgroup, staging, accumulators);
        } else {
          StagePlainTile<ElementType::kFP32>(ctx, warpgroup, staging, accumulators);
        }
      } else {
        // The epilogue's bias and residual reads are ordered after their
        // producers through the A loader: it acquires their flags before the
        // job's first A stage, whose full barrier this warpgroup waited on
        // in the main loop. A job of no k-blocks (K = 0) has no such stage,
        // so nothing here orders its reads; the graph's validation refuses a
        // K = 0 node whose bias or residual another node writes (rule 10,
        // runtime/src/graph.cc).
        if (sums_tile) {
          // The last split sums the tile: the others' partials added to its
          // own accumulators, then the epilogue, as a reduce job's would be
          // (whatever the partials hold when their waits gave up: draining).
          const int32_t summed = sched::PartialsSummedWithoutWholeTiles(tile.node->schedule, *tile.job);
          WaitForPartials(ctx, tile, summed, warpgroup, index);
          AddPartials(ctx, tile, warpgroup, summed, accumulators);
        }
        StageOutput<!kSplitK>(ctx, tile, *tile.node, warpgroup, staging, accumulators);
      }
    }
    RecordTrace(ctx, index, recorder, &DeviceJobTrace::staged);
  }
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_CONSUMER_ROLE_CUH_
