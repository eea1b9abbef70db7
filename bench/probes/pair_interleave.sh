#!/usr/bin/env bash
# One device call for the pair split with its producers' columns interleaved
# (SchedulerOptions::interleave_split_producers; bench/NOTES.md v2.02), on
# whatever card comes:
#   1. the pair split's GPU tests;
#   2. in turns, ROUNDS times, at 48 and 64 tokens and on the 64-token
#      chain: main; the pair split with claim pacing 8 and without; and the
#      same from DIR/loom_graph_bench-contig if present (a build before the
#      interleave: the halves' producers queued left to right);
#   3. one traced launch of the pair split with claim pacing 8 at 64 tokens;
#   4. on an H200 only: main with claim pacing 8 against main at 1 and 16
#      tokens and on the one-token chain;
#   5. graph_gpu_test whole, while the budget lasts.
#   usage (on the device, carry [".device-carry"]):
#     bash bench/probes/pair_interleave.sh [BUDGET_S=400] [ROUNDS=2] [DIR=.device-carry]
set -u
budget=${1:-400}
rounds=${2:-2}
dir=${3:-.device-carry}
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/$dir/lib:${LD_LIBRARY_PATH:-}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card"
log=$(mktemp)
run() {  # LABEL BINARY FLAGS...: one process, its result lines labelled
  local label=$1 binary=$2
  shift 2
  timeout 120 "$binary" --pack_weights --run_length=10 --iters=40 --rounds=1 "$@" > "$log" 2>&1
  local rc=$?
  grep -E "^(mlp|chain) +[0-9]+ " "$log" | sed "s|^|$label rc=$rc: |"
}
s=$SECONDS
timeout 120 "$dir/graph_gpu_test" --gtest_filter='*PairSplit*' > "$out/pair_split_tests.log" 2>&1
echo "pair split tests rc=$? $((SECONDS - s))s: $(grep -E '^\[  (PASSED|FAILED)' "$out/pair_split_tests.log" | tr '\n' ' ')"
cases=(--tokens=48,64 --chain_tokens=64)
for ((r = 1; r <= rounds; ++r)); do
  run "round $r main" "$dir/loom_graph_bench" "${cases[@]}"
  run "round $r pair8" "$dir/loom_graph_bench" "${cases[@]}" --narrow_pair_split=on --narrow_claim_stages=8
  run "round $r pair" "$dir/loom_graph_bench" "${cases[@]}" --narrow_pair_split=on
  if [ -x "$dir/loom_graph_bench-contig" ]; then
    run "round $r contig pair8" "$dir/loom_graph_bench-contig" "${cases[@]}" --narrow_pair_split=on --narrow_claim_stages=8
  fi
done > "$out/timing.txt"
grep -iE "copy bandwidth" "$log" | head -1 >> "$out/timing.txt"
timeout 120 "$dir/loom_graph_bench" --pack_weights --run_length=10 --iters=40 --rounds=1 --tokens=64 --chain_tokens= \
  --narrow_pair_split=on --narrow_claim_stages=8 --timeline --timeline_csv="$out/tl_pair8.csv" > "$out/tl_pair8.txt" 2>&1
echo "timeline pair8 rc=$?"
case $card in
  *H200*)
    for ((r = 1; r <= rounds; ++r)); do
      run "round $r main" "$dir/loom_graph_bench" --tokens=1,16 --chain_tokens=1
      run "round $r main claim8" "$dir/loom_graph_bench" --tokens=1,16 --chain_tokens=1 --narrow_claim_stages=8
    done > "$out/claim8.txt"
    ;;
esac
if (( SECONDS + 70 < budget )); then
  s=$SECONDS
  timeout $((budget - SECONDS)) "$dir/graph_gpu_test" > "$out/graph_gpu_test.log" 2>&1
  echo "graph_gpu_test rc=$? $((SECONDS - s))s: $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$out/graph_gpu_test.log" | head -3 | tr '\n' ' ')"
else
  echo "graph_gpu_test skipped: $SECONDS s of $budget used"
fi
rm -f "$log"
echo "== timing (baseline us, loom us, speedup)"
cat "$out/timing.txt" "$out/claim8.txt" 2>/dev/null
exit 0
