#!/usr/bin/env bash
# Online benchmark of BENCHMARKS.md: troupe serve on the ~110M random model
# (F16), troupe bench serve against it at concurrency 1, 16 and 64. Server and
# client share the machine. MODEL=path serves another model instead (any
# vocabulary: the client reads its size and context from /v1/models);
# INPUT_LEN and OUTPUT_LEN set the random dataset's lengths.
set -euo pipefail
cd "$(dirname "$0")/.."
troupe=${TROUPE:-build/app/troupe}
threads=${THREADS:-2}
out=${OUT:-build/bench}
port=${PORT:-18800}
mkdir -p "$out"
model=${MODEL:-$out/rand-110m-f16.gguf}
vocab=()
[ -f ../shared/vocab/ggml-vocab-llama-spm.gguf ] && vocab=(--vocab ../shared/vocab/ggml-vocab-llama-spm.gguf)
[ -f "$model" ] || "$troupe" make-model --preset 110m --type f16 "${vocab[@]}" --out "$model" 2>/dev/null
"$troupe" serve --model "$model" --port "$port" --threads "$threads" --max-num-batched-tokens 512 \
  2>"$out/serve.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
for _ in $(seq 1 300); do grep -q serving "$out/serve.log" && break; sleep 0.1; done
echo "# $(date -u +%Y-%m-%d) $(uname -m), $(nproc) cores"
for concurrency in ${CONCURRENCY:-1 16 64}; do
  prompts=$(( concurrency < 16 ? 16 : concurrency * 2 ))
  args=(--port "$port" --num-prompts "$prompts" --input-len "${INPUT_LEN:-128}"
        --output-len "${OUTPUT_LEN:-64}" --request-rate inf
        --max-concurrency "$concurrency" --seed 1 --output-json "$out/serve-c$concurrency.json")
  echo "## $troupe bench serve ${args[*]}"
  "$troupe" bench serve "${args[@]}"
done
