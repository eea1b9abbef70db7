#!/usr/bin/env bash
# The next H200 call after v2.09 (bench/NOTES.md): main's GPU suites (the
# gathered epilogue stores and the lead have passed only on H100s), then, in
# turns, each run a separate process beside cuBLAS: main's bars (1, 16, 64
# and 128 tokens, the 1- and 64-token chains), whole tiles at 64 tokens
# with and without a lead of 24 k-blocks, and the 128-token tall pair split
# against the tiled default. ~5 minutes on an H100.
#   usage (on the device, carry [".device-carry"] from
#   bench/pack_for_h200.sh tests/graph_gpu_test tests/gemm_gpu_test
#   bench/loom_graph_bench):
#     bash bench/probes/h200_bars.sh [ROUNDS=3] [DIR=.device-carry]
set -u
# shellcheck source=bench/probes/turns.sh
source "$(dirname "$0")/turns.sh"
probe_setup "${1:-3}" "${2:-.device-carry}"
echo "card: $card"
for suite in graph gemm; do
  timeout 200 "$dir/${suite}_gpu_test" > "$out/${suite}_gpu_test.log" 2>&1
  echo "${suite}_gpu_test rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$out/${suite}_gpu_test.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED' "$out/${suite}_gpu_test.log" | head -8
done
flags=(--pack_weights --run_length=10 --iters=40 --rounds=1)
whole="--narrow_pair_split=on --narrow_split_whole_tiles"
variants=("--tokens=1,16,64,128 --chain_tokens=1,64"
          "--tokens=64 --chain_tokens= $whole"
          "--tokens=64 --chain_tokens= $whole --narrow_split_lead_k_blocks=24"
          "--tokens=128 --chain_tokens= --kernel=narrow --narrow_pair_split=on")
bench_table bars
