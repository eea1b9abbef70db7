#!/usr/bin/env bash
# The pair split's lead (CompileOptions::narrow_split_lead_k_blocks) and the
# narrow epilogue's gathered stores (gathered_stores.diff; bench/NOTES.md
# v2.08). First the GPU tests: main's NarrowSplitLeadTest and pair-split
# suites, then the whole graph and gemm suites of the gathered-stores build
# (DIR/graph_gpu_test-gathered_stores, DIR/gemm_gpu_test-gathered_stores:
# TESTS=1 build_probe.sh gathered_stores). Then, each run a separate process
# beside cuBLAS, in turns: main and whole tiles (--narrow_pair_split=on
# --narrow_split_whole_tiles) at 48 and 64 tokens and on the 64-token chain,
# whole tiles with leads of 16, 24 and 32 k-blocks at 48 and 64 tokens; main
# against DIR/loom_graph_bench-gathered_stores for the default plans (24-64
# tokens, the 64-token chain), whole tiles with and without a lead of 24,
# and the tall pair split at 128 tokens. Last, one traced launch at 64
# tokens of whole tiles with and without a lead of 24 under $OUT.
# Ran once (bench/NOTES.md v2.09, on an H100): the diff then landed on main
# as 92745b7 and is gone from this folder. To time the same pair again,
# pack c4730ea's binaries as main's and 92745b7's as DIR/*-gathered_stores.
#   usage (on the device, carry [".device-carry"]):
#     bash bench/probes/h200_store.sh [ROUNDS=3] [DIR=.device-carry]
set -u
# shellcheck source=bench/probes/turns.sh
source "$(dirname "$0")/turns.sh"
probe_setup "${1:-3}" "${2:-.device-carry}"
echo "card: $card"
gpu_tests lead_tests '*SplitLead*:*PairSplit*:*WholeTiles*'
for suite in graph gemm; do
  binary=$dir/${suite}_gpu_test-gathered_stores
  [ -x "$binary" ] || continue
  timeout 200 "$binary" > "$out/${suite}_gathered.log" 2>&1
  echo "$suite suite, gathered stores, rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$out/${suite}_gathered.log" |
    tr '\n' ' ')"
  grep -E '^\[  FAILED' "$out/${suite}_gathered.log" | head -8
done
flags=(--pack_weights --run_length=10 --iters=40 --rounds=1)
whole="--narrow_pair_split=on --narrow_split_whole_tiles"
variants=("--tokens=48,64 --chain_tokens=64"
          "--tokens=48,64 --chain_tokens=64 $whole")
for lead in 16 24 32; do
  variants+=("--tokens=48,64 --chain_tokens= $whole --narrow_split_lead_k_blocks=$lead")
done
bench_table lead
if [ -x "$dir/loom_graph_bench-gathered_stores" ]; then
  # The default plans at 24-64 tokens and on the 64-token chain; whole
  # tiles, with and without a lead; the tall pair split at 128 tokens
  # (--kernel=narrow; the default there is the tiled kernel, whose stores
  # the diff leaves alone).
  for variant in "--tokens=24,48,64 --chain_tokens=64" "--tokens=48,64 --chain_tokens= $whole" \
                 "--tokens=48,64 --chain_tokens= $whole --narrow_split_lead_k_blocks=24" \
                 "--tokens=128 --chain_tokens= --kernel=narrow --narrow_pair_split=on"; do
    echo "main against gathered stores: [$variant]"
    # shellcheck disable=SC2086  # the variant is several flags
    timeout 150 bash "$(dirname "$0")/time_in_turns.sh" "$dir" "$rounds" '^(mlp|chain) +[0-9]+ ' "${flags[@]}" \
      $variant
  done | tee "$out/gathered.txt"
fi
# shellcheck disable=SC2086  # $whole is several flags
traced_launch whole $whole
# shellcheck disable=SC2086
traced_launch lead24 $whole --narrow_split_lead_k_blocks=24
