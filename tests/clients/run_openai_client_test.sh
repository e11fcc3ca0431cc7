#!/usr/bin/env bash
# Starts `troupe serve` on a free port with a small random model and runs the
# official openai npm client against it. Exit 77 (skipped) without node or the
# client package (make test installs it with npm ci).
set -euo pipefail
troupe=$1
dir=$(cd "$(dirname "$0")" && pwd)
command -v node >/dev/null || { echo "skipped: node is not installed"; exit 77; }
[ -d "$dir/node_modules/openai" ] || { echo "skipped: tests/clients/node_modules is absent (npm ci --prefix tests/clients)"; exit 77; }
work=$(mktemp -d)
pid=
pid2=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  [ -n "$pid2" ] && kill "$pid2" 2>/dev/null && wait "$pid2" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
"$troupe" make-model --out "$work/model.gguf" --dim 64 --layers 1 --heads 2 --ffn 64 --vocab-size 1024 \
  --context-length 256 >/dev/null 2>&1
"$troupe" serve --model "$work/model.gguf" --served-model-name troupe --port 0 --api-key sk-test --kv-cache-gb 0.05 --threads 2 \
  2>"$work/server.log" &
pid=$!
for _ in $(seq 1 200); do grep -q "serving" "$work/server.log" && break; sleep 0.05; done
url=$(grep -o 'http://[0-9.]*:[0-9]*' "$work/server.log" | head -1)
[ -n "$url" ] || { echo "the server did not start:"; cat "$work/server.log"; exit 1; }
# A reasoning model's server: its template opens <think> for the model (as DeepSeek-R1's),
# so the random model's output is all thinking under --reasoning-parser deepseek_r1.
printf '%s' '{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
<think>
{% endif %}' >"$work/think.jinja"
"$troupe" serve "$work/model.gguf" --served-model-name troupe --port 0 --api-key sk-test --kv-cache-gb 0.05 \
  --threads 2 --reasoning-parser deepseek_r1 --chat-template "$work/think.jinja" 2>"$work/server2.log" &
pid2=$!
for _ in $(seq 1 200); do grep -q "serving" "$work/server2.log" && break; sleep 0.05; done
url2=$(grep -o 'http://[0-9.]*:[0-9]*' "$work/server2.log" | head -1)
[ -n "$url2" ] || { echo "the reasoning server did not start:"; cat "$work/server2.log"; exit 1; }
node "$dir/openai_client_test.mjs" "$url" "$url2"
# The online benchmark client against the same server.
port=${url##*:}
"$troupe" bench serve --port "$port" --api-key sk-test --num-prompts 12 --input-len 16 --output-len 8 \
  --max-concurrency 4 --output-json "$work/serve.json" | tee "$work/serve.out"
grep -Eq '^Successful requests: +12 ' "$work/serve.out"
grep -Eq '^Failed requests: +0 ' "$work/serve.out"
/usr/bin/python3 -c 'import json, sys; assert json.load(open(sys.argv[1]))["total_output_tokens"] == 96' \
  "$work/serve.json"
# The examples, as a user runs them (the server wants the key).
examples="$dir/../../examples"
if /usr/bin/python3 -c 'import websockets' 2>/dev/null; then
  /usr/bin/python3 - "$examples/websocket_client.py" "${url/http/ws}/v1/ws" <<'PY'
import runpy, sys, websockets
connect = websockets.connect
websockets.connect = lambda url, **kw: connect(url, extra_headers={"Authorization": "Bearer sk-test"}, **kw)
path, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_path(path, run_name="__main__")
PY
else
  echo "python3-websockets is absent: the WebSocket example was not run"
fi
