#!/usr/bin/env bash
# The pair split's whole leading tiles and its short nodes split in four
# (CompileOptions::narrow_split_whole_tiles, narrow_short_node_splits) on
# whatever card comes: their GPU tests; main, the pair split with whole
# tiles, and that with the short nodes in four, at 48 and 64 tokens and on
# the 64-token chain in turns, each run a separate process beside cuBLAS;
# one traced launch of the last at 64 tokens under $OUT.
# narrow_short_node_splits exists only with short_node_splits.diff applied
# (to 17472e4): pack .device-carry from a tree that has it, e.g.
#   git worktree add /tmp/sns 17472e4 && git -C /tmp/sns apply $PWD/bench/probes/short_node_splits.diff
#   and in /tmp/sns: cmake --preset default, ninja -C build, bench/pack_for_h200.sh
#   tests/graph_gpu_test bench/loom_graph_bench, then carry /tmp/sns/.device-carry's files.
#   usage (on the device, carry [".device-carry"]):
#     bash bench/probes/h200_short.sh [ROUNDS=3] [DIR=.device-carry]
set -u
# shellcheck source=bench/probes/turns.sh
source "$(dirname "$0")/turns.sh"
probe_setup "${1:-3}" "${2:-.device-carry}"
echo "card: $card"
gpu_tests split_tests '*PairSplit*:*WholeTiles*:*ShortNode*'
flags=(--pack_weights --run_length=10 --iters=40 --rounds=1)
variants=("--tokens=48,64 --chain_tokens=64"
          "--tokens=48,64 --chain_tokens=64 --narrow_pair_split=on --narrow_split_whole_tiles"
          "--tokens=48,64 --chain_tokens=64 --narrow_pair_split=on --narrow_split_whole_tiles --narrow_short_node_splits=4")
bench_table splits
traced_launch short --narrow_pair_split=on --narrow_split_whole_tiles --narrow_short_node_splits=4
