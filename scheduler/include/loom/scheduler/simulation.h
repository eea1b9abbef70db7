// loom/scheduler/simulation.h: a simulated run of a Schedule by virtual SMs, to
// check on the CPU that a queue cannot deadlock and never reads unfinished
// data, whatever the interleaving.
//
// Model: `virtual_sms` workers (one per cluster of the real kernel) take job
// indices from a shared cursor, in queue order; with `static_first_wave`,
// worker i starts on index i and the cursor past the workers (the narrow
// kernel: CTA i takes queue index i before it reads the cursor). A worker
// executes its job in steps: a kReduce job first waits for its partials; a
// kGemm job then goes k-block by k-block, each step waiting for the producer
// tiles its A and B slices of that k-block read; the epilogue job then waits
// for its bias and residual tiles; then the job completes and publishes its
// flags. A worker
// whose next step needs an unpublished flag waits, holding its job. Each step
// of the simulation picks, with a PRNG seeded by `seed`, one worker that can
// act (take a job, advance one step, or complete). The run ends finished (all
// jobs done) or deadlocked (no worker can act).
//
// The checks are against the data, not only the flags: each producer tile and
// split-K partial is tracked by (node, m-block, n-block, split), and a step
// that proceeds (because its flags are set) but reads a tile not yet computed
// is a violation; so is a tile computed twice, or never. A tile reduced in
// parts is computed once every part has completed (and a part twice is a
// duplicate too).
//
//   loom::sched::SimulationResult r = loom::sched::Simulate(schedule, 132, seed);
//   EXPECT_TRUE(r.ok()) << r.Summary();
//
// For many seeds on one schedule, build a Simulator once and call Run().
#ifndef LOOM_SCHEDULER_SIMULATION_H_
#define LOOM_SCHEDULER_SIMULATION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/scheduler/schedule.h"

namespace loom::sched {

struct SimulationResult {
  bool finished = false;          // every job completed
  bool deadlock = false;          // stopped with no worker able to act
  int64_t jobs_completed = 0;
  int64_t steps = 0;              // actions taken
  int64_t waits = 0;              // times a worker had to wait on a flag
  int64_t unfinished_reads = 0;   // steps that read a tile not yet computed
  int64_t duplicate_tiles = 0;    // tiles (or partials) computed more than once
  int64_t missing_tiles = 0;      // tiles (or partials) never computed (finished runs)
  int32_t max_jobs_in_flight = 0;   // most jobs held by workers at once
  int32_t max_nodes_in_flight = 0;  // most distinct nodes among them at once (the wavefront)
  std::vector<std::string> problems;  // the first few violations / the deadlock, readable

  // Finished, no unfinished read, every tile exactly once.
  bool ok() const {
    return finished && !deadlock && unfinished_reads == 0 && duplicate_tiles == 0 &&
           missing_tiles == 0;
  }
  std::string Summary() const;
};

class Simulator {
 public:
  // Precomputes every job's steps (the flags and tiles each reads) once.
  explicit Simulator(const Schedule& schedule);
  ~Simulator();
  Simulator(const Simulator&) = delete;
  Simulator& operator=(const Simulator&) = delete;

  SimulationResult Run(int virtual_sms, uint64_t seed, bool static_first_wave = false) const;

 private:
  struct Plan;
  std::unique_ptr<const Plan> plan_;
};

// Simulator(schedule).Run(virtual_sms, seed).
SimulationResult Simulate(const Schedule& schedule, int virtual_sms, uint64_t seed);

}  // namespace loom::sched

#endif  // LOOM_SCHEDULER_SIMULATION_H_
