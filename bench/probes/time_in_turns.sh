#!/usr/bin/env bash
# Times main's loom_graph_bench against timing builds, in turns, on the
# device: DIR/loom_graph_bench (bench/pack_for_h200.sh), then every
# DIR/loom_graph_bench-NAME (build_probe.sh), ROUNDS times
# over, each a separate process with the same flags; prints each run's
# result lines for the cases named. Timing builds' checks fail by design.
#   usage: bench/probes/time_in_turns.sh DIR ROUNDS CASE_REGEX [loom_graph_bench flags...]
#   e.g.:  bench/probes/time_in_turns.sh .device-carry 3 '^mlp +64 ' --pack_weights
#            --run_length=10 --iters=40 --rounds=1 --tokens=64 --chain_tokens=
# DIR/lib (bundle-libs.sh) goes on LD_LIBRARY_PATH.
set -u
dir=${1:?usage: time_in_turns.sh DIR ROUNDS CASE_REGEX [flags...]}
rounds=${2:?rounds}
cases=${3:?case regex}
shift 3
export LD_LIBRARY_PATH=$PWD/$dir/lib:${LD_LIBRARY_PATH:-}
log=$(mktemp)
for ((r = 1; r <= rounds; ++r)); do
  for binary in "$dir"/loom_graph_bench "$dir"/loom_graph_bench-*; do
    [ -x "$binary" ] || continue
    timeout 120 "$binary" "$@" > "$log" 2>&1
    rc=$?
    grep -E "$cases" "$log" | sed "s|^|round $r $(basename "$binary") rc=$rc: |"
  done
done
grep -iE "copy" "$log" | head -2
rm -f "$log"
