#!/usr/bin/env bash
# Main against claim pacing 8 and the pair split (bench/NOTES.md
# v2.01-v2.02) in turns, on the H200 only: exits at once on any other card,
# so a call that lands on an H100 costs only its start. Each run is a
# separate process; then one traced launch (--timeline_csv) of main and of
# the pair split (claim pacing 8 by default since df91107), kept under $OUT.
#   usage (on the device, carry [".device-carry"]):
#     bash bench/probes/pair_vs_main.sh [ROUNDS=2] [DIR=.device-carry]
set -u
# shellcheck source=bench/probes/turns.sh
source "$(dirname "$0")/turns.sh"
probe_setup "$@"
echo "card: $card"
case $card in *H200*) ;; *) echo "not an H200: nothing timed"; exit 3 ;; esac
flags=(--pack_weights --run_length=10 --iters=40 --rounds=1)
# The pair split changes only 33-64 rows; claim pacing only the narrow kernel.
variants=("--tokens=1,16,48,64 --chain_tokens=1,64"
          "--tokens=1,16,48,64 --chain_tokens=1,64 --narrow_claim_stages=8"
          "--tokens=48,64 --chain_tokens=64 --narrow_pair_split=on"
          "--tokens=64 --chain_tokens= --narrow_pair_split=on --narrow_claim_stages=4")
timeout 120 "$dir/graph_gpu_test" --gtest_filter='*PairSplit*' > "$out/pair_split_tests.log" 2>&1
echo "pair split tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$out/pair_split_tests.log" | tr '\n' ' ')"
bench_table pair_vs_main
traced_launch main
traced_launch pair --narrow_pair_split=on
