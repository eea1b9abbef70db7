// The kernels' waits replayed on the CPU (see kernel_waits.h).
#include "testbed/kernel_waits.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "internal/plan_impl.h"
#include "kernel_config.h"
#include "kernel_params.h"
#include "loom/scheduler/job_access.h"
#include "narrow_config.h"

namespace loom::testbed {
namespace {

// The producer tile flags elements [row0, row1) x [col0, col1) of `operand`
// (A unless said) read, over every edge of `node` on that operand.
std::set<int32_t> FlagsRead(const sched::Schedule& schedule, const sched::NodeSchedule& node, int64_t row0,
                            int64_t row1, int64_t col0, int64_t col1,
                            sched::DependencyOperand operand = sched::DependencyOperand::kA) {
  std::set<int32_t> flags;
  for (int d = 0; d < node.dependency_count; ++d) {
    const sched::DependencyEdge& edge = schedule.dependencies[node.dependency_begin + d];
    if (edge.operand != static_cast<uint8_t>(operand)) continue;
    const sched::NodeSchedule& producer = schedule.nodes[edge.producer];
    const sched::TileBox box = sched::ProducerTiles(producer, schedule.tile, edge, row0, row1, col0, col1);
    for (int m = box.m_begin; m < box.m_end; ++m) {
      for (int n = box.n_begin; n < box.n_end; ++n) flags.insert(sched::OutputFlagIndex(producer, m, n));
    }
  }
  return flags;
}

// Replays the A loader of one job's CTA (the row block from row0, k-blocks
// [kb_begin, kb_end)) and returns the first k-block that reads a producer
// tile not known done when it is loaded, as a message ("" when none). Adds
// the flags it waited for to `waited`.
template <class Config>
std::string ReplayALoader(const sched::Schedule& schedule, const kernel::KernelNode& record, int64_t row0,
                          int kb_begin, int kb_end, bool narrow, std::set<int32_t>* waited) {
  const sched::NodeSchedule& node = record.schedule;
  const int wait = node.a_wait_k_blocks;
  auto producer_of = [&](int p) -> const sched::NodeSchedule& { return schedule.nodes[p]; };
  // KnownARun: the run and the k-block it was found at.
  int known_kb = -1;
  sched::AFlagRun known;
  // The narrow kernel seeds a job spanning K of row block 0 or 1 with the
  // runtime's first run (narrow_gemm.cu); the tiled one reads it in
  // AProducerRunOf.
  const int64_t m_block = row0 / schedule.tile.m;
  if (narrow && kb_begin == 0 && kb_end == node.k_blocks && m_block < 2 &&
      record.first_a_run[m_block].granules > 0) {
    const kernel::KernelNode::FirstARun& first = record.first_a_run[m_block];
    known_kb = 0;
    known = {first.first_flag, first.granules, 1 << first.tiles_shift, first.tiles_shift};
  }
  std::set<int32_t>& done = *waited;
  for (int kb = kb_begin; kb < kb_end;) {
    if (known_kb < 0 || kb / wait - known_kb / wait >= known.granules) {
      known = kernel::AProducerRunOf<Config::kBlockM, Config::kBlockK, Config::kMaxTilesPerGranule>(
          record, schedule.dependencies.data(), producer_of, schedule.tile, row0, kb, kb_end);
      known_kb = kb;
    }
    const int skipped = kb / wait - known_kb / wait;
    if (known.granules - skipped <= 0) {
      // WaitForProducers over kb's own k-block, every edge.
      const std::set<int32_t> box =
          FlagsRead(schedule, node, row0, row0 + schedule.tile.m, int64_t{kb} * schedule.tile.k,
                    int64_t{kb + 1} * schedule.tile.k);
      done.insert(box.begin(), box.end());
    } else {
      // The poll found one granule complete: the run's next.
      const int32_t first = known.first_flag + skipped * known.tiles_per_granule;
      for (int t = 0; t < known.tiles_per_granule; ++t) done.insert(first + t);
    }
    const int next = std::min((kb / wait + 1) * wait, kb_end);
    for (; kb < next; ++kb) {
      // What the k-block's TMA load reads: A's rows and columns inside A.
      const int64_t row1 = std::min<int64_t>(row0 + schedule.tile.m, node.m);
      const int64_t col0 = int64_t{kb} * schedule.tile.k;
      const int64_t col1 = std::min<int64_t>(col0 + schedule.tile.k, node.k);
      if (row0 >= row1 || col0 >= col1) continue;
      for (int32_t flag : FlagsRead(schedule, node, row0, row1, col0, col1)) {
        if (!done.count(flag)) {
          return absl::StrCat("rows from ", row0, ", k-blocks [", kb_begin, ", ", kb_end, "): k-block ", kb,
                              " reads producer tile flag ", flag, ", not known done");
        }
      }
    }
  }
  return "";
}

}  // namespace

CtaWaits ReplayCta(const Plan& plan, const sched::Schedule& schedule, const sched::TileJob& job, int rank) {
  const bool narrow = plan.kernel() == KernelChoice::kNarrow;
  const sched::NodeSchedule& node = schedule.nodes[job.node];
  const sched::CtaTile tile = sched::CtaTileOf(job, node.share, rank);
  const int64_t row0 = int64_t{tile.m_block} * schedule.tile.m;
  CtaWaits waits;
  if (node.dependency_count == 0) return waits;
  using Op = sched::DependencyOperand;
  const auto add = [&](const std::set<int32_t>& flags) { waits.flags.insert(flags.begin(), flags.end()); };
  const int64_t out_col0 = int64_t{tile.n_block} * node.out_tile_n;
  add(FlagsRead(schedule, node, row0, row0 + schedule.tile.m, out_col0, out_col0 + node.out_tile_n, Op::kResidual));
  const int64_t n_row0 = int64_t{tile.n_block} * schedule.tile.n;
  add(FlagsRead(schedule, node, 0, 1, n_row0, n_row0 + schedule.tile.n, Op::kBias));
  if (sched::HasProducerOperand(node, Op::kA)) {
    kernel::KernelNode record;
    record.schedule = node;
    record.a_producer = internal::AProducerOf(schedule, job.node);
    internal::FirstARunsOf(schedule, job.node, record.a_producer, narrow, record.first_a_run);
    waits.unsound = narrow ? ReplayALoader<kernel::NarrowConfig>(schedule, record, row0, job.k_block_begin,
                                                                 job.k_block_end, true, &waits.flags)
                           : ReplayALoader<kernel::KernelConfig>(schedule, record, row0, job.k_block_begin,
                                                                 job.k_block_end, false, &waits.flags);
  }
  for (int kb = job.k_block_begin; kb < job.k_block_end; ++kb) {
    add(FlagsRead(schedule, node, n_row0, n_row0 + schedule.tile.n, int64_t{kb} * schedule.tile.k,
                  int64_t{kb + 1} * schedule.tile.k, Op::kB));
  }
  return waits;
}

std::vector<std::string> UnsoundWaits(const Plan& plan, const sched::Schedule& schedule) {
  std::vector<std::string> failures;
  for (const sched::TileJob& job : schedule.queue) {
    if (job.kind != static_cast<uint8_t>(sched::JobKind::kGemm)) continue;
    if (!sched::HasProducerOperand(schedule.nodes[job.node], sched::DependencyOperand::kA)) continue;
    for (int rank = 0; rank < schedule.cluster_size; ++rank) {
      const std::string failure = ReplayCta(plan, schedule, job, rank).unsound;
      if (!failure.empty() && failures.size() < 4) {
        failures.push_back(absl::StrCat("node ", plan.graph().nodes()[job.node].name, " ", failure));
      }
    }
  }
  return failures;
}

std::vector<std::string> WaitsOutOfQueueOrder(const Plan& plan, const sched::Schedule& schedule) {
  std::map<int32_t, size_t> last_writer;  // flag -> the last queue position that publishes it
  for (size_t position = 0; position < schedule.queue.size(); ++position) {
    std::vector<sched::FlagWrite> writes;
    sched::AppendJobWrites(schedule, schedule.queue[position], &writes);
    for (const sched::FlagWrite& write : writes) last_writer[write.flag] = position;
  }
  std::vector<std::string> failures;
  for (size_t position = 0; position < schedule.queue.size() && failures.size() < 4; ++position) {
    const sched::TileJob& job = schedule.queue[position];
    if (job.kind != static_cast<uint8_t>(sched::JobKind::kGemm)) continue;
    for (int rank = 0; rank < schedule.cluster_size; ++rank) {
      for (const int32_t flag : ReplayCta(plan, schedule, job, rank).flags) {
        const auto writer = last_writer.find(flag);
        if (writer != last_writer.end() && writer->second < position) continue;
        failures.push_back(absl::StrCat(
            "queue #", position, " (node ", plan.graph().nodes()[job.node].name, ", row block ",
            sched::CtaTileOf(job, schedule.nodes[job.node].share, rank).m_block, ", column block ",
            sched::CtaTileOf(job, schedule.nodes[job.node].share, rank).n_block, ", k-blocks [", job.k_block_begin,
            ", ", job.k_block_end, ")) waits for flag ", flag, ", ",
            writer == last_writer.end() ? std::string("which no job publishes")
                                        : absl::StrCat("published at #", writer->second)));
        break;
      }
    }
  }
  return failures;
}

}  // namespace loom::testbed
