#!/usr/bin/env bash
# Installs marlinc's build dependencies from Debian's packages when they are missing.
# Idempotent and non-interactive; on a machine that already has everything (the GPU machine,
# which has no package registry) it installs nothing.
set -euo pipefail

need=()
have_file() { [ -e "$1" ]; }
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
command -v clang++ >/dev/null || need+=(clang)                 # the libFuzzer target
command -v ccache >/dev/null || need+=(ccache)                 # rebuilds in fresh clones (CI) hit the cache
have_file /usr/include/eigen3/Eigen/Core || need+=(libeigen3-dev)
have_file /usr/include/CLI/CLI.hpp || need+=(libcli11-dev)
have_file /usr/include/nlohmann/json.hpp || need+=(nlohmann-json3-dev)
{ have_file /usr/include/catch2/catch.hpp || have_file /usr/include/catch2/catch_all.hpp; } || need+=(catch2)
{ have_file /usr/include/sentencepiece_processor.h; } || need+=(libsentencepiece-dev)
# clang's OpenMP and sanitizer runtimes, for the fuzz build.
{ ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; } || need+=(libclang-rt-dev)
{ ls /usr/lib/llvm-*/lib/libomp.so >/dev/null 2>&1 || ls /usr/lib/x86_64-linux-gnu/libomp.so* >/dev/null 2>&1; } || need+=(libomp-dev)
# Python only for the interop test (tests/interop): a venv in .deps/py with numpy and safetensors.
command -v python3 >/dev/null || need+=(python3)
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need+=(python3-venv)

# The interop test's venv, made after the packages above are in (PyPI is reachable where Debian's
# packages are; the GPU machine has neither and skips this when its python already has both).
py_env() {
  local py=.deps/py/bin/python3
  if [ -x "$py" ] && "$py" -c "import numpy, safetensors" 2>/dev/null; then return 0; fi
  python3 -m venv .deps/py && "$py" -m pip install --quiet --disable-pip-version-check numpy safetensors
}

cd "$(dirname "$0")/.."
if [ ${#need[@]} -eq 0 ]; then
  echo "setup: all dependencies present"
  py_env || echo "setup: could not make the Python venv .deps/py (the interop test will fail)" >&2
  exit 0
fi
echo "setup: installing ${need[*]}"
if ! command -v apt-get >/dev/null; then
  echo "setup: apt-get not found; install these packages by hand: ${need[*]}" >&2
  exit 1
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
py_env
