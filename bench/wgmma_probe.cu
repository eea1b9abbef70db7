// wgmma_probe: how fast one SM multiplies on wgmma with both operands from
// shared memory, in the pattern of the narrow decode kernel's main loop
// (RunWgmmaJob in ops/kernel/narrow_consumer_role.cuh), by instruction
// shape and by the number of warpgroups issuing at once. No loads, no rings: operands sit in
// shared memory (random bf16), each warpgroup its own copy, and every stage
// multiplies the same bytes.
//
// A stage is issued as the narrow kernel does: its wgmmas one group into
// independent accumulator sets (k16 step j into set j % sets), then commit
// and wait until at most the previous stage's group is in flight. Shapes
// (--shapes), named n<N>x<wgmmas a stage>s<sets>:
//   n32x4s4, n32x8s4   m64n32k16 (RunWgmmaJob's instruction), 4 or 8 a stage
//   n64x4s2, n64x8s2   m64n64k16 (RunPairedWgmmaJob's)
//   n128x4s1           m64n128k16 (the tiled kernel's with 128-column tiles)
//   n256x2s1, n256x4s1 m64n256k16 (the tiled kernel's)
// At most 8 a stage: with 16 (the narrow kernel's stage) ptxas serializes
// this loop's wgmmas (C7514, "non wgmma instructions reading accumulator
// registers"), which it does not do in the kernel, so the figures would not
// be the instruction's. --warpgroups: warpgroups per CTA issuing stages
// (each 128 threads); the CTA is one per SM.
//
// Prints, per shape and warpgroup count, cycles a stage and a wgmma (each
// warpgroup's own, median over the grid's warpgroups, from the clock at its
// start and end), ns a stage over the whole launch, and the SM's
// multiply-adds per clock over all its warpgroups (the H200's dense bf16 peak
// is 2048 = 4096 flops a clock an SM).
//
//   wgmma_probe --shapes=n32x8s4,n64x8s2 --warpgroups=1,2 --stages=4000
#include <cuda_bf16.h>
#include <cuda_runtime.h>

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

ABSL_FLAG(std::string, shapes, "n32x4s4,n32x8s4,n64x4s2,n64x8s2,n256x2s1,n256x4s1",
          "stage shapes to try (see the file's comment)");
ABSL_FLAG(std::string, warpgroups, "1,2,3", "warpgroups issuing stages in each CTA (1 to 3), a list");
ABSL_FLAG(int, stages, 4000, "stages each warpgroup multiplies");

namespace {

using loom::kernel::AdvanceDescriptorK16;
using loom::kernel::AdvanceDescriptorLowK16;
using loom::kernel::MakeSwizzle128Descriptor;
using loom::kernel::Swizzle128DescriptorLow;

// The probe times the bf16 forms.
constexpr loom::kernel::ElementType kBF16 = loom::kernel::ElementType::kBF16;
constexpr uint32_t kOperandBytes = 64 * 1024;  // A (at most 32 KiB, n32) then B (at most 32 KiB, n256)

// One stage: kWgmmas wgmmas m64nNk16 (N = kN: 32, 64 or 256) over kWgmmas
// k16 steps, step j into accumulator set j % kSets, from the operands at a
// (A, k-block-major, 128B swizzle, 8 KiB a k-block) and b (B, the same, kN x
// 128 bytes a k-block).
template <int kN, int kWgmmas, int kSets>
struct Stage {
  static_assert(kWgmmas % kSets == 0 && kWgmmas <= 8, "at most 8 a stage (see the file's comment)");
  static_assert(kN * 128 * ((kWgmmas + 3) / 4) <= 32 * 1024, "at most 32 KiB of B");
  static constexpr int kRegisters = kN / 2;
  static constexpr int kWgmmasPerStage = kWgmmas;
  static constexpr int kMacs = 64 * kN * 16 * kWgmmas;
  float acc[kSets][kRegisters] = {};
  __device__ void Issue(uint32_t a, uint32_t b) {
#pragma unroll
    for (int kb = 0; kb < (kWgmmas + 3) / 4; ++kb) {
      const uint32_t a_tile = a + kb * 8192, b_tile = b + kb * kN * 128;
      const uint32_t a_low = Swizzle128DescriptorLow(a_tile), b_low = Swizzle128DescriptorLow(b_tile);
#pragma unroll
      for (int k16 = 0; k16 < 4 && 4 * kb + k16 < kWgmmas; ++k16) {
        const int j = 4 * kb + k16;
        if constexpr (kN == 32) {
          loom::kernel::wgmma_m64n32k16_ss<kBF16>(acc[j % kSets], AdvanceDescriptorLowK16(a_low, k16),
                                                  AdvanceDescriptorLowK16(b_low, k16));
        } else if constexpr (kN == 64) {
          loom::kernel::wgmma_m64n64k16_ss<kBF16>(acc[j % kSets], AdvanceDescriptorLowK16(a_low, k16),
                                                  AdvanceDescriptorLowK16(b_low, k16));
        } else {
          static_assert(kN == 128 || kN == 256, "m64n32k16, m64n64k16, m64n128k16 or m64n256k16");
          const uint64_t da = AdvanceDescriptorK16(MakeSwizzle128Descriptor(a_tile), k16);
          const uint64_t db = AdvanceDescriptorK16(MakeSwizzle128Descriptor(b_tile), k16);
          if constexpr (kN == 128) {
            loom::kernel::wgmma_m64n128k16<kBF16>(acc[j % kSets], da, db, true);
          } else {
            loom::kernel::wgmma_m64n256k16<kBF16>(acc[j % kSets], da, db, true);
          }
        }
      }
    }
  }
  __device__ float Sum() const {
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < kSets; ++c) {
#pragma unroll
      for (int r = 0; r < kRegisters; ++r) s += acc[c][r];
    }
    return s;
  }
};

// Each warpgroup multiplies `stages` stages from its own operands; lane 0 of
// its first warp records the clock before and after. `sink` keeps the
// accumulators live.
template <typename StageT>
__global__ void ProbeKernel(int stages, long long* cycles, float* sink) {
  extern __shared__ uint8_t dynamic_smem[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(dynamic_smem));
  uint8_t* smem = dynamic_smem + (((raw + 1023) & ~1023u) - raw);
  for (uint32_t i = threadIdx.x; i < blockDim.x / 128 * kOperandBytes / 4; i += blockDim.x) {
    // Random-looking bf16 pairs of moderate magnitude (no zeros, no infinities).
    const uint32_t h = (i * 2654435761u) ^ (i >> 7);
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3c003c00u | (h & 0x03ff03ffu);
  }
  __syncthreads();
  const int warpgroup = static_cast<int>(threadIdx.x / 128);
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem + warpgroup * kOperandBytes));
  const uint32_t b = a + 32 * 1024;
  StageT stage;
  const long long start = clock64();
  for (int s = 0; s < stages; ++s) {
    loom::kernel::ptx::wgmma_fence();
    stage.Issue(a, b);
    loom::kernel::ptx::wgmma_commit_group();
    loom::kernel::ptx::wgmma_wait_group<1>();
  }
  loom::kernel::ptx::wgmma_wait_group<0>();
  const long long end = clock64();
  const float sum = stage.Sum();
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 4 + warpgroup] = end - start;
  if (sum == 1234.5f) *sink = sum;  // never true in practice; keeps the multiplies
}

template <typename StageT>
void Run(const char* name, int warpgroups, int stages, int sms, int clock_khz) {
  const auto kernel = ProbeKernel<StageT>;
  const int smem = warpgroups * static_cast<int>(kOperandBytes) + 1024;
  PROBE_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  long long* cycles = nullptr;
  float* sink = nullptr;
  PROBE_CHECK(cudaMalloc(&cycles, sms * 4 * sizeof(long long)));
  PROBE_CHECK(cudaMalloc(&sink, sizeof(float)));
  cudaEvent_t begin, end;
  PROBE_CHECK(cudaEventCreate(&begin));
  PROBE_CHECK(cudaEventCreate(&end));
  kernel<<<sms, warpgroups * 128, smem>>>(stages / 10 + 1, cycles, sink);  // warm-up
  PROBE_CHECK(cudaEventRecord(begin));
  kernel<<<sms, warpgroups * 128, smem>>>(stages, cycles, sink);
  PROBE_CHECK(cudaEventRecord(end));
  PROBE_CHECK(cudaEventSynchronize(end));
  PROBE_CHECK(cudaGetLastError());
  float ms = 0.0f;
  PROBE_CHECK(cudaEventElapsedTime(&ms, begin, end));
  std::vector<long long> host(sms * 4);
  PROBE_CHECK(cudaMemcpy(host.data(), cycles, host.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  std::vector<long long> per_warpgroup;
  for (int cta = 0; cta < sms; ++cta) {
    for (int w = 0; w < warpgroups; ++w) per_warpgroup.push_back(host[cta * 4 + w]);
  }
  std::nth_element(per_warpgroup.begin(), per_warpgroup.begin() + per_warpgroup.size() / 2, per_warpgroup.end());
  const double median_cycles = static_cast<double>(per_warpgroup[per_warpgroup.size() / 2]);
  const double cycles_per_stage = median_cycles / stages;
  const double ns_per_stage = ms * 1e6 / stages;  // the whole launch, every warpgroup in parallel
  std::printf(
      "%-9s %d warpgroups  %7.1f cycles a stage a warpgroup (%5.1f a wgmma)  %7.1f ns a stage (launch)"
      "  %5.0f MAC/clk/SM  (SM clock %.2f GHz nominal)\n",
      name, warpgroups, cycles_per_stage, cycles_per_stage / StageT::kWgmmasPerStage, ns_per_stage,
      warpgroups * StageT::kMacs / cycles_per_stage, clock_khz / 1e6);
  PROBE_CHECK(cudaFree(cycles));
  PROBE_CHECK(cudaFree(sink));
  PROBE_CHECK(cudaEventDestroy(begin));
  PROBE_CHECK(cudaEventDestroy(end));
}

// The shapes --shapes may name (the file's comment).
struct ProbeShape {
  const char* name;
  void (*run)(const char* name, int warpgroups, int stages, int sms, int clock_khz);
};
constexpr ProbeShape kShapes[] = {
    {"n32x4s4", &Run<Stage<32, 4, 4>>}, {"n32x8s4", &Run<Stage<32, 8, 4>>},   {"n64x4s2", &Run<Stage<64, 4, 2>>},
    {"n64x8s2", &Run<Stage<64, 8, 2>>}, {"n128x4s1", &Run<Stage<128, 4, 1>>}, {"n256x2s1", &Run<Stage<256, 2, 1>>},
    {"n256x4s1", &Run<Stage<256, 4, 1>>},
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int stages = absl::GetFlag(FLAGS_stages);
  if (stages < 10) {
    std::fprintf(stderr, "wgmma_probe: --stages must be at least 10, got %d\n", stages);
    return 2;
  }
  const std::vector<int> warpgroups = ParseIntList("warpgroups", absl::GetFlag(FLAGS_warpgroups));
  for (int w : warpgroups) {
    if (w < 1 || w > 3) {  // 64 KiB of operands each
      std::fprintf(stderr, "wgmma_probe: --warpgroups entries must be 1 to 3, got %d\n", w);
      return 2;
    }
  }
  std::vector<const ProbeShape*> shapes;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',', absl::SkipEmpty())) {
    const ProbeShape* found = nullptr;
    for (const ProbeShape& shape : kShapes) {
      if (name == shape.name) found = &shape;
    }
    if (found == nullptr) {
      std::fprintf(stderr, "wgmma_probe: unknown shape '%.*s' in --shapes\n", static_cast<int>(name.size()),
                   name.data());
      return 2;
    }
    shapes.push_back(found);
  }
  int device = 0, sms = 0, clock_khz = 0;
  PROBE_CHECK(cudaGetDevice(&device));
  PROBE_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  PROBE_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
  for (const ProbeShape* shape : shapes) {
    for (int w : warpgroups) shape->run(shape->name, w, stages, sms, clock_khz);
  }
  return 0;
}
