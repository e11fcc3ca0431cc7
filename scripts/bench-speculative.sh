#!/usr/bin/env bash
# Issue 36's end-to-end check of speculative decoding (BENCHMARKS.md): three servers in
# turn on the 110M random model in F16 — plain, a draft model (the same weights in Q8_0),
# n-gram lookup — each answering the same four greedy 192-token completions one after
# another. Prints each server's wall time and decode rate, its speed-up over the plain
# one, whether its four texts equal the plain server's byte for byte, and its spec-decode
# counters from /metrics.
set -euo pipefail
cd "$(dirname "$0")/.."
troupe=${TROUPE:-build/app/troupe}
threads=${THREADS:-2}
out=${OUT:-build/bench}
k=${K:-3}
rounds=${ROUNDS:-1}
mkdir -p "$out"
vocab=()
[ -f ../shared/vocab/ggml-vocab-llama-spm.gguf ] && vocab=(--vocab ../shared/vocab/ggml-vocab-llama-spm.gguf)
target=${TARGET:-$out/rand-110m-f16.gguf}
draft=${DRAFT:-$out/rand-110m-q8_0.gguf}
[ -f "$target" ] || "$troupe" make-model --preset 110m --type f16 "${vocab[@]}" --out "$target" 2>/dev/null
[ -f "$draft" ] || "$troupe" make-model --preset 110m --type q8_0 "${vocab[@]}" --out "$draft" 2>/dev/null
prompts=("The history of the city" "A list of things to do" "In the beginning there was" "Dear reader, today")
declare -A configs=(
  [plain]=""
  [draft]="{\"model\": \"$draft\", \"num_speculative_tokens\": $k}"
  [ngram]='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}'
)
echo "# $(date -u '+%Y-%m-%d %H:%M UTC') $(uname -m), $(nproc) cores; target $target, draft $draft, k=$k"
for round in $(seq "$rounds"); do
  for name in plain draft ngram; do
    log="$out/spec-$name.log"
    args=(serve --model "$target" --threads "$threads" --port 0)
    [ -n "${configs[$name]}" ] && args+=(--speculative-config "${configs[$name]}")
    "$troupe" "${args[@]}" >"$log" 2>&1 &
    pid=$!
    port=""
    for _ in $(seq 600); do
      port=$(grep -oE 'serving .* at https?://127\.0\.0\.1:[0-9]+' "$log" | grep -oE '[0-9]+$' || true)
      [ -n "$port" ] && break
      sleep 0.1
    done
    [ -n "$port" ] || { echo "$name: the server did not start"; cat "$log"; kill $pid; exit 1; }
    start=$(date +%s.%N)
    for i in "${!prompts[@]}"; do
      curl -s --max-time 300 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\": \"${prompts[$i]}\", \"max_tokens\": 192, \"temperature\": 0, \"ignore_eos\": true}" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])' >"$out/spec-$name-$i.txt"
    done
    end=$(date +%s.%N)
    metrics=$(curl -s "http://127.0.0.1:$port/metrics")
    kill $pid; wait $pid 2>/dev/null || true
    seconds=$(python3 -c "print(f'{$end - $start:.2f}')")
    eval "seconds_$name=$seconds"
    same=yes
    for i in "${!prompts[@]}"; do cmp -s "$out/spec-$name-$i.txt" "$out/spec-plain-$i.txt" || same=no; done
    counters=$(echo "$metrics" | grep -E '^troupe_spec_decode_num_(drafts|draft_tokens|accepted_tokens)_total' |
      sed -E 's/^troupe_spec_decode_num_([a-z_]+)_total\{[^}]*\} /\1=/' | tr '\n' ' ')
    python3 - "$name" "$seconds" "${seconds_plain}" "$same" "$counters" <<'PY'
import sys
name, s, plain, same, counters = sys.argv[1:]
s, plain = float(s), float(plain)
print(f"{name:6s} {s:7.2f} s for 4 x 192 tokens ({4*192/s:6.1f} tok/s), {plain/s:.2f}x the plain server, "
      f"same text: {same}; {counters}")
PY
  done
done
