// gpc_probe: which SMs share a GPC, and whether SMs that stream at once slow
// each other by GPC. bench/NOTES.md (v1.35) found that while every CTA of a
// one-wave node streams, some SMs take ~20% longer than others, by SM and
// not by job; this probe asks whether the slow ones are the SMs of the
// GPCs with the most streaming SMs.
//
// 1. The map. A thread block cluster runs on the SMs of one GPC, so the SMs
//    that one cluster ran on share a GPC. ClusterWhere runs clusters of
//    --cluster_sizes CTAs (non-portable sizes allowed) for --map_rounds
//    launches of a few waves each, every CTA waiting a pseudo-random few us
//    so that later clusters land on different SMs; the SMs seen together are
//    joined (union-find). Printed: each group and its SMs.
// 2. The stream. One CTA per SM; an active CTA streams --mib MiB of its own
//    rows of a large buffer through a ring of --stages stages of --stage_kib
//    KiB (one 1-D bulk copy a stage; a consumer thread frees each stage as
//    it lands), recording its SM and its start and end. Active sets:
//      all      every CTA
//      first<N> the CTAs with blockIdx < N (what a first wave of N jobs
//               gets when CTA i takes queue index i, as in the narrow kernel)
//      even<N>  N SMs spread evenly over the groups of the map
//      packed<N> N SMs, whole groups first (the worst spread)
//    Printed per set: the median over --iters launches of the phase (first
//    start to last end), and for the median launch each group's active SMs
//    and their median and slowest per-SM rate (group -1: SMs that no
//    cluster of the map ran on).
// Times are %globaltimer's (about 1 us ticks: a per-SM rate over a ~55-us
// stream is good to ~2%). The flags are checked before the GPU is touched:
// a bad one exits 2, naming it.
//
//   gpc_probe --sets=all,first112,even112,packed112 --mib=2
#include <cuda_runtime.h>

#include <cuda/ptx>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "probe_common.h"
#include "ptx.cuh"

ABSL_FLAG(std::string, cluster_sizes, "16,8", "cluster sizes the map is built from, a list");
ABSL_FLAG(int, map_rounds, 20, "launches per cluster size for the map");
ABSL_FLAG(std::string, sets, "all,first112,even112,packed112", "active sets to stream with (see the file's comment)");
ABSL_FLAG(int, mib, 2, "MiB each active CTA streams");
ABSL_FLAG(int, stages, 4, "ring stages");
ABSL_FLAG(int, stage_kib, 32, "KiB a stage");
ABSL_FLAG(int, iters, 9, "launches per set (the median is printed)");

namespace {

using loom::kernel::ptx::globaltimer;
using loom::kernel::ptx::smid;

// Each CTA writes its SM after a wait of 2-40 us that differs by CTA and round.
__global__ void ClusterWhere(uint32_t* sm_of_block, uint32_t round) {
  if (threadIdx.x != 0) return;
  uint32_t h = (blockIdx.x + 1) * 2654435761u ^ (round * 40503u);
  h ^= h >> 13;
  const uint64_t wait_ns = 2000 + (h % 38000);
  const uint64_t start = globaltimer();
  while (globaltimer() - start < wait_ns) {
  }
  sm_of_block[blockIdx.x] = smid();
}

struct StreamParams {
  const uint8_t* data;
  const uint8_t* active_sm;  // [256]: 1 where the SM streams (sets by SM)
  int active_blocks;         // > 0: the CTAs with blockIdx below stream instead
  int64_t bytes_per_cta;
  uint32_t stage_bytes;
  int stages;
  uint64_t* start_ns;  // [grid]
  uint64_t* end_ns;
  uint32_t* sm;
};

__device__ uint32_t stream_sink;

__global__ void __launch_bounds__(64, 1) Stream(const __grid_constant__ StreamParams p) {
  extern __shared__ uint8_t smem[];
  __shared__ uint64_t full[16], empty[16];
  const uint32_t sm = smid();
  const bool active =
      p.active_blocks > 0 ? static_cast<int>(blockIdx.x) < p.active_blocks : sm < 256 && p.active_sm[sm] != 0;
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      cuda::ptx::mbarrier_init(&full[s], 1);
      cuda::ptx::mbarrier_init(&empty[s], 1);
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  __syncthreads();
  if (!active) {
    if (threadIdx.x == 0) p.sm[blockIdx.x] = 0xffffffffu;
    return;
  }
  const int64_t stage_count = p.bytes_per_cta / p.stage_bytes;
  const uint8_t* src = p.data + int64_t{blockIdx.x} * p.bytes_per_cta;
  if (threadIdx.x == 0) {  // the loader
    p.start_ns[blockIdx.x] = globaltimer();
    p.sm[blockIdx.x] = sm;
    int slot = 0;
    uint32_t phase = 0;
    for (int64_t s = 0; s < stage_count; ++s) {
      while (!cuda::ptx::mbarrier_try_wait_parity(&empty[slot], phase ^ 1)) {
      }
      cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                           &full[slot], p.stage_bytes);
      cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, smem + slot * p.stage_bytes,
                               src + s * p.stage_bytes, p.stage_bytes, &full[slot]);
      if (++slot == p.stages) slot = 0, phase ^= 1;
    }
  } else if (threadIdx.x == 32) {  // the consumer: one word a stage, then free it
    int slot = 0;
    uint32_t phase = 0, sum = 0;
    for (int64_t s = 0; s < stage_count; ++s) {
      while (!cuda::ptx::mbarrier_try_wait_parity(&full[slot], phase)) {
      }
      sum += *reinterpret_cast<const uint32_t*>(smem + slot * p.stage_bytes);
      cuda::ptx::mbarrier_arrive(&empty[slot]);
      if (++slot == p.stages) slot = 0, phase ^= 1;
    }
    p.end_ns[blockIdx.x] = globaltimer();
    if (sum == 0x12345678u) stream_sink = sum;
  }
}

struct UnionFind {
  std::vector<int> parent;
  explicit UnionFind(int n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  int Find(int x) { return parent[x] == x ? x : parent[x] = Find(parent[x]); }
  void Join(int a, int b) { parent[Find(a)] = Find(b); }
};

// The SMs of each group, groups in order of their smallest SM.
std::vector<std::vector<int>> BuildMap(int sms) {
  constexpr int kMaxSm = 256;
  UnionFind sets(kMaxSm);
  std::vector<bool> seen(kMaxSm, false);
  uint32_t* sm_of_block = nullptr;
  for (int size : ParseIntList("cluster_sizes", absl::GetFlag(FLAGS_cluster_sizes))) {
    PROBE_CHECK(cudaFuncSetAttribute(ClusterWhere, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attribute = ClusterDimension(size);
    config.attrs = &attribute;
    config.numAttrs = 1;
    config.blockDim = dim3(32);
    config.gridDim = dim3(size);
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, ClusterWhere, &config) != cudaSuccess || clusters == 0) {
      (void)cudaGetLastError();
      std::printf("map: clusters of %d do not launch here; skipped\n", size);
      continue;
    }
    const int blocks = 3 * clusters * size;
    config.gridDim = dim3(blocks);
    PROBE_CHECK(cudaMalloc(&sm_of_block, blocks * sizeof(uint32_t)));
    std::vector<uint32_t> where(blocks);
    for (int round = 0; round < absl::GetFlag(FLAGS_map_rounds); ++round) {
      PROBE_CHECK(cudaLaunchKernelEx(&config, ClusterWhere, sm_of_block, static_cast<uint32_t>(round)));
      PROBE_CHECK(cudaMemcpy(where.data(), sm_of_block, blocks * sizeof(uint32_t), cudaMemcpyDeviceToHost));
      for (int b = 0; b < blocks; ++b) {
        if (where[b] >= static_cast<uint32_t>(kMaxSm) || where[b - b % size] >= static_cast<uint32_t>(kMaxSm)) {
          continue;  // not an SM number this map can hold
        }
        seen[where[b]] = true;
        sets.Join(static_cast<int>(where[b]), static_cast<int>(where[b - b % size]));
      }
    }
    PROBE_CHECK(cudaFree(sm_of_block));
    std::printf("map: clusters of %d, %d at once, %d rounds\n", size, clusters, absl::GetFlag(FLAGS_map_rounds));
  }
  std::map<int, std::vector<int>> by_root;
  for (int s = 0; s < kMaxSm; ++s) {
    if (seen[s]) by_root[sets.Find(s)].push_back(s);
  }
  std::vector<std::vector<int>> groups;
  for (auto& [root, members] : by_root) groups.push_back(members);
  std::sort(groups.begin(), groups.end());
  int covered = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    covered += static_cast<int>(groups[g].size());
    std::printf("group %zu (%zu SMs):", g, groups[g].size());
    for (int s : groups[g]) std::printf(" %d", s);
    std::printf("\n");
  }
  std::printf("map: %zu groups, %d of %d SMs seen\n", groups.size(), covered, sms);
  return groups;
}

// The SMs of an `even` or `packed` set of n.
std::vector<int> ChooseSms(const std::vector<std::vector<int>>& groups, int n, bool even) {
  std::vector<int> chosen;
  if (even) {
    for (size_t depth = 0; static_cast<int>(chosen.size()) < n; ++depth) {
      bool any = false;
      for (const auto& group : groups) {
        if (depth < group.size() && static_cast<int>(chosen.size()) < n) chosen.push_back(group[depth]), any = true;
      }
      if (!any) break;
    }
  } else {
    for (const auto& group : groups) {
      for (int s : group) {
        if (static_cast<int>(chosen.size()) < n) chosen.push_back(s);
      }
    }
  }
  return chosen;
}

// The ring, and at least 116 KiB: two CTAs never share an SM.
size_t SharedBytes(const StreamParams& params) {
  return std::max<size_t>(static_cast<size_t>(params.stages) * params.stage_bytes, 116 * 1024);
}

// One entry of --sets: which SMs stream.
struct ActiveSet {
  std::string name;
  enum class Kind { kAll, kFirst, kEven, kPacked } kind = Kind::kAll;
  int n = 0;  // kFirst, kEven, kPacked: how many
};

// The entries of --sets; one that is not all, first<N>, even<N> or packed<N>
// with N >= 1 is refused (named; exit 2).
std::vector<ActiveSet> ParseSets(const std::string& list) {
  std::vector<ActiveSet> sets;
  for (absl::string_view entry : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    ActiveSet set{std::string(entry)};
    size_t prefix = 0;
    if (entry == "all") {
      sets.push_back(set);
      continue;
    } else if (absl::StartsWith(entry, "first")) {
      set.kind = ActiveSet::Kind::kFirst, prefix = 5;
    } else if (absl::StartsWith(entry, "even")) {
      set.kind = ActiveSet::Kind::kEven, prefix = 4;
    } else if (absl::StartsWith(entry, "packed")) {
      set.kind = ActiveSet::Kind::kPacked, prefix = 6;
    }
    if (prefix == 0 || !absl::SimpleAtoi(entry.substr(prefix), &set.n) || set.n < 1) {
      std::fprintf(stderr, "--sets: '%s' is not all, first<N>, even<N> or packed<N> with N >= 1 (in '%s')\n",
                   set.name.c_str(), list.c_str());
      std::exit(2);
    }
    sets.push_back(set);
  }
  return sets;
}

void RunSet(const ActiveSet& set, const std::vector<std::vector<int>>& groups, int sms, const uint8_t* data,
            StreamParams params) {
  std::vector<uint8_t> active_sm(256, 0);
  params.active_blocks = 0;
  const int n = std::min(set.kind == ActiveSet::Kind::kAll ? sms : set.n, sms);
  switch (set.kind) {
    case ActiveSet::Kind::kAll:
      std::fill(active_sm.begin(), active_sm.end(), 1);
      break;
    case ActiveSet::Kind::kFirst:
      params.active_blocks = n;
      break;
    case ActiveSet::Kind::kEven:
    case ActiveSet::Kind::kPacked:
      for (int s : ChooseSms(groups, n, set.kind == ActiveSet::Kind::kEven)) active_sm[s] = 1;
      break;
  }
  uint8_t* active_device = nullptr;
  PROBE_CHECK(cudaMalloc(&active_device, 256));
  PROBE_CHECK(cudaMemcpy(active_device, active_sm.data(), 256, cudaMemcpyHostToDevice));
  params.active_sm = active_device;
  params.data = data;
  const size_t smem = SharedBytes(params);
  struct Launch {
    double phase_us;
    std::vector<uint64_t> start, end;
    std::vector<uint32_t> sm;
  };
  std::vector<Launch> launches;
  for (int it = 0; it < absl::GetFlag(FLAGS_iters); ++it) {
    PROBE_CHECK(cudaMemset(params.sm, 0xff, sms * sizeof(uint32_t)));
    Stream<<<sms, 64, smem>>>(params);
    PROBE_CHECK(cudaGetLastError());
    PROBE_CHECK(cudaDeviceSynchronize());
    Launch launch{0, std::vector<uint64_t>(sms), std::vector<uint64_t>(sms), std::vector<uint32_t>(sms)};
    PROBE_CHECK(cudaMemcpy(launch.start.data(), params.start_ns, sms * 8, cudaMemcpyDeviceToHost));
    PROBE_CHECK(cudaMemcpy(launch.end.data(), params.end_ns, sms * 8, cudaMemcpyDeviceToHost));
    PROBE_CHECK(cudaMemcpy(launch.sm.data(), params.sm, sms * 4, cudaMemcpyDeviceToHost));
    uint64_t first = UINT64_MAX, last = 0;
    for (int b = 0; b < sms; ++b) {
      if (launch.sm[b] == 0xffffffffu) continue;
      first = std::min(first, launch.start[b]);
      last = std::max(last, launch.end[b]);
    }
    launch.phase_us = (last - first) / 1e3;
    launches.push_back(std::move(launch));
  }
  PROBE_CHECK(cudaFree(active_device));
  std::sort(launches.begin(), launches.end(), [](const Launch& a, const Launch& b) { return a.phase_us < b.phase_us; });
  const Launch& median = launches[launches.size() / 2];
  std::vector<int> group_of(256, -1);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int s : groups[g]) group_of[s] = static_cast<int>(g);
  }
  int streaming = 0;
  for (uint32_t s : median.sm) streaming += s != 0xffffffffu;
  std::printf("%-10s %3d SMs  phase %7.1f us (min %.1f, max %.1f)  ", set.name.c_str(), streaming, median.phase_us,
              launches.front().phase_us, launches.back().phase_us);
  std::map<int, std::vector<double>> rates;  // group -> GB/s of its active SMs
  for (int b = 0; b < sms; ++b) {
    if (median.sm[b] == 0xffffffffu) continue;
    rates[group_of[median.sm[b]]].push_back(static_cast<double>(params.bytes_per_cta) /
                                            (median.end[b] - median.start[b]));
  }
  std::printf("group: active, median / slowest GB/s\n");
  for (auto& [group, r] : rates) {
    std::sort(r.begin(), r.end());
    std::printf("    group %2d: %2zu active, %5.1f / %5.1f GB/s\n", group, r.size(), r[r.size() / 2], r.front());
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::vector<ActiveSet> sets = ParseSets(absl::GetFlag(FLAGS_sets));
  StreamParams params = {};
  params.stages = absl::GetFlag(FLAGS_stages);
  const int stage_kib = absl::GetFlag(FLAGS_stage_kib), mib = absl::GetFlag(FLAGS_mib);
  if (params.stages < 1 || params.stages > 16 || stage_kib < 1 || stage_kib > 64 || mib < 1 ||
      (int64_t{mib} * 1024) % stage_kib != 0) {
    std::fprintf(stderr,
                 "--stages=%d --stage_kib=%d --mib=%d: need 1 <= stages <= 16, 1 <= stage_kib <= 64, mib >= 1 "
                 "and a whole number of stages in mib\n",
                 params.stages, stage_kib, mib);
    return 2;
  }
  params.stage_bytes = static_cast<uint32_t>(stage_kib) * 1024;
  params.bytes_per_cta = int64_t{mib} << 20;
  int sms = 0;
  PROBE_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const std::vector<std::vector<int>> groups = BuildMap(sms);
  const size_t smem = SharedBytes(params);
  PROBE_CHECK(cudaFuncSetAttribute(Stream, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  uint8_t* data = nullptr;
  PROBE_CHECK(cudaMalloc(&data, static_cast<size_t>(sms) * params.bytes_per_cta));
  PROBE_CHECK(cudaMemset(data, 1, static_cast<size_t>(sms) * params.bytes_per_cta));
  PROBE_CHECK(cudaMalloc(&params.start_ns, sms * 8));
  PROBE_CHECK(cudaMalloc(&params.end_ns, sms * 8));
  PROBE_CHECK(cudaMalloc(&params.sm, sms * 4));
  std::printf("stream: %d MiB a CTA, %d stages of %u KiB, %d launches a set\n", absl::GetFlag(FLAGS_mib),
              params.stages, params.stage_bytes / 1024, absl::GetFlag(FLAGS_iters));
  for (const ActiveSet& set : sets) RunSet(set, groups, sms, data, params);
  return 0;
}
