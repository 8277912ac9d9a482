// Target names and the checkpoint-wide quantization config each target family expects
// (formats.md §1.10, §3.7, §4.6, §5, §6.4), written so vLLM / transformers / AutoGPTQ-family loaders
// recognise the files.
#include <algorithm>
#include <map>
#include <set>

#include "packer/adapters.h"
#include "packer/formats/common.h"

namespace marlinc {

using json = nlohmann::json;

std::optional<TargetFormat> target_from_name(std::string_view s) {
  if (s == "marlin") return TargetFormat::Marlin;
  if (s == "marlin24" || s == "marlin_24" || s == "marlin-24") return TargetFormat::Marlin24;
  if (s == "gptq" || s == "gptq_v1" || s == "gptq-v1") return TargetFormat::GptqV1;
  if (s == "gptq_v2" || s == "gptq-v2") return TargetFormat::GptqV2;
  if (s == "compressed-tensors" || s == "compressed_tensors" || s == "ct") return TargetFormat::CompressedTensors;
  if (s == "awq") return TargetFormat::Awq;
  return std::nullopt;
}

std::string target_name(TargetFormat t) {
  switch (t) {
    case TargetFormat::Marlin: return "marlin";
    case TargetFormat::Marlin24: return "marlin24";
    case TargetFormat::GptqV1: return "gptq";
    case TargetFormat::GptqV2: return "gptq_v2";
    case TargetFormat::CompressedTensors: return "compressed-tensors";
    case TargetFormat::Awq: return "awq";
  }
  return "?";
}

Format target_format(TargetFormat t) {
  switch (t) {
    case TargetFormat::Marlin: return Format::Marlin;
    case TargetFormat::Marlin24: return Format::Marlin24;
    case TargetFormat::GptqV1: return Format::GptqV1;
    case TargetFormat::GptqV2: return Format::GptqV2;
    case TargetFormat::CompressedTensors: return Format::CompressedTensorsPack;
    case TargetFormat::Awq: return Format::Awq;
  }
  return Format::Unknown;
}

namespace {

// Anchored regex matching exactly one module name (GPTQModel `dynamic` keys are regexes).
std::string exact_regex(const std::string& name) {
  std::string r = "^";
  for (char c : name) {
    if (std::string_view(".^$|()[]{}*+?\\").find(c) != std::string_view::npos) r += '\\';
    r += c;
  }
  return r + "$";
}

bool is_gptq_family(const json& q) {
  if (!q.is_object()) return false;
  auto m = q.find("quant_method");
  if (m == q.end()) return q.contains("bits");
  return m->is_string() && (*m == "gptq" || *m == "marlin");
}

// GPTQ-family dict: generic keys of a GPTQ-family source kept, format keys set from the data.
json gptq_family_dict(const json& src_quant, const QuantSummary& s, const std::string& checkpoint_format) {
  static const std::set<std::string> replaced = {
      "bits", "group_size", "desc_act", "sym", "quant_method", "checkpoint_format", "is_marlin_format", "dynamic",
      "w_bit", "q_group_size", "zero_point", "version", "modules_to_not_convert", "format", "method", "marlinc",
      "lm_head"};
  json d = json::object();
  if (is_gptq_family(src_quant))
    for (auto it = src_quant.begin(); it != src_quant.end(); ++it)
      if (!replaced.count(it.key())) d[it.key()] = it.value();
  d["bits"] = s.bits;
  d["group_size"] = s.group_size;
  d["desc_act"] = s.desc_act;
  d["sym"] = s.sym;
  d["quant_method"] = "gptq";
  d["checkpoint_format"] = checkpoint_format;
  d["lm_head"] = s.lm_head_quantized;  // GPTQModel / vLLM build lm_head quantized only when this says so

  // `dynamic`: from the output's own modules only, "-:" for kept-dequantized layers and the other plain linears
  // and "+:" for per-module bits/group overrides, each an exact regex. The source's rules are not carried: a
  // source "-:" rule may match modules that hold quantized tensors (the data decides, not the config), which a
  // loader would then build unquantized; the exact rules already name every plain linear of the output.
  json dyn = json::object();
  for (const auto& p : s.dequantized) dyn["-:" + exact_regex(p)] = json::object();
  // Other plain linears too (skipped layers): GPTQModel and vLLM otherwise expect every Linear of the
  // decoder quantized. lm_head has its own switch (lm_head: false) in those loaders.
  for (const auto& p : s.plain_linears)
    if (p.find("lm_head") == std::string::npos) dyn["-:" + exact_regex(p)] = json::object();
  for (const auto& [p, bg] : s.overrides) dyn["+:" + exact_regex(p)] = {{"bits", bg.first}, {"group_size", bg.second}};
  if (!dyn.empty()) d["dynamic"] = dyn;
  if (!s.dequantized.empty()) d["modules_to_not_convert"] = s.dequantized;

  if (s.act_order_marlin || s.zero_points_marlin) {
    json ext = json::object();
    if (s.act_order_marlin)
      ext["act_order"] = "<p>.g_idx int32 [k] sorted, <p>.perm int32 [k]: Marlin row j holds original input row perm[j]";
    if (s.zero_points_marlin) ext["zero_points"] = "<p>.qzeros int32 [G, n/8] in the Marlin zero-point layout";
    ext["doc"] = "docs/FORMATS.md";
    d["marlinc"] = ext;
  }
  return d;
}

json compressed_tensors_dict(const QuantSummary& s) {
  auto weights = [&](int bits, int group) {
    json w = {{"num_bits", bits},
              {"type", "int"},
              {"symmetric", s.sym},
              {"group_size", group > 0 ? json(group) : json(nullptr)},
              {"strategy", group > 0 ? "group" : "channel"},
              {"block_structure", nullptr},
              {"dynamic", false},
              {"actorder", s.desc_act ? json("group") : (s.weight_act_order && group > 0 ? json("weight") : json(nullptr))},
              {"observer", "minmax"},
              {"observer_kwargs", json::object()}};
    return w;
  };
  json groups = json::object();
  groups["group_0"] = {{"targets", json::array({"Linear"})},
                       {"weights", weights(s.bits, s.group_size)},
                       {"input_activations", nullptr},
                       {"output_activations", nullptr},
                       {"format", "pack-quantized"}};
  // Modules whose bits/group differ get their own scheme targeting them by name.
  std::map<std::pair<int, int>, std::vector<std::string>> by_scheme;
  for (const auto& [p, bg] : s.overrides) by_scheme[bg].push_back(p);
  int gi = 1;
  for (const auto& [bg, names] : by_scheme)
    groups["group_" + std::to_string(gi++)] = {{"targets", names},
                                               {"weights", weights(bg.first, bg.second)},
                                               {"input_activations", nullptr},
                                               {"output_activations", nullptr},
                                               {"format", "pack-quantized"}};
  std::vector<std::string> ignore = s.plain_linears;
  ignore.insert(ignore.end(), s.dequantized.begin(), s.dequantized.end());
  std::sort(ignore.begin(), ignore.end());
  ignore.erase(std::unique(ignore.begin(), ignore.end()), ignore.end());
  return {{"config_groups", groups},
          {"format", "pack-quantized"},
          {"quant_method", "compressed-tensors"},
          {"quantization_status", "compressed"},
          {"global_compression_ratio", nullptr},
          {"ignore", ignore},
          {"kv_cache_scheme", nullptr},
          {"sparsity_config", json::object()},
          {"transform_config", json::object()},
          {"version", "0.12.2"}};
}

}  // namespace

std::vector<std::string> unquantized_linears(const Checkpoint& ck, const std::function<bool(const std::string&)>& quantized) {
  const std::string suffix = ".weight";
  std::vector<std::string> out;
  bool has_lm_head = false;
  for (const auto& name : ck.tensor_names()) {
    has_lm_head = has_lm_head || name.rfind("lm_head.", 0) == 0;
    if (ck.at(name).info->shape.size() != 2 || name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string p = name.substr(0, name.size() - suffix.size());
    if (!quantized(p) && !is_embedding(p)) out.push_back(p);
  }
  bool causal_lm = false;
  if (auto a = ck.config().find("architectures"); a != ck.config().end() && a->is_array())
    for (const auto& x : *a)
      causal_lm = causal_lm || (x.is_string() && x.get<std::string>().find("ForCausalLM") != std::string::npos);
  if (!has_lm_head && causal_lm) out.push_back("lm_head");
  std::sort(out.begin(), out.end());
  return out;
}

TargetConfig target_config(TargetFormat t, const json& src_config, const json& src_quant, const QuantSummary& s) {
  TargetConfig out;
  out.config = src_config.is_object() ? src_config : json::object();
  json q;
  switch (t) {
    case TargetFormat::GptqV1: q = gptq_family_dict(src_quant, s, "gptq"); break;
    case TargetFormat::GptqV2: q = gptq_family_dict(src_quant, s, "gptq_v2"); break;
    case TargetFormat::Marlin: q = gptq_family_dict(src_quant, s, "marlin"); break;
    case TargetFormat::Marlin24: q = gptq_family_dict(src_quant, s, "marlin_24"); break;
    case TargetFormat::Awq: {
      // transformers' AWQ loader replaces every Linear not named here.
      std::vector<std::string> not_converted = s.dequantized;
      not_converted.insert(not_converted.end(), s.plain_linears.begin(), s.plain_linears.end());
      std::sort(not_converted.begin(), not_converted.end());
      not_converted.erase(std::unique(not_converted.begin(), not_converted.end()), not_converted.end());
      q = {{"quant_method", "awq"},
           {"zero_point", true},
           {"group_size", s.group_size},
           {"bits", s.bits},
           {"version", "gemm"},
           {"modules_to_not_convert", not_converted.empty() ? json(nullptr) : json(not_converted)}};
      break;
    }
    case TargetFormat::CompressedTensors: q = compressed_tensors_dict(s); break;
  }
  out.config["quantization_config"] = q;
  if (t == TargetFormat::GptqV1 || t == TargetFormat::GptqV2 || t == TargetFormat::Marlin || t == TargetFormat::Marlin24)
    out.quantize_config = q;
  return out;
}

}  // namespace marlinc
