// kernel_params.h: what the host hands the persistent kernel. Built by the
// runtime from a Plan (runtime/src/plan_resources.cc), copied to device memory
// once per Plan; the kernel takes one KernelParams by value.
#ifndef LOOM_OPS_KERNEL_KERNEL_PARAMS_H_
#define LOOM_OPS_KERNEL_KERNEL_PARAMS_H_

#include <cuda.h>

#include <cstdint>

#include "loom/scheduler/schedule.h"

namespace loom::kernel {

enum class EpilogueActivation : uint8_t { kNone = 0, kReLU = 1, kGELU = 2, kSiLU = 3, kSwiGLU = 4 };
// kFP16 only in plans whose 16-bit type is fp16 (the tiled kernel's fp16
// instantiations, half_types.cuh).
enum class ElementType : uint8_t { kBF16 = 0, kFP32 = 1, kFP16 = 2 };

// One GEMM node as the kernel sees it (CUtensorMap carries its own 64-byte alignment).
struct KernelNode {
  CUtensorMap a_map;  // A [M, K] bf16 (fp16), box {kBlockK, kABoxRows}, 128B swizzle
  CUtensorMap b_map;  // B [N, K] bf16 (fp16), box {kBlockK, kBBoxRows}, 128B swizzle
  // The same two, box {kBlockK, 2 x box rows}: a whole slot in one load, for a
  // CTA that loads both halves itself (loader_role.cuh).
  CUtensorMap a_slot_map;
  CUtensorMap b_slot_map;
  // C [M, c_tma_cols], box {128 B of columns, 64 rows}, 128B swizzle.
  // NOTE: TMA stores clip the innermost dimension at 16-byte granularity (seen
  // on the H200: a 777-column bf16 row got its padding written), so the map
  // covers only the 16-byte-aligned prefix of each row; the consumers store the
  // last (< 16 bytes of) columns themselves with plain global stores.
  CUtensorMap c_map;
  // Split-K nodes only: the node's fp32 partials in the workspace, 3-D
  // {n_blocks * kBlockN columns, M rows, split_k slices} (slices m_blocks *
  // kBlockM rows apart), box {32, 64, 1}, 128B swizzle. Rows past M are
  // clipped, so a decode-size M writes only its own rows.
  CUtensorMap partial_map;
  sched::NodeSchedule schedule;
  void* c = nullptr;               // C [M, N_out], out_type
  int64_t c_stride = 0;            // elements
  int64_t c_tma_cols = 0;          // columns [0, c_tma_cols) go through TMA; the rest direct
  const void* bias = nullptr;      // [N] (accumulator columns), bias_type
  const void* residual = nullptr;  // [M, N_out], residual_type
  int64_t residual_stride = 0;     // elements
  EpilogueActivation activation = EpilogueActivation::kNone;
  ElementType out_type = ElementType::kBF16;
  ElementType bias_type = ElementType::kFP32;
  ElementType residual_type = ElementType::kBF16;
  uint8_t has_dependents = 0;      // some node waits on this node's tile flags
  // Words a row of the tagged copy tagged_c points into (below): (out_cols +
  // 1) / 2 for a copy of this node's C alone, the buffer's for a column slice
  // of a buffer whose copy several producers write. In what was padding.
  uint16_t tagged_c_pitch = 0;
  // Packed weights (CompileOptions::pack_weights): B in the kernel's stage
  // order (NarrowConfig::Packed or KernelConfig::Packed, packed_layout.h),
  // loaded a stage per bulk copy instead of through b_map; null: B through
  // b_map. (Last: the fields before it keep the sectors they had before it
  // existed.)
  const uint8_t* packed_b = nullptr;
  // The narrow kernel's tagged handoff (NarrowConfig::kTaggedMaxRows):
  // tagged_c, where the epilogue also writes C as tagged words, rows of
  // tagged_c_pitch words (a copy of C alone, or of the buffer C is a column
  // slice of, from an even column), each two bf16 of a row in its low half
  // (the lower column first, 0 past out_cols) and the launch's epoch in its
  // high half; tagged_a, the tagged copy that is this node's whole A, rows
  // of (K + 1) / 2 words, written by its producers, which the A loader then
  // reads instead of a_map and A's flags. Null: none.
  uint64_t* tagged_c = nullptr;
  const uint64_t* tagged_a = nullptr;
  // A node whose A has exactly one producer edge, not whole_tensor: that
  // edge's offsets and the producer's fields that AProducerRun reads, copied
  // here by the runtime (internal::AProducerOf), so that the narrow kernel's
  // A loader works out a dependent job's run of flags from this node's own
  // record (the line its B loader has read already) instead of reading the
  // edge and then the producer, one after the other, after an acquire fence
  // has emptied L1. Measured (bench/NOTES.md v1.67): the 64-token 8-layer
  // chain ~1 us faster than with the edge walk; the MLP block level.
  // out_tile_n == 0: no such edge; AProducerRun walks the edges.
  struct AProducer {
    int64_t row_offset = 0, col_offset = 0;  // the edge's
    int64_t m = 0, out_cols = 0;             // the producer's
    int32_t flag_base = 0, flag_row_stride = 0, n_blocks = 0, out_tile_n = 0;
  } a_producer;
  // The run of A's producer flags (sched::ARunOfBox) from k-block 0 of a job
  // that spans the node's K, for row blocks 0 and 1, worked out by the
  // runtime (internal::FirstARunsOf), so that the A loader of a dependent
  // job polls without working it out first: on the narrow kernel that took
  // it 1.1-1.7 kcycles, on the path of each late SM's first down job of the
  // 64-token MLP block (bench/NOTES.md v1.67, v1.68). For a node whose A
  // joins several nodes' outputs, the run may go on from one edge's producer
  // into the next's, where their flags follow on (v1.69, v1.70). The narrow
  // kernel has at most the two row blocks. The tiled kernel takes row block
  // r's run as row block 0's moved on by r times the flags from row block
  // 0's first flag to row block 1's (the runtime leaves both none unless
  // every row block's run is that), from whichever granule a wait starts at
  // (AProducerRun), for row blocks within M.
  // granules == 0: none; the A loader works the run out (AProducerRun).
  struct FirstARun {
    int32_t first_flag = 0;
    uint16_t granules = 0;
    uint8_t tiles_shift = 0;  // log2 of tiles a granule
    uint8_t unused = 0;
  } first_a_run[2];
};
// The copy and the runs above sit in what was the record's tail padding:
// the fields before them keep their offsets, and the record its size.
static_assert(sizeof(KernelNode) == 1024, "KernelNode grew past its 1024 bytes");

// The run of A's producer flags (sched::ARunOfBox) from k-block kb of a job
// that ends at kb_end, for the row block of tile_m rows at row0, of a node
// whose one A edge is `copy` (KernelNode::a_producer) and whose granules are
// a_wait_k_blocks k-blocks of kBlockK columns: the narrow kernel's
// AProducerRun, and what the runtime stores as KernelNode::first_a_run.
template <int kBlockK, int kMaxTilesPerGranule>
LOOM_HOST_DEVICE inline sched::AFlagRun ARunOfCopy(const KernelNode::AProducer& copy, int a_wait_k_blocks,
                                                   int32_t tile_m, int64_t row0, int kb, int kb_end) {
  const int64_t col_begin = int64_t{kb} * kBlockK;
  const sched::TileBox box = sched::ProducerTilesOffset(copy.m, copy.out_cols, copy.out_tile_n, tile_m,
                                                        copy.row_offset, copy.col_offset, row0, row0 + tile_m,
                                                        col_begin, col_begin + kBlockK);
  return sched::ARunOfBox(copy.flag_base, copy.flag_row_stride, copy.n_blocks, copy.out_tile_n, copy.out_cols,
                          box, a_wait_k_blocks * kBlockK, sched::GranulesLeft(kb, kb_end, a_wait_k_blocks),
                          kMaxTilesPerGranule);
}

// Calls visit(producer, box) for the first A edge of `node` whose producer
// tiles k-block kb of the row block from row0 reads (box not empty), and
// returns how many edges read there, counting to 2 at most: what the runs
// below need, a run coming only from exactly one.
// `dependencies` are the schedule's edges, `producer_of(p)` node p's
// schedule, `tile` the scheduler's tile.
template <int kBlockK, typename ProducerOf, typename Visit>
LOOM_HOST_DEVICE inline int ForEachABox(const sched::NodeSchedule& node, const sched::DependencyEdge* dependencies,
                                        ProducerOf&& producer_of, const sched::TileShape& tile, int64_t row0,
                                        int kb, Visit&& visit) {
  if (!sched::HasProducerOperand(node, sched::DependencyOperand::kA)) return 0;
  const int64_t col_begin = int64_t{kb} * kBlockK;
  int edges = 0;
  for (int d = 0; d < node.dependency_count; ++d) {
    const sched::DependencyEdge& edge = dependencies[node.dependency_begin + d];
    if (edge.operand != static_cast<uint8_t>(sched::DependencyOperand::kA)) continue;
    const sched::NodeSchedule& producer = producer_of(edge.producer);
    const sched::TileBox box =
        sched::ProducerTiles(producer, tile, edge, row0, row0 + tile.m, col_begin, col_begin + kBlockK);
    if (box.empty()) continue;
    if (++edges > 1) return edges;
    visit(producer, box);
  }
  return edges;
}

// The same for a node with no one-edge copy (several A edges, as where A
// joins the outputs of several nodes): the run of the one edge whose producer
// tiles k-block kb's columns read, none (granules 0) where no edge's or more
// than one edge's do. `dependencies` are the schedule's edges and
// `producer_of(p)` node p's schedule; `tile` the scheduler's tile. The narrow
// kernel's AProducerRun for such nodes, and the start of what the runtime
// stores as their KernelNode::first_a_run (internal::FirstARunsOf, which
// also joins the runs of edges whose flags follow on).
template <int kBlockK, int kMaxTilesPerGranule, typename ProducerOf>
LOOM_HOST_DEVICE inline sched::AFlagRun ARunOfEdges(const sched::NodeSchedule& node,
                                                    const sched::DependencyEdge* dependencies,
                                                    ProducerOf&& producer_of, const sched::TileShape& tile,
                                                    int64_t row0, int kb, int kb_end) {
  const int granule = node.a_wait_k_blocks;
  const int granules_left = sched::GranulesLeft(kb, kb_end, granule);
  sched::AFlagRun run;
  const int edges = ForEachABox<kBlockK>(
      node, dependencies, producer_of, tile, row0, kb,
      [&](const sched::NodeSchedule& producer, const sched::TileBox& box) {
        run = sched::ARunOfBox(producer.flag_base, producer.flag_row_stride, producer.n_blocks,
                               producer.out_tile_n, producer.out_cols, box, granule * kBlockK, granules_left,
                               kMaxTilesPerGranule);
      });
  return edges == 1 ? run : sched::AFlagRun{};
}

// The tiled kernel's form of ARunOfEdges: one whole producer tile a granule
// (Config::kMaxTilesPerGranule is 1 there), the run to the producer's last
// whole tile column.
// NOTE: kept apart from ARunOfBox: that one, compiled into the tiled kernel,
// raised its spills by 16-24 bytes (464 to 510 bytes in an earlier form).
template <int kBlockK, typename ProducerOf>
LOOM_HOST_DEVICE inline sched::AFlagRun TiledARunOfEdges(const sched::NodeSchedule& node,
                                                         const sched::DependencyEdge* dependencies,
                                                         ProducerOf&& producer_of, const sched::TileShape& tile,
                                                         int64_t row0, int kb, int kb_end) {
  const int granule = node.a_wait_k_blocks;
  const int granules_left = sched::GranulesLeft(kb, kb_end, granule);
  sched::AFlagRun run;
  bool one_whole_tile = false;
  int columns_left = 0;
  const int edges = ForEachABox<kBlockK>(
      node, dependencies, producer_of, tile, row0, kb,
      [&](const sched::NodeSchedule& producer, const sched::TileBox& box) {
        one_whole_tile = box.m_end - box.m_begin == 1 && box.n_end - box.n_begin == 1 &&
                         granule * kBlockK == producer.out_tile_n;
        run.first_flag = sched::OutputFlagIndex(producer, box.m_begin, box.n_begin);
        const bool ragged = int64_t{producer.n_blocks} * producer.out_tile_n > producer.out_cols;
        columns_left = producer.n_blocks - box.n_begin - (ragged ? 1 : 0);
      });
  if (edges != 1 || !one_whole_tile) return sched::AFlagRun{};
  run.granules = granules_left < columns_left ? granules_left : columns_left;
  return run;
}

// The run of A's producer flags that a kernel's A loader polls from k-block
// kb of a job that ends at kb_end, in the row block from row0
// (AProducerRun, dependencies.cuh, for a kernel of tiles kBlockM x kBlockK
// and at most kMaxTilesPerGranule producer tiles a granule; host code calls
// it to check plans). None (granules 0: the loader waits granule by granule)
// unless the node's runs are sound (NodeSchedule::a_flag_runs). The narrow
// kernel (several tiles a granule) works it out from the one-edge copy, or
// else from the edges. The tiled kernel takes the runtime's run from k-block
// 0 (KernelNode::first_a_run), moved on to this row block and to kb's
// granule; past that run, or for a row block past M (a cluster peer whose
// tile lies past it still runs the job's ring steps: it has no producer
// tiles, and the run moved on would name other tiles' flags), its own form.
template <int kBlockM, int kBlockK, int kMaxTilesPerGranule, typename ProducerOf>
LOOM_HOST_DEVICE inline sched::AFlagRun AProducerRunOf(const KernelNode& node,
                                                       const sched::DependencyEdge* dependencies,
                                                       ProducerOf&& producer_of, const sched::TileShape& tile,
                                                       int64_t row0, int kb, int kb_end) {
  if (!node.schedule.a_flag_runs) return sched::AFlagRun{};
  if constexpr (kMaxTilesPerGranule > 1) {
    // NOTE: the one-edge copy on the narrow kernel only, where v1.67
    // measured it.
    if (node.a_producer.out_tile_n != 0) {
      return ARunOfCopy<kBlockK, kMaxTilesPerGranule>(node.a_producer, node.schedule.a_wait_k_blocks, tile.m,
                                                      row0, kb, kb_end);
    }
    return ARunOfEdges<kBlockK, kMaxTilesPerGranule>(node.schedule, dependencies, producer_of, tile, row0, kb,
                                                     kb_end);
  } else {
    const int granule = node.schedule.a_wait_k_blocks;
    const int granules_left = sched::GranulesLeft(kb, kb_end, granule);
    const KernelNode::FirstARun& first = node.first_a_run[0];
    const int32_t m_block = static_cast<int32_t>(row0 / kBlockM);
    if (kb / granule < first.granules && m_block < node.schedule.m_blocks) {
      const int32_t step = node.first_a_run[1].first_flag - first.first_flag;
      sched::AFlagRun run;
      run.first_flag = first.first_flag + m_block * step + kb / granule;
      const int32_t first_left = first.granules - kb / granule;
      run.granules = first_left < granules_left ? first_left : granules_left;
      return run;
    }
    return TiledARunOfEdges<kBlockK>(node.schedule, dependencies, producer_of, tile, row0, kb, kb_end);
  }
}

// Per-Plan device state that survives launches. Zeroed when the Plan is built.
struct LaunchState {
  uint32_t epoch;          // the epoch of the last completed launch
  uint32_t cursor;         // next queue index to hand out
  uint32_t finished_fetching;  // schedulers of the current launch done fetching (FinishFetching)
  uint32_t abort;  // set when any wait timed out: every role drains (cleared by Plan::Synchronize)
};

// Written (host-mapped memory) by the first wait that times out. Only waits
// on other CTAs' work have a time limit (a role whose wait gives up drains:
// watchdog.cuh), so these are all there are.
enum class WaitKind : int32_t {
  kNone = 0,
  kDependencyFlag = 1,
  // The scheduler, holding back until its last job's inputs are ready (and,
  // with claim pacing, its B loader near that job's end).
  kHeldJobInputs = 2,
  kFirstFetches = 3,   // the scheduler, before its second fetch, for every scheduler's first
  // Not a wait: a consumer was handed a job the launched kernel has no path
  // for (a loom bug; the narrow kernel's PassOverJob), reported the same way.
  kNoKernelPath = 4,
};

// How long the watchdog lets a wait of kind `what` spin before it reports a
// time-out (Watchdog::SpinUntil), from CompileOptions::spin_timeout_ns:
// that for a dependency flag; four times that for the scheduler's two
// waits (a held job's inputs, the first fetches), each a downstream symptom
// of some dependency wait, so that the root cause is the one reported. The
// host's time-out status names the same limit.
LOOM_HOST_DEVICE constexpr uint64_t WaitLimitNs(WaitKind what, uint64_t spin_timeout_ns) {
  return what == WaitKind::kDependencyFlag ? spin_timeout_ns : 4 * spin_timeout_ns;
}
struct DeviceTimeoutRecord {
  int32_t timed_out;  // 0 or 1; claimed with atomicCAS by the first waiter
  int32_t sm;
  int32_t job;
  int32_t flag;
  uint32_t expected;
  uint32_t seen;
  int32_t wait_kind;  // WaitKind
  int32_t block;
};

// One job's timeline on one CTA (CompileOptions::trace): %globaltimer
// nanoseconds (about 1 us ticks). 0: the event did not happen this launch.
struct DeviceJobTrace {
  uint64_t fetched;     // consumer warpgroup 0 received the job
  uint64_t data_ready;  // its first A slot was full (dependencies met, first loads landed) or,
                        // for a reduce job, every partial was published
  uint64_t mma_done;    // main loop (or partial sum) finished
  uint64_t staged;      // its last panel was handed to the store thread (narrow kernel: the tile to the publisher)
  uint64_t published;   // store thread (narrow kernel: publisher): stores complete (and the tile flag released)
  int32_t sm;
  uint32_t a_dependency_ns;  // A loader: time spent checking and waiting for A's producers (gemm jobs)
};

struct KernelParams {
  const KernelNode* nodes;
  const sched::TileJob* queue;
  const sched::DependencyEdge* dependencies;  // grouped by consumer node
  int32_t num_jobs;
  int32_t cluster_size;
  int32_t a_stages;
  int32_t b_stages;
  int32_t lockstep;        // 1: one ring (A's barriers) carries A and B
  uint32_t* flags;         // [num_flags] epoch of the last completion of each tile
  float* workspace;        // split-K partials
  LaunchState* state;
  DeviceTimeoutRecord* timeout;  // host-mapped
  uint64_t spin_timeout_ns;
  DeviceJobTrace* trace;  // [num_jobs * cluster_size] (job, rank), or null
  uint32_t a_stage_bytes;  // KernelConfig::kAStageBytes, or kHalfAStageBytes for a plan of <= 64-row nodes
  int32_t num_nodes;       // nodes[0, num_nodes)
  int32_t b_in_flight;     // narrow kernel: B stages in flight at most (< b_stages)
  int32_t block_m;         // the scheduler's tile.m (narrow kernel: NarrowConfig::BlockRows)
  // Tiled kernel: 0, or the clock cycles per rank by which a cluster delays
  // its first fetch (SpreadFirstFetch, scheduler_role.cuh; the runtime sets
  // KernelConfig::kFirstFetchSpreadCycles where sched::IdleClustersAtLaunch
  // is above 0).
  uint32_t first_fetch_spread_cycles;
  // Narrow kernel (CompileOptions::narrow_claim_stages): 0, or the scheduler
  // claims its next job only once the B loader has at most this many stages
  // of the last claimed job left to issue (NarrowContext::LoaderNear).
  int32_t claim_stages;
};

}  // namespace loom::kernel

#endif  // LOOM_OPS_KERNEL_KERNEL_PARAMS_H_
