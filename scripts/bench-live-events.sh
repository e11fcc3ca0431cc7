#!/usr/bin/env bash
# The live page's cost (BENCHMARKS.md, issue 16): troupe bench serve at concurrency 16 (CONCURRENCY)
# against one server, alternating runs with no viewer and with a viewer of
# GET /v1/engine/events reading every step (curl, as the page's fetch does), PAIRS pairs.
# Prints each pair's output tokens/s and the ratio with / without, then the median.
# MODEL=path serves another model (default: ../shared's stories260K; MODEL=none, or no
# ../shared: the built-in); PROMPTS sets the requests per run (800).
set -euo pipefail
cd "$(dirname "$0")/.."
troupe=${TROUPE:-build/app/troupe}
out=${OUT:-build/bench}
port=${PORT:-18810}
pairs=${PAIRS:-8}
mkdir -p "$out"
model=${MODEL:-../shared/models/stories260K.gguf}
model_args=()
[ -f "$model" ] && model_args=(--model "$model")
"$troupe" serve "${model_args[@]}" --port "$port" --threads "${THREADS:-1}" --kv-cache-gb 0.1 \
  --disable-log-stats --disable-access-log 2>"$out/live-serve.log" &
pid=$!
viewer=
trap 'kill $pid $viewer 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 1 300); do grep -q serving "$out/live-serve.log" && break; sleep 0.1; done
args=(--port "$port" --input-len 64 --output-len 32 --max-concurrency "${CONCURRENCY:-16}" --seed 1 --disable-tqdm)
prompts=${PROMPTS:-800}
echo "# $(date -u +%Y-%m-%d) $(uname -m), $(nproc) cores; model: ${model_args[*]:-the built-in}"
echo "# $troupe bench serve --num-prompts $prompts ${args[*]}, $pairs pairs"
throughput() {
  "$troupe" bench serve "${args[@]}" --num-prompts "$prompts" --output-json "$out/live.json" >/dev/null
  /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["output_throughput"])' \
    "$out/live.json"
}
"$troupe" bench serve "${args[@]}" --num-prompts 64 >/dev/null  # warm up
ratios=()
for i in $(seq 1 "$pairs"); do
  off=$(throughput)
  curl -sN "http://127.0.0.1:$port/v1/engine/events" >"$out/live-events.txt" &
  viewer=$!
  on=$(throughput)
  kill $viewer; wait $viewer 2>/dev/null || true
  viewer=
  steps=$(grep -c '"type":"step"' "$out/live-events.txt" || true)
  dropped=$(grep -c '"dropped":[1-9]' "$out/live-events.txt" || true)
  ratio=$(/usr/bin/python3 -c "print(f'{$on / $off:.3f}')")
  ratios+=("$ratio")
  printf 'pair %d: off %.1f tok/s, on %.1f tok/s (%d step events, %d with drops): %s\n' \
    "$i" "$off" "$on" "$steps" "$dropped" "$ratio"
done
/usr/bin/python3 -c "import statistics,sys; r=[float(x) for x in sys.argv[1:]]; \
print(f'on/off output tokens/s: median {statistics.median(r):.3f}, range {min(r):.3f}-{max(r):.3f}')" \
  "${ratios[@]}"
