#!/usr/bin/env bash
# A hostile client's classes of attack (attack.py) against `troupe serve` on loopback: output
# constraints (schemas, regexes, GBNF, tools), chat and completion bodies, WebSocket
# messages, the cluster port, and start-up files (--config, --model). The server is a head
# with its replica in itself, so its cluster port is open too, and a model with a vocabulary
# of 32 000 tokens, so that token masks cost what they cost on a real one. Every class must
# hold: no 5xx, no dropped connection, a canary stream served within CANARY_BOUND_S seconds
# throughout, the server alive after, and nothing left running or in the KV cache.
# Usage: attack_test.sh TROUPE_BINARY [CLASSES]. Exit 77 (skipped) without Debian's
# python3-websockets.
set -euo pipefail
troupe=$1
classes=${2:-}
dir=$(cd "$(dirname "$0")" && pwd)
python=/usr/bin/python3
"$python" -c 'import websockets' 2>/dev/null || {
  echo "skipped: $python with websockets is not here (apt-get install python3-websockets)"
  exit 77
}

work=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

"$troupe" make-model --out "$work/model.gguf" --dim 64 --layers 1 --heads 2 --ffn 64 \
  --vocab-size 32000 --context-length 1024 >/dev/null 2>&1
"$troupe" serve --model "$work/model.gguf" --port 0 --threads 1 --kv-cache-gb 0.05 --seed 1 \
  --cluster-port 0 --head-replica 2>"$work/server.log" &
pid=$!
for _ in $(seq 1 400); do grep -q "serving" "$work/server.log" && break; sleep 0.05; done
url=$(grep -o 'http://[0-9.]*:[0-9]*' "$work/server.log" | head -1 || true)
cluster_port=$(sed -n 's/.*cluster port [0-9.]*:\([0-9]*\).*/\1/p' "$work/server.log" | head -1)
[ -n "$url" ] || { echo "FAIL: the server did not start:"; cat "$work/server.log"; exit 1; }
echo "server: pid $pid at $url, cluster port ${cluster_port:-none}"
args=("$url" --troupe "$troupe")
[ -n "$cluster_port" ] && args+=(--cluster-port "$cluster_port")
[ -n "$classes" ] && args+=(--classes "$classes")
status=0
"$python" "$dir/attack.py" "${args[@]}" || status=$?
if ! kill -0 "$pid" 2>/dev/null; then
  echo "FAIL: the server died; its log ends:"
  tail -20 "$work/server.log"
  exit 1
fi
exit $status
