#!/usr/bin/env bash
# Goodput under open-loop arrivals (BENCHMARKS.md, issue 35): for each token budget and
# request rate a fresh `troupe serve` of the ~110M random model (F16, 2 threads), and
# `troupe bench serve` against it with Poisson arrivals and the objectives TTFT <= 4 s,
# TPOT <= 0.25 s. DISTURB=1 adds the disturbed start: both cores busy for 8 s from the
# moment the server starts (its calibration included), the client sent as soon as it
# serves. Prints one line per run: budget, rate, goodput, good/total, TTFT p50/p99,
# TPOT p50/p99, the budget the server started with, and the CPU time of every other
# process during the run (cores, from /proc/stat less the server's and the client's).
# A budget "slo" is auto with --target-tpot-ms 250; TROUPE_OLD=path adds "old-auto", the
# default of another build (e.g. main before the budget's probes) on the same file; a
# budget "llama" serves the same file with $LLAMA_SERVER (llama-server, --parallel 16).
#   RATES="3 5" BUDGETS="auto slo 256 2048" NUM=60 DISTURB=1 scripts/bench-goodput.sh
set -euo pipefail
cd "$(dirname "$0")/.."
troupe=${TROUPE:-build/app/troupe}
out=${OUT:-build/bench}
port=${PORT:-18830}
num=${NUM:-60}
mkdir -p "$out"
model=${MODEL:-$out/rand-110m-f16.gguf}
vocab=()
[ -f ../shared/vocab/ggml-vocab-llama-spm.gguf ] && vocab=(--vocab ../shared/vocab/ggml-vocab-llama-spm.gguf)
[ -f "$model" ] || "$troupe" make-model --preset 110m --type f16 "${vocab[@]}" --out "$model" 2>/dev/null

busy_jiffies() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
proc_jiffies() { awk '{print $14+$15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
hz=$(getconf CLK_TCK)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# run BUDGET RATE TAG [disturbed]
run() {
  local budget=$1 rate=$2 tag=$3 disturbed=${4:-}
  local log="$out/goodput-$tag.log" json="$out/goodput-$tag.json"
  local spinners=()
  if [ -n "$disturbed" ]; then
    for _ in 1 2; do timeout 8 sh -c 'while :; do :; done' & spinners+=($!); done
  fi
  local binary=$troupe flags=(--max-num-batched-tokens "$budget") client_flags=()
  case $budget in
    slo) flags=(--max-num-batched-tokens auto --target-tpot-ms 250) ;;
    old-auto) binary=$TROUPE_OLD flags=(--max-num-batched-tokens auto) ;;
  esac
  local server
  # A port of its own for each run: the last run's server, or its connections, may still
  # hold the one before for a moment (llama-server's does).
  port=$((port + 1))
  while [ "$(ss -tanH "sport = :$port" | wc -l)" != 0 ]; do port=$((port + 1)); done
  if [ "$budget" = llama ]; then
    # LLAMA_SERVER: llama.cpp's (or ik_llama.cpp's) llama-server, 16 slots of 512 tokens.
    # LLAMA_FLAGS: more of its flags (e.g. ik_llama.cpp's -rtr, its run-time repacking).
    # shellcheck disable=SC2086
    "$LLAMA_SERVER" -m "$model" --port "$port" -t 2 --parallel 16 -c 8192 -fa on ${LLAMA_FLAGS:-} \
      2>"$log" >&2 &
    server=$!
    client_flags=(--vocab-size "${VOCAB_SIZE:-32000}")
    for _ in $(seq 1 600); do
      curl -s "http://127.0.0.1:$port/health" | grep -q ok && { echo "serving '$model'" >>"$log"; break; }
      sleep 0.1
    done
  else
    "$binary" serve --model "$model" --port "$port" --threads 2 "${flags[@]}" 2>"$log" &
    server=$!
  fi
  pids=("$server" "${spinners[@]}")
  for _ in $(seq 1 600); do grep -qs "serving '" "$log" && break; sleep 0.1; done
  local j0 s0 t0
  j0=$(busy_jiffies); s0=$(proc_jiffies "$server"); t0=$(date +%s.%N)
  /usr/bin/time -f "%U %S" -o "$out/goodput-$tag.time" "$troupe" bench serve --port "$port" \
    --num-prompts "$num" --input-len 80 --output-len 96 --range-ratio 0.33 \
    --request-rate "$rate" --seed 1 --goodput ttft:4000 tpot:250 \
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 \
    --disable-tqdm --output-json "$json" "${client_flags[@]}" >"$out/goodput-$tag.txt"
  local j1 s1 t1
  j1=$(busy_jiffies); s1=$(proc_jiffies "$server"); t1=$(date +%s.%N)
  kill "$server"; wait "$server" 2>/dev/null || true
  # llama-server leaves a process of its own: end whatever still listens on the port.
  for listener in $(ss -ltnpH "sport = :$port" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do
    kill "$listener" 2>/dev/null || true
  done
  for p in "${spinners[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
  local client other
  client=$(awk '{print $1+$2}' "$out/goodput-$tag.time")
  other=$(awk -v j="$((j1 - j0))" -v s="$((s1 - s0))" -v c="$client" -v hz="$hz" \
    -v t="$(echo "$t1 - $t0" | bc)" 'BEGIN{printf "%.2f", ((j - s) / hz - c) / t}')
  local start
  # (llama-server prints no budget)
  start=$(grep -o 'token budget: .*' "$log" | head -1 | sed 's/.*(\(.*\))$/\1/' || true)
  python3 - "$json" "$budget" "$rate" "$tag" "$other" "$start" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[4]:<20} budget {sys.argv[2]:>8} rate {sys.argv[3]:>4}  goodput {r['request_goodput']:.2f} "
      f"({r['good_completed']}/{r['num_prompts']}, {r['completed']} done)  "
      f"TTFT p50/p99 {r['p50_ttft_ms']/1000:.2f}/{r['p99_ttft_ms']/1000:.2f} s  "
      f"TPOT p50/p99 {r['p50_tpot_ms']/1000:.3f}/{r['p99_tpot_ms']/1000:.3f} s  "
      f"out {r['output_throughput']:.0f} tok/s  dur {r['duration']:.1f} s  other {sys.argv[5]} cores  [{sys.argv[6]}]")
PY
}

echo "# $(date -u '+%Y-%m-%d %H:%M UTC') $(git rev-parse --short HEAD) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for rate in ${RATES:-3 5}; do
  for budget in ${BUDGETS:-auto slo 256 2048}; do
    run "$budget" "$rate" "$budget-r$rate"
  done
  if [ "${DISTURB:-0}" = 1 ]; then
    for budget in ${DISTURB_BUDGETS:-auto}; do
      run "$budget" "$rate" "disturbed-$budget-r$rate" disturbed
    done
  fi
done
