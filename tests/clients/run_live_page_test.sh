#!/usr/bin/env bash
# Starts `troupe serve` on the built-in model and drives the live page (GET /) in headless
# Chromium with playwright-core: once on an open server, once with --api-key. Screenshots
# go to the artifacts directory. Exit 77 (skipped) without node, /usr/bin/chromium or
# playwright-core (make test installs it with npm ci).
# LIVE_PAGE_WEB_DIR=net/web serves the page from disk (--web-dir) instead of the binary's
# copy, for testing edits without a rebuild.
set -euo pipefail
troupe=$1
artifacts=${2:-.}
dir=$(cd "$(dirname "$0")" && pwd)
command -v node >/dev/null || { echo "skipped: node is not installed"; exit 77; }
[ -x /usr/bin/chromium ] || { echo "skipped: /usr/bin/chromium is not installed"; exit 77; }
[ -d "$dir/node_modules/playwright-core" ] || {
  echo "skipped: tests/clients/node_modules/playwright-core is absent (npm ci --prefix tests/clients)"
  exit 77
}
mkdir -p "$artifacts"
artifacts=$(cd "$artifacts" && pwd)
work=$(mktemp -d)
pid=
stop_server() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=
  fi
}
cleanup() { stop_server; rm -rf "$work"; }
trap cleanup EXIT
web=()
[ -n "${LIVE_PAGE_WEB_DIR:-}" ] && web=(--web-dir "$LIVE_PAGE_WEB_DIR")

# start_server LOG [flags...]: sets pid and url.
start_server() {
  local log=$1
  shift
  "$troupe" serve --port 0 --threads 1 --kv-cache-gb 0.05 --max-num-seqs 32 "${web[@]}" "$@" 2>"$log" &
  pid=$!
  for _ in $(seq 1 600); do
    grep -aq "serving" "$log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  url=$(grep -ao 'http://[0-9.]*:[0-9]*' "$log" | head -1 || true)
  [ -n "$url" ] || { echo "the server did not start:"; cat "$log"; exit 1; }
}

start=$SECONDS
echo "== the live page on an open server"
start_server "$work/open.log"
node "$dir/live_page_test.mjs" "$url" "$artifacts" || { echo "server log:"; tail -20 "$work/open.log"; exit 1; }
stop_server

echo "== the live page with --api-key"
key="sk-live-$RANDOM$RANDOM"
start_server "$work/key.log" --api-key "$key"
node "$dir/live_page_test.mjs" "$url" "$artifacts" "$key" || { echo "server log:"; tail -20 "$work/key.log"; exit 1; }
stop_server
echo "the live page test passed in $((SECONDS - start)) s"
