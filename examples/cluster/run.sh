#!/usr/bin/env bash
# A head and two nodes on loopback, then a streamed completion through them.
#   examples/cluster/run.sh [MODEL.gguf]      (default: the built-in model)
# Ctrl-C (or the end of the script) stops all three.
set -euo pipefail
troupe=${TROUPE:-build/app/troupe}
model=${1:-}
model_args=()
[ -n "$model" ] && model_args=(-m "$model")
token=example-token-$$
log=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$log"' EXIT

"$troupe" serve "${model_args[@]}" --port 0 --data-parallel-size 2 \
  --cluster-port 0 --cluster-token "$token" --kv-cache-gb 0.25 2>"$log/head" &
until cluster_port=$(grep -o 'cluster port 127.0.0.1:[0-9]*' "$log/head" | cut -d: -f2) \
  && [ -n "$cluster_port" ]; do sleep 0.2; done
echo "head: cluster port $cluster_port"

for name in node-a node-b; do
  "$troupe" node --join "127.0.0.1:$cluster_port" --cluster-token "$token" \
    --name "$name" --threads 1 2>"$log/$name" &
done
until port=$(grep -o 'http://127.0.0.1:[0-9]*' "$log/head" | cut -d: -f3) && [ -n "$port" ]; do
  sleep 0.2
done
cat "$log/head"

echo "--- a streamed completion through the cluster:"
curl -sN "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt":"Once upon a time","max_tokens":24,"stream":true}' | grep -o '"text":"[^"]*"'
echo "--- the cluster:"
curl -s "http://127.0.0.1:$port/v1/cluster"; echo
curl -s "http://127.0.0.1:$port/health"; echo
