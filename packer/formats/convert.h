// `marlinc convert` as a library: detect the source format, check every module against the target's
// rules, then stream module by module (peak memory = one layer) into an atomic, sharded, deterministic
// output. The CLI only parses options and prints the report.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "packer/adapters.h"

namespace marlinc {

// One converted (or kept-dequantized) module.
struct ConvertedModule {
  std::string prefix;
  int64_t k = 0, n = 0;
  int bits = 4, group_size = -1;
  std::string from, to;     // e.g. "gptq-v1" -> "marlin"; to = "dequantized" when kept unconverted
  std::string rule;         // the target rule the module broke (kept dequantized), else ""
  uint64_t bytes_in = 0, bytes_out = 0;
  double seconds = 0;
  std::vector<std::string> notes;
};

// A module the target cannot hold.
struct IncompatibleModule {
  std::string prefix;
  int64_t k = 0, n = 0;
  int bits = 4, group_size = -1;
  std::string rule;
  std::vector<std::string> tensors;  // its source tensors
};

struct ConvertReport;

struct ConvertOptions {
  TargetFormat to = TargetFormat::Marlin;
  // Keep modules the target cannot hold as plain `<p>.weight` [n, k] in the scale dtype (dequantized,
  // listed as not converted in the config) instead of stopping.
  bool keep_incompatible = false;
  // Check each module's part at this tensor-parallel size too (checkpoint/tensor_parallel.h); 1 = whole layers.
  int tp = 1;
  uint64_t max_shard_bytes = 5'000'000'000ull;  // tensor bytes per shard (HF's "5GB"); 0 = one file
  bool overwrite = false;
  // Called after every module (index from 0), for progress lines; never required.
  std::function<void(const ConvertedModule&, size_t index, size_t total)> on_module;
  // Called once after detection and planning, before anything is written (report holds the source
  // format, notes and incompatible modules so far).
  std::function<void(const ConvertReport&)> on_start;
};

struct ConvertReport {
  bool ok = false;  // false: incompatible modules stopped the conversion; nothing was written
  std::string input, output, target;
  std::string source_format, source_label;
  std::vector<std::string> notes;  // detection notes (label/data mismatches...) and per-module notes
  std::vector<ConvertedModule> modules;
  std::vector<IncompatibleModule> incompatible;
  size_t passthrough_tensors = 0;
  uint64_t passthrough_bytes = 0;
  std::vector<std::string> copied_files;  // non-tensor files copied (tokenizer, generation config...)
  std::vector<std::string> written_files;  // config files written
  uint64_t bytes_in = 0, bytes_out = 0;   // tensor bytes
  size_t shards = 0;
  double seconds = 0;
  nlohmann::json to_json() const;
};

// Throws BadUsage (no quantized modules, output == input, output exists without overwrite) and BadData
// (corrupt source, a target rule broken while writing, e.g. codes that are not 2:4 for marlin24).
// Incompatible shapes without keep_incompatible return ok = false with `incompatible` filled.
ConvertReport convert_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                                 const ConvertOptions& opts);

// "5GB" (10^9), "500MB", "2GiB" (2^30), "1024" (bytes), "0" (no sharding). Throws BadUsage.
uint64_t parse_size(std::string_view s);

}  // namespace marlinc
