// timeline.h (internal): formatting of job traces (CompileOptions::trace),
// separate from Plan so it can be tested on the CPU with made-up traces.
#ifndef LOOM_RUNTIME_INTERNAL_TIMELINE_H_
#define LOOM_RUNTIME_INTERNAL_TIMELINE_H_

#include <string>
#include <vector>

#include "loom/runtime.h"

namespace loom::internal {

// The table Plan::ExplainTimeline prints: per node and job kind (over all of
// K, "gemm"; each part of K of a node that splits it, "part N" after
// JobTrace::part; "reduce"), the number
// of CTA-jobs, when they were fetched and published, the median wait for
// data, main loop, epilogue and store of the jobs where both events of a span
// happened, and the median time the A loader spent on A's producers (gemm
// jobs); "-" where no job has the value. node_names[i] names graph node i.
std::string FormatTimeline(const std::vector<JobTrace>& timeline, const std::vector<std::string>& node_names);

}  // namespace loom::internal

#endif  // LOOM_RUNTIME_INTERNAL_TIMELINE_H_
