// The calibration runner's side of the GPU forward pass: maps llama.h's model, blocks and
// dequantized weights onto CudaForward's plain interface (forward_cuda.h). Needs a build with
// MARLINC_CUDA.
#pragma once
#include <initializer_list>
#include <string>
#include <vector>

#include "packer/quantized_linear.h"
#include "quantizer/calib/forward_cuda.h"
#include "quantizer/calib/llama.h"
#include "quantizer/calib/quantized_linears.h"

namespace marlinc::calib {

// BadUsage naming `what` (the option) when no CUDA device is visible, before any work starts.
void require_cuda_device(const std::string& what);

// Device memory free to allocate now: the driver's free memory plus what the stream-ordered pool holds unused.
double available_device_bytes();

// How many GPTQs the GPU pass runs at once at most (fewer when the free device memory does not take them).
size_t gpu_gptq_at_once(const LlamaConfig& c);

GpuDims gpu_dims(const LlamaConfig& c);
// fp16 for fp16/fp32 checkpoints; bf16 for bf16 ones (judged by block 0's q_proj).
GpuAct gpu_act_for(const LlamaModel& m);

// A CudaForward for these samples, their embeddings already uploaded as the first block's inputs.
std::unique_ptr<CudaForward> make_gpu_forward(const LlamaModel& m, const std::vector<std::vector<int32_t>>& samples,
                                              size_t chunk_tokens = CudaForward::kDefaultChunkTokens);
std::unique_ptr<CudaForward> make_gpu_forward(const LlamaModel& m, const std::vector<std::vector<int32_t>>& samples,
                                              GpuAct act, size_t chunk_tokens);
// How a block's linears reached the GPU.
struct GpuLinearCounts {
  int plain = 0;        // the checkpoint's 16/32-bit weight
  int kernel = 0;       // quantized, run through the Marlin kernel
  int dequantized = 0;  // quantized, dequantized on the device (the kernel does not take it)
};
// Why a quantized linear cannot run through the Marlin kernel with these activations ("" when it can):
// the kernel takes dense symmetric 4-bit layers without act-order, k % 128 == 0, n % 64 == 0, scales of
// the activations' type.
std::string marlin_rule(const QuantizedLinear& q, GpuAct act);
// Block b's norms and biases, and its linears: plain ones straight from the checkpoint's bytes (no
// fp32 copy on the host); with `ql`, its quantized ones through the Marlin kernel when `kernel` and
// they fit it, else dequantized on the device.
void upload_block(CudaForward& f, const LlamaModel& m, int64_t b, const QuantizedLinears* ql = nullptr,
                  bool kernel = false, GpuLinearCounts* counts = nullptr);
// Every window's hidden states after the last block (before the final norm), run on the GPU.
std::vector<Matrix> gpu_final_hidden(const LlamaModel& m, const std::vector<std::vector<int32_t>>& windows,
                                     const QuantizedLinears* ql, bool kernel, GpuLinearCounts* counts);
// One linear's quantized weights (dequantized on the device).
void upload_quantized(CudaForward& f, LinearRef r, const QuantizedLinear& q);
void run_block(CudaForward& f, std::initializer_list<LinearInput> capture, bool update, int64_t block);
Matrix download_hidden(const CudaForward& f, size_t sample, int64_t hidden);

}  // namespace marlinc::calib
