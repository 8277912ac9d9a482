// Mixture-of-experts MLPs of the calibration forward pass (llama.h): Mixtral, Qwen2-MoE and Qwen3-MoE, as
// transformers 5 runs them. Each expert sees only the tokens routed to it, so GPTQ's per-expert Hessians
// come from exactly the inputs the expert has at inference.
#include <algorithm>
#include <cmath>
#include <set>

#include "checkpoint/error.h"
#include "quantizer/calib/llama.h"

namespace marlinc::calib {

using nlohmann::json;

namespace {

// Config keys here are read with the same rules as llama.cpp's: absent or null takes the default; a wrong
// type or range names the key.
int64_t moe_int(const json& cfg, const char* key, int64_t dflt, int64_t lo, const std::string& label) {
  if (!cfg.contains(key) || cfg[key].is_null()) return dflt;
  if (!cfg[key].is_number_integer() || cfg[key].get<int64_t>() < lo || cfg[key].get<int64_t>() > (int64_t(1) << 24))
    bad_data(label + ": '" + key + "' must be an integer in [" + std::to_string(lo) + ", 2^24]");
  return cfg[key].get<int64_t>();
}

}  // namespace

void parse_moe(const json& cfg, LlamaConfig& c, const std::string& label) {
  MoeConfig& m = c.moe;
  const bool mixtral = c.family == Family::Mixtral, qwen2 = c.family == Family::Qwen2Moe;
  if (!mixtral && !qwen2 && c.family != Family::Qwen3Moe) return;
  if (mixtral) {
    // MixtralConfig maps num_experts onto num_local_experts.
    const bool alias = !(cfg.contains("num_local_experts") && !cfg["num_local_experts"].is_null());
    m.experts = moe_int(cfg, alias ? "num_experts" : "num_local_experts", 8, 1, label);
    m.top_k = moe_int(cfg, "num_experts_per_tok", 2, 1, label);
    m.expert_intermediate = c.intermediate;  // Mixtral's experts are intermediate_size wide
    m.norm_topk = true;
    m.mixtral_names = true;
    m.layers.assign(static_cast<size_t>(c.layers), true);
  } else {
    // Qwen configs say num_experts; transformers 5 writes Qwen3-MoE's as num_local_experts (Qwen2MoeConfig
    // reads num_experts only).
    const bool named = cfg.contains("num_experts") && !cfg["num_experts"].is_null();
    const char* count_key = named || qwen2 ? "num_experts" : "num_local_experts";
    m.experts = moe_int(cfg, count_key, qwen2 ? 60 : 128, 0, label);
    m.top_k = moe_int(cfg, "num_experts_per_tok", qwen2 ? 4 : 8, 1, label);
    m.expert_intermediate = moe_int(cfg, "moe_intermediate_size", qwen2 ? 1408 : 768, 1, label);
    if (qwen2) m.shared_intermediate = moe_int(cfg, "shared_expert_intermediate_size", 5632, 1, label);
    if (cfg.contains("norm_topk_prob") && !cfg["norm_topk_prob"].is_null()) {
      if (!cfg["norm_topk_prob"].is_boolean()) bad_data(label + ": 'norm_topk_prob' must be true or false");
      m.norm_topk = cfg["norm_topk_prob"].get<bool>();
    }
    // A layer is MoE unless listed in mlp_only_layers, and only every decoder_sparse_step-th one.
    const int64_t step = moe_int(cfg, "decoder_sparse_step", 1, 1, label);
    std::set<int64_t> dense;
    if (cfg.contains("mlp_only_layers") && !cfg["mlp_only_layers"].is_null()) {
      const json& ml = cfg["mlp_only_layers"];
      if (!ml.is_array()) bad_data(label + ": 'mlp_only_layers' must be a list of layer indices");
      for (const json& x : ml) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= c.layers)
          bad_data(label + ": 'mlp_only_layers' holds a value that is not a layer index in [0, " +
                   std::to_string(c.layers) + ")");
        dense.insert(x.get<int64_t>());
      }
    }
    m.layers.assign(static_cast<size_t>(c.layers), false);
    for (int64_t i = 0; i < c.layers; ++i)
      m.layers[static_cast<size_t>(i)] = m.experts > 0 && !dense.count(i) && (i + 1) % step == 0;
  }
  if (m.experts > 0 && m.top_k > m.experts)
    bad_data(label + ": num_experts_per_tok " + std::to_string(m.top_k) + " exceeds the " + std::to_string(m.experts) +
             " experts");
}

void route_logits(const LlamaConfig& c, const float* logits, int64_t T, int64_t E, int32_t* expert, float* weight) {
  const int64_t K = c.moe.top_k;
  std::vector<float> p(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* lt = logits + t * E;
    float mx = -INFINITY;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, lt[e]);
    float sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += (p[size_t(e)] = std::exp(lt[e] - mx));
    for (float& v : p) v /= sum;
    for (int32_t e = 0; e < static_cast<int32_t>(E); ++e) order[size_t(e)] = e;
    // Highest probability first; equal ones by expert index, so the choice is deterministic.
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) {
      return p[size_t(a)] != p[size_t(b)] ? p[size_t(a)] > p[size_t(b)] : a < b;
    });
    float top = 0;
    for (int64_t j = 0; j < K; ++j) top += p[size_t(order[size_t(j)])];
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = order[size_t(j)];
      expert[t * K + j] = e;
      weight[t * K + j] = c.moe.norm_topk ? p[size_t(e)] / top : p[size_t(e)];
    }
  }
}

Routing route_tokens(const LlamaConfig& c, const Matrix& router, const Matrix& x) {
  const int64_t T = x.rows(), E = router.rows(), K = c.moe.top_k;
  Routing r;
  r.tokens = T;
  r.top_k = K;
  r.expert.resize(static_cast<size_t>(T * K));
  r.weight.resize(static_cast<size_t>(T * K));
  const Matrix logits = x * router.transpose();  // [T, E] fp32
  route_logits(c, logits.data(), T, E, r.expert.data(), r.weight.data());
  return r;
}

Matrix moe_mlp(const LlamaConfig& c, const BlockWeights& w, const Matrix& x, const InputHook& hook,
               ExpertCalibration ec) {
  const int64_t T = x.rows(), E = static_cast<int64_t>(w.experts.size());
  const bool all = ec == ExpertCalibration::All;
  const Vector none;
  if (hook && all) {  // every expert calibrated on every token; the output below still follows the router
    hook(LinearInput::GateUp, kAllExperts, x);
    for (int64_t e = 0; e < E; ++e) {
      const ExpertWeights& ex = w.experts[size_t(e)];
      hook(LinearInput::Down, static_cast<int32_t>(e), mlp_hidden(c, x, ex.gate, ex.up, none, none));  // [T, inter]
    }
  }
  const Routing r = route_tokens(c, w.router, x);
  // Each expert's tokens, in token order, and their routing weights.
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(E));
  std::vector<std::vector<float>> weights(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < r.top_k; ++j) {
      const size_t e = static_cast<size_t>(r.expert[size_t(t * r.top_k + j)]);
      rows[e].push_back(t);
      weights[e].push_back(r.weight[size_t(t * r.top_k + j)]);
    }
  Matrix out = Matrix::Zero(T, x.cols());  // [T, hidden]
  // Experts in index order, each adding its weighted output to its tokens' rows (transformers' index_add_).
  for (int64_t e = 0; e < E; ++e) {
    const auto& rs = rows[size_t(e)];
    if (rs.empty()) continue;
    Matrix xe(static_cast<Eigen::Index>(rs.size()), x.cols());  // [n_e, hidden]
    for (size_t i = 0; i < rs.size(); ++i) xe.row(static_cast<Eigen::Index>(i)) = x.row(rs[i]);
    const ExpertWeights& ex = w.experts[size_t(e)];
    if (hook && !all) hook(LinearInput::GateUp, static_cast<int32_t>(e), xe);
    const Matrix h = mlp_hidden(c, xe, ex.gate, ex.up, none, none);  // [n_e, inter]
    if (hook && !all) hook(LinearInput::Down, static_cast<int32_t>(e), h);
    const Matrix y = h * ex.down.transpose();  // [n_e, hidden]
    for (size_t i = 0; i < rs.size(); ++i)
      out.row(rs[i]) += weights[size_t(e)][i] * y.row(static_cast<Eigen::Index>(i));
  }
  if (w.shared_gate.size()) {  // Qwen2-MoE: every token through the shared expert, scaled by its sigmoid gate
    if (hook) hook(LinearInput::GateUp, kSharedExpert, x);
    const Matrix h = mlp_hidden(c, x, w.shared.gate, w.shared.up, none, none);  // [T, shared inter]
    if (hook) hook(LinearInput::Down, kSharedExpert, h);
    const Matrix y = h * w.shared.down.transpose();  // [T, hidden]
    const Vector g = x * w.shared_gate;              // [T]
    for (int64_t t = 0; t < T; ++t) out.row(t) += (1.0f / (1.0f + std::exp(-g[t]))) * y.row(t);
  }
  return out;
}

}  // namespace marlinc::calib
