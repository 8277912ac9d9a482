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

// C[m, cols] with the kernel's numerics: grouped scales -> each weight (code - z) * s rounded to fp16,
// products accumulated in fp32; per-channel scale -> integer weights accumulated in fp32, then scaled
// once in fp32; the result rounded to fp16 (returned as float). A is fp16 bits [m, k].
std::vector<float> gemm_kernel_numerics(const std::vector<uint16_t>& A, int m, const QuantizedLinear& q,
                                        const std::vector<int64_t>& cols);
// C[m, cols] in float64 from the exact dequantized weights.
std::vector<double> gemm_reference(const std::vector<uint16_t>& A, int m, const QuantizedLinear& q,
                                   const std::vector<int64_t>& cols);

struct RelErr {
  double mean_rel = 0;  // mean|C - R| / mean|R|
  double max_rel = 0;   // max|C - R| / max|R|
  bool finite = true;
};
RelErr compare(const std::vector<float>& c, const std::vector<double>& ref);

// Random fp16 activations [m, k], uniform in [-1, 1), from a seed (splitmix64, portable).
std::vector<uint16_t> random_activations(int m, int64_t k, uint64_t seed);

}  // namespace marlinc
