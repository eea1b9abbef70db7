// timeline.cc: reading back and summarising the job traces of a launch
// (CompileOptions::trace).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "internal/cuda_status.h"
#include "internal/plan_impl.h"
#include "loom/runtime.h"
#include "loom/status.h"

namespace loom {
namespace {

// Median of the values that are not negative (events that happened); -1 if none.
double Median(std::vector<double> values) {
  values.erase(std::remove_if(values.begin(), values.end(), [](double v) { return v < 0; }), values.end());
  if (values.empty()) return -1;
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

// later - earlier when both events happened, else -1.
double Span(double earlier, double later) { return earlier >= 0 && later >= 0 ? later - earlier : -1; }

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

std::string FormatMicros(double us) { return us < 0 ? std::string("-") : absl::StrFormat("%.1f us", us); }

}  // namespace

absl::StatusOr<std::vector<JobTrace>> Plan::Timeline() const {
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
    trace.fetched = micros(r.fetched);
    trace.data_ready = micros(r.data_ready);
    trace.mma_done = micros(r.mma_done);
    trace.staged = micros(r.staged);
    trace.published = micros(r.published);
    out.push_back(trace);
  }
  return out;
}

absl::StatusOr<std::string> Plan::ExplainTimeline() const {
  absl::StatusOr<std::vector<JobTrace>> timeline = Timeline();
  if (!timeline.ok()) return timeline.status();
  Range launch;
  for (const JobTrace& t : *timeline) {
    launch.Add(t.fetched);
    launch.Add(t.published);
  }
  std::string out = absl::StrFormat(
      "timeline (us from the first job fetch; %%globaltimer, ~1 us ticks): %d CTA-jobs, last store at %s\n",
      static_cast<int>(timeline->size()), FormatMicros(launch.last));
  out += "  node / kind          CTA-jobs  fetched        published      median: wait  main loop  epilogue  store\n";
  for (int node = 0; node < impl_->graph.size(); ++node) {
    for (bool reduce : {false, true}) {
      Range fetched, published;
      std::vector<double> wait, main_loop, epilogue, store;
      int count = 0;
      for (const JobTrace& t : *timeline) {
        if (t.node != node || t.reduce != reduce) continue;
        ++count;
        fetched.Add(t.fetched);
        published.Add(t.published);
        wait.push_back(Span(t.fetched, t.data_ready));
        main_loop.push_back(Span(t.data_ready, t.mma_done));
        epilogue.push_back(Span(t.mma_done, t.staged));
        store.push_back(Span(t.staged, t.published));
      }
      if (count == 0) continue;
      out += absl::StrFormat("  %-12s %-7s %8d  %-13s  %-13s  %12s %10s %9s %6s\n",
                             impl_->graph.nodes()[node].name.substr(0, 12), reduce ? "reduce" : "gemm", count,
                             fetched.ToString(), published.ToString(), FormatMicros(Median(wait)),
                             FormatMicros(Median(main_loop)), FormatMicros(Median(epilogue)),
                             FormatMicros(Median(store)));
    }
  }
  return out;
}

}  // namespace loom
