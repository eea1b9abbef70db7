#include "testbed/random_options.h"

#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_format.h"

namespace loom::testbed {

CompileOptions RandomCompileOptions(Rng& rng, OptionRanges ranges) {
  CompileOptions options;
  if (OneIn(rng, 4)) return options;
  options.kernel = Pick(rng, {KernelChoice::kAuto, KernelChoice::kTiled, KernelChoice::kNarrow});
  options.ring_mode = OneIn(rng, 4) ? RingMode::kLockstep : RingMode::kSplit;
  if (ranges == OptionRanges::kAny && OneIn(rng, 4)) {
    options.a_stages = Pick(rng, {-1, 0, 1, 2, 3, 4, 5, 8, 16, 40});
    options.b_stages = Pick(rng, {-1, 0, 1, 2, 3, 4, 5, 8, 16, 40});
    options.max_clusters = Pick(rng, {-1, 0, 1, 2, 33, 66, 67, 132, 133, 1000});
    options.split_k = Pick(rng, {-1, 0, 1, 2, 3, 8, 64, 100000});
    options.tile_n = Pick(rng, {-1, 0, 64, 128, 256, 512});
    options.group_size = Pick(rng, {-1, 0, 1, 3, 16, 1000});
    options.reduce_part_rows = Pick(rng, {-1, 0, 1, 8, 16, 17});
    options.narrow_a_stages = Pick(rng, {-1, 0, 1, 2, 5, 16, 17});
    options.narrow_b_stages = Pick(rng, {-1, 0, 1, 2, 5, 16, 17});
    options.narrow_b_in_flight = Pick(rng, {-1, 0, 1, 2, 3, 15, 20});
    options.narrow_consumers = Pick(rng, {-1, 0, 1, 2, 3});
    options.narrow_claim_stages = Pick(rng, {-1, 0, 1, 8, kMaxNarrowClaimStages, kMaxNarrowClaimStages + 1});
    options.spin_timeout_ns = Pick<int64_t>(rng, {-5, 0, 1, 2'000'000'000, kMaxSpinTimeoutNs, int64_t{1} << 62});
  } else {
    options.a_stages = Pick(rng, {0, 0, 2, 3, 4, 5, 7});
    options.b_stages = options.ring_mode == RingMode::kLockstep ? options.a_stages : Pick(rng, {0, 0, 2, 3, 4, 5});
    options.max_clusters = Pick(rng, {0, 0, 1, 2, 7, 33});
    options.split_k = Pick(rng, {0, 0, 1, 2, 3});
    options.tile_n = Pick(rng, {0, 0, 128, 256});
    options.group_size = Pick(rng, {0, 1, 3});
    options.reduce_part_rows = Pick(rng, {0, 8, 16});
    options.narrow_a_stages = Pick(rng, {0, 0, 2, 4, 6});
    options.narrow_b_stages = Pick(rng, {0, 0, 4, 8});
    options.narrow_b_in_flight = Pick(rng, {0, 0, 1, 3});
    options.narrow_consumers = Pick(rng, {0, 0, 1, 2});
    options.narrow_claim_stages = Pick(rng, {0, 0, 1, 4, 8, kMaxNarrowClaimStages});
  }
  options.reduce_in_parts = !OneIn(rng, 3);
  options.sum_in_last_split = !OneIn(rng, 3);
  options.last_split_extra_k_blocks = Pick(rng, {-1, -1, 0, 3});
  options.pack_weights = OneIn(rng, 2);
  options.narrow_pair_split =
      Pick(rng, {PairSplitChoice::kAuto, PairSplitChoice::kAuto, PairSplitChoice::kOn, PairSplitChoice::kOff});
  // Beside the pair split's kOn, refused (compile_fuzz_test: a clean refusal).
  options.narrow_wide_split = OneIn(rng, 4);
  // Without the pair split or beside the wide split, refused (compile_fuzz_test: a clean refusal).
  options.narrow_split_whole_tiles = OneIn(rng, 3);
  // Rounded onto the ring stages where it is taken; outside [0, 65535], without
  // the pair split or beside what else sets its halves, refused
  // (compile_fuzz_test: a clean refusal). Usable: only where it may be set,
  // so that it costs the soak no plans.
  const bool lead_allowed = options.narrow_pair_split != PairSplitChoice::kOff && !options.narrow_wide_split &&
                            options.last_split_extra_k_blocks <= 0;
  if (ranges == OptionRanges::kAny && OneIn(rng, 4)) {
    options.narrow_split_lead_k_blocks = Pick(rng, {-1, 4, 8, 65536, std::numeric_limits<int>::max()});
  } else if (lead_allowed) {
    options.narrow_split_lead_k_blocks = Pick(rng, {0, 0, 8, 24});
  }
  options.tagged_handoff = !OneIn(rng, 3);
  options.overlap_launches = !OneIn(rng, 3);
  options.trace = OneIn(rng, 4);
  return options;
}

std::string DescribeOptions(const CompileOptions& options) {
  return absl::StrFormat(
      "kernel %s, ring %s, stages %d/%d, max_clusters %d, split_k %d, tile_n %d, group %d, reduce in parts %d of "
      "%d rows, last split sums %d (extra %d), narrow stages %d/%d, %d in flight, %d consumers, claim at %d, "
      "pair split %s, wide split %d, whole tiles %d, lead %d, pack %d, tagged %d, overlap %d, timeout %d ns, trace %d",
      AbslUnparseFlag(options.kernel), options.ring_mode == RingMode::kSplit ? "split" : "lockstep",
      options.a_stages, options.b_stages, options.max_clusters, options.split_k, options.tile_n, options.group_size,
      options.reduce_in_parts, options.reduce_part_rows, options.sum_in_last_split,
      options.last_split_extra_k_blocks, options.narrow_a_stages,
      options.narrow_b_stages,
      options.narrow_b_in_flight, options.narrow_consumers, options.narrow_claim_stages,
      AbslUnparseFlag(options.narrow_pair_split), options.narrow_wide_split, options.narrow_split_whole_tiles,
      options.narrow_split_lead_k_blocks, options.pack_weights,
      options.tagged_handoff, options.overlap_launches, options.spin_timeout_ns, options.trace);
}

}  // namespace loom::testbed
