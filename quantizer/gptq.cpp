// GPTQ CPU back end: the blocked lazy-update loop (spec: gptq.md §1.6, §1.11), run independently
// on chunks of output rows (rows never interact in GPTQ: they share only U). The weights are kept
// transposed, [k, chunk], so one input column of the chunk is a contiguous vector; the in-block
// rank-1 updates are AXPYs over it and the trailing update is one GEMM per block. All of it in double
// (gptq.h: the CUDA back end must reach the same codes).
#include <algorithm>
#include <chrono>
#include <cmath>

#include "checkpoint/error.h"
#include "checkpoint/half.h"
#include "quantizer/clip.h"
#include "quantizer/gptq_internal.h"
#include "quantizer/grid.h"
#include "quantizer/rtn.h"

namespace marlinc {

std::string order_name(GptqOptions::Order o) {
  switch (o) {
    case GptqOptions::Natural: return "natural";
    case GptqOptions::StaticActOrder: return "static";
    case GptqOptions::Gar: return "gar";
    case GptqOptions::DynamicActOrder: return "dynamic";
  }
  return "?";
}

namespace gptq {

std::vector<RowMatrixXd> clip_weights(const GptqOptions& o, const Prepared& P) {
  std::vector<RowMatrixXd> out;
  if (o.clip != GptqOptions::Marlin || o.group_size <= 0 || !dynamic_groups(o)) return out;
  const int64_t g = P.group, G = P.k / g;
  out.resize(size_t(G));
#pragma omp parallel for schedule(static)
  for (int64_t gi = 0; gi < G; ++gi) {
    RowMatrixXd Ug = P.U.block(gi * g, gi * g, g, g);
    RowMatrixXd Minv = RowMatrixXd::Identity(g, g);
    Ug.triangularView<Eigen::Upper>().solveInPlace(Minv);
    Minv.triangularView<Eigen::StrictlyLower>().setZero();
    out[size_t(gi)] = std::move(Minv);
  }
  return out;
}

QuantizedLinear make_result(const GptqOptions& o, const Prepared& P) {
  QuantizedLinear q;
  q.name = o.name;
  q.k = P.k;
  q.n = P.n;
  q.bits = o.bits;
  q.group_size = o.group_size;
  q.sym = true;
  q.scale_type = o.bf16_scales ? ScaleType::BF16 : ScaleType::F16;
  q.codes.assign(size_t(P.k * P.n), uint8_t(quant::zero_code(o.bits)));
  q.scales.assign(size_t(q.groups() * P.n), 0);
  if (!P.static_scales.empty())
    for (size_t i = 0; i < q.scales.size(); ++i) q.scales[i] = float_to_word16(P.static_scales[i], o.bf16_scales);
  if (o.sparse24) q.mask.assign(size_t(P.k * P.n), 1);
  if (o.order == GptqOptions::DynamicActOrder && o.group_size > 0) {
    q.g_idx.assign(size_t(P.k), 0);
    for (int64_t p = 0; p < P.k; ++p) q.g_idx[size_t(P.perm[size_t(p)])] = int32_t(p / P.group);
  }
  return q;
}

void finish_stats(const float* W, const QuantizedLinear& q, const Prepared& P, double loss, double seconds,
                  GptqStats* stats) {
  if (!stats) return;
  stats->loss = loss;
  stats->rel_weight_err = quant::relative_weight_error(W, q);
  stats->damp_used = P.damp_used;
  stats->fell_back_to_rtn = P.fell_back;
  stats->seconds = seconds;
  stats->dead_columns = P.dead;
}

}  // namespace gptq

namespace {

using gptq::RowMatrixXd;
using RowMap = Eigen::Map<RowMatrixXd>;

// Output rows per task. Fixed (not derived from the thread count) so results are identical for any
// number of threads; 128 keeps the per-block GEMM efficient and the working copy in L2 per column.
constexpr int64_t kChunk = 128;

// Runs the whole GPTQ loop for output rows [c0, c0 + nc); returns the chunk's OBS loss.
double run_chunk(const GptqOptions& o, const gptq::Prepared& P, const std::vector<RowMatrixXd>& Minv, int64_t c0,
                 int64_t nc, QuantizedLinear& q) {
  const int64_t k = P.k, n = P.n, g = P.group, B = P.block;
  const int bits = o.bits;
  RowMatrixXd Wc(k, nc);  // [k, nc] working weights, processing order
  for (int64_t p = 0; p < k; ++p) std::copy_n(P.Wt.data() + p * n + c0, nc, Wc.data() + p * nc);
  RowMatrixXd E(B, nc);   // [B, nc] scaled errors of the current block
  std::vector<float> s(static_cast<size_t>(nc));          // [nc] scales of the current group (fp16/bf16 values)
  std::vector<double> amax(static_cast<size_t>(nc));     // [nc] absmax of the current group
  std::vector<uint8_t> pruned(static_cast<size_t>(4 * nc));  // [4, nc] 2:4 decisions of the current 4-group
  double loss = 0.0;
  const bool dyn = gptq::dynamic_groups(o);
  for (int64_t i1 = 0; i1 < k; i1 += B) {
    const int64_t i2 = std::min(i1 + B, k);
    for (int64_t p = i1; p < i2; ++p) {
      double* w = Wc.data() + p * nc;
      const int64_t srow = gptq::scale_row(o, P, p);
      if (dyn && p % g == 0) {
        // Fit on the working copy, which already carries every earlier column's error feedback.
        if (!Minv.empty()) {
          quant::weighted_clip_scales(w, g, nc, nc, Minv[size_t(p / g)].data(), quant::Tri::Upper, bits,
                                      quant::kMarlinClipGrid, quant::kMarlinClipCandidates, o.bf16_scales, s.data());
        } else {
          std::fill(amax.begin(), amax.end(), 0.0);
          for (int64_t t = 0; t < g; ++t) {
            const double* x = w + t * nc;
            for (int64_t r = 0; r < nc; ++r) amax[size_t(r)] = std::max(amax[size_t(r)], std::fabs(x[r]));
          }
          for (int64_t r = 0; r < nc; ++r) s[size_t(r)] = quant::sym_scale(amax[size_t(r)], bits, o.bf16_scales);
        }
        for (int64_t r = 0; r < nc; ++r) q.scales[size_t(srow * n + c0 + r)] = float_to_word16(s[size_t(r)], o.bf16_scales);
      } else if (!dyn) {
        std::copy_n(P.static_scales.data() + srow * n + c0, nc, s.data());  // written by make_result
      }
      if (o.sparse24 && p % 4 == 0) {
        double d[4];
        for (int t = 0; t < 4; ++t) d[t] = P.U(p + t, p + t);
        for (int64_t r = 0; r < nc; ++r) {
          double ww[4];
          for (int t = 0; t < 4; ++t) ww[t] = Wc(p + t, r);
          const unsigned m = gptq::prune_24(ww, d);
          for (int t = 0; t < 4; ++t) pruned[size_t(t * nc + r)] = uint8_t(m >> t & 1u);
        }
      }
      const double d = P.U(p, p);
      double* e = E.data() + (p - i1) * nc;
      const int64_t orig = P.perm[size_t(p)];
      uint8_t* codes = q.codes.data() + orig * n + c0;
      uint8_t* mask = o.sparse24 ? q.mask.data() + orig * n + c0 : nullptr;
      const uint8_t* pr = o.sparse24 ? pruned.data() + (p % 4) * nc : nullptr;
      for (int64_t r = 0; r < nc; ++r) {
        const float sc = s[size_t(r)];
        int code;
        if (pr && pr[r]) {
          code = quant::zero_code(bits);
          mask[r] = 0;
        } else {
          code = quant::quantize_code(w[r], sc, bits);
        }
        codes[r] = uint8_t(code);
        const double err = (w[r] - double(quant::dequant(code, sc, bits))) / d;
        e[r] = err;
        loss += err * err;
      }
      // In-block OBS update of the remaining columns of this block (rank 1).
      const double* urow = P.U.data() + p * k;
      for (int64_t t = p + 1; t < i2; ++t) {
        const double u = urow[t];
        double* x = Wc.data() + t * nc;
        for (int64_t r = 0; r < nc; ++r) x[r] -= u * e[r];
      }
    }
    if (i2 < k) {
      // Lazy update of every later column with the whole block's errors: one GEMM.
      RowMap rest(Wc.data() + i2 * nc, k - i2, nc);
      Eigen::Map<const RowMatrixXd, 0, Eigen::OuterStride<>> Ub(P.U.data() + i1 * k + i2, i2 - i1, k - i2, Eigen::OuterStride<>(k));
      rest.noalias() -= Ub.transpose() * E.topRows(i2 - i1);
    }
  }
  return 0.5 * loss;
}

}  // namespace

QuantizedLinear gptq_quantize(const float* W, int64_t n, int64_t k, const Eigen::MatrixXf& H, const GptqOptions& o,
                              GptqStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.device == GptqOptions::Device::Cuda) {
    gptq::check_options(o, n, k, H);  // throws when CUDA is not built in
#ifdef MARLINC_HAVE_CUDA
    QuantizedLinear gptq_quantize_cuda(const float*, int64_t, int64_t, const Eigen::MatrixXf&, const GptqOptions&,
                                       GptqStats*);
    return gptq_quantize_cuda(W, n, k, H, o, stats);
#endif
  }
  const gptq::Prepared P = gptq::prepare(W, n, k, H, o, /*ref=*/false);
  const std::vector<RowMatrixXd> Minv = gptq::clip_weights(o, P);
  QuantizedLinear q = gptq::make_result(o, P);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> loss(static_cast<size_t>(chunks), 0.0);  // [chunks], summed in order for determinism
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t c0 = c * kChunk;
    loss[size_t(c)] = run_chunk(o, P, Minv, c0, std::min(kChunk, n - c0), q);
  }
  double total = 0.0;
  for (double l : loss) total += l;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  gptq::finish_stats(W, q, P, total, secs, stats);
  return q;
}

}  // namespace marlinc
