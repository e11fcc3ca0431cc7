#!/usr/bin/env bash
# Soak: `troupe serve` under SECONDS of mixed HTTP, SSE and WebSocket traffic with
# disconnects, cancels and bad requests (tests/reliability/soak.py says what it sends
# and what it checks: resources flat and back to their start values, greedy outputs
# equal to their solo outputs, no 5xx, no unexpected error).
# Usage: soak_test.sh TROUPE_BINARY [SECONDS (default 75)] [CSV (default: a temporary file)]
#   make test runs a short version; locally, e.g. 1200 s:
#   tests/reliability/soak_test.sh build/app/troupe 1200 /tmp/troupe-soak.csv
# The model: ../shared/models/stories260K.gguf when present (a trained model: distinct
# greedy outputs per prompt, so a mixed-up sequence shows), else a random one.
# Exit 77 (skipped) without /usr/bin/python3 and its websockets module.
set -euo pipefail
troupe=$1
seconds=${2:-75}
dir=$(cd "$(dirname "$0")" && pwd)
python=/usr/bin/python3
[ -x "$python" ] || { echo "skipped: $python is absent"; exit 77; }
"$python" -c 'import websockets' 2>/dev/null ||
  { echo "skipped: python3-websockets is not installed (apt-get install python3-websockets)"; exit 77; }

work=$(mktemp -d)
given_csv=${3:-}
csv=${given_csv:-$work/soak.csv}
pid=
# shellcheck disable=SC2317  # run by the trap
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; fi
  if [ -z "$given_csv" ] && [ -f "$csv" ]; then cp "$csv" "${TMPDIR:-/tmp}/troupe-soak-last.csv"; fi
  rm -rf "$work"
}
trap cleanup EXIT

model=$dir/../../../shared/models/stories260K.gguf
if [ ! -f "$model" ]; then
  model=$work/model.gguf
  "$troupe" make-model --out "$model" --dim 64 --layers 2 --heads 2 --ffn 128 --vocab-size 1024 \
    --context-length 256 >/dev/null 2>&1
  echo "note: ../shared is absent: a random model (its greedy outputs repeat one token)"
fi
# A small KV pool (about 1650 tokens of stories260K) so that the load fills it now and then.
"$troupe" serve --model "$model" --port 0 --threads 1 --kv-cache-gb 0.002 --seed 1 \
  --api-key sk-soak 2>"$work/server.log" &
pid=$!
for _ in $(seq 1 200); do grep -q "serving" "$work/server.log" && break; sleep 0.05; done
url=$(grep -o 'http://[0-9.]*:[0-9]*' "$work/server.log" | head -1 || true)
[ -n "$url" ] || { echo "FAIL: the server did not start:"; cat "$work/server.log"; exit 1; }
head -2 "$work/server.log" | tail -1
status=0
"$python" "$dir/soak.py" --url "$url" --pid "$pid" --seconds "$seconds" --csv "$csv" \
  --api-key sk-soak || status=$?
if ! kill -0 "$pid" 2>/dev/null; then
  echo "FAIL: the server died; its log:"
  tail -20 "$work/server.log"
  exit 1
fi
[ -n "$given_csv" ] || echo "(the samples are kept in ${TMPDIR:-/tmp}/troupe-soak-last.csv)"
exit "$status"
