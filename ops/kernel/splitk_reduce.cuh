// splitk_reduce.cuh: the consumer side of a split-K reduce job. The split
// jobs store raw fp32 partials of their CTA tile into the node's workspace
// slice (store_role.cuh) and release one partial flag each; the reduce job of
// that tile waits for every split's flag, sums the partials in split order
// (bit-identical every run) into the accumulator layout, and then runs the
// node's fused epilogue like any tile (consumer_role.cuh).
#ifndef LOOM_OPS_KERNEL_SPLITK_REDUCE_CUH_
#define LOOM_OPS_KERNEL_SPLITK_REDUCE_CUH_

#include "cta_context.cuh"

namespace loom::kernel {

// Where this lane's accumulator rows live in a split-K partial: its two rows
// (lane / 4 and 8 further, of its warp's 16) in split 0's slice of the
// workspace (layout: schedule.h, workspace_offset), pointing at the lane's
// first column pair; each further split is `split_stride` floats on.
struct LanePartialRows {
  float* lo;
  float* hi;
  int64_t split_stride;
  bool lo_ok, hi_ok;  // the row is inside M

  __device__ LanePartialRows(const CtaContext& ctx, const CtaWork& work, int warpgroup) {
    const sched::NodeSchedule& schedule = work.node->schedule;
    const int warp = (threadIdx.x / 32) % 4;
    const int lane = threadIdx.x % 32;
    const int64_t padded_cols = int64_t{schedule.n_blocks} * KernelConfig::kBlockN;
    const int64_t row_lo = int64_t{work.m_block} * KernelConfig::kBlockM +
                           warpgroup * KernelConfig::kRowsPerConsumer + warp * 16 + lane / 4;
    split_stride = int64_t{schedule.m_blocks} * KernelConfig::kBlockM * padded_cols;
    lo_ok = row_lo < schedule.m;
    hi_ok = row_lo + 8 < schedule.m;
    lo = ctx.params.workspace + schedule.workspace_offset + row_lo * padded_cols +
         int64_t{work.n_block} * KernelConfig::kBlockN + 2 * (lane % 4);
    hi = lo + 8 * padded_cols;
  }
};

// A split-K partial whose CTA tile has at most this many rows inside M (one
// consumer warp's rows: decode, a few tokens) is written by the consumers
// straight from registers to the workspace, live rows only, instead of eight
// fp32 panels staged for TMA stores that clip all but a row or two. The store
// thread then only publishes it (store_role.cuh), after one staging handshake
// per warpgroup that orders the consumers' stores before its flag release.
constexpr int kDirectPartialRows = 16;

__device__ inline bool StoresPartialDirectly(const sched::NodeSchedule& schedule, int32_t m_block) {
  return schedule.m - int64_t{m_block} * KernelConfig::kBlockM <= kDirectPartialRows;
}

// The consumer side of a direct partial (StoresPartialDirectly): this lane's
// accumulators of rows inside M, as float2 pairs, into the split's workspace
// slice (layout: schedule.h, workspace_offset).
__device__ inline bool StorePartialDirectly(const CtaContext& ctx, const CtaWork& work, int warpgroup,
                                            RingCursor& staging, const float (&acc)[128], int job_index) {
  const LanePartialRows rows(ctx, work, warpgroup);
  float* lo = rows.lo + work.job->split * rows.split_stride;
  float* hi = rows.hi + work.job->split * rows.split_stride;
  if (!WaitForStaging(ctx, warpgroup, staging, job_index)) return false;
#pragma unroll
  for (int c = 0; c < 32; ++c) {  // 8-column chunk c: registers 4c..4c+3
    if (rows.lo_ok) *reinterpret_cast<float2*>(lo + 8 * c) = make_float2(acc[4 * c], acc[4 * c + 1]);
    if (rows.hi_ok) *reinterpret_cast<float2*>(hi + 8 * c) = make_float2(acc[4 * c + 2], acc[4 * c + 3]);
  }
  PublishPanel(ctx, warpgroup, staging);
  return true;
}

// Split-K reduce, part 1: waits until every split of this CTA tile has
// published its partial. Called by every thread of the consumer warpgroup:
// thread t waits for split t's flag (and t + 128, ...), so the splits are
// polled together, one round trip to L2 rather than one per split; the
// barrier then hands each thread's acquire on to the whole warpgroup. Returns
// false (in every thread) when the launch is aborting.
// NOTE: the reduce job runs the epilogue but does not wait for a bias or
// residual that another node produces: every split job's A loader already
// waited for them (acquire) before its first load, and the split's partial
// flag is released after that, so acquiring all partial flags orders the
// reduce after the producers too (release/acquire chains are transitive).
// Waiting here again put the loaders' dependency code into the consumer role
// and its register pressure into the main loop (spills, a quarter of the
// GEMM throughput lost).
__device__ inline bool WaitForPartials(const CtaContext& ctx, const CtaWork& work, int warpgroup, int job_index) {
  const sched::NodeSchedule& schedule = work.node->schedule;
  const int split_k = schedule.split_k;
  const int first_flag = schedule.partial_flag_base + (work.m_block * schedule.n_blocks + work.n_block) * split_k;
  bool ok = true;
  for (int split = threadIdx.x % 128; ok && split < split_k; split += 128) {
    ok = WaitForFlag(ctx, first_flag + split, job_index);
  }
  static_assert(KernelConfig::kConsumerWarpgroups == 2, "one named barrier per consumer warpgroup");
  return warpgroup == 0 ? ptx::barrier_and<1, 128>(ok) : ptx::barrier_and<2, 128>(ok);
}

// Split-K reduce, part 2: sums the partials in split order (the same order
// every run, so the result is bit-for-bit reproducible) into the accumulator
// layout.
__device__ inline void SumPartials(const CtaContext& ctx, const CtaWork& work, int warpgroup, float (&acc)[128]) {
  const int split_k = work.node->schedule.split_k;
  const LanePartialRows rows(ctx, work, warpgroup);
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  for (int split = 0; split < split_k; ++split) {
    const float* lo = rows.lo + split * rows.split_stride;
    const float* hi = rows.hi + split * rows.split_stride;
#pragma unroll
    for (int c = 0; c < 32; ++c) {  // 8-column chunk c: registers 4c..4c+3
      if (rows.lo_ok) {
        const float2 v = *reinterpret_cast<const float2*>(lo + 8 * c);
        acc[4 * c] += v.x;
        acc[4 * c + 1] += v.y;
      }
      if (rows.hi_ok) {
        const float2 v = *reinterpret_cast<const float2*>(hi + 8 * c);
        acc[4 * c + 2] += v.x;
        acc[4 * c + 3] += v.y;
      }
    }
  }
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_SPLITK_REDUCE_CUH_
