// Llama-family decoder forward pass on the CPU (fp32, Eigen + OpenMP), for calibration and perplexity
// (spec: ../shared/spec/gptq.md §7). Llama 2/3 (GQA, RoPE theta and llama3 scaling), Mistral (sliding
// window), Qwen2/2.5 (q/k/v bias), Qwen3 (per-head q/k RMSNorm), Gemma 1/2/3 text models ((1 + w) norms,
// scaled embeddings, GeGLU; Gemma 2/3: norms around both sub-blocks, query_pre_attn_scalar, soft-capped
// scores and logits, sliding-window layers with their own RoPE base), Phi-3/Phi-4 (fused qkv_proj and
// gate_up_proj, partial rotary, LongRoPE), Granite 3 (embedding, residual, attention and logit multipliers),
// SmolLM3 (layers without RoPE), and the mixture-of-experts Mixtral, Qwen2-MoE (shared expert) and Qwen3-MoE
// (moe_forward.cpp: top-k routing, each expert on the tokens routed to it).
// Structured block by block so the
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

enum class Family {
  Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma2, Gemma3, Phi3, Granite, SmolLM3, Mixtral, Qwen2Moe, Qwen3Moe
};
// The MLP's gate activation: silu (SwiGLU), gelu with tanh approximation (GeGLU as Gemma runs it:
// gelu_pytorch_tanh, gelu_new) or exact gelu (erf).
enum class Activation { Silu, GeluTanh, Gelu };

struct RopeScaling {
  std::string type = "default";  // default | linear | llama3 | longrope
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 8192;       // llama3, longrope
  // longrope (Phi-3.5, Phi-4-mini): per-frequency stretch factors [rotary_dim/2], the short ones for
  // sequences up to original_max_position_embeddings and the long ones beyond (transformers picks per
  // forward by its length), and the factor on cos/sin.
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1.0;
};

// Mixture-of-experts MLPs: a router [experts, hidden] scores each token, softmax in fp32, the top_k experts
// run on it and their outputs are summed with those probabilities (renormalised to sum 1 when norm_topk).
struct MoeConfig {
  int64_t experts = 0;              // routed experts per MoE layer; 0: a dense model
  int64_t top_k = 0;                // experts per token
  int64_t expert_intermediate = 0;  // each routed expert's intermediate size
  int64_t shared_intermediate = 0;  // Qwen2-MoE's shared expert (scaled by sigmoid(shared_expert_gate)); 0: none
  bool norm_topk = false;           // Mixtral always; Qwen's norm_topk_prob
  bool mixtral_names = false;       // block_sparse_moe.experts.E.w1/w3/w2, not mlp.experts.E.gate/up/down_proj
  std::vector<bool> layers;         // per layer: MoE (else the dense MLP of intermediate_size)
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
  int64_t rotary_dim = 0;  // leading dims of each head RoPE rotates: head_dim, or less (Phi's partial_rotary_factor)
  // Phi-3: q/k/v are one checkpoint tensor (qkv_proj, rows q|k|v) and gate/up another (gate_up_proj, rows
  // gate|up); linear_source() says which rows are which.
  bool fused_linears = false;
  bool tie_embeddings = false;
  bool qk_norm = false;  // Qwen3, Gemma 3
  Activation act = Activation::Silu;
  // Gemma: every RMSNorm scales by (1 + w); load_block and the final norm add the 1 (in fp32, as
  // transformers does), so the norm arithmetic is the same for every family.
  bool unit_offset_norms = false;
  // Gemma 2/3: the attention and MLP outputs are normalised before the residual add
  // (post_attention_layernorm, post_feedforward_layernorm) and the MLP's input norm is
  // pre_feedforward_layernorm.
  bool sandwich_norms = false;
  bool scale_embeddings = false;  // Gemma: embeddings times sqrt(hidden); Granite: embedding_multiplier
  double embedding_multiplier = 1.0;  // Granite
  double residual_multiplier = 1.0;   // Granite: each sub-block's output times this before the residual add
  double logits_scaling = 1.0;        // Granite: logits divided by this
  double attn_scale = 0;          // scores' scale; 0: head_dim^-1/2 (Gemma 2/3: query_pre_attn_scalar^-1/2)
  double attn_softcap = 0;        // scores -> cap·tanh(scores / cap) before the mask; 0: none (Gemma 2)
  double final_softcap = 0;       // the same on the logits (Gemma 2)
  // Per layer: whether it attends through the sliding window (Gemma 2/3's layer_types). Empty: every
  // layer does when sliding_window > 0 (Mistral).
  std::vector<bool> sliding_layers;
  // Gemma 3's sliding layers' RoPE (rope_local_base_freq); local_rope_theta 0: as every other layer.
  double local_rope_theta = 0;
  RopeScaling local_rope_scaling;

  // Per layer: whether it applies RoPE (SmolLM3's no_rope_layers: 0 = NoPE). Empty: every layer does.
  std::vector<bool> rope_layers;

  MoeConfig moe;

  bool layer_slides(int64_t layer) const;  // the layer's attention is windowed (sliding_window > 0)
  bool layer_rope(int64_t layer) const;    // the layer rotates q and k
  bool layer_local_rope(int64_t layer) const;  // the layer uses the local RoPE table
  bool layer_moe(int64_t layer) const;         // the layer's MLP is a mixture of experts
  bool has_moe() const;                        // some layer's is

  // Parses config.json. Unknown architectures, activations or rope types are refused by name, with
  // what is supported. `label` names the file in messages.
  static LlamaConfig from_json(const nlohmann::json& cfg, const std::string& label);
};
// The architectures from_json accepts.
const std::vector<std::string>& supported_architectures();

// The seven linears of a block, in the order the calibration runner visits them.
enum class Linear { Q, K, V, O, Gate, Up, Down };
inline constexpr Linear kAllLinears[] = {Linear::Q, Linear::K, Linear::V, Linear::O, Linear::Gate, Linear::Up, Linear::Down};
// Which MLP a gate/up/down linear belongs to: the block's dense MLP, routed expert e >= 0 of an MoE block,
// or Qwen2-MoE's shared expert. Attention linears are always kDenseMlp.
inline constexpr int32_t kDenseMlp = -1, kSharedExpert = -2;
// How an MoE block's routed experts are calibrated: each on the tokens the router sends it (what it sees at
// inference; an expert no token reaches has no Hessian), or each on every token (llm-compressor's
// calibrate_all_experts, GPTQModel's routing bypass: full-rank Hessians for all of them). The block's output
// follows the router either way.
enum class ExpertCalibration { Routed, All };
// Under ExpertCalibration::All the routed experts' gate/up read one input, every token's: its hook key.
inline constexpr int32_t kAllExperts = -3;
struct LinearRef {
  Linear l = Linear::Q;
  int32_t expert = kDenseMlp;
  LinearRef(Linear l_, int32_t expert_ = kDenseMlp) : l(l_), expert(expert_) {}  // NOLINT: a Linear is a dense ref
  bool operator==(const LinearRef&) const = default;
};
// "model.layers.3.self_attn.q_proj", "model.layers.3.mlp.experts.5.up_proj" (no ".weight"), the unfused
// name; c gives the experts' naming (Mixtral: block_sparse_moe.experts.E.w1/w3/w2).
std::string linear_name(const LlamaConfig& c, int64_t block, LinearRef r);
// Where linear l of a block is stored: rows [row0, row0 + rows) of the checkpoint module `prefix`
// (`<prefix>.weight` [total rows, in]). The whole module for every family but Phi-3's fused ones.
struct LinearSource {
  std::string prefix;
  int64_t row0 = 0, rows = 0, total_rows = 0, in = 0;
  bool fused() const { return rows != total_rows; }
};
LinearSource linear_source(const LlamaConfig& c, int64_t block, LinearRef r);

// Linears that read the same input share one Hessian: {q,k,v}, {o}, {gate,up}, {down}.
enum class LinearInput { QKV, O, GateUp, Down };
std::vector<Linear> linears_of(LinearInput g);
// The linears of a block that read input g, in the order the runner visits (and writes) them: linears_of(g)
// for attention and dense MLPs; in an MoE block gate/up (or down) of expert 0, 1, ..., then the shared expert's.
std::vector<LinearRef> block_linears(const LlamaConfig& c, int64_t block, LinearInput g);
// Input features of the linears in group g of MLP `expert` (kDenseMlp for attention groups).
int64_t group_in_features(const LlamaConfig& c, LinearInput g, int32_t expert);

struct ExpertWeights {
  Matrix gate, up, down;  // [inter, hidden], [inter, hidden], [hidden, inter] fp32
};

struct BlockWeights {
  int64_t index = 0;  // the decoder layer: selects its attention window and RoPE table
  Matrix q, k, v, o, gate, up, down;  // [out, in] fp32
  Vector q_bias, k_bias, v_bias, o_bias, gate_bias, up_bias, down_bias;  // [out] or empty
  // The attention's and the MLP's input norms, [hidden] (Llama's input_layernorm and
  // post_attention_layernorm; Gemma 2/3's input_layernorm and pre_feedforward_layernorm).
  Vector input_norm, post_norm;
  Vector attn_out_norm, mlp_out_norm;  // [hidden] Gemma 2/3's output norms, or empty
  Vector q_norm, k_norm;         // [head_dim] (Qwen3, Gemma 3) or empty
  // An MoE block (moe true): its router and experts replace gate/up/down.
  bool moe = false;
  Matrix router;                       // [experts, hidden]
  std::vector<ExpertWeights> experts;  // [experts]
  ExpertWeights shared;                // Qwen2-MoE's shared expert, or empty
  Vector shared_gate;                  // [hidden] Qwen2-MoE's shared_expert_gate (one output), or empty
  Matrix& weight(LinearRef r);
  const Matrix& weight(LinearRef r) const;
  const Vector& bias(LinearRef r) const;  // experts have none: an empty vector
};

// Where a block's linear weights come from: the checkpoint by default; the calibration runner (or a
// quantized-checkpoint reader) supplies fp32 [out, in] replacements, e.g. dequantized weights.
class LinearProvider {
 public:
  virtual ~LinearProvider() = default;
  // nullopt: use the checkpoint's weight.
  virtual std::optional<Matrix> weight(int64_t block, LinearRef r) const = 0;
};

// Called by block_forward with each linear group's input, [T, in_features], before the linears run; for an
// MoE block's experts, with the rows of the tokens routed to `expert` (in token order; not called for an
// expert no token reached) -- under ExpertCalibration::All once with every token for gate/up (expert
// kAllExperts) and, for each expert's down, its activations on every token.
using InputHook = std::function<void(LinearInput, int32_t expert, const Matrix&)>;

class LlamaModel {
 public:
  // Opens dir (config.json + safetensors through marlinc::Checkpoint) and validates every tensor shape
  // the forward pass will use. Weights are converted to fp32 block by block, on demand. With
  // quantized_linears the block linears' plain weights are not required (a QuantizedLinears provider
  // supplies them).
  static LlamaModel open(const std::filesystem::path& dir, bool quantized_linears = false);

  const LlamaConfig& config() const { return cfg_; }
  // What embed() multiplies the embeddings by: 1; for Gemma sqrt(hidden) rounded to the embedding
  // table's dtype, as the model runs in it (transformers and vLLM keep the factor in the model dtype);
  // for Granite its embedding_multiplier.
  float embed_scale() const { return embed_scale_; }
  const Checkpoint& checkpoint() const { return *ckpt_; }

  // linears = false: norms and biases only (the GPU pass uploads the linears' checkpoint bytes).
  BlockWeights load_block(int64_t i, const LinearProvider* provider = nullptr, bool linears = true) const;

  Matrix embed(std::span<const int32_t> tokens) const;  // [T, hidden]
  // One decoder block on one unpadded sequence at positions 0..T-1 (causal mask), in place on
  // hidden [T, hidden]. hook, when set, sees the inputs of the four linear groups.
  void block_forward(Matrix& hidden, const BlockWeights& w, const InputHook& hook = nullptr,
                     ExpertCalibration ec = ExpertCalibration::Routed) const;
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
  // Rows [row0, row0 + n) of the [rows, cols] tensor `name` (a fused module's part), in fp32.
  Matrix load_rows(const std::string& name, int64_t rows, int64_t cols, int64_t row0, int64_t n) const;
  Vector load_vector(const std::string& name, int64_t n) const;
  Vector load_optional_vector(const std::string& name, int64_t n) const;
  Vector load_norm(const std::string& name, int64_t n) const;  // a norm weight, with Gemma's + 1

  LlamaConfig cfg_;
  std::shared_ptr<Checkpoint> ckpt_;
  std::vector<float> inv_freq_;        // [rotary_dim/2] RoPE frequencies after scaling
  std::vector<float> inv_freq_local_;  // [rotary_dim/2] Gemma 3's sliding layers', or empty
  std::vector<float> inv_freq_long_;   // [rotary_dim/2] longrope's long table, or empty
  float embed_scale_ = 1.0f;
  Vector final_norm_;            // [hidden]
  std::string head_name_;        // lm_head.weight or the tied embedding
};

// RMSNorm of each row of x [T, n] with weight w [n]: x / sqrt(mean(x^2) + eps) * w. Scalar reference.
Matrix rms_norm_ref(const Matrix& x, const Vector& w, double eps);
// RoPE inverse frequencies [rotary_dim/2] for a config (default, linear, llama3 or longrope scaling); local:
// the table of Gemma 3's sliding layers (local_rope_theta and local_rope_scaling); long: longrope's table
// for sequences longer than original_max_position_embeddings.
std::vector<float> rope_inv_freq(const LlamaConfig& cfg, bool local = false, bool long_seq = false);
// longrope: whether a sequence of `len` tokens takes the long factors (transformers: len > original max).
bool rope_long(const LlamaConfig& cfg, int64_t len);
// The MLP's gate activation of one value, in fp32 (the GPU pass forms the same expressions).
float activation_ref(Activation a, float g);

// act(x·gateᵀ) ⊙ (x·upᵀ) [T, inter] for x [T, hidden] (biases optional): the down projection's input.
Matrix mlp_hidden(const LlamaConfig& c, const Matrix& x, const Matrix& gate, const Matrix& up, const Vector& gate_bias,
                  const Vector& up_bias);

// moe_forward.cpp. Each token's experts, best first, and their weights: [T, top_k] each, row-major. As
// transformers routes: router logits in fp32, softmax, top-k (ties to the lower expert index), renormalised
// when norm_topk.
struct Routing {
  int64_t tokens = 0, top_k = 0;
  std::vector<int32_t> expert;  // [T, top_k]
  std::vector<float> weight;    // [T, top_k]
};
Routing route_tokens(const LlamaConfig& c, const Matrix& router /*[E, hidden]*/, const Matrix& x /*[T, hidden]*/);
// The same from router logits [T, E] fp32 row-major into expert/weight [T, top_k] (the GPU pass computes
// the logits and routes with this, so both passes route by one rule).
void route_logits(const LlamaConfig& c, const float* logits, int64_t T, int64_t E, int32_t* expert, float* weight);
// The MoE MLP's output [T, hidden] for its normed input x [T, hidden]; hook sees each expert's routed rows.
Matrix moe_mlp(const LlamaConfig& c, const BlockWeights& w, const Matrix& x, const InputHook& hook,
               ExpertCalibration ec = ExpertCalibration::Routed);
// Parses the MoE keys of config.json into c.moe (c.family, c.layers and c.intermediate already set).
void parse_moe(const nlohmann::json& cfg, LlamaConfig& c, const std::string& label);

}  // namespace marlinc::calib
