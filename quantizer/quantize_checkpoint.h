// `marlinc quantize` as a library: stream a plain FP16/BF16/FP32 checkpoint, quantize every linear
// layer the target format can hold, pass everything else through byte-identical, and write the
// target through the packer's adapters (atomic, sharded, deterministic). The CLI only parses and prints.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/writer.h"
#include "packer/adapters.h"

namespace marlinc {

struct QuantizeOptions {
  TargetFormat to = TargetFormat::Marlin;
  std::string method = "rtn";          // rtn here; gptq through calib::gptq_quantize_checkpoint
  int bits = 4;
  int group_size = 128;
  bool clip = true;                    // RTN: unweighted Lp clip search
  std::vector<std::string> skip;       // substrings of module names to leave unquantized
  bool include_lm_head = false;        // lm_head is left alone unless asked; embeddings always are
  bool act_order = false;              // every module stores g_idx, configs say desc_act (GPTQ --order dynamic)
  // GPTQ visited the columns in activation order with contiguous groups (--order static or gar): no
  // g_idx; compressed-tensors configs of grouped schemes say actorder "weight", as llm-compressor's do.
  bool calibration_act_order = false;
  uint64_t max_shard_bytes = 5'000'000'000ull;
  bool overwrite = false;
  int tp = 1;                          // layers whose tensor-parallel part breaks the target's rules stay unquantized
};

struct QuantizedLayerReport {
  std::string name;
  int64_t n = 0, k = 0;                // HF weight [n, k]
  double rel_weight_err = 0;
  double seconds = 0;
  double loss = -1, damp = -1;         // GPTQ only: OBS loss estimate and the relative damping used
};

struct QuantizeReport {
  std::string input, output, target, method;
  std::vector<QuantizedLayerReport> layers;
  std::vector<std::pair<std::string, std::string>> skipped;  // layer -> why
  size_t passthrough_tensors = 0;
  uint64_t bytes_in = 0, bytes_out = 0;
  double seconds = 0;
  std::vector<std::string> notes;  // about the output as written (e.g. a replaced output left behind)
  nlohmann::json to_json() const;
};

using LayerDone = std::function<void(const QuantizedLayerReport&, size_t index, size_t total)>;

// The plan shared by every method: which `<p>.weight` tensors become quantized modules (with the
// reason for each one left alone, in rep.skipped), and every output tensor's spec, before any data
// is read. Throws BadUsage when the input is already quantized or nothing can be quantized.
struct QuantJob {
  std::string prefix;
  const TensorInfo* info = nullptr;
  ModuleDesc desc;
};
struct QuantPlan {
  std::vector<QuantJob> jobs;
  std::vector<TensorSpec> specs;
  std::map<std::string, size_t> job_of_tensor;  // "<p>.weight" -> index into jobs
};
QuantPlan plan_quantization(const Checkpoint& ck, const QuantizeOptions& o, QuantizeReport& rep);
// The scale type the job's grid rounds to, which is the one the output stores: bf16 for a bf16 model
// (the dtype its bf16 Marlin kernel takes), except in Sparse-Marlin, whose kernels take fp16 only.
bool grid_bf16(const QuantizeOptions& o, const QuantJob& job);
// Packs q for the target and writes its tensors (q's scales of the type grid_bf16 gives; another type is
// an internal error). Adds the bytes written to rep.bytes_out; returns q as written.
QuantizedLinear write_quantized(CheckpointWriter& w, const QuantizeOptions& o, const QuantJob& job, QuantizedLinear q,
                     QuantizeReport& rep);
// config.json (+ quantize_config.json) for the target, the non-tensor files, commit. The config names
// the linears P leaves unquantized; `extra_quant` is merged into the quantization config (e.g. the
// calibration record).
void finish_output(CheckpointWriter& w, const Checkpoint& ck, const QuantizeOptions& o, const QuantPlan& P,
                   QuantizeReport& rep, const nlohmann::json& extra_quant = nlohmann::json::object());

// Throws BadUsage (options, quantized input, nothing to quantize) and BadData (corrupt input).
QuantizeReport quantize_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                                   const QuantizeOptions& opts, const LayerDone& on_layer = {});

}  // namespace marlinc
