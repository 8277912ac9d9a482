#!/usr/bin/env bash
# Profile: build bench_marlin, run bench (per-layer json), then ncu metrics on chosen kernels.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s)
cmake --preset cuda -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null && cmake --build build/cuda --target bench_marlin ${TARGETS:-} -j 16 > "$OUT/build.log" 2>&1 || { grep error "$OUT/build.log" | head; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
B=build/cuda/bench/bench_marlin
timeout 240 $B --sets "${SETS:-llama3-8b,llama3-70b,large}" --ms "${MS:-1,16,64,128}" --json "$OUT/bench.json" ${BENCH_EXTRA:-} > "$OUT/bench.log" 2>&1
grep -E "^(set|llama|large|copy)" "$OUT/bench.log" | cut -c1-118
M="sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed.avg.per_cycle_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,sm__cycles_active.avg,smsp__warps_active.avg.per_cycle_active"
for s in barrier long_scoreboard short_scoreboard math_pipe_throttle mio_throttle wait not_selected selected dispatch_stall lg_throttle no_instruction branch_resolving membar drain tex_throttle; do M="$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"; done
# spec: "set:m:skip" - profile the (skip+1)-th marlin launch of that run (eager warm-up launches come first per layer).
for spec in ${NCU_SPECS:-llama3-8b:1:70 llama3-70b:64:3 large:1:3}; do
  IFS=: read -r set m skip <<< "$spec"
  timeout 120 ncu --clock-control none --kernel-name regex:${NCU_KERNEL:-marlin_kernel} --launch-skip "$skip" --launch-count 1 --metrics "$M" $B --sets "$set" --ms "$m" > "$OUT/ncu_${set}_${m}.log" 2>&1
  echo "== ncu $set m=$m (skip $skip)"
  grep -E "marlin_kernel<|marlin_wgmma_kernel<|\.ratio|pct|per_cycle|duration|cycles_active" "$OUT/ncu_${set}_${m}.log" | sed -e 's/smsp__average_warps_issue_stalled_//' -e 's/_per_issue_active.ratio//' | awk '{$1=$1; print}' | head -30
done
