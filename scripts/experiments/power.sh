#!/usr/bin/env bash
# Clocks and power while each GEMM runs (issue 4): builds bench_marlin, logs `nvidia-smi` every LMS ms
# (read-only queries: nothing is set), runs the bench with `--soak SOAK` (each cuBLAS and Auto graph
# replays SOAK seconds before it is timed) and prints, per soak window, the median SM clock, power draw
# and the clock-event reasons seen (power_summary.py). Knobs: SETS, MS, SOAK, LMS, SKIP_BUILD=1, BENCH_EXTRA (more
# bench arguments, e.g. "--wgmma-rows 256").
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  t0=$(date +%s)
  cmake --preset cuda -DCMAKE_CUDA_ARCHITECTURES=90 > /dev/null &&
    cmake --build build/cuda --target bench_marlin -j "$(nproc)" > "$OUT/power_build.log" 2>&1 ||
    { grep -E "error" "$OUT/power_build.log" | head; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
fi
nvidia-smi -q -d POWER | grep -E "Power Limit|Power Draw" | head -6
fields=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$fields --format=csv,noheader > /dev/null 2>&1 ||
  fields=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active
python3 -c 'import time; print(int(time.time()*1000), time.strftime("%Y/%m/%d %H:%M:%S"))' > "$OUT/power_clock0.txt"
nvidia-smi --query-gpu=$fields --format=csv,noheader,nounits -lms "${LMS:-50}" > "$OUT/power_smi.csv" 2>&1 &
smi=$!
timeout "${BENCH_TIMEOUT:-400}" build/cuda/bench/bench_marlin --sets "${SETS:-large,llama3-70b}" --ms "${MS:-1,16}" \
  --auto-only --soak "${SOAK:-3}" ${BENCH_EXTRA:-} > "$OUT/power_bench.log" 2> "$OUT/power_soak.log"
rc=$?
kill "$smi" 2> /dev/null; wait "$smi" 2> /dev/null
echo "bench rc=$rc"
python3 scripts/experiments/power_summary.py "$OUT/power_smi.csv" "$OUT/power_soak.log"
grep -E "^(set|llama|large|[0-9])" "$OUT/power_bench.log" | cut -c1-150
exit $rc
