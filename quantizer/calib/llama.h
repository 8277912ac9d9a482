// Llama-family decoder forward pass on the CPU (fp32, Eigen + OpenMP), for calibration and perplexity
// (spec: ../shared/spec/gptq.md §7). Llama 2/3 (GQA, RoPE theta and llama3 scaling), Mistral (sliding
// window), Qwen2/2.5 (q/k/v bias), Qwen3 (per-head q/k RMSNorm). Structured block by block so the
// calibration runner can capture each linear's input, quantize, and run the block again with
// dequantized weights: embed -> block_forward x L -> final_norm -> logits.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"

namespace marlinc::calib {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vector = Eigen::VectorXf;

enum class Family { Llama, Mistral, Qwen2, Qwen3 };

struct RopeScaling {
  std::string type = "default";  // default | linear | llama3
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 8192;       // llama3
};

struct LlamaConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  Family family = Family::Llama;
  int64_t hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
  int64_t max_position_embeddings = 0;
  int64_t sliding_window = 0;  // 0: none (Mistral sets it)
  double rms_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_embeddings = false;
  bool qk_norm = false;  // Qwen3

  // Parses config.json. Unknown architectures, activations or rope types are refused by name, with
  // what is supported. `label` names the file in messages.
  static LlamaConfig from_json(const nlohmann::json& cfg, const std::string& label);
};
// The architectures from_json accepts.
const std::vector<std::string>& supported_architectures();

// The seven linears of a block, in the order the calibration runner visits them.
enum class Linear { Q, K, V, O, Gate, Up, Down };
inline constexpr Linear kAllLinears[] = {Linear::Q, Linear::K, Linear::V, Linear::O, Linear::Gate, Linear::Up, Linear::Down};
// "model.layers.3.self_attn.q_proj" (no ".weight").
std::string linear_name(int64_t block, Linear l);

// Linears that read the same input share one Hessian: {q,k,v}, {o}, {gate,up}, {down}.
enum class LinearInput { QKV, O, GateUp, Down };
std::vector<Linear> linears_of(LinearInput g);

struct BlockWeights {
  Matrix q, k, v, o, gate, up, down;  // [out, in] fp32
  Vector q_bias, k_bias, v_bias, o_bias, gate_bias, up_bias, down_bias;  // [out] or empty
  Vector input_norm, post_norm;  // [hidden]
  Vector q_norm, k_norm;         // [head_dim] (Qwen3) or empty
  Matrix& weight(Linear l);
  const Matrix& weight(Linear l) const;
  const Vector& bias(Linear l) const;
};

// Where a block's linear weights come from: the checkpoint by default; the calibration runner (or a
// quantized-checkpoint reader) supplies fp32 [out, in] replacements, e.g. dequantized weights.
class LinearProvider {
 public:
  virtual ~LinearProvider() = default;
  // nullopt: use the checkpoint's weight.
  virtual std::optional<Matrix> weight(int64_t block, Linear l) const = 0;
};

// Called by block_forward with each linear group's input, [T, in_features], before the linears run.
using InputHook = std::function<void(LinearInput, const Matrix&)>;

class LlamaModel {
 public:
  // Opens dir (config.json + safetensors through marlinc::Checkpoint) and validates every tensor shape
  // the forward pass will use. Weights are converted to fp32 block by block, on demand. With
  // quantized_linears the block linears' plain weights are not required (a QuantizedLinears provider
  // supplies them).
  static LlamaModel open(const std::filesystem::path& dir, bool quantized_linears = false);

  const LlamaConfig& config() const { return cfg_; }
  const Checkpoint& checkpoint() const { return *ckpt_; }

  // linears = false: norms and biases only (the GPU pass uploads the linears' checkpoint bytes).
  BlockWeights load_block(int64_t i, const LinearProvider* provider = nullptr, bool linears = true) const;

  Matrix embed(std::span<const int32_t> tokens) const;  // [T, hidden]
  // One decoder block on one unpadded sequence at positions 0..T-1 (causal mask), in place on
  // hidden [T, hidden]. hook, when set, sees the inputs of the four linear groups.
  void block_forward(Matrix& hidden, const BlockWeights& w, const InputHook& hook = nullptr) const;
  Matrix final_norm(const Matrix& hidden) const;  // [T, hidden]
  Matrix logits(const Matrix& normed) const;      // [T, vocab]

  // Whole forward pass; when `hidden_after` is given it receives each block's output (before the
  // final norm), [layers] x [T, hidden]. Block weights are loaded per call (tests, perplexity).
  Matrix forward(std::span<const int32_t> tokens, const LinearProvider* provider = nullptr,
                 std::vector<Matrix>* hidden_after = nullptr) const;
  // The same with block weights already in memory (perplexity over many windows).
  Matrix forward(std::span<const int32_t> tokens, const std::vector<BlockWeights>& blocks,
                 std::vector<Matrix>* hidden_after = nullptr) const;

 private:
  LlamaModel() = default;
  Matrix load_matrix(const std::string& name, int64_t rows, int64_t cols) const;
  Vector load_vector(const std::string& name, int64_t n) const;
  Vector load_optional_vector(const std::string& name, int64_t n) const;

  LlamaConfig cfg_;
  std::shared_ptr<Checkpoint> ckpt_;
  std::vector<float> inv_freq_;  // [head_dim/2] RoPE frequencies after scaling
  Vector final_norm_;            // [hidden]
  std::string head_name_;        // lm_head.weight or the tied embedding
};

// RMSNorm of each row of x [T, n] with weight w [n]: x / sqrt(mean(x^2) + eps) * w. Scalar reference.
Matrix rms_norm_ref(const Matrix& x, const Vector& w, double eps);
// RoPE inverse frequencies [head_dim/2] for a config (default, linear or llama3 scaling).
std::vector<float> rope_inv_freq(const LlamaConfig& cfg);

}  // namespace marlinc::calib
