// register_stream_probe: can a 64-token layer stream its weights at the
// one-token rate if the weights never pass through shared memory?
//
// At 33-64 rows the narrow kernel (RunWgmmaJob in
// ops/kernel/narrow_consumer_role.cuh) multiplies a 32-column weight tile on
// wgmma m64n32k16 with both operands in shared memory: per weight byte the SM's
// shared memory takes 1 byte of weights and 2 of tokens written by TMA and
// reads the same 3 back, and wgmma_probe measured m64n32k16 at the 24 cycles a
// wgmma that its 3 KiB of operands take at 128 bytes a clock. This probe times
// the other way round: the weights are wgmma's A operand (64 weight rows =
// output columns, the M side), loaded by every consumer thread straight from
// global memory into the registers of its m64k16 fragment (16 bytes a thread a
// k16 step, the layout a packed copy of the weights could have), and the 64
// tokens are the B operand (N = 64) from shared memory. Per weight byte the
// shared memory then takes 1 byte of tokens written and 1 read.
//
// Every SM runs one CTA of --warpgroups consumer warpgroups; each warpgroup
// streams its own contiguous slice of a --mib MiB weight buffer, 2 KiB a k16
// step, keeping --depth steps of loads in flight per thread (16 bytes each).
// Modes (--modes):
//   ldg  the loads only (each fragment folded into a sink): the register
//        stream's own rate
//   rs   + wgmma m64n64k16 with A from registers (the fragment), B the
//        tokens' k-block from shared memory, never reloaded (a static tile)
//   rsx  rs, with the tokens' k-block (64 x 64 bf16, 8 KiB) brought in by a
//        bulk copy from a 512 KiB token buffer (L2-resident, as a layer's A)
//        into a ring of --x_stages slots per warpgroup, as a layer's A would be
// The narrow kernel's own pattern is what to compare with: `loom_bench
// --kernel=narrow --pack_weights` at 64 x N x K in the same run (a copy of
// it here, 16 m64n32k16 a stage from a bulk-copied ring, was serialized by
// ptxas, C7514, as wgmma_probe's was, so it would not time the kernel's).
// Results are not checked: the values are whatever the buffers hold (the
// probe times the traffic, not the arithmetic). Printed per mode and depth:
// the launch's time (median of --iters), the weights' TB/s over the chip and
// GB/s a warpgroup.
//
//   register_stream_probe --modes=ldg,rs,rsx --depth=8,16 --warpgroups=2
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
#include "wgmma.cuh"

ABSL_FLAG(std::string, modes, "ldg,rs,rsx", "comma-separated: ldg, rs, rsx");
ABSL_FLAG(std::string, depth, "8,16", "k16 steps of weight loads in flight per thread (8 or 16), a list");
ABSL_FLAG(int, warpgroups, 2, "consumer warpgroups per CTA (1 or 2)");
ABSL_FLAG(int, mib, 224, "MiB of weights streamed per launch, over all warpgroups (64-1024)");
ABSL_FLAG(int, x_stages, 4, "rsx: token ring slots per warpgroup (2-8)");
ABSL_FLAG(int, iters, 5, "launches per mode and depth (the median printed)");

namespace {

enum Mode : int { kLdg = 0, kRs = 1, kRsx = 2 };
constexpr const char* kModeNames[] = {"ldg", "rs", "rsx"};

constexpr int kStepBytes = 2048;          // a warpgroup's weights a k16 step: 64 rows x 16 bf16
constexpr int kXKBlockBytes = 64 * 128;   // the tokens' k-block: 64 rows x 64 bf16, 128B swizzled
constexpr int kXBufferBytes = 512 * 1024; // the token buffer in global memory (64 x 4096 bf16)
constexpr int kMaxSlots = 8;

struct Params {
  const uint4* weights;
  const uint8_t* tokens;  // kXBufferBytes
  int64_t steps;          // k16 steps per warpgroup
  int slots;
  uint32_t* sink;
};

// A warpgroup's shared memory: rsx's ring of `slots` token k-blocks, or the
// four static ones of rs (ldg reserves them too, unread).
__host__ __device__ constexpr uint32_t RingBytes(int mode, int slots) {
  return static_cast<uint32_t>(mode == kRsx ? slots : 4) * kXKBlockBytes;
}

__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// wgmma m64n64k16, A (this thread's fragment of the 64 x 16 weights) from
// registers, B (64 tokens x 16) from shared memory through a descriptor's
// low word; accumulates.
__device__ __forceinline__ void WgmmaRs(float (&d)[32], const uint4& a, uint32_t desc_b_low) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      ".reg .b32 high;\n"
      ".reg .b64 db;\n"
      "mov.b32 high, %37;\n"
      "mov.b64 db, {%36, high};\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 \n"
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,\n"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},\n"
      "{%32, %33, %34, %35}, db, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(desc_b_low), "n"(loom::kernel::kSwizzle128DescriptorHigh));
}

__device__ __forceinline__ void WaitFull(uint64_t* bar, uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cta, bar, parity)) {
  }
}

// One bulk copy of `bytes` from global `src` into shared `dst`, completing on `bar`.
__device__ __forceinline__ void CopyIn(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, src, bytes, bar);
}

__device__ __forceinline__ uint32_t SmemAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The rs / rsx / ldg loop of one warpgroup. `ring` is its shared memory
// (rs: 4 static token k-blocks; rsx: `slots` ring slots of one k-block),
// `full` its slots' barriers; `leader` issues the token copies.
template <int kMode, int kDepth>
__device__ void RegisterStream(const Params& p, const uint4* slice, uint8_t* ring, uint64_t* full, bool leader,
                               int thread) {
  const uint8_t* tokens = p.tokens;
  const int slots = p.slots;
  uint4 w[kDepth];
#pragma unroll
  for (int j = 0; j < kDepth; ++j) w[j] = LoadStreaming(slice + j * 128 + thread);
  uint32_t fold = 0;
  float acc[2][32];
#pragma unroll
  for (int s = 0; s < 2; ++s) {
#pragma unroll
    for (int r = 0; r < 32; ++r) acc[s][r] = 0.0f;
  }
  if (kMode == kRsx && leader) {
    for (int s = 0; s < slots; ++s) {
      cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                           &full[s], kXKBlockBytes);
      CopyIn(ring + s * kXKBlockBytes, tokens + (s % 64) * kXKBlockBytes, kXKBlockBytes, &full[s]);
    }
  }
  for (int64_t base = 0; base < p.steps; base += kDepth) {
#pragma unroll
    for (int j = 0; j < kDepth; ++j) {
      const int64_t t = base + j;
      if constexpr (kMode == kLdg) {
        fold ^= w[j].x ^ w[j].y ^ w[j].z ^ w[j].w;
        if (t + kDepth < p.steps) w[j] = LoadStreaming(slice + (t + kDepth) * 128 + thread);
        continue;
      }
      const int64_t kb = t / 4;
      uint32_t x_tile;
      if constexpr (kMode == kRsx) {
        const int slot = static_cast<int>(kb % slots);
        if (t % 4 == 0) WaitFull(&full[slot], static_cast<uint32_t>((kb / slots) & 1));
        x_tile = SmemAddress(ring + slot * kXKBlockBytes);
      } else {
        x_tile = SmemAddress(ring + (kb % 4) * kXKBlockBytes);
      }
      loom::kernel::ptx::wgmma_fence();
      WgmmaRs(acc[j % 2], w[j],
              loom::kernel::AdvanceDescriptorLowK16(loom::kernel::Swizzle128DescriptorLow(x_tile),
                                                    static_cast<int>(t % 4)));
      loom::kernel::ptx::wgmma_commit_group();
      loom::kernel::ptx::wgmma_wait_group<1>();
      // Step t - 1's wgmma has retired: its fragment's registers take step
      // t - 1 + kDepth, and at a k-block's first step the previous
      // k-block's slot is free for the k-block `slots` past it.
      const int prev = (j + kDepth - 1) % kDepth;  // a constant once unrolled
      if (t >= 1 && t - 1 + kDepth < p.steps) w[prev] = LoadStreaming(slice + (t - 1 + kDepth) * 128 + thread);
      if (kMode == kRsx && leader && t % 4 == 0 && kb >= 1 && kb - 1 + slots < p.steps / 4) {
        const int64_t next = kb - 1 + slots;
        const int slot = static_cast<int>((kb - 1) % slots);
        cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                             &full[slot], kXKBlockBytes);
        CopyIn(ring + slot * kXKBlockBytes, tokens + (next % 64) * kXKBlockBytes, kXKBlockBytes, &full[slot]);
      }
    }
  }
  loom::kernel::ptx::wgmma_wait_group<0>();
  float total = 0.0f;
#pragma unroll
  for (int r = 0; r < 32; ++r) total += acc[0][r] + acc[1][r];
  // Never true in practice; depends on every load (ldg) or every wgmma
  // (rs, rsx), so that ptxas keeps them.
  if ((fold ^ __float_as_uint(total)) == 0x12345678u) p.sink[0] = fold;
}

template <int kMode, int kDepth>
__global__ void __launch_bounds__(256, 1) StreamKernel(Params p) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t raw = SmemAddress(smem_raw);
  uint8_t* smem = smem_raw + (((raw + 1023) & ~1023u) - raw);
  const int wg = threadIdx.x / 128;
  const int thread = threadIdx.x % 128;
  const int warpgroups = blockDim.x / 128;
  const uint32_t ring_bytes = RingBytes(kMode, p.slots);
  auto* barriers = reinterpret_cast<uint64_t*>(smem + warpgroups * ring_bytes);
  uint8_t* ring = smem + wg * ring_bytes;
  uint64_t* full = barriers + wg * kMaxSlots;
  if (thread == 0) {
    for (int s = 0; s < kMaxSlots; ++s) cuda::ptx::mbarrier_init(&full[s], 1);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  __syncthreads();
  const int64_t slice_index = static_cast<int64_t>(blockIdx.x) * warpgroups + wg;
  const uint4* slice = p.weights + slice_index * p.steps * (kStepBytes / 16);
  RegisterStream<kMode, kDepth>(p, slice, ring, full, thread == 0, thread);
}

template <int kMode, int kDepth>
float TimeLaunches(const Params& p, int grid, int threads, uint32_t smem, int iters) {
  PROBE_CHECK(cudaFuncSetAttribute(StreamKernel<kMode, kDepth>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t start, stop;
  PROBE_CHECK(cudaEventCreate(&start));
  PROBE_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int i = 0; i <= iters; ++i) {  // the first launch warms up
    PROBE_CHECK(cudaEventRecord(start));
    StreamKernel<kMode, kDepth><<<grid, threads, smem>>>(p);
    PROBE_CHECK(cudaEventRecord(stop));
    PROBE_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    PROBE_CHECK(cudaEventElapsedTime(&t, start, stop));
    if (i > 0) ms.push_back(t);
  }
  PROBE_CHECK(cudaGetLastError());
  PROBE_CHECK(cudaEventDestroy(start));
  PROBE_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// TimeLaunches of the kernel for `mode` and `depth`.
float Time(int mode, int depth, const Params& p, int grid, int threads, uint32_t smem, int iters) {
  switch (mode) {
    case kLdg:
      return depth == 8 ? TimeLaunches<kLdg, 8>(p, grid, threads, smem, iters)
                        : TimeLaunches<kLdg, 16>(p, grid, threads, smem, iters);
    case kRs:
      return depth == 8 ? TimeLaunches<kRs, 8>(p, grid, threads, smem, iters)
                        : TimeLaunches<kRs, 16>(p, grid, threads, smem, iters);
    default:
      return depth == 8 ? TimeLaunches<kRsx, 8>(p, grid, threads, smem, iters)
                        : TimeLaunches<kRsx, 16>(p, grid, threads, smem, iters);
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int> modes;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_modes), ',', absl::SkipEmpty())) {
    const auto* it = std::find(std::begin(kModeNames), std::end(kModeNames), name);
    if (it == std::end(kModeNames)) {
      std::fprintf(stderr, "--modes: '%.*s' must be ldg, rs or rsx\n", static_cast<int>(name.size()),
                   name.data());
      return 2;
    }
    modes.push_back(static_cast<int>(it - std::begin(kModeNames)));
  }
  const std::vector<int> depths = ParseIntList("depth", absl::GetFlag(FLAGS_depth));
  for (int d : depths) {
    if (d != 8 && d != 16) {
      std::fprintf(stderr, "--depth: %d must be 8 or 16\n", d);
      return 2;
    }
  }
  const int warpgroups = absl::GetFlag(FLAGS_warpgroups);
  const int mib = absl::GetFlag(FLAGS_mib);
  const int slots = absl::GetFlag(FLAGS_x_stages);
  const int iters = absl::GetFlag(FLAGS_iters);
  if (warpgroups < 1 || warpgroups > 2 || mib < 64 || mib > 1024 || slots < 2 || slots > kMaxSlots || iters < 1) {
    std::fprintf(stderr,
                 "--warpgroups=%d --mib=%d --x_stages=%d --iters=%d: need warpgroups 1-2, mib 64-1024, "
                 "x_stages 2-%d, iters >= 1\n",
                 warpgroups, mib, slots, iters, kMaxSlots);
    return 2;
  }
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) !=
                                                   cudaSuccess) {
    std::fprintf(stderr, "register_stream_probe: no CUDA device\n");
    return 1;
  }
  // Each warpgroup's slice: a whole number of depth-16 rounds.
  const int64_t wgs = static_cast<int64_t>(sms) * warpgroups;
  const int64_t steps = (static_cast<int64_t>(mib) << 20) / kStepBytes / wgs / 16 * 16;
  const int64_t weight_bytes = steps * kStepBytes * wgs;
  uint4* weights = nullptr;
  uint8_t* tokens = nullptr;
  uint32_t* sink = nullptr;
  PROBE_CHECK(cudaMalloc(&weights, weight_bytes));
  PROBE_CHECK(cudaMalloc(&tokens, kXBufferBytes));
  PROBE_CHECK(cudaMalloc(&sink, sizeof(uint32_t)));
  PROBE_CHECK(cudaMemset(weights, 0x3c, weight_bytes));  // bf16 ~0.011 everywhere: finite sums
  PROBE_CHECK(cudaMemset(tokens, 0x3c, kXBufferBytes));
  std::printf("%d SMs, %d warpgroup(s) a CTA, %.1f MiB of weights, %lld k16 steps a warpgroup\n", sms, warpgroups,
              weight_bytes / 1048576.0, static_cast<long long>(steps));
  std::printf("%-5s %6s %10s %10s %14s\n", "mode", "depth", "us", "TB/s", "GB/s a wg");
  for (int mode : modes) {
    for (int depth : depths) {
      const Params p{weights, tokens, steps, slots, sink};
      const uint32_t smem = warpgroups * RingBytes(mode, slots) + warpgroups * kMaxSlots * sizeof(uint64_t) + 1024;
      const float ms = Time(mode, depth, p, sms, 128 * warpgroups, smem, iters);
      const double seconds = ms * 1e-3;
      std::printf("%-5s %6d %10.1f %10.2f %14.1f\n", kModeNames[mode], depth, ms * 1e3, weight_bytes / seconds / 1e12,
                  weight_bytes / wgs / seconds / 1e9);
    }
  }
  PROBE_CHECK(cudaFree(weights));
  PROBE_CHECK(cudaFree(tokens));
  PROBE_CHECK(cudaFree(sink));
  return 0;
}
