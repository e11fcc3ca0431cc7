#!/usr/bin/env bash
# The CPU kernel benchmark of BENCHMARKS.md (issue 29): issue 14's dense 110M shape
# (`make-model --preset 110m --kv-heads 12`, tied output, the Llama-2 vocabulary) in each of
# TYPES; troupe's prefill of 512 and decode at 1, 8 and 32 streams after 128 tokens of
# history; where TROUPE_BEFORE names another troupe binary, the same through it (a before and
# after in one run); and where IK_LLAMA names a CPU build of ik_llama.cpp (its build/bin),
# the same file through its llama-bench (pp512, tg128) and llama-batched-bench (128 + 128 at
# 8 and 32 streams). Engines alternate, ROUNDS times.
set -euo pipefail
cd "$(dirname "$0")/.."
troupe=${TROUPE:-build/app/troupe}
before=${TROUPE_BEFORE:-}
threads=${THREADS:-2}
types=${TYPES:-"f16 q8_0 q4_k_m"}
rounds=${ROUNDS:-2}
gen=${GEN_LEN:-128}
ik=${IK_LLAMA:-}
out=${OUT:-build/bench}
mkdir -p "$out"
vocab=()
if [ -f ../shared/vocab/ggml-vocab-llama-spm.gguf ]; then
  vocab=(--vocab ../shared/vocab/ggml-vocab-llama-spm.gguf)
fi
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -m), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
run_troupe() {
  "$1" bench forward --model "$2" --threads "$threads" --prompt-len 512 --gen-len "$gen" \
    --batch 1,8,32 --context 128 2>&1 | grep -E '^(prefill|decode)'
}
for type in $types; do
  model="$out/r110m-$type.gguf"
  [ -f "$model" ] || "$troupe" make-model --preset 110m --kv-heads 12 --type "$type" \
    "${vocab[@]}" --out "$model" 2>/dev/null
  for round in $(seq "$rounds"); do
    echo "## $type, round $round: troupe bench forward --model $model --threads $threads --prompt-len 512 --gen-len $gen --batch 1,8,32 --context 128"
    run_troupe "$troupe" "$model"
    if [ -n "$before" ]; then
      echo "## $type, round $round: the same through $before"
      run_troupe "$before" "$model"
    fi
    if [ -n "$ik" ]; then
      echo "## $type, round $round: llama-bench -m $model -t $threads -fa 1 -rtr 1 -p 512 -n $gen -r 2"
      "$ik/llama-bench" -m "$model" -t "$threads" -fa 1 -rtr 1 -p 512 -n "$gen" -r 2 \
        2>/dev/null | grep -E '^\| llama' || true
      echo "## $type, round $round: llama-batched-bench -m $model -t $threads -fa on -rtr -c 8192 -npp 128 -ntg $gen -npl 8,32"
      "$ik/llama-batched-bench" -m "$model" -t "$threads" -fa on -rtr -c 8192 \
        -npp 128 -ntg "$gen" -npl 8,32 2>&1 | grep -E '^\| +[0-9]' || true
    fi
  done
done
