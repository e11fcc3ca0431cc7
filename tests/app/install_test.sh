#!/usr/bin/env bash
# `cmake --install` into a temporary prefix gives a tree that works without the source
# or build tree: the layout is checked, then the installed troupe is run from a working
# directory outside both (--version, `serve` answering /health and one completion, and a
# clean exit on SIGTERM, as systemd and Docker stop it).
# Usage: install_test.sh CMAKE BUILD_DIR SOURCE_DIR VERSION. Exit 77 (skipped), saying why,
# without cmake, curl or /usr/bin/python3.
set -euo pipefail
cmake=$1 build=$2 source=$3 version=$4
[ -x "$cmake" ] || command -v "$cmake" >/dev/null || { echo "skipped: cmake ($cmake) is absent"; exit 77; }
command -v curl >/dev/null || { echo "skipped: curl is absent (scripts/setup.sh installs it)"; exit 77; }
[ -x /usr/bin/python3 ] || { echo "skipped: /usr/bin/python3 is absent (it reads the completion)"; exit 77; }

tmp=$(mktemp -d)
prefix=$tmp/prefix
pid=
cleanup() {
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAILED: $*"; [ -f "$tmp/server.log" ] && { echo "--- server log"; cat "$tmp/server.log"; }; exit 1; }

"$cmake" --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }

# The layout: the binary, the dashboards, the docs and the deploy examples.
for f in bin/troupe \
         share/troupe/grafana/troupe-dashboard.json \
         share/troupe/prometheus/prometheus.yml \
         share/doc/troupe/README.md \
         share/doc/troupe/docs/architecture.md \
         share/doc/troupe/docs/deploy.md \
         share/doc/troupe/examples/deploy/troupe.service \
         share/doc/troupe/examples/deploy/Dockerfile; do
  [ -f "$prefix/$f" ] || fail "$f is not installed"
done
[ -x "$prefix/bin/troupe" ] || fail "bin/troupe is not executable"
# Nothing but bin/troupe and share/: no test binaries, libraries or headers.
stray=$(cd "$prefix" && find . -type f ! -path './share/*' ! -path './bin/troupe')
[ -z "$stray" ] || fail "files outside bin/troupe and share/: $stray"
# Its libraries resolve, and no RPATH points back into the build or source tree.
if command -v ldd >/dev/null; then
  libraries=$(ldd "$prefix/bin/troupe") # whole, not piped into grep -q (pipefail, SIGPIPE)
  [[ $libraries != *"not found"* ]] || { echo "$libraries"; fail "a library is not found"; }
fi
if command -v readelf >/dev/null; then
  runpath=$(readelf -d "$prefix/bin/troupe" | grep -E 'RPATH|RUNPATH' || true)
  case "$runpath" in
    *"$build"* | *"$source"*) fail "the installed binary's RPATH points into the tree: $runpath" ;;
  esac
fi

# Run from outside the source tree, with the user's cache in the temporary directory
# (where the built-in model is written when ../shared is absent).
mkdir "$tmp/work"
cd "$tmp/work"
export XDG_CACHE_HOME=$tmp/cache
troupe=$prefix/bin/troupe
[ "$("$troupe" --version)" = "troupe $version" ] || fail "--version says '$("$troupe" --version)', not 'troupe $version'"

model=${TROUPE_SHARED_DIR:-$source/../shared}/models/stories260K.gguf
model_args=()
if [ -f "$model" ]; then
  model_args=(--model "$model")
else
  echo "$model is absent: serving the built-in random model"
fi
"$troupe" serve --port 0 "${model_args[@]}" --kv-cache-gb 0.05 --threads 2 2>"$tmp/server.log" &
pid=$!
url=
for _ in $(seq 1 600); do
  url=$(grep -o 'serving .* at http://[0-9.]*:[0-9]*' "$tmp/server.log" | grep -o 'http://.*' || true)
  [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || fail "the server exited before serving"
  sleep 0.1
done
[ -n "$url" ] || fail "the server did not start"
curl -fsS --max-time 10 "$url/health" >/dev/null || fail "GET /health"
reply=$(curl -fsS --max-time 60 "$url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}') || fail "POST /v1/completions"
/usr/bin/python3 - "$reply" <<'PY' || fail "the completion: $reply"
import json, sys
reply = json.loads(sys.argv[1])
assert isinstance(reply["choices"][0]["text"], str), reply
assert 1 <= reply["usage"]["completion_tokens"] <= 4, reply
PY

kill -TERM "$pid"
status=0
wait "$pid" || status=$?
pid=
[ "$status" -eq 0 ] || fail "troupe serve exited $status on SIGTERM, not 0"
grep -q 'INFO    stopping' "$tmp/server.log" || fail "no 'stopping' line after SIGTERM"
echo "the installed tree at $prefix served from $PWD and stopped cleanly"
