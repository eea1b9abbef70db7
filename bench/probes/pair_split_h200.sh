#!/usr/bin/env bash
# One device call for the pair split (CompileOptions::narrow_pair_split,
# bench/NOTES.md v2.01), in order of what matters most:
#   1. its GPU tests (graph_gpu_test's NarrowPairSplitTest);
#   2. main's MLP block at 48 and 64 tokens and the 64-token chain, with
#      and without --narrow_pair_split, in turns, ROUNDS times;
#   3. the pair split at 64 tokens with other rings and claim pacing;
#   4. the half-A timing builds against main, where DIR holds them;
#   5. both GPU suites, while the time budget lasts.
# Here first: bench/pack_for_h200.sh tests/gemm_gpu_test tests/graph_gpu_test
# bench/loom_graph_bench (and, for 4, bench/probes/build_probe.sh half_a_down
# and half_a_gateup, which add to the same folder).
#   usage (on the device, carry [".device-carry"]):
#     bash bench/probes/pair_split_h200.sh [BUDGET_S=540] [ROUNDS=3] [DIR=.device-carry]
# Logs under $OUT; the timing table last.
set -u
budget=${1:-540}
rounds=${2:-3}
dir=${3:-.device-carry}
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/$dir/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader | tee "$out/gpu.txt"
log=$(mktemp)
bench() {  # LABEL FLAGS...: one process, its result lines labelled
  local label=$1
  shift
  timeout 120 "$dir/loom_graph_bench" --pack_weights --run_length=10 --iters=40 --rounds=1 "$@" > "$log" 2>&1
  local rc=$?
  grep -E "^(mlp|chain) +[0-9]+ " "$log" | sed "s|^|$label rc=$rc: |"
}
s=$SECONDS
timeout 240 "$dir/graph_gpu_test" --gtest_filter='*PairSplit*' > "$out/pair_split_tests.log" 2>&1
echo "pair split tests rc=$? $((SECONDS - s))s"
grep -E "^\[  (FAILED|PASSED) |Failure|Expected|Which is" "$out/pair_split_tests.log" | head -24
for ((r = 1; r <= rounds; ++r)); do
  bench "round $r main" --tokens=48,64 --chain_tokens=64
  bench "round $r pair" --tokens=48,64 --chain_tokens=64 --narrow_pair_split=on
done > "$out/pair_split_timing.txt"
grep -iE "copy bandwidth" "$log" | head -1 >> "$out/pair_split_timing.txt"
for variant in "--narrow_b_in_flight=3" "--narrow_b_in_flight=1" "--narrow_a_stages=4 --narrow_b_stages=3" \
               "--narrow_a_stages=2 --narrow_b_stages=5 --narrow_b_in_flight=3" "--narrow_claim_stages=8"; do
  (( SECONDS + 30 < budget )) || break
  # shellcheck disable=SC2086  # the variant is several flags
  bench "pair $variant" --tokens=64 --chain_tokens= --narrow_pair_split=on $variant
done | tee "$out/pair_split_variants.txt"
if compgen -G "$dir/loom_graph_bench-*" > /dev/null && (( SECONDS + 60 < budget )); then
  bash bench/probes/time_in_turns.sh "$dir" 1 '^mlp +64 ' --pack_weights --run_length=10 --iters=40 --rounds=1 \
    --tokens=64 --chain_tokens= | tee "$out/half_a.txt"
fi
for t in graph_gpu_test gemm_gpu_test; do
  if (( SECONDS + 80 < budget )); then
    s=$SECONDS
    timeout $((budget - SECONDS)) "$dir/$t" > "$out/$t.log" 2>&1
    rc=$?
    echo "$t rc=$rc $((SECONDS - s))s: $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$out/$t.log" | head -3 | tr '\n' ' ')"
  else
    echo "$t skipped: $SECONDS s of $budget used"
  fi
done
rm -f "$log"
echo "== timing (baseline us, loom us, speedup)"
cat "$out/pair_split_timing.txt"
exit 0
