// Round-to-nearest (data-free) symmetric quantization per group, with an optional unweighted Lp
// clip search (spec: gptq.md §1.9, §2.2, §2.9). The path `marlinc quantize --method rtn` drives.
//
// Orientation: the input is a float weight in Hugging Face orientation W [n, k] row-major (row =
// output channel, as stored in a checkpoint's `*.weight`); the result is a QuantizedLinear whose
// codes are [k, n] (transposed), scales [G, n] fp16 bits (bf16 with bf16_scales), g_idx empty (trivial).
#pragma once
#include <cstdint>
#include <string>

#include "packer/quantized_linear.h"
#include "quantizer/grid.h"

namespace marlinc {

struct RtnOptions {
  int bits = 4;          // 4 (uint4b8) or 8 (uint8b128)
  int group_size = 128;  // -1 (one group over all of k) or a positive divisor of k (32/64/128)
  bool clip = false;     // search a shrink factor per row-group minimising Σ|Q − W|^clip_norm
  float clip_norm = quant::kMseClipNorm;             // 2.4 as GPTQ's mse option; 2 = plain L2
  int clip_grid = quant::kMseClipGrid;               // p = 1 − i/grid
  int clip_candidates = quant::kMseClipCandidates;   // i = 0 .. candidates−1
  std::string name;      // tensor/module name, used in errors and copied to QuantizedLinear::name
  bool bf16_scales = false;  // the grid's scales are bf16 (a bf16 model's output), else fp16
};

struct RtnStats {
  double rel_weight_err = 0;  // ‖W − Ŵ‖_F / ‖W‖_F
  double seconds = 0;
};

// Throws marlinc::Error (BadUsage for options, BadData for non-finite weights), naming opts.name.
QuantizedLinear rtn_quantize(const float* W /*[n, k]*/, int64_t n, int64_t k, const RtnOptions& opts,
                             RtnStats* stats = nullptr);
// Scalar single-threaded reference; rtn_quantize is held bit-exact to it.
QuantizedLinear rtn_quantize_ref(const float* W /*[n, k]*/, int64_t n, int64_t k, const RtnOptions& opts);

namespace quant {
// Shared option checks (also used by GPTQ): bits, group size vs k, finite weights.
void check_common(const std::string& name, int bits, int group_size, int64_t n, int64_t k);
void check_finite(const std::string& name, const float* W, int64_t count);
// ‖W − Ŵ‖_F / ‖W‖_F with W [n, k] (HF orientation) and Ŵ = dequantize(q) [k, n].
double relative_weight_error(const float* W, const QuantizedLinear& q);
}  // namespace quant

}  // namespace marlinc
