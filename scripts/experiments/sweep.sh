#!/usr/bin/env bash
# Builds the working tree ("new") and the trees RUNS names (NAME: build/carry/NAME-src, e.g. old, mid) in parallel
# (TARGETS, e.g. test_gpu, only in the working tree), then bench runs RUNS="old mid new:VAR=value ..." (a tree,
# optionally one environment assignment), so that variants and knobs compare within one device call. EXTRA_i: more
# bench arguments for run i (1-based), e.g. EXTRA_2="--wgmma-rows 256".
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
dir_of() { case $1 in new) echo . ;; *) echo build/carry/$1-src ;; esac; }  # old, mid or any NAME: build/carry/NAME-src
t0=$(date +%s)
trees=$( (echo new; for run in ${RUNS:-old new}; do echo "${run%%:*}"; done) | sort -u)
for tree in $trees; do
  d=$(dir_of $tree); [ -f "$d/CMakeLists.txt" ] || continue
  (cd "$d" && cmake --preset cuda -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null &&
     cmake --build build/cuda --target bench_marlin $([ $tree = new ] && echo ${TARGETS:-}) -j ${JOBS:-5} > "$OUT/build_$tree.log" 2>&1
   echo "$tree build rc=$? C7513=$(grep -c C7513 "$OUT/build_$tree.log")") &
done
wait
echo "builds: $(( $(date +%s) - t0 )) s"
[ -d build/carry/shared ] && [ ! -e ../shared/spec ] && mkdir -p ../shared && cp -r build/carry/shared/. ../shared/
if [ -n "${TESTS:-}" ]; then  # TESTS="[marlin]" needs TARGETS=test_gpu
  t0=$(date +%s); env ${TEST_ENV:-} timeout ${TEST_TIMEOUT:-300} build/cuda/tests/test_gpu "$TESTS" > "$OUT/test.log" 2>&1
  rc=$?; echo "tests rc=$rc $(tail -3 "$OUT/test.log" | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)"
  # A failing kernel makes its timings meaningless: STOP_ON_FAIL=1 skips the benches then.
  if [ $rc != 0 ] && [ "${STOP_ON_FAIL:-0}" = 1 ]; then grep -B5 -A15 FAILED "$OUT/test.log" | head -60; RUNS=none; SAN=0; fi
fi
if [ "${SAN:-0}" = 1 ]; then
  for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 build/cuda/tests/test_gpu "${SAN_SPEC:-[sanitize]}" > "$OUT/san_$tool.log" 2>&1
    echo "$tool rc=$? $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/san_$tool.log" | tail -1)"
  done
fi
i=0
for run in ${RUNS:-old new}; do
  [ "$run" = none ] && break
  i=$((i + 1)); tree=${run%%:*}; envs=(); [ "$run" != "$tree" ] && envs=("${run#*:}")
  t0=$(date +%s)
  env "${envs[@]}" timeout 200 "$(dir_of $tree)/build/cuda/bench/bench_marlin" --sets "${SETS:-llama3-8b,llama3-70b,large}" \
    --ms "${MS:-1,16}" --json "$OUT/bench_$i.json" ${BENCH_EXTRA:-} $(eval echo "\${EXTRA_$i:-}") > "$OUT/bench_$i.log" 2>&1
  rc=$?; echo "== $i $run $(eval echo "\${EXTRA_$i:-}") (rc=$rc, $(( $(date +%s) - t0 )) s)"; grep -E "^(set|llama|large|qwen|explore)" "$OUT/bench_$i.log" | cut -c1-150
done
tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log *.json 2>/dev/null) && rm -f "$OUT"/*.log "$OUT"/*.json
