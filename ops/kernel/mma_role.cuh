// mma_role.cuh: the consumer warpgroups' main loop. Each of the two consumer
// warpgroups multiplies its 64 rows of the A slot by the whole kBlockN-row B
// slot (four wgmma m64n256k16 per k-block into 128 FP32 registers per thread,
// or m64n128k16 into 64 with 128-column tiles).
//
// Release policy: the wgmmas of k-block i are committed as one group; after
// wgmma.wait_group<1> (only group i may still be running) the slots of k-block
// i - 1 are no longer read, so the warpgroup's first thread releases them to
// every CTA of the cluster. One MMA group stays in flight while the next slot
// is awaited. The SS (shared-memory A) form reads A until the group retires,
// so A cannot be released earlier than B here; the split rings still let B
// run ahead.
// One arrival for the warpgroup is enough because its warps cannot drift
// apart while they multiply: a wgmma group is the warpgroup's, so group i
// completes only once all four warps have issued it, and warp 0, having seen
// group i - 1 complete, releases reads that every warp has finished; a warp
// still behind waits on slot i or i + 1, never on the slot released. A
// warpgroup that does not multiply (compute == false) has no wgmma to hold
// its warps together, so they meet at the warpgroup's named barrier before
// each release: else warp 0 could release a slot that a lagging warp has
// yet to wait for, and that warp would wait on the slot's next phase
// forever. (A timing build without the meeting hung the 300-row chain once,
// bench/NOTES.md v1.71; rebuilt without it, the chain and
// BackToBackTiledChainTest ran over three thousand launches and never hung,
// v1.72: the race is argued, not reproduced.)
#ifndef LOOM_OPS_KERNEL_MMA_ROLE_CUH_
#define LOOM_OPS_KERNEL_MMA_ROLE_CUH_

#include "cta_context.cuh"
#include "wgmma.cuh"

namespace loom::kernel {

// Runs the k-blocks of one job. The ring waits have no time limit: the
// loaders keep both rings going even when the launch is aborting
// (watchdog.cuh).
// compute == false (this warpgroup's 64 rows are all past M, as in decode):
// the slots are still waited for and released in step with the other
// warpgroup and the peer CTA, but no wgmma is issued: for M <= 64 this halves
// the tensor work of a memory-bound job. (With half-size A stages, warpgroup
// 1's descriptor would point into the next stage; it never computes there.)
// One k16 step of the warpgroup's 64 x kBlockN tile, accumulating.
template <ElementType kHalf>
__device__ __forceinline__ void WgmmaTile(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
  wgmma_m64n256k16<kHalf>(d, desc_a, desc_b, /*accumulate=*/true);
}
template <ElementType kHalf>
__device__ __forceinline__ void WgmmaTile(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  wgmma_m64n128k16<kHalf>(d, desc_a, desc_b, /*accumulate=*/true);
}

// NOTE: the path from a k-block's full waits to its first wgmma was tried
// shorter, all measured against this loop (bench/NOTES.md): polling k-block
// i + 1's slots before releasing i - 1's, 2-9% slower on 200-1024-row GEMMs
// (v1.87); both polls' first tries issued together, the kernel arguments the
// loop reads held in registers instead of reread from the constant bank,
// and the descriptors made before the waits, each level (v1.88).
template <class Config>
__device__ inline void RunMainLoop(const CtaContext<Config>& ctx, const CtaWork& work, int warpgroup, bool compute,
                                   RingCursor& a_ring, RingCursor& b_ring,
                                   float (&accumulators)[Config::kAccumulators]) {
  const bool lockstep = ctx.params.lockstep != 0;
  const int a_stages = ctx.params.a_stages;
  const int b_stages = ctx.params.b_stages;
  const bool release_thread = (threadIdx.x % 128) == 0;
  const uint32_t warpgroup_barrier = static_cast<uint32_t>(NamedBarrier::kConsumer0) + warpgroup;
  const int k_blocks = work.job->k_block_end - work.job->k_block_begin;
  const uint32_t a_ring_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.a_ring)) +
                               warpgroup * Config::kRowsPerConsumer * Config::kPanelBytes;
  const uint32_t b_ring_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.b_ring));

  // Zeroed here, before the first fence, rather than by the first wgmma's
  // scale-d: see the note on C7515 above RunConsumer (consumer_role.cuh).
#pragma unroll
  for (int r = 0; r < Config::kAccumulators; ++r) accumulators[r] = 0.0f;
  for (int i = 0; i < k_blocks; ++i) {
    WaitPhase(&ctx.barriers->a_full[a_ring.stage], a_ring.phase);
    if (!lockstep) WaitPhase(&ctx.barriers->b_full[b_ring.stage], b_ring.phase);
    const uint64_t desc_a =
        MakeSwizzle128Descriptor(a_ring_base + a_ring.stage * ctx.params.a_stage_bytes);
    // Lockstep mode keeps B in the slot of the same index as A.
    const int b_stage = lockstep ? a_ring.stage : b_ring.stage;
    const uint64_t desc_b = MakeSwizzle128Descriptor(b_ring_base + b_stage * Config::kBStageBytes);
    if (compute) {
      ptx::wgmma_fence();
#pragma unroll
      for (int k16 = 0; k16 < Config::kBlockK / 16; ++k16) {
        WgmmaTile<Config::kHalf>(accumulators, AdvanceDescriptorK16(desc_a, k16), AdvanceDescriptorK16(desc_b, k16));
      }
      ptx::wgmma_commit_group();
    }
    if (i > 0) {
      ptx::wgmma_wait_group<1>();
      if (!compute) ptx::barrier_at<128>(warpgroup_barrier);
      if (release_thread) {
        ctx.ArriveOnEveryCta(&ctx.barriers->a_empty[a_ring.Previous(a_stages)]);
        if (!lockstep) ctx.ArriveOnEveryCta(&ctx.barriers->b_empty[b_ring.Previous(b_stages)]);
      }
    }
    a_ring.Advance(a_stages);
    if (!lockstep) b_ring.Advance(b_stages);
  }
  ptx::wgmma_wait_group<0>();
  if (k_blocks > 0 && !compute) ptx::barrier_at<128>(warpgroup_barrier);
  if (k_blocks > 0 && release_thread) {
    ctx.ArriveOnEveryCta(&ctx.barriers->a_empty[a_ring.Previous(a_stages)]);
    if (!lockstep) ctx.ArriveOnEveryCta(&ctx.barriers->b_empty[b_ring.Previous(b_stages)]);
  }
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_MMA_ROLE_CUH_
