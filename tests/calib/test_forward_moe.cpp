// The mixture-of-experts forward pass (quantizer/calib/moe_forward.cpp) against transformers 5.17 on the
// tiny Mixtral, Qwen2-MoE and Qwen3-MoE fixtures of tests/calib/make_arch_golden.py; the routing rule on
// its own; what each expert's Hessian hook sees and the CPU pass's per-expert Hessians; MoE config keys and
// their refusals; quantized experts read back.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/error.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/writer.h"
#include "packer/quantized_linear.h"
#include "quantizer/calib/calib_pass.h"
#include "quantizer/calib/llama.h"
#include "quantizer/calib/quantized_linears.h"
#include "quantizer/quantize_checkpoint.h"
#include "tests/calib/expert_checks.h"
#include "tests/calib/golden_compare.h"
#include "tests/common.h"

using namespace marlinc;
using namespace marlinc::calib;
using marlinc::test::golden_matrix;
using marlinc::test::rel_err;

namespace {

constexpr double kArchRelTol = 1e-5;  // as test_forward_arch.cpp: fp32 against fp32, sums in another order

std::filesystem::path fixture(const char* name) {
  return std::filesystem::path(MARLINC_SOURCE_DIR) / "tests" / "data" / "arch-golden" / name;
}

std::vector<int32_t> golden_tokens(const SafetensorsFile& g, int s) {
  const TensorInfo* ti = g.find("seq" + std::to_string(s) + ".tokens");
  REQUIRE(ti != nullptr);
  auto tv = g.view<int32_t>(*ti);
  return {tv.begin(), tv.end()};
}

// A fixture's config.json with `edit` applied, parsed.
LlamaConfig edited_config(const char* name, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(fixture(name) / "config.json"));
  edit(cfg);
  return LlamaConfig::from_json(cfg, "config.json");
}

std::string config_error(const char* name, const std::function<void(nlohmann::json&)>& edit) {
  try {
    edited_config(name, edit);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

// The fixture's model under an edited config (same weights).
Matrix logits_with_config(const char* name, const std::function<void(nlohmann::json&)>& edit,
                          const std::vector<int32_t>& tokens, test::TempDir& tmp) {
  std::filesystem::copy_file(fixture(name) / "model.safetensors", tmp.path / "model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(fixture(name) / "config.json"));
  edit(cfg);
  std::ofstream(tmp.path / "config.json") << cfg.dump();
  return LlamaModel::open(tmp.path).forward(tokens);
}

}  // namespace

TEST_CASE("Mixtral / Qwen2-MoE / Qwen3-MoE forward passes match transformers' logits", "[forward][moe]") {
  struct Case {
    const char* dir;
    Family family;
    int64_t experts, top_k, expert_inter, shared;
    bool norm;
    std::vector<bool> layers;
  };
  const Case cases[] = {{"mixtral", Family::Mixtral, 4, 2, 64, 0, true, {true, true}},
                        {"qwen2_moe", Family::Qwen2Moe, 4, 2, 32, 64, false, {true, false}},
                        {"qwen3_moe", Family::Qwen3Moe, 8, 2, 32, 0, true, {true, true}}};
  for (const Case& c : cases) {
    INFO(c.dir);
    const LlamaModel model = LlamaModel::open(fixture(c.dir));
    const LlamaConfig& cfg = model.config();
    CHECK(cfg.family == c.family);
    CHECK(cfg.moe.experts == c.experts);
    CHECK(cfg.moe.top_k == c.top_k);
    CHECK(cfg.moe.expert_intermediate == c.expert_inter);
    CHECK(cfg.moe.shared_intermediate == c.shared);
    CHECK(cfg.moe.norm_topk == c.norm);
    CHECK(cfg.moe.layers == c.layers);
    CHECK(cfg.qk_norm == (c.family == Family::Qwen3Moe));
    const BlockWeights b0 = model.load_block(0);
    CHECK(b0.moe);
    CHECK(int64_t(b0.experts.size()) == c.experts);
    CHECK(b0.router.rows() == c.experts);
    CHECK(b0.shared_gate.size() == (c.shared ? cfg.hidden : 0));
    if (c.family == Family::Qwen2Moe) {
      CHECK(b0.q_bias.size() == cfg.heads * cfg.head_dim);  // qkv_bias
      CHECK_FALSE(model.load_block(1).moe);                 // mlp_only_layers [1]: the dense MLP
      CHECK(model.load_block(1).down.cols() == cfg.intermediate);
    }
    const SafetensorsFile golden = SafetensorsFile::open(fixture(c.dir) / "golden.safetensors");
    for (int s = 0; s < 2; ++s) {
      const std::string p = "seq" + std::to_string(s) + ".";
      const std::vector<int32_t> tokens = golden_tokens(golden, s);
      std::vector<Matrix> hidden;
      const Matrix logits = model.forward(tokens, nullptr, &hidden);
      const double e_logits = rel_err(logits, golden_matrix(golden, p + "logits"));
      const double e_l0 = rel_err(hidden[0], golden_matrix(golden, p + "hidden_layer0"));
      INFO(p << " " << tokens.size() << " tokens: rel error logits " << e_logits << ", after layer 0 " << e_l0);
      CHECK(e_logits <= kArchRelTol);
      CHECK(e_l0 <= kArchRelTol);
    }
  }
}

TEST_CASE("The MoE fixtures' routing is live: other top-k rules give other logits", "[forward][moe]") {
  // Guards the fixtures: were one expert to win every token, or the weights not matter, the test above
  // would pass with a wrong router.
  using Edit = std::function<void(nlohmann::json&)>;
  const std::pair<const char*, Edit> offs[] = {
      {"mixtral", [](nlohmann::json& c) { c["num_experts_per_tok"] = 1; }},
      {"mixtral", [](nlohmann::json& c) { c["num_experts_per_tok"] = 3; }},
      {"qwen2_moe", [](nlohmann::json& c) { c["norm_topk_prob"] = true; }},
      {"qwen3_moe", [](nlohmann::json& c) { c["norm_topk_prob"] = false; }},
      {"qwen3_moe", [](nlohmann::json& c) { c["num_experts_per_tok"] = 4; }},
  };
  for (const auto& [name, edit] : offs) {
    INFO(name << " " << config_error(name, edit));
    const SafetensorsFile golden = SafetensorsFile::open(fixture(name) / "golden.safetensors");
    test::TempDir tmp("moe-off");
    const Matrix off = logits_with_config(name, edit, golden_tokens(golden, 0), tmp);
    CHECK(rel_err(off, golden_matrix(golden, "seq0.logits")) > 10 * kArchRelTol);
  }
}

TEST_CASE("route_tokens: top-k by softmax probability, ties to the lower expert, renormalised on request",
          "[forward][moe]") {
  LlamaConfig c;
  c.moe.experts = 4;
  c.moe.top_k = 2;
  Matrix router = Matrix::Zero(4, 2);  // [E, hidden]
  router << 1, 0,   // expert 0 scores x0
            0, 1,   // expert 1 scores x1
            0, 1,   // expert 2 ties with expert 1
            -1, 0;  // expert 3
  Matrix x(2, 2);
  x << 0.0f, 2.0f,   // token 0: experts 1 and 2 tie at the top
      3.0f, -1.0f;   // token 1: expert 0 first; then 1, 2 tie below it (logit -1) above expert 3 (-3)
  for (bool norm : {false, true}) {
    c.moe.norm_topk = norm;
    const Routing r = route_tokens(c, router, x);
    REQUIRE(r.expert.size() == 4);
    CHECK(r.expert == std::vector<int32_t>{1, 2, 0, 1});
    // Softmax of token 0's logits {0, 2, 2, 0}: e^2 / (2 + 2e^2) each for experts 1 and 2.
    const double e2 = std::exp(2.0), p = e2 / (2 + 2 * e2);
    CHECK(std::abs(r.weight[0] - (norm ? 0.5 : p)) < 1e-6);
    CHECK(r.weight[0] == r.weight[1]);
    CHECK(r.weight[2] > r.weight[3]);
    if (norm) CHECK(std::abs(r.weight[2] + r.weight[3] - 1.0f) < 1e-6);
  }
}

TEST_CASE("An MoE block's hook sees each expert's routed rows and the shared expert's every row", "[forward][moe]") {
  const LlamaModel model = LlamaModel::open(fixture("qwen2_moe"));
  const LlamaConfig& c = model.config();
  const BlockWeights w = model.load_block(0);
  const SafetensorsFile golden = SafetensorsFile::open(fixture("qwen2_moe") / "golden.safetensors");
  const std::vector<int32_t> tokens = golden_tokens(golden, 0);
  const int64_t T = int64_t(tokens.size());
  Matrix h = model.embed(tokens);
  std::map<std::pair<LinearInput, int32_t>, std::pair<int64_t, int64_t>> seen;  // -> (rows, cols)
  Matrix mlp_in;
  model.block_forward(h, w, [&](LinearInput g, int32_t e, const Matrix& x) {
    CHECK(seen.count({g, e}) == 0);  // once per sample
    seen[{g, e}] = {x.rows(), x.cols()};
    if (g == LinearInput::GateUp && e == kSharedExpert) mlp_in = x;
  });
  CHECK(seen.at({LinearInput::QKV, kDenseMlp}).first == T);
  CHECK(seen.at({LinearInput::GateUp, kSharedExpert}) == std::pair<int64_t, int64_t>{T, c.hidden});
  CHECK(seen.at({LinearInput::Down, kSharedExpert}) == std::pair<int64_t, int64_t>{T, c.moe.shared_intermediate});
  CHECK_FALSE(seen.count({LinearInput::GateUp, kDenseMlp}));
  // Every token reaches top_k experts: the routed rows add up to T·top_k, matching the router's own choice.
  const Routing r = route_tokens(c, w.router, mlp_in);
  int64_t routed = 0;
  for (int32_t e = 0; e < int32_t(c.moe.experts); ++e) {
    const int64_t want = std::count(r.expert.begin(), r.expert.end(), e);
    const auto it = seen.find({LinearInput::GateUp, e});
    CHECK((it == seen.end() ? 0 : it->second.first) == want);
    if (want) CHECK(seen.at({LinearInput::Down, e}) == std::pair<int64_t, int64_t>{want, c.moe.expert_intermediate});
    routed += want;
  }
  CHECK(routed == T * c.moe.top_k);
  // The linears the runner visits in an MoE block, in its order, with their checkpoint names.
  const std::vector<LinearRef> up = block_linears(c, 0, LinearInput::GateUp);
  REQUIRE(up.size() == size_t(2 * (c.moe.experts + 1)));
  CHECK(linear_source(c, 0, up[0]).prefix == "model.layers.0.mlp.experts.0.gate_proj");
  CHECK(linear_source(c, 0, up[3]).prefix == "model.layers.0.mlp.experts.1.up_proj");
  CHECK(linear_source(c, 0, up.back()).prefix == "model.layers.0.mlp.shared_expert.up_proj");
  CHECK(linear_source(c, 0, LinearRef(Linear::Down, 2)).in == c.moe.expert_intermediate);
  CHECK(block_linears(c, 1, LinearInput::Down) == std::vector<LinearRef>{Linear::Down});
  const LlamaConfig mix = LlamaModel::open(fixture("mixtral")).config();
  CHECK(linear_source(mix, 1, LinearRef(Linear::Up, 3)).prefix == "model.layers.1.block_sparse_moe.experts.3.w3");
  CHECK(linear_source(mix, 1, LinearRef(Linear::Down, 0)).prefix == "model.layers.1.block_sparse_moe.experts.0.w2");
}

TEST_CASE("MoE configs: key spellings, the sparse-step pattern, and refusals by name", "[forward][moe]") {
  // transformers 5 writes Qwen3-MoE's expert count as num_local_experts; older configs say num_experts.
  const LlamaConfig q3 = edited_config("qwen3_moe", [](nlohmann::json& c) {
    c.erase("num_local_experts");
    c["num_experts"] = 6;
  });
  CHECK(q3.moe.experts == 6);
  // MixtralConfig takes num_experts for num_local_experts; Qwen2MoeConfig reads num_experts only (default 60).
  CHECK(edited_config("mixtral", [](nlohmann::json& c) {
          c.erase("num_local_experts");
          c["num_experts"] = 6;
        }).moe.experts == 6);
  CHECK(edited_config("qwen2_moe", [](nlohmann::json& c) {
          c.erase("num_experts");
          c["num_local_experts"] = 6;
        }).moe.experts == 60);
  // Defaults of the config classes: Mixtral's RoPE base 1e6, Qwen3-MoE's dense intermediate_size 6144.
  CHECK(edited_config("mixtral", [](nlohmann::json& c) { c.erase("rope_parameters"); }).rope_theta == 1e6);
  CHECK(edited_config("qwen3_moe", [](nlohmann::json& c) { c.erase("intermediate_size"); }).intermediate == 6144);
  // decoder_sparse_step 2: layers 1, 3, ... are MoE, the rest dense.
  const LlamaConfig step = edited_config("qwen3_moe", [](nlohmann::json& c) {
    c["num_hidden_layers"] = 4;
    c["decoder_sparse_step"] = 2;
  });
  CHECK(step.moe.layers == std::vector<bool>{false, true, false, true});
  // No experts: every layer dense.
  CHECK(edited_config("qwen3_moe", [](nlohmann::json& c) { c["num_local_experts"] = 0; }).moe.layers ==
        std::vector<bool>{false, false});
  CHECK(config_error("mixtral", [](nlohmann::json& c) { c["num_experts_per_tok"] = 5; })
            .find("num_experts_per_tok 5 exceeds the 4 experts") != std::string::npos);
  CHECK(config_error("qwen2_moe", [](nlohmann::json& c) { c["mlp_only_layers"] = {2}; })
            .find("'mlp_only_layers' holds a value that is not a layer index in [0, 2)") != std::string::npos);
  CHECK(config_error("qwen2_moe", [](nlohmann::json& c) { c["decoder_sparse_step"] = 0; })
            .find("'decoder_sparse_step' must be an integer in [1") != std::string::npos);
  CHECK(config_error("qwen3_moe", [](nlohmann::json& c) { c["norm_topk_prob"] = "yes"; })
            .find("'norm_topk_prob' must be true or false") != std::string::npos);
  CHECK(config_error("qwen3_moe", [](nlohmann::json& c) { c["use_sliding_window"] = true; })
            .find("use_sliding_window is not supported for Qwen3MoeForCausalLM") != std::string::npos);
  // model_type alone names the architecture too.
  CHECK(edited_config("mixtral", [](nlohmann::json& c) { c.erase("architectures"); }).family == Family::Mixtral);
}

TEST_CASE("An MoE checkpoint without one expert's tensor is refused naming it", "[forward][moe]") {
  test::TempDir tmp("moe-missing");
  const SafetensorsFile src = SafetensorsFile::open(fixture("mixtral") / "model.safetensors");
  // The same tensors but expert 2's w3 of block 1.
  const std::string gone = "model.layers.1.block_sparse_moe.experts.2.w3.weight";
  std::vector<TensorSpec> plan;
  for (const auto& t : src.tensors())
    if (t.name != gone) plan.push_back({t.name, t.dtype, t.shape});
  {
    CheckpointWriter w(tmp.path / "m", plan);
    for (const auto& t : src.tensors())
      if (t.name != gone) w.write(t.name, src.data(t));
    w.copy_file(fixture("mixtral") / "config.json", "config.json");
    w.commit();
  }
  try {
    LlamaModel::open(tmp.path / "m");
    FAIL("opened a model without an expert's tensor");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("tensor model.layers.1.block_sparse_moe.experts.2.w3.weight is missing") !=
          std::string::npos);
  }
}

TEST_CASE("A quantized MoE checkpoint's experts reach the forward pass dequantized, its routers exactly",
          "[forward][moe]") {
  // RTN of the Qwen2-MoE fixture to GPTQ's format: every expert (and the shared one) is quantized, the routers
  // and the shared expert's gate are not (loaders build them in 16 bits), and the model runs.
  test::TempDir tmp("moe-q");
  QuantizeOptions o;
  o.to = TargetFormat::GptqV1;
  o.group_size = 32;
  quantize_checkpoint(fixture("qwen2_moe"), tmp.path / "q", o);
  const LlamaModel qm = LlamaModel::open(tmp.path / "q", /*quantized_linears=*/true);
  const QuantizedLinears ql(qm.checkpoint(), qm.config());
  const LlamaModel plain = LlamaModel::open(fixture("qwen2_moe"));
  const BlockWeights orig = plain.load_block(0), quant = qm.load_block(0, &ql);
  CHECK(quant.router == orig.router);
  CHECK(quant.shared_gate == orig.shared_gate);
  for (LinearInput g : {LinearInput::GateUp, LinearInput::Down})
    for (LinearRef r : block_linears(qm.config(), 0, g)) {
      INFO("linear " << int(r.l) << " expert " << r.expert);
      REQUIRE(ql.quantized(0, r).has_value());
      const double e = rel_err(quant.weight(r), orig.weight(r));
      CHECK(e > 0);
      CHECK(e < 0.25);  // 4-bit RTN: about 0.1; another expert's weights would be about 1.4
    }
  const SafetensorsFile golden = SafetensorsFile::open(fixture("qwen2_moe") / "golden.safetensors");
  const std::vector<int32_t> tokens = golden_tokens(golden, 0);
  std::vector<BlockWeights> blocks = {qm.load_block(0, &ql), qm.load_block(1, &ql)};
  const Matrix logits = qm.forward(tokens, blocks);
  CHECK(logits.allFinite());
  CHECK(rel_err(logits, golden_matrix(golden, "seq0.logits")) > kArchRelTol);  // the quantized experts ran
}

TEST_CASE("The CPU calibration pass gives each expert the Hessian of its routed tokens, an unreached one H = I",
          "[forward][moe]") {
  const LlamaModel m = LlamaModel::open(fixture("qwen3_moe"));
  const LlamaConfig& c = m.config();
  const std::vector<std::vector<int32_t>> samples = {{5, 9, 17}, {3, 4}};  // 5 tokens: at most 10 of 16 slots
  std::unique_ptr<CalibPass> pass = make_cpu_pass(m, samples);
  pass->load(0);
  pass->capture({LinearInput::QKV, LinearInput::O, LinearInput::GateUp, LinearInput::Down});
  // The routed rows each expert sees, counted through the block's own hook.
  const BlockWeights w = m.load_block(0);
  std::map<int32_t, int64_t> rows;
  for (const auto& s : samples) {
    Matrix h = m.embed(s);
    m.block_forward(h, w, [&](LinearInput g, int32_t e, const Matrix& x) {
      if (g == LinearInput::GateUp && e >= 0) rows[e] += x.rows();
    });
  }
  CHECK(pass->hessian_tokens(Linear::Q) == 5);
  int32_t unreached = -1;
  for (int32_t e = 0; e < int32_t(c.moe.experts); ++e) {
    INFO("expert " << e);
    const int64_t n = rows.count(e) ? rows[e] : 0;
    CHECK(pass->hessian_tokens(LinearRef(Linear::Gate, e)) == n);
    CHECK(pass->hessian_tokens(LinearRef(Linear::Down, e)) == n);
    if (n == 0) unreached = e;
  }
  REQUIRE(unreached >= 0);
  GptqOptions o;
  o.group_size = 32;
  o.name = "unreached";
  const Matrix& W = w.weight(LinearRef(Linear::Up, unreached));  // [n, k]
  const QuantizedLinear got = pass->quantize(LinearRef(Linear::Up, unreached), o, nullptr);
  const QuantizedLinear want =
      gptq_quantize(W.data(), W.rows(), W.cols(), Eigen::MatrixXf::Identity(W.cols(), W.cols()), o, nullptr);
  CHECK(got.codes == want.codes);
  CHECK(got.scales == want.scales);
}

TEST_CASE("ExpertCalibration::All: every expert's hook sees every token, the output still follows the router",
          "[forward][moe]") {
  const LlamaModel model = LlamaModel::open(fixture("qwen2_moe"));  // block 0: 4 experts and the shared expert
  const LlamaConfig& c = model.config();
  const BlockWeights w = model.load_block(0);
  const SafetensorsFile golden = SafetensorsFile::open(fixture("qwen2_moe") / "golden.safetensors");
  const std::vector<int32_t> tokens = golden_tokens(golden, 0);
  const int64_t T = int64_t(tokens.size());
  Matrix routed = model.embed(tokens), all = routed;
  std::map<std::pair<LinearInput, int32_t>, Matrix> seen_routed, seen_all;
  model.block_forward(routed, w, [&](LinearInput g, int32_t e, const Matrix& x) { seen_routed[{g, e}] = x; });
  model.block_forward(
      all, w, [&](LinearInput g, int32_t e, const Matrix& x) { seen_all[{g, e}] = x; }, ExpertCalibration::All);
  CHECK(all == routed);  // the same arithmetic for the output, bit for bit
  const Matrix& x = seen_all.at({LinearInput::GateUp, kAllExperts});
  CHECK(x.rows() == T);
  CHECK(x == seen_all.at({LinearInput::GateUp, kSharedExpert}));  // the MLP's normed input, every token
  for (int32_t e = 0; e < int32_t(c.moe.experts); ++e) {
    INFO("expert " << e);
    CHECK_FALSE(seen_all.count({LinearInput::GateUp, e}));
    const Matrix& down = seen_all.at({LinearInput::Down, e});
    REQUIRE(down.rows() == T);
    CHECK(down.cols() == c.moe.expert_intermediate);
    // On the tokens the router sends the expert, its activations are the routed pass's (the same rows of the same
    // product, up to the GEMM's blocking).
    const auto it = seen_routed.find({LinearInput::Down, e});
    if (it == seen_routed.end()) continue;
    const Matrix& xe = seen_routed.at({LinearInput::GateUp, e});
    int64_t matched = 0;
    for (int64_t t = 0; t < T && matched < xe.rows(); ++t)
      if (x.row(t) == xe.row(matched)) {
        CHECK((down.row(t) - it->second.row(matched)).cwiseAbs().maxCoeff() <=
              1e-5f * std::max(1.0f, it->second.row(matched).cwiseAbs().maxCoeff()));
        ++matched;
      }
    CHECK(matched == xe.rows());
  }
  // The CPU pass under All: every expert's gate/up and down have every token, so none is left uncalibrated
  // even on a 3-token sample that reaches at most 6 of qwen3_moe's 8 experts.
  const LlamaModel m3 = LlamaModel::open(fixture("qwen3_moe"));
  const std::vector<std::vector<int32_t>> one = {{5, 9, 17}};
  auto by_route = make_cpu_pass(m3, one), by_all = make_cpu_pass(m3, one, ExpertCalibration::All);
  for (auto* p : {by_route.get(), by_all.get()}) {
    p->load(0);
    p->capture({LinearInput::QKV, LinearInput::O, LinearInput::GateUp, LinearInput::Down});
  }
  int unreached = 0;
  for (int32_t e = 0; e < int32_t(m3.config().moe.experts); ++e)
    unreached += by_route->hessian_tokens(LinearRef(Linear::Gate, e)) == 0;
  CHECK(unreached >= 2);
  test::check_every_expert_calibrated(*by_all, m3.config().moe.experts, 3);
}

TEST_CASE("The CPU pass's expert Hessians are the same sums whatever the thread count", "[forward][moe]") {
  // 24 samples of 100-146 tokens: several hundred routed rows per expert, more than one batch of staged rows
  // (calib_pass.cpp), in chunks of samples that differ between 1 and 3 threads. GPTQ's loss is a continuous
  // function of the Hessian, so any other summation would show in it.
  const LlamaModel m = LlamaModel::open(fixture("qwen3_moe"));
  std::vector<std::vector<int32_t>> samples;
  for (int d = 0; d < 24; ++d) {
    samples.emplace_back();
    for (int t = 0; t < 100 + 2 * d; ++t) samples.back().push_back((d * 53 + t * 29 + t * t) % 128);
  }
  GptqOptions o;
  o.group_size = 32;
  o.name = "expert";
  // Routed, and with every expert on every token (its sums split across the threads like the attention's).
  const ExpertCalibration ec = GENERATE(ExpertCalibration::Routed, ExpertCalibration::All);
  INFO((ec == ExpertCalibration::All ? "all tokens" : "routed"));
  std::vector<double> losses[2];
  std::vector<int64_t> tokens[2];
  const int before = omp_get_max_threads();
  for (int run = 0; run < 2; ++run) {
    omp_set_num_threads(run == 0 ? 1 : 3);
    std::unique_ptr<CalibPass> pass = make_cpu_pass(m, samples, ec);
    pass->load(0);
    pass->capture({LinearInput::GateUp, LinearInput::Down});
    for (int32_t e = 0; e < 8; ++e)
      for (Linear l : {Linear::Gate, Linear::Down}) {
        GptqStats st;
        pass->quantize(LinearRef(l, e), o, &st);
        losses[run].push_back(st.loss);
        tokens[run].push_back(pass->hessian_tokens(LinearRef(l, e)));
      }
  }
  omp_set_num_threads(before);
  CHECK(*std::min_element(tokens[0].begin(), tokens[0].end()) > 256);  // more than one staged batch each
  CHECK(tokens[0] == tokens[1]);
  CHECK(losses[0] == losses[1]);
}
