// loom/reference.h: the CPU reference executor of a lowered GEMM graph.
//
// RunReference executes a Schedule job by job, exactly as the persistent
// kernel would, on tensors in HOST memory (the graph's TensorView pointers are
// host pointers): FP64 accumulation, the epilogue of loom/ops/reference.h,
// outputs rounded once to C's dtype. Split-K partials live in a host FP64
// workspace and are reduced in split order 0..split_k-1. While it runs it
// checks the schedule: every output tile is computed exactly once, each job's
// k-blocks cover the node's K, no job runs before the flags it waits for are
// set (the waits of loom/scheduler/job_access.h, which the queue order and
// the kernels follow), and, on the data itself, no job reads a byte of any
// node's output before a job has written it (so waits that cover too little
// are caught even where they agree with the queue). A broken schedule is an
// Internal error; a graph that fails GemmGraph::Validate is refused with its
// InvalidArgument.
//
// With options.simulated_sms > 0, that many virtual SMs pull jobs from a
// cursor in a seeded random interleaving; a job runs only once the producer
// tiles it reads are done, and a state where no SM can move is reported as a
// deadlock (Internal) instead of hanging.
//
// RunNaiveGraph is the independent check: each node as one triple loop, in
// node order, with the same epilogue.
//
//   loom::GemmGraph graph = ...;  // views of host buffers
//   absl::StatusOr<loom::Plan> plan =
//       loom::Runtime::ForDescription(loom::DeviceDescription::H200()).Compile(graph);
//   LOOM_RETURN_IF_ERROR(loom::RunReference(*plan, {.simulated_sms = 132, .seed = 7}));
#ifndef LOOM_REFERENCE_H_
#define LOOM_REFERENCE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "loom/graph.h"
#include "loom/runtime.h"
#include "loom/scheduler/schedule.h"

namespace loom {

struct ReferenceOptions {
  // 0: run the queue in order. > 0: that many virtual SMs interleave the jobs
  // (at most one a job: more could never hold one).
  int simulated_sms = 0;
  // Seeds the interleaving of the virtual SMs (ignored for queue order).
  uint64_t seed = 0;
};

// Runs `schedule` (lowered from `graph`) on the graph's host tensors.
// InvalidArgument if the graph is not valid (GemmGraph::Validate) or the
// schedule does not describe it (node count or shapes differ); Internal if
// the schedule is inconsistent (a tile computed twice or never, k-blocks that
// do not cover K, a job whose flags are not set in queue order, a job that
// reads an output not yet written, a deadlock of the virtual SMs);
// ResourceExhausted, before any is filled, where the nodes' tile flags and
// FP64 partials together exceed the host memory this process can still be
// given (the smallest of the physical memory, /proc/meminfo's MemAvailable
// and a cgroup's room under its limit) or an allocation fails.
absl::Status RunReference(const GemmGraph& graph, const sched::Schedule& schedule,
                          const ReferenceOptions& options = {});

// RunReference(plan.graph(), plan.schedule(), options), without validating
// the graph again (Compile did). FailedPrecondition for a moved-from Plan.
absl::Status RunReference(const Plan& plan, const ReferenceOptions& options = {});

// Computes every node in node order with one FP64 triple loop each (its
// output columns in blocks over the host's cores; each element one sum over
// K in order, so the bits do not depend on the blocks); needs no schedule.
// The same epilogue and output rounding as RunReference.
// InvalidArgument if a node's views, dtypes or shapes are not valid
// (GemmGraph::ValidateShapes; the kernels' limits do not apply).
absl::Status RunNaiveGraph(const GemmGraph& graph);

}  // namespace loom

#endif  // LOOM_REFERENCE_H_
