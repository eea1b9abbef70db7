# shellcheck shell=bash
# The caller's `variants` and `flags`, and the globals probe_setup sets for
# it, cross the file boundary:
# shellcheck disable=SC2034,SC2154
# Sourced by the probe scripts.
# probe_setup [ROUNDS=2] [DIR=.device-carry] (the script's own arguments):
# sets rounds, dir, out ($OUT, or /tmp/out; made) and card (the GPU's
# name), and puts DIR/lib on LD_LIBRARY_PATH.
probe_setup() {
  rounds=${1:-2}
  dir=${2:-.device-carry}
  out=${OUT:-/tmp/out}
  mkdir -p "$out"
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  export LD_LIBRARY_PATH=$PWD/$dir/lib:${LD_LIBRARY_PATH:-}
}

# gpu_tests NAME FILTER: DIR/graph_gpu_test's tests matching FILTER
# (within 240 s), logged to OUT/NAME.log; prints the exit status, the
# summary lines and the first failures.
gpu_tests() {
  local name=$1 filter=$2 rc
  timeout 240 "$dir/graph_gpu_test" --gtest_filter="$filter" > "$out/$name.log" 2>&1
  rc=$?
  echo "$name rc=$rc: $(grep -E '^\[  (PASSED|FAILED)' "$out/$name.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED' "$out/$name.log" | head -8
}

# bench_in_turns ROUNDS DIR LOG runs
# DIR/loom_graph_bench once for each of the caller's `variants` (the
# caller's `flags`, then the variant's own), ROUNDS times over, in turns,
# each a separate process; prints every run's MLP and chain result lines,
# labelled with the round, the variant's flags past its token lists and the
# exit status. LOG keeps the last run's output (its copy bandwidth line).
bench_in_turns() {
  local rounds=$1 dir=$2 log=$3 r variant rc label
  for ((r = 1; r <= rounds; ++r)); do
    for variant in "${variants[@]}"; do
      # shellcheck disable=SC2086  # the variant is several flags
      timeout 120 "$dir/loom_graph_bench" "${flags[@]}" $variant > "$log" 2>&1
      rc=$?
      label=$(sed -E 's/--(chain_)?tokens=[^ ]* ?//g' <<< "$variant")
      grep -E "^(mlp|chain) +[0-9]+ " "$log" | sed "s|^|round $r [${label:-main}] rc=$rc: |"
    done
  done
}

# bench_table NAME: bench_in_turns over the caller's `rounds` and `dir`,
# its lines also kept in OUT/NAME.txt, then the last run's copy bandwidth
# line.
bench_table() {
  local log
  log=$(mktemp)
  bench_in_turns "$rounds" "$dir" "$log" | tee "$out/$1.txt"
  grep -iE "copy bandwidth" "$log" | head -1
  rm -f "$log"
}

# traced_launch NAME [FLAGS...]: one traced launch (--timeline, its jobs in
# OUT/tl_NAME.csv) of DIR/loom_graph_bench with the caller's `flags`, the
# MLP block at 64 tokens and FLAGS; prints its result line.
traced_launch() {
  local name=$1 rc
  shift
  timeout 120 "$dir/loom_graph_bench" "${flags[@]}" --tokens=64 --chain_tokens= "$@" --timeline \
    --timeline_csv="$out/tl_$name.csv" > "$out/tl_$name.txt" 2>&1
  rc=$?
  echo "timeline $name rc=$rc: $(grep -E '^mlp +64 ' "$out/tl_$name.txt")"
}
