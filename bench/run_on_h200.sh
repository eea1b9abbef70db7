#!/usr/bin/env bash
# One device call: every carried *_gpu_test, then the GEMM benchmark, then
# (when carried) the graph benchmark with per-node timelines; logs under
# $OUT, the short tables last. Runs from the repo root on the H200 with the
# binaries bench/pack_for_h200.sh put in .device-carry/.
#   usage: bench/run_on_h200.sh [gtest filter|none] [bench shapes] [extra loom_bench flags...]
set -u
carry=.device-carry
export LD_LIBRARY_PATH=$PWD/$carry/lib:${LD_LIBRARY_PATH:-}
out=${OUT:-/tmp/out}
mkdir -p "$out"
filter=${1:-*}
shapes=${2:-}
shift 2 2>/dev/null || true
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader | tee "$out/gpu.txt"
if [ "$filter" != "none" ]; then
  for test in "$carry"/*_gpu_test; do
    name=$(basename "$test")
    timeout ${TEST_TIMEOUT:-200} "$test" --gtest_filter="$filter" > "$out/$name.log" 2>&1
    echo "$name rc=$?"
    grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]|Failure|error" "$out/$name.log" | head -30
  done
fi
if [ -x "$carry/loom_bench" ]; then
  timeout ${BENCH_TIMEOUT:-200} "$carry/loom_bench" ${shapes:+--shapes="$shapes"} --json="$out/bench.json" "$@" \
    > "$out/bench.log" 2>&1
  echo "loom_bench rc=$?"
fi
if [ -x "$carry/loom_graph_bench" ]; then
  timeout ${GRAPH_BENCH_TIMEOUT:-150} "$carry/loom_graph_bench" --timeline > "$out/graph_bench.log" 2>&1
  echo "loom_graph_bench rc=$?"
fi
[ -f "$out/bench.log" ] && grep -E "loom-|summary|geomean" "$out/bench.log"
[ -f "$out/graph_bench.log" ] && grep -A12 "^summary" "$out/graph_bench.log"
exit 0
