#!/usr/bin/env bash
# Multi-LoRA serving's cost (BENCHMARKS.md, issue 33), on the ~110M random model (F16) with
# random rank-16 adapters of every attention and FFN matrix (`troupe make-lora`, F16 as
# converted adapters usually are; TYPE=f32 for F32 ones):
#  1. offline throughput, 32 requests over 8 adapters against the same 32 on the base model
#     alone, ROUNDS rounds taking turns (the ratio of each round, and their median);
#  2. the forward pass alone at batch 1 (one adapter) and 32 (eight), each step timed beside
#     the base model's in the same process (`bench forward --lora`);
#  3. an adapter's load time (read, checked, transposed), from the throughput runs.
#   ROUNDS=3 INPUT=64 OUTPUT=128 TYPE=f16 scripts/bench-lora.sh
set -euo pipefail
cd "$(dirname "$0")/.."
troupe=${TROUPE:-build/app/troupe}
out=${OUT:-build/bench}
rounds=${ROUNDS:-3}
input=${INPUT:-64}
output=${OUTPUT:-128}
type=${TYPE:-f16}
mkdir -p "$out"
model=${MODEL:-$out/rand-110m-f16.gguf}
[ -f "$model" ] || "$troupe" make-model --preset 110m --type f16 --out "$model" 2>/dev/null
adapters=()
for i in 1 2 3 4 5 6 7 8; do
  file="$out/lora-r16-$type-$i.gguf"
  [ -f "$file" ] || "$troupe" make-lora --base "$model" --rank 16 --type "$type" --seed "$i" \
    --out "$file" 2>/dev/null
  adapters+=("$file")
done

echo "model $model; adapters: 8 x rank 16 ($type), all attention and FFN matrices"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(date -u '+%Y-%m-%d %H:%M UTC')"
throughput() {  # prints output tokens/s; the LoRA run's load time to $out/lora-load.txt
  local json=$out/lora-throughput.json
  "$troupe" bench throughput --model "$model" --num-prompts 32 --input-len "$input" \
    --output-len "$output" --output-json "$json" "$@" >/dev/null 2>&1
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['output_throughput'], r.get('mean_lora_load_ms', ''))" "$json"
}
base_all=() lora_all=()
for round in $(seq "$rounds"); do
  read -r base _ < <(throughput)
  read -r lora load < <(throughput --lora "${adapters[@]}")
  base_all+=("$base")
  lora_all+=("$lora")
  printf 'round %d: base %.1f tok/s, 8 adapters %.1f tok/s: %.3fx; an adapter loads in %.1f ms\n' \
    "$round" "$base" "$lora" "$(python3 -c "print($lora / $base)")" "$load"
done
python3 - "${base_all[*]}" "${lora_all[*]}" <<'PY'
import statistics, sys
base = [float(v) for v in sys.argv[1].split()]
lora = [float(v) for v in sys.argv[2].split()]
ratios = sorted(l / b for b, l in zip(base, lora))
print(f"32 requests over 8 adapters / base alone: median of the rounds' ratios "
      f"{statistics.median(ratios):.3f}x (each: {', '.join(f'{r:.3f}' for r in ratios)})")
PY
"$troupe" bench forward --model "$model" --lora "${adapters[0]}" --batch 1 --gen-len 64 \
  --prompt-len 128 2>/dev/null | grep -E '^(prefill|decode|LoRA)'
"$troupe" bench forward --model "$model" --lora "${adapters[@]}" --batch 32 --gen-len 32 \
  --prompt-len 128 2>/dev/null | grep -E '^(decode|LoRA)'
