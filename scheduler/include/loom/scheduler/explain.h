// loom/scheduler/explain.h: a readable account of a Schedule, for --explain
// and for reading test failures.
//
//   std::cout << loom::sched::ExplainSchedule(*schedule, {"up", "down"});
//
// Per node: shape, tile and cluster shape, shared operand, raster, group,
// split-K, job count, flags and workspace, dependencies (producer name,
// operand, offsets). Then the queue: total jobs, which wavefront order it is
// (queue.h: deepest- or shallowest-first, with both orders' SimulatedMakespan
// when they differ), the first 16 jobs, and where each node's jobs start and
// end in the queue. Names missing from `node_names` print as "node <i>".
#ifndef LOOM_SCHEDULER_EXPLAIN_H_
#define LOOM_SCHEDULER_EXPLAIN_H_

#include <string>
#include <vector>

#include "loom/scheduler/schedule.h"

namespace loom::sched {

std::string ExplainSchedule(const Schedule& schedule, const std::vector<std::string>& node_names);

}  // namespace loom::sched

#endif  // LOOM_SCHEDULER_EXPLAIN_H_
