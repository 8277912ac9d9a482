// The config `quantize` writes names every linear it leaves unquantized, so loaders do not expect
// quantized tensors there: compressed-tensors `ignore`, GPTQ `dynamic` "-:" rules, AWQ
// `modules_to_not_convert`.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "checkpoint/checkpoint.h"
#include "checkpoint/error.h"
#include "checkpoint/half.h"
#include "checkpoint/writer.h"
#include "packer/adapters.h"
#include "quantizer/quantize_checkpoint.h"
#include "tests/common.h"
#include "tests/quantizer/bf16_sample.h"

using namespace marlinc;
namespace fs = std::filesystem;

TEST_CASE("quantize lists lm_head and --skip layers as unquantized in the target's config", "[quantizer][config]") {
  const fs::path model = fs::path(MARLINC_SOURCE_DIR) / "data" / "sample" / "model";
  test::TempDir td("qcfg");
  QuantizeOptions o;
  o.skip = {"down_proj"};
  const std::vector<std::string> down = {"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"};

  o.to = TargetFormat::CompressedTensors;
  quantize_checkpoint(model, td.path / "ct", o);
  const auto ct = Checkpoint::open(td.path / "ct").config().at("quantization_config");
  CHECK(ct.at("ignore") == nlohmann::json({"lm_head", down[0], down[1]}));

  o.to = TargetFormat::GptqV1;
  quantize_checkpoint(model, td.path / "gptq", o);
  const auto gq = Checkpoint::open(td.path / "gptq").quantize_config();
  REQUIRE(gq.contains("dynamic"));
  CHECK(gq.at("dynamic").size() == 2);
  for (const auto& p : down) {
    std::string rx = "-:^";
    for (char c : p) rx += c == '.' ? std::string("\\.") : std::string(1, c);
    CHECK(gq.at("dynamic").contains(rx + "$"));
  }

  o.to = TargetFormat::Awq;
  quantize_checkpoint(model, td.path / "awq", o);
  const auto aq = Checkpoint::open(td.path / "awq").config().at("quantization_config");
  CHECK(aq.at("modules_to_not_convert") == nlohmann::json({"lm_head", down[0], down[1]}));
}

TEST_CASE("include_lm_head quantizes lm_head, never the embeddings, and GPTQ configs say lm_head", "[quantizer][config]") {
  const fs::path model = fs::path(MARLINC_SOURCE_DIR) / "data" / "sample" / "model";
  test::TempDir td("qhead");
  QuantizeOptions o;
  o.to = TargetFormat::GptqV1;
  quantize_checkpoint(model, td.path / "plain_head", o);
  CHECK(Checkpoint::open(td.path / "plain_head").quantize_config().at("lm_head") == false);
  o.include_lm_head = true;
  quantize_checkpoint(model, td.path / "head", o);
  Checkpoint ck = Checkpoint::open(td.path / "head");
  CHECK(ck.contains("lm_head.qweight"));
  CHECK(ck.contains("model.embed_tokens.weight"));  // nn.Embedding: no loader reads it quantized
  CHECK_FALSE(ck.contains("model.embed_tokens.qweight"));
  CHECK(ck.quantize_config().at("lm_head") == true);
}

TEST_CASE("a tied lm_head (no lm_head tensor) is named in compressed-tensors ignore", "[quantizer][config]") {
  const fs::path model = fs::path(MARLINC_SOURCE_DIR) / "data" / "sample" / "model";
  test::TempDir td("qtied");
  {  // the sample without lm_head.weight, tie_word_embeddings on
    Checkpoint src = Checkpoint::open(model);
    std::vector<TensorSpec> plan;
    for (const auto& name : src.tensor_names())
      if (name != "lm_head.weight") plan.push_back({name, src.at(name).info->dtype, src.at(name).info->shape});
    CheckpointWriter w(td.path / "tied", plan);
    for (const auto& s : plan) w.write(s.name, src.data(s.name));
    nlohmann::json cfg = src.config();
    cfg["tie_word_embeddings"] = true;
    w.add_file("config.json", cfg.dump(2));
    w.commit();
  }
  QuantizeOptions o;
  o.to = TargetFormat::CompressedTensors;
  quantize_checkpoint(td.path / "tied", td.path / "ct", o);
  CHECK(Checkpoint::open(td.path / "ct").config().at("quantization_config").at("ignore") == nlohmann::json({"lm_head"}));
}

TEST_CASE("group sizes and skipped layers the target cannot take are refused before any work", "[quantizer][config]") {
  const fs::path model = fs::path(MARLINC_SOURCE_DIR) / "data" / "sample" / "model";
  Checkpoint ck = Checkpoint::open(model);
  auto refusal = [&](TargetFormat to, int group, std::vector<std::string> skip) {
    QuantizeOptions o;
    o.to = to;
    o.group_size = group;
    o.skip = std::move(skip);
    QuantizeReport rep;
    try {
      plan_quantization(ck, o, rep);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::BadUsage);
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(refusal(TargetFormat::GptqV1, 0, {}).find("--group 0: expected -1 (per channel) or a positive size") == 0);
  CHECK(refusal(TargetFormat::GptqV1, -2, {}).find("--group -2") == 0);
  CHECK(refusal(TargetFormat::Marlin, 256, {}).find("--group 256: Marlin kernels take -1, 32, 64 or 128") == 0);
  CHECK(refusal(TargetFormat::Marlin24, 64, {}).find("--group 64: Sparse-Marlin kernels take -1 or 128") == 0);
  CHECK(refusal(TargetFormat::GptqV1, 256, {}).empty());  // GPTQ takes any group dividing k
  const std::string m24 = refusal(TargetFormat::Marlin24, 128, {"o_proj"});
  CHECK(m24.find("marlin_24 checkpoints cannot keep linear layers unquantized") != std::string::npos);
  CHECK(m24.find("model.layers.0.self_attn.o_proj") != std::string::npos);
  CHECK(refusal(TargetFormat::Marlin24, 128, {}).empty());  // lm_head and embeddings stay outside the scheme
}

TEST_CASE("act-order outputs store g_idx in every module and their configs say so", "[quantizer][config]") {
  const fs::path model = fs::path(MARLINC_SOURCE_DIR) / "data" / "sample" / "model";
  test::TempDir td("qact");
  QuantizeOptions o;
  o.act_order = true;  // what GPTQ --order dynamic sets; RTN's g_idx is trivial, the layout the same
  o.to = TargetFormat::CompressedTensors;
  quantize_checkpoint(model, td.path / "ct", o);
  Checkpoint ct = Checkpoint::open(td.path / "ct");
  CHECK(ct.contains("model.layers.1.mlp.down_proj.weight_g_idx"));
  CHECK(ct.config().at("quantization_config").at("config_groups").at("group_0").at("weights").at("actorder") == "group");
  o.to = TargetFormat::GptqV2;
  quantize_checkpoint(model, td.path / "gptq", o);
  CHECK(Checkpoint::open(td.path / "gptq").quantize_config().at("desc_act") == true);
}

TEST_CASE("quantize --tp: layers whose part on one GPU breaks the target's rules stay unquantized, named", "[quantizer][config]") {
  // The sample: o_proj k = 256 and down_proj k = 768 leave 64 and 192 rows per rank at tp 4, not whole
  // groups of 128; q/k/v/gate/up split along n into parts Marlin still takes.
  const fs::path model = fs::path(MARLINC_SOURCE_DIR) / "data" / "sample" / "model";
  test::TempDir td("qtp");
  QuantizeOptions o;
  o.tp = 4;
  const QuantizeReport rep = quantize_checkpoint(model, td.path / "m", o);
  CHECK(rep.layers.size() == 10);
  int named = 0;
  for (const auto& [name, why] : rep.skipped) {
    if (name.find("o_proj") == std::string::npos && name.find("down_proj") == std::string::npos) continue;
    INFO(name << ": " << why);
    CHECK(why.find("tensor parallel 4: group size 128 does not divide one rank's k = ") == 0);
    ++named;
  }
  CHECK(named == 4);
  const Checkpoint out = Checkpoint::open(td.path / "m");
  CHECK(out.contains("model.layers.0.mlp.down_proj.weight"));  // kept in the model's dtype
  CHECK(out.contains("model.layers.0.mlp.gate_proj.B"));
  // tp 1 (the default) quantizes every decoder linear, and tp 0 is refused.
  QuantizeOptions one;
  CHECK(quantize_checkpoint(model, td.path / "m1", one).layers.size() == 14);
  QuantizeOptions zero;
  zero.tp = 0;
  CHECK_THROWS_WITH(quantize_checkpoint(model, td.path / "m0", zero), Catch::Contains("--tp 0"));
  CHECK_FALSE(fs::exists(td.path / "m0"));
}


TEST_CASE("a bf16 model's outputs hold bf16 scales its codes were chosen for, marlin24 fp16", "[quantizer][config]") {
  test::TempDir td("qbf16");
  test::write_bf16_sample(td.path / "model");
  for (TargetFormat to : {TargetFormat::Marlin, TargetFormat::GptqV1, TargetFormat::CompressedTensors}) {
    QuantizeOptions o;
    o.to = to;
    o.bits = to == TargetFormat::GptqV1 ? 8 : 4;
    const fs::path out = td.path / ("out-" + target_name(to));
    const QuantizeReport rep = quantize_checkpoint(td.path / "model", out, o);
    REQUIRE(!rep.layers.empty());
    const Checkpoint ck = Checkpoint::open(out);
    const FormatInfo fi = detect_format(ck);
    const Checkpoint model = Checkpoint::open(td.path / "model");
    for (const auto& L : rep.layers) {
      INFO(target_name(to) << " " << L.name);
      const QuantizedLinear q = read_module(ck, describe_module(ck, L.name, fi), fi);
      CHECK(q.scale_type == ScaleType::BF16);
      // The report describes the stored weights: the error recomputed from the file is the same.
      const auto r = model.at(L.name + ".weight");
      const std::vector<float> W = to_float(r.file->data(*r.info), r.info->dtype);  // [n, k]
      const std::vector<float> Wq = dequantize(q);                                   // [k, n]
      double d = 0, nw = 0;
      for (int64_t row = 0; row < q.n; ++row)
        for (int64_t c = 0; c < q.k; ++c) {
          const double w = W[size_t(row * q.k + c)], e = double(Wq[size_t(c * q.n + row)]) - w;
          d += e * e, nw += w * w;
        }
      CHECK(std::fabs(std::sqrt(d / nw) - L.rel_weight_err) <= 1e-6 * L.rel_weight_err);
    }
  }
  // Sparse-Marlin kernels take fp16 scales only: its grid stays fp16 for a bf16 model (GPTQ + 2:4 runs it;
  // tests/cli/test_quantize_gptq.cpp covers that path end to end).
  QuantJob job;
  job.desc.scale_type = ScaleType::BF16;
  QuantizeOptions o24;
  o24.to = TargetFormat::Marlin24;
  CHECK_FALSE(grid_bf16(o24, job));
  o24.to = TargetFormat::Awq;
  CHECK(grid_bf16(o24, job));
  job.desc.scale_type = ScaleType::F16;
  CHECK_FALSE(grid_bf16(o24, job));
}

TEST_CASE("mixture-of-experts routers are recognised by their names beside experts", "[quantizer][config]") {
  const std::set<std::string> parents = moe_expert_parents({"model.layers.0.mlp.experts.3.down_proj.weight",
                                                            "model.layers.1.block_sparse_moe.experts.0.w1.weight",
                                                            "model.layers.2.mlp.gate_proj.weight"});
  CHECK(parents == std::set<std::string>{"model.layers.0.mlp", "model.layers.1.block_sparse_moe"});
  CHECK(is_moe_router("model.layers.0.mlp.gate", parents));                 // Qwen2/3-MoE, DeepSeek, OLMoE
  CHECK(is_moe_router("model.layers.1.block_sparse_moe.gate", parents));    // Mixtral
  CHECK(is_moe_router("model.layers.0.mlp.shared_expert_gate", parents));   // Qwen2-MoE
  CHECK(is_moe_router("model.layers.0.mlp.gate.wg", parents));              // Hunyuan
  CHECK(is_moe_router("model.layers.5.feed_forward.router", parents));      // Llama 4, Jamba, gpt-oss
  CHECK(is_moe_router("model.layers.5.block_sparse_moe.router.layer", parents));  // Granite-MoE
  CHECK_FALSE(is_moe_router("model.layers.2.mlp.gate", parents));           // a dense block's `gate`
  CHECK_FALSE(is_moe_router("model.layers.2.mlp.gate.wg", parents));
  CHECK_FALSE(is_moe_router("model.layers.0.mlp.experts.3.gate_proj", parents));
  CHECK_FALSE(is_moe_router("model.layers.0.mlp.gate_proj", parents));
  CHECK_FALSE(is_moe_router("gate", parents));
}

TEST_CASE("quantize keeps mixture-of-experts routers in 16 bits and names them in the config", "[quantizer][config]") {
  // A one-block Qwen3-MoE-shaped model with 64 experts' router (n = 64 passes every Marlin rule), two of the
  // experts, a shared expert gate, and a dense block whose MLP linear happens to be called `gate`.
  test::TempDir td("qmoe");
  const int64_t h = 128;
  std::vector<TensorSpec> plan;
  auto add = [&](const std::string& name, int64_t n, int64_t k) { plan.push_back({name, DType::F16, {n, k}}); };
  const std::string moe = "model.layers.0.mlp.", dense = "model.layers.1.mlp.";
  add(moe + "gate.weight", 64, h);
  add(moe + "shared_expert_gate.weight", 1, h);
  for (int e = 0; e < 2; ++e)
    for (const char* l : {"gate_proj", "up_proj", "down_proj"}) add(moe + "experts." + std::to_string(e) + "." + l + ".weight", h, h);
  add(dense + "gate.weight", h, h);
  {
    CheckpointWriter w(td.path / "model", plan);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 0.05f);
    for (const auto& s : plan) {
      std::vector<uint16_t> v(size_t(s.shape[0] * s.shape[1]));
      for (auto& x : v) x = float_to_half(nd(rng));
      w.write(s.name, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * 2));
    }
    w.add_file("config.json", nlohmann::json{{"architectures", {"Qwen3MoeForCausalLM"}}, {"num_experts", 64}}.dump(2));
    w.commit();
  }
  for (TargetFormat to : {TargetFormat::Marlin, TargetFormat::GptqV1, TargetFormat::CompressedTensors}) {
    INFO(target_name(to));
    QuantizeOptions o;
    o.to = to;
    const fs::path out = td.path / ("out-" + target_name(to));
    const QuantizeReport rep = quantize_checkpoint(td.path / "model", out, o);
    CHECK(rep.layers.size() == 7);  // six expert linears and the dense block's `gate`
    std::map<std::string, std::string> why(rep.skipped.begin(), rep.skipped.end());
    CHECK(why[moe + "gate"].find("mixture-of-experts routers stay unquantized") == 0);
    CHECK(why[moe + "shared_expert_gate"].find("mixture-of-experts routers stay unquantized") == 0);
    const Checkpoint ck = Checkpoint::open(out);
    CHECK(ck.at(moe + "gate.weight").info->dtype == DType::F16);
    CHECK_FALSE(ck.contains(moe + "gate.qweight"));
    if (to == TargetFormat::CompressedTensors) {
      const nlohmann::json ignore = ck.config().at("quantization_config").at("ignore");
      CHECK(std::find(ignore.begin(), ignore.end(), moe + "gate") != ignore.end());
      CHECK(std::find(ignore.begin(), ignore.end(), moe + "shared_expert_gate") != ignore.end());
    }
    if (to == TargetFormat::GptqV1) CHECK(ck.quantize_config().at("dynamic").contains("-:^model\\.layers\\.0\\.mlp\\.gate$"));
  }
}
