#!/usr/bin/env bash
# The whole leading tiles' GPU tests, then the pair
# split with whole leading tiles (bench/NOTES.md v2.07) at 64 tokens on
# whatever card comes: its ring depths, B stages in flight and
# claim pacing (first guesses, v2.02, never tried on an H200) and leads of
# 16-40 k-blocks (v2.09; 32 was the H100's best) against its defaults and main, in turns, each run a separate process beside cuBLAS.
#   usage (on the device, carry [".device-carry"]):
#     bash bench/probes/whole_rings.sh [ROUNDS=3] [DIR=.device-carry]
set -u
# shellcheck source=bench/probes/turns.sh
source "$(dirname "$0")/turns.sh"
probe_setup "${1:-3}" "${2:-.device-carry}"
echo "card: $card"
gpu_tests whole_tests '*WholeTiles*'
flags=(--pack_weights --run_length=10 --iters=40 --rounds=1 --tokens=64 --chain_tokens=)
whole="--narrow_pair_split=on --narrow_split_whole_tiles"
variants=("" "$whole" "$whole --narrow_b_in_flight=3" "$whole --narrow_a_stages=2 --narrow_b_stages=5 --narrow_b_in_flight=4"
          "$whole --narrow_a_stages=4 --narrow_b_stages=3" "$whole --narrow_claim_stages=16" "$whole --narrow_claim_stages=4"
          "$whole --narrow_split_lead_k_blocks=16" "$whole --narrow_split_lead_k_blocks=24"
          "$whole --narrow_split_lead_k_blocks=32" "$whole --narrow_split_lead_k_blocks=40"
          "$whole --narrow_split_lead_k_blocks=24 --narrow_claim_stages=16")
bench_table whole_rings
