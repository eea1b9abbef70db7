// A simulated run of a Schedule by virtual SMs (see simulation.h).
#include "loom/scheduler/simulation.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "loom/scheduler/job_access.h"

namespace loom::sched {

// Every job's steps, flattened. A read names both the flag the kernel waits on
// and the data unit it actually reads; the two are tracked separately so that a
// schedule whose flags do not match its data (a wrong flag_base, a missing job)
// shows up as an unfinished read rather than passing silently.
struct Simulator::Plan {
  struct Read {
    int32_t flag;   // -1: outside [0, num_flags)
    int32_t unit;   // data unit: a producer tile or a split-K partial
    FlagRead what;  // for messages
  };
  struct Write {
    int32_t flag;
    int32_t unit;
    int32_t part;     // of `writers` jobs that write the unit (FlagWrite)
    int32_t writers;
  };
  std::vector<TileJob> queue;
  int32_t num_flags = 0;
  int32_t num_nodes = 0;
  int64_t num_units = 0;
  std::vector<int64_t> step_begin;  // per job, into read_begin; one extra at the end
  std::vector<int64_t> read_begin;  // per step, into reads; one extra at the end
  std::vector<Read> reads;
  std::vector<int64_t> write_begin;  // per job, into writes
  std::vector<Write> writes;
  std::vector<std::string> setup_problems;
};

namespace {

std::string DescribeJob(const TileJob& job, int64_t position) {
  return absl::StrCat("queue job #", position, " (node ", job.node,
                      job.kind == static_cast<uint8_t>(JobKind::kReduce) ? " reduce" : " gemm", " m", job.m_block,
                      " n", job.n_block, " k[", job.k_block_begin, ",", job.k_block_end, ")",
                      job.kind == static_cast<uint8_t>(JobKind::kGemm) ? " split " : " part ", job.split,
                      ")");
}

std::string DescribeRead(const FlagRead& r) {
  return absl::StrCat("node ", r.producer, " tile (", r.m_block, ", ", r.n_block, ")",
                      r.split >= 0 ? absl::StrCat(" partial ", r.split) : "", " [flag ", r.flag, "]");
}

}  // namespace

Simulator::Simulator(const Schedule& schedule) {
  auto plan = std::make_unique<Plan>();
  plan->queue = schedule.queue;
  plan->num_flags = schedule.num_flags;
  plan->num_nodes = static_cast<int32_t>(schedule.nodes.size());

  // Data units, numbered by the simulator itself (not from flag_base).
  std::vector<int64_t> output_unit_base(schedule.nodes.size()), partial_unit_base(schedule.nodes.size());
  int64_t units = 0;
  for (size_t i = 0; i < schedule.nodes.size(); ++i) {
    output_unit_base[i] = units;
    units += int64_t{schedule.nodes[i].m_blocks} * schedule.nodes[i].n_blocks;
  }
  for (size_t i = 0; i < schedule.nodes.size(); ++i) {
    partial_unit_base[i] = units;
    units += int64_t{schedule.nodes[i].m_blocks} * schedule.nodes[i].n_blocks * PartialSlices(schedule.nodes[i]);
  }
  plan->num_units = units;
  auto unit_of = [&](int32_t node, int32_t mb, int32_t nb, int32_t split) -> int32_t {
    const NodeSchedule& n = schedule.nodes[node];
    const int64_t t = int64_t{mb} * n.n_blocks + nb;
    return static_cast<int32_t>(split < 0 ? output_unit_base[node] + t
                                          : partial_unit_base[node] + t * PartialSlices(n) + split);
  };
  auto flag_or_invalid = [&](int32_t flag) { return flag >= 0 && flag < schedule.num_flags ? flag : -1; };

  std::vector<FlagRead> step_reads;
  auto add_step = [&](const TileJob& job, int32_t kb0, int32_t kb1, ReadPhase phase) {
    step_reads.clear();
    AppendJobReads(schedule, job, kb0, kb1, phase, &step_reads);
    std::sort(step_reads.begin(), step_reads.end(), [](const FlagRead& a, const FlagRead& b) {
      return std::tie(a.flag, a.producer, a.m_block, a.n_block, a.split) <
             std::tie(b.flag, b.producer, b.m_block, b.n_block, b.split);
    });
    for (size_t i = 0; i < step_reads.size(); ++i) {
      const FlagRead& r = step_reads[i];
      if (i > 0 && r.flag == step_reads[i - 1].flag && r.producer == step_reads[i - 1].producer &&
          r.m_block == step_reads[i - 1].m_block && r.n_block == step_reads[i - 1].n_block &&
          r.split == step_reads[i - 1].split) {
        continue;
      }
      plan->reads.push_back(Plan::Read{flag_or_invalid(r.flag), unit_of(r.producer, r.m_block, r.n_block, r.split), r});
    }
    plan->read_begin.push_back(static_cast<int64_t>(plan->reads.size()));
  };

  plan->read_begin.push_back(0);
  plan->step_begin.push_back(0);
  plan->write_begin.push_back(0);
  std::vector<FlagWrite> job_writes;
  for (size_t p = 0; p < schedule.queue.size(); ++p) {
    const TileJob& job = schedule.queue[p];
    if (job.node >= schedule.nodes.size()) {
      plan->setup_problems.push_back(absl::StrCat(DescribeJob(job, p), " names a node that does not exist"));
      plan->step_begin.push_back(static_cast<int64_t>(plan->read_begin.size()) - 1);
      plan->write_begin.push_back(static_cast<int64_t>(plan->writes.size()));
      continue;
    }
    // As the kernel: a kGemm job waits for its epilogue inputs' producers
    // before its first load (and the last split of a node whose last split
    // sums for the other splits' partials after its main loop), a kReduce
    // job reads them after its partials.
    if (job.kind == static_cast<uint8_t>(JobKind::kReduce)) {
      add_step(job, 0, 0, ReadPhase::kPartials);
      add_step(job, 0, 0, ReadPhase::kEpilogue);
    } else {
      add_step(job, 0, 0, ReadPhase::kEpilogue);
      for (int32_t kb = job.k_block_begin; kb < job.k_block_end; ++kb) {
        add_step(job, kb, kb + 1, ReadPhase::kMainLoop);
      }
      if (FinishesSplitTile(schedule.nodes[job.node], job)) add_step(job, 0, 0, ReadPhase::kPartials);
    }
    plan->step_begin.push_back(static_cast<int64_t>(plan->read_begin.size()) - 1);

    job_writes.clear();
    AppendJobWrites(schedule, job, &job_writes);
    for (const FlagWrite& w : job_writes) {
      plan->writes.push_back(
          Plan::Write{flag_or_invalid(w.flag), unit_of(job.node, w.m_block, w.n_block, w.split), w.part, w.writers});
    }
    plan->write_begin.push_back(static_cast<int64_t>(plan->writes.size()));
  }
  plan_ = std::move(plan);
}

Simulator::~Simulator() = default;

SimulationResult Simulator::Run(int virtual_sms, uint64_t seed, bool static_first_wave) const {
  const Plan& plan = *plan_;
  SimulationResult result;
  for (const std::string& p : plan.setup_problems) result.problems.push_back(p);
  auto note = [&](std::string problem) {
    if (result.problems.size() < 8) result.problems.push_back(std::move(problem));
  };

  const int workers = std::max(virtual_sms, 1);
  const int64_t num_jobs = static_cast<int64_t>(plan.queue.size());
  std::mt19937_64 rng(seed);

  std::vector<char> flag_set(static_cast<size_t>(std::max(plan.num_flags, 0)), 0);
  std::vector<int32_t> flag_waiters(flag_set.size(), -1);  // head of a list of workers, linked by next_waiter
  std::vector<int32_t> next_waiter(workers, -1);
  std::vector<int32_t> unit_done(static_cast<size_t>(plan.num_units), 0);
  std::vector<uint32_t> unit_parts(unit_done.size(), 0);  // parts written, one bit each (reduce parts)
  std::vector<int64_t> job_of(workers, -1), step_of(workers, 0), read_of(workers, 0);
  std::vector<int32_t> node_in_flight(static_cast<size_t>(plan.num_nodes) + 1, 0);
  int32_t jobs_in_flight = 0, nodes_in_flight = 0;

  // Workers that can act, with each one's position in it (-1: not in it).
  std::vector<int32_t> can_act(workers), position(workers);
  for (int w = 0; w < workers; ++w) can_act[w] = position[w] = w;
  auto remove = [&](int32_t w) {
    const int32_t at = position[w];
    can_act[at] = can_act.back();
    position[can_act[at]] = at;
    can_act.pop_back();
    position[w] = -1;
  };
  auto add = [&](int32_t w) {
    position[w] = static_cast<int32_t>(can_act.size());
    can_act.push_back(w);
  };
  auto node_slot = [&](int64_t j) {
    return std::min<int32_t>(plan.queue[j].node, plan.num_nodes);
  };

  int64_t cursor = 0;
  auto take = [&](int32_t w, int64_t j) {
    job_of[w] = j;
    step_of[w] = plan.step_begin[j];
    read_of[w] = plan.read_begin[step_of[w]];
    if (node_in_flight[node_slot(j)]++ == 0) ++nodes_in_flight;
    ++jobs_in_flight;
    result.max_jobs_in_flight = std::max(result.max_jobs_in_flight, jobs_in_flight);
    result.max_nodes_in_flight = std::max(result.max_nodes_in_flight, nodes_in_flight);
  };
  if (static_first_wave) {
    for (int32_t w = 0; w < workers && w < num_jobs; ++w) take(w, w);
    cursor = workers;  // the dynamic fetches start past the grid
  }
  while (!can_act.empty()) {
    const int32_t w = can_act[rng() % can_act.size()];
    ++result.steps;
    if (job_of[w] < 0) {  // idle: take the next job, or leave
      if (cursor >= num_jobs) {
        remove(w);
        continue;
      }
      take(w, cursor++);
      continue;
    }
    const int64_t j = job_of[w];
    if (step_of[w] < plan.step_begin[j + 1]) {  // the next step: wait for its flags, then read
      const int64_t step = step_of[w];
      const int64_t end = plan.read_begin[step + 1];
      bool waiting = false;
      for (int64_t r = read_of[w]; r < end; ++r) {
        const int32_t flag = plan.reads[r].flag;
        if (flag >= 0 && !flag_set[flag]) {
          read_of[w] = r;
          next_waiter[w] = flag_waiters[flag];
          flag_waiters[flag] = w;
          remove(w);
          ++result.waits;
          waiting = true;
          break;
        }
      }
      if (waiting) continue;
      for (int64_t r = plan.read_begin[step]; r < end; ++r) {
        const Plan::Read& read = plan.reads[r];
        if (read.flag < 0) {
          ++result.unfinished_reads;
          note(absl::StrCat(DescribeJob(plan.queue[j], j), " reads ", DescribeRead(read.what),
                            " whose flag is outside [0, ", plan.num_flags, ")"));
        } else if (unit_done[read.unit] == 0) {
          ++result.unfinished_reads;
          note(absl::StrCat(DescribeJob(plan.queue[j], j), " reads ", DescribeRead(read.what),
                            " before it is computed (its flag is set)"));
        }
      }
      step_of[w] = step + 1;
      read_of[w] = end;
      continue;
    }
    // Complete: publish the data, then the flags (release), then wake waiters.
    for (int64_t i = plan.write_begin[j]; i < plan.write_begin[j + 1]; ++i) {
      const Plan::Write& write = plan.writes[i];
      if (write.writers > 1) {  // one part of the unit: whole once every part is in
        const uint32_t bit = uint32_t{1} << write.part;
        if (unit_parts[write.unit] & bit) {
          ++result.duplicate_tiles;
          note(absl::StrCat(DescribeJob(plan.queue[j], j), " computes part ", write.part, " of data unit ",
                            write.unit, " a second time"));
          continue;
        }
        unit_parts[write.unit] |= bit;
        if (unit_parts[write.unit] != (uint32_t{1} << write.writers) - 1) continue;
      }
      if (++unit_done[write.unit] > 1) {
        ++result.duplicate_tiles;
        note(absl::StrCat(DescribeJob(plan.queue[j], j), " computes data unit ", write.unit, " a second time"));
      }
      if (write.flag < 0) continue;
      flag_set[write.flag] = 1;
      for (int32_t waiter = flag_waiters[write.flag]; waiter >= 0; waiter = next_waiter[waiter]) add(waiter);
      flag_waiters[write.flag] = -1;
    }
    ++result.jobs_completed;
    if (--node_in_flight[node_slot(j)] == 0) --nodes_in_flight;
    --jobs_in_flight;
    job_of[w] = -1;
  }

  result.finished = result.jobs_completed == num_jobs;
  result.deadlock = !result.finished;
  if (result.deadlock) {
    note(absl::StrCat("deadlock after ", result.steps, " steps: ", result.jobs_completed, " of ", num_jobs,
                      " jobs done, ", std::min(cursor, num_jobs), " dequeued"));
    for (int w = 0; w < workers && result.problems.size() < 8; ++w) {
      if (job_of[w] < 0) continue;
      const Plan::Read& read = plan.reads[read_of[w]];
      note(absl::StrCat("worker ", w, " holds ", DescribeJob(plan.queue[job_of[w]], job_of[w]), " waiting on ",
                        DescribeRead(read.what)));
    }
  } else {
    for (int64_t u = 0; u < plan.num_units; ++u) {
      if (unit_done[u] == 0) {
        ++result.missing_tiles;
        note(absl::StrCat("data unit ", u, " is never computed"));
      }
    }
  }
  if (!plan.setup_problems.empty()) ++result.unfinished_reads;  // a job of no node is an error too
  return result;
}

std::string SimulationResult::Summary() const {
  std::string s = absl::StrCat(finished ? "finished" : "DEADLOCK", ": ", jobs_completed, " jobs, ", steps,
                               " steps, ", waits, " waits, unfinished reads ", unfinished_reads,
                               ", duplicate tiles ", duplicate_tiles, ", missing tiles ", missing_tiles,
                               ", max jobs in flight ", max_jobs_in_flight, ", max nodes in flight ",
                               max_nodes_in_flight);
  for (const std::string& p : problems) absl::StrAppend(&s, "\n  ", p);
  return s;
}

SimulationResult Simulate(const Schedule& schedule, int virtual_sms, uint64_t seed) {
  return Simulator(schedule).Run(virtual_sms, seed);
}

}  // namespace loom::sched
