// loom_option_flags.h: the command-line flags for loom's CompileOptions that
// both benchmarks take (rings, kernel choice, narrow rings, reduce parts),
// defined once (loom_option_flags.cc) so the two cannot drift apart.
#ifndef LOOM_BENCH_LOOM_OPTION_FLAGS_H_
#define LOOM_BENCH_LOOM_OPTION_FLAGS_H_

#include "loom/runtime.h"

namespace loom::bench {

// CompileOptions with --a_stages, --b_stages, --tile_n, --max_clusters, --kernel, --narrow_a_stages,
// --narrow_b_stages, --narrow_b_in_flight, --narrow_consumers, --narrow_claim_stages,
// --narrow_pair_split, --narrow_wide_split, --narrow_split_whole_tiles, --pack_weights, --tagged_handoff, --overlap_launches, --reduce_in_parts, --reduce_part_rows,
// --sum_in_last_split, --last_split_extra, --split_k and --group_size
// applied; every other field at its default.
CompileOptions LoomOptionsFromFlags();

// Makes --help list every flag the benchmarks define (their own and these
// shared ones), not Abseil's default of the flags of a file named after the
// program (none here: "No flags matched").
void ListBenchFlagsInHelp();

}  // namespace loom::bench

#endif  // LOOM_BENCH_LOOM_OPTION_FLAGS_H_
