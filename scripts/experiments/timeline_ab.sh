#!/usr/bin/env bash
# Per-block timelines of the trees TREES names ("old new": build/carry/old-src and the working tree), built in
# parallel with MARLINC_TIMELINE=ON and dumped one after another (bench_marlin --timeline-dump into
# $OUT/tl_TREE), then the ends of shared slices of each (timeline_finish.py). Each build/cuda is configured with
# the timeline OFF again at the end. Knobs: TREES, SETS, MS, MIN_BLOCKS.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
dir_of() { case $1 in new) echo . ;; *) echo build/carry/$1-src ;; esac; }
t0=$(date +%s)
for tree in ${TREES:-old new}; do
  (cd "$(dir_of $tree)" && cmake --preset cuda -DCMAKE_CUDA_ARCHITECTURES=90 -DMARLINC_TIMELINE=ON > /dev/null 2>&1 &&
     cmake --build build/cuda --target bench_marlin -j 16 > "$OUT/build_tl_$tree.log" 2>&1
   echo "$tree timeline build rc=$?") &
done
wait
echo "builds: $(( $(date +%s) - t0 )) s"
for tree in ${TREES:-old new}; do
  mkdir -p "$OUT/tl_$tree"
  timeout 200 "$(dir_of $tree)/build/cuda/bench/bench_marlin" --sets "${SETS:-llama3-8b,llama3-70b}" --ms "${MS:-128,256}" \
    --auto-only --timeline-dump "$OUT/tl_$tree" > "$OUT/tl_$tree.log" 2>&1
  echo "== $tree (rc=$?)"
  python3 scripts/experiments/timeline_finish.py "$OUT/tl_$tree" "${MIN_BLOCKS:-3}"
done
for tree in ${TREES:-old new}; do
  (cd "$(dir_of $tree)" && cmake --preset cuda -DMARLINC_TIMELINE=OFF > /dev/null 2>&1)
done
