#!/usr/bin/env bash
# What a costly output constraint costs everyone else (issue 27): `troupe bench serve`'s
# inter-token latency and TTFT at concurrency 4 against `troupe serve`, alone, and beside a
# client that sends, one after another, completions held to "abcdefgh<n>" + ".*" * 200 + "z"
# (cheap at its start, so admitted; its next mask then spends its whole work budget, about
# 0.4-1 s of a core, before its request ends with an error). Runs alternate in pairs
# whose order flips each time; each pair's ratio (beside over alone) is printed, and the
# costly client's own tally (how its requests ended, how long each took).
# Usage: scripts/bench-costly-constraint.sh   (MODEL=path for another model)
set -euo pipefail
cd "$(dirname "$0")/.."
troupe=${TROUPE:-build/app/troupe}
threads=${THREADS:-2}
pairs=${PAIRS:-3}
out=${OUT:-build/bench}
port=${PORT:-18810}
mkdir -p "$out"
model=${MODEL:-$out/rand-110m-f16.gguf}
vocab=()
[ -f ../shared/vocab/ggml-vocab-llama-spm.gguf ] && vocab=(--vocab ../shared/vocab/ggml-vocab-llama-spm.gguf)
[ -f "$model" ] || "$troupe" make-model --preset 110m --type f16 "${vocab[@]}" --out "$model" 2>/dev/null
"$troupe" serve --model "$model" --port "$port" --threads "$threads" --max-num-batched-tokens 512 \
  2>"$out/costly-serve.log" &
pid=$!
costly=
trap 'kill $costly $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
for _ in $(seq 1 300); do grep -q serving "$out/costly-serve.log" && break; sleep 0.1; done

args=(--port "$port" --num-prompts 24 --input-len 64 --output-len 64 --request-rate inf
      --max-concurrency 4 --seed 1)
run() {  # alone|beside pair
  local json="$out/costly-$1-$2.json" tally="$out/costly-tally-$2.txt"
  if [ "$1" = beside ]; then
    /usr/bin/python3 - "$port" "$tally" <<'PY' &
import http.client, json, sys, time
port, tally = int(sys.argv[1]), sys.argv[2]
ended, n, took = {}, 0, []
deadline = time.time() + 600
while time.time() < deadline:
    body = {"prompt": "x", "max_tokens": 16, "stream": False,
            "guided_regex": "abcdefgh%d" % n + ".*" * 200 + "z"}
    start = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse(); text = r.read().decode()
    took.append(time.time() - start)
    key = str(r.status) + (" error" if '"finish_reason":"error"' in text.replace(" ", "") else "")
    ended[key] = ended.get(key, 0) + 1
    n += 1
    with open(tally, "w") as f:
        f.write("%d costly requests: %s; each took %.2f-%.2f s\n" % (
            n, ", ".join("%s x%d" % kv for kv in sorted(ended.items())), min(took), max(took)))
PY
    costly=$!
    sleep 1
  fi
  "$troupe" bench serve "${args[@]}" --output-json "$json" >/dev/null 2>&1
  if [ -n "$costly" ]; then kill "$costly" 2>/dev/null; wait "$costly" 2>/dev/null || true; costly=; fi
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))
print("%.1f %.1f %.1f %.1f" % (r["median_itl_ms"], r["p99_itl_ms"], r["median_ttft_ms"], r["output_throughput"]))' "$json"
}

echo "# $(date -u '+%Y-%m-%d %H:%M') UTC $(uname -m), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "# $troupe bench serve ${args[*]}; model $model, serve --threads $threads"
echo "| pair | alone: ITL p50 / p99, TTFT p50 (ms), tok/s | beside: the same | ITL p50 ratio | ITL p99 ratio | the costly client |"
echo "|---|---|---|---|---|---|"
for pair in $(seq 1 "$pairs"); do
  order=(alone beside)
  [ $((pair % 2)) -eq 0 ] && order=(beside alone)
  declare -A result
  for kind in "${order[@]}"; do result[$kind]=$(run "$kind" "$pair"); done
  read -r a50 a99 att atp <<<"${result[alone]}"
  read -r b50 b99 btt btp <<<"${result[beside]}"
  echo "| $pair | $a50 / $a99, $att, $atp | $b50 / $b99, $btt, $btp | $(python3 -c "print('%.2f' % ($b50 / $a50))") | $(python3 -c "print('%.2f' % ($b99 / $a99))") | $(cat "$out/costly-tally-$pair.txt" 2>/dev/null || echo none) |"
done
