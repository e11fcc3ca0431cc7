#!/usr/bin/env bash
# Structured outputs' cost (issue 13): output tokens/s of `troupe bench throughput` at
# batch 32 with every request held to a JSON schema, against the same run unconstrained,
# greedy and at temperature 1. Runs alternate in pairs whose order flips each time, so a
# drift in the machine's speed falls on both sides; each pair's ratio (constrained over
# free) and their median are printed. A schema's end ends an output even with ignore_eos,
# so the mean output lengths are printed beside the rates. The token budget is fixed
# (--max-num-batched-tokens 2048: the prompts in two steps, then decodes), since the CPU's
# default, auto, is timed at load and so schedules each run of a pair differently.
# Usage: scripts/bench-structured.sh [-m MODEL.gguf]   (default: the built-in random model)
set -euo pipefail
cd "$(dirname "$0")/.."
troupe=${TROUPE:-build/app/troupe}
threads=${THREADS:-2}
pairs=${PAIRS:-3}
schema=${SCHEMA:-bench/schemas/record.json}
input_len=${INPUT_LEN:-128}
output_len=${OUTPUT_LEN:-128}
temperatures=${TEMPERATURES:-"0 1"}
out=${OUT:-build/bench}
model=()
while getopts m: flag; do
  case $flag in
    m) model=(-m "$OPTARG") ;;
    *) echo "usage: $0 [-m MODEL.gguf]" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
common=(bench throughput "${model[@]}" --num-prompts 32 --max-num-seqs 32 --input-len "$input_len"
        --output-len "$output_len" --threads "$threads" --max-num-batched-tokens 2048 --seed 1)

# One run; prints "output_tok_per_s mean_output_len".
run() {  # constrained|free temperature json
  local constraint=()
  [ "$1" = constrained ] && constraint=(--json-schema "$schema")
  "$troupe" "${common[@]}" --temperature "$2" "${constraint[@]}" --output-json "$3" >/dev/null
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))
assert r["failed"] == 0, "failed requests"
print("%.1f %.1f" % (r["output_throughput"], r["mean_output_len"]))' "$3"
}

echo "# $(date -u '+%Y-%m-%d %H:%M') UTC $(uname -m), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "# $troupe ${common[*]} --temperature T [--json-schema $schema] --output-json FILE"
for temperature in $temperatures; do
  ratios=()
  for pair in $(seq 1 "$pairs"); do
    order=(constrained free)
    [ $((pair % 2)) -eq 0 ] && order=(free constrained)
    for kind in "${order[@]}"; do
      result=$(run "$kind" "$temperature" "$out/structured-t$temperature-$pair-$kind.json")
      if [ "$kind" = constrained ]; then read -r c_rate c_len <<<"$result"
      else read -r f_rate f_len <<<"$result"; fi
    done
    ratio=$(awk -v c="$c_rate" -v f="$f_rate" 'BEGIN { printf "%.3f", c / f }')
    ratios+=("$ratio")
    echo "temperature $temperature pair $pair (${order[0]} first): schema $c_rate tok/s" \
      "(mean output $c_len), free $f_rate tok/s (mean output $f_len): ratio $ratio"
  done
  median=$(printf '%s\n' "${ratios[@]}" | sort -g | awk '{ v[NR] = $1 } END {
    print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  echo "temperature $temperature: median ratio $median (goal: at least 0.9)"
done
