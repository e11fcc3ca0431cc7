#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) in build-fuzz and runs each
# for SECONDS (default 60), one after another. Every executable named *_fuzzer in
# build-fuzz/fuzz is a target: a new one needs no change here.
#
#   scripts/fuzz.sh [SECONDS]
#
# Per target <name>: the working corpus is build-fuzz/corpus/<name> (seeded from
# fuzz/corpus/<name>, which stays as committed), the dictionary fuzz/<name>.dict
# where there is one, crash/leak/timeout/OOM inputs go to build-fuzz/artifacts/<name>/
# and the log to build-fuzz/logs/<name>.log. One summary line per target; the exit
# status is non-zero if any target failed.
#
# Environment: FUZZ_BUILD (build folder, default build-fuzz), FUZZ_TARGETS (names to
# run, default all), FUZZ_RSS_MB (2048), FUZZ_TIMEOUT (seconds per input, 10),
# FUZZ_ARGS (more libFuzzer flags, e.g. -jobs=2 or -only_ascii=1).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
build=${FUZZ_BUILD:-build-fuzz}
rss_mb=${FUZZ_RSS_MB:-2048}
timeout_s=${FUZZ_TIMEOUT:-10}

CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DTROUPE_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)"

targets=()
if [ -n "${FUZZ_TARGETS:-}" ]; then
  read -r -a targets <<<"$FUZZ_TARGETS"
else
  for exe in "$build"/fuzz/*_fuzzer; do
    [ -x "$exe" ] && targets+=("$(basename "$exe" _fuzzer)")
  done
fi
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz: no *_fuzzer executables in $build/fuzz" >&2
  exit 1
fi

# The last value libFuzzer printed for one of its -print_final_stats lines.
stat() { sed -n "s/^stat::$1: *//p" "$2" | tail -n 1; }

failed=()
echo "fuzz: ${#targets[@]} targets, ${seconds} s each"
for name in "${targets[@]}"; do
  exe="$build/fuzz/${name}_fuzzer"
  corpus="$build/corpus/$name"
  artifacts="$build/artifacts/$name"
  log="$build/logs/$name.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  if [ -d "fuzz/corpus/$name" ]; then
    cp -n fuzz/corpus/"$name"/* "$corpus"/ 2>/dev/null || true
  fi
  dict=()
  [ -f "fuzz/$name.dict" ] && dict=("-dict=fuzz/$name.dict")
  # Marks the start: artifacts newer than it are this run's findings.
  stamp="$artifacts/.started"
  touch "$stamp"
  started=$SECONDS
  # shellcheck disable=SC2086  # FUZZ_ARGS is a list of flags
  if "$exe" -max_total_time="$seconds" -rss_limit_mb="$rss_mb" -timeout="$timeout_s" \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "${dict[@]}" ${FUZZ_ARGS:-} \
    "$corpus" >"$log" 2>&1; then
    status=0
  else
    status=$?
  fi
  elapsed=$((SECONDS - started))
  found=$(find "$artifacts" -maxdepth 1 -type f -newer "$stamp" \
    \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
  execs=$(stat number_of_executed_units "$log")
  rate=$(stat average_exec_per_sec "$log")
  rss=$(stat peak_rss_mb "$log")
  size=$(find "$corpus" -maxdepth 1 -type f | wc -l)
  printf 'fuzz: %-18s %5s s %10s execs %7s exec/s  corpus %5s  peak rss %5s MB  crashes %s\n' \
    "$name" "$elapsed" "${execs:-?}" "${rate:-?}" "$size" "${rss:-?}" "$found"
  if [ "$status" -ne 0 ] || [ "$found" -ne 0 ]; then
    failed+=("$name")
    echo "fuzz: $name failed (exit $status); log $log, inputs in $artifacts/:" >&2
    grep -E 'ERROR|invariant broken|SUMMARY' "$log" | head -n 5 >&2 || true
  fi
done

if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: no crash, leak or timeout"
