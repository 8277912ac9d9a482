// The calibration runner's side of the GPU forward pass: maps llama.h's model, blocks and
// dequantized weights onto CudaForward's plain interface (forward_cuda.h). Needs a build with
// MARLINC_CUDA.
#pragma once
#include <initializer_list>
#include <vector>

#include "packer/quantized_linear.h"
#include "quantizer/calib/forward_cuda.h"
#include "quantizer/calib/llama.h"

namespace marlinc::calib {

GpuDims gpu_dims(const LlamaConfig& c);
// fp16 for fp16/fp32 checkpoints; bf16 for bf16 ones (judged by block 0's q_proj).
GpuAct gpu_act_for(const LlamaModel& m);

// A CudaForward for these samples, their embeddings already uploaded as the first block's inputs.
std::unique_ptr<CudaForward> make_gpu_forward(const LlamaModel& m, const std::vector<std::vector<int32_t>>& samples,
                                              size_t chunk_tokens = CudaForward::kDefaultChunkTokens);
std::unique_ptr<CudaForward> make_gpu_forward(const LlamaModel& m, const std::vector<std::vector<int32_t>>& samples,
                                              GpuAct act, size_t chunk_tokens);
// Block b's linears straight from the checkpoint's bytes (no fp32 copy on the host), its norms and
// biases.
void upload_block(CudaForward& f, const LlamaModel& m, int64_t b);
// One linear's quantized weights (dequantized on the device).
void upload_quantized(CudaForward& f, Linear l, const QuantizedLinear& q);
void run_block(CudaForward& f, std::initializer_list<LinearInput> capture, bool update, int64_t block);
Matrix download_hidden(const CudaForward& f, size_t sample, int64_t hidden);

}  // namespace marlinc::calib
