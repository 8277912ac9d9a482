#!/usr/bin/env bash
# The kernels cuBLAS runs for single layers in bench_marlin's FP16 baseline, with their ncu durations
# (one pass over every launch) and launch/DRAM/SM-activity metrics (one launch each), next to the
# same metrics for marlinc's kernels on the layer: how much of a call its SMs are busy.
# LAYERS="KxN ..." (bench sets), M (tokens), MET (the per-launch metrics), BENCH_EXTRA (e.g. --auto-only). Run from
# the repository root on the device machine.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
cmake --preset cuda -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null &&
  cmake --build build/cuda --target bench_marlin -j 16 > "$OUT/build.log" 2>&1 || { tail "$OUT/build.log"; exit 1; }
B=build/cuda/bench/bench_marlin
MET=${MET:-"gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__cycles_active.avg,sm__cycles_elapsed.avg,launch__grid_size,launch__block_size,launch__registers_per_thread,smsp__warps_active.avg.per_cycle_active"}
for L in ${LAYERS:-4096x6144 4096x4096 14336x4096}; do
  timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --csv $B --sets "$L" --ms "${M:-1}" ${BENCH_EXTRA:-} > "$OUT/names_$L.csv" 2>/dev/null
  # Kernels first launched after the bench's weight fill (fill_bits): the layer's cuBLAS kernel(s) and
  # ours. One line each: launches to skip (the fourth launch), launches, median us, name.
  python3 - "$OUT/names_$L.csv" > "$OUT/kernels_$L.txt" <<'PY'
import csv, statistics, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
rows = rows[next(i for i, r in enumerate(rows) if "Kernel Name" in r):]  # past the bench's own lines with commas
h = rows[0]
k, m, v, u = (h.index(c) for c in ("Kernel Name", "Metric Name", "Metric Value", "Metric Unit"))
seq = [(r[k].split("(")[0], float(r[v].replace(",", "")) * {"ns": 1e-3, "us": 1.0, "ms": 1e3}[r[u]])
       for r in rows[1:] if r[m] == "gpu__time_duration.sum"]
start = next(i for i, (n, _) in enumerate(seq) if "fill_bits" in n)
seen = {}
for i, (n, t) in enumerate(seq[start:], start):
    if "fill_" in n or "copy_int4" in n:
        continue
    seen.setdefault(n, []).append((i, t))
for n, l in seen.items():
    if len(l) >= 4:
        print(l[3][0], len(l), f"{statistics.median(t for _, t in l):.2f}", n.replace(" ", "_"))
PY
  while read -r skip count med name; do
    echo "== $L m=${M:-1}: $name (${count} launches, median ${med} us under ncu)"
    timeout 120 ncu --clock-control none --launch-skip "$skip" --launch-count 1 --metrics "$MET" $B --sets "$L" --ms "${M:-1}" ${BENCH_EXTRA:-} > "$OUT/ncu_${L}_$skip.log" 2>&1
    grep -E "duration|dram__|cycles_|grid_size|block_size|registers|warps_active|pipe_" "$OUT/ncu_${L}_$skip.log" | awk '{$1=$1; print}'
  done < "$OUT/kernels_$L.txt"
done
