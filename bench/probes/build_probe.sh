#!/usr/bin/env bash
# Builds a timing build of loom_graph_bench: main's HEAD (or BASE) with one probe diff
# of this folder applied, in a git worktree of its own, so the probe never
# touches main's kernels. Timing builds give wrong results on purpose (their
# checks fail); they exist to time one change (bench/NOTES.md names each).
#   usage: [BASE=COMMIT] bench/probes/build_probe.sh NAME [DEST]
#   NAME: a diff here, without .diff:
#     half_a  every narrow A stage loads half its rows (the "XAR" builds of
#             bench/NOTES.md v1.92-v1.99: do A's bytes bound the 64-token block?
#             meant for 33-64 rows; smaller row tiles were never timed with it)
#     half_a_down, half_a_gateup
#             the same for one node of the MLP block only: the down
#             projection (K past 8192: XARD) or gate/up (XARG)
#     wide_turns
#             the wide split in turns (bench/NOTES.md v2.06): each 64 x 128
#             job one consumer warpgroup's (m64n128k16), non-last quarters
#             releasing their own flags; right on an H100 but ~56 us
#             slower than main at 64 tokens. Kept as the start of a next
#             attempt (its tests too: build graph_gpu_test in the tree).
#             It applies to bc62d2b, before 804daa1 reshaped the split
#             jobs' code: BASE=bc62d2b build_probe.sh wide_turns
#     short_node_splits
#             not a timing build (right results; its GPU tests pass on an
#             H100): CompileOptions::narrow_short_node_splits, a pair-split
#             node of fewer tiles than the grid split in 3-4 parts of K
#             (bench/NOTES.md v2.07). ~1.5 us slower at 64 tokens on an
#             H100; never timed on an H200; its runtime part count makes
#             the pair kernel spill 28 bytes. Applies to 17472e4:
#             BASE=17472e4 build_probe.sh short_node_splits (h200_short.sh
#             times it, with its tests, from a full build of that tree)
#   TESTS=1: also builds the tree's graph_gpu_test and gemm_gpu_test, as
#           DEST/graph_gpu_test-NAME and DEST/gemm_gpu_test-NAME
#   DEST:   where the binary goes, as DEST/loom_graph_bench-NAME (default:
#           .device-carry, after bench/pack_for_h200.sh has filled it: the
#           probe links the libraries that script bundles for main's bench)
# Takes ~6 minutes on this repository's two-core machines; time_in_turns.sh
# here times the builds against main on the device.
set -euo pipefail
cd "$(dirname "$0")/../.."
name=${1:?usage: build_probe.sh NAME [DEST]}
dest=${2:-.device-carry}
diff=$PWD/bench/probes/$name.diff
[ -f "$diff" ] || { echo "no probe diff $diff" >&2; exit 2; }
tree=/tmp/loom-probe-$name
export PATH=/usr/local/cuda/bin:$PATH
# The commit the diff applies to: main's HEAD, or BASE where a diff names
# an older one (below).
base=$(git rev-parse "${BASE:-HEAD}")
if [ -d "$tree" ] && [ "$(git -C "$tree" rev-parse HEAD)" != "$base" ]; then
  git worktree remove --force "$tree"  # another commit's: rebuilt from this one
fi
if [ ! -d "$tree" ]; then
  git worktree add -q --detach "$tree" "$base"
  git -C "$tree" apply "$diff"
fi
tests=${TESTS:-0}
targets=(bench/loom_graph_bench)
[ "$tests" = 1 ] && targets+=(tests/graph_gpu_test tests/gemm_gpu_test)
cmake -S "$tree" -B "$tree/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DLOOM_BUILD_TESTS="$([ "$tests" = 1 ] && echo ON || echo OFF)" -DLOOM_BUILD_DEMOS=OFF >/dev/null
ninja -C "$tree/build" "${targets[@]}"
mkdir -p "$dest"
for target in "${targets[@]}"; do
  cp "$tree/build/$target" "$dest/$(basename "$target")-$name"
done
echo "built $dest/loom_graph_bench-$name (main $(git -C "$tree" rev-parse --short HEAD) + $name.diff)"
