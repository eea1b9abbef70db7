// reachable_views.h (internal): Compile's check that every view of a graph
// is memory the plan's device can reach with the kernels' TMA loads and
// stores.
#ifndef LOOM_RUNTIME_INTERNAL_REACHABLE_VIEWS_H_
#define LOOM_RUNTIME_INTERNAL_REACHABLE_VIEWS_H_

#include "absl/status/status.h"
#include "loom/graph.h"

namespace loom::internal {

// InvalidArgument naming the node and view where a view of `graph` is host
// memory CUDA does not know (on a device that does not read pageable
// memory), runs past the plain cudaMalloc allocation it starts in, ends in
// unmapped memory, or is device memory `device` has no access to (read-only
// access, for C). What the driver cannot answer passes. Needs `device`
// current.
absl::Status CheckViewsAreReachable(const GemmGraph& graph, int device);

}  // namespace loom::internal

#endif  // LOOM_RUNTIME_INTERNAL_REACHABLE_VIEWS_H_
