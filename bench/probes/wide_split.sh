#!/usr/bin/env bash
# The wide split (bench/NOTES.md v2.05) on whatever card comes: its GPU
# tests; main, the pair split and the wide split at 48 and 64 tokens and
# on the 64-token 8-layer chain, in turns, each run a separate process
# beside cuBLAS; on an H200 the half-A timing builds by node (XARD, XARG:
# build_probe.sh half_a_down, half_a_gateup) against main, if they are in
# DIR, and elsewhere racecheck on the wide kernel; then one traced launch
# (--timeline_csv) of main and of the wide split at 64 tokens, kept under
# $OUT.
#   usage (on the device, carry [".device-carry"]):
#     bash bench/probes/wide_split.sh [ROUNDS=2] [DIR=.device-carry]
set -u
# shellcheck source=bench/probes/turns.sh
source "$(dirname "$0")/turns.sh"
probe_setup "$@"
echo "card: $card"
gpu_tests wide_tests '*NarrowWideSplit*'
flags=(--pack_weights --run_length=10 --iters=40 --rounds=1)
variants=("--tokens=48,64 --chain_tokens=64"
          "--tokens=48,64 --chain_tokens=64 --narrow_pair_split=on"
          "--tokens=48,64 --chain_tokens=64 --narrow_wide_split")
bench_table wide_vs_main
case $card in
  *H200*)
    if ls "$dir"/loom_graph_bench-* > /dev/null 2>&1; then
      timeout 100 bash "$(dirname "$0")/time_in_turns.sh" "$dir" 1 '^mlp +64 ' "${flags[@]}" --tokens=64 --chain_tokens=
    fi ;;
  *)
    timeout 150 compute-sanitizer --tool racecheck "$dir/graph_gpu_test" \
      --gtest_filter='Graphs/NarrowWideSplitTest.*/mlp64_h1024' > "$out/race_wide.txt" 2>&1
    echo "racecheck rc=$?: $(grep -E 'RACECHECK SUMMARY|^\[  (PASSED|FAILED)' "$out/race_wide.txt" | tr '\n' ' ')" ;;
esac
traced_launch main
traced_launch wide --narrow_wide_split
