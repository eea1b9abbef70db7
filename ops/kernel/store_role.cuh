// store_role.cuh: the store thread (one thread of the producer warpgroup).
// Per job it issues a TMA store per staged panel (clipped to the tensor by the
// hardware; split-K partials go to the workspace through a 3-D map), hands
// each staging buffer back once the TMA engine has read it, and once the
// tile's stores are complete marks the tile's flag with the launch epoch.
// It waits for nothing but its own CTA's consumers, so it never gives up:
// in a launch that is aborting it stores and publishes what the draining
// roles computed. Protocol and fences: cta_context.cuh.
#ifndef LOOM_OPS_KERNEL_STORE_ROLE_CUH_
#define LOOM_OPS_KERNEL_STORE_ROLE_CUH_

#include <cuda/ptx>

#include "cta_context.cuh"
#include "epilogue_role.cuh"
#include "splitk_reduce.cuh"

namespace loom::kernel {

// The store thread.
template <class Config>
__device__ inline void RunStore(const CtaContext<Config>& ctx) {
  JobStream jobs;
  RingCursor staging[Config::kConsumerWarpgroups];
  {
    constexpr const CUtensorMap KernelNode::*kMaps[] = {&KernelNode::c_map, &KernelNode::partial_map};
    AcquireEveryNodesTensorMaps(ctx.params, kMaps);
  }
  for (;;) {
    const int index = jobs.Next(ctx);
    if (index < 0) break;
    const CtaWork work = ResolveJob(ctx, index);
    if (!work.in_range) continue;
    const KernelNode& node = *work.node;
    const sched::TileJob job = *work.job;
    // A split-K partial goes to the node's workspace slice, raw fp32, whole
    // padded tile; everything else (unsplit jobs, reduce jobs, the last split
    // of a node whose last split sums) to C.
    const bool partial = job.kind == static_cast<uint8_t>(sched::JobKind::kGemm) && node.schedule.split_k > 1 &&
                         !sched::FinishesSplitTile(node.schedule, job);
    const bool reduce = job.kind == static_cast<uint8_t>(sched::JobKind::kReduce);
    // The consumers wrote a direct partial, or a few-row reduce's output,
    // themselves: one handshake per warpgroup with rows, nothing to store,
    // then the flag.
    const bool direct = partial ? StoresPartialDirectly(node.schedule, work.m_block)
                                : reduce && ReduceStoresDirectly(node, work.m_block, work.n_block);
    const int cols_per_panel =
        Config::kPanelBytes / (partial || node.out_type == ElementType::kFP32 ? 4 : 2);
    const int32_t out_tile_n = partial ? Config::kBlockN : node.schedule.out_tile_n;
    const int panels = direct    ? 1
                       : partial ? Config::kBlockN / cols_per_panel
                                 : OutputPanels(node.schedule.out_cols, out_tile_n, cols_per_panel, work.n_block);
    const int64_t tma_cols = partial ? int64_t{node.schedule.n_blocks} * Config::kBlockN : node.c_tma_cols;
    const int64_t row0 = static_cast<int64_t>(work.m_block) * Config::kBlockM;
    bool hands_over[Config::kConsumerWarpgroups];
#pragma unroll
    for (int w = 0; w < Config::kConsumerWarpgroups; ++w) hands_over[w] = HandsOverRows(work, w);
    const int64_t out_col0 = static_cast<int64_t>(work.n_block) * out_tile_n;
    // One store stays in flight: a panel's buffer is handed back once the
    // next store is issued and wait_group.read<1> says the older one was read.
    uint64_t* pending_empty = nullptr;
    for (int p = 0; p < panels; ++p) {
      for (int w = 0; w < Config::kConsumerWarpgroups; ++w) {
        if (!hands_over[w]) continue;
        const int64_t rows = row0 + w * Config::kRowsPerConsumer;
        RingCursor& cursor = staging[w];
        WaitPhase(&ctx.barriers->staging_full[w][cursor.stage], cursor.phase);
        const int64_t panel_col0 = out_col0 + p * cols_per_panel;
        if (direct) {
          // written by the consumers (StorePartialDirectly, SumFewRowPartials)
        } else if (partial) {
          const int32_t coords[3] = {static_cast<int32_t>(panel_col0), static_cast<int32_t>(rows),
                                     static_cast<int32_t>(job.split)};
          cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, &node.partial_map,
                                          coords, ctx.staging_panel(w, cursor.stage));
        } else if (panel_col0 < tma_cols) {  // else the consumers stored this panel directly
          const int32_t coords[2] = {static_cast<int32_t>(panel_col0), static_cast<int32_t>(rows)};
          cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, &node.c_map,
                                          coords, ctx.staging_panel(w, cursor.stage));
        }
        cuda::ptx::cp_async_bulk_commit_group();  // possibly empty: keeps the group count uniform
        if (pending_empty != nullptr) {
          cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<1>{});
          cuda::ptx::mbarrier_arrive(pending_empty);
        }
        pending_empty = &ctx.barriers->staging_empty[w][cursor.stage];
        cursor.Advance(Config::kStagingBuffers);
      }
    }
    if (pending_empty != nullptr) {
      cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
      cuda::ptx::mbarrier_arrive(pending_empty);
    }
    if (partial || node.has_dependents) {
      // Completed (not just read), then visible to generic-proxy acquirers,
      // then published. A partial always has a reader: its tile's reduce job.
      cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
      cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
      const int flag = partial ? sched::PartialFlagIndex(node.schedule, work.m_block, work.n_block, job.split)
                               : sched::OutputFlagIndex(node.schedule, work.m_block, work.n_block);
      // A tile reduced in parts is published by the part that completes it.
      const bool in_parts = reduce && node.schedule.reduce_parts > 1;
      if (!in_parts || FinishesReducePart(ctx, node.schedule, work.m_block, work.n_block)) {
        ptx::st_release_gpu(&ctx.params.flags[flag], ctx.epoch);
      }
    }
    if (ctx.params.trace != nullptr) {
      cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
      RecordTrace(ctx, index, /*recorder=*/true, &DeviceJobTrace::published);
    }
  }
  cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_STORE_ROLE_CUH_
