// The CPU forward pass against transformers for every architecture calibration supports, on tiny random
// models written by tests/calib/make_arch_golden.py (transformers 5.17, committed under tests/data):
// Llama 3 RoPE scaling, Mistral's sliding window (8, shorter than the 24-token sequence), Qwen2's q/k/v
// biases, Qwen3's per-head q/k norms with head_dim != hidden / heads and tied embeddings, Gemma's (1 + w)
// norms, scaled embeddings and GeGLU with one KV head, Gemma 2's four norms per block, query_pre_attn_scalar,
// attention and final soft-caps and alternating sliding layers, Gemma 3's q/k norms, explicit layer_types
// and per-layer-type RoPE (local base for sliding layers, linear scaling on the global one). stories260K
// (test_forward.cpp) covers the plain Llama path on a trained model; tests/gpu/test_forward_cuda.cpp runs
// the GPU pass on the same fixtures.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/convert_dtype.h"
#include "checkpoint/error.h"
#include "checkpoint/half.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/writer.h"
#include "packer/adapters.h"
#include "quantizer/calib/llama.h"
#include "quantizer/calib/quantized_linears.h"
#include "quantizer/quantize_checkpoint.h"
#include "tests/calib/golden_compare.h"
#include "tests/common.h"

using namespace marlinc;
using namespace marlinc::calib;
using marlinc::test::golden_matrix;
using marlinc::test::rel_err;

namespace {

// max |ours - golden| / max |golden|: both fp32 over the same fp16-stored weights; what differs is the
// order of the sums (Eigen/OpenMP against PyTorch's CPU kernels).
constexpr double kArchRelTol = 1e-5;  // measured 3e-7 to 1e-6

std::filesystem::path golden_dir() { return std::filesystem::path(MARLINC_SOURCE_DIR) / "tests" / "data" / "arch-golden"; }

// Within fp32 rounding (Catch2 v2 and v3 spell Approx differently).
bool near(double a, double b) { return std::abs(a - b) <= 1e-6 * std::abs(b); }

struct Case {
  const char* dir;
  Family family;
};

// The sequences and transformers' outputs of a fixture.
struct Golden {
  SafetensorsFile file;
  std::vector<std::vector<int32_t>> tokens;  // seq0, seq1
};
Golden read_golden(const std::filesystem::path& dir) {
  Golden g{SafetensorsFile::open(dir / "golden.safetensors"), {}};
  for (int s = 0; s < 2; ++s) {
    const TensorInfo* ti = g.file.find("seq" + std::to_string(s) + ".tokens");
    REQUIRE(ti != nullptr);
    auto tv = g.file.view<int32_t>(*ti);
    g.tokens.emplace_back(tv.begin(), tv.end());
  }
  return g;
}

// Opens a copy of fixture `name` whose config.json has `edit` applied: the same weights under another
// configuration, to show that what the edit removes changes the logits.
calib::Matrix logits_with_config(const std::string& name, const std::function<void(nlohmann::json&)>& edit,
                                 const std::vector<int32_t>& tokens, test::TempDir& tmp) {
  const std::filesystem::path dir = golden_dir() / name;
  std::filesystem::copy_file(dir / "model.safetensors", tmp.path / "model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  edit(cfg);
  std::ofstream(tmp.path / "config.json") << cfg.dump();
  return LlamaModel::open(tmp.path).forward(tokens);
}

// LlamaConfig::from_json's error for a config, or "" when it accepts it.
std::string config_error(const nlohmann::json& cfg) {
  try {
    LlamaConfig::from_json(cfg, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("Llama 3 / Mistral / Qwen2 / Qwen3 / Gemma 1-3 / Phi-3 / Phi-4 / Granite / SmolLM3 forward passes match "
          "transformers' logits",
          "[forward]") {
  const Case cases[] = {{"llama3", Family::Llama}, {"mistral", Family::Mistral}, {"qwen2", Family::Qwen2},
                        {"qwen3", Family::Qwen3},  {"gemma", Family::Gemma},     {"gemma2", Family::Gemma2},
                        {"gemma3", Family::Gemma3}, {"phi3", Family::Phi3},      {"phi4", Family::Phi3},
                        {"granite", Family::Granite}, {"smollm3", Family::SmolLM3}};
  for (const Case& c : cases) {
    const std::filesystem::path dir = golden_dir() / c.dir;
    INFO(dir.string());
    auto model = LlamaModel::open(dir);
    const LlamaConfig& cfg = model.config();
    CHECK(cfg.family == c.family);
    CHECK(cfg.layers == (c.family == Family::Gemma3 || c.family == Family::SmolLM3 ? 3 : 2));
    if (c.family == Family::SmolLM3) CHECK(cfg.rope_layers == std::vector<bool>{true, false, true});
    // What each fixture is there to exercise, read back from its config.
    if (c.family == Family::Llama) CHECK(cfg.rope_scaling.type == "llama3");
    if (c.family == Family::Mistral) CHECK(cfg.sliding_window == 8);
    if (c.family == Family::Qwen3 || c.family == Family::Gemma3) {
      CHECK(cfg.qk_norm);
      CHECK(cfg.tie_embeddings);
      CHECK(cfg.head_dim * cfg.heads != cfg.hidden);
    }
    if (c.family == Family::Gemma) {
      CHECK(cfg.act == Activation::GeluTanh);
      CHECK(cfg.unit_offset_norms);
      CHECK(cfg.kv_heads == 1);
      CHECK(model.embed_scale() == 8.0f);  // sqrt(64)
    }
    if (c.family == Family::Gemma2) {
      CHECK(cfg.sandwich_norms);
      CHECK(cfg.attn_softcap == 2.0);
      CHECK(cfg.final_softcap == 3.0);
      CHECK(near(cfg.attn_scale, 1.0 / std::sqrt(24.0)));
      CHECK(cfg.layer_slides(0));
      CHECK_FALSE(cfg.layer_slides(1));
    }
    if (c.family == Family::Gemma3) {
      CHECK(cfg.sliding_layers == std::vector<bool>{true, false, true});
      CHECK(cfg.rope_scaling.type == "linear");
      CHECK(cfg.rope_theta == 1e6);
      CHECK(cfg.local_rope_theta == 1e4);
      CHECK(cfg.local_rope_scaling.type == "default");
      CHECK(cfg.attn_softcap == 0);
      CHECK(cfg.final_softcap == 0);
    }
    if (c.family == Family::Phi3) {
      CHECK(cfg.fused_linears);
      const bool phi3 = std::string(c.dir) == "phi3";
      CHECK(cfg.rotary_dim == (phi3 ? 8 : 16));  // partial_rotary_factor 0.5 of head_dim 16
      CHECK(cfg.rope_scaling.type == (phi3 ? "longrope" : "default"));
      CHECK(cfg.sliding_window == (phi3 ? 8 : 0));
      CHECK(cfg.tie_embeddings == !phi3);
      if (phi3) {
        CHECK(cfg.rope_scaling.original_max_position_embeddings == 16);
        CHECK(near(cfg.rope_scaling.attention_factor, std::sqrt(2.0)));  // factor 256 / 16: sqrt(1 + ln 16 / ln 16)
      }
    }
    if (c.family == Family::Granite) {
      CHECK((cfg.embedding_multiplier == 6.0 && model.embed_scale() == 6.0f && cfg.residual_multiplier == 0.4));
      CHECK((cfg.attn_scale == 0.1 && cfg.logits_scaling == 4.0 && cfg.tie_embeddings));
      CHECK(model.load_block(0).o_bias.size() == cfg.hidden);
    }
    Golden golden = read_golden(dir);
    for (int s = 0; s < 2; ++s) {
      const std::string p = "seq" + std::to_string(s) + ".";
      const std::vector<int32_t>& tokens = golden.tokens[size_t(s)];
      std::vector<Matrix> hidden;
      const Matrix logits = model.forward(tokens, nullptr, &hidden);
      REQUIRE(int64_t(hidden.size()) == cfg.layers);
      const double e_logits = rel_err(logits, golden_matrix(golden.file, p + "logits"));
      const double e_l0 = rel_err(hidden[0], golden_matrix(golden.file, p + "hidden_layer0"));
      INFO(p << " " << tokens.size() << " tokens: rel error logits " << e_logits << ", after layer 0 " << e_l0);
      CHECK(e_logits <= kArchRelTol);
      CHECK(e_l0 <= kArchRelTol);
    }
  }
}

TEST_CASE("The Mistral fixture's window is live: without it the logits differ", "[forward]") {
  // Guards the fixture itself: were the window wider than the sequence, the test above would not see it.
  const std::filesystem::path dir = golden_dir() / "mistral";
  auto model = LlamaModel::open(dir);
  auto golden = SafetensorsFile::open(dir / "golden.safetensors");
  const TensorInfo* ti = golden.find("seq0.tokens");
  REQUIRE(ti != nullptr);
  auto tv = golden.view<int32_t>(*ti);
  const std::vector<int32_t> tokens(tv.begin(), tv.end());
  REQUIRE(int64_t(tokens.size()) > model.config().sliding_window);
  // The same weights under a config without a window.
  test::TempDir tmp("mistral-nowindow");
  std::filesystem::copy_file(dir / "model.safetensors", tmp.path / "model.safetensors");
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  cfg["sliding_window"] = nullptr;
  std::ofstream(tmp.path / "config.json") << cfg.dump();
  auto wide = LlamaModel::open(tmp.path);
  REQUIRE(wide.config().sliding_window == 0);
  CHECK(rel_err(wide.forward(tokens), golden_matrix(golden, "seq0.logits")) > 100 * kArchRelTol);
}

TEST_CASE("Each Gemma / Phi-3 / Granite / SmolLM3 feature the fixtures exercise is live: without it the logits differ",
          "[forward]") {
  // Guards the fixtures: a feature whose effect vanished at these weights would pass unnoticed above.
  using Edit = std::function<void(nlohmann::json&)>;
  struct Off {
    const char* fixture;
    const char* what;
    Edit edit;
    int seq = 0;  // phi3: seq0 (24 tokens) takes longrope's long factors, seq1 (7) the short ones
  };
  const Off offs[] = {
      {"gemma", "silu instead of the tanh gelu", [](nlohmann::json& c) { c["hidden_act"] = "silu"; }},
      {"gemma2", "exact gelu instead of the tanh form", [](nlohmann::json& c) { c["hidden_activation"] = "gelu"; }},
      {"gemma2", "no attention soft-cap", [](nlohmann::json& c) { c["attn_logit_softcapping"] = nullptr; }},
      {"gemma2", "no final soft-cap", [](nlohmann::json& c) { c["final_logit_softcapping"] = nullptr; }},
      {"gemma2", "head_dim scaling", [](nlohmann::json& c) { c["query_pre_attn_scalar"] = 32; }},
      {"gemma2", "no sliding layer", [](nlohmann::json& c) { c["layer_types"] = {"full_attention", "full_attention"}; }},
      {"gemma3", "the global RoPE on sliding layers",
       [](nlohmann::json& c) { c["rope_parameters"]["sliding_attention"] = c["rope_parameters"]["full_attention"]; }},
      {"gemma3", "layer 2 global",
       [](nlohmann::json& c) { c["layer_types"] = {"sliding_attention", "full_attention", "full_attention"}; }},
      {"phi3", "the short factors past the original length",
       [](nlohmann::json& c) { c["rope_parameters"]["long_factor"] = c["rope_parameters"]["short_factor"]; }},
      {"phi3", "the long factors within the original length",
       [](nlohmann::json& c) { c["rope_parameters"]["short_factor"] = c["rope_parameters"]["long_factor"]; }, 1},
      {"phi3", "no attention factor", [](nlohmann::json& c) { c["rope_parameters"]["attention_factor"] = 1.0; }, 1},
      {"phi3", "no window", [](nlohmann::json& c) { c["sliding_window"] = nullptr; }},
      {"smollm3", "RoPE on the NoPE layer", [](nlohmann::json& c) { c["no_rope_layers"] = {1, 1, 1}; }},
      {"granite", "no embedding multiplier", [](nlohmann::json& c) { c["embedding_multiplier"] = 1.0; }},
      {"granite", "no residual multiplier", [](nlohmann::json& c) { c["residual_multiplier"] = 1.0; }},
      {"granite", "head_dim^-1/2 attention scaling", [](nlohmann::json& c) { c["attention_multiplier"] = 0.25; }},
      {"granite", "no logit scaling", [](nlohmann::json& c) { c["logits_scaling"] = 1.0; }},
      {"phi3", "plain RoPE over the whole head",
       [](nlohmann::json& c) {
         c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
         c.erase("partial_rotary_factor");
       }, 1},
  };
  for (const Off& o : offs) {
    INFO(o.fixture << ": " << o.what);
    Golden golden = read_golden(golden_dir() / o.fixture);
    test::TempDir tmp("gemma-off");
    const Matrix off = logits_with_config(o.fixture, o.edit, golden.tokens[size_t(o.seq)], tmp);
    // 10x the tolerance, 100x the errors measured with the feature on (exact gelu moves these logits least).
    CHECK(rel_err(off, golden_matrix(golden.file, "seq" + std::to_string(o.seq) + ".logits")) > 10 * kArchRelTol);
  }
}

TEST_CASE("Gemma configs: transformers 4 keys, defaults, and refusals by name", "[forward]") {
  nlohmann::json g3 = {{"architectures", {"Gemma3ForCausalLM"}}, {"hidden_size", 1152}, {"intermediate_size", 6912},
                       {"num_hidden_layers", 13}, {"num_attention_heads", 4}, {"num_key_value_heads", 1},
                       {"head_dim", 256}, {"vocab_size", 262144}, {"rope_theta", 1000000.0},
                       {"rope_local_base_freq", 10000.0}, {"rope_scaling", nullptr}, {"sliding_window", 512},
                       {"sliding_window_pattern", 6}, {"query_pre_attn_scalar", 256}};
  LlamaConfig c = LlamaConfig::from_json(g3, "g3/config.json");
  CHECK(c.family == Family::Gemma3);
  CHECK(c.tie_embeddings);  // Gemma's default
  CHECK(c.act == Activation::GeluTanh);
  CHECK(c.attn_softcap == 0);
  CHECK(c.local_rope_theta == 10000.0);
  CHECK(c.rope_theta == 1e6);
  for (int64_t i = 0; i < 13; ++i) CHECK(c.layer_slides(i) == ((i + 1) % 6 != 0));  // layers 5 and 11 global
  CHECK(rope_inv_freq(c, true)[1] != rope_inv_freq(c)[1]);
  g3["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};  // Gemma 3 4B+: the global layers only
  c = LlamaConfig::from_json(g3, "g3/config.json");
  CHECK(near(rope_inv_freq(c)[1], std::pow(1e6, -2.0 / 256) / 8));
  CHECK(near(rope_inv_freq(c, true)[1], std::pow(1e4, -2.0 / 256)));

  // transformers 5's per-layer-type form with sub-objects that leave keys out: the older top-level keys fill them.
  nlohmann::json g3v5 = g3;
  g3v5.erase("rope_theta");
  g3v5["rope_local_base_freq"] = 20000.0;
  g3v5["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
  g3v5["rope_parameters"] = {{"full_attention", {{"rope_theta", 500000.0}}}, {"sliding_attention", {{"rope_type", "default"}}}};
  c = LlamaConfig::from_json(g3v5, "g3v5/config.json");
  CHECK(c.rope_theta == 500000.0);
  CHECK(c.rope_scaling.type == "linear");
  CHECK(c.rope_scaling.factor == 4.0);
  CHECK(c.local_rope_theta == 20000.0);
  CHECK(c.local_rope_scaling.type == "default");

  // Gemma 1 reads hidden_act, "gelu" meaning the tanh form (transformers 5), before hidden_activation.
  nlohmann::json g1 = {{"architectures", {"GemmaForCausalLM"}}, {"hidden_size", 64}, {"intermediate_size", 96},
                       {"num_hidden_layers", 1}, {"num_attention_heads", 4}, {"num_key_value_heads", 1},
                       {"head_dim", 32}, {"vocab_size", 128}, {"hidden_act", "gelu"}, {"hidden_activation", nullptr}};
  CHECK(LlamaConfig::from_json(g1, "g1/config.json").act == Activation::GeluTanh);
  g1["hidden_act"] = "silu";
  g1["hidden_activation"] = "gelu";
  CHECK(LlamaConfig::from_json(g1, "g1/config.json").act == Activation::Silu);
  g1.erase("hidden_act");
  CHECK(LlamaConfig::from_json(g1, "g1/config.json").act == Activation::GeluTanh);

  nlohmann::json g2 = {{"model_type", "gemma2"}, {"hidden_size", 2304}, {"intermediate_size", 9216},
                       {"num_hidden_layers", 4}, {"num_attention_heads", 8}, {"num_key_value_heads", 4},
                       {"head_dim", 256}, {"vocab_size", 256000}};
  c = LlamaConfig::from_json(g2, "g2/config.json");
  CHECK(c.family == Family::Gemma2);
  CHECK(c.attn_softcap == 50.0);  // Gemma2Config's defaults where the keys are absent
  CHECK(c.final_softcap == 30.0);
  CHECK(c.sliding_window == 4096);
  CHECK(c.sliding_layers == std::vector<bool>{true, false, true, false});
  CHECK(near(c.attn_scale, 1.0 / 16.0));

  auto refused = [](nlohmann::json j, const std::string& why) {
    try {
      LlamaConfig::from_json(j, "m/config.json");
      FAIL("accepted: " << j.dump());
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find("m/config.json") != std::string::npos);
      CHECK(std::string(e.what()).find(why) != std::string::npos);
    }
  };
  nlohmann::json bad = g2;
  bad["layer_types"] = {"sliding_attention"};
  refused(bad, "'layer_types' must be a list of num_hidden_layers (4) strings");
  bad["layer_types"] = {"sliding_attention", "chunked_attention", "full_attention", "full_attention"};
  refused(bad, "layer_types[1] is 'chunked_attention'");
  bad = g2;
  bad["hidden_activation"] = "relu";
  refused(bad, "hidden_activation 'relu' is not supported (supported: silu, gelu_pytorch_tanh, gelu_new, gelu)");
  bad = g2;
  bad["use_bidirectional_attention"] = true;
  refused(bad, "use_bidirectional_attention is not supported");
  bad = g2;
  bad["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}}};
  refused(bad, "per-layer-type rope_parameters are supported for Gemma 3 only");
  bad = g3;
  bad["attn_logit_softcapping"] = -1;
  refused(bad, "'attn_logit_softcapping' must be a positive finite number");
  bad = g3;
  bad["architectures"] = {"Gemma3ForConditionalGeneration"};
  refused(bad, "architecture Gemma3ForConditionalGeneration is not supported");
}

TEST_CASE("Gemma's embedding scale is sqrt(hidden) in the embedding table's dtype", "[forward]") {
  // The fixtures' sqrt(64) = 8 is exact in every dtype; sqrt(2048) = 45.2548 is 45.25 in bf16 and 45.25 in
  // fp16 as well (transformers and vLLM multiply in the model dtype), 45.254834 in fp32.
  const int64_t hid = 2048, vocab = 4;
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    INFO(dtype_name(dt));
    test::TempDir tmp("gemma-scale");
    const nlohmann::json cfg = {{"architectures", {"GemmaForCausalLM"}}, {"hidden_size", hid}, {"intermediate_size", 2},
                                {"num_hidden_layers", 1}, {"num_attention_heads", 1}, {"num_key_value_heads", 1},
                                {"head_dim", 2}, {"vocab_size", vocab}};
    const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
        {"model.embed_tokens.weight", {vocab, hid}}, {"model.norm.weight", {hid}},
        {"model.layers.0.input_layernorm.weight", {hid}}, {"model.layers.0.post_attention_layernorm.weight", {hid}},
        {"model.layers.0.self_attn.q_proj.weight", {2, hid}}, {"model.layers.0.self_attn.k_proj.weight", {2, hid}},
        {"model.layers.0.self_attn.v_proj.weight", {2, hid}}, {"model.layers.0.self_attn.o_proj.weight", {hid, 2}},
        {"model.layers.0.mlp.gate_proj.weight", {2, hid}}, {"model.layers.0.mlp.up_proj.weight", {2, hid}},
        {"model.layers.0.mlp.down_proj.weight", {hid, 2}}};
    std::vector<TensorSpec> plan;
    for (const auto& [name, shape] : shapes) plan.push_back({name, dt, shape});
    {
      CheckpointWriter w(tmp.path / "m", plan);
      for (const auto& [name, shape] : shapes) {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        std::vector<uint8_t> bytes(size_t(n) * dtype_size(dt), 0);
        if (name == "model.embed_tokens.weight")  // every weight 1.0: embed() returns the scale itself
          for (int64_t i = 0; i < n; ++i) {
            if (dt == DType::F32) { const float one = 1.0f; std::memcpy(bytes.data() + 4 * i, &one, 4); }
            else { const uint16_t one = dt == DType::BF16 ? float_to_bf16(1.0f) : float_to_half(1.0f); std::memcpy(bytes.data() + 2 * i, &one, 2); }
          }
        w.write(name, bytes);
      }
      w.add_file("config.json", cfg.dump());
      w.commit();
    }
    const LlamaModel m = LlamaModel::open(tmp.path / "m");
    const float want = dt == DType::F32 ? float(std::sqrt(2048.0)) : 45.25f;
    CHECK(m.embed_scale() == want);
    const std::vector<int32_t> tok = {2};
    CHECK(m.embed(tok)(0, 7) == want);
  }
}

TEST_CASE("Phi-3: fused modules' rows, transformers 4 config keys, and refusals by name", "[forward]") {
  const LlamaModel m = LlamaModel::open(golden_dir() / "phi3");
  const LlamaConfig& c = m.config();
  // qkv_proj [q 64 | k 32 | v 32, 64] and gate_up_proj [gate 96 | up 96, 64]; the others are whole.
  const LinearSource q = linear_source(c, 1, Linear::Q), k = linear_source(c, 1, Linear::K),
                     v = linear_source(c, 1, Linear::V), up = linear_source(c, 1, Linear::Up),
                     o = linear_source(c, 1, Linear::O);
  CHECK(q.prefix == "model.layers.1.self_attn.qkv_proj");
  CHECK((q.row0 == 0 && q.rows == 64 && k.row0 == 64 && k.rows == 32 && v.row0 == 96 && v.rows == 32));
  CHECK((q.total_rows == 128 && q.in == 64 && q.fused()));
  CHECK((up.prefix == "model.layers.1.mlp.gate_up_proj" && up.row0 == 96 && up.rows == 96 && up.total_rows == 192));
  CHECK((o.prefix == "model.layers.1.self_attn.o_proj" && !o.fused()));
  // A block's q/k/v are the rows of the checkpoint's qkv_proj.
  const BlockWeights w = m.load_block(1);
  const auto ref = m.checkpoint().at("model.layers.1.self_attn.qkv_proj.weight");
  const std::vector<float> all = to_float(ref.file->data(*ref.info), ref.info->dtype);  // [128, 64]
  CHECK(w.k(5, 7) == all[size_t((64 + 5) * 64 + 7)]);
  CHECK(w.v(31, 63) == all[size_t((96 + 31) * 64 + 63)]);

  // transformers 4 wrote rope_scaling {type: longrope} and partial_rotary_factor at the top level ("su" is
  // its older name): the same RoPE.
  nlohmann::json v4 = m.checkpoint().config();
  const nlohmann::json rp = v4["rope_parameters"];
  v4.erase("rope_parameters");
  v4["rope_theta"] = 10000.0;
  for (const char* type : {"longrope", "su"}) {
    INFO(type);
    v4["rope_scaling"] = {{"type", type}, {"short_factor", rp["short_factor"]}, {"long_factor", rp["long_factor"]}};
    const LlamaConfig c4 = LlamaConfig::from_json(v4, "v4");
    CHECK(c4.rotary_dim == 8);
    CHECK(rope_inv_freq(c4) == rope_inv_freq(c));
    CHECK(rope_inv_freq(c4, false, true) == rope_inv_freq(c, false, true));
    CHECK(c4.rope_scaling.attention_factor == c.rope_scaling.attention_factor);
  }
  CHECK(rope_inv_freq(c)[3] == 1.0f / (2.2f * 1000.0f));  // 1 / (short_factor · theta^(6/8))
  CHECK(rope_inv_freq(c, false, true)[3] == 1.0f / (9.0f * 1000.0f));
  CHECK_FALSE(rope_long(c, 16));
  CHECK(rope_long(c, 17));

  // Phi3Config's precedence and defaults: the top-level original length (default 4096) wins over the rope
  // parameters' own; an empty rope_scaling falls through to rope_parameters.
  nlohmann::json no_top = m.checkpoint().config();
  no_top.erase("original_max_position_embeddings");
  const LlamaConfig ct = LlamaConfig::from_json(no_top, "cfg");
  CHECK(ct.rope_scaling.original_max_position_embeddings == 4096);
  CHECK(ct.rope_scaling.attention_factor == 1.0);  // max 256 / 4096 <= 1
  nlohmann::json empty_rs = m.checkpoint().config();
  empty_rs["rope_scaling"] = nlohmann::json::object();
  CHECK(LlamaConfig::from_json(empty_rs, "cfg").rope_scaling.type == "longrope");
  // Phi-3-mini-4k-instruct's config.json (transformers 4): plain RoPE, a window, no rope_scaling.
  const nlohmann::json mini = {{"architectures", {"Phi3ForCausalLM"}}, {"hidden_size", 3072}, {"intermediate_size", 8192},
                               {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"num_key_value_heads", 32},
                               {"vocab_size", 32064}, {"rope_scaling", nullptr}, {"rope_theta", 10000.0},
                               {"sliding_window", 2047}, {"original_max_position_embeddings", 4096},
                               {"max_position_embeddings", 4096}, {"rms_norm_eps", 1e-5}};
  const LlamaConfig cm = LlamaConfig::from_json(mini, "mini");
  CHECK((cm.rope_scaling.type == "default" && cm.rotary_dim == 96 && cm.sliding_window == 2047 && cm.fused_linears));
  nlohmann::json bare = mini;  // absent keys take Phi3Config's defaults
  bare.erase("rms_norm_eps");
  bare.erase("max_position_embeddings");
  const LlamaConfig cb = LlamaConfig::from_json(bare, "bare");
  CHECK((cb.rms_eps == 1e-5 && cb.max_position_embeddings == 4096));

  nlohmann::json bad = m.checkpoint().config();
  bad["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 10000.0}};
  CHECK(config_error(bad).find("rope type 'linear' is not supported for Phi3ForCausalLM (supported: default, longrope)") !=
        std::string::npos);
  bad = m.checkpoint().config();
  bad["rope_parameters"]["short_factor"] = {1.0, 2.0};
  CHECK(config_error(bad).find("longrope 'short_factor' must be a list of rotary_dim / 2 = 4 numbers") != std::string::npos);
  bad = m.checkpoint().config();
  bad["partial_rotary_factor"] = 0.3;  // 16 x 0.3 = 4.8 -> 4 dims: the factor lists no longer fit
  bad["rope_parameters"].erase("partial_rotary_factor");
  CHECK(config_error(bad).find("rotary_dim / 2 = 2") != std::string::npos);
  bad["partial_rotary_factor"] = 0.1;  // 1 dim
  CHECK(config_error(bad).find("an even number >= 2 is needed") != std::string::npos);
  bad = m.checkpoint().config();
  bad["architectures"] = {"LlamaForCausalLM"};
  CHECK(config_error(bad).find("rope type 'longrope' is supported for Phi3ForCausalLM only") != std::string::npos);
}

TEST_CASE("Phi-3: a quantized checkpoint's fused modules give each linear its own rows", "[forward]") {
  // RTN of the fixture to GPTQ's format: QuantizedLinears hands out q/k/v and gate/up as rows of the one
  // qkv_proj / gate_up_proj module, each the dequantized rows of the stored module and close to the original.
  test::TempDir tmp("phi3-q");
  QuantizeOptions o;
  o.to = TargetFormat::GptqV1;
  o.group_size = 32;
  quantize_checkpoint(golden_dir() / "phi3", tmp.path / "q", o);
  const LlamaModel qm = LlamaModel::open(tmp.path / "q", /*quantized_linears=*/true);
  const QuantizedLinears ql(qm.checkpoint(), qm.config());
  const LlamaModel plain = LlamaModel::open(golden_dir() / "phi3");
  const BlockWeights orig = plain.load_block(1);
  const QuantizedLinear qkv =
      read_module(qm.checkpoint(), describe_module(qm.checkpoint(), "model.layers.1.self_attn.qkv_proj", ql.format()),
                  ql.format());
  REQUIRE(qkv.n == 128);
  const std::vector<float> all = dequantize(qkv);  // [k 64, n 128]
  for (Linear l : {Linear::Q, Linear::K, Linear::V, Linear::Gate, Linear::Up}) {
    INFO("linear " << int(l));
    const std::optional<Matrix> w = ql.weight(1, l);
    REQUIRE(w.has_value());
    const LinearSource s = linear_source(qm.config(), 1, l);
    REQUIRE(w->rows() == s.rows);
    if (s.prefix == qkv.name) {  // exactly the stored module's rows
      bool same = true;
      for (int64_t r = 0; r < s.rows; ++r)
        for (int64_t c = 0; c < s.in; ++c) same = same && (*w)(r, c) == all[size_t(c * qkv.n + s.row0 + r)];
      CHECK(same);
    }
    const double e = rel_err(*w, orig.weight(l));
    CHECK(e < 0.25);  // 4-bit RTN: about 0.1; another part's rows would be about 1.4
  }
}

TEST_CASE("SmolLM3 configs: the NoPE interval by default, and refusals by name", "[forward]") {
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(golden_dir() / "smollm3" / "config.json"));
  cfg.erase("no_rope_layers");  // SmolLM3Config's default: one NoPE layer every no_rope_layer_interval (4)
  cfg["num_hidden_layers"] = 8;
  CHECK(LlamaConfig::from_json(cfg, "c").rope_layers == std::vector<bool>{true, true, true, false, true, true, true, false});
  cfg["no_rope_layer_interval"] = 2;
  const LlamaConfig c2 = LlamaConfig::from_json(cfg, "c");
  CHECK((!c2.layer_rope(1) && c2.layer_rope(2) && !c2.layer_rope(7)));
  nlohmann::json bad = cfg;
  bad["no_rope_layers"] = {1, 0};
  CHECK(config_error(bad).find("'no_rope_layers' must be a list of num_hidden_layers (8) 0/1 values") != std::string::npos);
  bad["no_rope_layers"] = {1, 0, 1, 2, 1, 1, 1, 1};
  CHECK(config_error(bad).find("no_rope_layers[3] must be 0 (no RoPE) or 1 (RoPE)") != std::string::npos);
  bad = cfg;
  bad["use_sliding_window"] = true;
  CHECK(config_error(bad).find("use_sliding_window is not supported for SmolLM3") != std::string::npos);
}
