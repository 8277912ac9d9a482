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
// The arithmetic check of one layer on the GPU. A [M, k] stacks batches of `batches[i]` rows, words of
// the layer's kernel type (bf16 where q's scales are bf16, else fp16: verify/arith.h, bf16_kernel);
// each batch runs through our Marlin kernel of that type on the packed form of q (C [M, n], results
// as float), and R [M, n] is the float64 reference from the exact dequantized weights (cuBLAS DGEMM).
// Act-order layers (g_idx) run as vLLM runs them: rows sorted by group and A's columns in that order;
// the reference stays in the stored order. 2:4 layers run the dense kernel with their pruned weights as
// zero codes. Returns false with `why` when the layer is outside what the kernel runs (zero points, 8
// bits, act-order groups of unequal sizes), or on a CUDA failure (the caller then falls back to the CPU
// path).
bool gpu_arith(const std::string& name, const QuantizedLinear& q, const std::vector<uint16_t>& A,
               const std::vector<int>& batches, std::vector<float>& C, std::vector<double>& R, std::string& why);

}  // namespace marlinc
