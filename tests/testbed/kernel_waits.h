// testbed/kernel_waits.h: the kernels' waits, replayed on the CPU for a
// compiled plan, job by job and CTA by CTA, as their loaders wait (with the
// kernels' own run functions, kernel_params.h), and two checks on them: that
// every A tile a k-block loads was waited for, and that every flag waited for
// is published earlier in the queue (what keeps the persistent kernel from
// deadlocking). Used by a_flag_runs_test and compile_fuzz_test.
#ifndef LOOM_TESTS_TESTBED_KERNEL_WAITS_H_
#define LOOM_TESTS_TESTBED_KERNEL_WAITS_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "loom/runtime.h"
#include "loom/scheduler/schedule.h"

namespace loom::testbed {

// What one CTA of GEMM job `job` waits for, replayed as the kernels' loaders
// do (a CTA of a cluster job whose tile lies past the node too: its loaders
// run the job's waits all the same): the epilogue's inputs before the first
// load (WaitForEpilogueInputs), A k-block by k-block (ReplayALoader), B
// k-block by k-block (the B loader of split rings; lockstep rings refuse a B
// that a node writes). Each over the CTA's whole tile and k-blocks, as the
// kernels ask, not clipped to the operand. `unsound`: ReplayALoader's
// message.
struct CtaWaits {
  std::set<int32_t> flags;
  std::string unsound;
};
// Each function replays `schedule`, which is the plan's own unless a test
// hands in an edited copy to show a check is not blind; the plan gives the
// kernel and the node names.
CtaWaits ReplayCta(const Plan& plan, const sched::Schedule& schedule, const sched::TileJob& job, int rank);

// Every GEMM job of `plan`, each CTA of its cluster, replayed: the failures
// (at most a few), each naming the node.
std::vector<std::string> UnsoundWaits(const Plan& plan, const sched::Schedule& schedule);
inline std::vector<std::string> UnsoundWaits(const Plan& plan) { return UnsoundWaits(plan, plan.schedule()); }

// The waits of every GEMM job of `plan`, each CTA of its cluster, replayed,
// against the queue: every flag a job waits for must be published by jobs
// that all come before it. That is what keeps the persistent kernel from
// deadlocking: CTAs take jobs in queue order, so the earliest job not done
// can always finish, unless it waits for a later one, which every CTA may
// be holding a job in front of. (The queue is ordered by the scheduler's
// model of what jobs read, sched::AppendJobReads; this checks that model
// against the kernels' own waits, which it once missed: an operand that is
// a slice of a larger output, clipped in the model and not in the kernels.)
// The failures, at most a few.
std::vector<std::string> WaitsOutOfQueueOrder(const Plan& plan, const sched::Schedule& schedule);
inline std::vector<std::string> WaitsOutOfQueueOrder(const Plan& plan) {
  return WaitsOutOfQueueOrder(plan, plan.schedule());
}

}  // namespace loom::testbed

#endif  // LOOM_TESTS_TESTBED_KERNEL_WAITS_H_
