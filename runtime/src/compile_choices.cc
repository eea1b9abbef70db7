// compile_choices.cc: what Compile checks and chooses from the graph, the
// options and the device (compile_choices.h). The measurements behind each
// choice are in the comments here, with their bench/NOTES.md sections.
#include "internal/compile_choices.h"

#include <algorithm>
#include <limits>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernel_config.h"
#include "loom/scheduler/tiling.h"
#include "loom/status.h"
#include "narrow_gemm.h"
#include "persistent_gemm.h"

namespace loom::internal {

using kernel::KernelConfig;
using kernel::KernelConfigN128;
using kernel::NarrowConfig;

namespace {

sched::DependencyOperand DependencyOperandOf(Operand operand) {
  switch (operand) {
    case Operand::kA:
      return sched::DependencyOperand::kA;
    case Operand::kB:
      return sched::DependencyOperand::kB;
    case Operand::kBias:
      return sched::DependencyOperand::kBias;
    case Operand::kResidual:
      return sched::DependencyOperand::kResidual;
  }
  return sched::DependencyOperand::kA;
}

// The tiled kernel's tile width the options set (CompileOptions::tile_n), or
// 256 where they leave it to Compile: the width kAuto's narrow-or-tiled
// choice was measured against (UsesNarrowKernel).
int TiledTileWidth(const CompileOptions& options) {
  return options.tile_n != 0 ? options.tile_n : KernelConfig::kBlockN;
}

// The bytes of a node's B (its weights) that its jobs read: none without jobs.
int64_t WeightBytes(const GemmNode& node) {
  return HasJobs(node) ? node.n() * node.k() * static_cast<int64_t>(node.b.element_size()) : 0;
}

// The tiled kernel's cluster tiles of `node`, of at most 128 rows (one row
// block), on tiles `tile_n` wide, grouped as the scheduler groups them.
int64_t TiledClusterTilesOfOneRowBlock(const GemmNode& node, int tile_n) {
  if (!HasJobs(node)) return 0;
  sched::NodeSchedule tiles;
  tiles.m_blocks = 1;
  tiles.n_blocks = static_cast<int32_t>((node.n() + tile_n - 1) / tile_n);
  tiles.share = sched::ChooseShare(tiles.m_blocks, tiles.n_blocks);
  return sched::ClusterGridOf(tiles, kClusterSize).size();
}

// Whether `node`, of at most 128 rows, would have its K split on the tiled
// kernel with tiles `tile_n` wide launched on every cluster of a device with
// `sms` SMs. `step_cluster_tiles`: the cluster tiles of every node at the
// node's dependency depth, which Lower counts together (ChooseSplitK). A
// node without jobs has no tiles, so ChooseSplitK never splits it.
bool TiledKernelSplitsK(const GemmNode& node, int sms, int tile_n, int64_t step_cluster_tiles) {
  const int64_t k_blocks = (node.k() + KernelConfig::kBlockK - 1) / KernelConfig::kBlockK;
  return sched::ChooseSplitK(TiledClusterTilesOfOneRowBlock(node, tile_n), static_cast<int32_t>(k_blocks),
                             sms / kClusterSize, /*forced=*/0, /*few_row_reduce=*/true, step_cluster_tiles) > 1;
}

}  // namespace

kernel::ElementType ElementTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kFP32:
      return kernel::ElementType::kFP32;
    case DType::kFP16:
      return kernel::ElementType::kFP16;
    default:
      return kernel::ElementType::kBF16;  // validation admits no other
  }
}

kernel::EpilogueActivation ActivationOf(Activation activation) {
  switch (activation) {
    case Activation::kNone:
      return kernel::EpilogueActivation::kNone;
    case Activation::kReLU:
      return kernel::EpilogueActivation::kReLU;
    case Activation::kGELU:
      return kernel::EpilogueActivation::kGELU;
    case Activation::kSiLU:
      return kernel::EpilogueActivation::kSiLU;
    case Activation::kSwiGLU:
      return kernel::EpilogueActivation::kSwiGLU;
  }
  return kernel::EpilogueActivation::kNone;
}

// `dependencies`: graph.Dependencies().
std::vector<sched::NodeProblem> ProblemsOf(const GemmGraph& graph, const std::vector<DataDependency>& dependencies) {
  std::vector<sched::NodeProblem> problems(graph.nodes().size());
  for (size_t i = 0; i < problems.size(); ++i) {
    const GemmNode& node = graph.nodes()[i];
    problems[i].m = node.m();
    problems[i].n = node.n();
    problems[i].k = node.k();
    problems[i].swiglu = node.epilogue.activation == Activation::kSwiGLU;
    problems[i].label = graph.NodeLabel(static_cast<int>(i));
  }
  for (const DataDependency& dependency : dependencies) {
    sched::DependencyEdge edge;
    edge.producer = dependency.producer;
    edge.operand = static_cast<uint8_t>(DependencyOperandOf(dependency.operand));
    edge.whole_tensor = dependency.whole_tensor ? 1 : 0;
    edge.row_offset = dependency.row_offset;
    edge.col_offset = dependency.col_offset;
    problems[dependency.consumer].dependencies.push_back(edge);
  }
  return problems;
}

// Whether the scheduler gives `node` tile jobs: every node with an output,
// K = 0 too (its jobs run the epilogue alone).
bool HasJobs(const GemmNode& node) { return node.m() > 0 && node.n() > 0; }

// The A stage size for `graph` (KernelParams::a_stage_bytes): half a stage
// when every node has at most one warpgroup's rows (decode), whose loads and
// wgmma only ever touch the first half. Measured on the H200 (bench/NOTES.md
// v1.15, same calls, interleaved): seven decode GEMMs 0.832 -> 0.847 of
// cuBLAS (geomean of three rounds), the chain at 16 tokens 177-178 -> 174-175
// us, the MLP at 64 tokens 126 -> 127. The fifth B stage that half stages
// make room for gained nothing on its own and slowed the dependent graphs.
uint32_t AStageBytesFor(const GemmGraph& graph) {
  for (const GemmNode& node : graph.nodes()) {
    if (HasJobs(node) && node.a.rows > KernelConfig::kRowsPerConsumer) return KernelConfig::kAStageBytes;
  }
  return KernelConfig::kHalfAStageBytes;
}

// Every option's range, whichever kernel the plan runs on: a bad value is
// refused even where the chosen kernel would not read it.
absl::Status CheckOptions(const CompileOptions& options) {
  // At least two slots a ring: the consumers free a k-block's slot only
  // once the next k-block's is full (one wgmma group stays in flight,
  // mma_role.cuh), so a ring of one slot would wait for itself.
  for (auto [name, stages] : {std::pair{"a_stages", options.a_stages}, std::pair{"b_stages", options.b_stages}}) {
    if (stages != 0 && (stages < 2 || stages > KernelConfig::kMaxStages)) {
      return absl::InvalidArgumentError(absl::StrFormat("CompileOptions.%s: %d is outside {0} and [2, %d]", name,
                                                        stages, KernelConfig::kMaxStages));
    }
  }
  if (options.tile_n != 0 && options.tile_n != KernelConfig::kBlockN && options.tile_n != KernelConfigN128::kBlockN) {
    return absl::InvalidArgumentError(absl::StrFormat("CompileOptions.tile_n: %d is not 0, %d or %d", options.tile_n,
                                                      KernelConfigN128::kBlockN, KernelConfig::kBlockN));
  }
  if (options.ring_mode == RingMode::kLockstep && options.a_stages != 0 && options.b_stages != 0 &&
      options.a_stages != options.b_stages) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CompileOptions: lockstep rings need a_stages == b_stages, got %d and %d", options.a_stages,
        options.b_stages));
  }
  if (options.max_clusters < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CompileOptions.max_clusters: %d is negative", options.max_clusters));
  }
  // Here, not only in the scheduler's check of its options: a narrow plan
  // hands the scheduler a split_k of its own (1).
  if (options.split_k < 0 || options.split_k > sched::kMaxSplitK) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CompileOptions.split_k must be in [0, %d] (the TileJob split field is 8-bit), got %d",
                        sched::kMaxSplitK, options.split_k));
  }
  if (options.ring_mode != RingMode::kSplit && options.ring_mode != RingMode::kLockstep) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CompileOptions.ring_mode: %d is not one of kSplit (0), kLockstep (1)", static_cast<int>(options.ring_mode)));
  }
  if (options.kernel != KernelChoice::kAuto && options.kernel != KernelChoice::kTiled &&
      options.kernel != KernelChoice::kNarrow) {
    return absl::InvalidArgumentError(absl::StrFormat("CompileOptions.kernel: %d is not one of kAuto, kTiled, kNarrow",
                                                      static_cast<int>(options.kernel)));
  }
  if (options.narrow_pair_split != PairSplitChoice::kAuto && options.narrow_pair_split != PairSplitChoice::kOn &&
      options.narrow_pair_split != PairSplitChoice::kOff) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CompileOptions.narrow_pair_split: %d is not one of kAuto, kOn, kOff",
                        static_cast<int>(options.narrow_pair_split)));
  }
  if (options.narrow_split_whole_tiles &&
      (options.narrow_pair_split == PairSplitChoice::kOff || options.narrow_wide_split)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CompileOptions.narrow_split_whole_tiles: set, but %s: it keeps the pair split's tiles whole, and only "
        "those (the wide split's whole tiles have not run on a GPU)",
        options.narrow_wide_split ? "narrow_wide_split is set too" : "narrow_pair_split is kOff"));
  }
  if (options.narrow_split_lead_k_blocks < 0 || options.narrow_split_lead_k_blocks > sched::kMaxKBlocks) {
    return absl::InvalidArgumentError(absl::StrFormat("CompileOptions.narrow_split_lead_k_blocks: %d is outside [0, %d]",
                                                      options.narrow_split_lead_k_blocks, sched::kMaxKBlocks));
  }
  if (options.narrow_split_lead_k_blocks > 0 &&
      (options.narrow_pair_split == PairSplitChoice::kOff || options.narrow_wide_split ||
       options.last_split_extra_k_blocks > 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CompileOptions.narrow_split_lead_k_blocks: %d, but %s: it shortens the pair split's last half, and only "
        "that",
        options.narrow_split_lead_k_blocks,
        options.narrow_wide_split                   ? "narrow_wide_split is set too"
        : options.narrow_pair_split == PairSplitChoice::kOff ? "narrow_pair_split is kOff"
                                                    : "last_split_extra_k_blocks lengthens it"));
  }
  if (options.narrow_wide_split && options.narrow_pair_split == PairSplitChoice::kOn) {
    return absl::InvalidArgumentError(
        "CompileOptions: narrow_wide_split and narrow_pair_split = kOn each ask for a split of K; set one");
  }
  if (options.spin_timeout_ns <= 0 || options.spin_timeout_ns > kMaxSpinTimeoutNs) {
    return absl::InvalidArgumentError(absl::StrFormat("CompileOptions.spin_timeout_ns: %d is outside [1, %d]",
                                                      options.spin_timeout_ns, kMaxSpinTimeoutNs));
  }
  if (options.narrow_a_stages < 0 || options.narrow_a_stages == 1 ||
      options.narrow_a_stages > NarrowConfig::kMaxAStages) {
    return absl::InvalidArgumentError(absl::StrFormat("CompileOptions.narrow_a_stages: %d is outside {0} and [2, %d]",
                                                      options.narrow_a_stages, NarrowConfig::kMaxAStages));
  }
  // Two B stages at least: the loads of one stage and the multiplies of the
  // other overlap, and the wgmma path's reads of the last A stage may run
  // up to 40 rows (5 KiB) past it, into the B ring (NarrowConfig::ATileBytes).
  if (options.narrow_b_stages == 1 || options.narrow_b_stages < 0 ||
      options.narrow_b_stages > NarrowConfig::kMaxBStages) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CompileOptions.narrow_b_stages: %d is outside {0} and [2, %d]", options.narrow_b_stages,
        NarrowConfig::kMaxBStages));
  }
  // The bound of any ring: the ring chosen may allow less (ChooseNarrowRings).
  if (options.narrow_b_in_flight < 0 || options.narrow_b_in_flight > NarrowConfig::kMaxBStages - 1) {
    return absl::InvalidArgumentError(absl::StrFormat("CompileOptions.narrow_b_in_flight: %d is outside [0, %d]",
                                                      options.narrow_b_in_flight, NarrowConfig::kMaxBStages - 1));
  }
  if (options.narrow_claim_stages < 0 || options.narrow_claim_stages > kMaxNarrowClaimStages) {
    return absl::InvalidArgumentError(absl::StrFormat("CompileOptions.narrow_claim_stages: %d is outside [0, %d]",
                                                      options.narrow_claim_stages, kMaxNarrowClaimStages));
  }
  if (options.narrow_consumers < 0 || options.narrow_consumers > NarrowConfig::kMaxConsumerWarpgroups) {
    return absl::InvalidArgumentError(absl::StrFormat("CompileOptions.narrow_consumers: %d is outside [0, %d]",
                                                      options.narrow_consumers,
                                                      NarrowConfig::kMaxConsumerWarpgroups));
  }
  return absl::OkStatus();
}

// A described device (Runtime::ForDescription) must be one a plan can be
// lowered for; Runtime::Create's descriptions come from the GPU itself.
absl::Status CheckDevice(const DeviceDescription& device) {
  for (auto [name, value] : {std::pair{"sm_count", int64_t{device.sm_count}},
                             std::pair{"shared_memory_per_block", device.shared_memory_per_block}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("DeviceDescription \"%s\": %s %d is not positive", device.name, name, value));
    }
  }
  for (auto [name, value] : {std::pair{"l2_bytes", device.l2_bytes},
                             std::pair{"max_coresident_clusters", int64_t{device.max_coresident_clusters}}}) {
    if (value < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("DeviceDescription \"%s\": %s %d is negative", device.name, name, value));
    }
  }
  if (int64_t{device.max_coresident_clusters} * kClusterSize > device.sm_count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "DeviceDescription \"%s\": max_coresident_clusters %d clusters of %d CTAs need %d SMs, but sm_count is %d",
        device.name, device.max_coresident_clusters, kClusterSize,
        int64_t{device.max_coresident_clusters} * kClusterSize, device.sm_count));
  }
  return absl::OkStatus();
}

// The tiled kernel's tile width for `graph` on a grid of `grid_ctas` CTAs:
// the options' if set; else 128 where, at every step of the graph, 128-wide
// tiles either fit in half the grid (the scheduler splits their K to fill
// it, as it would split 256-wide ones) or fill at least nine tenths of it
// unsplit with no node's K past kNearFullWaveMaxKBlocks; 256 otherwise. A
// step is the nodes that can run at once: those of one depth in the
// dependency graph (a node is one deeper than the deepest node it reads), so
// a batch counts its nodes' tiles together and a chain each layer's alone
// (`depth`: sched::NodeDepths(problems)).
// NOTE (measured on the H200, bench/NOTES.md v1.60-v1.61, `loom_bench` ratios
// to cuBLAS, 256 -> 128): a 128 x 128 tile's k-block runs at ~60% of the
// tensor pipe's rate against ~100% for 128 x 256, but twice the tiles need
// half the splits of K, or none. Where 128-wide tiles fit in half the grid
// that wins everywhere measured: 200 x 4096 x 4096 0.72 -> 0.85, 256 x 1024 x
// 4096 0.48 -> 0.65, 128 x 4096 x 14336 0.78 -> 0.92, the 4096 chain at
// 150-256 rows 0.49-0.54x -> 0.66-0.70x. At a nearly full wave (120-128 tiles)
// it wins or is level: 1024 x 2048 x 2048 0.73 -> 0.89, 512 x 4096 x 4096
// +4-11%, 384 x 5120 x 4096 -0.1 to -3%. Between the two, with a tenth to a
// half of the SMs left idle, 256-wide tiles split to fill them are level or
// better: 640 x 2048 x 4096 (80 tiles) -6-11%, 384 x 4096 x 4096 (96) -3-5%,
// 128 x 9216 x 4096 (72) -1-4% (single nodes of one row block at 96-112 gained
// 3-13%: not taken). Past one wave: 640 x 4096 x 4096 0.69 -> 0.52, and the
// MLP block at 128 and 200 tokens (gate/up's 224 and 448 tiles) 113 -> 125 and
// 175 -> 199 us.
// NOTE (v1.71): the nearly full wave pays only for short K. Unsplit, a
// 128-wide tile's ~40% slower k-blocks grow with K, while the 256-wide
// tiles' split costs a partial and a reduce whatever K is. `loom_bench`
// ratios to cuBLAS, 128 -> 256, at 120-128 tiles: K = 4096 0.71 -> 0.68,
// 6144 level (0.72-0.73 -> 0.73-0.74), 8192 0.72-0.75 -> 0.74-0.79,
// 11008 0.73 -> 0.83, 14336 0.74 -> 0.85 (512 x 4096, 1024 x 2048, 640 x
// 3072, 384 x 5120, 768 x 2560). In half the grid 128 wins at every K
// (256 x 4096 x 4096-14336 0.72-0.84 against 0.53-0.77).
constexpr int64_t kNearFullWaveMaxKBlocks = 80;  // K <= 5120: between the last win (4096) and a level (6144)
int ChooseTileWidth(const CompileOptions& options, const std::vector<sched::NodeProblem>& problems,
                    const std::vector<int32_t>& depth, int64_t grid_ctas) {
  if (options.tile_n != 0) return options.tile_n;
  constexpr int64_t kRows = KernelConfigN128::kBlockM;
  constexpr int64_t kCols = KernelConfigN128::kBlockN;
  constexpr int64_t kBlockK = KernelConfigN128::kBlockK;
  std::vector<int64_t> step_tiles(problems.size(), 0);     // 128-wide tiles at each depth
  std::vector<int64_t> step_k_blocks(problems.size(), 0);  // the longest K at each depth, in k-blocks
  for (size_t i = 0; i < problems.size(); ++i) {
    // A node without jobs (M or N zero) counts nothing: its other dimension
    // may be anything (its views are empty).
    if (problems[i].m == 0 || problems[i].n == 0) continue;
    step_tiles[depth[i]] += ((problems[i].m + kRows - 1) / kRows) * ((problems[i].n + kCols - 1) / kCols);
    step_k_blocks[depth[i]] = std::max(step_k_blocks[depth[i]], (problems[i].k + kBlockK - 1) / kBlockK);
  }
  for (size_t step = 0; step < problems.size(); ++step) {
    const int64_t tiles = step_tiles[step];
    const bool half_grid = 2 * tiles <= grid_ctas;
    const bool nearly_full_wave = 10 * tiles >= 9 * grid_ctas && tiles <= grid_ctas &&
                                  step_k_blocks[step] <= kNearFullWaveMaxKBlocks;
    if (!half_grid && !nearly_full_wave) return KernelConfig::kBlockN;
  }
  return KernelConfigN128::kBlockN;
}

// The tiled kernel's tile for tiles `tile_n` wide.
sched::TileShape TiledTile(int tile_n) {
  return kernel::WithTiledConfig(tile_n, [](auto config) { return decltype(config)::tile(); });
}

// The tiled kernel's ring depths, {A, B}, where the options leave both 0:
// 4 and 4, and on 128-wide tiles in split rings 7 and 5 (192 KiB of 16-KiB
// stages against 128). A 128-wide k-block is multiplied in half the time of
// a 256-wide one, so a ring of the same depth covers half the load latency;
// on 4 and 4 its main loop ran at ~60% of the tensor pipe's rate (in time;
// in cycles 4 / 4 took 48.3 kcycles a 64-k-block job, 7 / 5 46.3 and 6 / 6
// 45.8 against 32.8 of multiplies: what an SM takes in bounds it, not the
// depth, bench/NOTES.md v1.64). 7 and 5
// took the 4096 chain at 512 rows from 273 to 254-256 us in two calls (256
// rows 1-2% faster, 150 and 200 level) and single GEMMs on 128-wide tiles
// -3% to +4% over two rounds; against 6 / 6, 8 / 4 and 5 / 5, one run each,
// it was fastest at 7 of 9 shapes (bench/NOTES.md v1.63). Lockstep rings
// keep 4 and 4 (not measured deeper).
constexpr std::pair<int, int> kTiledRings = {4, 4};
constexpr std::pair<int, int> kTiledRingsOf128 = {7, 5};

// The tiled kernel's ring depths: the options', each 0 chosen. One of the
// two given: in lockstep rings the other is the same; in split rings the
// other's chosen depth, lowered (not below 2) until the rings fit in shared
// memory. Whether they fit is TiledSharedMemory's.
std::pair<int, int> ChooseTiledRings(const CompileOptions& options, const DeviceDescription& device,
                                     uint32_t a_stage_bytes, int tile_n) {
  int a = options.a_stages;
  int b = options.b_stages;
  if (options.ring_mode == RingMode::kLockstep) {
    const int given = std::max(a, b);
    return given == 0 ? kTiledRings : std::pair{given, given};
  }
  if (a != 0 && b != 0) return {a, b};
  const std::pair<int, int> chosen_rings = tile_n == KernelConfig::kBlockN ? kTiledRings : kTiledRingsOf128;
  if (a == 0 && b == 0) return chosen_rings;
  const bool choose_a = a == 0;
  int& chosen = choose_a ? a : b;
  chosen = choose_a ? chosen_rings.first : chosen_rings.second;
  while (chosen > 2 && kernel::SharedMemoryBytes(a, b, a_stage_bytes, tile_n) > device.shared_memory_per_block) {
    --chosen;
  }
  return {a, b};
}

// The tiled kernel's shared memory a CTA for ring depths `a_stages` and
// `b_stages`, tiles `tile_n` wide; refused where the device has less.
absl::StatusOr<int64_t> TiledSharedMemory(int a_stages, int b_stages, const DeviceDescription& device,
                                          uint32_t a_stage_bytes, int tile_n) {
  const int64_t smem = kernel::SharedMemoryBytes(a_stages, b_stages, a_stage_bytes, tile_n);
  if (smem > device.shared_memory_per_block) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "shared memory: a_stages=%d (of %d bytes), b_stages=%d (tiles %d wide) need %d bytes per block, but %s "
        "allows %d",
        a_stages, a_stage_bytes, b_stages, tile_n, smem, device.name, device.shared_memory_per_block));
  }
  return smem;
}

constexpr int64_t kOneWaveChainBStages = 6;  // ChooseNarrowRings
// ChooseNarrowRings: the B stages in flight with a split of K (the pair
// split's 32 KiB stages; the wide split's 64 KiB ones, whose two-stage
// ring allows one).
constexpr int kSplitBStagesInFlight = 2;
// ChooseNarrowRings: the claim pacing of a split of K (the pair split's,
// the wide split's) where CompileOptions::narrow_claim_stages leaves it 0.
// Unpaced, CTAs claimed down's last jobs up to a job late and the 64-token
// MLP block took 5-7 us longer with the pair split on H100s (bench/NOTES.md
// v2.02); the wide split takes it untried.
constexpr int kSplitClaimStages = 8;
// ChooseNarrowRings: the B stages the tall pair split's A ring leaves room
// for (more A stages where they fit: at 65 tokens on an H100, before its
// consumers freed each stage early, 3 A stages and 3 B stages against 2
// and 4 took the MLP block from 144.6-144.9 us to 136.2-136.3, the 8-layer
// chain from 164.7-165.0 to 159.2-159.4; at 100 tokens 3 A stages left 2
// B stages, and 182 us against 151; bench/NOTES.md v2.03).
constexpr int kTallPairSplitBStages = 3;
// ChooseNarrowRings: the B stages (64 KiB each) the wide split's A ring
// leaves room for: two, which with A's 32-KiB stages at 64 rows leaves A
// three (a first guess; no other depth measured. On an H100 its jobs'
// main loops streamed faster than main's, bench/NOTES.md v2.06).
constexpr int kWideSplitBStages = 2;
// PairSplitPaysByDefault: the tall pair split under PairSplitChoice::kAuto
// needs every node with jobs to have at least this many quarters of a wave
// of them. On H100s (bench/NOTES.md v2.03) the nodes of 4096 columns (128
// jobs on 132 SMs) gained on two row blocks, those of 1024-2048 (32-64
// jobs) lost by a third; nothing between was measured.
constexpr int64_t kAutoPairSplitWaveQuarters = 3;
constexpr int64_t kPackedMmaSyncAStages = 6;  // ChooseNarrowRings

// Whether the jobs of `node` load A and B (so it has their tensor maps, and
// weights to pack): K > 0.
bool LoadsOperands(const GemmNode& node) { return HasJobs(node) && node.k() > 0; }

// The first node with jobs over no k-blocks (K = 0 and an output), or null.
// Only the tiled kernel runs them: its consumers zero their accumulators per
// job and its loaders loop over the job's k-blocks, so such a job is its
// epilogue alone, with no change to the kernel. The narrow kernel would need
// its epilogue prefetched outside the stage loop, and that alone cost the
// 64-token chain ~1 us (107.2-107.5 us against 106.2-106.6, bench/NOTES.md
// v1.37), so graphs with such a node keep the tiled kernel.
const GemmNode* FirstZeroKNode(const GemmGraph& graph) {
  for (const GemmNode& node : graph.nodes()) {
    if (HasJobs(node) && node.k() == 0) return &node;
  }
  return nullptr;
}

// The narrow kernel's tiles of `node`: its 32-column blocks (none without jobs,
// whose N may be anything: a node of M = 0 and K = 0 has only empty views).
int64_t NarrowTiles(const GemmNode& node) {
  return HasJobs(node) ? (node.n() + NarrowConfig::kBlockN - 1) / NarrowConfig::kBlockN : 0;
}

// The rows of the graph's tallest node with jobs (A's rows; a node of N = 0
// does no work, whatever its rows).
int64_t MaxRows(const GemmGraph& graph) {
  int64_t rows = 0;
  for (const GemmNode& node : graph.nodes()) {
    if (HasJobs(node)) rows = std::max(rows, node.a.rows);
  }
  return rows;
}

// The 16-bit type of a validated graph's inputs, bf16 or fp16 (bf16 for a
// graph with no nodes). One plan runs one: the kernels are instantiated per
// type, so a graph that mixes them is refused, naming the first node of each.
absl::StatusOr<DType> HalfTypeOf(const GemmGraph& graph) {
  const std::vector<GemmNode>& nodes = graph.nodes();
  if (nodes.empty()) return DType::kBF16;
  const DType half = nodes.front().a.dtype;
  for (size_t i = 1; i < nodes.size(); ++i) {
    if (nodes[i].a.dtype != half) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "graph: %s has %s inputs but %s has %s; one plan runs one 16-bit type (compile each as its own plan)",
          graph.NodeLabel(0), DTypeName(half), graph.NodeLabel(static_cast<int>(i)), DTypeName(nodes[i].a.dtype)));
    }
  }
  return half;
}

// Whether a graph of at most `rows` rows runs on the narrow decode kernel
// (CompileOptions::kernel, KernelChoice) of a device with `sms` SMs.
// NOTE (kAuto, measured on the H200): up to 16 rows the narrow kernel's
// mma.sync path wins everywhere measured (bench/NOTES.md v1.18). From 17
// rows it multiplies with wgmma (m64n64k16 over two k-blocks up to 32 rows,
// m64n32k16 past), whose main loop is slower than the tiled kernel's on
// wide nodes (64 x 28672 x 4096 0.78 of cuBLAS against 0.94, 64 x 16384 x
// 4096 0.78 against 0.80; 32 x 28672 x 4096 0.84-0.87 since v1.24, against
// 0.89 tiled in v1.21), but it needs no split-K. It
// takes a graph (v1.21, `loom_bench` and `loom_graph_bench --kernel=narrow|
// tiled`, means of two rounds) whose nodes all fit three waves of its tiles
// (48 x 8192 x 4096 0.87 against 0.74, 64 x 4096 x 14336 0.99 against 0.87,
// the 8-layer 4096 chain at 32 / 64 tokens 118 / 119 us against 184 / 210),
// or whose nodes past three waves hold at most twice the weights of the
// nodes that read another's output and would have their K split on the
// tiled kernel: a split dependent node is a chain of round trips (partials,
// their flags, the reduce, its flag) on the graph's critical path. The MLP
// block (gate/up, N = 28672, twice the weights of the down projection, split
// on the tiled kernel) at 24 / 32 / 48 / 64 tokens 114.8 / 117.0 / 118.8 /
// 123.5 us against 122.8 / 121.2 / 124.3 / 124.8. A graph that a wide node
// dominates (an LM head after a layer) keeps the tiled kernel, as single
// wide nodes do (14336 x 4096 even, 16384 and 28672 above); not measured as
// a graph. A node split on its own may not be split beside the other nodes
// of its dependency depth, which fill the wave with it: the rule asks what
// Lower would do, counting the whole depth. `dependencies`:
// graph.Dependencies(); `depth`: each node's dependency depth
// (sched::NodeDepths).
bool UsesNarrowKernel(const CompileOptions& options, const GemmGraph& graph,
                      const std::vector<DataDependency>& dependencies, const std::vector<int32_t>& depth,
                      int64_t rows, int sms) {
  constexpr int64_t kMaxWaves = 3;  // of narrow tiles in one node, from 17 rows
  constexpr int64_t kTwoBlockMaxWeightBytes = int64_t{32} << 20;  // a node's, past 64 rows
  switch (options.kernel) {
    case KernelChoice::kNarrow:
      return rows <= NarrowConfig::kMaxRows;
    case KernelChoice::kTiled:
      return false;
    case KernelChoice::kAuto:
      break;
  }
  // Options only the tiled kernel has keep it: splits, lockstep rings; and
  // nodes with K = 0 (FirstZeroKNode).
  if (rows > NarrowConfig::kMaxRows || options.split_k > 1 || options.ring_mode != RingMode::kSplit ||
      FirstZeroKNode(graph) != nullptr) {
    return false;
  }
  const std::vector<GemmNode>& nodes = graph.nodes();
  if (rows > NarrowConfig::kBlockM) {
    // Two row blocks: each weight tile is read by two jobs, and each job
    // reads twice its weights' bytes of A, so the narrow kernel's L2 traffic
    // is about six times the weights against the tiled kernel's ~1.5 plus
    // its split-K partials. It pays where the tiled kernel's split-K round
    // trips (partials, their flags, the reduce) outweigh that: nodes of at
    // most two waves of jobs and at most kTwoBlockMaxWeightBytes of weights
    // (bench/NOTES.md v1.33, on the H200: the 8-layer 4096 chain at 65, 100
    // and 128 rows 170 / 178 / 175 us against 215 / 229 / 246 tiled;
    // 128 x 4096 x 4096 in 0.030-0.031 ms against 0.037-0.038, 128 x 2048 x
    // 8192 0.027-0.028 against 0.039-0.041. Past 32 MiB no gain or a loss:
    // 128 x 4096 x 8192 0.044-0.047 against 0.045-0.046, 100 x 4096 x 14336
    // 0.069 against 0.059).
    for (const GemmNode& node : nodes) {
      // A job per row block and column tile: two waves is a tile per SM.
      if (NarrowTiles(node) > sms || WeightBytes(node) > kTwoBlockMaxWeightBytes) return false;
    }
    return true;
  }
  if (rows <= NarrowConfig::kMmaSyncRows) return true;
  std::vector<bool> dependent(nodes.size(), false);
  for (const DataDependency& dependency : dependencies) dependent[dependency.consumer] = true;
  const int tile_n = TiledTileWidth(options);
  std::vector<int64_t> step_cluster_tiles(nodes.size(), 0);  // by depth
  for (size_t i = 0; i < nodes.size(); ++i) {
    step_cluster_tiles[depth[i]] += TiledClusterTilesOfOneRowBlock(nodes[i], tile_n);
  }
  int64_t wide_bytes = 0;             // weights of the nodes past three waves of narrow tiles
  int64_t split_dependent_bytes = 0;  // weights of the dependent nodes the tiled kernel would split
  for (size_t i = 0; i < nodes.size(); ++i) {
    const int64_t weight_bytes = WeightBytes(nodes[i]);
    if (NarrowTiles(nodes[i]) > kMaxWaves * sms) wide_bytes += weight_bytes;
    if (dependent[i] && TiledKernelSplitsK(nodes[i], sms, tile_n, step_cluster_tiles[depth[i]])) {
      split_dependent_bytes += weight_bytes;
    }
  }
  return wide_bytes <= 2 * split_dependent_bytes;
}

// The longest K of the graph's nodes with jobs.
int64_t MaxK(const GemmGraph& graph) {
  int64_t k = 0;
  for (const GemmNode& node : graph.nodes()) {
    if (HasJobs(node)) k = std::max(k, node.k());
  }
  return k;
}

// Whether every node of `graph` is at most one wave of narrow tiles on
// `sms` SMs and some node reads another's output (`dependencies`:
// graph.Dependencies()): a chain of one-wave layers, each waiting on the last.
bool IsChainOfOneWaveLayers(const GemmGraph& graph, const std::vector<DataDependency>& dependencies, int sms) {
  for (const GemmNode& node : graph.nodes()) {
    if (NarrowTiles(node) > sms) return false;
  }
  return !dependencies.empty();
}

namespace {

// Whether every node of `graph` splits K in `splits` parts that Lower,
// given `extra` (sched::SplitKRange's last_extra, clamped as
// sched::ChooseLastSplitExtra does), starts on stages, each part at least a
// stage.
bool SplitsOnStages(const GemmGraph& graph, int32_t splits, int32_t extra) {
  for (const GemmNode& node : graph.nodes()) {
    if (!HasJobs(node)) continue;
    const int32_t k_blocks = static_cast<int32_t>((node.k() + NarrowConfig::kBlockK - 1) / NarrowConfig::kBlockK);
    const int32_t used = std::min(extra, std::max(k_blocks - splits, 0));
    for (int32_t split = 0; split < splits; ++split) {
      const sched::KBlockRange range = sched::SplitKRange(k_blocks, splits, split, used);
      if (range.end - range.begin < NarrowConfig::kKBlocksPerStage ||
          range.begin % NarrowConfig::kKBlocksPerStage != 0) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace

int32_t PairSplitLastExtraKBlocks(const CompileOptions& options) {
  return std::max(options.last_split_extra_k_blocks, 0);
}

int64_t FewestPairSplitJobs(const GemmGraph& graph) {
  int64_t fewest = std::numeric_limits<int64_t>::max();
  for (const GemmNode& node : graph.nodes()) {
    if (!HasJobs(node)) continue;
    const int64_t tiles = (node.n() + NarrowConfig::kPairSplitBlockN - 1) / NarrowConfig::kPairSplitBlockN;
    fewest = std::min(fewest, NarrowConfig::kPairSplits * tiles);
  }
  return fewest;
}

bool PairSplitPaysByDefault(const GemmGraph& graph, int64_t rows, int sms) {
  return NarrowConfig::TallPairSplit(rows) &&
         FewestPairSplitJobs(graph) >= (int64_t{sms} * kAutoPairSplitWaveQuarters + 3) / 4;
}

bool NarrowPairSplitApplies(const CompileOptions& options, const GemmGraph& graph, int64_t rows, int sms) {
  const bool wanted =
      options.narrow_pair_split == PairSplitChoice::kOn ||
      (options.narrow_pair_split == PairSplitChoice::kAuto && PairSplitPaysByDefault(graph, rows, sms));
  return wanted && NarrowConfig::PairSplitRows(rows) &&
         (!NarrowConfig::TallPairSplit(rows) || options.narrow_consumers != 1) &&
         SplitsOnStages(graph, NarrowConfig::kPairSplits, PairSplitLastExtraKBlocks(options));
}

bool NarrowWideSplitApplies(const CompileOptions& options, const GemmGraph& graph, int64_t rows) {
  return options.narrow_wide_split && NarrowConfig::WideSplitRows(rows) && options.narrow_consumers != 1 &&
         SplitsOnStages(graph, NarrowConfig::kWideSplits, PairSplitLastExtraKBlocks(options));
}

// The narrow decode kernel's rings for a graph of at most `rows` rows and K
// at most `max_k`: A stages of those rows (NarrowConfig::AStageBytes), enough
// to hold the longest job's A, within 128 KiB (96 KiB for A tiles of 9 to 32
// rows; 2 to kMaxAStages stages); B stages
// with the shared memory that leaves (at most kMaxBStages). The options may
// set either depth (their ranges: CheckOptions); split_k above 1 and
// lockstep rings, which only the tiled kernel has, are refused.
// NOTE: A deep before B. Each refill of the A ring is a round trip through
// memory queues shared with the weight stream (~2 us traced); with the whole
// of a job's A loaded at once, the MLP block at 16 tokens took 102 us
// against 106 with 32 KiB of A and B 4 stages deeper (bench/NOTES.md v1.17).
// Once the B loader stopped pausing between jobs (v1.19), 16-row A tiles
// did better with 12 stages (96 KiB) and two more B stages: the MLP block at
// 16 tokens 99.4-99.6 us against 101.6-101.9, the 16-token chain 117.7-118.3
// against 118.9-119.0. At 1-8 rows (16 A stages of 4 KiB) and at 17-64 rows
// fewer A stages were slower; at 17-32 rows, once those jobs multiplied two
// k-blocks a wgmma (RunPairedWgmmaJob), 96 KiB was faster: the MLP block at
// 24 / 32 tokens 103.3-103.9 / 106.2-106.3 us (8 / 6 stages) against
// 105.1-105.3 / 108.8-109.0 (10 / 8), the 32-token chain 106.4-106.7
// against 108.9-109.3 (bench/NOTES.md v1.24).
// NOTE: B at most kOneWaveChainBStages deep for a chain of one-wave layers
// of at most 16 rows. There every layer waits on the round trips of the
// last (its tiles' release, the flag poll, the A load), and those queue
// behind the weights loading ahead: the 8-layer 4096 chain at one token took
// 97.1-97.8 us with 5 or 6 B stages against 99.7-100.5 with the 9 that
// shared memory allows (7: 97.9-98.3, 10-12: no better than 9), at 16
// tokens 99.3-99.7 with 6 against 99.8-100.3 with 7. The MLP block, whose
// gate/up is seven waves, lost 0.5-1.8 us with 6 (bench/NOTES.md v1.21;
// landed in v1.22: chain1 97.6-97.8 against 100.4-100.8).
// `one_wave_chain`: IsChainOfOneWaveLayers.
// NOTE: the pair split's defaults (3 A stages, 96 KiB; B stages of 32 KiB,
// what shared memory leaves: 4; 2 in flight, the bytes of 4 of 16 KiB) were
// a first guess; on H100s none of 3 or 1 in flight, A 4 / B 3 stages or A 2
// / B 5 stages did better (bench/NOTES.md v2.02). Not yet tried on an H200.
// Past 64 rows (the tall pair split) an A stage of 128 rows is 64 KiB: as
// many A stages as leave 3 B stages (kTallPairSplitBStages), at least 2: 3
// at 65-80 rows, 2 past that.
absl::StatusOr<NarrowRings> ChooseNarrowRings(const CompileOptions& options, const DeviceDescription& device,
                                              int64_t rows, int64_t max_k, bool one_wave_chain, bool packed,
                                              NarrowConfig::Split split) {
  // What only the tiled kernel has (kAuto never picks the narrow one then).
  if (options.split_k > 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CompileOptions.split_k: %d, but the narrow decode kernel (kernel = kNarrow, chosen for a graph of at most "
        "%d rows) never splits K",
        options.split_k, NarrowConfig::kMaxRows));
  }
  if (options.ring_mode != RingMode::kSplit) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CompileOptions.ring_mode: lockstep, but the narrow decode kernel (kernel = kNarrow, chosen for a graph of "
        "at most %d rows) has split rings only",
        NarrowConfig::kMaxRows));
  }
  NarrowRings rings;
  const bool splits_k = split != NarrowConfig::Split::kNone;
  // The tall pair split's and the wide split's jobs are both consumer
  // warpgroups' (two only: NarrowPairSplitApplies, NarrowWideSplitApplies).
  const bool wide = split == NarrowConfig::Split::kWide;
  const bool both_warpgroups = NarrowConfig::BothWarpgroupsOnEveryJob(NarrowConfig::InstantiationFor(
      static_cast<uint32_t>(rows), NarrowConfig::kBlockM, /*tagged_handoffs=*/false, split));
  rings.consumers = options.narrow_consumers > 0
                        ? options.narrow_consumers
                        : (both_warpgroups || (rows > NarrowConfig::kMmaSyncRows && !one_wave_chain) ? 2 : 1);
  rings.a_stage_bytes = NarrowConfig::AStageBytes(std::max<int64_t>(NarrowConfig::TileRows(rows, splits_k), 1));
  const uint32_t tile_rows = NarrowConfig::ATileRows(rings.a_stage_bytes);
  // 96 KiB for the 16-row mma.sync tiles and the paired wgmma's tiles.
  const bool smaller_a = tile_rows > 8 && NarrowConfig::MultiplyFor(tile_rows) != NarrowConfig::Multiply::kWgmma;
  const int tile_n = NarrowConfig::TileN(split);
  const uint32_t b_stage_bytes = NarrowConfig::BStageBytes(tile_n);
  // The tall pair split and the wide split: as many A stages as leave
  // kTallPairSplitBStages or kWideSplitBStages.
  const int64_t auto_a_bytes =
      both_warpgroups ? device.shared_memory_per_block -
                            int64_t{kernel::NarrowSharedMemoryBytes(
                                0, rings.a_stage_bytes, wide ? kWideSplitBStages : kTallPairSplitBStages,
                                rings.consumers, tile_n)}
                      : (smaller_a || splits_k ? int64_t{96} * 1024 : int64_t{128} * 1024);
  constexpr int64_t kStageK = NarrowConfig::kKBlocksPerStage * NarrowConfig::kBlockK;
  const int64_t splits = NarrowConfig::Splits(split);
  const int64_t job_stages = ((max_k + splits - 1) / splits + kStageK - 1) / kStageK;
  // With packed weights on the mma.sync path (at most 16 rows) at most
  // kPackedMmaSyncAStages: the rest of shared memory goes to B, which each
  // launch fills with packed weights while the launch before it ends
  // (NarrowGemmKernel). Back to back the MLP block at 1 / 16 tokens took 79.5
  // / 80.6 us a launch against 80.2-80.6 / 81.1-81.3 with the whole job's A;
  // with an event between launches, and unpacked, no difference past the
  // noise (bench/NOTES.md v1.27).
  const int64_t max_a_stages =
      packed && tile_rows <= NarrowConfig::kMmaSyncRows ? kPackedMmaSyncAStages : NarrowConfig::kMaxAStages;
  rings.a_stages = options.narrow_a_stages > 0
                       ? options.narrow_a_stages
                       : static_cast<int>(std::clamp<int64_t>(
                             std::min<int64_t>(auto_a_bytes / rings.a_stage_bytes, job_stages), 2, max_a_stages));
  const int64_t left =
      device.shared_memory_per_block -
      int64_t{kernel::NarrowSharedMemoryBytes(rings.a_stages, rings.a_stage_bytes, 0, rings.consumers, tile_n)};
  const int64_t max_b_stages =
      one_wave_chain && rows <= NarrowConfig::kMmaSyncRows ? kOneWaveChainBStages : NarrowConfig::kMaxBStages;
  rings.b_stages = options.narrow_b_stages > 0
                       ? options.narrow_b_stages
                       : static_cast<int>(std::min<int64_t>(max_b_stages, left / b_stage_bytes));
  // How the messages below name a ring depth: the option where the caller
  // set it, else the depth Compile chose.
  const auto depth = [](const char* option, int set, int stages) {
    return set > 0 ? absl::StrFormat("CompileOptions.%s = %d", option, set)
                   : absl::StrFormat("%d chosen (CompileOptions.%s = 0)", stages, option);
  };
  if (rings.b_stages < 2) {  // chosen from what is left, and not enough is
    return absl::FailedPreconditionError(absl::StrFormat(
        "shared memory: the narrow decode kernel's A stages, %s, of %d bytes each, leave %d of the %d bytes per "
        "block %s allows, less than two B stages of %d bytes",
        depth("narrow_a_stages", options.narrow_a_stages, rings.a_stages), rings.a_stage_bytes,
        std::max<int64_t>(left, 0), device.shared_memory_per_block, device.name, b_stage_bytes));
  }
  rings.smem_bytes =
      kernel::NarrowSharedMemoryBytes(rings.a_stages, rings.a_stage_bytes, rings.b_stages, rings.consumers, tile_n);
  if (rings.smem_bytes > device.shared_memory_per_block) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "shared memory: the narrow decode kernel's A stages, %s, of %d bytes each, and B stages, %s, of %d "
        "bytes each, need %d bytes per block, but %s allows %d",
        depth("narrow_a_stages", options.narrow_a_stages, rings.a_stages), rings.a_stage_bytes,
        depth("narrow_b_stages", options.narrow_b_stages, rings.b_stages), b_stage_bytes,
        rings.smem_bytes, device.name, device.shared_memory_per_block));
  }
  // At most b_stages - 1: the oldest stage in flight is then waited for
  // before its slot is loaded again (RunNarrowBLoader).
  const int default_in_flight =
      splits_k ? kSplitBStagesInFlight
               : (packed && !one_wave_chain ? NarrowConfig::kPackedBStagesInFlight : NarrowConfig::kBStagesInFlight);
  rings.b_in_flight = options.narrow_b_in_flight > 0 ? options.narrow_b_in_flight
                                                     : std::min(default_in_flight, rings.b_stages - 1);
  rings.claim_stages =
      options.narrow_claim_stages == 0 && splits_k ? kSplitClaimStages : options.narrow_claim_stages;
  if (rings.b_in_flight > rings.b_stages - 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CompileOptions.narrow_b_in_flight: %d, but at most the B ring's %d stages - 1 can be in flight",
        rings.b_in_flight, rings.b_stages));
  }
  return rings;
}

// Whether the tiled kernel can read packed weights under `options`: its B
// loader reads them, which lockstep rings do not run (the A loader carries B
// there). Compile packs by it and Explain says why not by it.
bool TiledRingsReadPackedWeights(const CompileOptions& options) {
  return options.ring_mode == RingMode::kSplit;
}

// Lockstep rings have no B loader: the A loader loads each B stage beside A's
// and waits only for A's and the epilogue's producers (loader_role.cuh), so a
// B that another node writes would be read before it exists. Refused, naming
// the first such node, until that loader waits for B's producers too.
absl::Status CheckLockstepReadsNoProducedB(const GemmGraph& graph, const std::vector<DataDependency>& dependencies) {
  for (const DataDependency& dependency : dependencies) {
    if (dependency.operand != Operand::kB) continue;
    return absl::InvalidArgumentError(absl::StrFormat(
        "CompileOptions.ring_mode: lockstep, but %s reads its B (\"%s\") from %s's output, and lockstep rings do "
        "not wait for B's producers; use kSplit (the default)",
        graph.NodeLabel(dependency.consumer), graph.nodes()[dependency.consumer].b.name,
        graph.NodeLabel(dependency.producer)));
  }
  return absl::OkStatus();
}

}  // namespace loom::internal
