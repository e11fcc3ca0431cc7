#!/usr/bin/env bash
# Slow clients against `troupe serve`, with Debian's slowhttptest, on loopback:
#   slowloris (-H: headers that never end), slow body (-B: a POST body that never ends),
#   slow read (-X: responses read a few bytes at a time through a tiny window), and
#   never-reading WebSocket clients (never_reader.py: several MiB of token frames owed).
# While each runs, a normal client asks GET /health and a small greedy completion every
# ~0.5 s: every one of its requests must succeed (200) within NORMAL_BOUND_S seconds.
# Also asserted: slowloris and slow-body connections are ended by the server's request
# deadline (30 s) before slowhttptest's own limit (40 s); never-reading WebSocket clients
# are closed by the server (a client too far behind is dropped and its requests
# cancelled); after each mode the server's descriptor count returns to within
# FD_SLACK of its start; at the end the server is healthy, runs nothing and holds no KV.
# Usage: slow_clients_test.sh TROUPE_BINARY. Exit 77 (skipped) without slowhttptest.
set -euo pipefail
troupe=$1
dir=$(cd "$(dirname "$0")" && pwd)
command -v slowhttptest >/dev/null || {
  echo "skipped: slowhttptest is not installed (apt-get install slowhttptest)"
  exit 77
}
command -v curl >/dev/null || { echo "skipped: curl is not installed"; exit 77; }
NORMAL_BOUND_S=${NORMAL_BOUND_S:-2}
FD_SLACK=${FD_SLACK:-3}
CONNECTIONS=${SLOW_CONNECTIONS:-400}
python=/usr/bin/python3

work=$(mktemp -d)
pid=
normal_pid=
cleanup() {
  [ -n "$normal_pid" ] && kill "$normal_pid" 2>/dev/null && wait "$normal_pid" 2>/dev/null
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

"$troupe" make-model --out "$work/model.gguf" --dim 64 --layers 1 --heads 2 --ffn 64 \
  --vocab-size 1024 --context-length 256 >/dev/null 2>&1
# The connection limit: 1024 (the default) where the descriptor limit holds it, else what
# it holds (the server wants ~64 descriptors besides). The slow clients stay well under
# it, so a normal client that finds no slot would be the server's fault, not the limit's.
hard=$(ulimit -Hn)
max_connections=1024
if [ "$hard" != unlimited ] && [ "$hard" -lt $((max_connections + 128)) ]; then
  max_connections=$((hard - 128))
fi
[ "$CONNECTIONS" -le $((max_connections * 2 / 3)) ] || CONNECTIONS=$((max_connections * 2 / 3))
soft=$(ulimit -Sn)  # slowhttptest's own descriptors
if [ "$soft" != unlimited ] && [ "$CONNECTIONS" -gt $((soft - 64)) ]; then
  CONNECTIONS=$((soft - 64))
fi
"$troupe" serve --model "$work/model.gguf" --port 0 --threads 1 --kv-cache-gb 0.05 --seed 1 \
  --max-connections "$max_connections" 2>"$work/server.log" &
pid=$!
for _ in $(seq 1 200); do grep -q "serving" "$work/server.log" && break; sleep 0.05; done
url=$(grep -o 'http://[0-9.]*:[0-9]*' "$work/server.log" | head -1 || true)
[ -n "$url" ] || { echo "FAIL: the server did not start:"; cat "$work/server.log"; exit 1; }
echo "server: pid $pid at $url, --max-connections $max_connections; $CONNECTIONS slow connections a mode"

failures=()
fail() { failures+=("$1"); echo "FAIL: $1"; }
fds() { find "/proc/$pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
completion='{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}'

# One normal client: /health and a small completion every ~0.5 s until $work/stop exists.
# Each line: what, HTTP status (000: no answer within the bound), seconds.
normal_client() {
  local out=$1
  while [ ! -e "$work/stop" ]; do
    curl -s -o /dev/null -m "$NORMAL_BOUND_S" -w 'health %{http_code} %{time_total}\n' \
      "$url/health" >>"$out" || true  # -w writes a line, status 000, on failure too
    curl -s -o /dev/null -m "$NORMAL_BOUND_S" -w 'completion %{http_code} %{time_total}\n' \
      -H 'Content-Type: application/json' -d "$completion" "$url/v1/completions" >>"$out" || true
    sleep 0.5
  done
}
start_normal() {
  rm -f "$work/stop"
  : >"$work/normal-$1.txt"
  normal_client "$work/normal-$1.txt" &
  normal_pid=$!
}
stop_normal() {
  touch "$work/stop"
  wait "$normal_pid" 2>/dev/null || true
  normal_pid=
}
# Waits up to 15 s for the descriptors to come back near the start value.
fds_settle() {
  local n
  for _ in $(seq 1 75); do
    n=$(fds)
    [ "$n" -le $((fd_start + FD_SLACK)) ] && break
    sleep 0.2
  done
  echo "$n"
}

curl -sf -m 5 -o /dev/null -H 'Content-Type: application/json' -d "$completion" \
  "$url/v1/completions" || { echo "FAIL: the server does not answer a completion"; exit 1; }
fd_start=$(fds)
echo "server descriptors at start: $fd_start"

summary=()
# run_mode NAME LIMIT_S SLOWHTTPTEST_ARGS...: slowhttptest with a normal client alongside.
run_mode() {
  local name=$1 limit=$2
  shift 2
  start_normal "$name"
  local t0=$SECONDS
  # slowhttptest's CSV: Seconds,Closed,Pending,Connected,... one row a second.
  timeout $((limit + 30)) slowhttptest "$@" -c "$CONNECTIONS" -r 400 -l "$limit" -p 2 -g \
    -o "$work/$name" >"$work/$name.out" 2>&1 || true
  local took=$((SECONDS - t0))
  stop_normal
  local plain
  plain=$(sed 's/\x1b\[[0-9;]*m//g' "$work/$name.out")
  local held=0
  if [ -f "$work/$name.csv" ]; then  # the most connections open at once
    held=$(awk -F, 'NR > 1 && $4 > m { m = $4 } END { print m + 0 }' "$work/$name.csv")
  fi
  local exit_reason probe
  exit_reason=$(grep -o 'Exit status: .*' <<<"$plain" | tail -1 | sed 's/Exit status: //' || true)
  probe=$(grep -o 'service available: *[A-Z]*' <<<"$plain" | tail -1 | awk '{print $3}' || true)
  local ok bad max_latency
  ok=$(awk '$2 == 200 && $3 <= b' b="$NORMAL_BOUND_S" "$work/normal-$name.txt" | wc -l)
  bad=$(awk '!($2 == 200 && $3 <= b)' b="$NORMAL_BOUND_S" "$work/normal-$name.txt" | wc -l)
  max_latency=$(awk '$3 > m { m = $3 } END { printf "%.3f", m }' "$work/normal-$name.txt")
  local fd_after
  fd_after=$(fds_settle)
  summary+=("$(printf '%-11s held %4s, ran %3ss, ended: %s (its probe: service available %s) | normal: %3s ok, %s failed, max %ss | fds after %s' \
    "$name" "$held" "$took" "${exit_reason:-?}" "${probe:-?}" "$ok" "$bad" "$max_latency" "$fd_after")")
  echo "${summary[-1]}"
  [ "$held" -ge $((CONNECTIONS * 9 / 10)) ] ||
    fail "$name: slowhttptest held only $held of $CONNECTIONS connections: the attack did not happen"$'\n'"$plain"
  [ "$ok" -ge 5 ] || fail "$name: only $ok normal requests were made"
  [ "$bad" -eq 0 ] || fail "$name: $bad normal requests failed or took over ${NORMAL_BOUND_S}s: $(awk '!($2 == 200 && $3 <= b)' b="$NORMAL_BOUND_S" "$work/normal-$name.txt" | head -5 | tr '\n' ';')"
  [ "$fd_after" -le $((fd_start + FD_SLACK)) ] ||
    fail "$name: the server holds $fd_after descriptors after the slow clients left (start: $fd_start)"
  kill -0 "$pid" 2>/dev/null || { fail "$name: the server died"; exit 1; }
  last_exit_reason=$exit_reason
}

# Slowloris: headers a few bytes every 5 s. The request deadline (30 s) must end them
# all before slowhttptest's 40 s, so it stops with no open connection left.
run_mode slowloris 40 -H -i 5 -x 24 -t GET -u "$url/v1/models"
[ "$last_exit_reason" = "No open connections left" ] ||
  fail "slowloris: the server did not end the slow requests by its 30 s deadline (slowhttptest: $last_exit_reason)"
# Slow body: a POST declaring 8 KiB, sent 10 bytes at a time every 5 s.
run_mode slow_body 40 -B -i 5 -x 10 -s 8192 -t POST -f application/json -u "$url/v1/completions"
[ "$last_exit_reason" = "No open connections left" ] ||
  fail "slow_body: the server did not end the slow bodies by its 30 s deadline (slowhttptest: $last_exit_reason)"
# Slow read: 10 pipelined GET /metrics (~10 KiB each) per connection, a 16-32 byte
# window, 32 bytes read every 2 s: far more than the socket buffers hold.
run_mode slow_read 20 -X -w 16 -y 32 -n 2 -z 32 -k 10 -t GET -u "$url/metrics"

# Never-reading WebSocket clients: 4 sockets, 32 generates each (~3.8 MiB of frames
# owed to each), held 12 s without reading.
if "$python" -c 'import json, socket' 2>/dev/null; then
  start_normal never_read
  rss_before=$(awk '/VmRSS/ { print $2 }' "/proc/$pid/status")
  "$python" "$dir/never_reader.py" "${url/http/ws}/v1/ws" 4 32 12 >"$work/never_read.out" 2>&1 ||
    fail "never_read: the client failed: $(cat "$work/never_read.out")"
  rss_after=$(awk '/VmRSS/ { print $2 }' "/proc/$pid/status")
  stop_normal
  cat "$work/never_read.out"
  closed=$(grep -o 'closed_by_server=[0-9]*' "$work/never_read.out" | cut -d= -f2 || true)
  ok=$(awk '$2 == 200 && $3 <= b' b="$NORMAL_BOUND_S" "$work/normal-never_read.txt" | wc -l)
  bad=$(awk '!($2 == 200 && $3 <= b)' b="$NORMAL_BOUND_S" "$work/normal-never_read.txt" | wc -l)
  max_latency=$(awk '$3 > m { m = $3 } END { printf "%.3f", m }' "$work/normal-never_read.txt")
  fd_after=$(fds_settle)
  summary+=("$(printf '%-11s 4 sockets, closed by server %s of 4, server RSS %s -> %s KiB | normal: %3s ok, %s failed, max %ss | fds after %s' \
    never_read "${closed:-?}" "$rss_before" "$rss_after" "$ok" "$bad" "$max_latency" "$fd_after")")
  [ "${closed:-0}" -eq 4 ] ||
    fail "never_read: the server kept $((4 - ${closed:-0})) of 4 WebSocket clients that read nothing for 12 s open, their output queued for them"
  [ "$bad" -eq 0 ] || fail "never_read: $bad normal requests failed or took over ${NORMAL_BOUND_S}s"
  [ "$fd_after" -le $((fd_start + FD_SLACK)) ] ||
    fail "never_read: the server holds $fd_after descriptors after the clients left (start: $fd_start)"
else
  summary+=("never_read  not run: $python is absent")
fi

# Afterwards: healthy, idle, no KV held.
curl -sf -m 5 -o /dev/null "$url/health" || fail "the server is not healthy after the slow clients"
curl -sf -m 5 -o /dev/null -H 'Content-Type: application/json' -d "$completion" \
  "$url/v1/completions" || fail "the server does not complete a request after the slow clients"
metrics=$(curl -sf -m 5 "$url/metrics" || true)
for gauge in troupe_num_requests_running troupe_num_requests_waiting troupe_kv_cache_usage_ratio \
  troupe_http_requests_in_flight; do
  value=$(awk -v g="$gauge" '$1 == g || index($1, g "{model_name=") == 1 { print $2 }' <<<"$metrics")
  [ -z "$value" ] || awk -v v="$value" 'BEGIN { exit !(v == 0) }' ||
    fail "$gauge is $value after the slow clients left (want 0)"
done

echo
echo "slow clients: $CONNECTIONS connections a mode, normal requests bounded by ${NORMAL_BOUND_S}s, server fds at start $fd_start"
printf '  %s\n' "${summary[@]}"
if [ ${#failures[@]} -gt 0 ]; then
  echo "FAILED (${#failures[@]}):"
  printf '  - %s\n' "${failures[@]}"
  exit 1
fi
echo "PASSED"
