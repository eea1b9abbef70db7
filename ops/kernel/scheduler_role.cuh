// scheduler_role.cuh: job fetch. One thread of cluster rank 0 takes queue
// indices with one atomicAdd each (dynamic load balancing across clusters) and
// hands them to every role of both CTAs through the job slots (protocol in
// cta_context.cuh). The queue is a topological order of the dependencies, so
// indices are handed out in an order in which every job's producers were
// handed out before it.
#ifndef LOOM_OPS_KERNEL_SCHEDULER_ROLE_CUH_
#define LOOM_OPS_KERNEL_SCHEDULER_ROLE_CUH_

#include "cta_context.cuh"

namespace loom::kernel {

__device__ inline void RunScheduler(const CtaContext& ctx) {
  RingCursor slot;
  const uint32_t slots_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.job_slots));
  const uint32_t full_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.barriers->job_full));
  for (;;) {
    if (!ctx.watchdog.WaitBarrier(&ctx.barriers->job_empty[slot.stage], slot.phase ^ 1,
                                  WaitKind::kJobSlot, -1, Watchdog::kClusterScope)) {
      return;
    }
    int index = static_cast<int>(atomicAdd(&ctx.params.state->cursor, 1u));
    if (index >= ctx.params.num_jobs) index = -1;
    for (int r = 0; r < ctx.params.cluster_size; ++r) {
      ptx::st_shared_cluster(ptx::mapa_shared_cluster(slots_base + slot.stage * sizeof(int32_t), r), index);
      ptx::mbarrier_arrive_cluster(
          ptx::mapa_shared_cluster(full_base + slot.stage * sizeof(uint64_t), r));
    }
    if (index < 0) return;
    slot.Advance(KernelConfig::kJobSlots);
  }
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_SCHEDULER_ROLE_CUH_
