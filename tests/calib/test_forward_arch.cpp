// The CPU forward pass against transformers for every architecture calibration supports, on tiny random
// models written by tests/calib/make_arch_golden.py (transformers 5.17, committed under tests/data):
// Llama 3 RoPE scaling, Mistral's sliding window (8, shorter than the 24-token sequence), Qwen2's q/k/v
// biases, Qwen3's per-head q/k norms with head_dim != hidden / heads and tied embeddings. stories260K
// (test_forward.cpp) covers the plain Llama path on a trained model; tests/gpu/test_forward_cuda.cpp runs
// the GPU pass on the same fixtures.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "quantizer/calib/llama.h"
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

struct Case {
  const char* dir;
  Family family;
};

}  // namespace

TEST_CASE("Llama 3 / Mistral / Qwen2 / Qwen3 forward passes match transformers' logits", "[forward]") {
  const Case cases[] = {{"llama3", Family::Llama}, {"mistral", Family::Mistral}, {"qwen2", Family::Qwen2},
                        {"qwen3", Family::Qwen3}};
  for (const Case& c : cases) {
    const std::filesystem::path dir = golden_dir() / c.dir;
    INFO(dir.string());
    auto model = LlamaModel::open(dir);
    const LlamaConfig& cfg = model.config();
    CHECK(cfg.family == c.family);
    CHECK(cfg.layers == 2);
    // What each fixture is there to exercise, read back from its config.
    if (c.family == Family::Llama) CHECK(cfg.rope_scaling.type == "llama3");
    if (c.family == Family::Mistral) CHECK(cfg.sliding_window == 8);
    if (c.family == Family::Qwen3) {
      CHECK(cfg.qk_norm);
      CHECK(cfg.tie_embeddings);
      CHECK(cfg.head_dim * cfg.heads != cfg.hidden);
    }
    auto golden = SafetensorsFile::open(dir / "golden.safetensors");
    for (int s = 0; s < 2; ++s) {
      const std::string p = "seq" + std::to_string(s) + ".";
      const TensorInfo* ti = golden.find(p + "tokens");
      REQUIRE(ti != nullptr);
      auto tv = golden.view<int32_t>(*ti);
      const std::vector<int32_t> tokens(tv.begin(), tv.end());
      std::vector<Matrix> hidden;
      const Matrix logits = model.forward(tokens, nullptr, &hidden);
      REQUIRE(hidden.size() == 2);
      const double e_logits = rel_err(logits, golden_matrix(golden, p + "logits"));
      const double e_l0 = rel_err(hidden[0], golden_matrix(golden, p + "hidden_layer0"));
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
