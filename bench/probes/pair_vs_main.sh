#!/usr/bin/env bash
# Main against the pair split (bench/NOTES.md v2.01-v2.02) in turns, on the
# H200 only: exits at once on any other card, so a call that lands on an
# H100 costs only its start. Each run is a separate process with the same
# flags but the variant's; then one traced launch (--timeline_csv) of main
# and of the pair split with claim pacing 8, kept under $OUT.
#   usage (on the device, carry [".device-carry"]):
#     bash bench/probes/pair_vs_main.sh [ROUNDS=3] [TOKENS=48,64] [DIR=.device-carry]
set -u
rounds=${1:-3}
tokens=${2:-48,64}
dir=${3:-.device-carry}
out=${OUT:-/tmp/out}
mkdir -p "$out"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $card"
case $card in *H200*) ;; *) echo "not an H200: nothing timed"; exit 3 ;; esac
export LD_LIBRARY_PATH=$PWD/$dir/lib:${LD_LIBRARY_PATH:-}
flags=(--pack_weights --run_length=10 --iters=40 --rounds=1 --chain_tokens=)
variants=("" "--narrow_pair_split" "--narrow_pair_split --narrow_claim_stages=8"
          "--narrow_pair_split --narrow_claim_stages=8 --narrow_b_in_flight=3"
          "--narrow_pair_split --narrow_claim_stages=4")
log=$(mktemp)
for ((r = 1; r <= rounds; ++r)); do
  for variant in "${variants[@]}"; do
    # shellcheck disable=SC2086  # the variant is several flags
    timeout 120 "$dir/loom_graph_bench" "${flags[@]}" --tokens="$tokens" $variant > "$log" 2>&1
    rc=$?
    grep -E "^mlp +[0-9]+ " "$log" | sed "s|^|round $r [${variant:-main}] rc=$rc: |"
  done
done | tee "$out/pair_vs_main.txt"
grep -iE "copy bandwidth" "$log" | head -1
for variant in "" "--narrow_pair_split --narrow_claim_stages=8"; do
  name=$([ -z "$variant" ] && echo main || echo pair8)
  # shellcheck disable=SC2086
  timeout 120 "$dir/loom_graph_bench" "${flags[@]}" --tokens=64 $variant --timeline \
    --timeline_csv="$out/tl_$name.csv" > "$out/tl_$name.txt" 2>&1
  echo "timeline $name rc=$?: $(grep -E '^mlp +64 ' "$out/tl_$name.txt")"
done
rm -f "$log"
