#include "quantizer/calib/llama.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "checkpoint/convert_dtype.h"
#include "checkpoint/error.h"
#include "checkpoint/half.h"

namespace marlinc::calib {

using nlohmann::json;

const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> k = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                             "Qwen3ForCausalLM", "GemmaForCausalLM",   "Gemma2ForCausalLM",
                                             "Gemma3ForCausalLM", "Phi3ForCausalLM",   "GraniteForCausalLM",
                                             "SmolLM3ForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM",
                                             "Qwen3MoeForCausalLM"};
  return k;
}

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Dimensions above this are refused: no model comes near, and products of two of them (heads x head_dim,
// rows x columns) then stay far from int64 overflow.
constexpr int64_t kMaxDim = int64_t(1) << 24;

bool present(const json& o, const char* key) { return o.contains(key) && !o[key].is_null(); }

int64_t req_int(const json& cfg, const char* key, const std::string& label) {
  if (!cfg.contains(key) || !cfg[key].is_number_integer() || cfg[key].get<int64_t>() <= 0 ||
      cfg[key].get<int64_t>() > kMaxDim)
    bad_data(label + ": '" + key + "' must be a positive integer up to 2^24");
  return cfg[key].get<int64_t>();
}

// Optional keys: absent or null gives the default; any other type, or a value out of range, is an
// error naming the key (nlohmann's own type errors would not say which file or key).
int64_t opt_int(const json& o, const char* key, int64_t dflt, int64_t lo, const std::string& label) {
  if (!present(o, key)) return dflt;
  if (!o[key].is_number_integer() || o[key].get<int64_t>() < lo)
    bad_data(label + ": '" + key + "' must be an integer >= " + std::to_string(lo));
  return o[key].get<int64_t>();
}
double opt_positive(const json& o, const char* key, double dflt, const std::string& label) {
  if (!present(o, key)) return dflt;
  if (!o[key].is_number() || !std::isfinite(o[key].get<double>()) || o[key].get<double>() <= 0)
    bad_data(label + ": '" + key + "' must be a positive finite number");
  return o[key].get<double>();
}
bool opt_bool(const json& o, const char* key, bool dflt, const std::string& label) {
  if (!present(o, key)) return dflt;
  if (!o[key].is_boolean()) bad_data(label + ": '" + key + "' must be true or false");
  return o[key].get<bool>();
}
std::string opt_string(const json& o, const char* key, const std::string& dflt, const std::string& label) {
  if (!present(o, key)) return dflt;
  if (!o[key].is_string()) bad_data(label + ": '" + key + "' must be a string");
  return o[key].get<std::string>();
}

std::vector<double> factor_list(const json& rp, const char* key, int64_t count, const std::string& label) {
  if (!present(rp, key) || !rp[key].is_array() || static_cast<int64_t>(rp[key].size()) != count)
    bad_data(label + ": longrope '" + key + "' must be a list of rotary_dim / 2 = " + std::to_string(count) + " numbers");
  std::vector<double> v;
  for (const json& x : rp[key]) {
    if (!x.is_number() || !std::isfinite(x.get<double>()) || x.get<double>() <= 0)
      bad_data(label + ": longrope '" + key + "' holds a value that is not a positive finite number");
    v.push_back(x.get<double>());
  }
  return v;
}

// One RoPE parameter set: `rp` is rope_scaling (transformers 4) or a rope_parameters object
// (transformers 5, which also holds rope_theta there); `theta` already holds the top-level or default base.
// c gives the family and sizes longrope needs (Phi-3 only).
void parse_rope(const json* rp, double& theta, RopeScaling& s, const LlamaConfig& c, const json& cfg,
                const std::string& label) {
  if (!rp) return;
  if (present(*rp, "rope_theta")) theta = opt_positive(*rp, "rope_theta", theta, label);
  std::string type = opt_string(*rp, "rope_type", opt_string(*rp, "type", "default", label), label);
  // Phi3Config renames the older "su" and "yarn" to longrope.
  if (c.family == Family::Phi3 && (type == "su" || type == "yarn")) type = "longrope";
  s.type = type;
  if (type == "longrope") {
    if (c.family != Family::Phi3) bad_data(label + ": rope type 'longrope' is supported for Phi3ForCausalLM only");
    const int64_t half = c.rotary_dim / 2;
    s.short_factor = factor_list(*rp, "short_factor", half, label);
    s.long_factor = factor_list(*rp, "long_factor", half, label);
    // Phi3Config always has a top-level original_max_position_embeddings (default 4096), and transformers
    // writes it over the rope parameters' own.
    s.original_max_position_embeddings = opt_int(cfg, "original_max_position_embeddings", 4096, 1, label);
    const double orig = static_cast<double>(s.original_max_position_embeddings);
    const double factor = present(*rp, "factor") ? opt_positive(*rp, "factor", 1.0, label)
                                                 : static_cast<double>(c.max_position_embeddings) / orig;
    s.factor = factor;
    // The paper's attention scaling: sqrt(1 + ln(factor) / ln(original length)), unless given.
    s.attention_factor = present(*rp, "attention_factor") ? opt_positive(*rp, "attention_factor", 1.0, label)
                         : factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(factor) / std::log(orig));
    return;
  }
  if (c.family == Family::Phi3 && type != "default")  // Phi3Config's own rule
    bad_data(label + ": rope type '" + type + "' is not supported for Phi3ForCausalLM (supported: default, longrope)");
  if (type == "linear" || type == "llama3") {
    if (!present(*rp, "factor")) bad_data(label + ": rope scaling '" + type + "' needs a positive 'factor'");
    s.factor = opt_positive(*rp, "factor", 1.0, label);
  }
  if (type == "llama3") {
    s.low_freq_factor = opt_positive(*rp, "low_freq_factor", 1.0, label);
    s.high_freq_factor = opt_positive(*rp, "high_freq_factor", 4.0, label);
    s.original_max_position_embeddings = opt_int(*rp, "original_max_position_embeddings", 8192, 1, label);
    if (s.high_freq_factor <= s.low_freq_factor)
      bad_data(label + ": llama3 rope scaling needs high_freq_factor > low_freq_factor");
  } else if (type != "default" && type != "linear") {
    bad_data(label + ": rope type '" + type + "' is not supported (supported: default, linear, llama3)");
  }
}

// The RoPE parameters transformers reads for a model with one set: rope_scaling (transformers 4), unless
// absent or empty, else rope_parameters (transformers 5); null when neither is an object.
const json* rope_dict(const json& cfg) {
  if (cfg.contains("rope_scaling") && cfg["rope_scaling"].is_object() && !cfg["rope_scaling"].empty()) return &cfg["rope_scaling"];
  if (cfg.contains("rope_parameters") && cfg["rope_parameters"].is_object()) return &cfg["rope_parameters"];
  return nullptr;
}

bool is_gemma(Family f) { return f == Family::Gemma || f == Family::Gemma2 || f == Family::Gemma3; }

// Gemma 2/3's per-layer attention kinds: layer_types when config.json has it (transformers >= 4.53
// writes it), else the family's fixed pattern (Gemma 2: even layers slide; Gemma 3: all but every
// sliding_window_pattern-th).
std::vector<bool> gemma_sliding_layers(const json& cfg, const LlamaConfig& c, const std::string& label) {
  std::vector<bool> out(static_cast<size_t>(c.layers));
  if (present(cfg, "layer_types")) {
    const json& lt = cfg["layer_types"];
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.layers)
      bad_data(label + ": 'layer_types' must be a list of num_hidden_layers (" + std::to_string(c.layers) + ") strings");
    for (size_t i = 0; i < lt.size(); ++i) {
      const std::string t = lt[i].is_string() ? lt[i].get<std::string>() : std::string("(not a string)");
      if (t != "sliding_attention" && t != "full_attention")
        bad_data(label + ": layer_types[" + std::to_string(i) + "] is '" + t.substr(0, 64) +
                 "' (supported: sliding_attention, full_attention)");
      out[i] = t == "sliding_attention";
    }
    return out;
  }
  int64_t pattern = 2;
  if (c.family == Family::Gemma3)
    pattern = opt_int(cfg, "sliding_window_pattern", opt_int(cfg, "_sliding_window_pattern", 6, 1, label), 1, label);
  for (int64_t i = 0; i < c.layers; ++i) out[static_cast<size_t>(i)] = (i + 1) % pattern != 0;
  return out;
}

}  // namespace

bool LlamaConfig::layer_slides(int64_t layer) const {
  if (sliding_window <= 0) return false;
  if (sliding_layers.empty()) return true;
  return layer >= 0 && layer < static_cast<int64_t>(sliding_layers.size()) && sliding_layers[static_cast<size_t>(layer)];
}

bool LlamaConfig::layer_rope(int64_t layer) const {
  return rope_layers.empty() || (layer >= 0 && layer < static_cast<int64_t>(rope_layers.size()) &&
                                 rope_layers[static_cast<size_t>(layer)]);
}

bool LlamaConfig::layer_moe(int64_t layer) const {
  return moe.experts > 0 && layer >= 0 && layer < static_cast<int64_t>(moe.layers.size()) &&
         moe.layers[static_cast<size_t>(layer)];
}

bool LlamaConfig::has_moe() const {
  for (int64_t b = 0; b < layers; ++b)
    if (layer_moe(b)) return true;
  return false;
}

bool LlamaConfig::layer_local_rope(int64_t layer) const {
  return local_rope_theta > 0 && layer >= 0 && layer < static_cast<int64_t>(sliding_layers.size()) &&
         sliding_layers[static_cast<size_t>(layer)];
}

float activation_ref(Activation a, float g) {
  switch (a) {
    case Activation::Silu: return g / (1.0f + std::exp(-g));
    case Activation::GeluTanh: {
      constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;
      return 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + kCubic * g * g * g)));
    }
    case Activation::Gelu: return 0.5f * g * (1.0f + std::erf(g * 0.7071067811865476f));
  }
  return g;
}

LlamaConfig LlamaConfig::from_json(const json& cfg, const std::string& label) {
  if (!cfg.is_object() || cfg.empty()) bad_data(label + ": config.json is missing or empty");
  LlamaConfig c;
  if (cfg.contains("architectures") && cfg["architectures"].is_array() && !cfg["architectures"].empty() &&
      cfg["architectures"][0].is_string()) {
    c.architecture = cfg["architectures"][0].get<std::string>();
  } else {
    const std::string mt = opt_string(cfg, "model_type", "", label);
    if (mt == "llama") c.architecture = "LlamaForCausalLM";
    else if (mt == "mistral") c.architecture = "MistralForCausalLM";
    else if (mt == "qwen2") c.architecture = "Qwen2ForCausalLM";
    else if (mt == "qwen3") c.architecture = "Qwen3ForCausalLM";
    else if (mt == "gemma") c.architecture = "GemmaForCausalLM";
    else if (mt == "gemma2") c.architecture = "Gemma2ForCausalLM";
    else if (mt == "gemma3_text") c.architecture = "Gemma3ForCausalLM";
    else if (mt == "phi3") c.architecture = "Phi3ForCausalLM";
    else if (mt == "granite") c.architecture = "GraniteForCausalLM";
    else if (mt == "smollm3") c.architecture = "SmolLM3ForCausalLM";
    else if (mt == "mixtral") c.architecture = "MixtralForCausalLM";
    else if (mt == "qwen2_moe") c.architecture = "Qwen2MoeForCausalLM";
    else if (mt == "qwen3_moe") c.architecture = "Qwen3MoeForCausalLM";
    else c.architecture = mt.empty() ? std::string("(none)") : "model_type " + mt;
  }
  if (c.architecture == "LlamaForCausalLM") c.family = Family::Llama;
  else if (c.architecture == "MistralForCausalLM") c.family = Family::Mistral;
  else if (c.architecture == "Qwen2ForCausalLM") c.family = Family::Qwen2;
  else if (c.architecture == "Qwen3ForCausalLM") c.family = Family::Qwen3;
  else if (c.architecture == "GemmaForCausalLM") c.family = Family::Gemma;
  else if (c.architecture == "Gemma2ForCausalLM") c.family = Family::Gemma2;
  else if (c.architecture == "Gemma3ForCausalLM") c.family = Family::Gemma3;
  else if (c.architecture == "Phi3ForCausalLM") c.family = Family::Phi3;
  else if (c.architecture == "GraniteForCausalLM") c.family = Family::Granite;
  else if (c.architecture == "SmolLM3ForCausalLM") c.family = Family::SmolLM3;
  else if (c.architecture == "MixtralForCausalLM") c.family = Family::Mixtral;
  else if (c.architecture == "Qwen2MoeForCausalLM") c.family = Family::Qwen2Moe;
  else if (c.architecture == "Qwen3MoeForCausalLM") c.family = Family::Qwen3Moe;
  else bad_data(label + ": architecture " + c.architecture + " is not supported by marlinc's forward pass (supported: " +
                join(supported_architectures()) + "); `quantize --method rtn` and `convert` need no forward pass");
  c.hidden = req_int(cfg, "hidden_size", label);
  // Qwen3-MoE's dense layers (mlp_only_layers) are the only use of intermediate_size there: Qwen3MoeConfig
  // defaults it.
  c.intermediate = c.family == Family::Qwen3Moe && !present(cfg, "intermediate_size")
                       ? 6144 : req_int(cfg, "intermediate_size", label);
  c.layers = req_int(cfg, "num_hidden_layers", label);
  c.heads = req_int(cfg, "num_attention_heads", label);
  c.kv_heads = cfg.contains("num_key_value_heads") && !cfg["num_key_value_heads"].is_null()
                   ? req_int(cfg, "num_key_value_heads", label) : c.heads;
  c.vocab = req_int(cfg, "vocab_size", label);
  if (present(cfg, "head_dim")) {
    c.head_dim = req_int(cfg, "head_dim", label);
  } else {
    if (c.hidden % c.heads != 0)
      bad_data(label + ": hidden_size " + std::to_string(c.hidden) + " is not a multiple of num_attention_heads " +
               std::to_string(c.heads) + " (and no head_dim is given)");
    c.head_dim = c.hidden / c.heads;
  }
  if (c.heads % c.kv_heads != 0)
    bad_data(label + ": num_attention_heads " + std::to_string(c.heads) + " is not a multiple of num_key_value_heads " +
             std::to_string(c.kv_heads));
  if (c.head_dim % 2 != 0) bad_data(label + ": head_dim " + std::to_string(c.head_dim) + " must be even for RoPE");
  const bool phi3 = c.family == Family::Phi3;
  c.max_position_embeddings = opt_int(cfg, "max_position_embeddings", phi3 ? 4096 : 0, 0, label);  // Phi3Config's defaults
  // Mistral, Mixtral and Phi-3 window every layer (null or absent: none).
  if (c.family == Family::Mistral || c.family == Family::Mixtral || c.family == Family::Phi3)
    c.sliding_window = opt_int(cfg, "sliding_window", 0, 0, label);
  c.fused_linears = c.family == Family::Phi3;
  c.rotary_dim = c.head_dim;
  if (phi3) {
    // partial_rotary_factor from the RoPE parameters transformers reads, else the top level (Phi-4-mini: 0.75).
    const json* rd = rope_dict(cfg);
    const double prf = opt_positive(rd && present(*rd, "partial_rotary_factor") ? *rd : cfg, "partial_rotary_factor", 1.0, label);
    if (prf > 1.0) bad_data(label + ": 'partial_rotary_factor' must be in (0, 1]");
    c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * prf);  // Python's int(): truncated
    if (c.rotary_dim < 2 || c.rotary_dim % 2 != 0)
      bad_data(label + ": partial_rotary_factor " + std::to_string(prf) + " gives " + std::to_string(c.rotary_dim) +
               " rotary dims of head_dim " + std::to_string(c.head_dim) + "; an even number >= 2 is needed");
  }
  if ((c.family == Family::Qwen2 || c.family == Family::Qwen2Moe || c.family == Family::Qwen3Moe) &&
      opt_bool(cfg, "use_sliding_window", false, label))
    bad_data(label + ": use_sliding_window is not supported for " + c.architecture +
             " (set it false; calibration sequences are short)");
  c.rms_eps = opt_positive(cfg, "rms_norm_eps", phi3 ? 1e-5 : 1e-6, label);
  const bool gemma = is_gemma(c.family);
  // Gemma 2/3's MLP reads hidden_activation; Gemma 1's reads hidden_act (then hidden_activation), where
  // transformers 5 takes "gelu" for the tanh form the model was trained with (the first Gemma configs
  // said "gelu"); the others read hidden_act.
  const bool gemma1 = c.family == Family::Gemma;
  std::string act = gemma1 ? opt_string(cfg, "hidden_act", opt_string(cfg, "hidden_activation", "gelu_pytorch_tanh", label), label)
                    : gemma ? opt_string(cfg, "hidden_activation", "gelu_pytorch_tanh", label)
                            : opt_string(cfg, "hidden_act", "silu", label);
  if (gemma1 && act == "gelu") act = "gelu_pytorch_tanh";
  if (act == "silu") c.act = Activation::Silu;
  else if (gemma && (act == "gelu_pytorch_tanh" || act == "gelu_new")) c.act = Activation::GeluTanh;
  else if (gemma && act == "gelu") c.act = Activation::Gelu;
  else bad_data(label + ": " + (gemma && !gemma1 ? "hidden_activation '" : "hidden_act '") + act.substr(0, 64) +
                "' is not supported (supported: silu" + (gemma ? ", gelu_pytorch_tanh, gelu_new, gelu)" : ")"));
  c.tie_embeddings = opt_bool(cfg, "tie_word_embeddings", gemma, label);
  c.qk_norm = c.family == Family::Qwen3 || c.family == Family::Qwen3Moe || c.family == Family::Gemma3;
  parse_moe(cfg, c, label);
  if (gemma) {
    if (opt_bool(cfg, "use_bidirectional_attention", false, label))
      bad_data(label + ": use_bidirectional_attention is not supported (a causal language model attends backwards only)");
    c.unit_offset_norms = true;
    c.scale_embeddings = true;
  }
  if (c.family == Family::SmolLM3) {
    // no_rope_layers (1 = RoPE, 0 = NoPE), else one NoPE layer every no_rope_layer_interval (SmolLM3Config).
    if (opt_bool(cfg, "use_sliding_window", false, label))
      bad_data(label + ": use_sliding_window is not supported for SmolLM3 (set it false; calibration sequences are short)");
    c.rope_layers.assign(static_cast<size_t>(c.layers), true);
    if (present(cfg, "no_rope_layers")) {
      const json& nr = cfg["no_rope_layers"];
      if (!nr.is_array() || static_cast<int64_t>(nr.size()) != c.layers)
        bad_data(label + ": 'no_rope_layers' must be a list of num_hidden_layers (" + std::to_string(c.layers) + ") 0/1 values");
      for (size_t i = 0; i < nr.size(); ++i) {
        if (!nr[i].is_number_integer() || (nr[i].get<int64_t>() != 0 && nr[i].get<int64_t>() != 1))
          bad_data(label + ": no_rope_layers[" + std::to_string(i) + "] must be 0 (no RoPE) or 1 (RoPE)");
        c.rope_layers[i] = nr[i].get<int64_t>() == 1;
      }
    } else {
      const int64_t every = opt_int(cfg, "no_rope_layer_interval", 4, 1, label);
      for (int64_t i = 0; i < c.layers; ++i) c.rope_layers[static_cast<size_t>(i)] = (i + 1) % every != 0;
    }
  }
  if (c.family == Family::Granite) {
    // GraniteConfig's four multipliers (default 1): the attention one replaces head_dim^-1/2.
    c.embedding_multiplier = opt_positive(cfg, "embedding_multiplier", 1.0, label);
    c.scale_embeddings = c.embedding_multiplier != 1.0;
    c.residual_multiplier = opt_positive(cfg, "residual_multiplier", 1.0, label);
    c.attn_scale = opt_positive(cfg, "attention_multiplier", 1.0, label);
    c.logits_scaling = opt_positive(cfg, "logits_scaling", 1.0, label);
  }
  if (c.family == Family::Gemma2 || c.family == Family::Gemma3) {
    const bool g2 = c.family == Family::Gemma2;
    c.sandwich_norms = true;
    c.attn_scale = 1.0 / std::sqrt(opt_positive(cfg, "query_pre_attn_scalar", 256.0, label));
    // Absent keys take the family's defaults; null means none.
    auto cap = [&](const char* key, double dflt) {
      if (!cfg.contains(key)) return dflt;
      return cfg[key].is_null() ? 0.0 : opt_positive(cfg, key, dflt, label);
    };
    c.attn_softcap = cap("attn_logit_softcapping", g2 ? 50.0 : 0.0);
    c.final_softcap = cap("final_logit_softcapping", g2 ? 30.0 : 0.0);
    c.sliding_window = opt_int(cfg, "sliding_window", 4096, 0, label);
    c.sliding_layers = gemma_sliding_layers(cfg, c, label);
  }

  // RoPE: transformers 4 writes rope_theta and rope_scaling; transformers 5 writes rope_parameters,
  // for Gemma 3 one set per layer type ({"full_attention": {...}, "sliding_attention": {...}}).
  // Gemma3TextConfig's default global base, and MixtralConfig's.
  if (c.family == Family::Gemma3 || c.family == Family::Mixtral) c.rope_theta = 1000000.0;
  if (present(cfg, "rope_theta")) c.rope_theta = opt_positive(cfg, "rope_theta", c.rope_theta, label);
  // An empty rope_scaling falls through to rope_parameters, as in transformers (rope_scaling or rope_parameters).
  const json* rs = cfg.contains("rope_scaling") && cfg["rope_scaling"].is_object() && !cfg["rope_scaling"].empty()
                       ? &cfg["rope_scaling"] : nullptr;
  const json* rp = cfg.contains("rope_parameters") && cfg["rope_parameters"].is_object() ? &cfg["rope_parameters"] : nullptr;
  const bool per_type = rp && (rp->contains("full_attention") || rp->contains("sliding_attention"));
  if (per_type) {
    if (c.family != Family::Gemma3)
      bad_data(label + ": per-layer-type rope_parameters are supported for Gemma 3 only");
    auto sub = [&](const char* key) -> const json* {
      if (!rp->contains(key)) return nullptr;
      if (!(*rp)[key].is_object()) bad_data(label + ": rope_parameters." + key + " must be an object");
      return &(*rp)[key];
    };
    // What a sub-object leaves out comes from the older top-level keys, as transformers 5 fills them in:
    // rope_scaling for the global layers, rope_local_base_freq for the sliding ones.
    if (rs) parse_rope(rs, c.rope_theta, c.rope_scaling, c, cfg, label);
    const json* full = sub("full_attention");
    if (full && (full->contains("rope_type") || full->contains("type")))
      parse_rope(full, c.rope_theta, c.rope_scaling, c, cfg, label);
    else if (full && present(*full, "rope_theta"))
      c.rope_theta = opt_positive(*full, "rope_theta", c.rope_theta, label);
    c.local_rope_theta = opt_positive(cfg, "rope_local_base_freq", 10000.0, label);
    parse_rope(sub("sliding_attention"), c.local_rope_theta, c.local_rope_scaling, c, cfg, label);
  } else {
    parse_rope(rs ? rs : rp, c.rope_theta, c.rope_scaling, c, cfg, label);
    if (c.family == Family::Gemma3)  // transformers 4: local layers take rope_local_base_freq, unscaled
      c.local_rope_theta = opt_positive(cfg, "rope_local_base_freq", 10000.0, label);
  }
  return c;
}

bool rope_long(const LlamaConfig& c, int64_t len) {
  return c.rope_scaling.type == "longrope" && len > c.rope_scaling.original_max_position_embeddings;
}

std::vector<float> rope_inv_freq(const LlamaConfig& c, bool local, bool long_seq) {
  const int64_t dim = c.rotary_dim > 0 ? c.rotary_dim : c.head_dim, half = dim / 2;
  std::vector<float> f(static_cast<size_t>(half));
  const double theta = local && c.local_rope_theta > 0 ? c.local_rope_theta : c.rope_theta;
  const RopeScaling& s = local && c.local_rope_theta > 0 ? c.local_rope_scaling : c.rope_scaling;
  // As transformers computes it, in fp32: 1 / theta^(2i / dim); longrope: 1 / (ext_i · theta^(2i / dim)).
  for (int64_t i = 0; i < half; ++i) {
    float e = static_cast<float>(2 * i) / static_cast<float>(dim);
    const double p = std::pow(static_cast<double>(static_cast<float>(theta)), static_cast<double>(e));
    if (s.type == "longrope") {
      const std::vector<double>& ext = long_seq ? s.long_factor : s.short_factor;
      f[i] = 1.0f / (static_cast<float>(ext[size_t(i)]) * static_cast<float>(p));
    } else {
      f[i] = static_cast<float>(1.0 / p);
    }
  }
  if (s.type == "linear") {
    for (float& x : f) x = static_cast<float>(x / s.factor);
  } else if (s.type == "llama3") {
    // Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated smoothly.
    const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
    const double low_wavelen = old_ctx / s.low_freq_factor, high_wavelen = old_ctx / s.high_freq_factor;
    for (float& x : f) {
      const double wavelen = 2.0 * std::numbers::pi / x;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        x = static_cast<float>(x / s.factor);
      } else {
        const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        x = static_cast<float>((1.0 - smooth) * x / s.factor + smooth * x);
      }
    }
  }
  return f;
}

std::string linear_name(const LlamaConfig& c, int64_t block, LinearRef r) {
  static const char* kNames[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                 "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  const std::string p = "model.layers." + std::to_string(block) + ".";
  const int li = static_cast<int>(r.l);
  if (r.expert == kSharedExpert) return p + "mlp.shared_expert." + (kNames[li] + 4);  // Qwen2-MoE
  if (r.expert >= 0) {
    if (c.moe.mixtral_names) {  // w1 = gate, w3 = up, w2 = down
      const char* w = r.l == Linear::Gate ? "w1" : r.l == Linear::Up ? "w3" : "w2";
      return p + "block_sparse_moe.experts." + std::to_string(r.expert) + "." + w;
    }
    return p + "mlp.experts." + std::to_string(r.expert) + "." + (kNames[li] + 4);
  }
  return p + kNames[li];
}

int64_t group_in_features(const LlamaConfig& c, LinearInput g, int32_t expert) {
  if (g == LinearInput::O) return c.heads * c.head_dim;
  if (g != LinearInput::Down) return c.hidden;
  return expert == kSharedExpert ? c.moe.shared_intermediate : expert >= 0 ? c.moe.expert_intermediate : c.intermediate;
}

std::vector<LinearRef> block_linears(const LlamaConfig& c, int64_t block, LinearInput g) {
  std::vector<LinearRef> out;
  const bool mlp = g == LinearInput::GateUp || g == LinearInput::Down;
  if (!mlp || !c.layer_moe(block)) {
    for (Linear l : linears_of(g)) out.emplace_back(l);
    return out;
  }
  for (int32_t e = 0; e < static_cast<int32_t>(c.moe.experts); ++e)
    for (Linear l : linears_of(g)) out.emplace_back(l, e);
  if (c.moe.shared_intermediate > 0)
    for (Linear l : linears_of(g)) out.emplace_back(l, kSharedExpert);
  return out;
}

LinearSource linear_source(const LlamaConfig& c, int64_t block, LinearRef r) {
  const Linear l = r.l;
  const int64_t qd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  const std::string p = "model.layers." + std::to_string(block) + ".";
  if (r.expert != kDenseMlp) {
    const int64_t inter = group_in_features(c, LinearInput::Down, r.expert);
    const bool down = l == Linear::Down;
    return {linear_name(c, block, r), 0, down ? c.hidden : inter, down ? c.hidden : inter, down ? inter : c.hidden};
  }
  if (c.fused_linears) {
    switch (l) {
      case Linear::Q: return {p + "self_attn.qkv_proj", 0, qd, qd + 2 * kvd, c.hidden};
      case Linear::K: return {p + "self_attn.qkv_proj", qd, kvd, qd + 2 * kvd, c.hidden};
      case Linear::V: return {p + "self_attn.qkv_proj", qd + kvd, kvd, qd + 2 * kvd, c.hidden};
      case Linear::Gate: return {p + "mlp.gate_up_proj", 0, c.intermediate, 2 * c.intermediate, c.hidden};
      case Linear::Up: return {p + "mlp.gate_up_proj", c.intermediate, c.intermediate, 2 * c.intermediate, c.hidden};
      default: break;
    }
  }
  int64_t out = 0, in = 0;
  switch (l) {
    case Linear::Q: out = qd, in = c.hidden; break;
    case Linear::K: case Linear::V: out = kvd, in = c.hidden; break;
    case Linear::O: out = c.hidden, in = qd; break;
    case Linear::Gate: case Linear::Up: out = c.intermediate, in = c.hidden; break;
    case Linear::Down: out = c.hidden, in = c.intermediate; break;
  }
  return {linear_name(c, block, r), 0, out, out, in};
}

std::vector<Linear> linears_of(LinearInput g) {
  switch (g) {
    case LinearInput::QKV: return {Linear::Q, Linear::K, Linear::V};
    case LinearInput::O: return {Linear::O};
    case LinearInput::GateUp: return {Linear::Gate, Linear::Up};
    case LinearInput::Down: return {Linear::Down};
  }
  return {};
}

Matrix& BlockWeights::weight(LinearRef r) {
  if (r.expert != kDenseMlp) {
    ExpertWeights& e = r.expert == kSharedExpert ? shared : experts.at(static_cast<size_t>(r.expert));
    return r.l == Linear::Gate ? e.gate : r.l == Linear::Up ? e.up : e.down;
  }
  switch (r.l) {
    case Linear::Q: return q;
    case Linear::K: return k;
    case Linear::V: return v;
    case Linear::O: return o;
    case Linear::Gate: return gate;
    case Linear::Up: return up;
    case Linear::Down: return down;
  }
  return q;
}
const Matrix& BlockWeights::weight(LinearRef r) const { return const_cast<BlockWeights*>(this)->weight(r); }
const Vector& BlockWeights::bias(LinearRef r) const {
  static const Vector kNone;
  if (r.expert != kDenseMlp) return kNone;
  switch (r.l) {
    case Linear::Q: return q_bias;
    case Linear::K: return k_bias;
    case Linear::V: return v_bias;
    case Linear::O: return o_bias;
    case Linear::Gate: return gate_bias;
    case Linear::Up: return up_bias;
    case Linear::Down: return down_bias;
  }
  return q_bias;
}

// ---- loading -------------------------------------------------------------------------------------

namespace {

// An MoE block's router weight [experts, hidden].
std::string router_name(const LlamaConfig& c, int64_t block) {
  return "model.layers." + std::to_string(block) +
         (c.moe.mixtral_names ? ".block_sparse_moe.gate.weight" : ".mlp.gate.weight");
}

void expect_shape(const Checkpoint& ck, const std::string& name, std::vector<int64_t> shape) {
  auto ref = ck.find(name);
  if (!ref)
    bad_data(ck.source().string() + ": tensor " + name + " is missing" +
             (ck.quantize_config().empty() ? std::string()
                                           : " (the checkpoint is quantized: its linears need a dequantizing LinearProvider)"));
  if (ref->info->shape != shape) {
    auto str = [](const std::vector<int64_t>& s) {
      std::string r = "[";
      for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
      return r + "]";
    };
    bad_data(ck.source().string() + ": tensor " + name + " has shape " + str(ref->info->shape) + ", config.json implies " +
             str(shape));
  }
  DType dt = ref->info->dtype;
  if (dt != DType::F32 && dt != DType::F16 && dt != DType::BF16)
    bad_data(ck.source().string() + ": tensor " + name + " has dtype " + std::string(dtype_name(dt)) +
             "; the forward pass reads F32, F16 or BF16 (quantized checkpoints need a LinearProvider)");
}

}  // namespace

LlamaModel LlamaModel::open(const std::filesystem::path& dir, bool quantized_linears) {
  LlamaModel m;
  m.ckpt_ = std::make_shared<Checkpoint>(Checkpoint::open(dir));
  const Checkpoint& ck = *m.ckpt_;
  m.cfg_ = LlamaConfig::from_json(ck.config(), (ck.dir() / "config.json").string());
  const LlamaConfig& c = m.cfg_;
  const int64_t qd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  expect_shape(ck, "model.embed_tokens.weight", {c.vocab, c.hidden});
  expect_shape(ck, "model.norm.weight", {c.hidden});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    expect_shape(ck, p + "input_layernorm.weight", {c.hidden});
    expect_shape(ck, p + "post_attention_layernorm.weight", {c.hidden});
    if (c.sandwich_norms) {
      expect_shape(ck, p + "pre_feedforward_layernorm.weight", {c.hidden});
      expect_shape(ck, p + "post_feedforward_layernorm.weight", {c.hidden});
    }
    // A quantized checkpoint has no plain weight for its quantized linears: load_block then takes
    // them from the LinearProvider (QuantizedLinears), which checks their shapes.
    const bool plain_linears = !quantized_linears;
    if (plain_linears)
      for (LinearInput g : {LinearInput::QKV, LinearInput::O, LinearInput::GateUp, LinearInput::Down})
        for (LinearRef r : block_linears(c, i, g)) {
          const LinearSource s = linear_source(c, i, r);
          expect_shape(ck, s.prefix + ".weight", {s.total_rows, s.in});
        }
    if (c.layer_moe(i)) {  // routers stay 16-bit in quantized checkpoints too
      expect_shape(ck, router_name(c, i), {c.moe.experts, c.hidden});
      if (c.moe.shared_intermediate > 0) expect_shape(ck, p + "mlp.shared_expert_gate.weight", {1, c.hidden});
    }
    // Qwen2-MoE's attention has biases unless qkv_bias is false (then none are stored).
    if (c.family == Family::Qwen2 || (c.family == Family::Qwen2Moe && ck.contains(p + "self_attn.q_proj.bias"))) {
      expect_shape(ck, p + "self_attn.q_proj.bias", {qd});
      expect_shape(ck, p + "self_attn.k_proj.bias", {kvd});
      expect_shape(ck, p + "self_attn.v_proj.bias", {kvd});
    }
    if (c.qk_norm) {
      expect_shape(ck, p + "self_attn.q_norm.weight", {c.head_dim});
      expect_shape(ck, p + "self_attn.k_norm.weight", {c.head_dim});
    }
  }
  if (ck.contains("lm_head.weight")) {
    m.head_name_ = "lm_head.weight";
  } else if (c.tie_embeddings) {
    m.head_name_ = "model.embed_tokens.weight";
  } else {
    bad_data(ck.source().string() + ": tensor lm_head.weight is missing and config.json does not set tie_word_embeddings");
  }
  expect_shape(ck, m.head_name_, {c.vocab, c.hidden});
  m.inv_freq_ = rope_inv_freq(c);
  if (c.local_rope_theta > 0) m.inv_freq_local_ = rope_inv_freq(c, /*local=*/true);
  if (c.rope_scaling.type == "longrope") m.inv_freq_long_ = rope_inv_freq(c, false, /*long_seq=*/true);
  m.final_norm_ = m.load_norm("model.norm.weight", c.hidden);
  if (c.family == Family::Granite) {
    m.embed_scale_ = static_cast<float>(c.embedding_multiplier);  // a Python float times the embeddings
  } else if (c.scale_embeddings) {
    // sqrt(hidden) as a Python float, then held in the model's dtype (the embedding table's).
    const double scale = std::sqrt(static_cast<double>(c.hidden));
    const DType dt = ck.at("model.embed_tokens.weight").info->dtype;
    m.embed_scale_ = dt == DType::F16    ? half_to_float(float_to_half(static_cast<float>(scale)))
                     : dt == DType::BF16 ? bf16_to_float(float_to_bf16(static_cast<float>(scale)))
                                         : static_cast<float>(scale);
  }
  return m;
}

Matrix LlamaModel::load_rows(const std::string& name, int64_t rows, int64_t cols, int64_t row0, int64_t n) const {
  expect_shape(*ckpt_, name, {rows, cols});
  auto ref = ckpt_->at(name);
  const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(ref.info->dtype);
  std::vector<float> f =
      to_float(ref.file->data(*ref.info).subspan(static_cast<size_t>(row0) * row_bytes, static_cast<size_t>(n) * row_bytes),
               ref.info->dtype);
  return Eigen::Map<const Matrix>(f.data(), n, cols);
}

Vector LlamaModel::load_vector(const std::string& name, int64_t n) const {
  expect_shape(*ckpt_, name, {n});
  auto ref = ckpt_->at(name);
  std::vector<float> f = to_float(ref.file->data(*ref.info), ref.info->dtype);
  return Eigen::Map<const Vector>(f.data(), n);
}

Vector LlamaModel::load_optional_vector(const std::string& name, int64_t n) const {
  return ckpt_->contains(name) ? load_vector(name, n) : Vector();
}

Vector LlamaModel::load_norm(const std::string& name, int64_t n) const {
  Vector w = load_vector(name, n);
  if (cfg_.unit_offset_norms) w.array() += 1.0f;  // Gemma: x̂ · (1 + w), the sum in fp32
  return w;
}

BlockWeights LlamaModel::load_block(int64_t i, const LinearProvider* provider, bool linears) const {
  const LlamaConfig& c = cfg_;
  if (i < 0 || i >= c.layers)
    bad_usage("block " + std::to_string(i) + " is out of range (the model has " + std::to_string(c.layers) + ")");
  const std::string p = "model.layers." + std::to_string(i) + ".";
  BlockWeights w;
  w.index = i;
  if (c.layer_moe(i)) {
    w.moe = true;
    w.router = load_rows(router_name(c, i), c.moe.experts, c.hidden, 0, c.moe.experts);
    w.experts.resize(static_cast<size_t>(c.moe.experts));
    if (c.moe.shared_intermediate > 0)
      w.shared_gate = load_rows(p + "mlp.shared_expert_gate.weight", 1, c.hidden, 0, 1).row(0).transpose();
  }
  for (LinearInput g : {LinearInput::QKV, LinearInput::O, LinearInput::GateUp, LinearInput::Down})
    for (LinearRef r : block_linears(c, i, g)) {
      const LinearSource s = linear_source(c, i, r);
      // A fused module's bias is its rows' part too; experts have none.
      if (r.expert == kDenseMlp && ckpt_->contains(s.prefix + ".bias"))
        const_cast<Vector&>(w.bias(r)) = load_vector(s.prefix + ".bias", s.total_rows).segment(s.row0, s.rows);
      if (!linears) continue;
      std::optional<Matrix> repl = provider ? provider->weight(i, r) : std::nullopt;
      if (repl) {
        if (repl->rows() != s.rows || repl->cols() != s.in)
          bad_data(linear_name(c, i, r) + ": replacement weight is [" + std::to_string(repl->rows()) + ", " +
                   std::to_string(repl->cols()) + "], expected [" + std::to_string(s.rows) + ", " +
                   std::to_string(s.in) + "]");
        w.weight(r) = std::move(*repl);
      } else {
        w.weight(r) = load_rows(s.prefix + ".weight", s.total_rows, s.in, s.row0, s.rows);
      }
    }
  w.input_norm = load_norm(p + "input_layernorm.weight", c.hidden);
  if (c.sandwich_norms) {
    w.attn_out_norm = load_norm(p + "post_attention_layernorm.weight", c.hidden);
    w.post_norm = load_norm(p + "pre_feedforward_layernorm.weight", c.hidden);
    w.mlp_out_norm = load_norm(p + "post_feedforward_layernorm.weight", c.hidden);
  } else {
    w.post_norm = load_norm(p + "post_attention_layernorm.weight", c.hidden);
  }
  if (c.qk_norm) {
    w.q_norm = load_norm(p + "self_attn.q_norm.weight", c.head_dim);
    w.k_norm = load_norm(p + "self_attn.k_norm.weight", c.head_dim);
  }
  return w;
}

// ---- compute ---------------------------------------------------------------------------------------

Matrix rms_norm_ref(const Matrix& x, const Vector& w, double eps) {
  Matrix y(x.rows(), x.cols());
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    double ss = 0;
    for (Eigen::Index j = 0; j < x.cols(); ++j) ss += static_cast<double>(x(r, j)) * x(r, j);
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(x.cols()) + eps));
    for (Eigen::Index j = 0; j < x.cols(); ++j) y(r, j) = w[j] * (x(r, j) * inv);
  }
  return y;
}

namespace {

// In place on rows of x viewed as [rows, n]; the same arithmetic as rms_norm_ref, row-parallel.
void rms_norm_rows(float* x, Eigen::Index rows, Eigen::Index n, const Vector& w, double eps) {
#pragma omp parallel for schedule(static) if (rows * n >= (1 << 16))
  for (Eigen::Index r = 0; r < rows; ++r) {
    float* row = x + r * n;
    double ss = 0;
    for (Eigen::Index j = 0; j < n; ++j) ss += static_cast<double>(row[j]) * row[j];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
    for (Eigen::Index j = 0; j < n; ++j) row[j] = w[j] * (row[j] * inv);
  }
}

Matrix linear(const Matrix& x, const Matrix& w, const Vector& b) {
  Matrix y = x * w.transpose();  // [T, out]
  if (b.size()) y.rowwise() += b.transpose();
  return y;
}

}  // namespace

Matrix LlamaModel::embed(std::span<const int32_t> tokens) const {
  const LlamaConfig& c = cfg_;
  auto ref = ckpt_->at("model.embed_tokens.weight");
  const size_t esz = dtype_size(ref.info->dtype);
  std::span<const uint8_t> bytes = ref.file->data(*ref.info);
  Matrix h(static_cast<Eigen::Index>(tokens.size()), c.hidden);
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (tokens[t] < 0 || tokens[t] >= c.vocab)
      bad_data("token id " + std::to_string(tokens[t]) + " at position " + std::to_string(t) +
               " is outside the model's vocabulary of " + std::to_string(c.vocab));
    // Straight into the row-major row: a calibration set embeds hundreds of thousands of tokens.
    to_float_into(bytes.subspan(static_cast<size_t>(tokens[t]) * c.hidden * esz, c.hidden * esz), ref.info->dtype,
                  h.data() + static_cast<Eigen::Index>(t) * c.hidden);
  }
  if (c.scale_embeddings) h *= embed_scale_;
  return h;
}

void LlamaModel::block_forward(Matrix& hidden, const BlockWeights& w, const InputHook& hook, ExpertCalibration ec) const {
  const LlamaConfig& c = cfg_;
  const Eigen::Index T = hidden.rows(), hd = c.head_dim, H = c.heads, KV = c.kv_heads;
  const Eigen::Index group = H / KV, half = c.rotary_dim / 2;  // rotated pairs (i, i + half), i < half
  // Attention: pre-norm, q/k/v, (q/k norm), RoPE, causal softmax attention with GQA, o_proj.
  Matrix x = hidden;
  rms_norm_rows(x.data(), T, x.cols(), w.input_norm, c.rms_eps);
  if (hook) hook(LinearInput::QKV, kDenseMlp, x);
  Matrix q = linear(x, w.q, w.q_bias);  // [T, H*hd]
  Matrix k = linear(x, w.k, w.k_bias);  // [T, KV*hd]
  Matrix v = linear(x, w.v, w.v_bias);  // [T, KV*hd]
  if (c.qk_norm) {
    rms_norm_rows(q.data(), T * H, hd, w.q_norm, c.rms_eps);
    rms_norm_rows(k.data(), T * KV, hd, w.k_norm, c.rms_eps);
  }
  // rotate_half convention of HF weights: pairs (i, i + rotary_dim/2) share frequency i; the dims from
  // rotary_dim on (Phi's partial rotary) pass through. longrope: the long table past the original length,
  // and cos/sin times its attention factor (in fp32, as transformers scales them).
  const std::vector<float>& inv_freq = c.layer_local_rope(w.index) ? inv_freq_local_
                                       : rope_long(c, T)            ? inv_freq_long_
                                                                    : inv_freq_;
  const float af = static_cast<float>(c.rope_scaling.type == "longrope" ? c.rope_scaling.attention_factor : 1.0);
  std::vector<float> cosv(static_cast<size_t>(T * half)), sinv(static_cast<size_t>(T * half));  // [T, rotary_dim/2]
  for (Eigen::Index t = 0; t < T; ++t)
    for (Eigen::Index i = 0; i < half; ++i) {
      const float ang = inv_freq[i] * static_cast<float>(t);  // fp32 product, as transformers forms it
      cosv[t * half + i] = static_cast<float>(std::cos(static_cast<double>(ang))) * af;
      sinv[t * half + i] = static_cast<float>(std::sin(static_cast<double>(ang))) * af;
    }
  auto rope = [&](Matrix& m, Eigen::Index heads) {
#pragma omp parallel for schedule(static) if (T * heads * hd >= (1 << 16))
    for (Eigen::Index t = 0; t < T; ++t)
      for (Eigen::Index h = 0; h < heads; ++h) {
        float* p = m.data() + t * m.cols() + h * hd;
        for (Eigen::Index i = 0; i < half; ++i) {
          const float a = p[i], b = p[i + half], co = cosv[t * half + i], si = sinv[t * half + i];
          p[i] = a * co - b * si;
          p[i + half] = b * co + a * si;
        }
      }
  };
  if (c.layer_rope(w.index)) {  // SmolLM3's NoPE layers attend without positions
    rope(q, H);
    rope(k, KV);
  }
  Matrix attn(T, H * hd);  // [T, H*hd]
  const float scale = c.attn_scale > 0 ? static_cast<float>(c.attn_scale) : 1.0f / std::sqrt(static_cast<float>(hd));
  const float cap = static_cast<float>(c.attn_softcap);
  const Eigen::Index window = c.layer_slides(w.index) ? c.sliding_window : T + 1;
  // Threads only when there is real work: tiny models on a busy machine lose more to thread wake-ups.
#pragma omp parallel for schedule(dynamic) if (T * T * hd * H >= (int64_t{1} << 24))
  for (Eigen::Index h = 0; h < H; ++h) {
    const Eigen::Index kvh = h / group;
    Matrix qh = q.middleCols(h * hd, hd), kh = k.middleCols(kvh * hd, hd), vh = v.middleCols(kvh * hd, hd);
    Matrix s = (qh * kh.transpose()) * scale;  // [T, T]
    if (cap > 0) s = ((s.array() / cap).tanh() * cap).matrix();
    for (Eigen::Index i = 0; i < T; ++i) {
      const Eigen::Index lo = std::max<Eigen::Index>(0, i - window + 1);
      float mx = -INFINITY;
      for (Eigen::Index j = lo; j <= i; ++j) mx = std::max(mx, s(i, j));
      float sum = 0;
      for (Eigen::Index j = 0; j < T; ++j) {
        const float e = (j >= lo && j <= i) ? std::exp(s(i, j) - mx) : 0.0f;
        s(i, j) = e;
        sum += e;
      }
      const float inv = 1.0f / sum;
      for (Eigen::Index j = lo; j <= i; ++j) s(i, j) *= inv;
    }
    attn.middleCols(h * hd, hd) = s * vh;
  }
  if (hook) hook(LinearInput::O, kDenseMlp, attn);
  // Gemma 2/3 normalise each sub-block's output before the residual add; Granite scales it.
  auto add_output = [&](Matrix y, const Vector& out_norm) {
    if (c.sandwich_norms) rms_norm_rows(y.data(), T, y.cols(), out_norm, c.rms_eps);
    if (c.residual_multiplier != 1.0) y *= static_cast<float>(c.residual_multiplier);
    hidden += y;
  };
  add_output(linear(attn, w.o, w.o_bias), w.attn_out_norm);
  // MLP: pre-norm, down(act(gate) * up).
  x = hidden;
  rms_norm_rows(x.data(), T, x.cols(), w.post_norm, c.rms_eps);
  if (w.moe) {
    add_output(moe_mlp(c, w, x, hook, ec), w.mlp_out_norm);
    return;
  }
  if (hook) hook(LinearInput::GateUp, kDenseMlp, x);
  const Matrix g = mlp_hidden(c, x, w.gate, w.up, w.gate_bias, w.up_bias);  // [T, inter]
  if (hook) hook(LinearInput::Down, kDenseMlp, g);
  add_output(linear(g, w.down, w.down_bias), w.mlp_out_norm);
}

Matrix mlp_hidden(const LlamaConfig& c, const Matrix& x, const Matrix& gate, const Matrix& up, const Vector& gate_bias,
                  const Vector& up_bias) {
  Matrix g = linear(x, gate, gate_bias);  // [T, inter]
  const Matrix u = linear(x, up, up_bias);  // [T, inter]
  if (c.act == Activation::Silu) {
    g = g.array() / (1.0f + (-g.array()).exp()) * u.array();
  } else {
    g = g.unaryExpr([&](float v) { return activation_ref(c.act, v); }).array() * u.array();
  }
  return g;
}

Matrix LlamaModel::final_norm(const Matrix& hidden) const {
  Matrix y = hidden;
  rms_norm_rows(y.data(), y.rows(), y.cols(), final_norm_, cfg_.rms_eps);
  return y;
}

Matrix LlamaModel::logits(const Matrix& normed) const {
  const LlamaConfig& c = cfg_;
  auto ref = ckpt_->at(head_name_);
  const size_t esz = dtype_size(ref.info->dtype);
  std::span<const uint8_t> bytes = ref.file->data(*ref.info);
  Matrix out(normed.rows(), c.vocab);  // [T, vocab]
  // The head is converted in slices of rows so memory stays bounded for 128k-token vocabularies.
  constexpr int64_t kRowsPerSlice = 8192;
  for (int64_t r0 = 0; r0 < c.vocab; r0 += kRowsPerSlice) {
    const int64_t n = std::min(kRowsPerSlice, c.vocab - r0);
    std::vector<float> f = to_float(bytes.subspan(static_cast<size_t>(r0 * c.hidden) * esz, static_cast<size_t>(n * c.hidden) * esz),
                                    ref.info->dtype);
    Eigen::Map<const Matrix> w(f.data(), n, c.hidden);
    out.middleCols(r0, n) = normed * w.transpose();
  }
  if (c.logits_scaling != 1.0) out /= static_cast<float>(c.logits_scaling);  // Granite
  if (c.final_softcap > 0) {  // Gemma 2: logits -> cap · tanh(logits / cap)
    const float cap = static_cast<float>(c.final_softcap);
    out = ((out.array() / cap).tanh() * cap).matrix();
  }
  return out;
}

Matrix LlamaModel::forward(std::span<const int32_t> tokens, const LinearProvider* provider,
                           std::vector<Matrix>* hidden_after) const {
  Matrix h = embed(tokens);
  if (hidden_after) hidden_after->clear();
  for (int64_t i = 0; i < cfg_.layers; ++i) {
    BlockWeights w = load_block(i, provider);
    block_forward(h, w);
    if (hidden_after) hidden_after->push_back(h);
  }
  return logits(final_norm(h));
}

Matrix LlamaModel::forward(std::span<const int32_t> tokens, const std::vector<BlockWeights>& blocks,
                           std::vector<Matrix>* hidden_after) const {
  if (static_cast<int64_t>(blocks.size()) != cfg_.layers)
    bad_usage("forward: " + std::to_string(blocks.size()) + " blocks given, the model has " + std::to_string(cfg_.layers));
  Matrix h = embed(tokens);
  if (hidden_after) hidden_after->clear();
  for (const BlockWeights& w : blocks) {
    block_forward(h, w);
    if (hidden_after) hidden_after->push_back(h);
  }
  return logits(final_norm(h));
}

}  // namespace marlinc::calib
