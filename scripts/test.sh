#!/usr/bin/env bash
# Builds and runs every test that needs no GPU, in the `cpu` and `asan` presets; compiles the CUDA
# code when a CUDA compiler is present (so device code never breaks silently); runs the safetensors
# header fuzzer for a bounded time. Prints "N passed, M failed" last.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
logs=build/test-logs
mkdir -p "$logs"
passed=0; failed=0
count() {  # add ctest's "x% tests passed, F tests failed out of T" from log $1
  local line t f
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$1" | tail -n 1)
  t=$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$line"); f=$(sed -E 's/.*passed, ([0-9]+) tests? failed.*/\1/' <<<"$line")
  passed=$((passed + t - f)); failed=$((failed + f))
}

echo "== cpu preset"
cmake --preset cpu >/dev/null
cmake --build --preset cpu
ctest --preset cpu 2>&1 | tee "$logs/cpu.log" || true
count "$logs/cpu.log"

echo "== asan preset (AddressSanitizer + UBSan)"
cmake --preset asan >/dev/null
cmake --build --preset asan
ASAN_OPTIONS=detect_leaks=1 ctest --preset asan 2>&1 | tee "$logs/asan.log" || true
count "$logs/asan.log"

if [ -z "${CUDACXX:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then export CUDACXX=/usr/local/cuda/bin/nvcc; fi
if command -v "${CUDACXX:-nvcc}" >/dev/null 2>&1; then
  echo "== cuda preset: compile only (no GPU here)"
  cmake --preset cuda >/dev/null
  cmake --build --preset cuda
else
  echo "== cuda preset skipped: no CUDA compiler"
fi

echo "== fuzzing the safetensors header parser for ${FUZZ_SECONDS}s"
cmake --preset fuzz >/dev/null
cmake --build build/fuzz --target fuzz_safetensors_header
mkdir -p build/fuzz/corpus
./build/fuzz/tests/fuzz/fuzz_safetensors_header -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 \
  build/fuzz/corpus tests/fuzz/corpus 2>&1 | tail -n 12 | tee "$logs/fuzz.log"

echo
echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
