// `marlinc quantize` as a library: stream a plain FP16/BF16/FP32 checkpoint, quantize every linear
// layer the target format can hold, pass everything else through byte-identical, and write the
// target through the packer's adapters (atomic, sharded, deterministic). The CLI only parses and prints.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "packer/adapters.h"

namespace marlinc {

struct QuantizeOptions {
  TargetFormat to = TargetFormat::Marlin;
  std::string method = "rtn";          // the data-free path; GPTQ needs calibration (calibration runner)
  int bits = 4;
  int group_size = 128;
  bool clip = true;                    // RTN: unweighted Lp clip search
  std::vector<std::string> skip;       // substrings of module names to leave unquantized
  bool include_lm_head = false;        // lm_head / embeddings are left alone unless asked
  uint64_t max_shard_bytes = 5'000'000'000ull;
  bool overwrite = false;
};

struct QuantizedLayerReport {
  std::string name;
  int64_t n = 0, k = 0;                // HF weight [n, k]
  double rel_weight_err = 0;
  double seconds = 0;
};

struct QuantizeReport {
  std::string input, output, target, method;
  std::vector<QuantizedLayerReport> layers;
  std::vector<std::pair<std::string, std::string>> skipped;  // layer -> why
  size_t passthrough_tensors = 0;
  uint64_t bytes_in = 0, bytes_out = 0;
  double seconds = 0;
  nlohmann::json to_json() const;
};

using LayerDone = std::function<void(const QuantizedLayerReport&, size_t index, size_t total)>;

// Throws BadUsage (options, quantized input, nothing to quantize) and BadData (corrupt input).
QuantizeReport quantize_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                                   const QuantizeOptions& opts, const LayerDone& on_layer = {});

}  // namespace marlinc
