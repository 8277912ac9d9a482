#include "quantizer/quantize_checkpoint.h"

#include <chrono>
#include <map>
#include <set>

#include "checkpoint/checkpoint.h"
#include "checkpoint/convert_dtype.h"
#include "checkpoint/error.h"
#include "checkpoint/format.h"
#include "checkpoint/half.h"
#include "checkpoint/writer.h"
#include "quantizer/rtn.h"

namespace marlinc {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Why a 2-D `<p>.weight` is not quantized ("" = quantize it).
std::string skip_reason(const std::string& prefix, const TensorInfo& t, const QuantizeOptions& o,
                        const std::set<std::string>& expert_parents) {
  if (t.shape.size() != 2) return "not a 2-D weight";
  if (t.dtype != DType::F16 && t.dtype != DType::BF16 && t.dtype != DType::F32) return "dtype is not F16/BF16/F32";
  // Embeddings are nn.Embedding, not linear layers: no loader reads them quantized.
  if (is_embedding(prefix))
    return "embeddings stay unquantized (they are not linear layers)";
  if (prefix.find("lm_head") != std::string::npos && !o.include_lm_head)
    return "lm_head stays unquantized (--include-lm-head)";
  if (is_moe_router(prefix, expert_parents))
    return "mixture-of-experts routers stay unquantized (loaders build them in 16 bits)";
  for (const auto& pat : o.skip)
    if (prefix.find(pat) != std::string::npos) return "matches --skip " + pat;
  return "";
}

}  // namespace

nlohmann::json QuantizeReport::to_json() const {
  nlohmann::json layers_j = nlohmann::json::array();
  for (const auto& l : layers) {
    nlohmann::json j = {{"name", l.name}, {"n", l.n}, {"k", l.k}, {"rel_weight_err", l.rel_weight_err}, {"seconds", l.seconds}};
    if (l.loss >= 0) j["gptq_loss"] = l.loss;
    if (l.damp >= 0) j["damp"] = l.damp;
    layers_j.push_back(j);
  }
  nlohmann::json skipped_j = nlohmann::json::array();
  for (const auto& [name, why] : skipped) skipped_j.push_back({{"name", name}, {"why", why}});
  return {{"input", input}, {"output", output}, {"target", target}, {"method", method}, {"layers", layers_j},
          {"skipped", skipped_j}, {"passthrough_tensors", passthrough_tensors}, {"bytes_in", bytes_in},
          {"bytes_out", bytes_out}, {"seconds", seconds}, {"notes", notes}};
}

QuantPlan plan_quantization(const Checkpoint& ck, const QuantizeOptions& o, QuantizeReport& rep) {
  // Group sizes the target's kernels and loaders take (formats.md §1.9, §3.6); 0 or < -1 never.
  const std::string g = std::to_string(o.group_size);
  if (o.group_size == 0 || o.group_size < -1) bad_usage("--group " + g + ": expected -1 (per channel) or a positive size");
  if (o.to == TargetFormat::Marlin && o.group_size != -1 && o.group_size != 32 && o.group_size != 64 && o.group_size != 128)
    bad_usage("--group " + g + ": Marlin kernels take -1, 32, 64 or 128");
  if (o.to == TargetFormat::Marlin24 && o.group_size != -1 && o.group_size != 128)
    bad_usage("--group " + g + ": Sparse-Marlin kernels take -1 or 128");
  FormatInfo fi = detect_format(ck);
  if (fi.format != Format::Plain)
    bad_usage(ck.source().string() + ": already quantized (" + format_name(fi.format) +
              "); use `marlinc convert` to change its format");
  if (o.tp < 1) bad_usage("--tp " + std::to_string(o.tp) + ": the tensor-parallel size is at least 1");
  const TpHeads heads = tp_heads(ck.config());
  const std::set<std::string> expert_parents = moe_expert_parents(ck.tensor_names());
  QuantPlan P;
  for (const auto& name : ck.tensor_names()) {
    auto ref = ck.at(name);
    const TensorInfo& t = *ref.info;
    if (ends_with(name, ".weight")) {
      const std::string prefix = name.substr(0, name.size() - 7);
      std::string why = skip_reason(prefix, t, o, expert_parents);
      if (why.empty() && t.shape.size() == 2) {
        ModuleDesc d;
        d.prefix = prefix; d.format = target_format(o.to); d.n = t.shape[0]; d.k = t.shape[1];
        d.bits = o.bits; d.group_size = o.group_size == -1 ? -1 : o.group_size;
        d.groups = o.group_size == -1 ? 1 : (d.k % o.group_size == 0 ? d.k / o.group_size : 0);
        d.scale_type = t.dtype == DType::BF16 ? ScaleType::BF16 : ScaleType::F16;
        d.act_order = o.act_order;
        why = d.groups == 0 ? "group size " + std::to_string(o.group_size) + " does not divide k = " + std::to_string(d.k)
                            : target_rule(o.to, d);
        if (why.empty()) why = target_rule_tp(o.to, d, o.tp, heads);
        if (why.empty()) {
          P.job_of_tensor[name] = P.jobs.size();
          for (auto& s : plan_module(o.to, d, ModuleLayout{false, o.act_order})) P.specs.push_back(s);
          P.jobs.push_back({prefix, &t, d});
          continue;
        }
      }
      if (t.shape.size() == 2) rep.skipped.emplace_back(prefix, why);
    }
    P.specs.push_back({name, t.dtype, t.shape});
    ++rep.passthrough_tensors;
  }
  if (P.jobs.empty()) {
    std::string why;
    for (const auto& [name, reason] : rep.skipped) why += "; " + name + ": " + reason;
    bad_usage(ck.source().string() + ": no linear layer can be quantized to " + target_name(o.to) + why);
  }
  // marlin_24 configs hold no skip list and vLLM applies Sparse-Marlin to every linear layer, so a decoder
  // linear left in fp16 would not load (lm_head is outside the scheme).
  if (o.to == TargetFormat::Marlin24) {
    std::string left;
    for (const auto& [name, reason] : rep.skipped)
      if (name.find("lm_head") == std::string::npos && !is_embedding(name))
        left += (left.empty() ? "" : "; ") + name + " (" + reason + ")";
    if (!left.empty())
      bad_usage("--format marlin24: marlin_24 checkpoints cannot keep linear layers unquantized (their loaders apply "
                "Sparse-Marlin to every one and read no skip list), but these would stay fp16: " + left);
  }
  return P;
}

bool grid_bf16(const QuantizeOptions& o, const QuantJob& job) {
  return job.desc.scale_type == ScaleType::BF16 && o.to != TargetFormat::Marlin24;
}

QuantizedLinear write_quantized(CheckpointWriter& w, const QuantizeOptions& o, const QuantJob& job, QuantizedLinear q,
                                QuantizeReport& rep) {
  q.name = job.prefix;
  // The codes were chosen for these scales: re-encoding them here would leave codes that are not the
  // nearest for the stored scale (before the bf16 grid: 3% more weight error at 8 bits).
  if ((q.scale_type == ScaleType::BF16) != grid_bf16(o, job))
    fail(ErrorKind::Internal, job.prefix + ": quantized with " +
                                  (q.scale_type == ScaleType::BF16 ? "bf16" : "fp16") + " scales for an output that stores " +
                                  (grid_bf16(o, job) ? "bf16" : "fp16"));
  for (const auto& p : write_module(o.to, q, ModuleLayout{false, o.act_order})) {
    w.write(p.spec.name, p.bytes);
    rep.bytes_out += p.bytes.size();
  }
  return q;
}

void finish_output(CheckpointWriter& w, const Checkpoint& ck, const QuantizeOptions& o, const QuantPlan& P, QuantizeReport& rep,
                   const nlohmann::json& extra_quant) {
  QuantSummary s;
  s.bits = o.bits; s.group_size = o.group_size; s.sym = true; s.desc_act = o.act_order;
  s.weight_act_order = o.calibration_act_order && !o.act_order;
  s.act_order_marlin = o.to == TargetFormat::Marlin && o.act_order;  // g_idx + perm: marlinc's extension
  // Linears left unquantized (lm_head, --skip, layers the target cannot hold): the config names them
  // so loaders do not expect quantized tensors there.
  s.plain_linears = unquantized_linears(ck, [&](const std::string& p) { return P.job_of_tensor.count(p + ".weight") > 0; });
  s.lm_head_quantized = P.job_of_tensor.count("lm_head.weight") > 0;
  TargetConfig cfg = target_config(o.to, ck.config(), nlohmann::json::object(), s);
  if (!extra_quant.empty()) {
    // An object both have (the "marlinc" record and the act-order extension's description) is merged, not replaced.
    auto put = [&](nlohmann::json& qc) {
      for (auto it = extra_quant.begin(); it != extra_quant.end(); ++it)
        if (qc.contains(it.key()) && qc[it.key()].is_object() && it.value().is_object())
          qc[it.key()].update(it.value());
        else
          qc[it.key()] = it.value();
    };
    put(cfg.config["quantization_config"]);
    if (cfg.quantize_config) put(*cfg.quantize_config);
  }
  w.add_file("config.json", cfg.config.dump(2) + "\n");
  if (cfg.quantize_config) w.add_file("quantize_config.json", cfg.quantize_config->dump(2) + "\n");
  if (std::filesystem::is_directory(ck.dir())) copy_non_tensor_files(ck.dir(), w);
  w.commit();
  if (const std::string n = leftover_note(w); !n.empty()) rep.notes.push_back(n);
}

QuantizeReport quantize_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                                   const QuantizeOptions& o, const LayerDone& on_layer) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.method != "rtn")
    bad_usage("--method " + o.method + ": quantize_checkpoint runs rtn; gptq needs calibration (calib::gptq_quantize_checkpoint)");
  if (o.to == TargetFormat::Marlin24)
    bad_usage("--format marlin24 needs 2:4 pruning (--method gptq --sparsity 2:4); RTN cannot choose a mask");
  Checkpoint ck = Checkpoint::open(in);
  check_output_not_input(ck.dir(), out);
  QuantizeReport rep;
  rep.input = ck.source().string();
  rep.output = out.string();
  rep.target = target_name(o.to);
  rep.method = o.method;
  const QuantPlan P = plan_quantization(ck, o, rep);

  WriterOptions wo;
  wo.max_shard_bytes = o.max_shard_bytes;
  wo.overwrite = o.overwrite;
  CheckpointWriter w(out, P.specs, wo);
  for (const auto& name : ck.tensor_names()) {
    std::span<const uint8_t> bytes = ck.data(name);
    rep.bytes_in += bytes.size();
    auto it = P.job_of_tensor.find(name);
    if (it == P.job_of_tensor.end()) {
      w.write(name, bytes);
      rep.bytes_out += bytes.size();
      continue;
    }
    const QuantJob& job = P.jobs[it->second];
    const auto t1 = std::chrono::steady_clock::now();
    std::vector<float> W = to_float(bytes, job.info->dtype);  // [n, k]
    RtnOptions ro;
    ro.bits = o.bits; ro.group_size = o.group_size; ro.clip = o.clip; ro.name = job.prefix;
    ro.bf16_scales = grid_bf16(o, job);
    RtnStats st;
    write_quantized(w, o, job, rtn_quantize(W.data(), job.desc.n, job.desc.k, ro, &st), rep);
    QuantizedLayerReport lr{job.prefix, job.desc.n, job.desc.k, st.rel_weight_err,
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count()};
    rep.layers.push_back(lr);
    if (on_layer) on_layer(lr, rep.layers.size() - 1, P.jobs.size());
  }
  finish_output(w, ck, o, P, rep);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace marlinc
