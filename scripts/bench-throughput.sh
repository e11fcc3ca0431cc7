#!/usr/bin/env bash
# Engine throughput benchmarks of BENCHMARKS.md on the ~110M random model (F16):
# Anyscale-style continuous vs static batching, shared prefix with and without
# the prefix cache, and the scheduler's overhead with 256 running sequences.
set -euo pipefail
cd "$(dirname "$0")/.."
troupe=${TROUPE:-build/app/troupe}
threads=${THREADS:-2}
out=${OUT:-build/bench}
runs=${RUNS:-"anyscale-continuous anyscale-static anyscale-short-continuous anyscale-short-static shared-prefix shared-prefix-off many-seqs"}
mkdir -p "$out"
model="$out/rand-110m-f16.gguf"
vocab=()
[ -f ../shared/vocab/ggml-vocab-llama-spm.gguf ] && vocab=(--vocab ../shared/vocab/ggml-vocab-llama-spm.gguf)
[ -f "$model" ] || "$troupe" make-model --preset 110m --type f16 "${vocab[@]}" --out "$model" 2>/dev/null
common=(--model "$model" --threads "$threads" --seed 1)
echo "# $(date -u +%Y-%m-%d) $(uname -m), $(nproc) cores"
for run in $runs; do
  case $run in
    anyscale-continuous) args=(--dataset-name anyscale --num-prompts 256 --input-len 512 --output-len 128
                               --batching continuous --max-num-seqs 32 --max-num-batched-tokens 512) ;;
    anyscale-static)     args=(--dataset-name anyscale --num-prompts 256 --input-len 512 --output-len 128
                               --batching static --max-num-seqs 32) ;;
    anyscale-short-continuous) args=(--dataset-name anyscale --num-prompts 256 --input-len 32 --output-len 128
                               --batching continuous --max-num-seqs 32 --max-num-batched-tokens 512) ;;
    anyscale-short-static) args=(--dataset-name anyscale --num-prompts 256 --input-len 32 --output-len 128
                               --batching static --max-num-seqs 32) ;;
    shared-prefix)       args=(--dataset-name shared-prefix --num-prompts 256 --prefix-len 512 --input-len 32
                               --output-len 64 --max-num-seqs 32 --max-num-batched-tokens 512) ;;
    shared-prefix-off)   args=(--dataset-name shared-prefix --num-prompts 256 --prefix-len 512 --input-len 32
                               --output-len 64 --max-num-seqs 32 --max-num-batched-tokens 512 --no-prefix-caching) ;;
    many-seqs)           args=(--dataset-name random --num-prompts 256 --input-len 32 --output-len 128
                               --max-num-seqs 256 --max-num-batched-tokens 2048) ;;
    *) echo "unknown run $run" >&2; exit 1 ;;
  esac
  echo "## $run: $troupe bench throughput ${common[*]} ${args[*]}"
  "$troupe" bench throughput "${common[@]}" "${args[@]}" --output-json "$out/throughput-$run.json"
done
