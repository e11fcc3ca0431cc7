#!/usr/bin/env bash
# Issue 36's end-to-end check of speculative decoding (BENCHMARKS.md): three servers in
# turn on the 110M random model in F16 — plain, a draft model (the same weights in Q8_0),
# n-gram lookup — each answering the same four greedy 192-token completions one after
# another. Prints each server's wall time and decode rate, its speed-up over the plain
# one, whether its four texts equal the plain server's byte for byte, and its spec-decode
# counters from /metrics. LLAMA_SERVER=path adds llama.cpp's (or ik_llama.cpp's)
# llama-server on the same pair, plain and with the draft (ik_llama.cpp's --spec-type
# draft:n_max=k,p_min=0.0, or llama.cpp's --draft-max k --draft-min 0 --draft-p-min 0), the
# same four requests: its speed-up is over its own plain run, its
# texts are compared with its own plain run's, and its draft counters come from the
# responses' timings.
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
names=(plain draft ngram)
[ -n "${LLAMA_SERVER:-}" ] && names+=(llama_plain llama_draft)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; true' EXIT
echo "# $(date -u '+%Y-%m-%d %H:%M UTC') $(uname -m), $(nproc) cores; target $target, draft $draft, k=$k"
for round in $(seq "$rounds"); do
  for name in "${names[@]}"; do
    log="$out/spec-$name.log"
    port=""
    case $name in
      llama_*)
        port=${LLAMA_PORT:-18870}
        # LLAMA_FLAGS: more of its flags (e.g. ik_llama.cpp's -rtr, its run-time repacking).
        # shellcheck disable=SC2206
        args=(-m "$target" --port "$port" -t "$threads" -c 2048 ${LLAMA_FLAGS:-})
        if [ "$name" = llama_draft ]; then
          # ik_llama.cpp takes the draft's length in --spec-type; llama.cpp in --draft-max.
          # (the help read whole first: grep -q would cut the pipe, failing it under pipefail)
          help=$("$LLAMA_SERVER" --help 2>&1 || true)
          if grep -q -- '--spec-type' <<<"$help"; then
            args+=(-md "$draft" --spec-type "draft:n_max=$k,p_min=0.0")
          else
            args+=(-md "$draft" --draft-max "$k" --draft-min 0 --draft-p-min 0)
          fi
        fi
        "$LLAMA_SERVER" "${args[@]}" >"$log" 2>&1 &
        pid=$!
        for _ in $(seq 600); do
          curl -s "http://127.0.0.1:$port/health" | grep -q ok && break
          sleep 0.1
        done
        curl -s "http://127.0.0.1:$port/health" | grep -q ok || port=""
        ;;
      *)
        args=(serve --model "$target" --threads "$threads" --port 0)
        [ -n "${configs[$name]}" ] && args+=(--speculative-config "${configs[$name]}")
        "$troupe" "${args[@]}" >"$log" 2>&1 &
        pid=$!
        for _ in $(seq 600); do
          port=$(grep -oE 'serving .* at https?://127\.0\.0\.1:[0-9]+' "$log" | grep -oE '[0-9]+$' || true)
          [ -n "$port" ] && break
          sleep 0.1
        done
        ;;
    esac
    [ -n "$port" ] || { echo "$name: the server did not start"; cat "$log"; exit 1; }
    start=$(date +%s.%N)
    for i in "${!prompts[@]}"; do
      curl -s --max-time 300 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\": \"${prompts[$i]}\", \"max_tokens\": 192, \"temperature\": 0, \"ignore_eos\": true}" \
        >"$out/spec-$name-$i.json"
    done
    end=$(date +%s.%N)
    drafted=0 accepted=0
    for i in "${!prompts[@]}"; do
      python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' \
        "$out/spec-$name-$i.json" >"$out/spec-$name-$i.txt"
      read -r d a < <(python3 -c 'import json,sys; t=json.load(open(sys.argv[1])).get("timings") or {}; print(t.get("draft_n", 0), t.get("draft_n_accepted", 0))' \
        "$out/spec-$name-$i.json")
      drafted=$((drafted + d)) accepted=$((accepted + a))
    done
    metrics=$(curl -s "http://127.0.0.1:$port/metrics" || true)
    kill "$pid"; wait "$pid" 2>/dev/null || true
    # llama-server leaves a process of its own holding the port: end whatever listens there.
    for listener in $(ss -ltnpH "sport = :$port" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do
      kill "$listener" 2>/dev/null || true
    done
    pid=""
    seconds=$(python3 -c "print(f'{$end - $start:.2f}')")
    eval "seconds_$name=$seconds"
    base=plain
    [[ $name == llama_* ]] && base=llama_plain
    base_seconds_var="seconds_$base"
    same=yes
    for i in "${!prompts[@]}"; do cmp -s "$out/spec-$name-$i.txt" "$out/spec-$base-$i.txt" || same=no; done
    if [[ $name == llama_* ]]; then
      counters="draft_tokens=$drafted accepted_tokens=$accepted"
    else
      counters=$(echo "$metrics" | grep -E '^troupe_spec_decode_num_(drafts|draft_tokens|accepted_tokens)_total' |
        sed -E 's/^troupe_spec_decode_num_([a-z_]+)_total\{[^}]*\} /\1=/' | tr '\n' ' ')
    fi
    python3 - "$name" "$seconds" "${!base_seconds_var}" "$same" "$counters" "$base" <<'PY'
import sys
name, s, plain, same, counters, base = sys.argv[1:]
s, plain = float(s), float(plain)
print(f"{name:11s} {s:7.2f} s for 4 x 192 tokens ({4*192/s:6.1f} tok/s), {plain/s:.2f}x {base}, "
      f"same text as {base}: {same}; {counters}")
PY
  done
done
