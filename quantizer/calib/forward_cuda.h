// The calibration forward pass on the GPU (spec: ../shared/spec/gptq.md §7; the CPU pass is llama.h).
// Holds every calibration sample's hidden state on the device (fp32 residual stream, samples
// concatenated unpadded), one decoder block's weights at a time (fp16, or bf16 for bf16 checkpoints),
// and the four shared Hessian sums. A block runs over the samples in chunks of whole samples: the
// linears as cuBLAS GEMMs over every token of the chunk (16-bit inputs, fp32 accumulation and fp32
// outputs), attention per sample (each at its own length, causal, GQA, RoPE, Mistral's sliding
// window, Qwen2 biases, Qwen3 q/k norm; Gemma 2/3's per-layer windows and RoPE tables, score scale and
// soft-cap) as strided-batched GEMMs around a masked softmax, Gemma's GeGLU and output norms, and the
// Hessian sums Σ x xᵀ as one GEMM per captured group per chunk on the same 16-bit inputs the
// linears read. Mixture-of-experts blocks (Mixtral, Qwen2/3-MoE) route each chunk's tokens on the host
// (the router's logits come down, the CPU pass's rule picks the experts), gather each expert's rows, run
// its MLP as GEMMs over just those rows and keep a Hessian sum per expert from them.
//
// Device code is compiled as C++17 (CMake 3.25 has no C++20 flag for nvcc), so this header holds
// plain types only; gpu_calib.h maps LlamaConfig / BlockWeights / QuantizedLinear onto it. The
// definitions need a build with MARLINC_CUDA.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace marlinc::calib {

// The GEMM input type on the GPU. bf16 checkpoints keep bf16 (their activations may exceed fp16's
// range); fp16 and fp32 ones use fp16 (more mantissa).
enum class GpuAct { F16, BF16 };

// The MLP's gate activation (llama.h's Activation, same order).
enum class GpuActivation { Silu, GeluTanh, Gelu };

// Expert indices as llama.h's LinearRef holds them: routed expert e >= 0, the dense MLP (and the attention
// linears), Qwen2-MoE's shared expert (gpu_calib.cpp pins the correspondence).
constexpr int32_t kGpuDenseMlp = -1, kGpuSharedExpert = -2;
// The Hessian key every routed expert's gate/up share when the experts are calibrated on all tokens.
constexpr int32_t kGpuAllExperts = -3;
// Linear indices past llama.h's seven (Q..Down = 0..6): an MoE block's router [experts, hidden] and
// Qwen2-MoE's shared-expert gate [1, hidden]. Both run as 16-bit GEMMs like the other linears.
constexpr int kGpuRouter = 7, kGpuSharedGate = 8;

// Routes tokens from router logits [tokens, experts] fp32 row-major: each token's top_k experts and their
// weights, [tokens, top_k] each (llama.h's route_logits).
using GpuRouteFn = std::function<void(const float* logits, int64_t tokens, int32_t* expert, float* weight)>;

// What the block needs of config.json (LlamaConfig's fields of the same names).
struct GpuDims {
  int64_t hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t sliding_window = 0;  // 0: none; set_layer says which layers use it
  double rms_eps = 1e-6;
  GpuActivation activation = GpuActivation::Silu;
  double attn_scale = 0;       // 0: head_dim^-1/2
  double attn_softcap = 0;     // 0: none
  bool sandwich_norms = false; // Gemma 2/3: AttnOutNorm and MlpOutNorm before the residual adds
  int64_t rotary_dim = 0;      // leading dims of a head RoPE rotates (Phi's partial rotary); 0: head_dim
  double rope_scale = 1.0;     // cos/sin factor (longrope's attention factor)
  int64_t rope_long_after = 0; // longrope: samples longer than this take the long table; 0: none
  double residual_scale = 1.0; // Granite: each sub-block's output times this before the residual add
  // Mixture of experts (LlamaConfig::moe); experts 0: a dense model. set_layer says which layers are MoE.
  int64_t experts = 0, top_k = 0, expert_intermediate = 0, shared_intermediate = 0;
  GpuRouteFn route;            // required with experts
};

// Indices as in llama.h: Linear Q, K, V, O, Gate, Up, Down = 0..6; LinearInput QKV, O, GateUp,
// Down = 0..3 (gpu_calib.cpp pins the correspondence).
// PostNorm is the MLP's input norm; AttnOutNorm and MlpOutNorm are Gemma 2/3's output norms.
enum class GpuVec {
  InputNorm, PostNorm, QNorm, KNorm, BiasQ, BiasK, BiasV, BiasO, BiasGate, BiasUp, BiasDown, AttnOutNorm, MlpOutNorm
};
// Raw weight element types set_linear takes.
enum class GpuRaw { F32, F16, BF16 };

// A quantized linear as packer/quantized_linear.h's QuantizedLinear holds it, by pointer (host).
struct GpuQuantized {
  int64_t k = 0, n = 0;
  int bits = 4, group_size = -1;      // group_size -1: one group over all of k
  bool sym = true, bf16_scales = false;
  const uint8_t* codes = nullptr;     // [k, n] rows in the original input order
  const uint16_t* scales = nullptr;   // [G, n] fp16 or bf16 bits
  const uint8_t* zeros = nullptr;     // [G, n] when !sym
  const int32_t* g_idx = nullptr;     // [k] or null (row / group_size)
  const uint8_t* mask = nullptr;      // [k, n] 1 = kept, or null (dense)
};

class CudaForward {
 public:
  // Tokens per chunk: bounds the per-chunk scratch (the MLP's two fp32 [tokens, intermediate]
  // outputs dominate: 1.9 GB for Llama-3-8B); a sample longer than this is a chunk of its own.
  static constexpr size_t kDefaultChunkTokens = 16384;
  // Attention scores of one sample are made for as many KV heads at once as fit in this budget.
  static constexpr double kScoreBudgetBytes = 2e9;

  // lengths: tokens of each calibration sample (each > 0); inv_freq: RoPE frequencies [rotary_dim/2];
  // inv_freq_local: those of the layers set_layer marks local (Gemma 3's sliding layers), or empty;
  // inv_freq_long: longrope's for samples longer than d.rope_long_after, or empty.
  // Throws BadUsage for bad shapes, Internal when the device refuses.
  CudaForward(const GpuDims& d, const std::vector<size_t>& lengths, GpuAct act, const std::vector<float>& inv_freq,
              size_t chunk_tokens = kDefaultChunkTokens, const std::vector<float>& inv_freq_local = {},
              const std::vector<float>& inv_freq_long = {});
  ~CudaForward();
  CudaForward(const CudaForward&) = delete;
  CudaForward& operator=(const CudaForward&) = delete;

  size_t tokens() const;
  GpuAct act() const;
  size_t samples() const;
  size_t sample_tokens(size_t sample) const;
  // Device bytes held for these dimensions and calibration lengths (weights, hidden states, scratch,
  // the four Hessian sums): what the runner announces before it starts.
  static double device_bytes(const GpuDims& d, const std::vector<size_t>& lengths,
                             size_t chunk_tokens = kDefaultChunkTokens);

  // Sample i's hidden state [T_i, hidden] fp32 row-major (the embeddings before block 0), and back.
  void set_hidden(size_t sample, const float* h, size_t count);
  void get_hidden(size_t sample, float* h, size_t count) const;

  // Linear `l` of the current block from checkpoint bytes, [out, in] row-major; gate/up/down of MLP
  // `expert` (kGpuDenseMlp, a routed expert or kGpuSharedExpert); l may be kGpuRouter or kGpuSharedGate.
  void set_linear(int l, const void* bytes, size_t nbytes, GpuRaw raw, int32_t expert = kGpuDenseMlp);
  // The same from a quantized linear, dequantized on the device exactly as QuantizedLinear::weight
  // does it ((code − zero)·scale in fp32, 0 where the 2:4 mask prunes), then rounded to 16 bits.
  void set_linear_quantized(int l, const GpuQuantized& q, int32_t expert = kGpuDenseMlp);
  // The same from Marlin's packed layout (../shared/spec/formats.md §1): B int32 [k/16, 2n] uint4b8
  // tiles and permuted scales [G, n] (fp16 bits; bf16 when the activations are bf16). The linear then
  // runs through marlinc's own Marlin kernel (kernels/marlin.h, the fused path at every m), whose
  // fp16 output is widened into the fp32 stream, instead of through cuBLAS.
  void set_linear_marlin(int l, const int32_t* B, size_t b_count, const uint16_t* s, size_t s_count, int group_size,
                         int32_t expert = kGpuDenseMlp);
  // A norm weight or bias of the current block; count 0 removes an optional one (biases, q/k norm).
  void set_vector(GpuVec which, const float* v, size_t count);
  // The current block's attention: through the sliding window (when GpuDims has one), with the local
  // RoPE table, and with RoPE at all (SmolLM3's NoPE layers: without); its MLP a mixture of experts or
  // dense. A new CudaForward starts with (true, false, true, false), Mistral's every layer.
  void set_layer(bool sliding, bool local_rope, bool rope = true, bool moe = false);
  // MoE Hessians from every token (llama.h's ExpertCalibration::All): one gate/up sum under kGpuAllExperts and
  // each expert's down sum from its activations on all tokens; the outputs still follow the router.
  void set_experts_see_all(bool all);

  // Runs the current block over every sample. The inputs of the groups with capture[g] set are added
  // to their Hessian sums (an MoE block's GateUp and Down: one per expert, from its routed rows or, after
  // set_experts_see_all, from every token). With update the hidden states become the block's outputs;
  // without it they are left as they were and the pass stops after the last captured group. `block`
  // names errors (non-finite activations: a 16-bit overflow). Synchronous.
  void run(const bool capture[4], bool update, int64_t block);
  // Un-normalised Σ x xᵀ [k, k] fp32 on the device of a group (of MLP `expert`); nullptr before its
  // first rows (an expert no token was routed to has none).
  const float* hessian_sum(int group, int32_t expert = kGpuDenseMlp) const;
  // Rows in that sum: what hessian_finalize_cuda_device normalises it by (tokens() for a dense group).
  int64_t hessian_rows(int group, int32_t expert = kGpuDenseMlp) const;
  // Frees one sum (its row count stays): the caller has finalized it and the device memory is needed.
  void release_hessian(int group, int32_t expert = kGpuDenseMlp);
  void clear_hessians();
  // GPU time spent in the Hessian products so far (measured with events; part of run()'s wall time).
  double hessian_seconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

}  // namespace marlinc::calib
