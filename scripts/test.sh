#!/usr/bin/env bash
# Builds and runs every test that needs no GPU, then fuzzes the safetensors header parser, the resume
# job's readers, the model's config.json reader, the tokenizer.json reader and the quantization configs'
# readers (format detection) for a bounded time each.
# Prints "N passed, M failed" last.
#
# Two builds, so that both sides of MARLINC_CUDA are compiled and tested without building everything
# three times on a 2-core machine:
#  - main: the `cuda` preset when a CUDA compiler is present (device code compiled for sm_90 only here,
#    so it never breaks silently; the GPU machine builds its own), else the `cpu` preset. Its non-GPU
#    tests run; with no GPU present, every path that would use one falls back to the CPU.
#  - asan: CUDA off, AddressSanitizer + UBSan, every non-GPU test.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS=${FUZZ_SECONDS:-45}  # per fuzzer
logs=build/test-logs
mkdir -p "$logs"
passed=0; failed=0
count() {  # add ctest's "x% tests passed, F tests failed out of T" from log $1
  local line t f
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$1" | tail -n 1)
  if [ -z "$line" ]; then echo "no ctest summary in $1" >&2; failed=$((failed + 1)); return; fi
  t=$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$line"); f=$(sed -E 's/.*passed, ([0-9]+) tests? failed.*/\1/' <<<"$line")
  passed=$((passed + t - f)); failed=$((failed + f))
}
stamp() { echo "== $1 ($(date +%T))"; }
# ccache (CMakeLists.txt uses it when present): paths relative to the clone, so a fresh clone in another
# folder hits what an earlier one compiled; the Catch2 precompiled header needs the pch sloppiness.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime

if [ -z "${CUDACXX:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then export CUDACXX=/usr/local/cuda/bin/nvcc; fi
if command -v "${CUDACXX:-nvcc}" >/dev/null 2>&1; then
  main=cuda
  stamp "cuda preset (sm_90 device code; tests that need no GPU)"
  cmake --preset cuda -DCMAKE_CUDA_ARCHITECTURES="${MARLINC_CI_CUDA_ARCHS:-90}" >/dev/null
else
  main=cpu
  stamp "cpu preset (no CUDA compiler found)"
  cmake --preset cpu >/dev/null
fi
cmake --build "build/$main"
ctest --test-dir "build/$main" --output-on-failure -j 2 -LE gpu 2>&1 | tee "$logs/$main.log" || true
count "$logs/$main.log"

stamp "asan preset (AddressSanitizer + UBSan, CUDA off)"
cmake --preset asan >/dev/null
cmake --build --preset asan
ASAN_OPTIONS=detect_leaks=1 ctest --preset asan 2>&1 | tee "$logs/asan.log" || true
count "$logs/asan.log"

stamp "fuzzing the safetensors header parser, the resume job's readers, config.json, tokenizer.json and the quantization configs, ${FUZZ_SECONDS}s each"
cmake --preset fuzz >/dev/null
cmake --build build/fuzz --target fuzz_safetensors_header fuzz_job_file fuzz_model_config fuzz_tokenizer_json fuzz_quant_config
for target in safetensors_header job_file model_config tokenizer_json quant_config; do
  corpus=tests/fuzz/corpus max_len=4096
  [ "$target" = job_file ] && corpus=tests/fuzz/corpus_job
  [ "$target" = model_config ] && corpus=tests/fuzz/corpus_config
  [ "$target" = tokenizer_json ] && corpus=tests/fuzz/corpus_tokenizer max_len=8192  # seeds of 3-4 KB
  [ "$target" = quant_config ] && corpus=tests/fuzz/corpus_quant_config
  mkdir -p "build/fuzz/corpus_$target"
  if ./build/fuzz/tests/fuzz/fuzz_$target -max_total_time="$FUZZ_SECONDS" -max_len=$max_len -print_final_stats=1 \
      "build/fuzz/corpus_$target" "$corpus" > "$logs/fuzz_$target.log" 2>&1; then
    passed=$((passed + 1)); echo "fuzzer $target: clean"
  else
    failed=$((failed + 1)); echo "fuzzer $target: FAILED"
  fi
  tail -n 4 "$logs/fuzz_$target.log"
done

stamp "done"
echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
