#!/usr/bin/env bash
# The tall pair split (65-128 rows; bench/NOTES.md v2.03-v2.04) on whatever
# card comes: its GPU tests and the pair split's, then the MLP block at 65,
# 100 and 128 tokens and the 8-layer chain at 128, main (the tiled kernel
# for the block; for the chain the tall pair split, PairSplitChoice::kAuto)
# against the narrow kernel's tall pair split for both (claim pacing 8, then
# 4), in turns, each run a separate process beside cuBLAS. With
# VARIANTS=rows, the narrow kernel's two row blocks (the pair split off)
# against the tall pair split instead, chains at 65, 100 and 128 tokens
# too, and the tall pair split with 3 A stages (no tests); with
# VARIANTS=tall, main against main with the pair split off (the default
# before v2.04) and the narrow kernel's tall pair split at those sizes.
#   usage (on the device, carry [".device-carry"]):
#     bash bench/probes/tall_pair_split.sh [ROUNDS=2] [DIR=.device-carry]
set -u
# shellcheck source=bench/probes/turns.sh
source "$(dirname "$0")/turns.sh"
probe_setup "$@"
echo "card: $card"
flags=(--pack_weights --run_length=10 --iters=40 --rounds=1)
variants=("--tokens=65,100,128 --chain_tokens=128"
          "--tokens=65,100,128 --chain_tokens=128 --kernel=narrow --narrow_pair_split=on"
          "--tokens=65,100,128 --chain_tokens=128 --kernel=narrow --narrow_pair_split=on --narrow_claim_stages=4")
if [ "${VARIANTS:-}" = rows ]; then
  # Two row blocks against the tall pair split, and the tall pair split
  # with a third A stage where it fits (at most 104 rows).
  variants=("--tokens=65,100,128 --chain_tokens=65,100,128"
            "--tokens=65,100,128 --chain_tokens=65,100,128 --kernel=narrow --narrow_pair_split=off"
            "--tokens=65,100,128 --chain_tokens=65,100,128 --kernel=narrow --narrow_pair_split=on"
            "--tokens=65,100 --chain_tokens=65,100 --kernel=narrow --narrow_pair_split=on --narrow_a_stages=3")
  skip_tests=1
fi
if [ "${VARIANTS:-}" = tall ]; then
  # Main, main with the pair split off, and the tall pair split for both
  # graphs, as the plan chooses its rings.
  variants=("--tokens=65,100,128 --chain_tokens=65,100,128"
            "--tokens=65,100,128 --chain_tokens=65,100,128 --narrow_pair_split=off"
            "--tokens=65,100,128 --chain_tokens=65,100,128 --kernel=narrow --narrow_pair_split=on")
fi
if [ -z "${skip_tests:-}" ]; then
  timeout 240 "$dir/graph_gpu_test" --gtest_filter='*PairSplit*' > "$out/tall_tests.log" 2>&1
  echo "pair split tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$out/tall_tests.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED' "$out/tall_tests.log" | head -5
fi
bench_table tall_vs_main
