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
have_file /usr/include/eigen3/Eigen/Core || need+=(libeigen3-dev)
have_file /usr/include/CLI/CLI.hpp || need+=(libcli11-dev)
have_file /usr/include/nlohmann/json.hpp || need+=(nlohmann-json3-dev)
{ have_file /usr/include/catch2/catch.hpp || have_file /usr/include/catch2/catch_all.hpp; } || need+=(catch2)
{ have_file /usr/include/sentencepiece_processor.h; } || need+=(libsentencepiece-dev)
# clang's OpenMP and sanitizer runtimes, for the fuzz build.
{ ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; } || need+=(libclang-rt-dev)
{ ls /usr/lib/llvm-*/lib/libomp.so >/dev/null 2>&1 || ls /usr/lib/x86_64-linux-gnu/libomp.so* >/dev/null 2>&1; } || need+=(libomp-dev)

if [ ${#need[@]} -eq 0 ]; then
  echo "setup: all dependencies present"
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
