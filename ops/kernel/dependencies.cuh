// dependencies.cuh: what a job waits for before it can start. The A loader
// waits for the producer tiles of each slice of A it loads (WaitForProducers);
// the scheduler looks, without waiting, whether a job it handed out can start
// yet (JobInputsReady), and holds back further fetches while it cannot.
#ifndef LOOM_OPS_KERNEL_DEPENDENCIES_CUH_
#define LOOM_OPS_KERNEL_DEPENDENCIES_CUH_

#include "cta_context.cuh"

namespace loom::kernel {

// Waits until every producer tile that elements [row_begin, row_end) x
// [col_begin, col_end) of `operand` read is complete in this epoch. The memo
// remembers the last box known complete, so the k-blocks that fall inside one
// producer tile poll its flag once.
struct DependencyMemo {
  int dependency = -1;
  sched::TileBox satisfied;
  __device__ void Reset() { dependency = -1; }
  __device__ bool Covers(int d, const sched::TileBox& box) const {
    return d == dependency && box.m_begin >= satisfied.m_begin && box.m_end <= satisfied.m_end &&
           box.n_begin >= satisfied.n_begin && box.n_end <= satisfied.n_end;
  }
};

__device__ inline bool WaitForProducers(const CtaContext& ctx, const KernelNode& node, int job_index,
                                        sched::DependencyOperand operand, int64_t row_begin,
                                        int64_t row_end, int64_t col_begin, int64_t col_end,
                                        DependencyMemo& memo) {
  const sched::NodeSchedule& schedule = node.schedule;
  bool waited = false;
  for (int d = 0; d < schedule.dependency_count; ++d) {
    const sched::DependencyEdge& edge = ctx.params.dependencies[schedule.dependency_begin + d];
    if (edge.operand != static_cast<uint8_t>(operand)) continue;
    const sched::NodeSchedule& producer = ctx.params.nodes[edge.producer].schedule;
    const sched::TileBox box =
        sched::ProducerTiles(producer, KernelConfig::tile(), edge, row_begin, row_end, col_begin, col_end);
    if (box.empty()) continue;
    if (memo.Covers(d, box)) continue;
    for (int mb = box.m_begin; mb < box.m_end; ++mb) {
      for (int nb = box.n_begin; nb < box.n_end; ++nb) {
        if (!WaitForFlag(ctx, sched::OutputFlagIndex(producer, mb, nb), job_index)) return false;
      }
    }
    memo.dependency = d;
    memo.satisfied = box;
    waited = true;
  }
  // The producer wrote through the async proxy (TMA store) and released the
  // flag after a proxy fence; this fence orders our acquire before the TMA
  // loads (async proxy) we are about to issue.
  if (waited) cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
  return true;
}

// Whether every producer tile that elements [row_begin, row_end) x
// [col_begin, col_end) of `operand` read is complete in this epoch already,
// checked without waiting: relaxed reads, kBatch of them in flight together.
// It acquires nothing: a caller that goes on to read the producers' data must
// still wait (WaitForProducers) or fence.
__device__ inline bool ProducersDone(const CtaContext& ctx, const KernelNode& node, sched::DependencyOperand operand,
                                     int64_t row_begin, int64_t row_end, int64_t col_begin, int64_t col_end) {
  constexpr int kBatch = 8;
  const sched::NodeSchedule& schedule = node.schedule;
  for (int d = 0; d < schedule.dependency_count; ++d) {
    const sched::DependencyEdge& edge = ctx.params.dependencies[schedule.dependency_begin + d];
    if (edge.operand != static_cast<uint8_t>(operand)) continue;
    const sched::NodeSchedule& producer = ctx.params.nodes[edge.producer].schedule;
    const sched::TileBox box =
        sched::ProducerTiles(producer, KernelConfig::tile(), edge, row_begin, row_end, col_begin, col_end);
    if (box.empty()) continue;
    const int cols = box.n_end - box.n_begin;
    const int count = (box.m_end - box.m_begin) * cols;
    for (int i0 = 0; i0 < count; i0 += kBatch) {
      uint32_t seen[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = i0 + u;
        if (i < count) {
          seen[u] = ptx::ld_relaxed_gpu(
              &ctx.params.flags[sched::OutputFlagIndex(producer, box.m_begin + i / cols, box.n_begin + i % cols)]);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        if (i0 + u < count && static_cast<int32_t>(seen[u] - ctx.epoch) < 0) return false;
      }
    }
  }
  return true;
}

// Whether queue entry `index` could start now: the A producers of a GEMM
// job's first k-blocks (up to where the A loader would wait again,
// a_wait_k_blocks), or a reduce job's partials, are complete. A job that can
// start works through its k-blocks as their producers finish. Looks at the
// cluster's first CTA tile only (a hint for pacing the fetch, not a wait that
// orders anything).
__device__ inline bool JobInputsReady(const CtaContext& ctx, int index) {
  const sched::TileJob& job = ctx.params.queue[index];
  const KernelNode& node = ctx.params.nodes[job.node];
  const sched::NodeSchedule& schedule = node.schedule;
  const sched::CtaTile tile = sched::CtaTileOf(job, schedule.share, 0);
  if (job.kind == static_cast<uint8_t>(sched::JobKind::kReduce)) {
    const int first = schedule.partial_flag_base + (tile.m_block * schedule.n_blocks + tile.n_block) * schedule.split_k;
    for (int split = 0; split < schedule.split_k; ++split) {
      if (static_cast<int32_t>(ptx::ld_relaxed_gpu(&ctx.params.flags[first + split]) - ctx.epoch) < 0) return false;
    }
    return true;
  }
  if (schedule.dependency_count == 0) return true;
  const int64_t row0 = int64_t{tile.m_block} * KernelConfig::kBlockM;
  const int64_t first_wait_end = (int64_t{job.k_block_begin} / schedule.a_wait_k_blocks + 1) * schedule.a_wait_k_blocks;
  const int64_t k_end = first_wait_end < job.k_block_end ? first_wait_end : int64_t{job.k_block_end};
  return ProducersDone(ctx, node, sched::DependencyOperand::kA, row0, row0 + KernelConfig::kBlockM,
                       int64_t{job.k_block_begin} * KernelConfig::kBlockK, k_end * KernelConfig::kBlockK);
}

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_DEPENDENCIES_CUH_
