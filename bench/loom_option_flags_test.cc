// bench/loom_option_flags_test.cc: each of the benchmarks' shared loom option
// flags reaches its own CompileOptions field (LoomOptionsFromFlags), and the
// defaults are CompileOptions' own. CPU only: no GPU, no Compile.
#include "loom_option_flags.h"

#include <gtest/gtest.h>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"

ABSL_DECLARE_FLAG(int, a_stages);
ABSL_DECLARE_FLAG(int, b_stages);
ABSL_DECLARE_FLAG(int, max_clusters);
ABSL_DECLARE_FLAG(loom::KernelChoice, kernel);
ABSL_DECLARE_FLAG(int, tile_n);
ABSL_DECLARE_FLAG(int, narrow_a_stages);
ABSL_DECLARE_FLAG(int, narrow_b_stages);
ABSL_DECLARE_FLAG(int, narrow_b_in_flight);
ABSL_DECLARE_FLAG(int, narrow_consumers);
ABSL_DECLARE_FLAG(int, narrow_claim_stages);
ABSL_DECLARE_FLAG(loom::PairSplitChoice, narrow_pair_split);
ABSL_DECLARE_FLAG(bool, narrow_wide_split);
ABSL_DECLARE_FLAG(bool, narrow_split_whole_tiles);
ABSL_DECLARE_FLAG(int, narrow_split_lead_k_blocks);
ABSL_DECLARE_FLAG(bool, pack_weights);
ABSL_DECLARE_FLAG(bool, tagged_handoff);
ABSL_DECLARE_FLAG(bool, overlap_launches);
ABSL_DECLARE_FLAG(bool, reduce_in_parts);
ABSL_DECLARE_FLAG(int, reduce_part_rows);
ABSL_DECLARE_FLAG(bool, sum_in_last_split);
ABSL_DECLARE_FLAG(int, last_split_extra);
ABSL_DECLARE_FLAG(int, split_k);
ABSL_DECLARE_FLAG(int, group_size);

namespace loom::bench {
namespace {

// With no flag given, the options are CompileOptions' defaults.
TEST(LoomOptionFlagsTest, DefaultsAreCompileOptionsDefaults) {
  absl::FlagSaver saver;
  const CompileOptions defaults;
  const CompileOptions options = LoomOptionsFromFlags();
  EXPECT_EQ(options.a_stages, defaults.a_stages);
  EXPECT_EQ(options.b_stages, defaults.b_stages);
  EXPECT_EQ(options.max_clusters, defaults.max_clusters);
  EXPECT_EQ(options.kernel, defaults.kernel);
  EXPECT_EQ(options.tile_n, defaults.tile_n);
  EXPECT_EQ(options.narrow_a_stages, defaults.narrow_a_stages);
  EXPECT_EQ(options.narrow_b_stages, defaults.narrow_b_stages);
  EXPECT_EQ(options.narrow_b_in_flight, defaults.narrow_b_in_flight);
  EXPECT_EQ(options.narrow_consumers, defaults.narrow_consumers);
  EXPECT_EQ(options.narrow_claim_stages, defaults.narrow_claim_stages);
  EXPECT_EQ(options.narrow_pair_split, defaults.narrow_pair_split);
  EXPECT_EQ(options.narrow_wide_split, defaults.narrow_wide_split);
  EXPECT_EQ(options.narrow_split_whole_tiles, defaults.narrow_split_whole_tiles);
  EXPECT_EQ(options.narrow_split_lead_k_blocks, defaults.narrow_split_lead_k_blocks);
  EXPECT_EQ(options.pack_weights, defaults.pack_weights);
  EXPECT_EQ(options.tagged_handoff, defaults.tagged_handoff);
  EXPECT_EQ(options.overlap_launches, defaults.overlap_launches);
  EXPECT_EQ(options.reduce_in_parts, defaults.reduce_in_parts);
  EXPECT_EQ(options.reduce_part_rows, defaults.reduce_part_rows);
  EXPECT_EQ(options.sum_in_last_split, defaults.sum_in_last_split);
  EXPECT_EQ(options.last_split_extra_k_blocks, defaults.last_split_extra_k_blocks);
  EXPECT_EQ(options.split_k, defaults.split_k);
  EXPECT_EQ(options.group_size, defaults.group_size);
}

// Every flag set to a value of its own lands in its own field (no two swapped).
TEST(LoomOptionFlagsTest, EachFlagSetsItsOwnField) {
  absl::FlagSaver saver;
  absl::SetFlag(&FLAGS_a_stages, 3);
  absl::SetFlag(&FLAGS_b_stages, 4);
  absl::SetFlag(&FLAGS_max_clusters, 5);
  absl::SetFlag(&FLAGS_kernel, KernelChoice::kNarrow);
  absl::SetFlag(&FLAGS_tile_n, 128);
  absl::SetFlag(&FLAGS_narrow_a_stages, 6);
  absl::SetFlag(&FLAGS_narrow_b_stages, 7);
  absl::SetFlag(&FLAGS_narrow_b_in_flight, 2);
  absl::SetFlag(&FLAGS_narrow_consumers, 1);
  absl::SetFlag(&FLAGS_narrow_claim_stages, 12);
  absl::SetFlag(&FLAGS_narrow_pair_split, loom::PairSplitChoice::kOn);
  absl::SetFlag(&FLAGS_narrow_wide_split, true);
  absl::SetFlag(&FLAGS_narrow_split_whole_tiles, true);
  absl::SetFlag(&FLAGS_narrow_split_lead_k_blocks, 24);
  absl::SetFlag(&FLAGS_pack_weights, true);
  absl::SetFlag(&FLAGS_tagged_handoff, false);
  absl::SetFlag(&FLAGS_overlap_launches, false);
  absl::SetFlag(&FLAGS_reduce_in_parts, false);
  absl::SetFlag(&FLAGS_reduce_part_rows, 8);
  absl::SetFlag(&FLAGS_sum_in_last_split, false);
  absl::SetFlag(&FLAGS_last_split_extra, 9);
  absl::SetFlag(&FLAGS_split_k, 10);
  absl::SetFlag(&FLAGS_group_size, 11);
  const CompileOptions options = LoomOptionsFromFlags();
  EXPECT_EQ(options.a_stages, 3);
  EXPECT_EQ(options.b_stages, 4);
  EXPECT_EQ(options.max_clusters, 5);
  EXPECT_EQ(options.kernel, KernelChoice::kNarrow);
  EXPECT_EQ(options.tile_n, 128);
  EXPECT_EQ(options.narrow_a_stages, 6);
  EXPECT_EQ(options.narrow_b_stages, 7);
  EXPECT_EQ(options.narrow_b_in_flight, 2);
  EXPECT_EQ(options.narrow_consumers, 1);
  EXPECT_EQ(options.narrow_claim_stages, 12);
  EXPECT_EQ(options.narrow_pair_split, PairSplitChoice::kOn);
  EXPECT_TRUE(options.narrow_wide_split);
  EXPECT_TRUE(options.narrow_split_whole_tiles);
  EXPECT_EQ(options.narrow_split_lead_k_blocks, 24);
  EXPECT_TRUE(options.pack_weights);
  EXPECT_FALSE(options.tagged_handoff);
  EXPECT_FALSE(options.overlap_launches);
  EXPECT_FALSE(options.reduce_in_parts);
  EXPECT_EQ(options.reduce_part_rows, 8);
  EXPECT_FALSE(options.sum_in_last_split);
  EXPECT_EQ(options.last_split_extra_k_blocks, 9);
  EXPECT_EQ(options.split_k, 10);
  EXPECT_EQ(options.group_size, 11);
}

}  // namespace
}  // namespace loom::bench
