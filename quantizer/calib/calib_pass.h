// Where the calibration runner's per-block work runs (gptq_runner.cpp): the forward passes of the
// calibration samples through the current block, the shared Hessians of the four linear groups,
// GPTQ for each linear, and the quantized weights that later passes must see. The CPU pass is fp32
// Eigen + OpenMP (llama.h); the GPU pass keeps the hidden states, the block and the Hessians on the
// device (forward_cuda.h) and runs GPTQ there too.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "packer/quantized_linear.h"
#include "quantizer/calib/llama.h"
#include "quantizer/gptq.h"

namespace marlinc::calib {

struct PassTimes {
  double forward = 0;  // block passes over the samples (without the Hessian products)
  double hessian = 0;  // Σ x xᵀ products and their normalisation
  double gptq = 0;     // GPTQ itself, including the weights' conversion to fp32
};

class CalibPass {
 public:
  virtual ~CalibPass() = default;
  // Makes block b current, with its checkpoint weights.
  virtual void load(int64_t block) = 0;
  // Runs the samples through the current block (its weights as they are now) and makes the Hessians
  // of `groups` the ones the following quantize() calls use.
  virtual void capture(std::initializer_list<LinearInput> groups) = 0;
  // GPTQ of linear r of the current block with its group's Hessian from the last capture (an MoE expert's:
  // from the tokens routed to it).
  virtual QuantizedLinear quantize(LinearRef r, const GptqOptions& o, GptqStats* stats) = 0;
  // Tokens in the Hessian linear r would use, from the last capture. An MoE expert no calibration token was
  // routed to has none; quantize() then runs GPTQ with H = I (round-to-nearest with an unweighted clip).
  virtual int64_t hessian_tokens(LinearRef r) const = 0;
  // The same for several linears (o[i] for ls[i]); results in the order given. The GPU pass runs them
  // concurrently (one GPTQ leaves most of an H100 idle: its column loop has a thread per output row);
  // each result is what quantize() alone would give.
  virtual std::vector<QuantizedLinear> quantize_all(const std::vector<LinearRef>& ls, const std::vector<GptqOptions>& o,
                                                    std::vector<GptqStats>& stats);
  // From now on the current block's linear r computes with q's dequantized weights.
  virtual void set_weight(LinearRef r, const QuantizedLinear& q) = 0;
  // The samples' hidden states become the current block's outputs: the next block's inputs.
  virtual void advance() = 0;
  const PassTimes& times() const { return t_; }

 protected:
  PassTimes t_;
};

// How many samples the CPU pass runs (and keeps captured inputs of) at a time: two per thread.
size_t cpu_pass_chunk_samples();

// The group whose Hessian a linear uses.
LinearInput input_of(Linear l);

// The Hessian an MoE block's linear r uses under ec: (group, expert), or for the routed experts' gate/up under
// ExpertCalibration::All the one every expert shares (kAllExperts).
std::pair<LinearInput, int32_t> hessian_key(LinearRef r, ExpertCalibration ec);

// The CPU pass runs GPTQ where each linear's options say (o.device).
std::unique_ptr<CalibPass> make_cpu_pass(const LlamaModel& m, const std::vector<std::vector<int32_t>>& samples,
                                         ExpertCalibration ec = ExpertCalibration::Routed);
// Defined only in builds with MARLINC_CUDA (gpu_calib.cpp).
std::unique_ptr<CalibPass> make_gpu_pass(const LlamaModel& m, const std::vector<std::vector<int32_t>>& samples,
                                         ExpertCalibration ec = ExpertCalibration::Routed);

}  // namespace marlinc::calib
