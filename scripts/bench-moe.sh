#!/usr/bin/env bash
# The mixture-of-experts benchmark of BENCHMARKS.md (issue 28): `make-model --preset moe`
# (qwen3moe, dim 1024, 8 layers, 16/4 heads of 64, 32 experts of FFN 512 with 4 used, the
# Llama-2 vocabulary) in Q4_K_M and Q8_0; troupe's prefill of 512, and decode at 1, 8 and 32
# streams from an empty cache and after 128 tokens of history; and, where IK_LLAMA names a
# CPU build of ik_llama.cpp (its build/bin), the same file through its llama-bench (pp512,
# tg128) and llama-batched-bench (128 + 128 at 8 and 32 streams) in the same run,
# alternating the two engines ROUNDS times.
set -euo pipefail
cd "$(dirname "$0")/.."
troupe=${TROUPE:-build/app/troupe}
threads=${THREADS:-2}
types=${TYPES:-"q4_k_m q8_0"}
rounds=${ROUNDS:-2}
ik=${IK_LLAMA:-}
out=${OUT:-build/bench}
mkdir -p "$out"
vocab=()
if [ -f ../shared/vocab/ggml-vocab-llama-spm.gguf ]; then
  vocab=(--vocab ../shared/vocab/ggml-vocab-llama-spm.gguf)
fi
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -m), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for type in $types; do
  model="$out/moe-$type.gguf"
  [ -f "$model" ] || "$troupe" make-model --preset moe --type "$type" "${vocab[@]}" \
    --out "$model" 2>/dev/null
  for round in $(seq "$rounds"); do
    echo "## $type, round $round: troupe bench forward --model $model --threads $threads --prompt-len 512 --gen-len 128 --batch 1,8,32 --context 0 128"
    "$troupe" bench forward --model "$model" --threads "$threads" --prompt-len 512 \
      --gen-len 128 --batch 1,8,32 --context 0 128 --repetitions 3 2>&1 | grep -v '^model'
    if [ -n "$ik" ]; then
      echo "## $type, round $round: llama-bench -m $model -t $threads -fa 1 -rtr 1 -fmoe 1 -p 512 -n 128 -r 3"
      "$ik/llama-bench" -m "$model" -t "$threads" -fa 1 -rtr 1 -fmoe 1 -p 512 -n 128 -r 3 \
        2>/dev/null | grep -E '^\| (model|qwen3moe|---)' || true
      echo "## $type, round $round: llama-batched-bench -m $model -t $threads -fa on -rtr -c 8192 -npp 128 -ntg 128 -npl 8,32"
      "$ik/llama-batched-bench" -m "$model" -t "$threads" -fa on -rtr -c 8192 \
        -npp 128 -ntg 128 -npl 8,32 2>&1 | grep -E '^\|' || true
    fi
  done
done
