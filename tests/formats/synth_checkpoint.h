// Synthetic quantized checkpoints for the format/convert tests (also used by tests/cli/test_convert.cpp
// and bench/bench_convert.cpp): a small Llama-like model whose linear layers are random QuantizedLinear
// values written with the packer's GPTQ / AWQ / compressed-tensors layout functions (not with the
// adapters under test), plus unquantized tensors (embeddings, norms, lm_head, biases), config.json,
// quantize_config.json and tokenizer files. Deterministic for a given seed.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/half.h"
#include "checkpoint/writer.h"
#include "packer/gptq.h"
#include "packer/quantized_linear.h"

namespace marlinc::synth {

struct Layer {
  std::string prefix;
  int64_t k, n;
  bool bias = false;
};

enum class Kind { GptqV1, GptqV2, Awq, CompressedTensors };

struct Options {
  Kind kind = Kind::GptqV1;
  std::string config_format;  // quantize_config checkpoint_format label; "" = natural for kind
  int bits = 4;
  int group = 128;            // -1 = per-channel
  bool sym = true;
  bool act_order = false;
  ScaleType scale_type = ScaleType::F16;
  uint64_t shard_bytes = 0;   // 0 = one file
  uint64_t seed = 1;
  int64_t hidden = 256, vocab = 96;
  std::vector<Layer> layers;  // empty = default_layers(hidden)
  bool write_config_files = true;
};

// Two decoder blocks: q/k/v/o (k_proj narrow: n = 64), gate/up/down, q_proj with bias.
inline std::vector<Layer> default_layers(int64_t h = 256) {
  std::vector<Layer> L;
  for (int b = 0; b < 2; ++b) {
    const std::string p = "model.layers." + std::to_string(b) + ".";
    L.push_back({p + "self_attn.q_proj", h, h, true});
    L.push_back({p + "self_attn.k_proj", h, 64, true});
    L.push_back({p + "self_attn.v_proj", h, 64, false});
    L.push_back({p + "self_attn.o_proj", h, h, false});
    L.push_back({p + "mlp.gate_proj", h, 2 * h, false});
    L.push_back({p + "mlp.up_proj", h, 2 * h, false});
    L.push_back({p + "mlp.down_proj", 2 * h, h, false});
  }
  return L;
}

inline uint16_t to_scale(float v, ScaleType st) { return st == ScaleType::BF16 ? float_to_bf16(v) : float_to_half(v); }

// A random valid layer: codes uniform, scales in [0.002, 0.05], zeros 1..15 (asym; 1.. so v1 can hold
// them), act-order g_idx from a random permutation (g_idx[r] = position of r in processing order / g).
inline QuantizedLinear random_layer(const std::string& name, int64_t k, int64_t n, const Options& o, std::mt19937_64& rng) {
  QuantizedLinear q;
  q.name = name;
  q.k = k;
  q.n = n;
  q.bits = o.bits;
  q.group_size = o.group > 0 && o.group < k ? o.group : -1;
  q.sym = o.sym;
  q.scale_type = o.scale_type;
  const int maxq = (1 << o.bits) - 1;
  q.codes.resize(size_t(k * n));
  for (auto& c : q.codes) c = uint8_t(rng() % uint64_t(maxq + 1));
  const int64_t G = q.groups();
  std::uniform_real_distribution<float> us(0.002f, 0.05f);
  q.scales.resize(size_t(G * n));
  for (auto& s : q.scales) s = to_scale(us(rng), o.scale_type);
  if (!o.sym) {
    q.zeros.resize(size_t(G * n));
    for (auto& z : q.zeros) z = uint8_t(1 + rng() % uint64_t(maxq));
  }
  if (o.act_order && q.group_size > 0) {
    std::vector<int32_t> order(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) order[size_t(i)] = int32_t(i);
    std::shuffle(order.begin(), order.end(), rng);  // order[pos] = row processed at pos
    q.g_idx.resize(size_t(k));
    for (int64_t pos = 0; pos < k; ++pos) q.g_idx[size_t(order[size_t(pos)])] = int32_t(pos / q.group_size);
  }
  q.validate();
  return q;
}

struct Tensor {
  TensorSpec spec;
  std::vector<uint8_t> bytes;
};
template <class T>
Tensor tensor(std::string name, DType dt, std::vector<int64_t> shape, const std::vector<T>& v) {
  Tensor t{{std::move(name), dt, std::move(shape)}, std::vector<uint8_t>(v.size() * sizeof(T))};
  if (!v.empty()) std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

// The module's tensors in the source format, packed directly with packer/gptq.h.
inline std::vector<Tensor> pack_source(const QuantizedLinear& q, const Options& o) {
  const int64_t G = q.groups(), k = q.k, n = q.n;
  const int b = q.bits, pf = 32 / b;
  const DType sd = q.scale_type == ScaleType::BF16 ? DType::BF16 : DType::F16;
  std::vector<uint8_t> z = q.zeros;
  if (q.sym) z.assign(size_t(G * n), uint8_t(1 << (b - 1)));
  std::vector<Tensor> t;
  const std::string& p = q.name;
  switch (o.kind) {
    case Kind::GptqV1:
    case Kind::GptqV2: {
      const auto zf = o.kind == Kind::GptqV2 ? gptq::ZeroFormat::V2 : gptq::ZeroFormat::V1;
      t.push_back(tensor(p + ".qweight", DType::I32, {k / pf, n}, gptq::pack_qweight(q.codes.data(), k, n, b)));
      t.push_back(tensor(p + ".qzeros", DType::I32, {G, n / pf}, gptq::pack_qzeros(z.data(), G, n, b, zf)));
      t.push_back(tensor(p + ".scales", sd, {G, n}, q.scales));
      t.push_back(tensor(p + ".g_idx", DType::I32, {k}, q.g_idx.empty() ? gptq::trivial_g_idx(k, q.group_size) : q.g_idx));
      break;
    }
    case Kind::Awq:
      t.push_back(tensor(p + ".qweight", DType::I32, {k, n / pf}, awq::pack_qweight(q.codes.data(), k, n, b)));
      t.push_back(tensor(p + ".qzeros", DType::I32, {G, n / pf}, awq::pack_qzeros(z.data(), G, n, b)));
      t.push_back(tensor(p + ".scales", sd, {G, n}, q.scales));
      break;
    case Kind::CompressedTensors: {
      t.push_back(tensor(p + ".weight_packed", DType::I32, {n, (k + pf - 1) / pf}, ct::pack_weight(q.codes.data(), k, n, b)));
      std::vector<uint16_t> st(size_t(n * G));  // [n, G]
      for (int64_t g = 0; g < G; ++g)
        for (int64_t c = 0; c < n; ++c) st[size_t(c * G + g)] = q.scales[size_t(g * n + c)];
      t.push_back(tensor(p + ".weight_scale", sd, {n, G}, st));
      t.push_back(tensor(p + ".weight_shape", DType::I64, {2}, std::vector<int64_t>{n, k}));
      if (!q.sym)
        t.push_back(tensor(p + ".weight_zero_point", DType::I32, {(n + pf - 1) / pf, G}, ct::pack_zero_point(z.data(), G, n, b)));
      if (!q.g_idx.empty()) t.push_back(tensor(p + ".weight_g_idx", DType::I32, {k}, q.g_idx));
      break;
    }
  }
  return t;
}

inline std::vector<uint16_t> random_half(size_t count, std::mt19937_64& rng, ScaleType st) {
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<uint16_t> v(count);
  for (auto& x : v) x = to_scale(nd(rng), st);
  return v;
}

inline void write_text(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

struct Written {
  std::map<std::string, QuantizedLinear> layers;  // prefix -> the layer as generated
};

// Writes the checkpoint to `dir` (must not exist or be empty) and returns the generated layers.
inline Written write_checkpoint(const std::filesystem::path& dir, Options o) {
  if (o.layers.empty()) o.layers = default_layers(o.hidden);
  std::mt19937_64 rng(o.seed);
  Written w;
  std::vector<Tensor> all;
  const DType md = o.scale_type == ScaleType::BF16 ? DType::BF16 : DType::F16;
  all.push_back(tensor("model.embed_tokens.weight", md, {o.vocab, o.hidden}, random_half(size_t(o.vocab * o.hidden), rng, o.scale_type)));
  all.push_back(tensor("model.norm.weight", md, {o.hidden}, random_half(size_t(o.hidden), rng, o.scale_type)));
  all.push_back(tensor("lm_head.weight", md, {o.vocab, o.hidden}, random_half(size_t(o.vocab * o.hidden), rng, o.scale_type)));
  std::set<std::string> norms;
  for (const auto& L : o.layers) {
    QuantizedLinear q = random_layer(L.prefix, L.k, L.n, o, rng);
    for (auto& t : pack_source(q, o)) all.push_back(std::move(t));
    if (L.bias) all.push_back(tensor(L.prefix + ".bias", md, {L.n}, random_half(size_t(L.n), rng, o.scale_type)));
    const std::string block = L.prefix.substr(0, L.prefix.find(".", L.prefix.find("layers.") + 7));
    if (norms.insert(block).second)
      all.push_back(tensor(block + ".input_layernorm.weight", md, {o.hidden}, random_half(size_t(o.hidden), rng, o.scale_type)));
    w.layers.emplace(L.prefix, std::move(q));
  }
  std::vector<TensorSpec> plan;
  for (const auto& t : all) plan.push_back(t.spec);
  CheckpointWriter cw(dir, plan, WriterOptions{o.shard_bytes, "model", true});
  for (const auto& t : all) cw.write(t.spec.name, t.bytes);

  if (o.write_config_files) {
    nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"},
                          {"hidden_size", o.hidden}, {"vocab_size", o.vocab},
                          {"torch_dtype", o.scale_type == ScaleType::BF16 ? "bfloat16" : "float16"}};
    nlohmann::json qc;
    std::string label = o.config_format;
    switch (o.kind) {
      case Kind::GptqV1:
      case Kind::GptqV2:
        if (label.empty()) label = o.kind == Kind::GptqV2 ? "gptq_v2" : "gptq";
        qc = {{"bits", o.bits}, {"group_size", o.group}, {"desc_act", o.act_order}, {"sym", o.sym},
              {"quant_method", "gptq"}, {"checkpoint_format", label}, {"damp_percent", 0.01},
              {"static_groups", false}, {"true_sequential", true}};
        cw.add_file("quantize_config.json", qc.dump(2));
        cfg["quantization_config"] = qc;
        break;
      case Kind::Awq:
        cfg["quantization_config"] = {{"quant_method", "awq"}, {"zero_point", true}, {"group_size", o.group},
                                      {"bits", o.bits}, {"version", "gemm"}};
        break;
      case Kind::CompressedTensors:
        cfg["quantization_config"] = {
            {"quant_method", "compressed-tensors"}, {"format", "pack-quantized"},
            {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", {{"num_bits", o.bits}, {"type", "int"},
                {"symmetric", o.sym}, {"group_size", o.group > 0 ? nlohmann::json(o.group) : nlohmann::json(nullptr)},
                {"strategy", o.group > 0 ? "group" : "channel"},
                {"actorder", o.act_order ? nlohmann::json("group") : nlohmann::json(nullptr)}}}}}}},
            {"ignore", {"lm_head"}}};
        break;
    }
    cw.add_file("config.json", cfg.dump(2));
    cw.add_file("tokenizer.json", "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}\n");
    cw.add_file("tokenizer_config.json", "{\"bos_token\": \"<s>\"}\n");
    cw.add_file("generation_config.json", "{\"do_sample\": false}\n");
  }
  cw.commit();
  return w;
}

}  // namespace marlinc::synth
