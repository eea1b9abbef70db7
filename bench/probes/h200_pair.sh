#!/usr/bin/env bash
# The splits of K at 33-64 rows on the H200 only (exits at once on any
# other card, so a call that lands elsewhere costs only its start): the pair
# and wide splits' GPU tests; main, the pair split and the wide split at 48
# and 64 tokens and on the 64-token chain in turns, each run a separate
# process beside cuBLAS; the pair split's ring depths at 64 tokens; the
# half-A timing builds by node (XARD, XARG) against main if they are in DIR;
# one traced launch of main and of the pair split at 64 tokens under $OUT.
#   usage (on the device, carry [".device-carry"]):
#     bash bench/probes/h200_pair.sh [ROUNDS=3] [DIR=.device-carry]
set -u
# shellcheck source=bench/probes/turns.sh
source "$(dirname "$0")/turns.sh"
probe_setup "${1:-3}" "${2:-.device-carry}"
echo "card: $card"
case $card in *H200*) ;; *) echo "not an H200: nothing run"; exit 3 ;; esac
timeout 200 "$dir/graph_gpu_test" --gtest_filter='*PairSplit*:*NarrowWideSplit*' > "$out/split_tests.log" 2>&1
echo "split tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$out/split_tests.log" | tr '\n' ' ')"
grep -E '^\[  FAILED' "$out/split_tests.log" | head -8
flags=(--pack_weights --run_length=10 --iters=40 --rounds=1)
variants=("--tokens=48,64 --chain_tokens=64"
          "--tokens=48,64 --chain_tokens=64 --narrow_pair_split=on"
          "--tokens=48,64 --chain_tokens=64 --narrow_wide_split")
log=$(mktemp)
bench_in_turns "$rounds" "$dir" "$log" | tee "$out/splits.txt"
grep -iE "copy bandwidth" "$log" | head -1
variants=("--tokens=64 --chain_tokens= --narrow_pair_split=on --narrow_a_stages=4 --narrow_b_stages=3"
          "--tokens=64 --chain_tokens= --narrow_pair_split=on --narrow_a_stages=2 --narrow_b_stages=5"
          "--tokens=64 --chain_tokens= --narrow_pair_split=on --narrow_b_in_flight=3"
          "--tokens=64 --chain_tokens= --narrow_pair_split=on --narrow_claim_stages=16")
bench_in_turns 2 "$dir" "$log" | tee "$out/pair_rings.txt"
rm -f "$log"
if ls "$dir"/loom_graph_bench-* > /dev/null 2>&1; then
  timeout 100 bash "$(dirname "$0")/time_in_turns.sh" "$dir" 1 '^mlp +64 ' "${flags[@]}" --tokens=64 --chain_tokens= \
    | tee "$out/half_a.txt"
fi
traced_launch main
traced_launch pair --narrow_pair_split=on
