// loom/scheduler/queue.h: the jobs of each node and the order of the whole
// queue (a topological, wavefront order across nodes), plus a checker.
//
//   std::vector<loom::sched::TileJob> jobs = loom::sched::NodeJobs(schedule, 0);
//   schedule.queue = loom::sched::OrderQueue(schedule, /*lag=*/66);
//   absl::Status ok = loom::sched::CheckQueue(schedule);  // topological, each job once
//
// Queue order (OrderQueue):
//  * A job is ready once every producer job it can read from (ProducerTiles of
//    its operand regions over its whole k range; for a kReduce job, every split
//    of its tiles) is already in the queue. Only ready jobs are placed, so the
//    queue is topological.
//  * Among ready jobs, the deepest node goes first (longest path from a source),
//    then the node with the longest remaining critical path (in jobs), then the
//    lower node index; inside a node, its raster order. Deepest-first is what
//    makes the wavefront: a consumer job enters the queue close behind the
//    producer jobs it needs, interleaving the nodes of a chain.
//  * NOTE: deepest-first can also put a consumer's jobs ahead of the rest of
//    the producer it waits on, so that the producer's last tiles (and every
//    consumer job reading them) run a wave later: e.g. an MLP block at
//    128-512 tokens whose gate/up takes more than a wave of tiles and whose
//    down projection waits for a K range (split-K) or a row block of it. So
//    OrderQueue builds the order twice, deepest-first and shallowest-first (a
//    producer's jobs before its consumers' wherever both are ready), times
//    both with SimulatedMakespan on `lag` clusters, and keeps deepest-first
//    only where it simulates strictly shorter. A tie goes to shallowest-first:
//    the 8-layer chain at 2048 rows, a tie, ran 6% faster so on the H200 (why
//    is not established; bench/NOTES.md v1.43).
//  * NOTE: "close behind" is `lag` positions behind (one wave of clusters, as
//    Lower() uses), not right behind: a consumer dequeued right after its
//    producer would hold its SM spinning for a whole producer job. A ready job
//    whose producers are fewer than `lag` positions back waits, unless nothing
//    else is ready. lag = 0 places consumers right behind.
//  * Independent nodes are concatenated, not interleaved: each keeps its raster
//    order (its L2 locality), and since SMs dequeue dynamically the next node's
//    first jobs fill the previous node's tail anyway. Ready consumer jobs of a
//    chain interleave with whatever independent work is in the queue.
// Cost: O(J log J + R) for each of the two orders, J jobs, R = producer tiles
// read summed over jobs (a job whose box covers all of a producer counts once,
// not per tile).
#ifndef LOOM_SCHEDULER_QUEUE_H_
#define LOOM_SCHEDULER_QUEUE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "loom/scheduler/schedule.h"

namespace loom::sched {

// The jobs of node `node_index` in raster order of its cluster tiles (its
// cluster columns taken from Schedule::column_runs runs in turn). Per
// cluster tile: one kGemm job over all k-blocks when split_k == 1, or for
// the first WholeTilesOf cluster tiles (split split_k - 1: a whole tile,
// WholeTileOfSplitNode); else the split_k kGemm jobs (split 0, 1, ...)
// followed by that tile's reduce_parts kReduce jobs (part 0, 1, ...; none
// where the last split sums).
// Needs schedule.tile, cluster_size and nodes[node_index]'s tiling.
std::vector<TileJob> NodeJobs(const Schedule& schedule, int node_index);

// NodeJobs(schedule, node_index).size(), without building them.
int64_t NodeJobCount(const Schedule& schedule, int node_index);

// Schedule::whole_tiles of node `node_index` (0 where it is empty).
int64_t WholeTilesOf(const Schedule& schedule, int node_index);

// Which ready node a wavefront order takes first (see above).
enum class NodePriority { kDeepestFirst, kShallowestFirst };

// Every job of every node in the wavefront order under `priority`. Needs
// everything in the schedule except the queue.
std::vector<TileJob> WavefrontQueue(const Schedule& schedule, int64_t lag, NodePriority priority);

// Every job of every node, ordered as described above: the WavefrontQueue of
// either priority that SimulatedMakespan times shorter on `lag` clusters.
std::vector<TileJob> OrderQueue(const Schedule& schedule, int64_t lag);

// The two WavefrontQueues OrderQueue chooses between and, where they differ,
// their SimulatedMakespan on `lag` clusters (clamped to [1, 2^20]), from one
// build of the job graph (for Explain).
struct WavefrontOrders {
  std::vector<TileJob> deepest, shallowest;
  bool agree = false;                 // the two orders are the same
  int64_t deepest_makespan = -1;      // -1 where they agree
  int64_t shallowest_makespan = -1;
};
WavefrontOrders BothWavefrontOrders(const Schedule& schedule, int64_t lag);

// A simulated run of `queue` (the schedule's jobs, in any topological order)
// by `clusters` clusters that each take the next job when free, as the
// kernel's fetch does. A job starts once its cluster is free and every flag it
// waits on but the split-K partials it sums is published; it takes its
// k-blocks (its main loop; a reduce job has none), then once those partials
// are published 4 (its epilogue) plus their bytes over two weight k-blocks'
// bytes (they come from L2). Returns the last job's end in those units
// (k-blocks of one CTA tile), or -1 if the queue holds a job the schedule
// does not; `clusters` below 1 counts as 1. A model for choosing between orders, not a prediction
// of time: it ignores the B ring's loads ahead of A and everything about
// memory but the job's own k-blocks.
int64_t SimulatedMakespan(const Schedule& schedule, const std::vector<TileJob>& queue, int32_t clusters);

// Checks schedule.queue: every job of every node appears exactly once (and
// nothing else), and every job comes after all jobs it can read from.
// Internal error naming the job otherwise.
absl::Status CheckQueue(const Schedule& schedule);

// How many of a launch's `clusters` clusters have no job they can start at
// launch: each cluster's first fetch takes one of the first `clusters` queue
// positions, and a job there starts at once only if it reads no tile flag
// before its main loop (no producer of A, B, bias or residual, and not a
// reduce; the last split of a node whose last split sums starts). Past the
// queue's end counts as idle. The tiled kernel spreads its first fetches
// over the chip when some are idle (KernelConfig::kFirstFetchSpreadCycles).
int32_t IdleClustersAtLaunch(const Schedule& schedule, int32_t clusters);

}  // namespace loom::sched

#endif  // LOOM_SCHEDULER_QUEUE_H_
