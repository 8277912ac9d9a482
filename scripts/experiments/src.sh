#!/usr/bin/env bash
# ncu source-level (SASS) stall samples of the wgmma kernel on one shape; exports a csv.
set -uo pipefail
OUT=${OUT:-/tmp/out}
B=build/cuda/bench/bench_marlin
IFS=: read -r set m <<< "${SRC_SPEC:-8192x57344:256}"
timeout 150 ncu --clock-control none --kernel-name regex:marlin_wgmma_kernel --launch-skip 3 --launch-count 1 --section SourceCounters --section WarpStateStats -o "$OUT/src" $B --sets "$set" --ms "$m" --wgmma > "$OUT/ncu_src_run.log" 2>&1
ncu -i "$OUT/src.ncu-rep" --page source --csv --print-source sass > "$OUT/src_sass.csv" 2>"$OUT/src_err.log"
echo "== source export: $(wc -l < "$OUT/src_sass.csv") lines"; head -c 300 "$OUT/src_err.log"
rm -f "$OUT/src.ncu-rep"
