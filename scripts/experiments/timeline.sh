#!/usr/bin/env bash
# Per-block phase timings of each layer's auto kernel (bench_marlin --timeline) from a build with
# MARLINC_TIMELINE=ON, the raw records in $OUT/timeline_raw and their critical paths (timeline_path.py);
# the [timeline] GPU test on that build. build/cuda is reconfigured with it OFF again at the end.
# Knobs: SETS, MS, EXTRA.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/timeline_raw"
t0=$(date +%s)
cmake --preset cuda -DCMAKE_CUDA_ARCHITECTURES=90 -DMARLINC_TIMELINE=ON > "$OUT/configure_timeline.log" 2>&1 &&
  cmake --build build/cuda --target bench_marlin test_gpu -j 16 > "$OUT/build_timeline.log" 2>&1
echo "timeline build rc=$? ($(( $(date +%s) - t0 )) s)"
timeout 120 build/cuda/tests/test_gpu "[timeline]" > "$OUT/test_timeline.log" 2>&1
echo "[timeline] test rc=$? $(tail -2 "$OUT/test_timeline.log" | tr '\n' ' ')"
timeout "${TIMEOUT:-240}" build/cuda/bench/bench_marlin --sets "${SETS:-llama3-8b,llama3-70b}" --ms "${MS:-1,16}" \
  --timeline-dump "$OUT/timeline_raw" ${EXTRA:-} > "$OUT/timeline.log" 2>&1
echo "bench rc=$?"
grep -E "^(set|llama|large|timeline|--timeline)" "$OUT/timeline.log" | cut -c1-220
python3 scripts/experiments/timeline_path.py "$OUT/timeline_raw" | grep "call 32"
cmake --preset cuda -DMARLINC_TIMELINE=OFF > /dev/null 2>&1
