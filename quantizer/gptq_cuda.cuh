// Host API of the GPTQ CUDA back end (definitions in gptq_cuda.cu). Plain C++ declarations, so
// host-only translation units (tests, the CLI) may include it; needs a build with MARLINC_CUDA.
// gptq_quantize() with GptqOptions::device == Cuda is the normal entry point; the functions here
// add what a GPU caller needs beyond it: Hessian accumulation on the device.
#pragma once
#include <Eigen/Dense>
#include <cstdint>
#include <string>

#include "packer/quantized_linear.h"
#include "quantizer/gptq.h"

namespace marlinc {

// Same contract as gptq_quantize (W [n, k] row-major host, H [k, k] host); every O(k³) / O(n·k²)
// step runs on the current CUDA device. Throws marlinc::Error; failed device calls are Internal
// and name opts.name and the call.
QuantizedLinear gptq_quantize_cuda(const float* W, int64_t n, int64_t k, const Eigen::MatrixXf& H,
                                   const GptqOptions& opts, GptqStats* stats);

// The same with the finalized Hessian d_H [k, k] already in device memory (as
// hessian_finalize_cuda_device leaves it): the matrix never crosses to the host (only its diagonal,
// and the whole of it for static act-order).
QuantizedLinear gptq_quantize_cuda_device(const float* W, int64_t n, int64_t k, const float* d_H,
                                          const GptqOptions& opts, GptqStats* stats);
// About the device memory one such call holds at its peak for W [n, k]: what bounds how many run at once.
double gptq_cuda_device_bytes(int64_t n, int64_t k);

enum class ActDtype { F32, F16, BF16 };

// Adds Σ x xᵀ of t tokens X [t, k] row-major (fp32, or raw fp16/bf16 words) to an un-normalised
// device accumulator sum [k, k] fp32 (column-major = row-major: the GEMM fills both triangles).
// X may live on the device or the host (copied up first). fp32 accumulation always; 16-bit inputs
// use tensor cores (gptq.md §1.12: rel. error ~1e-4). Synchronous with respect to the host.
// `name` is used in errors.
void hessian_add_cuda(float* d_sum, int64_t k, const void* X, int64_t t, ActDtype dtype, bool x_on_device,
                      const std::string& name = "hessian");

// H = (2 / tokens)·sum into the caller's device buffer d_H [k, k] (for gptq_quantize_cuda_device).
void hessian_finalize_cuda_device(const float* d_sum, int64_t k, int64_t tokens, float* d_H,
                                  const std::string& name = "hessian");
// H = (2 / tokens)·sum, copied to the host (the layout gptq_quantize takes).
Eigen::MatrixXf hessian_finalize_cuda(const float* d_sum, int64_t k, int64_t tokens,
                                      const std::string& name = "hessian");

}  // namespace marlinc
