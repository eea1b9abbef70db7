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
//  * NOTE: "close behind" is `lag` positions behind (one wave of clusters, as
//    Lower() uses), not right behind: a consumer dequeued right after its
//    producer would hold its SM spinning for a whole producer job. A ready job
//    whose producers are fewer than `lag` positions back waits, unless nothing
//    else is ready. lag = 0 places consumers right behind.
//  * Independent nodes are concatenated, not interleaved: each keeps its raster
//    order (its L2 locality), and since SMs dequeue dynamically the next node's
//    first jobs fill the previous node's tail anyway. Ready consumer jobs of a
//    chain interleave with whatever independent work is in the queue.
// Cost: O(J log J + R), J jobs, R = producer tiles read summed over jobs (a job
// whose box covers all of a producer counts once, not per tile).
#ifndef LOOM_SCHEDULER_QUEUE_H_
#define LOOM_SCHEDULER_QUEUE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "loom/scheduler/schedule.h"

namespace loom::sched {

// The jobs of node `node_index` in raster order of its cluster tiles. Per
// cluster tile: one kGemm job over all k-blocks when split_k == 1; else the
// split_k kGemm jobs (split 0, 1, ...) followed by that tile's reduce_parts
// kReduce jobs (part 0, 1, ...).
// Needs schedule.tile, cluster_size and nodes[node_index]'s tiling.
std::vector<TileJob> NodeJobs(const Schedule& schedule, int node_index);

// NodeJobs(schedule, node_index).size(), without building them.
int64_t NodeJobCount(const Schedule& schedule, int node_index);

// Every job of every node, ordered as described above. Needs everything in the
// schedule except the queue.
std::vector<TileJob> OrderQueue(const Schedule& schedule, int64_t lag);

// Checks schedule.queue: every job of every node appears exactly once (and
// nothing else), and every job comes after all jobs it can read from.
// Internal error naming the job otherwise.
absl::Status CheckQueue(const Schedule& schedule);

// How many of a launch's `clusters` clusters have no job they can start at
// launch: each cluster's first fetch takes one of the first `clusters` queue
// positions, and a job there starts at once only if it reads no tile flag
// (no producer of A, B, bias or residual, and not a reduce). Past the
// queue's end counts as idle. The tiled kernel spreads its first fetches
// over the chip when some are idle (KernelConfig::kFirstFetchSpreadCycles).
int32_t IdleClustersAtLaunch(const Schedule& schedule, int32_t clusters);

}  // namespace loom::sched

#endif  // LOOM_SCHEDULER_QUEUE_H_
