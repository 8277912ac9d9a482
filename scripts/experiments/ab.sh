#!/usr/bin/env bash
# A/B on the device: old tree (build/carry/old-src) vs the working tree. Args via env: SETS, MS, NCU=1.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
t0=$(date +%s)
(cmake --preset cuda -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null && cmake --build build/cuda --target bench_marlin ${NEW_TARGETS:-test_gpu} -j 10 > "$OUT/build_new.log" 2>&1; echo "new build rc=$?") &
if [ "${OLD:-1}" = 1 ]; then
(cd build/carry/old-src && cmake --preset cuda -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null && cmake --build build/cuda --target bench_marlin -j 6 > "$OUT/build_old.log" 2>&1; echo "old build rc=$?") &
fi
wait
echo "builds: $(( $(date +%s) - t0 )) s"
grep -E "error" "$OUT/build_new.log" | head -20
if [ -n "${TESTS:-[marlin]}" ] && [ -x build/cuda/tests/test_gpu ]; then
  t0=$(date +%s)
  [ -d build/carry/shared ] && [ ! -e ../shared/spec ] && mkdir -p ../shared && cp -r build/carry/shared/. ../shared/
  timeout 300 build/cuda/tests/test_gpu "${TESTS:-[marlin]}" > "$OUT/test.log" 2>&1; echo "tests rc=$? $(tail -3 "$OUT/test.log" | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)"
fi
if [ "${SAN:-0}" = 1 ]; then
  for tool in memcheck racecheck; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 build/cuda/tests/test_gpu "[sanitize]" > "$OUT/san_$tool.log" 2>&1
    echo "$tool rc=$? $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/san_$tool.log" | tail -1)"
  done
fi
grep -h "C7513" "$OUT/build_new.log" | head -3
obj=$(find build/cuda -name "marlin_fp16_mb1.cu.o" | head -1)
if [ -n "$obj" ]; then
  cuobjdump -sass "$obj" > "$OUT/sass_fp16_mb1.txt" 2>/dev/null
  python3 - "$OUT/sass_fp16_mb1.txt" <<'PY'
import sys, re, collections
txt = open(sys.argv[1]).read()
for fn in re.split(r'\n\s*Function : ', txt)[1:]:
    name = fn.split('\n')[0]
    ops = collections.Counter(re.findall(r'/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)', fn))
    short = {k.split('.')[0] for k in ops}
    c = collections.Counter()
    for k, v in ops.items(): c[k.split('.')[0]] += v
    print(name.strip()[:70], 'total', sum(c.values()), ' '.join(f'{k}={c[k]}' for k in ['HMMA','LOP3','PRMT','HMUL2','HFMA2','HADD2','LDS','LDSM','LDGSTS','BAR','IMAD','IADD3','LEA','SHF','MOV','BRA']))
PY
fi
IFS=, read -r -a _ <<< ""
for side in ${SIDES:-old new}; do
  bin=build/cuda/bench/bench_marlin; [ "$side" = old ] && bin=build/carry/old-src/build/cuda/bench/bench_marlin
  [ -x "$bin" ] || continue
  timeout 300 "$bin" --sets "${SETS:-llama3-8b,llama3-70b,large}" --ms "${MS:-1,16,64}" --json "$OUT/bench_$side.json" ${BENCH_EXTRA:---wgmma} > "$OUT/bench_$side.log" 2>&1
  echo "== $side (rc=$?)"; grep -E "^(set|llama|large|copy)" "$OUT/bench_$side.log" | cut -c1-118
done
if [ "${NCU:-0}" = 1 ]; then
  timeout 200 ncu --clock-control none --kernel-name regex:${NCU_KERNEL:-marlin_kernel} --launch-skip ${NCU_SKIP:-3} --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
    build/cuda/bench/bench_marlin --sets "${NCU_SET:-llama3-8b}" --ms 1 > "$OUT/ncu.log" 2>&1
  grep -E "marlin_kernel|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Issued Warp|No Eligible|Active Warps|Eligible Warps|Stall|Registers|Achieved Occupancy|Grid Size|Warp Cycles" "$OUT/ncu.log" | head -40
fi
if [ -n "${EXPLORE_MS:-}" ]; then
  timeout 300 build/cuda/bench/bench_marlin --sets llama3-8b,llama3-70b --ms "$EXPLORE_MS" --explore > "$OUT/explore.log" 2>&1
  echo "== explore rc=$?"; grep -E "^explore" "$OUT/explore.log"
fi
