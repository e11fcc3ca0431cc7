#!/usr/bin/env bash
# The pause a migrated stream sees (BENCHMARKS.md, issue 31): a head (`troupe serve
# --cluster-port 0 --dp 2 --router round-robin`) and two nodes (`troupe node`, one thread
# each) on loopback serve MODEL; scripts/bench-failover-client.py streams STREAMS greedy
# completions (ignore_eos, max_tokens L+EXTRA), and once every stream of the replica
# holding most of them has streamed L tokens SIGKILLs that replica's node: its streams
# move to the other replica with their tokens and continue. For each L in LENGTHS and
# each prefix-cache setting in CACHES ("on", "off": --no-enable-prefix-caching),
# REPEATS fresh clusters; per migrated stream its extra latency (the gap across the loss
# less its median inter-token gap). Prints a line per setting: the extra latency's
# p50/p99, the kill-to-first-token time, the stall the survivors' streams see, and the
# counts (streams complete with finish_reason length and every token, errors,
# migrations); the runs' JSON and every process's log stay under SCRATCH. Detection is
# the head's "node ... was lost" log line less the kill's time. SHARED_PREFIX: the first
# tokens of every prompt are the same (a system prompt); HEAD_FLAGS: more flags for the
# head (--max-num-batched-tokens 2048, say); REPORT_ONLY=1: the lines of the runs
# already in SCRATCH, none run.
#   LENGTHS="16 64 128" CACHES="on off" REPEATS=3 scripts/bench-failover.sh
#   MODEL=../shared/models/stories260K.gguf LENGTHS=16 REPEATS=1 scripts/bench-failover.sh  # quick: its context is 128
set -euo pipefail
cd "$(dirname "$0")/.."
troupe=${TROUPE:-build/app/troupe}
scratch=${SCRATCH:-/tmp/fo}
lengths=${LENGTHS:-16 64 128}
caches=${CACHES:-on off}
streams=${STREAMS:-8}
repeats=${REPEATS:-3}
extra=${EXTRA:-64}
prompt_len=${PROMPT_LEN:-32}
shared=${SHARED_PREFIX:-0}
token=bench-failover
mkdir -p "$scratch"
if [ -z "${MODEL:-}" ]; then
  MODEL=/tmp/lead/bench/r110m-f16.gguf
  if [ ! -f "$MODEL" ]; then
    MODEL=$scratch/r110m-f16.gguf
    [ -f "$MODEL" ] || "$troupe" make-model --preset 110m --type f16 \
      --vocab ../shared/vocab/ggml-vocab-llama-spm.gguf --out "$MODEL" >/dev/null
  fi
fi

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_for FILE REGEX SECONDS PID: the first group of REGEX's first match in FILE, once
# there; fails after SECONDS (wall clock) or once process PID (the head) has ended.
wait_for() {
  local value="" deadline=$((SECONDS + $3))
  while [ $SECONDS -lt $deadline ] && kill -0 "$4" 2>/dev/null; do
    value=$(sed -nE "s|.*$2.*|\1|p" "$1" 2>/dev/null | head -1)
    [ -n "$value" ] && break
    sleep 0.1
  done
  [ -n "$value" ] || { echo "no '$2' in $1 (after $3 s, or the head ended):" >&2; tail -5 "$1" >&2; return 1; }
  echo "$value"
}

# run L CACHE REP: one fresh cluster, one kill; the client's JSON in $scratch.
run() {
  local length=$1 cache=$2 rep=$3
  local tag="L$length-$cache-$rep" flags=()
  [ "$cache" = off ] && flags=(--no-enable-prefix-caching)
  # shellcheck disable=SC2206  # HEAD_FLAGS: words
  flags+=(${HEAD_FLAGS:-})
  "$troupe" serve -m "$MODEL" --port 0 --cluster-port 0 --cluster-token "$token" --dp 2 \
    --router round-robin --threads 1 --kv-cache-gb 0.5 --cluster-wait 60 "${flags[@]}" \
    >"$scratch/head-$tag.log" 2>&1 &
  local head=$!
  pids+=("$head")
  local cport hport
  cport=$(wait_for "$scratch/head-$tag.log" 'cluster port 127\.0\.0\.1:([0-9]+)' 60 "$head")
  local node_args=()
  for name in n0 n1; do
    "$troupe" node --join "127.0.0.1:$cport" --cluster-token "$token" --name "$name" \
      --threads 1 >"$scratch/$name-$tag.log" 2>&1 &
    pids+=($!)
    node_args+=(--node "$name=$!")
    disown  # the client kills one: no "Killed" notice from this shell
  done
  hport=$(wait_for "$scratch/head-$tag.log" "serving '.*' at http://127\.0\.0\.1:([0-9]+)" 120 "$head")
  python3 scripts/bench-failover-client.py --port "$hport" --streams "$streams" \
    --length "$length" --max-tokens $((length + extra)) --prompt-len "$prompt_len" \
    --shared-prefix "$shared" "${node_args[@]}" >"$scratch/failover-$tag.json"
  cleanup
}

echo "model $MODEL, $streams streams, prompt $prompt_len tokens ($shared shared)," \
  "max_tokens L+$extra, $repeats repeats, head flags '${HEAD_FLAGS:-}'; $(uptime | sed 's/.*load/load/')"
for length in $lengths; do
  for cache in $caches; do
    if [ -z "${REPORT_ONLY:-}" ]; then
      for rep in $(seq 1 "$repeats"); do run "$length" "$cache" "$rep"; done
    fi
    python3 - "$scratch" "$length" "$cache" "$repeats" "$streams" <<'PY'
import datetime, json, re, sys
sys.path.insert(0, "scripts")
from importlib import import_module
client = import_module("bench-failover-client")
scratch, length, cache = sys.argv[1], sys.argv[2], sys.argv[3]
repeats, n = int(sys.argv[4]), int(sys.argv[5])
extra, resume, stall, at_kill, itl, detect, after = [], [], [], [], [], [], []
complete = errors = migrations = lost = 0
for rep in range(1, repeats + 1):
    tag = f"L{length}-{cache}-{rep}"
    run = json.load(open(f"{scratch}/failover-{tag}.json"))
    complete += run["complete"]; errors += run["errors"]
    migrations += run["migrations"]; lost += run["lost"]
    # Detection: the head's "node NAME was lost" line (its clock, ms) less the kill's time.
    for line in open(f"{scratch}/head-{tag}.log"):
        m = re.match(r"(\S+)Z WARNING +node (\S+) was lost", line)
        if m and m.group(2) == run["node"]:
            seen = datetime.datetime.fromisoformat(m.group(1) + "+00:00").timestamp()
            detect.append((seen - run["kill_wall"]) * 1e3)
            after += [s["kill_to_resume_ms"] - detect[-1] for s in run["streams"]
                      if s["lost"] and "extra_ms" in s]
            break
    for s in run["streams"]:
        if "extra_ms" not in s:
            continue
        if s["lost"]:
            extra.append(s["extra_ms"]); resume.append(s["kill_to_resume_ms"])
            at_kill.append(s["before"]); itl.append(s["median_itl_ms"])
        else:
            stall.append(s["extra_ms"])
p = client.percentile
f = lambda v, q: "-" if not v else f"{p(v, q):.0f}"
print(f"L={length} cache={cache}: migrated {len(extra)} streams (moved after "
      f"{min(at_kill, default=0)}-{max(at_kill, default=0)} tokens, their ITL median "
      f"{client.median(itl):.1f} ms): extra p50 {f(extra, 50)} ms p99 {f(extra, 99)} ms; "
      f"kill->next token p50 {f(resume, 50)} ms; detection (head log) p50 {f(detect, 50)} "
      f"max {f(detect, 100)} ms, from it to the next token p50 {f(after, 50)} "
      f"p99 {f(after, 99)} ms; survivors' stall p50 {f(stall, 50)} p99 {f(stall, 99)} ms; "
      f"complete {complete}/{repeats * n}, errors {errors}, migrations {migrations:.0f}/{lost}")
PY
  done
done
