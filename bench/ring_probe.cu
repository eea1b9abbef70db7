// ring_probe: the tiled kernel's consumer main loop (RunMainLoop in
// ops/kernel/mma_role.cuh) and its rings, built up from a bare wgmma loop one
// part at a time. Why: bench/NOTES.md v1.64 measured a 128-wide k-block's
// multiply at ~680 cycles inside the kernel with its loads switched off,
// against ~520 for the same wgmmas in wgmma_probe, and did not find where the
// rest goes. Each level adds one part of the kernel's loop to the one before:
//   0 bare     fence, four m64nNk16 wgmmas (one k-block of 64), commit,
//              wait_group<1>; both warpgroups read one B (as the kernel's
//              do) and their own 64 rows of A, always from the same slot.
//   1 rotate   the slots rotate through --slots stages of an A ring and a B
//              ring, the descriptors made from the stage as the kernel does.
//   2 wait     each k-block waits on its A and B slots' full barriers, which
//              a producer thread a ring arms (a plain arrival, no bytes)
//              after the slot's empty barrier completes; the first thread of
//              each consumer warpgroup releases the slots of k-block i - 1
//              after wait_group<1>, as the kernel does.
//   3 cluster  clusters of two: each release arrives on the empty barriers of
//              both CTAs (the kernel's ArriveOnEveryCta), so a CTA's
//              producers wait for the peer's consumers too.
//   4 waiters  the producer warpgroup's two other warps each have a thread
//              in a try-wait loop on a barrier that completes only at the
//              end, as the kernel's store thread and scheduler wait.
//   5 loads    the producers fill the slots: A with one bulk copy of 16 KiB
//              a CTA, B with one of half the stage that each CTA multicasts
//              to both (as packed weights shared by the pair), from a
//              --buffer_mib buffer read round and round (so from L2 once
//              it fits there); the full barriers expect the bytes.
// --multiply=false leaves the wgmmas out (the slots are still waited for
// and released): the loads' own rate at level 5.
// --variants (levels 2 and up, but delay) change how the consumers wait for
// full slots, to place the handshake's cost (bench/NOTES.md v1.86, v1.87):
//   kernel        as the kernel: every thread polls k-block i's full
//                 barriers after releasing k-block i - 1's slots.
//   no_full_wait  the consumers do not wait for full slots at all (levels
//                 2-4 only, where the slots carry no bytes): the releases'
//                 cost alone.
//   lane_wait     one lane a warp polls, then the warp meets (__syncwarp).
//   wait_ahead    k-block i + 1's full barriers are polled right after k-block
//                 i's wgmmas are issued, before wgmma.wait_group<1> and the
//                 release, so no poll lies between a release and the next
//                 issue (3 slots or more: with 2 it would wait for its own
//                 release).
//   paired_wait   both full barriers' first tries are issued before either
//                 result is tested, so their latencies overlap.
//   delay         no full waits (as no_full_wait; levels 0-4), and each
//                 k-block spins for each of --delays cycles before its
//                 wgmmas, where the waits would be: how much latency there
//                 the wgmmas in flight hide (bench/NOTES.md v1.87).
// The multiply sits under a runtime condition (`compute`, from --multiply),
// as the kernel's does. ptxas serialised this loop's wgmmas (C7514 or C7515)
// in several of the probe's first forms, all of which summed every
// accumulator after the loop; the probe reads one, and
// ring_probe_codegen_test fails the build if ptxas serialises it again.
//
// Prints, per tile width and level, the consumer warpgroups' cycles a k-block
// (median over the grid, from the clock at each warpgroup's start and end)
// and the fraction of the tensor pipe that is (512 cycles a 128 x 128 x 64
// k-block, 1024 at 256 columns, at 2048 multiply-adds a clock).
//
//   ring_probe --widths=128,256 --levels=0,1,2,3,4,5 --slots=4 --k_blocks=4000
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "cta_context.cuh"
#include "mma_role.cuh"
#include "probe_common.h"
#include "ptx.cuh"
#include "watchdog.cuh"
#include "wgmma.cuh"

ABSL_FLAG(std::string, widths, "128,256", "tile widths (wgmma N) to try: 128 and/or 256, a list");
ABSL_FLAG(std::string, levels, "0,1,2,3,4,5", "levels to run (see the file's comment), a list of 0-5");
ABSL_FLAG(int, slots, 4, "stages in each ring (2 to 6)");
ABSL_FLAG(int, k_blocks, 4000, "k-blocks each consumer warpgroup multiplies");
ABSL_FLAG(bool, multiply, true, "issue the wgmmas (false: the ring's waits and releases only)");
ABSL_FLAG(int, buffer_mib, 16, "level 5: the global buffer the loads read, MiB (1 to 1024)");
ABSL_FLAG(std::string, variants, "kernel",
          "how the consumers wait for full slots at levels 2 and up, a list of kernel, no_full_wait, lane_wait, "
          "wait_ahead, paired_wait, delay (see the file's comment)");
ABSL_FLAG(std::string, delays, "0,32,64,128,256",
          "the delay variant's spins, cycles a k-block (a list, each 0 to 100000)");

namespace {

namespace ptx = loom::kernel::ptx;
using loom::kernel::AdvanceDescriptorK16;
using loom::kernel::MakeSwizzle128Descriptor;
using loom::kernel::RingCursor;
using loom::kernel::WaitPhase;

constexpr loom::kernel::ElementType kBF16 = loom::kernel::ElementType::kBF16;
constexpr int kThreads = 384;                  // a producer warpgroup, then two consumer warpgroups
constexpr uint32_t kAStageBytes = 128 * 128;   // 128 rows x 64 bf16 (128 B), 128B swizzle
constexpr uint32_t kAHalfBytes = kAStageBytes / 2;
constexpr int kMaxSlots = 6;

enum class Variant : int { kKernel, kNoFullWait, kLaneWait, kWaitAhead, kPairedWait, kDelay };
constexpr const char* kVariantNames[] = {"kernel", "no_full_wait", "lane_wait", "wait_ahead", "paired_wait", "delay"};

struct Barriers {
  uint64_t a_full[kMaxSlots], a_empty[kMaxSlots], b_full[kMaxSlots], b_empty[kMaxSlots];
  uint64_t never;  // what level 4's waiters wait on; completed at the end
};

// WaitPhase on two barriers, both first tries issued before either result
// is tested, so that their latencies overlap where both phases are complete
// already (the paired_wait variant, bench/NOTES.md v1.87; 3 cycles a k-block
// here, and in the kernel level on single GEMMs and slower at 64 tokens, v1.88).
__device__ __forceinline__ void WaitPhases(uint64_t* first, uint32_t first_parity, uint64_t* second,
                                           uint32_t second_parity) {
  const bool first_done = cuda::ptx::mbarrier_try_wait_parity(first, first_parity);
  const bool second_done = cuda::ptx::mbarrier_try_wait_parity(second, second_parity);
  if (!first_done) WaitPhase(first, first_parity);
  if (!second_done) WaitPhase(second, second_parity);
}

template <int kN>
__device__ __forceinline__ void Multiply(float (&acc)[kN / 2], uint64_t desc_a, uint64_t desc_b) {
  ptx::wgmma_fence();
#pragma unroll
  for (int k16 = 0; k16 < 4; ++k16) {
    loom::kernel::WgmmaTile<kBF16>(acc, AdvanceDescriptorK16(desc_a, k16), AdvanceDescriptorK16(desc_b, k16));
  }
  ptx::wgmma_commit_group();
}

// Arrives on the barrier at `barrier`'s offset in each of the cluster's
// `cluster` CTAs: CtaContext::ArriveOnEveryCta's code, unrolled to two
// arrivals as there, without the kernel's context.
__device__ __forceinline__ void ReleaseEverywhere(uint64_t* barrier, int cluster) {
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(barrier));
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (r < cluster) ptx::mbarrier_arrive_remote(ptx::mapa_shared_cluster(local, r));
  }
}

// The variant is a template parameter: as a runtime argument it changed the
// kernel variant's own loop (three arguments reread from the constant bank
// every k-block; on one H200, 557.8 cycles a 128-wide k-block at level 2
// became 750.4, bench/NOTES.md v1.87).
template <int kN, Variant kVariant>
__global__ void __launch_bounds__(kThreads, 1)
    RingKernel(int level, long long delay, int slots, int k_blocks, bool compute, const uint8_t* buffer,
               uint32_t buffer_stages, long long* cycles, float* sink) {
  constexpr uint32_t kBStageBytes = kN * 128;
  extern __shared__ uint8_t dynamic_smem[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(dynamic_smem));
  uint8_t* smem = dynamic_smem + (((raw + 1023) & ~1023u) - raw);
  uint8_t* a_ring = smem;
  uint8_t* b_ring = a_ring + slots * kAStageBytes;
  Barriers* barriers = reinterpret_cast<Barriers*>(b_ring + slots * kBStageBytes);
  const int cluster = level >= 3 ? 2 : 1;
  const uint32_t rank = cluster > 1 ? cuda::ptx::get_sreg_cluster_ctarank() : 0;
  const int warpgroup = static_cast<int>(threadIdx.x / 128);
  const int lane_of_warpgroup = static_cast<int>(threadIdx.x % 128);

  for (uint32_t i = threadIdx.x; i < slots * (kAStageBytes + kBStageBytes) / 4; i += blockDim.x) {
    const uint32_t h = (i * 2654435761u) ^ (i >> 7);  // moderate bf16 pairs: no zeros, no infinities
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3c003c00u | (h & 0x03ff03ffu);
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < slots; ++s) {
      cuda::ptx::mbarrier_init(&barriers->a_full[s], 1);
      cuda::ptx::mbarrier_init(&barriers->b_full[s], 1);
      cuda::ptx::mbarrier_init(&barriers->a_empty[s], 2 * cluster);
      cuda::ptx::mbarrier_init(&barriers->b_empty[s], 2 * cluster);
    }
    cuda::ptx::mbarrier_init(&barriers->never, 1);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  __syncthreads();
  if (cluster > 1) ptx::cluster_sync();

  if (warpgroup == 0) {
    const int warp = lane_of_warpgroup / 32;
    if (lane_of_warpgroup % 32 != 0 || level < 2) {
      // no producer below level 2
    } else if (warp < 2) {
      // Warp 0 arms the A ring, warp 1 the B ring.
      const bool is_a = warp == 0;
      uint64_t* full = is_a ? barriers->a_full : barriers->b_full;
      uint64_t* empty = is_a ? barriers->a_empty : barriers->b_empty;
      const uint32_t stage_bytes = is_a ? kAStageBytes : kBStageBytes;
      // B shared by the pair: this CTA's half, to both CTAs.
      const uint32_t copy_bytes = is_a || cluster == 1 ? stage_bytes : stage_bytes / 2;
      const uint32_t copy_offset = is_a ? 0 : rank * copy_bytes;
      uint8_t* ring_base = is_a ? a_ring : b_ring;
      // Each CTA walks the buffer from its own place (a 32-KiB stride).
      uint32_t source_stage = (blockIdx.x * 7) % buffer_stages;
      RingCursor ring;
      for (int i = 0; i < k_blocks; ++i) {
        WaitPhase(&empty[ring.stage], ring.phase ^ 1);
        if (level >= 5) {
          cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                               &full[ring.stage], stage_bytes);
          uint8_t* slot = ring_base + ring.stage * stage_bytes + copy_offset;
          const uint8_t* source = buffer + static_cast<uint64_t>(source_stage) * 32768 + copy_offset;
          if (is_a || cluster == 1) {
            cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, slot, source, copy_bytes,
                                     &full[ring.stage]);
          } else {
            cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, slot, source, copy_bytes,
                                     &full[ring.stage], uint16_t{0b11});
          }
          if (++source_stage == buffer_stages) source_stage = 0;
        } else {
          cuda::ptx::mbarrier_arrive(&full[ring.stage]);
        }
        ring.Advance(slots);
      }
    } else if (level >= 4) {
      WaitPhase(&barriers->never, 0);  // completed by warpgroup 1 once it is done
    }
  } else {
    const uint32_t a_base = static_cast<uint32_t>(__cvta_generic_to_shared(a_ring)) + (warpgroup - 1) * kAHalfBytes;
    const uint32_t b_base = static_cast<uint32_t>(__cvta_generic_to_shared(b_ring));
    const bool rotate = level >= 1, wait = level >= 2;
    const bool full_waits = wait && kVariant != Variant::kNoFullWait && kVariant != Variant::kDelay;
    constexpr bool wait_ahead = kVariant == Variant::kWaitAhead;
    const bool release_thread = lane_of_warpgroup == 0;
    // Waits for the full barriers of the A and B slots the cursors point at.
    const auto wait_full = [&](const RingCursor& a_slot, const RingCursor& b_slot) {
      if constexpr (kVariant == Variant::kLaneWait) {
        if (lane_of_warpgroup % 32 == 0) {
          WaitPhase(&barriers->a_full[a_slot.stage], a_slot.phase);
          WaitPhase(&barriers->b_full[b_slot.stage], b_slot.phase);
        }
        __syncwarp();
      } else if constexpr (kVariant == Variant::kPairedWait) {
        WaitPhases(&barriers->a_full[a_slot.stage], a_slot.phase, &barriers->b_full[b_slot.stage], b_slot.phase);
      } else {
        WaitPhase(&barriers->a_full[a_slot.stage], a_slot.phase);
        WaitPhase(&barriers->b_full[b_slot.stage], b_slot.phase);
      }
    };
    float acc[kN / 2];
#pragma unroll
    for (int r = 0; r < kN / 2; ++r) acc[r] = 0.0f;
    RingCursor a, b;
    const long long start = clock64();
    for (int i = 0; i < k_blocks; ++i) {
      if (full_waits && (!wait_ahead || i == 0)) wait_full(a, b);
      if constexpr (kVariant == Variant::kDelay) {
        const long long spin_start = clock64();
        while (clock64() - spin_start < delay) {
        }
      }
      const uint64_t desc_a = MakeSwizzle128Descriptor(a_base + (rotate ? a.stage : 0) * kAStageBytes);
      const uint64_t desc_b = MakeSwizzle128Descriptor(b_base + (rotate ? b.stage : 0) * kBStageBytes);
      if (compute) Multiply<kN>(acc, desc_a, desc_b);
      if (full_waits && wait_ahead && i + 1 < k_blocks) {
        RingCursor next_a = a, next_b = b;
        next_a.Advance(slots);
        next_b.Advance(slots);
        wait_full(next_a, next_b);
      }
      if (i > 0) {
        ptx::wgmma_wait_group<1>();
        // Without wgmmas nothing holds the warpgroup's warps together: they
        // meet before warp 0 releases what a lagging warp may not have
        // waited for yet (as the kernel's consumers do, mma_role.cuh).
        if (wait && !compute) ptx::barrier_at<128>(static_cast<uint32_t>(warpgroup));
        if (wait && release_thread) {
          ReleaseEverywhere(&barriers->a_empty[a.Previous(slots)], cluster);
          ReleaseEverywhere(&barriers->b_empty[b.Previous(slots)], cluster);
        }
      }
      a.Advance(slots);
      b.Advance(slots);
    }
    ptx::wgmma_wait_group<0>();
    const long long end = clock64();
    if (wait && !compute) ptx::barrier_at<128>(static_cast<uint32_t>(warpgroup));
    if (wait && release_thread) {
      ReleaseEverywhere(&barriers->a_empty[a.Previous(slots)], cluster);
      ReleaseEverywhere(&barriers->b_empty[b.Previous(slots)], cluster);
    }
    // One accumulator read (the wgmmas are volatile asm, kept anyway; see
    // the file's comment).
    const float sum = acc[0];
    if (lane_of_warpgroup == 0) cycles[blockIdx.x * 2 + warpgroup - 1] = end - start;
    if (lane_of_warpgroup == 0 && warpgroup == 1) cuda::ptx::mbarrier_arrive(&barriers->never);
    if (sum == 1234.5f) *sink = sum;  // never true in practice; keeps the multiplies
  }
  __syncthreads();
  // A CTA leaves only once the peer no longer arrives on its barriers.
  if (cluster > 1) ptx::cluster_sync();
}

template <int kN>
void Run(int level, Variant variant, long long delay, int slots, int k_blocks, bool multiply, const uint8_t* buffer,
         uint32_t buffer_stages, int sms) {
  using KernelFunction = void (*)(int, long long, int, int, bool, const uint8_t*, uint32_t, long long*, float*);
  constexpr KernelFunction kKernels[] = {RingKernel<kN, Variant::kKernel>, RingKernel<kN, Variant::kNoFullWait>,
                                         RingKernel<kN, Variant::kLaneWait>, RingKernel<kN, Variant::kWaitAhead>,
                                         RingKernel<kN, Variant::kPairedWait>, RingKernel<kN, Variant::kDelay>};
  static_assert(std::size(kKernels) == std::size(kVariantNames));
  const KernelFunction kernel = kKernels[static_cast<int>(variant)];
  const std::string variant_name = variant == Variant::kDelay
                                       ? "delay=" + std::to_string(delay)
                                       : std::string(kVariantNames[static_cast<int>(variant)]);
  const bool below_level_2 = level < 2 && variant != Variant::kKernel && variant != Variant::kDelay;
  const bool past_level_4 = level >= 5 && (variant == Variant::kNoFullWait || variant == Variant::kDelay);
  if (below_level_2 || past_level_4 || (variant == Variant::kWaitAhead && slots < 3)) {
    std::printf(
        "n%-3d level %d  slots %d  %s: not run (the variants need levels 2 and up, no_full_wait and delay levels "
        "0-4, wait_ahead 3 slots or more)\n",
        kN, level, slots, variant_name.c_str());
    return;
  }
  const int smem = slots * static_cast<int>(kAStageBytes + kN * 128) + static_cast<int>(sizeof(Barriers)) + 1024;
  if (smem > 227 * 1024) {
    std::printf("n%-3d level %d  slots %d: %d bytes of shared memory, past the 227 KiB an SM has; skipped\n", kN, level,
                slots, smem);
    return;
  }
  PROBE_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int cluster = level >= 3 ? 2 : 1;
  const int grid = sms / cluster * cluster;
  long long* cycles = nullptr;
  float* sink = nullptr;
  PROBE_CHECK(cudaMalloc(&cycles, grid * 2 * sizeof(long long)));
  PROBE_CHECK(cudaMalloc(&sink, sizeof(float)));
  cudaLaunchAttribute attribute = ClusterDimension(cluster);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.attrs = &attribute;
  config.numAttrs = 1;
  for (int run = 0; run < 2; ++run) {  // a warm-up, then the run read
    PROBE_CHECK(cudaLaunchKernelEx(&config, kernel, level, delay, slots, run == 0 ? k_blocks / 10 + 2 : k_blocks,
                                   multiply, buffer, buffer_stages, cycles, sink));
    PROBE_CHECK(cudaDeviceSynchronize());
  }
  std::vector<long long> host(grid * 2);
  PROBE_CHECK(cudaMemcpy(host.data(), cycles, host.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  std::sort(host.begin(), host.end());
  const double median = static_cast<double>(host[host.size() / 2]) / k_blocks;
  const double low = static_cast<double>(host.front()) / k_blocks, high = static_cast<double>(host.back()) / k_blocks;
  const double ideal = kN == 128 ? 512.0 : 1024.0;
  std::printf(
      "n%-3d level %d  slots %d  cluster %d  %-11s %-12s %7.1f cycles a k-block (min %.1f, max %.1f)  %5.1f%% of the "
      "pipe\n",
      kN, level, slots, cluster, multiply ? "multiply" : "no multiply", variant_name.c_str(), median, low, high,
      100.0 * ideal / median);
  PROBE_CHECK(cudaFree(cycles));
  PROBE_CHECK(cudaFree(sink));
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int slots = absl::GetFlag(FLAGS_slots);
  const int k_blocks = absl::GetFlag(FLAGS_k_blocks);
  const std::vector<int> widths = ParseIntList("widths", absl::GetFlag(FLAGS_widths));
  const std::vector<int> levels = ParseIntList("levels", absl::GetFlag(FLAGS_levels));
  bool ok = slots >= 2 && slots <= kMaxSlots && k_blocks >= 10;
  for (int w : widths) ok = ok && (w == 128 || w == 256);
  for (int l : levels) ok = ok && l >= 0 && l <= 5;
  std::vector<Variant> variants;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_variants), ',', absl::SkipEmpty())) {
    const auto* found = std::find(std::begin(kVariantNames), std::end(kVariantNames), name);
    ok = ok && found != std::end(kVariantNames);
    if (found != std::end(kVariantNames)) variants.push_back(static_cast<Variant>(found - std::begin(kVariantNames)));
  }
  const std::vector<int> delays = ParseIntList("delays", absl::GetFlag(FLAGS_delays));
  for (int d : delays) ok = ok && d >= 0 && d <= 100000;
  const bool delay_variant = std::find(variants.begin(), variants.end(), Variant::kDelay) != variants.end();
  ok = ok && !(delay_variant && delays.empty());
  const int buffer_mib = absl::GetFlag(FLAGS_buffer_mib);
  ok = ok && buffer_mib >= 1 && buffer_mib <= 1024;
  if (!ok || (widths.size() * levels.size() * variants.size()) == 0) {
    std::fprintf(stderr,
                 "ring_probe: need --slots in [2, %d] (got %d), --k_blocks of at least 10 (got %d), --buffer_mib in [1, "
                 "1024] (got %d), --widths of 128 and/or 256, --levels of 0-5, --variants of kernel, no_full_wait, "
                 "lane_wait, wait_ahead, paired_wait, delay (got '%s'), --delays of 0-100000 (got '%s')\n",
                 kMaxSlots, slots, k_blocks, buffer_mib, absl::GetFlag(FLAGS_variants).c_str(),
                 absl::GetFlag(FLAGS_delays).c_str());
    return 2;
  }
  int device = 0, sms = 0;
  PROBE_CHECK(cudaGetDevice(&device));
  PROBE_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const bool multiply = absl::GetFlag(FLAGS_multiply);
  // Copies start at 32-KiB steps and end at most 32 KiB past their step (a B
  // half 16 KiB in, or a whole B stage), so every copy ends at least 64 KiB short of the end.
  const uint32_t buffer_stages = static_cast<uint32_t>(buffer_mib) * 32 - 2;
  uint8_t* buffer = nullptr;
  PROBE_CHECK(cudaMalloc(&buffer, static_cast<size_t>(buffer_mib) << 20));
  PROBE_CHECK(cudaMemset(buffer, 0x3c, static_cast<size_t>(buffer_mib) << 20));
  for (int w : widths) {
    for (int l : levels) {
      for (Variant v : variants) {
        for (int d : v == Variant::kDelay ? delays : std::vector<int>{0}) {
          if (w == 128) {
            Run<128>(l, v, d, slots, k_blocks, multiply, buffer, buffer_stages, sms);
          } else {
            Run<256>(l, v, d, slots, k_blocks, multiply, buffer, buffer_stages, sms);
          }
        }
      }
    }
  }
  PROBE_CHECK(cudaFree(buffer));
  return 0;
}
