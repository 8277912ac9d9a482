#!/usr/bin/env bash
# A/B/C on the device: old (build/carry/old-src), mid (build/carry/mid-src), new (working tree).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d build/carry/shared ] && [ ! -e ../shared/spec ] && mkdir -p ../shared && cp -r build/carry/shared/. ../shared/
t0=$(date +%s)
bld() { (cd "$1" && cmake --preset cuda -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null && cmake --build build/cuda --target bench_marlin $2 -j ${3:-5} > "$OUT/build_$4.log" 2>&1; echo "$4 build rc=$? C7513=$(grep -c C7513 "$OUT/build_$4.log")"); }
bld build/carry/old-src "" 4 old & bld build/carry/mid-src test_gpu 6 mid & bld . test_gpu 6 new &
wait; echo "builds: $(( $(date +%s) - t0 )) s"
for side in mid new; do
  d=.; [ $side = mid ] && d=build/carry/mid-src
  t0=$(date +%s); timeout 200 $d/build/cuda/tests/test_gpu "${TESTS:-[wgmma]}" > "$OUT/test_$side.log" 2>&1
  echo "$side tests rc=$? $(tail -3 "$OUT/test_$side.log" | tr '\n' ' ') ($(( $(date +%s) - t0 )) s)"
done
for side in ${SIDES:-old mid new}; do
  d=.; [ $side = mid ] && d=build/carry/mid-src; [ $side = old ] && d=build/carry/old-src
  timeout 300 $d/build/cuda/bench/bench_marlin --sets "${SETS:-llama3-8b,llama3-70b}" --ms "${MS:-64,128,256,1024}" --json "$OUT/bench_$side.json" --wgmma > "$OUT/bench_$side.log" 2>&1
  echo "== $side (rc=$?)"; grep -E "^(llama|large|[0-9])" "$OUT/bench_$side.log" | cut -c1-75
done
