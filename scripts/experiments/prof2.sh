#!/usr/bin/env bash
# Build bench_marlin; bench given shapes; ncu metrics + source-level stall samples on the wgmma kernel.
# RUNS: "sets:ms:wgmma_rows:wgmma_pipeline ..." (none: no benches); SKIP_BUILD=1 reuses build/cuda; NCU_SPECS: "set:m:launch_skip:kernel_regex:wgmma_pipeline ...";
# EXTRA_METRICS: more ncu metrics, comma-separated.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s)
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  cmake --preset cuda -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null && cmake --build build/cuda --target bench_marlin ${TARGETS:-} -j 16 > "$OUT/build.log" 2>&1 || { grep error "$OUT/build.log" | head; exit 1; }
fi
echo "build: $(( $(date +%s) - t0 )) s"; grep -c C7513 "$OUT/build.log" 2>/dev/null
B=${BENCH:-build/cuda/bench/bench_marlin}
for spec in ${RUNS:-"8192x57344,28672x8192:64,128,256,1024:"}; do
  [ "$spec" = none ] && break
  IFS=: read -r sets ms rows pipe <<< "$spec"
  extra="--wgmma"; [ -n "$rows" ] && extra="--wgmma-rows $rows"
  [ -n "$pipe" ] && extra="$extra --wgmma-pipeline $pipe"
  tag="${rows:-auto}_p${pipe:-0}_${ms//,/-}"
  timeout 200 $B --sets "$sets" --ms "$ms" $extra > "$OUT/bench_$tag.log" 2>&1
  echo "== bench $sets m=$ms rows=${rows:-auto} pipeline=${pipe:-auto}"; grep -E "^(set|[0-9]|llama|large)" "$OUT/bench_$tag.log" | cut -c1-100
done
M="sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed.avg.per_cycle_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,sm__cycles_active.avg,sm__cycles_elapsed.avg,dram__bytes_read.sum,smsp__warps_active.avg.per_cycle_active,launch__registers_per_thread,launch__grid_size,smsp__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed"
for s in barrier long_scoreboard short_scoreboard math_pipe_throttle mio_throttle wait not_selected selected dispatch_stall lg_throttle no_instruction branch_resolving membar drain tex_throttle sleeping misc; do M="$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"; done
[ -n "${EXTRA_METRICS:-}" ] && M="$M,$EXTRA_METRICS"
for spec in ${NCU_SPECS:-"8192x57344:256:3:marlin_wgmma_kernel" "8192x57344:1024:3:marlin_wgmma_kernel" "8192x57344:1024:3:sm90|gemm|xmma|cutlass"}; do
  IFS=: read -r set m skip kern pipe <<< "$spec"
  tag="${set}_${m}_${kern%%|*}_p${pipe:-0}"
  timeout 120 ncu --clock-control none --kernel-name "regex:$kern" --launch-skip "$skip" --launch-count 1 --metrics "$M" $B --sets "$set" --ms "$m" --wgmma ${pipe:+--wgmma-pipeline $pipe} > "$OUT/ncu_$tag.log" 2>&1
  echo "== ncu $tag"
  grep -E "marlin_wgmma_kernel<|marlin_wgmma_ws_kernel<|marlin_kernel<|marlin_stream_kernel<|gemm|gemv|\.ratio|pct|per_cycle|duration|cycles_|bytes_read|registers|grid_size" "$OUT/ncu_$tag.log" | grep -v "==PROF==" | sed -e 's/smsp__average_warps_issue_stalled_//' -e 's/_per_issue_active.ratio//' | awk '{$1=$1; print}' | cut -c1-110 | head -60
done
if [ -n "${SRC_SPEC-8192x57344:256}" ]; then
  IFS=: read -r set m <<< "${SRC_SPEC:-8192x57344:256}"
  timeout 150 ncu --clock-control none --kernel-name regex:${SRC_KERNEL:-marlin_wgmma_kernel} --launch-skip 3 --launch-count 1 --section SourceCounters --section WarpStateStats -o "$OUT/src" $B --sets "$set" --ms "$m" --wgmma > "$OUT/ncu_src_run.log" 2>&1
  ncu -i "$OUT/src.ncu-rep" --page source --csv --print-source sass > "$OUT/src_sass.csv" 2>"$OUT/src_err.log"
  ncu -i "$OUT/src.ncu-rep" --page details > "$OUT/src_details.txt" 2>&1
  echo "== source export: $(wc -l < "$OUT/src_sass.csv") lines"; head -c 600 "$OUT/src_err.log"
  rm -f "$OUT/src.ncu-rep"
fi
