#!/usr/bin/env bash
# A curl session against a running `troupe serve` (make run): completions,
# streaming over SSE, chat, tokenization and metrics.
# Usage: examples/curl_session.sh [http://127.0.0.1:8000]
set -euo pipefail
url=${1:-http://127.0.0.1:8000}
json=(-H 'Content-Type: application/json')

echo "== models";               curl -sS "$url/v1/models"; echo
echo "== a completion";         curl -sS "${json[@]}" "$url/v1/completions" \
  -d '{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0}'; echo
echo "== streamed (SSE)";       curl -sSN "${json[@]}" "$url/v1/completions" \
  -d '{"prompt": "Once upon a time", "max_tokens": 8, "stream": true, "stream_options": {"include_usage": true}}'
echo "== chat";                 curl -sS "${json[@]}" "$url/v1/chat/completions" \
  -d '{"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 16}'; echo
echo "== tokenize";             curl -sS "${json[@]}" "$url/tokenize" -d '{"prompt": "Hello world"}'; echo
echo "== a bad request";        curl -sS "${json[@]}" "$url/v1/completions" -d '{"prompt": 42}'; echo
echo "== metrics (excerpt)";    curl -sS "$url/metrics" | grep -E '^troupe_(generation_tokens_total|num_requests_running)[{ ]'
