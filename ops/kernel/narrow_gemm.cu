// narrow_gemm.cu: loom's narrow decode kernel, for plans whose every node has
// at most 64 rows (why: narrow_config.h). Persistent like the tiled kernel
// (persistent_gemm.cu), with the same job queue, job slots, scheduler,
// dependency waits and watchdog (cta_context.cuh, dependencies.cuh,
// scheduler_role.cuh), and the same deadlock-freedom argument: jobs in queue
// order, every CTA co-resident, no finishing role waits on a later job.
//
// One CTA per SM, no clusters, 256 threads:
//   warpgroup 0: warp 0 lane 0 the A loader, warp 1 lane 0 the B loader,
//                warp 2 lane 0 the scheduler;
//   warpgroup 1: the consumer: wgmma m64n32k16 over the job's whole K, then
//                the fused epilogue straight from registers into C (a tile
//                of at most 64 rows x 32 columns: no staging, no TMA store),
//                then the tile's flag.
// Rings: A and B each a ring of one-k-block stages with full / empty
// barriers, as in cta_context.cuh, but deep (up to kMaxBStages B stages of 4
// KiB) and local to the CTA: each consumer warp's lane 0 releases a slot once
// wgmma.wait_group<1> says its reads are done.
// Publishing a tile: every consumer thread's generic stores to C, then a
// named barrier over the warpgroup (bar.red: orders them before thread 0's
// later operations), then thread 0's st.release.gpu of the flag. A consumer
// node's A loader acquires the flag and fences the async proxy before its TMA
// loads read C (dependencies.cuh).
#include "narrow_gemm.h"

#include <cuda/ptx>
#include <cuda_bf16.h>

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
  int32_t* job_slots;
  uint32_t rank;   // 0: no clusters
  uint32_t epoch;  // this launch's epoch
  Watchdog watchdog;

  __device__ uint8_t* a_stage(int s) const { return a_ring + s * params.a_stage_bytes; }
  __device__ uint8_t* b_stage(int s) const { return b_ring + s * NarrowConfig::kBStageBytes; }
  __device__ DeviceJobTrace* trace_of(int job, bool recorder) const {
    if (params.trace == nullptr || !recorder) return nullptr;
    return params.trace + job;
  }
};

constexpr int kConsumerBarrier = static_cast<int>(NamedBarrier::kConsumer0);

__device__ void InitNarrowBarriers(NarrowBarriers* barriers, const KernelParams& params) {
  for (int s = 0; s < params.a_stages; ++s) {
    cuda::ptx::mbarrier_init(&barriers->a_full[s], 1);
    cuda::ptx::mbarrier_init(&barriers->a_empty[s], NarrowConfig::kReleasingWarpsPerCta);
  }
  for (int s = 0; s < params.b_stages; ++s) {
    cuda::ptx::mbarrier_init(&barriers->b_full[s], 1);
    cuda::ptx::mbarrier_init(&barriers->b_empty[s], NarrowConfig::kReleasingWarpsPerCta);
  }
  for (int s = 0; s < NarrowConfig::kJobSlots; ++s) {
    cuda::ptx::mbarrier_init(&barriers->job_full[s], 1);
    cuda::ptx::mbarrier_init(&barriers->job_empty[s], NarrowConfig::kJobReleasesPerCta);
  }
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}

// Loads the k-blocks [kb0, kb0 + kKBlocksPerStage) of rows [row0, + tile_bytes
// / 128) of an operand into a ring stage, one tile_bytes tile per k-block.
// `kblock_map` (the operand's K is a multiple of 64: runtime.cc encodes it
// with EncodeKBlockMap) loads them all at once; otherwise each k-block is a
// load of its own. Either way TMA zero-fills what lies past K, whole k-blocks
// too, so the consumer can run every k-block of every stage.
__device__ __forceinline__ void LoadStage(const CUtensorMap* map, bool kblock_map, uint8_t* stage, uint64_t* full,
                                          uint32_t tile_bytes, int kb0, int32_t row0) {
  cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                       full, NarrowConfig::kKBlocksPerStage * tile_bytes);
  if (kblock_map) {
    const int32_t coords[3] = {0, row0, kb0};
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, stage, map, coords, full);
    return;
  }
  for (int j = 0; j < NarrowConfig::kKBlocksPerStage; ++j) {
    const int32_t coords[2] = {(kb0 + j) * NarrowConfig::kBlockK, row0};
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, stage + j * tile_bytes, map,
                                    coords, full);
  }
}

// Whether the node's operands have k-block maps (KernelNodesOf in runtime.cc).
__device__ __forceinline__ bool HasKBlockMaps(const sched::NodeSchedule& schedule) {
  return schedule.k % NarrowConfig::kBlockK == 0;
}

// The A loader: the epilogue's inputs once per job, then per k-block A's
// producers (many k-blocks' flags per poll) and the load.
__device__ void RunNarrowALoader(const NarrowContext& ctx) {
  const bool traced = ctx.params.trace != nullptr;
  JobStream jobs;
  RingCursor ring;
  DependencyMemo memo;
  for (;;) {
    const int index = jobs.Next(ctx);
    if (index < 0) return;
    const CtaWork work = ResolveJob(ctx, index);
    const sched::TileJob job = *work.job;  // in registers: the asm below clobbers memory
    const KernelNode& node = *work.node;
    const sched::NodeSchedule& schedule = node.schedule;
    const int32_t row0 = work.m_block * NarrowConfig::kBlockM;
    memo.Reset();
    if (schedule.dependency_count > 0) {
      const int64_t out_col0 = int64_t{work.n_block} * schedule.out_tile_n;
      const int64_t acc_col0 = int64_t{work.n_block} * NarrowConfig::kBlockN;
      if (!WaitForProducers(ctx, node, index, sched::DependencyOperand::kResidual, row0,
                            row0 + NarrowConfig::kBlockM, out_col0, out_col0 + schedule.out_tile_n, memo) ||
          !WaitForProducers(ctx, node, index, sched::DependencyOperand::kBias, 0, 1, acc_col0,
                            acc_col0 + NarrowConfig::kBlockN, memo)) {
        return;
      }
    }
    int a_ready_end = HasProducers(ctx, node, sched::DependencyOperand::kA) ? job.k_block_begin : job.k_block_end;
    const bool kblock_map = HasKBlockMaps(schedule);
    const uint32_t tile_bytes = ctx.params.a_stage_bytes / NarrowConfig::kKBlocksPerStage;
    uint64_t a_dependency_ns = 0;  // for the trace
    for (int kb0 = job.k_block_begin; kb0 < job.k_block_end; kb0 += NarrowConfig::kKBlocksPerStage) {
      const int kb_end = min(kb0 + NarrowConfig::kKBlocksPerStage, int{job.k_block_end});
      while (a_ready_end < kb_end) {
        const uint64_t start = traced ? ptx::globaltimer() : 0;
        a_ready_end = WaitForAProducersAhead(ctx, node, index, row0, a_ready_end, job.k_block_end);
        if (a_ready_end < 0) return;
        if (traced) a_dependency_ns += ptx::globaltimer() - start;
      }
      if (!ctx.watchdog.WaitBarrier(&ctx.barriers->a_empty[ring.stage], ring.phase ^ 1, WaitKind::kRingEmpty,
                                    index)) {
        return;
      }
      LoadStage(&node.a_map, kblock_map, ctx.a_stage(ring.stage), &ctx.barriers->a_full[ring.stage], tile_bytes,
                kb0, row0);
      ring.Advance(ctx.params.a_stages);
    }
    if (DeviceJobTrace* trace = ctx.trace_of(index, traced)) {
      trace->a_dependency_ns = static_cast<uint32_t>(a_dependency_ns);
    }
  }
}

// The B loader: the weights, as far ahead as the ring allows, across A's
// waits; but a job's loads start only once the previous job's have all
// landed. Issued as soon as slots free up, the next layer's loads shared HBM
// with the last stages of the layer still running, and that layer's tiles
// (which the next layer waits for) finished later (bench/NOTES.md v1.16).
__device__ void RunNarrowBLoader(const NarrowContext& ctx) {
  JobStream jobs;
  RingCursor ring;
  RingCursor last_issued;  // the previous job's last stage and the phase it fills
  bool issued = false;
  DependencyMemo memo;
  for (;;) {
    const int index = jobs.Next(ctx);
    if (index < 0) return;
    if (issued && !ctx.watchdog.WaitBarrier(&ctx.barriers->b_full[last_issued.stage], last_issued.phase,
                                            WaitKind::kRingFull, index)) {
      return;
    }
    const CtaWork work = ResolveJob(ctx, index);
    const sched::TileJob job = *work.job;
    const KernelNode& node = *work.node;
    const bool b_has_producers = HasProducers(ctx, node, sched::DependencyOperand::kB);
    const int32_t n_row0 = work.n_block * NarrowConfig::kBlockN;
    memo.Reset();
    const bool kblock_map = HasKBlockMaps(node.schedule);
    for (int kb0 = job.k_block_begin; kb0 < job.k_block_end; kb0 += NarrowConfig::kKBlocksPerStage) {
      const int kb_end = min(kb0 + NarrowConfig::kKBlocksPerStage, int{job.k_block_end});
      if (b_has_producers &&
          !WaitForProducers(ctx, node, index, sched::DependencyOperand::kB, n_row0, n_row0 + NarrowConfig::kBlockN,
                            int64_t{kb0} * NarrowConfig::kBlockK, int64_t{kb_end} * NarrowConfig::kBlockK, memo)) {
        return;
      }
      if (!ctx.watchdog.WaitBarrier(&ctx.barriers->b_empty[ring.stage], ring.phase ^ 1, WaitKind::kRingEmpty,
                                    index)) {
        return;
      }
      LoadStage(&node.b_map, kblock_map, ctx.b_stage(ring.stage), &ctx.barriers->b_full[ring.stage],
                NarrowConfig::kBTileBytes, kb0, n_row0);
      last_issued = ring;
      issued = true;
      ring.Advance(ctx.params.b_stages);
    }
  }
}

__device__ __forceinline__ float LoadAs(ElementType type, const void* base, int64_t index) {
  return type == ElementType::kBF16 ? LoadFloat<__nv_bfloat16>(base, index) : LoadFloat<float>(base, index);
}

// The fused epilogue of one 64 x 32 tile, from this thread's 16 accumulators
// straight into C: out = activation(acc + bias) + residual, or for SwiGLU
// silu(gate + bias) * (up + bias) + residual (gate and up in adjacent
// accumulator columns), in that order, as in epilogue_role.cuh. Register
// 4c + 2h + e holds row 16 * warp + lane / 4 + 8h, column 8c + 2 * (lane % 4)
// + e (wgmma.cuh). Only rows inside M and columns inside the output are
// stored.
// It is built when the job starts and reads its bias and residual values as
// soon as they may be read (Prefetch: after the job's first A stage is full,
// so after the A loader waited for their producers), all while the main loop
// runs: read after it, the node's fields and then those values were two
// round trips to L2 (~2 us traced) between a tile's last wgmma and its flag.
class NarrowEpilogue {
 public:
  __device__ NarrowEpilogue(const CtaWork& work, int warp, int lane)
      : node_(*work.node),
        out_type_(work.node->out_type),
        row0_(int64_t{work.m_block} * NarrowConfig::kBlockM + warp * 16 + lane / 4),
        col0_(int64_t{work.n_block} * NarrowConfig::kBlockN + 2 * (lane % 4)) {}

  __device__ void Prefetch() {
    const bool swiglu = node_.activation == EpilogueActivation::kSwiGLU;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t col = col0_ + 8 * c + e;
        bias_[c][e] = node_.bias != nullptr && col < node_.n ? LoadAs(node_.bias_type, node_.bias, col) : 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t row = row0_ + 8 * h;
          const int64_t out_col = swiglu ? (col0_ + 8 * c) / 2 : col;
          const bool used = node_.residual != nullptr && row < node_.m && out_col < node_.out_cols && (!swiglu || e == 0);
          residual_[h][c][e] =
              used ? LoadAs(node_.residual_type, node_.residual, row * node_.residual_stride + out_col) : 0.0f;
        }
      }
    }
  }

  __device__ void Store(const float (&acc)[16]) const {
    const bool swiglu = node_.activation == EpilogueActivation::kSwiGLU;
    const int out_bytes = out_type_ == ElementType::kBF16 ? 2 : 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0_ + 8 * h;
      if (row >= node_.m) continue;
      uint8_t* c_row = static_cast<uint8_t*>(node_.c) + row * node_.c_stride * out_bytes;
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
          const float value = v[e] + residual_[h][c][e];
          uint8_t* address = c_row + (out_col + e) * out_bytes;
          if (out_type_ == ElementType::kBF16) {
            StoreScalar<ElementType::kBF16>(address, value);
          } else {
            StoreScalar<ElementType::kFP32>(address, value);
          }
        }
      }
    }
  }

 private:
  EpilogueFields node_;
  ElementType out_type_;
  int64_t row0_;  // this thread's first row (16 * warp + lane / 4 of the tile)
  int64_t col0_;  // this thread's first accumulator column (2 * (lane % 4) of the tile)
  float bias_[4][2];         // [c][e], 0 without a bias or past N
  float residual_[2][4][2];  // [h][c][e], 0 without a residual or outside the output
};

// One m64n32k16 wgmma is short, and wgmmas into one accumulator run one after
// another, each waiting for the last: a single chain of them left the tensor
// cores idle most of the time. So the consumer keeps kChains independent
// accumulator sets, k16 step j of each k-block into set j, summed at the end
// (in a fixed order: the result does not depend on timing). One wgmma group
// per ring stage (kKBlocksPerStage k-blocks); kGroupsInFlight groups stay in
// flight before the oldest stage's slots are released.
constexpr int kChains = 4;
constexpr int kGroupsInFlight = 1;
static_assert(kChains == NarrowConfig::kBlockK / 16, "a k-block covers the chains once");

// The four k16 steps of one k-block, one into each chain.
__device__ __forceinline__ void IssueKBlock(float (&chains)[kChains][16], uint64_t desc_a, uint64_t desc_b) {
#pragma unroll
  for (int k16 = 0; k16 < NarrowConfig::kBlockK / 16; ++k16) {
    wgmma_m64n32k16_bf16(chains[k16], AdvanceDescriptorK16(desc_a, k16), AdvanceDescriptorK16(desc_b, k16));
  }
}

// Frees the oldest issued stage's A and B slots (its wgmmas are done):
// one arrival per consumer warp.
__device__ __forceinline__ void ReleaseSlots(const NarrowContext& ctx, bool release_lane, RingCursor& a_release,
                                             RingCursor& b_release) {
  if (release_lane) {
    cuda::ptx::mbarrier_arrive(&ctx.barriers->a_empty[a_release.stage]);
    cuda::ptx::mbarrier_arrive(&ctx.barriers->b_empty[b_release.stage]);
  }
  a_release.Advance(ctx.params.a_stages);
  b_release.Advance(ctx.params.b_stages);
}

// The consumer warpgroup, job after job: the main loop over the whole K, the
// epilogue into C, the tile's flag.
// NOTE: no thread leaves between the main loop and the publish on its own:
// a thread whose wait gave up (the launch is aborting) still reaches the
// warpgroup's barrier, which then tells every thread to stop, so none is left
// waiting there.
__device__ void RunNarrowConsumer(const NarrowContext& ctx) {
  const int lane = threadIdx.x % 32;
  const int warp = (threadIdx.x / 32) % 4;
  const bool leader = threadIdx.x % 128 == 0;  // writes the job traces and the flag
  const bool release_lane = lane == 0;
  const uint32_t a_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.a_ring));
  const uint32_t b_base = static_cast<uint32_t>(__cvta_generic_to_shared(ctx.b_ring));
  const int a_stages = ctx.params.a_stages;
  const int b_stages = ctx.params.b_stages;
  JobStream jobs;
  RingCursor a_ring, b_ring;
  for (;;) {
    const int index = jobs.Next(ctx);
    if (index < 0) return;
    if (DeviceJobTrace* trace = ctx.trace_of(index, leader)) {
      trace->data_ready = trace->mma_done = trace->staged = trace->published = 0;
      trace->fetched = ptx::globaltimer();
      trace->sm = static_cast<int32_t>(ptx::smid());
    }
    const CtaWork work = ResolveJob(ctx, index);
    const int k_blocks = work.job->k_block_end - work.job->k_block_begin;
    NarrowEpilogue epilogue(work, warp, lane);
    float chains[kChains][16];
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
#pragma unroll
      for (int r = 0; r < 16; ++r) chains[c][r] = 0.0f;
    }
    bool ok = true;
    // Slots whose wgmmas were issued and not yet released, oldest first.
    RingCursor a_release = a_ring, b_release = b_ring;
    int pending = 0;
    const uint32_t a_tile_bytes = ctx.params.a_stage_bytes / NarrowConfig::kKBlocksPerStage;
    for (int kb0 = 0; kb0 < k_blocks; kb0 += NarrowConfig::kKBlocksPerStage) {
      ok = ctx.watchdog.WaitBarrier(&ctx.barriers->a_full[a_ring.stage], a_ring.phase, WaitKind::kRingFull, index);
      if (kb0 == 0) {
        RecordTrace(ctx, index, leader, &DeviceJobTrace::data_ready);
        if (ok) epilogue.Prefetch();
      }
      ok = ok && ctx.watchdog.WaitBarrier(&ctx.barriers->b_full[b_ring.stage], b_ring.phase, WaitKind::kRingFull,
                                          index);
      if (!ok) break;
      const uint32_t a_stage = a_base + a_ring.stage * ctx.params.a_stage_bytes;
      const uint32_t b_stage = b_base + b_ring.stage * NarrowConfig::kBStageBytes;
      // Every k-block of the stage, those past K too (zero-filled: LoadStage):
      // wgmmas under a branch made ptxas fence the accumulators (C7519).
      ptx::wgmma_fence();
#pragma unroll
      for (int j = 0; j < NarrowConfig::kKBlocksPerStage; ++j) {
        IssueKBlock(chains, MakeSwizzle128Descriptor(a_stage + j * a_tile_bytes),
                    MakeSwizzle128Descriptor(b_stage + j * NarrowConfig::kBTileBytes));
      }
      ptx::wgmma_commit_group();
      a_ring.Advance(a_stages);
      b_ring.Advance(b_stages);
      if (++pending > kGroupsInFlight) {
        ptx::wgmma_wait_group<kGroupsInFlight>();
        ReleaseSlots(ctx, release_lane, a_release, b_release);
        --pending;
      }
    }
    ptx::wgmma_wait_group<0>();
    if (ok) {
      for (; pending > 0; --pending) ReleaseSlots(ctx, release_lane, a_release, b_release);
    }
    float acc[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      acc[r] = chains[0][r];
#pragma unroll
      for (int c = 1; c < kChains; ++c) acc[r] += chains[c][r];
    }
    RecordTrace(ctx, index, leader, &DeviceJobTrace::mma_done);
    if (ok) epilogue.Store(acc);
    if (!ptx::barrier_and<kConsumerBarrier, 128>(ok)) return;
    RecordTrace(ctx, index, leader, &DeviceJobTrace::staged);
    if (leader && work.node->has_dependents) {
      const sched::NodeSchedule& schedule = work.node->schedule;
      ptx::st_release_gpu(&ctx.params.flags[sched::OutputFlagIndex(schedule, work.m_block, work.n_block)],
                          ctx.epoch);
    }
    RecordTrace(ctx, index, leader, &DeviceJobTrace::published);
  }
}

__global__ void __launch_bounds__(NarrowConfig::kThreads, 1)
    NarrowGemmKernel(const __grid_constant__ KernelParams params) {
  extern __shared__ uint8_t dynamic_smem[];
  // 128B-swizzled tiles need 1024-byte alignment; the layout reserved slack.
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(dynamic_smem));
  uint8_t* smem = dynamic_smem + (((raw + 1023) & ~1023u) - raw);
  const NarrowSmemLayout layout = ComputeNarrowSmemLayout(params.a_stages, params.a_stage_bytes, params.b_stages);
  auto* barriers = reinterpret_cast<NarrowBarriers*>(smem + layout.barriers);
  auto* epoch_slot = reinterpret_cast<uint32_t*>(smem + layout.epoch);
  if (threadIdx.x == 0) {
    InitNarrowBarriers(barriers, params);
    *epoch_slot = params.state->epoch + 1;
  }
  __syncthreads();

  const NarrowContext ctx{params,
                          barriers,
                          smem + layout.a_ring,
                          smem + layout.b_ring,
                          reinterpret_cast<int32_t*>(smem + layout.job_slots),
                          0,
                          *epoch_slot,
                          Watchdog(params)};
  if (threadIdx.x < 128) {
    if (threadIdx.x % 32 == 0) {
      switch (threadIdx.x / 32) {
        case 0:
          RunNarrowALoader(ctx);
          break;
        case 1:
          RunNarrowBLoader(ctx);
          break;
        case 2:
          RunScheduler(ctx);
          break;
        default:
          break;
      }
    }
    __syncwarp();
  } else {
    RunNarrowConsumer(ctx);
  }
  // Every TMA load this CTA issued has landed (its consumer waited for it)
  // before anyone leaves.
  __syncthreads();
  if (threadIdx.x == 0) FinishLaunch(params, ctx.epoch);
}

}  // namespace

cudaError_t MaxCoresidentNarrowCtas(uint32_t smem_bytes, int* ctas) {
  *ctas = 0;
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
  if (cudaError_t error = cudaFuncSetAttribute(NarrowGemmKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem);
      error != cudaSuccess) {
    return error;
  }
  int per_sm = 0;
  if (cudaError_t error =
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, NarrowGemmKernel, NarrowConfig::kThreads, smem_bytes);
      error != cudaSuccess) {
    return error;
  }
  *ctas = per_sm * sms;
  return cudaSuccess;
}

cudaError_t LaunchNarrowGemm(const KernelParams& params, int ctas, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(ctas), 1, 1);
  config.blockDim = dim3(NarrowConfig::kThreads, 1, 1);
  config.dynamicSmemBytes = NarrowSharedMemoryBytes(params.a_stages, params.a_stage_bytes, params.b_stages);
  config.stream = stream;
  return cudaLaunchKernelEx(&config, NarrowGemmKernel, params);
}

}  // namespace loom::kernel
