#!/usr/bin/env bash
# The GPU machine's one call: build the CUDA backend, its tests and the GPU benchmark
# from the repository (TROUPE_GPU_ONLY, dependencies from the carried .gpu-deps/ that
# scripts/gpu-deps.sh makes here), run the tests, the benchmark and the Hugging Face
# static-batching baseline, and print a short table last. Logs and JSON go to $OUT.
#
#   here:   scripts/gpu-deps.sh
#   device: run(command="bash scripts/gpu-check.sh", carry=[".gpu-deps"], timeout_s=600)
#
# The stages' own time limits (150 + 100 + 110 + 180 s = 540 s) keep the whole well inside
# the device tool's 600 s, and each stage prints as it goes, so a stage that runs out
# still leaves the ones before it in the reply. The tests run with TROUPE_TESTS_MUST_RUN:
# a test that would skip (no device, a driver too old for the runtime, a missing model
# file) fails instead, since a skip here must not read as a pass. The summary says of
# every stage whether it ran, passed, failed or ran out of time.
#
# Knobs (environment): NUM_PROMPTS (troupe's workload, 256), HF_PROMPTS (the baseline
# runs the workload's first N, 128), HF_BATCH (64), SHAPE (llama3-8b), SKIP_HF=1 (the
# baseline runs only where python3 can import torch and transformers anyway).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/troupe-gpu-check}
mkdir -p "$OUT"
deps=$PWD/.gpu-deps
NUM_PROMPTS=${NUM_PROMPTS:-256}
HF_PROMPTS=${HF_PROMPTS:-128}
HF_BATCH=${HF_BATCH:-64}
SHAPE=${SHAPE:-llama3-8b}
stage() { echo; echo "=== $* ($(date +%T))"; }
# What became of each stage, for the summary: name=outcome lines.
status_file=$OUT/stages.txt
: >"$status_file"
record() { echo "$1=$2" >>"$status_file"; }
# ran out of time (timeout's 124), failed, or passed
outcome() { case $1 in 0) echo passed ;; 124) echo "ran out of time" ;; *) echo "failed (rc $1)" ;; esac; }

stage "device"
nvidia-smi || echo "nvidia-smi failed"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
nvcc --version | tail -2
cmake --version | head -1

stage "build (TROUPE_GPU_ONLY)"
[ -d "$deps" ] || {
  echo "no .gpu-deps: run scripts/gpu-deps.sh first and carry it"; record build "did not run (no .gpu-deps)"; exit 2; }
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_GPU_ONLY=ON \
  -DTROUPE_CUDA=ON -DTROUPE_WERROR=OFF -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$deps/usr" \
  -Dhwy_DIR="$deps/usr/lib/x86_64-linux-gnu/cmake/hwy" -DCatch2_DIR="$deps/usr/lib/cmake/Catch2" \
  -DTL_EXPECTED_INCLUDE_DIR="$deps/usr/include" >"$OUT/configure.log" 2>&1 \
  || { tail -30 "$OUT/configure.log"; record build "failed (cmake configure)"; exit 1; }
timeout 150 cmake --build build-gpu -j "$(nproc)" >"$OUT/build.log" 2>&1
build_rc=$?
record build "$(outcome $build_rc)"
if [ $build_rc -ne 0 ]; then
  grep -E "error|FAILED" -A3 "$OUT/build.log" | head -60
  cat "$status_file"; exit 1
fi
echo "built ($(grep -c 'warning' "$OUT/build.log") warning lines in build.log)"

stage "tests (a skip is a failure here)"
export TROUPE_SHARED_DIR=$deps/shared
export TROUPE_TESTS_MUST_RUN=1
timeout 100 ctest --test-dir build-gpu --output-on-failure -j 4 >"$OUT/tests.log" 2>&1
tests_rc=$?
record tests "$(outcome $tests_rc)"
grep -E "tests passed|Failed|\*\*\*|Skipped|FAILED, not skipped" "$OUT/tests.log" | tail -25

stage "troupe-gpu-bench ($SHAPE)"
timeout 110 build-gpu/bench/troupe-gpu-bench --shape "$SHAPE" --num-prompts "$NUM_PROMPTS" \
  --json "$OUT/troupe.json" --workload "$OUT/workload.json" 2>&1 | tee "$OUT/bench.log"
record bench "$(outcome "${PIPESTATUS[0]}")"

if [ "${SKIP_HF:-0}" = 1 ]; then
  record hf "did not run (SKIP_HF=1)"
elif ! python3 -c "import torch, transformers" >/dev/null 2>&1; then
  record hf "did not run (no torch or transformers on this machine)"
elif [ ! -f "$OUT/workload.json" ]; then
  record hf "did not run (the benchmark wrote no workload)"
else
  stage "Hugging Face static batching ($HF_PROMPTS requests, batch $HF_BATCH)"
  PYTHONUNBUFFERED=1 timeout 180 python3 bench/hf_static_baseline.py --shape "$SHAPE" \
    --workload "$OUT/workload.json" --num-prompts "$HF_PROMPTS" --batch-size "$HF_BATCH" \
    --json "$OUT/hf.json" 2>&1 | grep -v Warning | tail -12
  record hf "$(outcome "${PIPESTATUS[0]}")"
fi

stage "summary"
python3 - "$OUT" "$tests_rc" "$status_file" <<'PY'
import json, os, sys
out, tests_rc, status_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
names = {"build": "build", "tests": "GPU tests (skips fail)", "bench": "troupe-gpu-bench",
         "hf": "Hugging Face baseline"}
with open(status_file) as f:
    stages = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
for key, label in names.items():
    print(f"{label:>24}: {stages.get(key, 'did not run')}")
try:
    with open(os.path.join(out, "tests.log")) as f:
        log = f.read()
    for line in log.splitlines():  # ctest's closing list: "  12 - gpu.name (Failed)"
        line = line.strip()
        if line[:1].isdigit() and " - " in line and line.endswith(("(Failed)", "(Timeout)")):
            print(f"  {line.split(' - ', 1)[1]}")
except OSError:
    pass
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
t, hf = load("troupe.json"), load("hf.json")
print(f"tests: {'passed' if tests_rc == 0 else 'FAILED (rc %d)' % tests_rc}")
if not t:
    print("benchmark: no result (see the stages above)"); sys.exit(0)
print(f"{t['device']}, {t['shape']} {t['dtype']}, weights {t['weight_gb']:.2f} GB, "
      f"copy {t['copy_bandwidth_gbs']:.0f} GB/s")
print(f"{'decode batch':>12} {'ms/step':>9} {'GB read':>8} {'of copy':>8} {'tok/s':>9}")
for d in t["decode"]:
    print(f"{d['batch']:>12} {d['step_ms']:>9.3f} {d['gb_read']:>8.2f} "
          f"{100 * d['copy_fraction']:>7.1f}% {d['tokens_per_s']:>9.0f}")
print(f"prefill tok/s {t['prefill_tokens_per_s']:.0f} "
      f"({t['prefill_fma_tokens_per_s']:.0f} with FMA attention); paged attention decode "
      f"{t['attention_decode_gbs']:.0f} GB/s")
tp = t["throughput"]
print(f"offline throughput (troupe): {tp['output_tokens_per_s']:.0f} output tok/s "
      f"({tp['requests']} requests, {tp['seconds']:.1f} s)")
if hf:
    print(f"HF static batching: {hf['output_tokens_per_s']:.0f} output tok/s "
          f"({hf['requests']} requests, batch {hf['batch_size']}, {hf['seconds']:.1f} s)")
    print(f"ratio troupe / HF: {tp['output_tokens_per_s'] / hf['output_tokens_per_s']:.1f}x "
          f"(target > 23x)")
PY
