#!/usr/bin/env bash
# The owed H200 call in one command (bench/NOTES.md v2.09-v2.10): stops at
# once on any other card (exit 3: the bars are the H200's), then
# h200_bars.sh (main's two GPU suites, the bars, whole tiles with and
# without a lead, the tall pair split at 128 tokens) and whole_rings.sh
# (ring depths, claim pacing, leads of 16-40 k-blocks with whole tiles),
# each capped (BARS_CAP, RINGS_CAP seconds) so the call ends inside the
# device's 10-minute limit. Their logs are written straight into $OUT (7
# files: the device returns 8 at most), so a call cut short keeps them.
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
out=${OUT:-/tmp/out}
mkdir -p "$out"

# capped SECONDS NAME SCRIPT ROUNDS: SCRIPT's output into OUT/NAME_stdout.txt,
# stopped after SECONDS. The script's own runs each sit under a timeout of
# their own, which is its own process group that the cap's signal does not
# reach: whatever run a cap cuts short is ended here, so that it never
# overlaps the next part's runs on the GPU.
capped() {
  local seconds=$1 name=$2 script=$3 rounds=$4
  OUT=$out timeout "$seconds" bash "$here/$script" "$rounds" > "$out/${name}_stdout.txt" 2>&1
  pkill -f 'loom_graph_bench|_gpu_test' && sleep 1
  cat "$out/${name}_stdout.txt"
}
capped "${BARS_CAP:-300}" bars h200_bars.sh "${1:-3}"
capped "${RINGS_CAP:-200}" rings whole_rings.sh "${2:-2}"
