// compile_choices.h (internal): what Runtime::Compile checks and chooses
// before it lowers a graph: the options' and the device's ranges, which
// kernel runs the plan, and that kernel's tile width, rings and shared
// memory. Pure functions of the graph, the options and the device
// description, so Compile without a GPU makes the same choices.
#ifndef LOOM_RUNTIME_INTERNAL_COMPILE_CHOICES_H_
#define LOOM_RUNTIME_INTERNAL_COMPILE_CHOICES_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernel_params.h"
#include "narrow_config.h"
#include "loom/graph.h"
#include "loom/runtime.h"
#include "loom/scheduler/schedule.h"

namespace loom::internal {

// The tiled kernel's CTAs a cluster (the narrow kernel has no clusters).
inline constexpr int kClusterSize = 2;

// The kernels' names for a graph's element type and activation.
kernel::ElementType ElementTypeOf(DType dtype);
kernel::EpilogueActivation ActivationOf(Activation activation);

// The scheduler's view of `graph`'s nodes and of the edges between them
// (`dependencies`: graph.Dependencies()).
std::vector<sched::NodeProblem> ProblemsOf(const GemmGraph& graph, const std::vector<DataDependency>& dependencies);

// Whether the scheduler gives `node` tile jobs (M and N above 0), and
// whether those jobs load operands (K above 0 too).
bool HasJobs(const GemmNode& node);
bool LoadsOperands(const GemmNode& node);

// The first node with jobs and K = 0, or null.
const GemmNode* FirstZeroKNode(const GemmGraph& graph);
// The narrow kernel's 32-column tiles of `node` (0 without jobs).
int64_t NarrowTiles(const GemmNode& node);
// The rows of the tallest node with jobs, and the longest K of one.
int64_t MaxRows(const GemmGraph& graph);
int64_t MaxK(const GemmGraph& graph);

// The plan's 16-bit input type; InvalidArgument for a graph that mixes two.
absl::StatusOr<DType> HalfTypeOf(const GemmGraph& graph);

// InvalidArgument for an option out of its range, naming it and the value.
absl::Status CheckOptions(const CompileOptions& options);
// InvalidArgument or FailedPrecondition for a device description the
// kernels cannot run on.
absl::Status CheckDevice(const DeviceDescription& device);
// InvalidArgument where lockstep rings would read a B another node writes.
absl::Status CheckLockstepReadsNoProducedB(const GemmGraph& graph, const std::vector<DataDependency>& dependencies);

// Whether a graph of at most `rows` rows runs on the narrow decode kernel
// (`depth`: sched::NodeDepths of its problems) of a device with `sms` SMs.
bool UsesNarrowKernel(const CompileOptions& options, const GemmGraph& graph,
                      const std::vector<DataDependency>& dependencies, const std::vector<int32_t>& depth,
                      int64_t rows, int sms);

// The tiled kernel: its A stage size, its tile width on a grid of
// `grid_ctas` CTAs, the scheduler's tile for a width, its ring depths {A,
// B}, the shared memory they take (ResourceExhausted past the device's), and
// whether its B loader reads packed weights under `options`.
uint32_t AStageBytesFor(const GemmGraph& graph);
int ChooseTileWidth(const CompileOptions& options, const std::vector<sched::NodeProblem>& problems,
                    const std::vector<int32_t>& depth, int64_t grid_ctas);
sched::TileShape TiledTile(int tile_n);
std::pair<int, int> ChooseTiledRings(const CompileOptions& options, const DeviceDescription& device,
                                     uint32_t a_stage_bytes, int tile_n);
absl::StatusOr<int64_t> TiledSharedMemory(int a_stages, int b_stages, const DeviceDescription& device,
                                          uint32_t a_stage_bytes, int tile_n);
bool TiledRingsReadPackedWeights(const CompileOptions& options);

// The narrow decode kernel's rings and claim pacing (ChooseNarrowRings).
struct NarrowRings {
  int a_stages = 0;
  int b_stages = 0;
  int b_in_flight = 0;
  int consumers = 0;  // consumer warpgroups (CompileOptions::narrow_consumers)
  int claim_stages = 0;  // CompileOptions::narrow_claim_stages, or the pair split's where that leaves it 0
  uint32_t a_stage_bytes = 0;
  uint32_t smem_bytes = 0;
};

// Whether every node is at most one wave of narrow tiles on `sms` SMs and
// some node reads another's output: a chain of one-wave layers.
bool IsChainOfOneWaveLayers(const GemmGraph& graph, const std::vector<DataDependency>& dependencies, int sms);
// The k-blocks a pair split gives its second halves beyond the first's
// share (sched::SplitKRange's last_extra): CompileOptions::
// last_split_extra_k_blocks where set, else 0.
// NOTE: 8 (two stages) took the 64-token 8-layer chain from ~149 to ~145
// us on an H100 but cost the 64-token MLP block ~1 us (16: 144 and ~1.7
// us; bench/NOTES.md v2.02); the block is what the pair split is for.
int32_t PairSplitLastExtraKBlocks(const CompileOptions& options);
// The fewest pair-split jobs (two halves of K for each 64-column tile) of
// any node of `graph` with jobs (the int64 maximum if none has any).
int64_t FewestPairSplitJobs(const GemmGraph& graph);
// Whether PairSplitChoice::kAuto asks for the pair split: past 64 rows (the
// tall pair split), every node with jobs at least three quarters of a wave
// of them on `sms` SMs (FewestPairSplitJobs).
bool PairSplitPaysByDefault(const GemmGraph& graph, int64_t rows, int sms);
// Whether a narrow plan of a graph of at most `rows` rows on `sms` SMs takes
// the pair split (CompileOptions::narrow_pair_split): asked for (kOn, or
// kAuto where PairSplitPaysByDefault), 33-128 rows
// (NarrowConfig::PairSplitRows; past 64 not with one consumer warpgroup
// asked for: NarrowConfig::TallPairSplit), and every node's K split in two
// (sched::SplitKRange, the second half PairSplitLastExtraKBlocks longer) on
// a stage boundary, a stage at least each.
bool NarrowPairSplitApplies(const CompileOptions& options, const GemmGraph& graph, int64_t rows, int sms);
// Whether a narrow plan of a graph of at most `rows` rows takes the wide
// split (CompileOptions::narrow_wide_split): asked for, 33-64 rows
// (NarrowConfig::WideSplitRows), not with one consumer warpgroup asked for,
// and every node's K split in four (sched::SplitKRange, the last quarter
// PairSplitLastExtraKBlocks longer) on stage boundaries, a stage at least
// each. Compile checks it before the pair split, which CheckOptions keeps
// from being asked for beside it (kOn).
bool NarrowWideSplitApplies(const CompileOptions& options, const GemmGraph& graph, int64_t rows);
// The narrow kernel's rings for a graph of at most `rows` rows and K at most
// `max_k`; InvalidArgument for options it cannot run. `split`: how the plan
// divides K (NarrowPairSplitApplies, NarrowWideSplitApplies): B stages of
// NarrowConfig::TileN(split)-row tiles, A stages of a job's part of K at most.
absl::StatusOr<NarrowRings> ChooseNarrowRings(const CompileOptions& options, const DeviceDescription& device,
                                              int64_t rows, int64_t max_k, bool one_wave_chain, bool packed,
                                              kernel::NarrowConfig::Split split = kernel::NarrowConfig::Split::kNone);

}  // namespace loom::internal

#endif  // LOOM_RUNTIME_INTERNAL_COMPILE_CHOICES_H_
