#!/usr/bin/env bash
# One device call: every carried *_gpu_test, then the GEMM benchmark; logs under $OUT, short table last.
# Runs from the repo root on the H200 with the carried binaries in .device-carry/.
#   usage: bench/run_on_h200.sh [gtest filter] [bench shapes] [extra bench flags...]
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
if [ -n "$shapes" ]; then
  timeout ${BENCH_TIMEOUT:-200} "$carry/loom_bench" --shapes="$shapes" --json="$out/bench.json" "$@" 2>&1 | tee "$out/bench.log"
fi
