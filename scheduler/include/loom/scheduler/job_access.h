// loom/scheduler/job_access.h: what a tile job reads from other jobs and what
// it publishes. The single definition the queue order, the queue checker and
// the simulator share (and the kernel's waits must match).
//
// Operand regions, in the consumer's element coordinates, of CTA tile
// (mb, nb) of a node over k-blocks [kb0, kb1):
//   A        [M, K]         rows [mb*tile.m, +tile.m)   cols [kb0*tile.k, kb1*tile.k)
//   B        [N, K]         rows [nb*tile.n, +tile.n)   cols [kb0*tile.k, kb1*tile.k)
//   bias     [1, N]         rows [0, 1)                 cols [nb*tile.n, +tile.n)   (accumulator columns)
//   residual [M, out_cols]  rows [mb*tile.m, +tile.m)   cols [nb*out_tile_n, +out_tile_n)
// whole tiles and k-blocks, NOT clipped to the operand's extent, and for
// every CTA of a cluster job, also one whose tile lies past the node: the
// kernels' loaders wait for the producer tiles of exactly these regions
// (dependencies.cuh), so where an operand is a slice of a larger output
// (rows or columns ending inside a producer tile, or a cluster peer past M
// reading rows the slice leaves out) the queue must place those tiles first
// too. (Clipped, it did not, and such graphs could deadlock: a CTA's loader
// waited for a producer tile queued behind the jobs that every CTA held.)
// A and B are read per k-block by the
// kGemm jobs; bias and residual by the job that runs the epilogue (the kGemm
// job when split_k == 1 or FinishesSplitTile, else the kReduce job), but
// every kGemm job, split or not, waits for their producers before its first
// load (the kernel's loader, WaitForEpilogueInputs: a reduce job then finds
// them complete through its partials' flags, splitk_reduce.cuh), so the
// epilogue phase's reads are every job's. A kReduce job first reads the split-K partials of
// its tiles (partial flags, all splits); the last split of a node whose last
// split sums (FinishesSplitTile) reads the others' after its main loop.
//
//   std::vector<loom::sched::FlagRead> reads;
//   loom::sched::AppendJobReads(schedule, job, k_block, k_block + 1,
//                               loom::sched::ReadPhase::kMainLoop, &reads);
#ifndef LOOM_SCHEDULER_JOB_ACCESS_H_
#define LOOM_SCHEDULER_JOB_ACCESS_H_

#include <cstdint>
#include <vector>

#include "loom/scheduler/schedule.h"

namespace loom::sched {

// A rectangle of elements [row_begin, row_end) x [col_begin, col_end).
struct ElementBox {
  int64_t row_begin = 0, row_end = 0, col_begin = 0, col_end = 0;
};

// The elements of `operand` that CTA tile `cta` of `node` reads over k-blocks
// [k_block_begin, k_block_end) (ignored for bias and residual). See above.
ElementBox OperandRegion(const NodeSchedule& node, const TileShape& tile, DependencyOperand operand,
                         CtaTile cta, int32_t k_block_begin, int32_t k_block_end);

// ProducerTiles(), additionally clipped to the producer's tile grid (empty for
// a producer without tiles).
TileBox ClippedProducerTiles(const NodeSchedule& producer, const TileShape& tile,
                             const DependencyEdge& edge, const ElementBox& region);

// Whether CTA tile `cta` lies inside the node's tile grid (a cluster job's
// second tile may not: the kernel skips it).
bool CtaTileInRange(const NodeSchedule& node, CtaTile cta);

// One producer tile a job needs: the flag the kernel waits on, and the
// producer's tile coordinates (so a checker can verify against the data, not
// only against the flag).
struct FlagRead {
  int32_t flag = 0;
  int32_t producer = 0;   // node index
  int32_t m_block = 0;
  int32_t n_block = 0;
  int32_t split = -1;     // >= 0: a split-K partial of the job's own node
};

enum class ReadPhase : uint8_t {
  kMainLoop,   // A and B dependencies over the given k-blocks (kGemm jobs)
  kPartials,   // the split-K partials a job sums (PartialsSummed)
  kEpilogue,   // bias and residual dependencies (every job: see the top of the file)
};

// The producer tiles one edge makes a job read, as a box (one entry per edge
// and CTA tile; empty boxes left out). Not for kPartials.
struct ProducerBox {
  int32_t producer = 0;
  TileBox box;
};
void AppendJobReadBoxes(const Schedule& schedule, const TileJob& job, int32_t k_block_begin,
                        int32_t k_block_end, ReadPhase phase, std::vector<ProducerBox>* boxes);

// Appends what `job` reads in `phase` (k-blocks [k_block_begin, k_block_end)
// for kMainLoop), for each of its CTA tiles (kPartials: its in-range ones),
// edge by edge. May contain duplicates. Nothing for a phase the job does not
// have.
void AppendJobReads(const Schedule& schedule, const TileJob& job, int32_t k_block_begin,
                    int32_t k_block_end, ReadPhase phase, std::vector<FlagRead>* reads);

// Every flag `job` reads: its main loop over all its k-blocks, its partials,
// its epilogue inputs (AppendJobReads of each phase, in that order).
void AppendEveryJobRead(const Schedule& schedule, const TileJob& job, std::vector<FlagRead>* reads);

// One flag a job publishes when it completes. A tile reduced in parts
// (NodeSchedule::reduce_parts) has `writers` jobs, part 0, 1, ...: its flag
// is set, and its data whole, once all of them have completed.
struct FlagWrite {
  int32_t flag = 0;
  int32_t m_block = 0;
  int32_t n_block = 0;
  int32_t split = -1;  // >= 0: a split-K partial
  int32_t part = 0;
  int32_t writers = 1;
};

// Appends what `job` publishes when done: the output flags of its in-range CTA
// tiles if it runs the epilogue, else the partial flags of its split.
void AppendJobWrites(const Schedule& schedule, const TileJob& job, std::vector<FlagWrite>* writes);

}  // namespace loom::sched

#endif  // LOOM_SCHEDULER_JOB_ACCESS_H_
