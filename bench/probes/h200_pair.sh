#!/usr/bin/env bash
# The splits of K at 33-64 rows: the pair split, the wide split and the
# whole leading tiles' GPU tests; main, the pair split, the pair split with
# whole leading tiles (and on an H200 the wide split) at 48 and 64 tokens
# and on the 64-token chain in turns, each run a separate process beside
# cuBLAS; on an H200 the half-A timing builds by node (XARD, XARG) against
# main if they are in DIR; one traced launch of main and of the pair split
# with whole tiles at 64 tokens under $OUT.
#   usage (on the device, carry [".device-carry"]):
#     bash bench/probes/h200_pair.sh [ROUNDS=3] [DIR=.device-carry]
set -u
# shellcheck source=bench/probes/turns.sh
source "$(dirname "$0")/turns.sh"
probe_setup "${1:-3}" "${2:-.device-carry}"
echo "card: $card"
gpu_tests split_tests '*PairSplit*:*NarrowWideSplit*:*WholeTiles*'
flags=(--pack_weights --run_length=10 --iters=40 --rounds=1)
variants=("--tokens=48,64 --chain_tokens=64"
          "--tokens=48,64 --chain_tokens=64 --narrow_pair_split=on"
          "--tokens=48,64 --chain_tokens=64 --narrow_pair_split=on --narrow_split_whole_tiles")
case $card in *H200*) variants+=("--tokens=48,64 --chain_tokens=64 --narrow_wide_split") ;; esac
bench_table splits
case $card in
  *H200*)
    if ls "$dir"/loom_graph_bench-* > /dev/null 2>&1; then
      timeout 100 bash "$(dirname "$0")/time_in_turns.sh" "$dir" 1 '^mlp +64 ' "${flags[@]}" --tokens=64 \
        --chain_tokens= | tee "$out/half_a.txt"
    fi ;;
esac
traced_launch main
traced_launch whole --narrow_pair_split=on --narrow_split_whole_tiles
