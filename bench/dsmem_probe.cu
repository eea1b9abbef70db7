// dsmem_probe: how fast one CTA of a cluster of two hands a tile of fp32
// accumulators to the other, as a split-K pair would: through distributed
// shared memory, or through global memory (a flag released after the stores,
// the reads after its acquire), as the tiled kernel's split partials go now.
//
// Every SM runs one CTA of 256 threads (two "warpgroups" of 128, as the
// tiled kernel's consumers), in clusters of two; every cluster works at once.
// Each thread holds 128 floats (a warpgroup's 64 x 256 tile: 64 KiB). Per
// tile, rank 0 hands its floats to rank 1, which adds them to its own:
//   dsmem: in chunks of 16 floats a thread (8 KiB a warpgroup), rank 0
//     stores each chunk into one of --buffers buffers in rank 1's shared
//     memory (st.shared::cluster, 16 bytes a store, consecutive threads on
//     consecutive 16 bytes) and arrives on rank 1's full barrier (release at
//     cluster scope, every thread); rank 1 waits on it (acquire at cluster
//     scope), reads the chunk from its own shared memory, adds it, and
//     arrives on rank 0's empty barrier for that buffer.
//   global: rank 0 stores all 128 floats to its pair's region (16 bytes a
//     store, coalesced), each warpgroup then releases a flag; rank 1 acquires
//     it and loads them (the first read of lines another SM just wrote).
// --tiles tiles run back to back in one launch; printed: the median and
// slowest cluster's time per tile and the bytes of all pairs over the
// median. %globaltimer ticks are about 1 us; run enough tiles.
//
//   dsmem_probe --mode=dsmem,global --tiles=32 --buffers=2
#include <cuda_runtime.h>

#include <cuda/ptx>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "probe_common.h"
#include "ptx.cuh"

ABSL_FLAG(std::string, mode, "dsmem,global", "comma-separated: dsmem, global");
ABSL_FLAG(int, tiles, 32, "tiles handed over per launch, back to back (1-4096)");
ABSL_FLAG(int, buffers, 2, "dsmem: chunk buffers per warpgroup in rank 1 (1-8)");
ABSL_FLAG(int, iters, 5, "launches per mode (the last one printed)");

namespace {

constexpr int kThreads = 256;
constexpr int kFloats = 128;           // a thread's accumulators
constexpr int kChunkFloats = 16;       // a thread's share of a chunk
constexpr int kChunks = kFloats / kChunkFloats;
constexpr int kChunkBytes = 128 * kChunkFloats * 4;  // a warpgroup's chunk: 8 KiB
constexpr int kMaxBuffers = 8;

__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Waits (acquire at cluster scope: the peer's stores or reads before its
// arrival are ordered before ours) until the barrier's phase of `parity` completes.
__device__ __forceinline__ void WaitCluster(uint64_t* bar, uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cluster, bar, parity)) {
  }
}

__device__ __forceinline__ void StoreRemote(uint32_t address, float4 v) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "f"(v.x), "f"(v.y), "f"(v.z),
               "f"(v.w)
               : "memory");
}

struct Shared {
  uint64_t full[2][kMaxBuffers];   // in rank 1: rank 0's 128 threads arrive per chunk
  uint64_t empty[2][kMaxBuffers];  // in rank 0: rank 1's 128 threads arrive per chunk
  alignas(128) float4 buffers[2][kMaxBuffers][kChunkBytes / 16];
};

// mode 0: dsmem; 1: global. `region`: kThreads * kFloats floats a cluster;
// `flags`: two a cluster (one a warpgroup), zeroed before the launch;
// `times`: the tile time of each cluster's rank 1, in ns; `sink` keeps the sums.
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads, 1)
    HandOver(int mode, int tiles, int buffers, float4* region, uint32_t* flags, uint64_t* times, float* sink) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  Shared& s = *reinterpret_cast<Shared*>(smem_raw);
  const uint32_t rank = cuda::ptx::get_sreg_cluster_ctarank();
  const int cluster = blockIdx.x / 2;
  const int wg = threadIdx.x / 128;
  const int t = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int w = 0; w < 2; ++w) {
      for (int b = 0; b < kMaxBuffers; ++b) {
        cuda::ptx::mbarrier_init(&s.full[w][b], 128);
        cuda::ptx::mbarrier_init(&s.empty[w][b], 128);
      }
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  loom::kernel::ptx::cluster_sync();
  float acc[kFloats];
#pragma unroll
  for (int i = 0; i < kFloats; ++i) acc[i] = static_cast<float>(i + threadIdx.x);
  const uint64_t start = loom::kernel::ptx::globaltimer();
  for (int tile = 0; tile < tiles; ++tile) {
    if (mode == 0) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int use = tile * kChunks + c;  // the buffer's uses so far, over all tiles
        const int b = use % buffers;
        const uint32_t parity = (use / buffers) & 1;
        float4* buffer = s.buffers[wg][b];
        if (rank == 0) {
          WaitCluster(&s.empty[wg][b], parity ^ 1);
          const uint32_t remote = loom::kernel::ptx::mapa_shared_cluster(SmemAddress(buffer), 1);
#pragma unroll
          for (int i = 0; i < kChunkFloats / 4; ++i) {
            const float* a = &acc[c * kChunkFloats + 4 * i];
            StoreRemote(remote + (i * 128 + t) * 16, make_float4(a[0], a[1], a[2], a[3]));
          }
          loom::kernel::ptx::mbarrier_arrive_cluster(
              loom::kernel::ptx::mapa_shared_cluster(SmemAddress(&s.full[wg][b]), 1));
        } else {
          WaitCluster(&s.full[wg][b], parity);
#pragma unroll
          for (int i = 0; i < kChunkFloats / 4; ++i) {
            const float4 v = buffer[i * 128 + t];
            float* a = &acc[c * kChunkFloats + 4 * i];
            a[0] += v.x;
            a[1] += v.y;
            a[2] += v.z;
            a[3] += v.w;
          }
          loom::kernel::ptx::mbarrier_arrive_cluster(
              loom::kernel::ptx::mapa_shared_cluster(SmemAddress(&s.empty[wg][b]), 0));
        }
      }
    } else {
      float4* mine = region + (static_cast<int64_t>(cluster) * 2 + wg) * 128 * (kFloats / 4);
      uint32_t* flag = &flags[cluster * 2 + wg];
      if (rank == 0) {
#pragma unroll
        for (int i = 0; i < kFloats / 4; ++i) {
          mine[i * 128 + t] = make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
        }
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
        if (t == 0) loom::kernel::ptx::st_release_gpu(flag, tile + 1);
      } else {
        if (t == 0) {
          while (true) {
            uint32_t v;
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
            if (v >= static_cast<uint32_t>(tile + 1)) break;
          }
        }
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
#pragma unroll
        for (int i = 0; i < kFloats / 4; ++i) {
          const float4 v = __ldcg(&mine[i * 128 + t]);
          acc[4 * i] += v.x;
          acc[4 * i + 1] += v.y;
          acc[4 * i + 2] += v.z;
          acc[4 * i + 3] += v.w;
        }
        // The writer may overwrite the region for the next tile only after
        // these reads: the next flag value is released after a cluster sync.
      }
      loom::kernel::ptx::cluster_sync();
    }
  }
  const uint64_t end = loom::kernel::ptx::globaltimer();
  loom::kernel::ptx::cluster_sync();  // neither CTA leaves while the other may touch its shared memory
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kFloats; ++i) sum += acc[i];
  sink[blockIdx.x * kThreads + threadIdx.x] = sum;
  if (rank == 1 && threadIdx.x == 0) times[cluster] = (end - start) / static_cast<uint64_t>(tiles);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int tiles = absl::GetFlag(FLAGS_tiles);
  const int buffers = absl::GetFlag(FLAGS_buffers);
  const int iters = absl::GetFlag(FLAGS_iters);
  std::vector<int> modes;
  for (absl::string_view m : absl::StrSplit(absl::GetFlag(FLAGS_mode), ',', absl::SkipEmpty())) {
    if (m == "dsmem") {
      modes.push_back(0);
    } else if (m == "global") {
      modes.push_back(1);
    } else {
      std::fprintf(stderr, "--mode: '%.*s' must be dsmem or global\n", static_cast<int>(m.size()), m.data());
      return 2;
    }
  }
  if (tiles < 1 || tiles > 4096 || buffers < 1 || buffers > kMaxBuffers || iters < 1) {
    std::fprintf(stderr, "--tiles=%d --buffers=%d --iters=%d: need tiles in [1, 4096], buffers in [1, %d], iters >= 1\n",
                 tiles, buffers, iters, kMaxBuffers);
    return 2;
  }
  cudaDeviceProp prop;
  PROBE_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int clusters = prop.multiProcessorCount / 2;
  const int ctas = 2 * clusters;
  float4* region;
  uint32_t* flags;
  uint64_t* times;
  float* sink;
  PROBE_CHECK(cudaMalloc(&region, static_cast<size_t>(clusters) * 2 * 128 * kFloats * 4));
  PROBE_CHECK(cudaMalloc(&flags, clusters * 2 * sizeof(uint32_t)));
  PROBE_CHECK(cudaMalloc(&times, clusters * sizeof(uint64_t)));
  PROBE_CHECK(cudaMalloc(&sink, static_cast<size_t>(ctas) * kThreads * sizeof(float)));
  const int smem = static_cast<int>(sizeof(Shared));
  PROBE_CHECK(cudaFuncSetAttribute(HandOver, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  std::printf("%d clusters of 2, %d tiles a launch, 64 KiB a warpgroup a tile (128 KiB a pair)\n", clusters, tiles);
  for (int mode : modes) {
    std::vector<uint64_t> host(clusters);
    for (int it = 0; it < iters; ++it) {
      PROBE_CHECK(cudaMemset(flags, 0, clusters * 2 * sizeof(uint32_t)));
      HandOver<<<ctas, kThreads, smem>>>(mode, tiles, buffers, region, flags, times, sink);
      PROBE_CHECK(cudaGetLastError());
      PROBE_CHECK(cudaDeviceSynchronize());
    }
    PROBE_CHECK(cudaMemcpy(host.data(), times, clusters * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    std::sort(host.begin(), host.end());
    const double median_us = host[clusters / 2] / 1e3, slowest_us = host.back() / 1e3;
    const double pair_bytes = 2.0 * 128 * kFloats * 4;
    std::printf("%-6s buffers %d: a tile %.2f us median, %.2f slowest; %.1f GB/s a pair, %.0f GB/s all pairs\n",
                mode == 0 ? "dsmem" : "global", buffers, median_us, slowest_us, pair_bytes / (median_us * 1e3),
                clusters * pair_bytes / (median_us * 1e3));
  }
  return 0;
}
