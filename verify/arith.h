// The arithmetic check's CPU side: a GEMM that follows the Marlin kernel's numerics, and the float64
// reference it is compared with. Both read the unpacked QuantizedLinear, so a layout error is the
// layout check's job; this one catches scales and codes whose products misbehave in fp16
// (overflow to inf, precision loss) exactly where the kernel would.
#pragma once
#include <cstdint>
#include <vector>

#include "packer/quantized_linear.h"

namespace marlinc {

// Output columns the CPU check evaluates: all of them up to `max_cols`, else `max_cols` columns spread
// evenly (deterministic), always including the first and last.
std::vector<int64_t> sample_columns(int64_t n, int64_t max_cols);

// The kernel a layer runs on takes activations, scales and outputs of one 16-bit type, so the layer's
// scale type decides it: fp16 scales -> the fp16 kernel, bf16 scales -> the bf16 kernel (formats.md §2.6).
// A, C and the activations below are words of that type.
inline bool bf16_kernel(const QuantizedLinear& q) { return q.scale_type == ScaleType::BF16; }

// C[m, cols] with the kernel's numerics in the layer's 16-bit type (bf16_kernel): grouped scales ->
// each weight (code - z) * s rounded to that type, products accumulated in fp32; per-channel scale ->
// integer weights accumulated in fp32, then scaled once in fp32; the result rounded to that type
// (returned as float). A is [m, k] words of that type.
std::vector<float> gemm_kernel_numerics(const std::vector<uint16_t>& A, int m, const QuantizedLinear& q,
                                        const std::vector<int64_t>& cols);
// C[m, cols] in float64 from the exact dequantized weights (A as above).
std::vector<double> gemm_reference(const std::vector<uint16_t>& A, int m, const QuantizedLinear& q,
                                   const std::vector<int64_t>& cols);

struct RelErr {
  double mean_rel = 0;  // mean|C - R| / mean|R|
  double max_rel = 0;   // max|C - R| / max|R|
  bool finite = true;
};
RelErr compare(const std::vector<float>& c, const std::vector<double>& ref);

// Random activations [m, k], uniform in [-1, 1), from a seed (splitmix64, portable), as fp16 words or
// (bf16) the same draws rounded to bf16.
std::vector<uint16_t> random_activations(int m, int64_t k, uint64_t seed, bool bf16 = false);

}  // namespace marlinc
