// `marlinc inspect PATH [--json]`: every tensor (one line each, fixed columns), the detected format and
// its parameters, totals, and per quantized layer whether the Marlin kernels accept it.
#include <cstdio>
#include <iostream>
#include <set>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/format.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "packer/adapters.h"

namespace marlinc::cli {

namespace {

using ojson = nlohmann::ordered_json;

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

struct LayerRow {
  std::string name;
  int64_t k, n;
  int bits, group;
  MarlinRuleCheck check;
  TpShard part;  // one rank's part at --tp (the whole layer at 1)
};

// The Marlin rules on the layer, then (tp > 1) on one tensor-parallel rank's part of it (packer's
// target_rule_tp). A part that passes reports its own caveats (e.g. the IST kernel's n % 256).
void check_layer(LayerRow& l, bool sparse, int tp, const TpHeads& heads) {
  l.check = marlin_compatible(l.k, l.n, l.group, l.bits, sparse);
  l.part = tp_shard(l.name, l.k, l.n, tp, heads);
  if (!l.check.ok || tp <= 1) return;
  ModuleDesc d;
  d.prefix = l.name, d.k = l.k, d.n = l.n, d.bits = l.bits;
  d.group_size = l.group == l.k ? -1 : l.group;  // one group over all of k is per-channel (§9.16)
  d.groups = d.group_size > 0 ? l.k / d.group_size : 1;
  d.sparse24 = sparse;
  const std::string rule = target_rule_tp(sparse ? TargetFormat::Marlin24 : TargetFormat::Marlin, d, tp, heads);
  if (!rule.empty()) {
    l.check = {false, rule};
    return;
  }
  l.check = marlin_compatible(l.part.k, l.part.n, d.group_size, l.bits, sparse);
  l.check.rule = "tensor parallel " + std::to_string(tp) + ": part [" + std::to_string(l.part.k) + " x " +
                 std::to_string(l.part.n) + "]" + (l.part.replicated ? " (k/v heads replicated)" : "") +
                 (l.check.rule.empty() ? "" : "; " + l.check.rule);
}

// Linear weights of a plain checkpoint that a quantizer would take (2-D "*.weight" inside decoder
// blocks, not mixture-of-experts routers), checked against the kernel rules for 4-bit group 128: what
// quantizing would run into.
std::vector<LayerRow> candidate_layers(const Checkpoint& ck, int tp, const TpHeads& heads) {
  std::vector<LayerRow> rows;
  const std::set<std::string> expert_parents = moe_expert_parents(ck.tensor_names());
  for (const std::string& name : ck.tensor_names()) {
    const TensorInfo& t = *ck.at(name).info;
    if (t.shape.size() != 2 || name.size() < 7 || name.compare(name.size() - 7, 7, ".weight") != 0) continue;
    if (name.find("layers.") == std::string::npos) continue;
    if (is_moe_router(name.substr(0, name.size() - 7), expert_parents)) continue;
    const int64_t n = t.shape[0], k = t.shape[1];  // nn.Linear stores [out, in]
    rows.push_back({name.substr(0, name.size() - 7), k, n, 4, 128, {}, {}});
    check_layer(rows.back(), false, tp, heads);
  }
  return rows;
}

void run_inspect(const std::string& path, bool as_json, int tp) {
  Checkpoint ck = Checkpoint::open(path);
  const TpHeads heads = tp_heads(ck.config());
  FormatInfo fi = detect_format(ck);
  std::vector<QuantizedModuleShape> mods = quantized_module_shapes(ck, fi);
  const bool sparse = fi.format == Format::Marlin24 || fi.format == Format::CompressedTensorsMarlin24;

  std::set<std::string> packed;  // tensors that belong to a quantized module
  std::vector<LayerRow> layers;
  uint64_t q_bytes = 0, q_weights = 0;
  for (const auto& m : mods) {
    packed.insert(m.tensors.begin(), m.tensors.end());
    q_bytes += m.stored_bytes;
    q_weights += uint64_t(m.k) * uint64_t(m.n);
    layers.push_back({m.prefix.empty() ? "<root>" : m.prefix, m.k, m.n, m.bits, m.group_size, {}, {}});
    check_layer(layers.back(), sparse, tp, heads);
  }
  const bool candidates = fi.format == Format::Plain;
  if (candidates) layers = candidate_layers(ck, tp, heads);

  uint64_t total_bytes = 0, params = q_weights;
  size_t name_w = 6, shape_w = 5, file_w = 4, dtype_w = 5;
  for (const std::string& n : ck.tensor_names()) {
    auto r = ck.at(n);
    total_bytes += r.info->nbytes();
    if (!packed.count(n)) params += uint64_t(r.info->numel());
    name_w = std::max(name_w, n.size());
    shape_w = std::max(shape_w, shape_str(r.info->shape).size());
    file_w = std::max(file_w, r.file->path().filename().string().size());
    dtype_w = std::max(dtype_w, dtype_name(r.info->dtype).size());
  }
  const double bpw = q_weights ? 8.0 * double(q_bytes) / double(q_weights) : 0.0;
  int n_ok = 0;
  for (const auto& l : layers) n_ok += l.check.ok;

  if (as_json) {
    ojson j;
    j["path"] = path;
    j["files"] = ojson::array();
    for (const auto& f : ck.files()) j["files"].push_back(f.path().filename().string());
    j["tensors"] = ojson::array();
    for (const std::string& n : ck.tensor_names()) {
      auto r = ck.at(n);
      j["tensors"].push_back({{"name", n}, {"dtype", std::string(dtype_name(r.info->dtype))}, {"shape", r.info->shape},
                              {"bytes", r.info->nbytes()}, {"file", r.file->path().filename().string()}});
    }
    j["format"] = {{"name", format_name(fi.format)}, {"config_label", fi.label_in_config}, {"bits", fi.bits},
                   {"group_size", fi.group_size}, {"sym", fi.sym}, {"desc_act", fi.desc_act}, {"notes", fi.notes}};
    j["totals"] = {{"tensors", ck.tensor_names().size()}, {"parameters", params}, {"bytes", total_bytes},
                   {"quantized_layers", mods.size()}, {"quantized_bytes", q_bytes}, {"quantized_weights", q_weights},
                   {"bits_per_weight", bpw}};
    j["tp"] = tp;
    j[candidates ? "candidate_layers" : "layers"] = ojson::array();
    for (const auto& l : layers) {
      ojson row = {{"name", l.name}, {"k", l.k}, {"n", l.n}, {"bits", l.bits}, {"group_size", l.group},
                   {"marlin_ok", l.check.ok}, {"rule", l.check.rule}};
      if (tp > 1 && l.part.error.empty())
        row["tp_part"] = {{"k", l.part.k}, {"n", l.part.n}, {"split", tp_split_name(l.part.split)},
                          {"replicated", l.part.replicated}};
      j[candidates ? "candidate_layers" : "layers"].push_back(row);
    }
    std::cout << json_text(j) << "\n";
    return;
  }

  std::cout << path << ": " << ck.tensor_names().size() << " tensors in " << ck.files().size() << " file(s)\n";
  std::printf("%-*s  %-*s  %-*s  %12s  %s\n", int(name_w), "TENSOR", int(dtype_w), "DTYPE", int(shape_w), "SHAPE",
              "BYTES", "FILE");
  for (const std::string& n : ck.tensor_names()) {
    auto r = ck.at(n);
    std::printf("%-*s  %-*s  %-*s  %12llu  %s\n", int(name_w), n.c_str(), int(dtype_w),
                std::string(dtype_name(r.info->dtype)).c_str(), int(shape_w), shape_str(r.info->shape).c_str(),
                (unsigned long long)r.info->nbytes(), r.file->path().filename().string().c_str());
  }
  std::printf("\nformat: %s", format_name(fi.format).c_str());
  if (!fi.label_in_config.empty()) std::printf(" (config: %s)", fi.label_in_config.c_str());
  if (fi.format != Format::Plain && fi.format != Format::Unknown)
    std::printf("  bits %d  group_size %d  sym %s  desc_act %s", fi.bits, fi.group_size, fi.sym ? "true" : "false",
                fi.desc_act ? "true" : "false");
  std::printf("\n");
  for (const auto& note : fi.notes) std::printf("note: %s\n", note.c_str());
  std::printf("totals: %zu tensors, %llu parameters, %llu bytes", ck.tensor_names().size(), (unsigned long long)params,
              (unsigned long long)total_bytes);
  if (!mods.empty())
    std::printf(", %zu quantized layers, %.3f bits per weight (packed weights, scales, zeros, g_idx / k*n)",
                mods.size(), bpw);
  std::printf("\n");
  if (layers.empty()) return;
  size_t lw = 5;
  for (const auto& l : layers) lw = std::max(lw, l.name.size());
  std::printf("\n%s\n", candidates ? "candidate layers (Marlin rules for 4-bit, group 128):"
                                   : "quantized layers:");
  std::printf("%-*s  %7s  %7s  %4s  %5s  %-6s  %s\n", int(lw), "LAYER", "K", "N", "BITS", "GROUP", "MARLIN", "RULE");
  for (const auto& l : layers)
    std::printf("%-*s  %7lld  %7lld  %4d  %5d  %-6s  %s\n", int(lw), l.name.c_str(), (long long)l.k, (long long)l.n,
                l.bits, l.group, l.check.ok ? "ok" : "FAIL", l.check.rule.c_str());
  std::printf("marlin: %d of %zu layers compatible%s\n", n_ok, layers.size(),
              tp > 1 ? (" at tensor parallel " + std::to_string(tp)).c_str() : "");
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "List tensors, detected format and Marlin compatibility");
  static std::string path;
  static bool as_json = false;
  static int tp = 1;
  cmd->add_option("PATH", path, "safetensors file, or checkpoint directory (single or sharded)")->required();
  cmd->add_flag("--json", as_json, "print the report as JSON on stdout");
  cmd->add_option("--tp", tp,
                  "check the Marlin rules on one GPU's part of each layer at this tensor-parallel size (vLLM's "
                  "split: o/down projections along k, the rest along n; default 1)")
      ->check(CLI::Range(1, 65536));
  cmd->footer("Exit codes: 0 success, 1 bad data (the error names file, tensor and rule) or an unreadable file, 2 bad "
              "usage (options, paths that do not exist), 3 internal error.");
  cmd->callback([] {
    run_inspect(path, as_json, tp);
    std::fflush(stdout);
    set_status(0);
  });
}

}  // namespace marlinc::cli
