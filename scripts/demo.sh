#!/usr/bin/env bash
# The main job on the built-in sample: build marlinc, quantize the sample checkpoint to Marlin with
# GPTQ + Marlin's clip search (calibrated on samples the model generates itself: the built-in
# default), verify every packed layer against the original weights, and show the certificate's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset cpu >/dev/null
cmake --build --preset cpu --target marlinc
bin=build/cpu/cli/marlinc
out=build/demo
rm -rf "$out"; mkdir -p "$out"
echo "== marlinc inspect data/sample/model"
"$bin" inspect data/sample/model | tail -n 8
echo "== marlinc quantize (GPTQ + clip search, group 128, built-in calibration) -> Marlin"
"$bin" quantize data/sample/model "$out/sample-marlin" --method gptq --format marlin --group 128 --json "$out/quantize.json"
echo "== marlinc verify"
"$bin" verify "$out/sample-marlin" --reference data/sample/model --certificate "$out/certificate.json"
echo "== certificate summary ($out/certificate.json)"
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(json.dumps({k: c[k] for k in ('backend','summary')}, indent=1))" \
  "$out/certificate.json" 2>/dev/null || grep -A5 '"summary"' "$out/certificate.json"
