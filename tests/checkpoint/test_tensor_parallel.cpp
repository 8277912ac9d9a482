// One tensor-parallel rank's part of a layer (checkpoint/tensor_parallel.h) and the target rules on
// it (packer target_rule_tp): the shapes vLLM gives each GPU, and the layers that then fail to load.
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/tensor_parallel.h"
#include "packer/adapters.h"
#include "tests/common.h"

using namespace marlinc;

namespace {

ModuleDesc module(const std::string& prefix, int64_t k, int64_t n, int group) {
  ModuleDesc d;
  d.prefix = prefix, d.k = k, d.n = n, d.bits = 4, d.group_size = group;
  d.groups = group > 0 ? k / group : 1;
  return d;
}
bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

}  // namespace

TEST_CASE("tensor parallel: which layers split along k", "[tp]") {
  for (const char* row : {"model.layers.3.self_attn.o_proj", "model.layers.0.mlp.down_proj", "transformer.h.0.mlp.c_proj",
                          "model.layers.1.block_sparse_moe.experts.7.w2", "fc2"})
    CHECK(tp_split(row) == TpSplit::Row);
  for (const char* col : {"model.layers.3.self_attn.q_proj", "model.layers.0.mlp.gate_proj", "lm_head",
                          "model.layers.0.mlp.down_proj_extra", "model.layers.1.block_sparse_moe.experts.7.w1"})
    CHECK(tp_split(col) == TpSplit::Column);
}

TEST_CASE("tensor parallel: k/v heads from config.json", "[tp]") {
  const auto h = tp_heads(nlohmann::json::parse(
      R"({"hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8})"));
  CHECK(h.kv_heads == 8);
  CHECK(h.head_dim == 128);
  const auto explicit_dim = tp_heads(nlohmann::json::parse(
      R"({"text_config": {"hidden_size": 2560, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256}})"));
  CHECK(explicit_dim.kv_heads == 4);
  CHECK(explicit_dim.head_dim == 256);
  const auto mha = tp_heads(nlohmann::json::parse(R"({"hidden_size": 256, "num_attention_heads": 4})"));
  CHECK(mha.kv_heads == 4);
  CHECK(mha.head_dim == 64);
  // Unknown or malformed values leave the heads unknown (no replication), never throw.
  for (const char* bad : {R"({})", R"({"hidden_size": 256, "num_attention_heads": "4"})",
                          R"({"hidden_size": 250, "num_attention_heads": 4})", R"({"num_key_value_heads": -2, "head_dim": 64})",
                          R"([1, 2])"}) {
    const auto u = tp_heads(nlohmann::json::parse(bad));
    CHECK(u.kv_heads == 0);
    CHECK(u.head_dim == 0);
  }
}

TEST_CASE("tensor parallel: each rank's part", "[tp]") {
  const TpHeads llama70b{8, 128};
  auto whole = tp_shard("model.layers.0.mlp.down_proj", 28672, 8192, 1, llama70b);
  CHECK(whole.k == 28672);
  CHECK(whole.n == 8192);
  CHECK(whole.error.empty());
  auto down = tp_shard("model.layers.0.mlp.down_proj", 28672, 8192, 8, llama70b);
  CHECK(down.split == TpSplit::Row);
  CHECK(down.k == 3584);
  CHECK(down.n == 8192);
  auto gate = tp_shard("model.layers.0.mlp.gate_proj", 8192, 28672, 8, llama70b);
  CHECK(gate.k == 8192);
  CHECK(gate.n == 3584);
  auto k8 = tp_shard("model.layers.0.self_attn.k_proj", 8192, 1024, 8, llama70b);
  CHECK(k8.n == 128);
  CHECK(!k8.replicated);
  // More ranks than k/v heads: vLLM gives each rank one whole (replicated) head.
  auto k16 = tp_shard("model.layers.0.self_attn.k_proj", 8192, 1024, 16, llama70b);
  CHECK(k16.n == 128);
  CHECK(k16.replicated);
  auto k3 = tp_shard("model.layers.0.self_attn.k_proj", 8192, 1024, 3, llama70b);
  CHECK(contains(k3.error, "num_key_value_heads = 8"));
  auto odd_col = tp_shard("model.layers.0.mlp.up_proj", 4096, 11008, 3, {});
  CHECK(contains(odd_col.error, "n = 11008 does not split into 3"));
  auto odd_row = tp_shard("model.layers.0.self_attn.o_proj", 4000, 4096, 3, {});
  CHECK(contains(odd_row.error, "k = 4000 does not split into 3"));
  // Phi-4-mini's fused qkv_proj: 24 query heads and 8 k/v heads of 128 (n = 5120); each part splits on its own.
  const TpHeads phi4mini{8, 128};
  auto qkv2 = tp_shard("model.layers.0.self_attn.qkv_proj", 3072, 5120, 2, phi4mini);
  CHECK((qkv2.n == 12 * 128 + 2 * 4 * 128 && !qkv2.replicated && qkv2.error.empty()));
  auto qkv24 = tp_shard("model.layers.0.self_attn.qkv_proj", 3072, 5120, 24, phi4mini);  // 1 q head, 1 replicated k/v head
  CHECK((qkv24.n == 128 + 2 * 128 && qkv24.replicated));
  auto qkv16 = tp_shard("model.layers.0.self_attn.qkv_proj", 3072, 5120, 16, phi4mini);
  CHECK(contains(qkv16.error, "num_attention_heads = 24 does not split into 16"));
  auto gu = tp_shard("model.layers.0.mlp.gate_up_proj", 3072, 2 * 8190, 4, phi4mini);  // n % 4 == 0, but 8190 % 4 != 0
  CHECK(contains(gu.error, "gate_up_proj's halves (n / 2 = 8190) do not split into 4"));
  CHECK(tp_shard("model.layers.0.mlp.gate_up_proj", 3072, 16384, 4, phi4mini).n == 4096);
}

TEST_CASE("tensor parallel: the target's rules on one rank's part", "[tp]") {
  // Qwen2-72B's down_proj (k = 29568 = 231 x 128) passes whole, but 2 or 4 ranks get 14784 / 7392 rows,
  // not whole groups of 128 (gptq.md §6 item 7); Llama-3-70B's (28672) splits into 3584 at 8.
  const ModuleDesc qwen_down = module("model.layers.0.mlp.down_proj", 29568, 8192, 128);
  CHECK(target_rule(TargetFormat::Marlin, qwen_down).empty());
  CHECK(target_rule_tp(TargetFormat::Marlin, qwen_down, 1, {}).empty());
  const std::string r4 = target_rule_tp(TargetFormat::Marlin, qwen_down, 4, {});
  INFO(r4);
  CHECK(contains(r4, "tensor parallel 4: group size 128 does not divide one rank's k = 7392"));
  CHECK(!target_rule_tp(TargetFormat::GptqV1, qwen_down, 2, {}).empty());
  CHECK(target_rule_tp(TargetFormat::Marlin, module("model.layers.0.mlp.down_proj", 28672, 8192, 128), 8, {}).empty());
  // Per-channel: no groups to keep whole, only the kernel's k % 128 on the part.
  const std::string pc = target_rule_tp(TargetFormat::Marlin, module("model.layers.0.mlp.down_proj", 29568, 8192, -1), 4, {});
  CHECK(contains(pc, "one rank's row-parallel part: k % 128 == 0 required"));
  CHECK(contains(pc, "k = 7392"));
  // A column-parallel part below the kernel's 64 columns.
  const std::string col = target_rule_tp(TargetFormat::Marlin, module("model.layers.0.self_attn.q_proj", 256, 256, 128), 8, {});
  CHECK(contains(col, "one rank's column-parallel part: n % 64 == 0 required"));
  // GPTQ packs 8 rows per word: the same part passes there.
  CHECK(target_rule_tp(TargetFormat::GptqV1, module("model.layers.0.self_attn.q_proj", 256, 256, 128), 8, {}).empty());
}
