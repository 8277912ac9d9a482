// GPTQ scalar reference: the textbook loop of gptq.md §1.11 without lazy blocks, one output row at
// a time (rows are independent), every OBS update applied to all later columns immediately. Double
// like the fast path, which must agree with it up to rounding ties (tests/quantizer/test_gptq.cpp).
#include <algorithm>
#include <chrono>
#include <cmath>

#include "checkpoint/half.h"
#include "quantizer/clip.h"
#include "quantizer/gptq_internal.h"
#include "quantizer/grid.h"

namespace marlinc {

QuantizedLinear gptq_quantize_ref(const float* W, int64_t n, int64_t k, const Eigen::MatrixXf& H, const GptqOptions& o,
                                  GptqStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  const gptq::Prepared P = gptq::prepare(W, n, k, H, o, /*ref=*/true);
  const std::vector<gptq::RowMatrixXd> Minv = gptq::clip_weights(o, P);
  QuantizedLinear q = gptq::make_result(o, P);
  const int64_t g = P.group;
  const int bits = o.bits;
  double loss = 0.0;
  std::vector<double> w(static_cast<size_t>(k));  // [k] one output row, processing order
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t p = 0; p < k; ++p) w[size_t(p)] = P.Wt[size_t(p * n + r)];
    float s = 0.0f;
    unsigned pruned = 0;
    for (int64_t p = 0; p < k; ++p) {
      const int64_t srow = gptq::scale_row(o, P, p);
      if (gptq::dynamic_groups(o) && p % g == 0) {
        if (!Minv.empty()) {
          s = quant::weighted_clip_scale_ref(w.data() + p, g, 1, Minv[size_t(p / g)].data(), bits,
                                             quant::kMarlinClipGrid, quant::kMarlinClipCandidates, o.bf16_scales);
        } else {
          double absmax = 0.0;
          for (int64_t t = p; t < p + g; ++t) absmax = std::max(absmax, std::fabs(w[size_t(t)]));
          s = quant::sym_scale(absmax, bits, o.bf16_scales);
        }
        q.scales[size_t(srow * n + r)] = float_to_word16(s, o.bf16_scales);
      } else if (!gptq::dynamic_groups(o)) {
        s = P.static_scales[size_t(srow * n + r)];
      }
      if (o.sparse24 && p % 4 == 0) {
        double d4[4];
        for (int t = 0; t < 4; ++t) d4[t] = P.U(p + t, p + t);
        pruned = gptq::prune_24(w.data() + p, d4);
      }
      const int64_t orig = P.perm[size_t(p)];
      int code;
      if (o.sparse24 && (pruned >> (p % 4) & 1u)) {
        code = quant::zero_code(bits);
        q.mask[size_t(orig * n + r)] = 0;
      } else {
        code = quant::quantize_code(w[size_t(p)], s, bits);
      }
      q.codes[size_t(orig * n + r)] = uint8_t(code);
      const double d = P.U(p, p);
      const double err = (w[size_t(p)] - double(quant::dequant(code, s, bits))) / d;
      loss += err * err;
      for (int64_t t = p + 1; t < k; ++t) w[size_t(t)] -= err * P.U(p, t);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  gptq::finish_stats(W, q, P, 0.5 * loss, secs, stats);
  return q;
}

}  // namespace marlinc
