#!/usr/bin/env bash
# The main job on the built-in sample: build marlinc, then look at the sample checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset cpu >/dev/null
cmake --build --preset cpu --target marlinc
bin=build/cpu/cli/marlinc
out=build/demo
rm -rf "$out"; mkdir -p "$out"
"$bin" inspect data/sample/model
