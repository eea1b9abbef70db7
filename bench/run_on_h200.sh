#!/usr/bin/env bash
# One device call: GPU tests, then the benchmark, logs under $OUT, short table last.
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
  timeout ${TEST_TIMEOUT:-200} "$carry/gemm_gpu_test" --gtest_filter="$filter" 2>&1 | tee "$out/gpu_test.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]|Failure|error" | head -60
fi
if [ -n "$shapes" ]; then
  timeout ${BENCH_TIMEOUT:-200} "$carry/loom_bench" --shapes="$shapes" --json="$out/bench.json" "$@" 2>&1 | tee "$out/bench.log"
fi
