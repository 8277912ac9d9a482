// Perplexity with our forward pass (stories260K README §6 defines the method): windows of `ctx`
// tokens every `stride` tokens over one token stream, each window run on its own from position 0;
// a window scores the tokens no earlier window scored (all of positions 1..len-1 when stride == ctx),
// NLL summed in float64, ppl = exp(mean NLL).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "quantizer/calib/llama.h"

namespace marlinc::calib {

struct PplOptions {
  size_t ctx = 256;
  size_t stride = 0;      // 0: = ctx (non-overlapping windows)
  size_t max_tokens = 0;  // 0: all; else the stream is cut to its first max_tokens tokens
  // Cuda: the blocks run on the GPU (forward_cuda.h; 16-bit GEMM inputs), a quantized checkpoint's
  // Marlin-compatible linears through marlinc's Marlin kernel; logits and NLL stay on the CPU.
  enum class Device { Cpu, Cuda };
  Device device = Device::Cpu;
};

struct PplResult {
  double ppl = 0, nll_sum = 0, mean_nll = 0;
  size_t tokens = 0;     // stream length after max_tokens
  size_t predicted = 0;  // tokens scored
  size_t windows = 0;
  double seconds = 0;
  // --device cuda: how the block linears ran (summed over blocks).
  int gpu_plain = 0, gpu_kernel = 0, gpu_dequantized = 0;
};

// Called after each window: (windows done, windows total, tokens scored so far, running NLL sum).
// Windows run in parallel: calls come from worker threads, one at a time (under a lock).
using PplProgress = std::function<void(size_t, size_t, size_t, double)>;

// Log-softmax NLL of `target` under one row of logits, in float64.
double token_nll(const float* logits_row, int64_t vocab, int32_t target);

PplResult perplexity(const LlamaModel& model, std::span<const int32_t> tokens, const PplOptions& opt,
                     const PplProgress& progress = nullptr, const LinearProvider* provider = nullptr);

// Text as `marlinc ppl` reads it: CRLF -> LF (WikiText ships CRLF line ends).
std::string normalize_newlines(std::string_view text);

}  // namespace marlinc::calib
