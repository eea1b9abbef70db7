#!/usr/bin/env bash
# The owed H200 call in one command (bench/NOTES.md v2.09-v2.10): stops at
# once on any other card (exit 3: the bars are the H200's), then
# h200_bars.sh (main's two GPU suites, the bars, whole tiles with and
# without a lead, the tall pair split at 128 tokens) and whole_rings.sh
# (ring depths, claim pacing, leads of 16-40 k-blocks with whole tiles),
# each capped so the call ends inside the device's 10-minute limit. Every
# log lands in OUT/logs.tgz ($OUT returns at most 8 files).
#   usage (on the device, carry [".device-carry"] from
#   bench/pack_for_h200.sh tests/graph_gpu_test tests/gemm_gpu_test
#   bench/loom_graph_bench):
#     bash bench/probes/h200_next.sh [BARS_ROUNDS=3] [RINGS_ROUNDS=2]
set -u
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ $card != *H200* ]]; then
  echo "card: $card, not an H200; nothing run"
  exit 3
fi
here=$(dirname "$0")
logs=$(mktemp -d)
OUT=$logs timeout 300 bash "$here/h200_bars.sh" "${1:-3}" > "$logs/bars_stdout.txt" 2>&1
OUT=$logs timeout 200 bash "$here/whole_rings.sh" "${2:-2}" > "$logs/rings_stdout.txt" 2>&1
mkdir -p "${OUT:-/tmp/out}"
tar czf "${OUT:-/tmp/out}/logs.tgz" -C "$logs" .
cat "$logs/bars_stdout.txt" "$logs/rings_stdout.txt"
