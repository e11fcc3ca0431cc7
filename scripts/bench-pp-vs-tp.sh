#!/usr/bin/env bash
# Pipeline against tensor parallelism as the link's latency grows (issue 34, BENCHMARKS.md):
# `troupe bench throughput` on MODEL split in two, --tp 2 and --pp 2 (with 1 and with 2
# steps in flight), one thread a worker, at each batch in BATCHES (requests submitted at
# once, INPUT prompt tokens, OUTPUT greedy tokens each) and each emulated one-way link
# delay in DELAYS (microseconds). The two workers are threads of one process talking Gloo
# over loopback; the delay is TROUPE_GLOO_LINK_DELAY_US (cpu/gloo_communicator.hpp), the
# stand-in for `tc netem` on a kernel without queueing disciplines: a point-to-point
# message arrives no sooner than its send time plus the delay, a collective returns the
# delay after it completes. Prints a line per run: output tok/s and the mean step time.
# SPLITS picks the splits: tp2, pp2-1 and pp2-2 (1 and 2 steps in flight) by default; tp4
# and pp2xtp2 (two stages of two ranks, the stages' all-reduces spared the delay, as on
# two machines of two ranks each: TROUPE_GLOO_LINK_DELAY_SCOPE=between-nodes) compare four
# workers, TP across the link against TP within a node and PP across it.
#   scripts/bench-pp-vs-tp.sh
#   SPLITS="tp4 pp2xtp2" scripts/bench-pp-vs-tp.sh
#   MODEL=../shared/models/stories260K.gguf BATCHES=1 DELAYS="0 1000" scripts/bench-pp-vs-tp.sh  # quick
set -euo pipefail
cd "$(dirname "$0")/.."
troupe=${TROUPE:-build/app/troupe}
out=${OUT:-build/bench}
batches=${BATCHES:-1 32}
delays=${DELAYS:-0 200 1000}
input=${INPUT:-32}
output=${OUTPUT:-64}
splits=${SPLITS:-tp2 pp2-1 pp2-2}
mkdir -p "$out"
vocab=()
[ -f ../shared/vocab/ggml-vocab-llama-spm.gguf ] && vocab=(--vocab ../shared/vocab/ggml-vocab-llama-spm.gguf)
model=${MODEL:-$out/rand-110m-f16.gguf}
[ -f "$model" ] || "$troupe" make-model --preset 110m --type f16 "${vocab[@]}" --out "$model" 2>/dev/null
echo "# $(date -u '+%Y-%m-%d %H:%M UTC') $(uname -m), $(nproc) cores; $model, $input + $output tokens a request, 1 thread a worker"
printf '%-8s %-6s %-22s %10s %12s\n' delay batch split "tok/s" "ms/step"
for delay in $delays; do
  for batch in $batches; do
    for split in $splits; do
      case $split in
        tp2) flags=(--tp 2) ;;
        tp4) flags=(--tp 4) ;;
        pp2-1) flags=(--pp 2 --pp-steps-in-flight 1) ;;
        pp2-2) flags=(--pp 2 --pp-steps-in-flight 2) ;;
        pp2xtp2) flags=(--pp 2 --tp 2 --pp-steps-in-flight 2) ;;
        *) echo "unknown split $split" >&2; exit 2 ;;
      esac
      result=$(TROUPE_GLOO_LINK_DELAY_US=$delay TROUPE_GLOO_LINK_DELAY_SCOPE=between-nodes \
        "$troupe" bench throughput -m "$model" \
        --input-len "$input" --output-len "$output" --num-prompts "$batch" --temperature 0 \
        --seed 1 -t 1 "${flags[@]}" 2>/dev/null || true)
      rate=$(awk '/Output token throughput/ {print $NF}' <<<"$result")
      step=$(awk '/^Iterations:/ {print $3}' <<<"$result")
      printf '%-8s %-6s %-22s %10s %12s\n' "${delay}us" "$batch" "$split" "${rate:-failed}" "${step:-}"
    done
  done
done
