#include "checkpoint/tensor_parallel.h"

#include <array>

#include "checkpoint/format.h"

namespace marlinc {

namespace {

// A positive integer config value, or 0 (absent, another type, or not positive: the heads stay unknown).
int64_t positive(const nlohmann::json& c, const char* key) {
  if (!c.is_object() || !c.contains(key) || !c[key].is_number_integer()) return 0;
  const int64_t v = c[key].get<int64_t>();
  return v > 0 ? v : 0;
}

}  // namespace

TpSplit tp_split(const std::string& module) {
  static const std::array<const char*, 8> kRow = {"o_proj", "down_proj", "out_proj", "dense_4h_to_h",
                                                  "fc2",    "w2",        "wo",       "c_proj"};
  const std::string leaf = split_tensor_name(module).leaf;
  for (const char* r : kRow)
    if (leaf == r) return TpSplit::Row;
  return TpSplit::Column;
}

const char* tp_split_name(TpSplit s) { return s == TpSplit::Row ? "row" : "column"; }

TpHeads tp_heads(const nlohmann::json& config) {
  // Multimodal configs keep the language model's keys in text_config.
  const nlohmann::json& c =
      config.is_object() && config.contains("text_config") && config["text_config"].is_object() ? config["text_config"]
                                                                                                  : config;
  TpHeads h;
  const int64_t heads = positive(c, "num_attention_heads"), hidden = positive(c, "hidden_size");
  h.kv_heads = positive(c, "num_key_value_heads");
  if (h.kv_heads == 0) h.kv_heads = heads;  // no GQA: as many k/v heads as query heads
  h.head_dim = positive(c, "head_dim");
  if (h.head_dim == 0 && heads > 0 && hidden % heads == 0) h.head_dim = hidden / heads;
  if (h.kv_heads == 0 || h.head_dim == 0) h = {};
  return h;
}

TpShard tp_shard(const std::string& module, int64_t k, int64_t n, int tp, const TpHeads& heads) {
  TpShard s;
  s.k = k, s.n = n, s.split = tp_split(module);
  if (tp <= 1) return s;
  const std::string t = std::to_string(tp);
  if (s.split == TpSplit::Row) {
    if (k % tp != 0) s.error = "k = " + std::to_string(k) + " does not split into " + t + " equal parts (row-parallel)";
    else s.k = k / tp;
    return s;
  }
  const std::string leaf = split_tensor_name(module).leaf;
  // One rank's k (or v) heads: kv_heads / tp of them, or one replicated head when there are fewer than tp.
  auto kv_part = [&](int64_t& part) {
    if (heads.kv_heads % tp == 0) {
      part = heads.kv_heads / tp * heads.head_dim;
    } else if (tp % heads.kv_heads == 0) {
      part = heads.head_dim, s.replicated = true;
    } else {
      s.error = "num_key_value_heads = " + std::to_string(heads.kv_heads) + " and tensor parallel " + t +
                ": neither divides the other";
    }
  };
  const int64_t kvd = heads.kv_heads * heads.head_dim;
  if ((leaf == "k_proj" || leaf == "v_proj") && heads.kv_heads > 0 && n == kvd) {
    kv_part(s.n);
    return s;
  }
  // Phi-3's fused q|k|v rows: each part splits as its own projection does (vLLM's QKVParallelLinear).
  if (leaf == "qkv_proj" && heads.kv_heads > 0 && n > 2 * kvd && (n - 2 * kvd) % heads.head_dim == 0) {
    const int64_t q_heads = (n - 2 * kvd) / heads.head_dim;
    if (q_heads % tp != 0) {
      s.error = "num_attention_heads = " + std::to_string(q_heads) + " does not split into " + t + " equal parts";
      return s;
    }
    int64_t kv = 0;
    kv_part(kv);
    if (s.error.empty()) s.n = q_heads / tp * heads.head_dim + 2 * kv;
    return s;
  }
  // Phi-3's fused gate|up rows: each half splits (vLLM's MergedColumnParallelLinear).
  if (leaf == "gate_up_proj" && (n % 2 != 0 || (n / 2) % tp != 0)) {
    s.error = "gate_up_proj's halves (n / 2 = " + std::to_string(n / 2) + ") do not split into " + t + " equal parts";
    return s;
  }
  if (n % tp != 0) s.error = "n = " + std::to_string(n) + " does not split into " + t + " equal parts (column-parallel)";
  else s.n = n / tp;
  return s;
}

}  // namespace marlinc
