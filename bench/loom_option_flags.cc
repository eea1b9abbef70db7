#include "loom_option_flags.h"

#include "absl/flags/flag.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

ABSL_FLAG(int, a_stages, 0, "loom: the tiled kernel's A ring depth, 2 to 8 (0: chosen by the plan)");
ABSL_FLAG(int, b_stages, 0, "loom: the tiled kernel's B ring depth, 2 to 8 (0: chosen by the plan)");
ABSL_FLAG(int, max_clusters, 0,
          "loom: clusters to launch, CTAs on the narrow kernel (0: every co-resident one; "
          "CompileOptions::max_clusters)");
ABSL_FLAG(loom::KernelChoice, kernel, loom::KernelChoice::kAuto,
          "loom: auto, tiled or narrow (CompileOptions::kernel; narrow: the narrow decode kernel for graphs of at "
          "most 128 rows)");
ABSL_FLAG(int, tile_n, 0,
          "loom: the tiled kernel's tile width, 128 or 256 (0: the plan chooses; CompileOptions::tile_n)");
ABSL_FLAG(int, narrow_a_stages, 0,
          "loom: the narrow kernel's A ring depth (0: the longest job's A, within 128 KiB, 96 KiB for 9-32 rows; "
          "at most 6 stages with packed weights at up to 16 rows)");
ABSL_FLAG(int, narrow_b_stages, 0, "loom: the narrow kernel's B ring depth (0: what shared memory leaves)");
ABSL_FLAG(int, narrow_b_in_flight, 0,
          "loom: the narrow kernel's B stages in flight at most (0: chosen, 3 or 4; 1 to its B ring depth - 1)");
ABSL_FLAG(int, narrow_consumers, 0,
          "loom: the narrow kernel's consumer warpgroups, 1 or 2 taking the jobs in turn (0: chosen, "
          "CompileOptions::narrow_consumers)");
ABSL_FLAG(int, narrow_claim_stages, 0,
          "loom: the narrow kernel's claim pacing: a CTA claims its next job once its B loader has at most this many "
          "B stages of its last left to issue (0: off; CompileOptions::narrow_claim_stages)");
ABSL_FLAG(loom::PairSplitChoice, narrow_pair_split, loom::PairSplitChoice::kAuto,
          "loom: auto, on or off: the narrow kernel at 33-128 rows runs 64-column tiles over each half of K, the "
          "second half summing (past 64 rows one row block on both consumer warpgroups; auto: only there, on "
          "nodes of three quarters of a wave of jobs or more; CompileOptions::narrow_pair_split)");
ABSL_FLAG(bool, narrow_wide_split, false,
          "loom: the narrow kernel at 33-64 rows runs 128-column tiles over each quarter of K on both consumer "
          "warpgroups, the last quarter summing (CompileOptions::narrow_wide_split)");
ABSL_FLAG(bool, narrow_split_whole_tiles, false,
          "loom: with the pair split, a node of two waves of tiles or more splits only its last one to two waves' "
          "tiles, the others one job over all of K each (CompileOptions::narrow_split_whole_tiles)");
ABSL_FLAG(int, narrow_split_lead_k_blocks, 0,
          "loom: with the pair split, on a node of one wave of jobs, the first half of K this many k-blocks longer "
          "than the second (CompileOptions::narrow_split_lead_k_blocks)");
ABSL_FLAG(bool, pack_weights, false,
          "loom: copy the weights into the kernel's stage order at Compile (the tiled kernel: nodes of at most two "
          "row blocks, split rings; CompileOptions::pack_weights)");
ABSL_FLAG(bool, tagged_handoff, true,
          "loom: nodes of 1-2 rows on the narrow kernel poll their A as tagged words beside the producer's "
          "output (CompileOptions::tagged_handoff)");
ABSL_FLAG(bool, overlap_launches, true,
          "loom: launches overlap the end of the kernel before them (CompileOptions::overlap_launches)");
ABSL_FLAG(bool, reduce_in_parts, true,
          "loom: reduce a split-K tile of 17-128 rows in parts of 16 rows on as many clusters (false: one job)");
ABSL_FLAG(int, reduce_part_rows, 0, "loom: rows of each reduce part (0: the scheduler chooses; at most 16)");
ABSL_FLAG(bool, sum_in_last_split, true,
          "loom: a split-K tile summed whole has its last split sum it (false: a reduce job; "
          "CompileOptions::sum_in_last_split)");
ABSL_FLAG(int, last_split_extra, -1,
          "loom: k-blocks the summing last split takes beyond an even share (-1: the scheduler decides; "
          "CompileOptions::last_split_extra_k_blocks)");
ABSL_FLAG(int, split_k, 0, "loom: force this split-K factor on every node (0: the scheduler chooses)");
ABSL_FLAG(int, group_size, 0,
          "loom: force this raster group width, in cluster tiles, on every node (0: the scheduler chooses)");

namespace loom::bench {

CompileOptions LoomOptionsFromFlags() {
  CompileOptions options;
  options.a_stages = absl::GetFlag(FLAGS_a_stages);
  options.b_stages = absl::GetFlag(FLAGS_b_stages);
  options.tile_n = absl::GetFlag(FLAGS_tile_n);
  options.max_clusters = absl::GetFlag(FLAGS_max_clusters);
  options.kernel = absl::GetFlag(FLAGS_kernel);
  options.narrow_a_stages = absl::GetFlag(FLAGS_narrow_a_stages);
  options.narrow_b_stages = absl::GetFlag(FLAGS_narrow_b_stages);
  options.narrow_b_in_flight = absl::GetFlag(FLAGS_narrow_b_in_flight);
  options.narrow_consumers = absl::GetFlag(FLAGS_narrow_consumers);
  options.narrow_claim_stages = absl::GetFlag(FLAGS_narrow_claim_stages);
  options.narrow_pair_split = absl::GetFlag(FLAGS_narrow_pair_split);
  options.narrow_wide_split = absl::GetFlag(FLAGS_narrow_wide_split);
  options.narrow_split_whole_tiles = absl::GetFlag(FLAGS_narrow_split_whole_tiles);
  options.narrow_split_lead_k_blocks = absl::GetFlag(FLAGS_narrow_split_lead_k_blocks);
  options.pack_weights = absl::GetFlag(FLAGS_pack_weights);
  options.tagged_handoff = absl::GetFlag(FLAGS_tagged_handoff);
  options.overlap_launches = absl::GetFlag(FLAGS_overlap_launches);
  options.reduce_in_parts = absl::GetFlag(FLAGS_reduce_in_parts);
  options.reduce_part_rows = absl::GetFlag(FLAGS_reduce_part_rows);
  options.sum_in_last_split = absl::GetFlag(FLAGS_sum_in_last_split);
  options.last_split_extra_k_blocks = absl::GetFlag(FLAGS_last_split_extra);
  options.split_k = absl::GetFlag(FLAGS_split_k);
  options.group_size = absl::GetFlag(FLAGS_group_size);
  return options;
}

void ListBenchFlagsInHelp() {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) { return absl::StrContains(file, "bench/"); };
  config.contains_helpshort_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace loom::bench
