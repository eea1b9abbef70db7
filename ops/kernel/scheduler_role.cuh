// scheduler_role.cuh: job fetch. One thread of cluster rank 0 takes queue
// indices with one atomicAdd each (dynamic load balancing across clusters) and
// hands them to every role of both CTAs through the job slots (protocol in
// cta_context.cuh). The queue is a topological order of the dependencies, so
// indices are handed out in an order in which every job's producers were
// handed out before it.
//
// A cluster holds at most one job that cannot start yet: while the last job
// it fetched still waits for its inputs, it fetches nothing more. Without
// that, a cluster with nothing to do at launch took a job slot's worth of
// jobs that all waited on the same producers and then ran them one after
// another, while other clusters sat idle (the MLP block's two modes, v1.9).
// Holding back never blocks progress: the held job's producers were handed
// out before it, to running clusters.
#ifndef LOOM_OPS_KERNEL_SCHEDULER_ROLE_CUH_
#define LOOM_OPS_KERNEL_SCHEDULER_ROLE_CUH_

#include "cta_context.cuh"
#include "dependencies.cuh"

namespace loom::kernel {

// The tiled kernel's first-wave spread (KernelConfig::kFirstFetchSpreadCycles):
// with KernelParams::first_fetch_spread_cycles set, each cluster's scheduler
// waits that many cycles times a rank in [0, clusters) before its first fetch,
// the rank a hash of its SM, so that the clusters that take the first wave's
// jobs (first come, first served) are spread over the chip instead of
// filling the GPCs that the launch placed first. A soft order: ranks may
// collide and setup times vary; any order of fetches is correct.
__device__ inline void SpreadFirstFetch(const KernelParams& params) {
  uint32_t h = ptx::smid() * 0x9E3779B1u;  // a multiplicative hash, then its high bits mixed down
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  const uint32_t start = static_cast<uint32_t>(clock());
  const uint32_t cycles = h % SchedulerCount(params) * params.first_fetch_spread_cycles;
  while (static_cast<uint32_t>(clock()) - start < cycles) {
  }
}

// `first_fetch`: the first index to hand out, already known (the tiled
// kernel's first atomicAdd on the cursor, made during its set-up beside the
// epoch read; the narrow kernel's CTA's own index), or -1. Later indices are
// `dynamic_base` + what atomicAdd on the cursor returns: the narrow kernel
// hands its first wave out statically (queue index = CTA index), so its
// dynamic fetches start past the grid. `after_first_post` runs once the first
// index was handed to the roles and before anything else (the narrow kernel
// waits there for the previous launch: the first post reads no memory another
// launch writes). `await_first_fetches`: 0, or how many first fetches (one a
// scheduler, all made at set-up) the cursor must count before this
// scheduler's second fetch: with SpreadFirstFetch, a cluster that fetched
// early would otherwise take a second job of the first wave while a later
// one finds none (the MLP block at 128 tokens took 152 us against 126,
// bench/NOTES.md v1.39). It never waits long: every scheduler makes its first
// fetch unconditionally.
template <typename Ctx, typename AfterFirstPost>
__device__ inline void RunScheduler(const Ctx& ctx, int first_fetch, uint32_t dynamic_base,
                                    uint32_t await_first_fetches, AfterFirstPost&& after_first_post) {
  RingCursor slot;
  const uint32_t slots_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.job_slots));
  const uint32_t full_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.barriers->job_full));
  int last = -1;  // the last job fetched
  if constexpr (Ctx::kPacesClaims) ctx.ResetLoaderNear();
  for (;;) {
    // Cluster scope only where the slots span a cluster (JobStream::Next).
    ctx.WaitJobSlot(&ctx.barriers->job_empty[slot.stage], slot.phase ^ 1, Ctx::Config::kJobSlotsAcrossCluster);
    // The two waits below have a time limit. One that gives up (the launch
    // is aborting) hands the job out anyway: every role drains (watchdog.cuh),
    // and the scheduler hands out the rest of the queue, whose jobs no longer
    // wait for their producers (every bounded wait gives up at once after an
    // abort).
    if (last >= 0) {
      const InputFlags inputs = FindInputFlags(ctx, last);
      ctx.watchdog.SpinUntil(
          [&] {
            if (InputsReady(ctx, inputs, last)) return true;
            __nanosleep(256);
            return false;
          },
          WaitKind::kHeldJobInputs, last);
      // Claim pacing (the narrow kernel's, NarrowContext::LoaderNear): and
      // until this CTA's B loader nears the last job's end. A wait on this
      // CTA's own loader, which never waits for a claim, so it always ends;
      // bounded by the watchdog like the wait above all the same. NOTE: a
      // separate wait, not folded into the one above: that changed the tiled
      // kernels' register allocation.
      if constexpr (Ctx::kPacesClaims) {
        ctx.watchdog.SpinUntil(
            [&] {
              if (ctx.LoaderNear(last)) return true;
              __nanosleep(64);
              return false;
            },
            WaitKind::kHeldJobInputs, last);
      }
    }
    if (await_first_fetches != 0 && first_fetch < 0) {
      ctx.watchdog.SpinUntil([&] { return ptx::ld_volatile(&ctx.params.state->cursor) >= await_first_fetches; },
                             WaitKind::kFirstFetches, last);
      await_first_fetches = 0;
    }
    int index = first_fetch >= 0 ? first_fetch
                                 : static_cast<int>(dynamic_base + atomicAdd(&ctx.params.state->cursor, 1u));
    first_fetch = -1;
    if (index >= ctx.params.num_jobs) index = -1;
    for (int r = 0; r < ctx.params.cluster_size; ++r) {
      ptx::st_shared_cluster(ptx::mapa_shared_cluster(slots_base + slot.stage * sizeof(int32_t), r), index);
      ptx::mbarrier_arrive_cluster(
          ptx::mapa_shared_cluster(full_base + slot.stage * sizeof(uint64_t), r));
    }
    if (last < 0) after_first_post();
    if (index < 0) return;
    last = index;
    slot.Advance(Ctx::Config::kJobSlots);
  }
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_SCHEDULER_ROLE_CUH_
