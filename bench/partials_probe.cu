// partials_probe: how fast one SM reads data that another SM has just
// written, as a split-K reduce reads the partials of the jobs before it.
// bench/NOTES.md (v1.38, v1.40) found the tiled kernel's few-row reduce at 128
// tokens slow for its bytes (16 rows x 8 splits x 1 KiB, 128 KiB a CTA, in
// ~8.7 us), a second read of the same bytes ~3x faster, and an L2 prefetch
// issued as each partial's flag appeared shortening the sum to 5.9 us. This
// probe separates what could make the first read slow.
//
// One CTA per SM (256 threads). Each writes its own --kib KiB region, as the
// split jobs write their partials: `tma` stages 8 KiB chunks in shared memory
// and bulk-stores them (cp.async.bulk, then wait_group 0 and the async proxy
// fence, as the store thread does), `st` has every thread store 16-byte
// words. It then releases its flag. Each CTA acquires the flag of the region
// it reads (`self`: its own; `other`: that of the CTA half a grid away),
// waits --delay_us, and reads the region twice, timed per pass: each thread
// issues --batch independent 8-byte loads (__ldcg, as the reduce does; a
// warp's load covers 256 contiguous bytes) before it adds them. With
// --separate the reads run in a second launch, after the first has ended.
// Printed: the median and slowest CTA's time for each pass, and the bytes
// of all CTAs over the slowest pass. %globaltimer ticks are about 1 us.
// With --layout=splits the CTAs instead write and read as the tiled kernel's
// split-K jobs and reduce parts do at 128 tokens (16 tiles of 128 x 256
// fp32, 8 splits, parts of 16 rows): CTA w < 128 writes split w % 8 of tile
// w / 8 (its 128 rows of 1 KiB, 16 KiB apart: the workspace's [split][row]
// [column] layout for a 4096-column node; `tma`: one 1 KiB bulk store a
// row), then reads part w % 8 of tile w / 8 (`other`: of the tile 8 further
// on) once all 8 of that tile's splits are flagged: each thread one column
// pair, 2 rows a step, the loads of all 8 splits of a step in flight, 4
// steps a warpgroup of 8 rows; --kib, --batch and --delay_us do not apply.
// With --stream_mib each CTA, after writing and flagging its part, reads its
// share of a buffer of that many MiB (streaming loads, 16 bytes a thread, 8 in
// flight) before it waits for the flags and reads: the weight stream that
// passes through L2 between a split job's partials and their reduce. With
// --stream_stride_kib as well, each load of the stream is that many KiB past
// the one before it: the same pages touched with far fewer lines of L2.
// With --stream_bulk the stream is read as the packed B loader reads weights
// instead (16 KiB bulk copies into shared memory under an L2 evict_first
// policy, four in flight).
// --smem_kib sets the shared memory a CTA asks for (the tiled kernel takes
// ~225 KiB, leaving L1 ~30), --cluster=2 launches clusters of two as the
// tiled kernel does, and --sequential_steps sums a part one step at a time
// as the kernel's SumColumnPair does (`#pragma unroll 1`; without it the
// compiler may issue all four steps' loads at once).
// The flags are checked before the GPU is touched: a bad one exits 2,
// naming it.
//
//   partials_probe --write=tma --reader=other --kib=128
//   partials_probe --layout=splits --write=tma --reader=other
//   partials_probe --layout=splits --stream_mib=256 --smem_kib=227 --cluster=2 --sequential_steps
#include <cuda_runtime.h>

#include <cuda/ptx>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "probe_common.h"
#include "ptx.cuh"

ABSL_FLAG(std::string, write, "tma", "how each CTA writes its region: tma (bulk stores from shared memory) or st");
ABSL_FLAG(std::string, reader, "other", "whose region a CTA reads: self, or other (the CTA half a grid away)");
ABSL_FLAG(int, kib, 128, "KiB each CTA writes and reads (a multiple of 16)");
ABSL_FLAG(int, batch, 16, "8-byte loads each thread has in flight (1 to 32)");
ABSL_FLAG(int, delay_us, 0, "us between acquiring the flag and the first read");
ABSL_FLAG(bool, separate, false, "read in a second launch instead of after the flags");
ABSL_FLAG(int, stream_mib, 0, "MiB streamed through L2 by all CTAs between the writes and the reads");
ABSL_FLAG(int, stream_stride_kib, 0, "KiB between two loads of the stream (0: every 16 bytes)");
ABSL_FLAG(int, smem_kib, 120,
          "dynamic shared memory a CTA asks for (at least 8, at most 227): more leaves less of the SM's 256 KiB "
          "to L1");
ABSL_FLAG(int, cluster, 1, "CTAs a cluster (1 or 2; the tiled kernel launches clusters of 2)");
ABSL_FLAG(bool, sequential_steps, false,
          "--layout=splits: sum a part one step (2 rows of every split) at a time, as the kernel does");
ABSL_FLAG(bool, stream_bulk, false,
          "with --stream_mib: stream with bulk copies into shared memory under an L2 evict_first policy (as the "
          "packed B loader) instead of streaming loads; needs --smem_kib of at least 73");
ABSL_FLAG(int, iters, 9, "launches (the median launch is printed)");
ABSL_FLAG(std::string, layout, "region",
          "region (each CTA one contiguous region) or splits (the tiled kernel's split-K partials; see the comment)");

namespace {

using loom::kernel::ptx::globaltimer;

constexpr int kThreads = 256;
constexpr uint32_t kChunkBytes = 8192;  // one staging panel of the tiled kernel
constexpr int kMaxBatch = 32;

struct ProbeParams {
  float* regions;       // [grid][bytes / 4]
  uint32_t* flags;      // [grid]: the launch's epoch once the region is written
  uint32_t epoch;
  int64_t bytes;        // a region's
  bool tma;             // write with bulk stores
  bool other;           // read the region of CTA (blockIdx + grid / 2) % grid
  int batch;
  uint64_t delay_ns;
  bool write, read;     // the phases this launch runs
  bool sequential_steps;  // --layout=splits: SumPart<true>
  uint64_t* pass_ns;    // [grid][2]
  const float4* stream; // [stream_bytes / 16], read between the writes and the reads
  int64_t stream_bytes;
  int64_t stream_stride;  // in float4s; 1: contiguous
  bool stream_bulk;       // StreamThroughBulk instead
};

__device__ float probe_sink;

// This CTA's share of p.stream with bulk copies into shared memory under an
// L2 evict_first policy, as the tiled kernel's packed B loader reads weights:
// kStreamChunks chunks of kStreamChunkBytes in flight, after the write staging,
// their barriers after them (in the dynamic shared memory: a static array
// would leave --smem_kib=227 no room).
constexpr uint32_t kStreamChunkBytes = 16384;
constexpr int kStreamChunks = 4;
constexpr uint32_t kStreamSharedBytes = kChunkBytes + kStreamChunks * (kStreamChunkBytes + sizeof(uint64_t));
__device__ void StreamThroughBulk(const ProbeParams& p, uint8_t* smem) {
  const int64_t share = p.stream_bytes / gridDim.x / kStreamChunkBytes * kStreamChunkBytes;
  const auto* chunk = reinterpret_cast<const uint8_t*>(p.stream) + int64_t{blockIdx.x} * share;
  uint8_t* buffers = smem + kChunkBytes;
  auto* full = reinterpret_cast<uint64_t*>(buffers + kStreamChunks * kStreamChunkBytes);
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStreamChunks; ++i) cuda::ptx::mbarrier_init(&full[i], 1);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
    const uint64_t policy = loom::kernel::ptx::l2_evict_first_policy();
    const int64_t count = share / kStreamChunkBytes;
    for (int64_t i = 0; i < count + kStreamChunks; ++i) {
      if (i >= kStreamChunks) {  // chunk i - kStreamChunks landed: its buffer is free
        const int64_t done = i - kStreamChunks;
        while (!cuda::ptx::mbarrier_try_wait_parity(&full[done % kStreamChunks],
                                                    static_cast<uint32_t>((done / kStreamChunks) & 1))) {
        }
      }
      if (i < count) {
        const int b = static_cast<int>(i % kStreamChunks);
        cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                             &full[b], uint32_t{kStreamChunkBytes});
        loom::kernel::ptx::cp_async_bulk_l2_hint(buffers + b * kStreamChunkBytes, chunk + i * kStreamChunkBytes,
                                                 kStreamChunkBytes, &full[b], policy);
      }
    }
  }
  __syncthreads();
}

// This CTA's share of p.stream, read once with streaming loads.
__device__ void StreamThrough(const ProbeParams& p) {
  constexpr int kInFlight = 8;
  const int64_t words = p.stream_bytes / 16, share = words / gridDim.x, loads = share / p.stream_stride;
  const float4* chunk = p.stream + int64_t{blockIdx.x} * share;
  float sum = 0.0f;
  for (int64_t base = 0; base < loads; base += int64_t{kThreads} * kInFlight) {
    float4 v[kInFlight];
#pragma unroll
    for (int b = 0; b < kInFlight; ++b) {
      const int64_t at = base + int64_t{b} * kThreads + threadIdx.x;
      v[b] = at < loads ? __ldcs(chunk + at * p.stream_stride) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int b = 0; b < kInFlight; ++b) sum += v[b].x + v[b].w;
  }
  if (sum == 1234.5f) probe_sink = sum;
}

__device__ void WriteRegion(const ProbeParams& p, uint8_t* staging) {
  float* region = p.regions + int64_t{blockIdx.x} * (p.bytes / 4);
  if (p.tma) {
    auto* words = reinterpret_cast<float*>(staging);
    for (uint32_t i = threadIdx.x; i < kChunkBytes / 4; i += kThreads) words[i] = static_cast<float>(i);
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int64_t at = 0; at < p.bytes; at += kChunkBytes) {
        cuda::ptx::cp_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared,
                                 reinterpret_cast<uint8_t*>(region) + at, staging, uint32_t{kChunkBytes});
        cuda::ptx::cp_async_bulk_commit_group();
      }
      cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
      cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
    }
  } else {
    auto* words = reinterpret_cast<float4*>(region);
    for (int64_t i = threadIdx.x; i < p.bytes / 16; i += kThreads) words[i] = make_float4(1.0f, 2.0f, 3.0f, 4.0f);
  }
  __syncthreads();
  if (threadIdx.x == 0) loom::kernel::ptx::st_release_gpu(&p.flags[blockIdx.x], p.epoch);
}

// One pass over `region`: each thread's loads in batches of p.batch.
__device__ float ReadPass(const ProbeParams& p, const float2* region) {
  const int64_t pairs = p.bytes / 8;
  const int64_t step = int64_t{kThreads} * p.batch;
  float sum = 0.0f;
  for (int64_t base = 0; base < pairs; base += step) {
    float2 v[kMaxBatch];
#pragma unroll
    for (int b = 0; b < kMaxBatch; ++b) {
      const int64_t at = base + int64_t{b} * kThreads + threadIdx.x;
      if (b < p.batch && at < pairs) v[b] = __ldcg(region + at);
    }
#pragma unroll
    for (int b = 0; b < kMaxBatch; ++b) {
      if (b < p.batch && base + int64_t{b} * kThreads + threadIdx.x < pairs) sum += v[b].x + v[b].y;
    }
  }
  return sum;
}

// What a CTA streams between its writes and its reads (--stream_mib; nothing
// without it).
__device__ void StreamBetween(const ProbeParams& p, uint8_t* smem) {
  if (p.stream_bulk) {
    StreamThroughBulk(p, smem);
  } else {
    StreamThrough(p);
  }
}

__global__ void __launch_bounds__(kThreads, 1) Probe(const __grid_constant__ ProbeParams p) {
  extern __shared__ __align__(128) uint8_t staging[];
  if (p.write) WriteRegion(p, staging);
  if (!p.read) return;
  StreamBetween(p, staging);
  const int source = p.other ? static_cast<int>((blockIdx.x + gridDim.x / 2) % gridDim.x) : blockIdx.x;
  if (threadIdx.x == 0) {
    while (loom::kernel::ptx::ld_relaxed_gpu(&p.flags[source]) != p.epoch) {
    }
    cuda::ptx::fence(cuda::ptx::sem_acq_rel, cuda::ptx::scope_gpu);
    const uint64_t start = globaltimer();
    while (globaltimer() - start < p.delay_ns) {
    }
  }
  __syncthreads();
  const auto* region = reinterpret_cast<const float2*>(p.regions + int64_t{source} * (p.bytes / 4));
  float sum = 0.0f;
  for (int pass = 0; pass < 2; ++pass) {
    __syncthreads();
    const uint64_t start = globaltimer();
    sum += ReadPass(p, region);
    __syncthreads();
    if (threadIdx.x == 0) p.pass_ns[2 * blockIdx.x + pass] = globaltimer() - start;
  }
  if (sum == 1234.5f) probe_sink = sum;
}

constexpr int kSplits = 8, kTileRows = 128, kTileCols = 256, kPartRows = 16;
constexpr int kRowBytes = kTileCols * 4;

// One warpgroup's 8 rows of a part, 2 rows of all splits a step. kSequential:
// one step's loads at a time (`#pragma unroll 1`, as the kernel's
// SumColumnPair); otherwise the steps unrolled, so that the compiler may issue
// every step's loads before the first add.
template <bool kSequential>
__device__ float SumPart(const float* base, int64_t row_floats, int64_t split_floats) {
  float sum = 0.0f;
  auto step = [&](int i) {
    float2 v[2][kSplits];
#pragma unroll
    for (int split = 0; split < kSplits; ++split) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        v[r][split] = __ldcg(reinterpret_cast<const float2*>(base + (i + r) * row_floats + split * split_floats));
      }
    }
#pragma unroll
    for (int split = 0; split < kSplits; ++split) sum += v[0][split].x + v[0][split].y + v[1][split].x + v[1][split].y;
  };
  if constexpr (kSequential) {
#pragma unroll 1
    for (int i = 0; i < kPartRows / 2; i += 2) step(i);
  } else {
#pragma unroll
    for (int i = 0; i < kPartRows / 2; i += 2) step(i);
  }
  return sum;
}

// The splits layout: CTA w < tiles * kSplits (tiles = gridDim.x / kSplits)
// writes split w % kSplits of tile w / kSplits, then sums one part.
__global__ void __launch_bounds__(kThreads, 1) SplitProbe(const __grid_constant__ ProbeParams p) {
  extern __shared__ __align__(128) uint8_t staging[];
  const int tiles = gridDim.x / kSplits;
  const int64_t row_floats = int64_t{tiles} * kTileCols;                 // a workspace row
  const int64_t split_floats = int64_t{kTileRows} * row_floats;          // a split's slice
  const int w = blockIdx.x;
  if (w >= tiles * kSplits) return;
  if (p.write) {
    float* slice = p.regions + (w % kSplits) * split_floats + (w / kSplits) * kTileCols;
    if (p.tma) {
      auto* words = reinterpret_cast<float*>(staging);
      for (int i = threadIdx.x; i < kTileCols; i += kThreads) words[i] = static_cast<float>(i);
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int row = 0; row < kTileRows; ++row) {
          cuda::ptx::cp_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, slice + row * row_floats,
                                   staging, uint32_t{kRowBytes});
        }
        cuda::ptx::cp_async_bulk_commit_group();
        cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
        cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
      }
    } else {
      for (int i = threadIdx.x; i < kTileRows * kTileCols / 4; i += kThreads) {
        const int row = i / (kTileCols / 4), col = i % (kTileCols / 4);
        reinterpret_cast<float4*>(slice + row * row_floats)[col] = make_float4(1.0f, 2.0f, 3.0f, 4.0f);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) loom::kernel::ptx::st_release_gpu(&p.flags[w], p.epoch);
  }
  if (!p.read) return;
  StreamBetween(p, staging);
  const int tile = p.other ? (w / kSplits + tiles / 2) % tiles : w / kSplits;
  const int part = w % kSplits;
  if (threadIdx.x < kSplits) {
    while (loom::kernel::ptx::ld_relaxed_gpu(&p.flags[tile * kSplits + threadIdx.x]) != p.epoch) {
    }
    cuda::ptx::fence(cuda::ptx::sem_acq_rel, cuda::ptx::scope_gpu);
  }
  __syncthreads();
  const int warpgroup = threadIdx.x / 128, t = threadIdx.x % 128;
  const int first_row = part * kPartRows + warpgroup * (kPartRows / 2);
  const float* base = p.regions + int64_t{first_row} * row_floats + tile * kTileCols + 2 * t;
  float sum = 0.0f;
  for (int pass = 0; pass < 2; ++pass) {
    __syncthreads();
    const uint64_t start = globaltimer();
    sum += p.sequential_steps ? SumPart<true>(base, row_floats, split_floats) : SumPart<false>(base, row_floats, split_floats);
    __syncthreads();
    if (threadIdx.x == 0) p.pass_ns[2 * blockIdx.x + pass] = globaltimer() - start;
  }
  if (sum == 1234.5f) probe_sink = sum;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string write = absl::GetFlag(FLAGS_write), reader = absl::GetFlag(FLAGS_reader);
  const int kib = absl::GetFlag(FLAGS_kib), batch = absl::GetFlag(FLAGS_batch);
  if (write != "tma" && write != "st") {
    std::fprintf(stderr, "--write=%s: must be tma or st\n", write.c_str());
    return 2;
  }
  if (reader != "self" && reader != "other") {
    std::fprintf(stderr, "--reader=%s: must be self or other\n", reader.c_str());
    return 2;
  }
  if (kib < 16 || kib % 16 != 0 || kib > 64 * 1024 || batch < 1 || batch > kMaxBatch ||
      absl::GetFlag(FLAGS_delay_us) < 0 || absl::GetFlag(FLAGS_iters) < 1 || absl::GetFlag(FLAGS_stream_mib) < 0 ||
      absl::GetFlag(FLAGS_stream_mib) > 16 * 1024 || absl::GetFlag(FLAGS_stream_stride_kib) < 0 ||
      absl::GetFlag(FLAGS_stream_stride_kib) > 1024 || absl::GetFlag(FLAGS_smem_kib) < 8 ||
      absl::GetFlag(FLAGS_smem_kib) > 227) {
    std::fprintf(stderr,
                 "--kib=%d --batch=%d --delay_us=%d --iters=%d --stream_mib=%d --stream_stride_kib=%d --smem_kib=%d: need "
                 "kib a multiple of 16 in [16, 65536], batch in [1, %d], delay_us >= 0, iters >= 1, stream_mib in "
                 "[0, 16384], stream_stride_kib in [0, 1024], smem_kib in [8, 227]\n",
                 kib, batch, absl::GetFlag(FLAGS_delay_us), absl::GetFlag(FLAGS_iters),
                 absl::GetFlag(FLAGS_stream_mib), absl::GetFlag(FLAGS_stream_stride_kib),
                 absl::GetFlag(FLAGS_smem_kib), kMaxBatch);
    return 2;
  }
  const std::string layout = absl::GetFlag(FLAGS_layout);
  if (layout != "region" && layout != "splits") {
    std::fprintf(stderr, "--layout=%s: must be region or splits\n", layout.c_str());
    return 2;
  }
  const bool splits = layout == "splits";
  if (absl::GetFlag(FLAGS_cluster) != 1 && absl::GetFlag(FLAGS_cluster) != 2) {
    std::fprintf(stderr, "--cluster=%d: must be 1 or 2\n", absl::GetFlag(FLAGS_cluster));
    return 2;
  }
  if (absl::GetFlag(FLAGS_stream_bulk) &&
      (int64_t{absl::GetFlag(FLAGS_smem_kib)} * 1024 < kStreamSharedBytes ||
       absl::GetFlag(FLAGS_stream_stride_kib) != 0)) {
    std::fprintf(stderr,
                 "--stream_bulk: needs --smem_kib of at least %u (it has %d) and no --stream_stride_kib\n",
                 (kStreamSharedBytes + 1023) / 1024, absl::GetFlag(FLAGS_smem_kib));
    return 2;
  }
  int sms = 0;
  PROBE_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  ProbeParams p = {};
  p.bytes = int64_t{kib} * 1024;
  p.tma = write == "tma";
  p.other = reader == "other";
  p.batch = batch;
  p.sequential_steps = absl::GetFlag(FLAGS_sequential_steps);
  p.delay_ns = static_cast<uint64_t>(absl::GetFlag(FLAGS_delay_us)) * 1000;
  // The CTAs that report, and the bytes each reads a pass.
  const int active = splits ? sms / kSplits * kSplits : sms;
  const int64_t read_bytes = splits ? int64_t{kPartRows} * kSplits * kRowBytes : p.bytes;
  const int64_t split_bytes = int64_t{kSplits} * kTileRows * (sms / kSplits) * kRowBytes;
  PROBE_CHECK(cudaMalloc(&p.regions, static_cast<size_t>(std::max(int64_t{sms} * p.bytes, split_bytes))));
  PROBE_CHECK(cudaMalloc(&p.flags, sms * sizeof(uint32_t)));
  PROBE_CHECK(cudaMemset(p.flags, 0, sms * sizeof(uint32_t)));
  PROBE_CHECK(cudaMalloc(&p.pass_ns, sms * 2 * sizeof(uint64_t)));
  p.stream_bytes = int64_t{absl::GetFlag(FLAGS_stream_mib)} << 20;
  p.stream_bulk = absl::GetFlag(FLAGS_stream_bulk);
  p.stream_stride = std::max(int64_t{1}, int64_t{absl::GetFlag(FLAGS_stream_stride_kib)} * 1024 / 16);
  if (p.stream_bytes > 0) {
    float4* stream = nullptr;
    PROBE_CHECK(cudaMalloc(&stream, static_cast<size_t>(p.stream_bytes)));
    PROBE_CHECK(cudaMemset(stream, 0, static_cast<size_t>(p.stream_bytes)));
    p.stream = stream;
  }
  // 120 KiB of shared memory: one CTA an SM.
  const int shared_bytes = absl::GetFlag(FLAGS_smem_kib) * 1024;
  PROBE_CHECK(cudaFuncSetAttribute(Probe, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  PROBE_CHECK(cudaFuncSetAttribute(SplitProbe, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  const int cluster = absl::GetFlag(FLAGS_cluster);
  auto run_probe = [&]() {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(sms);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = shared_bytes;
    cudaLaunchAttribute attribute = ClusterDimension(cluster);
    config.attrs = &attribute;
    config.numAttrs = 1;
    PROBE_CHECK(cudaLaunchKernelEx(&config, splits ? SplitProbe : Probe, p));
  };
  const bool separate = absl::GetFlag(FLAGS_separate);
  struct Launch {
    std::vector<uint64_t> pass_ns;
    uint64_t first_slowest = 0;
  };
  std::vector<Launch> launches;
  for (int it = 0; it < absl::GetFlag(FLAGS_iters); ++it) {
    p.epoch = static_cast<uint32_t>(it + 1);
    p.write = true;
    p.read = !separate;
    PROBE_CHECK(cudaMemset(p.pass_ns, 0, sms * 2 * sizeof(uint64_t)));
    run_probe();
    PROBE_CHECK(cudaGetLastError());
    if (separate) {
      PROBE_CHECK(cudaDeviceSynchronize());
      p.write = false;
      p.read = true;
      run_probe();
      PROBE_CHECK(cudaGetLastError());
    }
    PROBE_CHECK(cudaDeviceSynchronize());
    Launch launch{std::vector<uint64_t>(sms * 2)};
    PROBE_CHECK(cudaMemcpy(launch.pass_ns.data(), p.pass_ns, sms * 2 * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    for (int b = 0; b < sms; ++b) launch.first_slowest = std::max(launch.first_slowest, launch.pass_ns[2 * b]);
    launches.push_back(std::move(launch));
  }
  std::sort(launches.begin(), launches.end(),
            [](const Launch& a, const Launch& b) { return a.first_slowest < b.first_slowest; });
  const Launch& median = launches[launches.size() / 2];
  if (splits) {
    std::printf("partials_probe: %d CTAs, split-K partials (%d tiles of %d x %d fp32, %d splits) written by %s, "
                "parts of %d rows read by %s%s, %d MiB streamed between (stride %d KiB), %d KiB of shared memory\n",
                active, active / kSplits, kTileRows, kTileCols, kSplits, write.c_str(), kPartRows, reader.c_str(),
                separate ? ", in a second launch" : "", absl::GetFlag(FLAGS_stream_mib),
                absl::GetFlag(FLAGS_stream_stride_kib), absl::GetFlag(FLAGS_smem_kib));
  } else {
    std::printf("partials_probe: %d CTAs, %d KiB each, written by %s, read by %s, %d loads in flight a thread, "
                "delay %d us%s, %d MiB streamed between (stride %d KiB), %d KiB of shared memory\n",
                active, kib, write.c_str(), reader.c_str(), batch, absl::GetFlag(FLAGS_delay_us),
                separate ? ", read in a second launch" : "", absl::GetFlag(FLAGS_stream_mib),
                absl::GetFlag(FLAGS_stream_stride_kib), absl::GetFlag(FLAGS_smem_kib));
  }
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<uint64_t> ns(active);
    for (int b = 0; b < active; ++b) ns[b] = median.pass_ns[2 * b + pass];
    std::sort(ns.begin(), ns.end());
    std::printf("  pass %d: median %.1f us, slowest %.1f us, %.0f GB/s over the slowest\n", pass + 1,
                ns[active / 2] / 1e3, ns.back() / 1e3, static_cast<double>(active) * read_bytes / ns.back());
  }
  return 0;
}
