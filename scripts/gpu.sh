#!/usr/bin/env bash
# The one script for the lent GPU machine (H100/H200, CUDA 13): configures the `cuda` preset for
# sm_90 only, builds the GPU test and benchmark targets, runs the [gpu] tests, compute-sanitizer
# memcheck + racecheck on the stripe-reduction subset, the Marlin benchmark, and prints a short
# summary with the benchmark table LAST. Logs go under $OUT when set (the device tool returns them).
#
# Env knobs: GPU_TESTS (Catch2 filter, default "[gpu]"), SKIP_TESTS=1, SKIP_SAN=1, SKIP_BENCH=1,
# TEST_TIMEOUT/SAN_TIMEOUT/BENCH_TIMEOUT (seconds; a hung stripe lock must not eat the whole call),
# BENCH_ARGS (extra bench_marlin arguments, e.g. "--explore" or "--sets large --ms 1,16").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
BUILD=build/cuda
GPU_TESTS=${GPU_TESTS:-"[gpu]"}

# ../shared does not travel to the device machine: `bash scripts/gpu.sh --stage` (run here, before the
# device call) copies it into the ignored build/carry/shared, which the call carries; on the device
# it is put where the tests look.
if [ "${1:-}" = "--stage" ]; then
  rm -rf build/carry/shared && mkdir -p build/carry && cp -r ../shared build/carry/shared && du -sh build/carry/shared
  exit 0
fi
if [ ! -e ../shared/spec/formats.md ] && [ -d build/carry/shared ]; then
  mkdir -p ../shared && cp -r build/carry/shared/. ../shared/ && echo "shared/: from build/carry/shared"
fi

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
cmake --preset cuda -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build "$BUILD" --target test_gpu bench_marlin -j "$(nproc)" > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

status=0
summary=()
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  t0=$(date +%s)
  timeout "${TEST_TIMEOUT:-240}" "$BUILD/tests/test_gpu" "$GPU_TESTS" --durations yes > "$OUT/test_gpu.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1 && grep -B5 -A25 -E "FAILED|REQUIRE\(" "$OUT/test_gpu.log" | head -80
  summary+=("tests $GPU_TESTS: rc=$rc, $(grep -E "^(All tests passed|test cases:)" "$OUT/test_gpu.log" | tail -1) ($(( $(date +%s) - t0 )) s)")
fi
if [ "${SKIP_SAN:-0}" != 1 ]; then
  for tool in memcheck racecheck; do
    t0=$(date +%s)
    timeout "${SAN_TIMEOUT:-90}" compute-sanitizer --tool $tool --error-exitcode 9 "$BUILD/tests/test_gpu" "[sanitize]" > "$OUT/san_$tool.log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && status=1 && tail -40 "$OUT/san_$tool.log"
    summary+=("compute-sanitizer $tool [sanitize]: rc=$rc, $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/san_$tool.log" | tail -1) ($(( $(date +%s) - t0 )) s)")
  done
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-200}" "$BUILD/bench/bench_marlin" --json "$OUT/bench.json" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1 || { status=1; tail -20 "$OUT/bench.log"; }
fi

echo "==== summary"
for s in "${summary[@]}"; do echo "$s"; done
if [ -f "$OUT/bench.log" ]; then
  grep -E "^explore" "$OUT/bench.log" | head -120
  sed -n '/^device:/,/^copy bandwidth/p' "$OUT/bench.log" | head -3
  sed -n '/^set /,$p' "$OUT/bench.log"
fi
exit $status
