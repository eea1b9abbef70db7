#!/usr/bin/env bash
# The pair split's second-half extra (CompileOptions::last_split_extra_k_blocks;
# bench/NOTES.md v2.02) on whatever card comes: its GPU tests, then main and
# the pair split with no extra (the default), 8 and 16, in turns, ROUNDS
# times, at 48 and 64 tokens and on the 64-token chain. (Call 8 of v2.02 ran
# it when the default was 8 and timed 0 as the variant.)
#   usage (on the device, carry [".device-carry"]):
#     bash bench/probes/pair_extra.sh [ROUNDS=2] [DIR=.device-carry]
set -u
rounds=${1:-2}
dir=${2:-.device-carry}
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/$dir/lib:${LD_LIBRARY_PATH:-}
echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
timeout 120 "$dir/graph_gpu_test" --gtest_filter='*PairSplit*:*ClaimPacing*' > "$out/tests.log" 2>&1
echo "tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$out/tests.log" | tr '\n' ' ')"
log=$(mktemp)
for ((r = 1; r <= rounds; ++r)); do
  for variant in "" "--narrow_pair_split=on" "--narrow_pair_split=on --last_split_extra=8" \
                 "--narrow_pair_split=on --last_split_extra=16"; do
    # shellcheck disable=SC2086  # the variant is several flags
    timeout 120 "$dir/loom_graph_bench" --pack_weights --run_length=10 --iters=40 --rounds=1 --tokens=48,64 \
      --chain_tokens=64 $variant > "$log" 2>&1
    rc=$?
    grep -E "^(mlp|chain) +[0-9]+ " "$log" | sed "s|^|round $r [${variant:-main}] rc=$rc: |"
  done
done | tee "$out/timing.txt"
grep -iE "copy bandwidth" "$log" | head -1
rm -f "$log"
