// The arithmetic check's GPU side: the packed layer through our Marlin kernel. Without CUDA (or
// without a device) gpu_available() is false and the CPU path runs instead; the certificate records
// which one ran.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "packer/quantized_linear.h"

namespace marlinc {

bool gpu_available(std::string& device_name);
// C[m, n] (fp16 results as float) from the packed Marlin form of q. Returns false with `why` when the
// layer is outside what the kernel runs (the caller then falls back to the CPU path).
bool gpu_gemm_packed(const std::string& name, const QuantizedLinear& q, const std::vector<uint16_t>& A, int m,
                     std::vector<float>& C, std::string& why);

}  // namespace marlinc
