#!/usr/bin/env bash
# Forward-pass benchmark of BENCHMARKS.md: the ~110M random model of issue 14's
# side-by-side table with llama.cpp (dim 768, 12 layers, 12 heads, 12 KV heads,
# FFN 2048, the Llama-2 vocabulary, tied output) in F32, F16, Q8_0 and Q4_K_M
# (llama.cpp's mix of Q4_K and Q6_K), prompt 512, 128 decode steps, batches 1-64,
# and the machine's memory read bandwidth beside batch-1 decode.
set -euo pipefail
cd "$(dirname "$0")/.."
troupe=${TROUPE:-build/app/troupe}
threads=${THREADS:-2}
types=${TYPES:-"f32 f16 q8_0 q4_k_m"}
out=${OUT:-build/bench}
mkdir -p "$out"
vocab=()
if [ -f ../shared/vocab/ggml-vocab-llama-spm.gguf ]; then
  vocab=(--vocab ../shared/vocab/ggml-vocab-llama-spm.gguf)  # the real Llama-2 vocabulary
fi
echo "# $(date -u +%Y-%m-%d) $(uname -m), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for type in $types; do
  model="$out/rand-110m-kv12-$type.gguf"
  [ -f "$model" ] || "$troupe" make-model --preset 110m --kv-heads 12 --type "$type" "${vocab[@]}" \
    --out "$model" 2>/dev/null
  echo "## $type: $troupe bench forward --model $model --threads $threads --prompt-len 512 --gen-len 128 --batch 1,8,32,64 --memory-bandwidth"
  "$troupe" bench forward --model "$model" --threads "$threads" --prompt-len 512 --gen-len 128 \
    --batch 1,8,32,64 --memory-bandwidth --output-json "$out/forward-$type.json"
done
