#include "quantizer/calib/perplexity.h"

#ifdef MARLINC_HAVE_CUDA
#include "quantizer/calib/gpu_calib.h"
#endif

#include <algorithm>
#include <chrono>
#include <cmath>

#include "checkpoint/error.h"

namespace marlinc::calib {

double token_nll(const float* row, int64_t vocab, int32_t target) {
  double mx = -INFINITY;
  for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, static_cast<double>(row[j]));
  double sum = 0;
  for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
  return std::log(sum) + mx - static_cast<double>(row[target]);
}

PplResult perplexity(const LlamaModel& model, std::span<const int32_t> tokens, const PplOptions& opt,
                     const PplProgress& progress, const LinearProvider* provider) {
  const size_t ctx = opt.ctx, stride = opt.stride ? opt.stride : opt.ctx;
  if (ctx < 2) bad_usage("--ctx must be at least 2 (got " + std::to_string(ctx) + ")");
  if (stride > ctx) bad_usage("--stride (" + std::to_string(stride) + ") must not exceed --ctx (" + std::to_string(ctx) + ")");
  if (opt.max_tokens && tokens.size() > opt.max_tokens) tokens = tokens.first(opt.max_tokens);
  if (tokens.size() < 2) bad_data("perplexity needs at least 2 tokens of text (got " + std::to_string(tokens.size()) + ")");
  // Checked here because an exception cannot leave the parallel loop below.
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= model.config().vocab)
      bad_data("token id " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
               " is outside the model's vocabulary of " + std::to_string(model.config().vocab));
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t vocab = model.config().vocab;
  const bool gpu = opt.device == PplOptions::Device::Cuda;
#ifndef MARLINC_HAVE_CUDA
  if (gpu) bad_usage("--device cuda: this marlinc was built without CUDA (configure with -DMARLINC_CUDA=ON)");
#else
  if (gpu) require_cuda_device("--device cuda");
#endif
  std::vector<BlockWeights> blocks;
  if (!gpu)
    for (int64_t i = 0; i < model.config().layers; ++i) blocks.push_back(model.load_block(i, provider));

  // Window starts 0, stride, 2*stride, ... until a window reaches the end of the stream. Window w
  // scores positions [max(b+1, end of window w-1), e).
  const size_t n = tokens.size();
  std::vector<size_t> begins;
  for (size_t b = 0;; b += stride) {
    begins.push_back(b);
    if (b + ctx >= n) break;
  }
  const size_t total = begins.size();
  PplResult r;
  // On the GPU every window runs through the blocks at once (the windows are its samples).
  std::vector<Matrix> final_hidden;  // [windows] x [len, hidden]
#ifdef MARLINC_HAVE_CUDA
  if (gpu) {
    std::vector<std::vector<int32_t>> windows;
    for (size_t b : begins) {
      const auto win = tokens.subspan(b, std::min(b + ctx, n) - b);
      windows.emplace_back(win.begin(), win.end());
    }
    GpuLinearCounts counts;
    final_hidden = gpu_final_hidden(model, windows, dynamic_cast<const QuantizedLinears*>(provider), true, &counts);
    r.gpu_plain = counts.plain;
    r.gpu_kernel = counts.kernel;
    r.gpu_dequantized = counts.dequantized;
  }
#endif
  std::vector<double> nll(total, 0.0);     // [windows] per-window NLL sums, added in order afterwards
  std::vector<size_t> scored(total, 0);    // [windows]
  size_t done = 0, done_scored = 0;
  double done_nll = 0;
  // Windows are independent: threads take whole windows (coarse grain; the GEMMs inside then run
  // single-threaded), and the sum is formed in window order so the result does not depend on threads.
#pragma omp parallel for schedule(dynamic, 1) if (total > 1)
  for (size_t w = 0; w < total; ++w) {
    const size_t b = begins[w], e = std::min(b + ctx, n);
    const size_t first = w == 0 ? 1 : std::max(b + 1, std::min(begins[w - 1] + ctx, n));
    const Matrix logits = gpu ? model.logits(model.final_norm(final_hidden[w]))  // [len, vocab]
                              : model.forward(tokens.subspan(b, e - b), blocks);
    for (size_t t = first; t < e; ++t) {
      nll[w] += token_nll(logits.row(static_cast<Eigen::Index>(t - b - 1)).data(), vocab, tokens[t]);
      ++scored[w];
    }
#pragma omp critical(marlinc_ppl_progress)
    {
      ++done;
      done_scored += scored[w];
      done_nll += nll[w];
      if (progress) progress(done, total, done_scored, done_nll);
    }
  }
  r.tokens = n;
  r.windows = total;
  for (size_t w = 0; w < total; ++w) {
    r.nll_sum += nll[w];
    r.predicted += scored[w];
  }
  r.mean_nll = r.nll_sum / static_cast<double>(r.predicted);
  r.ppl = std::exp(r.mean_nll);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string normalize_newlines(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') continue;
    out.push_back(text[i]);
  }
  return out;
}

}  // namespace marlinc::calib
