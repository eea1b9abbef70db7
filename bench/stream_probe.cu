// stream_probe: how fast one CTA per SM can stream a weight matrix into a
// shared-memory ring, by the shape of its loads. No math: a consumer warp
// waits for each stage and frees it. This is the ceiling the narrow decode
// kernel's B ring (ops/kernel/narrow_loader_role.cuh) works under,
// measured apart from its dependencies, its consumer and its job queue.
//
// The matrix is [rows, cols] bf16, row-major (a weight matrix: rows are
// output columns, cols is K). A job is `job_rows` consecutive rows over the
// whole K (the narrow kernel's 32-column tile); job j runs on CTA j % grid.
// A stage is 16 KiB of the job. The ways to load a stage (--modes):
//   kblock  one 3-D TMA load, box {64, 32 rows, 4 k-blocks}: k-block-major in
//           shared memory (the narrow kernel's EncodeKBlockMap)
//   rowmaj  one 3-D TMA load, box {64, 4 k-blocks, 32 rows}: the same bytes,
//           row-major order (each row's 512 bytes one contiguous run)
//   tile2d  four 2-D TMA loads of {64, 32 rows} (4 KiB each)
//   bulk    one 1-D cp.async.bulk of 16 contiguous KiB of the job's rows
//   rowbulk 32 1-D cp.async.bulk, one a row: its 512 bytes of the stage's
//           4 k-blocks (row-major in shared memory, no swizzle)
// --box_rows=R (kblock only): boxes of R rows x (128 / R) k-blocks (still
//           16 KiB: each row a run of 256 * 32 / R bytes), the job's row
//           groups one after another, each over the whole K
// --pitch_pad=B: B bytes between the end of a row and the next (the tensor
//           modes; 0: rows packed, a row pitch of cols * 2 bytes)
//   ldg     no ring: every thread of the CTA reads 16-byte vectors (a
//           reference for what plain loads reach)
// --repeat=R: the launch streams the matrix R times over (R times its jobs,
// job j reading job j % jobs's rows): with a matrix that fits in L2, all but
// the first pass read L2, which times the rate L2 serves the SMs at.
// --drain: a job's loads start only once the previous job's last stage has
// landed (what the narrow kernel's B loader did until bench/NOTES.md v1.19).
// --a_rows=M: also stream an activation A [M, cols] beside it, as the narrow
// kernel does: a second ring (--a_stages, each stage four 3-D k-block boxes
// of M rounded up to 8 rows, zero-filled past M) that the consumer waits for
// too, loaded by a third thread. --job_gap_ns: the consumer idles this long
// after each job (the narrow kernel's epilogue and flag).
// --a_multicast=1 (with --a_rows): clusters of two CTAs, each CTA loading
// half of every A stage (two of its four k-blocks) into both CTAs' rings
// with one multicast copy, as a narrow kernel whose CTA pairs shared A would:
// L2 serves each A byte once a pair instead of once a CTA, while every SM
// still receives all of it. A slot is refilled once both consumers freed it.
// A consumer frees the peer's slot with the arrival the tiled kernel's ring
// release uses (mbarrier.arrive.shared::cluster, release at CTA scope:
// CtaContext::ArriveOnEveryCta). --a_multicast=2: the same clusters of two,
// each CTA loading its own A (the cluster launch alone, for comparison). The
// parts of 1 apart: 3 is 1 with release.cluster arrivals on the peer (what
// this probe used at first: ~0.4 us a stage, bench/NOTES.md v1.54); 4 each
// CTA loading its own A but a slot refilled only once both consumers freed
// it; 5 the multicast halves with each CTA's slot refilled once its own
// consumer freed it (timing only: a slot may be overwritten before the peer
// has read it).
//
//   stream_probe --rows=28672 --cols=4096 --stages=4,8,12 --modes=kblock,rowmaj
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cuda/ptx>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "probe_common.h"
#include "ptx.cuh"

ABSL_FLAG(int64_t, rows, 28672, "weight rows (output columns of the GEMM)");
ABSL_FLAG(int64_t, cols, 4096, "weight columns (K); a multiple of 256");
ABSL_FLAG(std::string, stages, "4,8,12", "ring depths to try (16 KiB stages)");
ABSL_FLAG(std::string, modes, "kblock,rowmaj,tile2d,bulk,ldg", "load shapes to try (see the file's comment)");
ABSL_FLAG(std::string, a_rows, "0", "activation rows to stream beside the weights (0: none), a list");
ABSL_FLAG(std::string, drain, "0", "0: a job's loads follow the last job's at once; 1: after its last stage landed; a list");
ABSL_FLAG(int, a_stages, 8, "with --a_rows: the A ring's depth");
ABSL_FLAG(std::string, a_multicast, "0",
          "with --a_rows: 1 shares A across CTA pairs (multicast); 2 launches the pairs without sharing; 3-5 parts "
          "of 1 (see the file's comment); a list");
ABSL_FLAG(std::string, job_gap_ns, "0", "consumer idle time after each job, a list");
ABSL_FLAG(std::string, grids, "0", "CTAs to launch (0: one per SM), a list");
ABSL_FLAG(std::string, box_rows, "32", "kblock mode: rows a box (32, 16 or 8), a list");
ABSL_FLAG(std::string, pitch_pad, "0", "bytes of padding after each row (a multiple of 16), a list");
ABSL_FLAG(int, iters, 20, "timed launches per configuration (median)");
ABSL_FLAG(int, repeat, 1, "times the grid streams the matrix in one launch (after the first, from L2 if it fits)");

namespace {

constexpr int kJobRows = 32;
constexpr int kKBlock = 64;  // bf16 elements in one 128-byte row
constexpr int kKBlocksPerStage = 4;
constexpr uint32_t kStageBytes = kJobRows * kKBlocksPerStage * kKBlock * 2;  // 16 KiB
constexpr int kMaxStages = 13;

enum class Mode { kKBlock, kRowMajor, kTile2D, kBulk, kLdg, kRowBulk };

struct ProbeParams {
  CUtensorMap map;    // the mode's map (unused by bulk and ldg)
  CUtensorMap a_map;  // with a_tile_bytes: A [a_rows, cols] as k-blocks, box {64, a_tile_bytes / 128, 4}
  CUtensorMap a_half_map;  // the same, box {64, a_tile_bytes / 128, 2} (a_multicast)
  int clustered;           // launched in clusters of two (--a_multicast 1-5)
  int a_halves;            // each CTA loads half of every A stage into both CTAs (1, 3, 5)
  int a_coupled;           // an A slot is refilled once both consumers freed it (1, 3, 4)
  int a_cluster_release;   // the consumers' arrivals on the peer release at cluster scope (3)
  uint32_t a_tile_bytes;  // 0: no A stream
  int a_stages;
  uint32_t job_gap_ns;
  const uint8_t* weights;
  int64_t cols;
  int jobs;         // launched: the matrix's jobs times --repeat
  int matrix_jobs;  // the matrix's (job j streams rows of job j % matrix_jobs)
  int stages;
  int stages_per_job;
  int box_rows;  // kblock: rows a box (kJobRows / box_rows row groups a job)
  int64_t pitch;  // bytes from one row to the next
  Mode mode;
  bool drain;
};


__device__ uint32_t probe_sink;

__device__ __forceinline__ uint64_t GlobalTimer() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(ns));
  return ns;
}

__device__ __forceinline__ void Wait(uint64_t* barrier, uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(barrier, parity)) {
  }
}

// Arrives on the barrier at `barrier`'s offset in the other CTA of the pair,
// releasing at CTA scope (the kernel's ring release), or at cluster scope.
__device__ __forceinline__ void ArriveOnPeer(uint64_t* barrier, bool cluster_scope) {
  namespace ptx = loom::kernel::ptx;
  const uint32_t remote = ptx::mapa_shared_cluster(static_cast<uint32_t>(__cvta_generic_to_shared(barrier)),
                                                   cuda::ptx::get_sreg_cluster_ctarank() ^ 1u);
  if (cluster_scope) {
    ptx::mbarrier_arrive_cluster(remote);
  } else {
    ptx::mbarrier_arrive_remote(remote);
  }
}

// Loads stage `s` of job `job` into `dst`, completing on `full`.
__device__ __forceinline__ void LoadStage(const ProbeParams& p, int job, int s, uint8_t* dst, uint64_t* full) {
  const uint32_t stage_bytes = kStageBytes;  // cuda::ptx takes sizes by reference
  cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, full,
                                       stage_bytes);
  const int32_t row0 = job % p.matrix_jobs * kJobRows;
  const int32_t kb0 = s * kKBlocksPerStage;
  switch (p.mode) {
    case Mode::kKBlock: {
      // Row group g of the job, then its k-blocks: with 32-row boxes, stage s.
      const int groups = kJobRows / p.box_rows;
      const int stages_per_group = p.stages_per_job / groups;
      const int32_t coords[3] = {0, row0 + s / stages_per_group * p.box_rows,
                                 s % stages_per_group * kKBlocksPerStage * groups};
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, &p.map, coords, full);
      break;
    }
    case Mode::kRowMajor: {
      const int32_t coords[3] = {0, kb0, row0};
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, &p.map, coords, full);
      break;
    }
    case Mode::kTile2D:
      for (int j = 0; j < kKBlocksPerStage; ++j) {
        const int32_t coords[2] = {(kb0 + j) * kKBlock, row0};
        cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                        dst + j * (kStageBytes / kKBlocksPerStage), &p.map, coords, full);
      }
      break;
    case Mode::kRowBulk: {
      const uint32_t row_bytes = kKBlocksPerStage * kKBlock * 2;
      for (int r = 0; r < kJobRows; ++r) {
        const uint8_t* src = p.weights + int64_t{row0 + r} * p.pitch + int64_t{kb0} * kKBlock * 2;
        cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, dst + r * row_bytes, src,
                                 row_bytes, full);
      }
      break;
    }
    default: {
      const uint8_t* src = p.weights + int64_t{row0} * p.pitch + int64_t{s} * kStageBytes;
      cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, src, stage_bytes, full);
      break;
    }
  }
}

__global__ void __launch_bounds__(96, 1) RingProbe(const __grid_constant__ ProbeParams p) {
  extern __shared__ uint8_t dynamic_smem[];
  // 128B-swizzled boxes land on 1024-byte boundaries (the launch adds 1 KiB).
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(dynamic_smem));
  uint8_t* smem = dynamic_smem + (((raw + 1023) & ~1023u) - raw);
  __shared__ uint64_t full[kMaxStages], empty[kMaxStages], a_full[kMaxStages], a_empty[kMaxStages];
  // [a_stages][4 k-blocks][a_tile_bytes], after the B ring
  uint8_t* a_ring = smem + p.stages * kStageBytes;
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      cuda::ptx::mbarrier_init(&full[s], 1);
      cuda::ptx::mbarrier_init(&empty[s], 1);
    }
    for (int s = 0; s < p.a_stages; ++s) {
      cuda::ptx::mbarrier_init(&a_full[s], 1);
      cuda::ptx::mbarrier_init(&a_empty[s], p.a_coupled ? 2 : 1);  // both consumers free a shared slot
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  if (p.clustered) {
    loom::kernel::ptx::cluster_sync();  // the peer's barriers exist before its copies and arrivals reach them
  } else {
    __syncthreads();
  }
  if (threadIdx.x == 0) {  // the loader
    int slot = 0;
    uint32_t phase = 0;
    int last_slot = -1;
    uint32_t last_phase = 0;
    for (int job = blockIdx.x; job < p.jobs; job += gridDim.x) {
      if (p.drain && last_slot >= 0) Wait(&full[last_slot], last_phase);
      for (int s = 0; s < p.stages_per_job; ++s) {
        Wait(&empty[slot], phase ^ 1);
        LoadStage(p, job, s, smem + slot * kStageBytes, &full[slot]);
        last_slot = slot;
        last_phase = phase;
        if (++slot == p.stages) slot = 0, phase ^= 1;
      }
    }
  } else if (threadIdx.x == 64 && p.a_tile_bytes != 0) {  // the A loader
    const uint32_t a_stage_bytes = kKBlocksPerStage * p.a_tile_bytes;
    int slot = 0;
    uint32_t phase = 0;
    for (int job = blockIdx.x; job < p.jobs; job += gridDim.x) {
      for (int s = 0; s < p.stages_per_job; ++s) {
        Wait(&a_empty[slot], phase ^ 1);
        cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                             &a_full[slot], a_stage_bytes);
        if (p.a_halves) {
          // This CTA's half of the stage (k-blocks 2 rank, 2 rank + 1) into both rings.
          const uint32_t rank = cuda::ptx::get_sreg_cluster_ctarank();
          const int32_t coords[3] = {0, 0, s * kKBlocksPerStage + 2 * static_cast<int32_t>(rank)};
          cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                          a_ring + slot * a_stage_bytes + rank * 2 * p.a_tile_bytes, &p.a_half_map,
                                          coords, &a_full[slot], uint16_t{0b11});
        } else {
          const int32_t coords[3] = {0, 0, s * kKBlocksPerStage};
          cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                          a_ring + slot * a_stage_bytes, &p.a_map, coords, &a_full[slot]);
        }
        if (++slot == p.a_stages) slot = 0, phase ^= 1;
      }
    }
  } else if (threadIdx.x == 32) {  // the consumer: one word a stage, then free it
    int slot = 0, a_slot = 0;
    uint32_t phase = 0, a_phase = 0;
    uint32_t sum = 0;
    for (int job = blockIdx.x; job < p.jobs; job += gridDim.x) {
      for (int s = 0; s < p.stages_per_job; ++s) {
        if (p.a_tile_bytes != 0) {
          Wait(&a_full[a_slot], a_phase);
          sum += *reinterpret_cast<const uint32_t*>(a_ring + a_slot * kKBlocksPerStage * p.a_tile_bytes);
          cuda::ptx::mbarrier_arrive(&a_empty[a_slot]);
          if (p.a_coupled) ArriveOnPeer(&a_empty[a_slot], p.a_cluster_release != 0);
          if (++a_slot == p.a_stages) a_slot = 0, a_phase ^= 1;
        }
        Wait(&full[slot], phase);
        sum += *reinterpret_cast<const uint32_t*>(smem + slot * kStageBytes);
        cuda::ptx::mbarrier_arrive(&empty[slot]);
        if (++slot == p.stages) slot = 0, phase ^= 1;
      }
      if (p.job_gap_ns != 0) {
        const uint64_t start = GlobalTimer();
        while (GlobalTimer() - start < p.job_gap_ns) {
        }
      }
    }
    if (sum == 0x12345678u) probe_sink = sum;  // keeps the reads
  }
  // No CTA leaves while its peer may still copy into it or arrive on it.
  if (p.clustered) loom::kernel::ptx::cluster_sync();
}

// Plain loads: CTA b streams its jobs' rows with 16-byte vectors.
__global__ void __launch_bounds__(256) LdgProbe(const uint4* weights, int64_t job_vectors, int jobs, int matrix_jobs,
                                                uint32_t* out) {
  uint32_t acc = 0;
  for (int job = blockIdx.x; job < jobs; job += gridDim.x) {
    const uint4* base = weights + job % matrix_jobs * job_vectors;
#pragma unroll 8
    for (int64_t i = threadIdx.x; i < job_vectors; i += blockDim.x) {
      uint4 v;
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(base + i));
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  if (acc == 0x12345678u) *out = acc;  // keeps the loads
}

// `box_kblocks` (kblock mode): k-blocks a box; 0: a 16-KiB box.
bool EncodeMap(Mode mode, void* base, int64_t rows, int64_t cols, uint32_t box_rows, CUtensorMap* map,
               int64_t pitch = 0, uint32_t box_kblocks = 0) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* pointer = nullptr;
    cudaDriverEntryPointQueryResult result;
    cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &pointer, 12000, cudaEnableDefault, &result);
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(pointer);
  }();
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(pitch > 0 ? pitch : cols * 2);
  const cuuint64_t kblocks = static_cast<cuuint64_t>(cols / kKBlock);
  cuuint64_t dims[3];
  cuuint64_t strides[2];
  cuuint32_t box[3];
  cuuint32_t rank = 3;
  switch (mode) {
    case Mode::kKBlock:
      dims[0] = kKBlock, dims[1] = rows, dims[2] = kblocks;
      strides[0] = row_bytes, strides[1] = kKBlock * 2;
      box[0] = kKBlock, box[1] = box_rows;
      box[2] = box_kblocks != 0 ? box_kblocks : kKBlocksPerStage * kJobRows / box_rows;
      break;
    case Mode::kRowMajor:
      dims[0] = kKBlock, dims[1] = kblocks, dims[2] = rows;
      strides[0] = kKBlock * 2, strides[1] = row_bytes;
      box[0] = kKBlock, box[1] = kKBlocksPerStage, box[2] = box_rows;
      break;
    case Mode::kTile2D:
      rank = 2;
      dims[0] = cols, dims[1] = rows;
      strides[0] = row_bytes;
      box[0] = kKBlock, box[1] = box_rows;
      break;
    default:
      return true;
  }
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, base, dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Median launch time in us of `launch`, back to back.
template <typename Launch>
double MedianUs(int iters, Launch launch) {
  launch();
  PROBE_CHECK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> marks(iters + 1);
  for (cudaEvent_t& mark : marks) PROBE_CHECK(cudaEventCreate(&mark));
  PROBE_CHECK(cudaEventRecord(marks[0]));
  for (int i = 0; i < iters; ++i) {
    launch();
    PROBE_CHECK(cudaEventRecord(marks[i + 1]));
  }
  PROBE_CHECK(cudaEventSynchronize(marks[iters]));
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    PROBE_CHECK(cudaEventElapsedTime(&ms, marks[i], marks[i + 1]));
    times.push_back(1000.0 * ms);
  }
  for (cudaEvent_t mark : marks) PROBE_CHECK(cudaEventDestroy(mark));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// One configuration of a ring mode: every combination of the list flags.
struct Variant {
  int box_rows, pad, stages, drain, a_rows, gap_ns, grid, a_multicast;
};

std::vector<Variant> Variants(Mode mode, const std::vector<int>& pads, const std::vector<int>& box_rows_list,
                              int sms) {
  std::vector<Variant> variants;
  for (int pad : pads) {
    for (int box_rows : box_rows_list) {
      if (mode != Mode::kKBlock && box_rows != kJobRows) continue;  // only kblock boxes come in other heights
      for (int stages : ParseIntList("stages", absl::GetFlag(FLAGS_stages))) {
        for (int drain : ParseIntList("drain", absl::GetFlag(FLAGS_drain))) {
          for (int a_rows : ParseIntList("a_rows", absl::GetFlag(FLAGS_a_rows))) {
            for (int gap : ParseIntList("job_gap_ns", absl::GetFlag(FLAGS_job_gap_ns))) {
              for (int grid : ParseIntList("grids", absl::GetFlag(FLAGS_grids))) {
                for (int multicast : ParseIntList("a_multicast", absl::GetFlag(FLAGS_a_multicast))) {
                  if (multicast != 0 && multicast != 2 && a_rows == 0) continue;  // nothing to share
                  variants.push_back({box_rows, pad, stages, drain, a_rows, gap, grid > 0 ? grid : sms, multicast});
                }
              }
            }
          }
        }
      }
    }
  }
  return variants;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t rows = absl::GetFlag(FLAGS_rows), cols = absl::GetFlag(FLAGS_cols);
  const int iters = std::max(1, absl::GetFlag(FLAGS_iters));
  for (int multicast : ParseIntList("a_multicast", absl::GetFlag(FLAGS_a_multicast))) {
    if (multicast < 0 || multicast > 5) {
      std::fprintf(stderr, "--a_multicast: %d must be 0 (alone), 1 (shared), 2 (pairs, not shared) or 3-5\n",
                   multicast);
      return 1;
    }
  }
  if (rows % kJobRows != 0 || cols % (kKBlock * kKBlocksPerStage) != 0) {
    std::fprintf(stderr, "--rows must be a multiple of %d and --cols of %d\n", kJobRows, kKBlock * kKBlocksPerStage);
    return 1;
  }
  const int repeat = absl::GetFlag(FLAGS_repeat);
  if (repeat < 1 || rows / kJobRows * repeat > std::numeric_limits<int>::max()) {
    std::fprintf(stderr, "--repeat must be at least 1 and keep the launch's jobs within an int, got %d\n", repeat);
    return 1;
  }
  int device = 0, sms = 0, max_smem = 0;
  PROBE_CHECK(cudaGetDevice(&device));
  PROBE_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  PROBE_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const size_t bytes = static_cast<size_t>(rows * cols * 2);  // what a run streams
  const std::vector<int> pads = ParseIntList("pitch_pad", absl::GetFlag(FLAGS_pitch_pad));
  const std::vector<int> box_rows_list = ParseIntList("box_rows", absl::GetFlag(FLAGS_box_rows));
  int max_pad = 0;
  for (int pad : pads) {
    if (pad < 0 || pad % 16 != 0) {
      std::fprintf(stderr, "--pitch_pad: a multiple of 16 bytes, got %d\n", pad);
      return 1;
    }
    max_pad = std::max(max_pad, pad);
  }
  for (int box_rows : box_rows_list) {
    if (box_rows != 8 && box_rows != 16 && box_rows != 32) {
      std::fprintf(stderr, "--box_rows: 8, 16 or 32, got %d\n", box_rows);
      return 1;
    }
  }
  const size_t allocated = static_cast<size_t>(rows * (cols * 2 + max_pad));
  uint8_t* weights = nullptr;
  uint32_t* out = nullptr;
  PROBE_CHECK(cudaMalloc(&weights, allocated));
  PROBE_CHECK(cudaMalloc(&out, sizeof(uint32_t)));
  PROBE_CHECK(cudaMemset(weights, 1, allocated));
  uint8_t* activations = nullptr;  // [64, cols]: enough for any --a_rows up to 64
  PROBE_CHECK(cudaMalloc(&activations, 64 * cols * 2));
  PROBE_CHECK(cudaMemset(activations, 1, 64 * cols * 2));
  cudaFuncAttributes attributes;
  PROBE_CHECK(cudaFuncGetAttributes(&attributes, RingProbe));
  max_smem -= static_cast<int>(attributes.sharedSizeBytes);  // the barriers
  PROBE_CHECK(cudaFuncSetAttribute(RingProbe, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
  const int jobs = static_cast<int>(rows / kJobRows);
  const double streamed = static_cast<double>(bytes) * repeat;  // what a launch streams
  const int stages_per_job = static_cast<int>(cols / (kKBlock * kKBlocksPerStage));
  std::printf("matrix %lld x %lld bf16 (%.1f MB), %d jobs of %d rows, streamed %d time(s) a launch, %d SMs\n",
              static_cast<long long>(rows), static_cast<long long>(cols), bytes / 1e6, jobs, kJobRows, repeat, sms);
  std::printf("%-7s %4s %4s %6s %6s %6s %7s %5s %5s %10s %9s\n", "mode", "box", "pad", "stages", "drain", "a_rows",
              "gap_ns", "grid", "a_mc", "us", "GB/s");
  const char* names[] = {"kblock", "rowmaj", "tile2d", "bulk", "ldg", "rowbulk"};
  std::vector<Mode> modes;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_modes), ',', absl::SkipEmpty())) {
    int index = 0;
    while (index < 6 && name != names[index]) ++index;
    if (index == 6) {
      std::fprintf(stderr, "unknown mode '%s'\n", std::string(name).c_str());
      return 1;
    }
    modes.push_back(static_cast<Mode>(index));
  }
  for (const Mode mode : modes) {
    if (mode == Mode::kLdg) {
      for (int grid : {sms, 2 * sms, 4 * sms}) {
        const double us = MedianUs(iters, [&] {
          LdgProbe<<<grid, 256>>>(reinterpret_cast<const uint4*>(weights), kJobRows * cols * 2 / 16, jobs * repeat,
                                  jobs, out);
        });
        std::printf("%-7s %4s %4s %6s %6s %6s %7s %5d %5s %10.1f %9.0f  (256 threads a CTA)\n", "ldg", "-", "-",
                    "-", "-", "-", "-", grid, "-", us, streamed / us / 1e3);
      }
      continue;
    }
    for (const Variant& v : Variants(mode, pads, box_rows_list, sms)) {
      const int groups = kJobRows / v.box_rows;
      if (cols % (kKBlock * kKBlocksPerStage * groups) != 0) continue;  // a row group's stages must tile K
      ProbeParams params = {};
      params.weights = weights;
      params.cols = cols;
      params.pitch = cols * 2 + v.pad;
      params.box_rows = v.box_rows;
      params.jobs = jobs * repeat;
      params.matrix_jobs = jobs;
      params.stages_per_job = stages_per_job;
      params.mode = mode;
      params.stages = v.stages;
      params.drain = v.drain != 0;
      params.job_gap_ns = static_cast<uint32_t>(v.gap_ns);
      if (!EncodeMap(mode, weights, rows, cols, static_cast<uint32_t>(v.box_rows), &params.map, params.pitch)) {
        std::fprintf(stderr, "cuTensorMapEncodeTiled refused mode %s\n", names[static_cast<int>(mode)]);
        return 1;
      }
      params.a_tile_bytes = v.a_rows > 0 ? static_cast<uint32_t>((v.a_rows + 7) / 8 * 8 * kKBlock * 2) : 0;
      params.a_stages = v.a_rows > 0 ? absl::GetFlag(FLAGS_a_stages) : 0;
      const uint32_t smem_bytes =
          v.stages * kStageBytes + params.a_stages * kKBlocksPerStage * params.a_tile_bytes + 1024;
      if (v.a_rows > 64 || v.stages < 1 || v.stages > kMaxStages || params.a_stages > kMaxStages ||
          smem_bytes > static_cast<uint32_t>(max_smem)) {
        std::fprintf(stderr, "skipping %d stages, %d A rows (at most %d stages and 64 rows, within shared memory)\n",
                     v.stages, v.a_rows, kMaxStages);
        continue;
      }
      // A stage: four k-blocks of the rows rounded up to 8, one box (two a
      // CTA with a_multicast).
      const uint32_t a_box_rows = static_cast<uint32_t>((v.a_rows + 7) / 8 * 8);
      if (v.a_rows > 0 &&
          (!EncodeMap(Mode::kKBlock, activations, v.a_rows, cols, a_box_rows, &params.a_map, 0, kKBlocksPerStage) ||
           !EncodeMap(Mode::kKBlock, activations, v.a_rows, cols, a_box_rows, &params.a_half_map, 0, 2))) {
        std::fprintf(stderr, "cuTensorMapEncodeTiled refused A with %d rows\n", v.a_rows);
        return 1;
      }
      const int m = v.a_multicast;
      params.clustered = m != 0 ? 1 : 0;
      params.a_halves = m == 1 || m == 3 || m == 5 ? 1 : 0;
      params.a_coupled = m == 1 || m == 3 || m == 4 ? 1 : 0;
      params.a_cluster_release = m == 3 ? 1 : 0;
      if (params.clustered && (v.grid % 2 != 0 || jobs % 2 != 0)) {
        std::fprintf(stderr, "skipping a_multicast on grid %d, %d jobs (pairs need both even)\n", v.grid, jobs);
        continue;
      }
      cudaLaunchConfig_t config = {};
      config.gridDim = dim3(v.grid);
      config.blockDim = dim3(96);
      config.dynamicSmemBytes = smem_bytes;
      cudaLaunchAttribute cluster = ClusterDimension(params.clustered ? 2 : 1);
      config.attrs = &cluster;
      config.numAttrs = 1;
      int resident = 0;  // clusters (CTAs without clusters) the SMs hold at once
      PROBE_CHECK(cudaOccupancyMaxActiveClusters(&resident, RingProbe, &config));
      if (resident * (params.clustered ? 2 : 1) < v.grid) {
        std::printf("  (only %d of the %d CTAs fit at once)\n", resident * (params.clustered ? 2 : 1), v.grid);
      }
      const double us = MedianUs(iters, [&] { PROBE_CHECK(cudaLaunchKernelEx(&config, RingProbe, params)); });
      std::printf("%-7s %4d %4d %6d %6d %6d %7d %5d %5d %10.1f %9.0f\n", names[static_cast<int>(mode)], v.box_rows,
                  v.pad, v.stages, v.drain, v.a_rows, v.gap_ns, v.grid, v.a_multicast, us, streamed / us / 1e3);
    }
    PROBE_CHECK(cudaGetLastError());
  }
  PROBE_CHECK(cudaFree(weights));
  PROBE_CHECK(cudaFree(out));
  PROBE_CHECK(cudaFree(activations));
  return 0;
}
