// timeline.cc: reading back and summarising the job traces of a launch
// (CompileOptions::trace).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "internal/cuda_status.h"
#include "internal/plan_impl.h"
#include "internal/timeline.h"
#include "loom/runtime.h"
#include "loom/scheduler/schedule.h"
#include "loom/status.h"

namespace loom {
namespace {

// Median of the spans that exist (both events happened); nullopt if none.
std::optional<double> Median(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

// Appends later - earlier when both events happened (times >= 0). The span
// may be slightly negative: the two events are stamped by different threads.
void AddSpan(double earlier, double later, std::vector<double>& spans) {
  if (earlier >= 0 && later >= 0) spans.push_back(later - earlier);
}

struct Range {
  double first = std::numeric_limits<double>::max();
  double last = -1;
  void Add(double t) {
    if (t < 0) return;
    first = std::min(first, t);
    last = std::max(last, t);
  }
  std::string ToString() const {
    return last < 0 ? std::string("-") : absl::StrFormat("%.1f-%.1f", first, last);
  }
};

std::string FormatMicros(std::optional<double> us) {
  return us.has_value() ? absl::StrFormat("%.1f us", *us) : std::string("-");
}

}  // namespace

absl::StatusOr<std::vector<JobTrace>> Plan::Timeline() const {
  if (impl_ == nullptr) return internal::MovedFromPlan("Timeline");
  if (!impl_->options.trace) {
    return absl::FailedPreconditionError("Plan::Timeline: compile the plan with CompileOptions::trace = true");
  }
  if (impl_->device_ordinal < 0) {
    return absl::FailedPreconditionError("Plan::Timeline: a host-only plan is never launched, so it has no timeline");
  }
  const int cluster = impl_->schedule.cluster_size;
  const size_t records = impl_->schedule.queue.size() * cluster;
  std::vector<kernel::DeviceJobTrace> raw(records);
  if (records > 0 && impl_->trace != nullptr) {
    LOOM_CUDA_RETURN_IF_ERROR(cudaMemcpy(raw.data(), impl_->trace, records * sizeof(kernel::DeviceJobTrace),
                                         cudaMemcpyDeviceToHost));
  }
  uint64_t origin = std::numeric_limits<uint64_t>::max();
  for (const kernel::DeviceJobTrace& r : raw) {
    if (r.fetched != 0) origin = std::min(origin, r.fetched);
  }
  auto micros = [origin](uint64_t t) { return t == 0 ? -1.0 : static_cast<double>(t - origin) * 1e-3; };
  std::vector<JobTrace> out;
  for (size_t i = 0; i < raw.size(); ++i) {
    const kernel::DeviceJobTrace& r = raw[i];
    if (r.fetched == 0) continue;  // this CTA had nothing to do for the job
    const sched::TileJob& job = impl_->schedule.queue[i / cluster];
    JobTrace trace;
    trace.job = static_cast<int>(i / cluster);
    trace.rank = static_cast<int>(i % cluster);
    trace.node = job.node;
    trace.sm = r.sm;
    trace.reduce = job.kind == static_cast<uint8_t>(sched::JobKind::kReduce);
    if (sched::MultipliesPartOfK(impl_->schedule.nodes[job.node], job)) trace.part = job.split;
    trace.fetched = micros(r.fetched);
    trace.data_ready = micros(r.data_ready);
    trace.mma_done = micros(r.mma_done);
    trace.staged = micros(r.staged);
    trace.published = micros(r.published);
    if (!trace.reduce) trace.a_dependency = static_cast<double>(r.a_dependency_ns) * 1e-3;
    out.push_back(trace);
  }
  return out;
}

absl::StatusOr<std::string> Plan::ExplainTimeline() const {
  absl::StatusOr<std::vector<JobTrace>> timeline = Timeline();
  if (!timeline.ok()) return timeline.status();
  std::vector<std::string> names;
  for (const GemmNode& node : impl_->graph.nodes()) names.push_back(node.name);
  return internal::FormatTimeline(*timeline, names);
}

namespace internal {

std::string FormatTimeline(const std::vector<JobTrace>& timeline, const std::vector<std::string>& node_names) {
  Range stores;
  for (const JobTrace& t : timeline) stores.Add(t.published);
  std::string out = absl::StrFormat(
      "timeline (us from the first job fetch; %%globaltimer, ~1 us ticks): %d CTA-jobs, last store at %s\n",
      static_cast<int>(timeline.size()), stores.last < 0 ? std::string("-") : FormatMicros(stores.last));
  out += "  node / kind          CTA-jobs  fetched        published      median: wait  main loop  epilogue  store  A deps\n";
  int most_parts = 0;
  for (const JobTrace& t : timeline) most_parts = std::max(most_parts, t.part + 1);
  for (int node = 0; node < static_cast<int>(node_names.size()); ++node) {
    // A row per kind of job: over all of K ("gemm", part -1), each part of
    // K of a split node ("part N", JobTrace::part), reduce jobs.
    for (int kind = -1; kind <= most_parts; ++kind) {
      const bool reduce = kind == most_parts;
      const int part = reduce ? -1 : kind;
      Range fetched, published;
      std::vector<double> wait, main_loop, epilogue, store, a_dependency;
      int count = 0;
      for (const JobTrace& t : timeline) {
        if (t.node != node || t.reduce != reduce || t.part != part) continue;
        ++count;
        fetched.Add(t.fetched);
        published.Add(t.published);
        AddSpan(t.fetched, t.data_ready, wait);
        AddSpan(t.data_ready, t.mma_done, main_loop);
        AddSpan(t.mma_done, t.staged, epilogue);
        AddSpan(t.staged, t.published, store);
        if (t.a_dependency >= 0) a_dependency.push_back(t.a_dependency);
      }
      if (count == 0) continue;
      const std::string kind_name = reduce ? "reduce" : part < 0 ? "gemm" : absl::StrCat("part ", part);
      out += absl::StrFormat("  %-12s %-7s %8d  %-13s  %-13s  %12s %10s %9s %6s %7s\n", node_names[node].substr(0, 12),
                             kind_name, count, fetched.ToString(), published.ToString(),
                             FormatMicros(Median(wait)), FormatMicros(Median(main_loop)),
                             FormatMicros(Median(epilogue)), FormatMicros(Median(store)),
                             FormatMicros(Median(a_dependency)));
    }
  }
  return out;
}

}  // namespace internal
}  // namespace loom
