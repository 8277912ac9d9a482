#include "quantizer/clip.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "quantizer/grid.h"

namespace marlinc::quant {

namespace {

using RowMat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Candidates evaluated per GEMM: 76 = 4 × 19, so Marlin's grid is 4 equal batches and the working
// buffers stay ~2.4 MiB each for a 128 × 128 tile of doubles.
constexpr int kCandidateBatch = 19;

// |d|^norm with exact fast paths for the common integer norms (pow is ~20× slower than a multiply).
inline double abs_pow(double d, double norm) {
  d = std::fabs(d);
  if (norm == 2.0) return d * d;
  if (norm == 1.0) return d;
  return std::pow(d, norm);
}

}  // namespace

float lp_clip_scale(const float* x, int64_t len, int64_t stride, int bits, float norm, int grid,
                    int candidates, bool bf16) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < len; ++i) absmax = std::max(absmax, std::fabs(x[i * stride]));
  float best_s = sym_scale(absmax, bits, bf16);
  if (absmax == 0.0f) return best_s;
  double best = std::numeric_limits<double>::infinity();
  for (int c = 0; c < candidates; ++c) {
    const float s = candidate_scale(absmax, c, grid, bits, bf16);
    double err = 0.0;
    for (int64_t i = 0; i < len; ++i) {
      const float w = x[i * stride];
      err += abs_pow(double(dequant(quantize_code(w, s, bits), s, bits)) - double(w), norm);
    }
    if (err < best) { best = err; best_s = s; }
  }
  return best_s;
}

float weighted_clip_scale_ref(const double* x, int64_t g, int64_t stride, const double* M, int bits,
                              int grid, int candidates, bool bf16) {
  double absmax = 0.0;
  for (int64_t t = 0; t < g; ++t) absmax = std::max(absmax, std::fabs(x[t * stride]));
  float best_s = sym_scale(absmax, bits, bf16);
  if (absmax == 0.0) return best_s;
  std::vector<double> delta(static_cast<size_t>(g));
  double best = std::numeric_limits<double>::infinity();
  for (int c = 0; c < candidates; ++c) {
    const float s = candidate_scale(absmax, c, grid, bits, bf16);
    for (int64_t t = 0; t < g; ++t) {
      const double w = x[t * stride];
      delta[size_t(t)] = double(dequant(quantize_code(w, s, bits), s, bits)) - w;
    }
    double err = 0.0;
    for (int64_t u = 0; u < g; ++u) {  // (Mᵀδ)_u = Σ_t M[t, u]·δ_t
      double acc = 0.0;
      for (int64_t t = 0; t < g; ++t) acc += M[t * g + u] * delta[size_t(t)];
      err += acc * acc;
    }
    if (err < best) { best = err; best_s = s; }
  }
  return best_s;
}

void weighted_clip_scales(const double* X, int64_t g, int64_t cols, int64_t ld, const double* M, Tri tri,
                          int bits, int grid, int candidates, bool bf16, float* scales) {
  std::vector<double> absmax(static_cast<size_t>(cols), 0.0);  // [cols]
  for (int64_t t = 0; t < g; ++t)
    for (int64_t r = 0; r < cols; ++r) absmax[size_t(r)] = std::max(absmax[size_t(r)], std::fabs(X[t * ld + r]));
  std::vector<double> best(static_cast<size_t>(cols), std::numeric_limits<double>::infinity());  // [cols]
  for (int64_t r = 0; r < cols; ++r) scales[r] = sym_scale(absmax[size_t(r)], bits, bf16);

  Eigen::Map<const RowMat> Mm(M, g, g);
  const int nb_max = std::min(candidates, kCandidateBatch);
  RowMat D(g, cols * nb_max), P(g, cols * nb_max);  // [g, cols·batch] candidate errors, then Mᵀ·D
  std::vector<float> cand_s(static_cast<size_t>(cols * nb_max));  // [batch, cols]
  std::vector<double> err(static_cast<size_t>(cols * nb_max));    // [batch, cols]
  for (int c0 = 0; c0 < candidates; c0 += nb_max) {
    const int nb = std::min(nb_max, candidates - c0);
    for (int b = 0; b < nb; ++b)
      for (int64_t r = 0; r < cols; ++r) cand_s[size_t(b * cols + r)] = candidate_scale(absmax[size_t(r)], c0 + b, grid, bits, bf16);
    for (int64_t t = 0; t < g; ++t) {
      double* drow = D.data() + t * D.cols();
      const double* xrow = X + t * ld;
      for (int b = 0; b < nb; ++b)
        for (int64_t r = 0; r < cols; ++r) drow[b * cols + r] = round_error(xrow[r], cand_s[size_t(b * cols + r)], bits);
    }
    auto Db = D.leftCols(nb * cols);
    auto Pb = P.leftCols(nb * cols);
    switch (tri) {
      case Tri::Upper: Pb.noalias() = Mm.transpose().triangularView<Eigen::Lower>() * Db; break;
      case Tri::Lower: Pb.noalias() = Mm.transpose().triangularView<Eigen::Upper>() * Db; break;
      case Tri::Dense: Pb.noalias() = Mm.transpose() * Db; break;
    }
    std::fill(err.begin(), err.end(), 0.0);
    for (int64_t u = 0; u < g; ++u) {  // row-wise so the sum of squares streams through P
      const double* prow = P.data() + u * P.cols();
      for (int64_t i = 0; i < nb * cols; ++i) err[size_t(i)] += prow[i] * prow[i];
    }
    for (int b = 0; b < nb; ++b)
      for (int64_t r = 0; r < cols; ++r) {
        const double e = err[size_t(b * cols + r)];
        if (absmax[size_t(r)] != 0.0 && e < best[size_t(r)]) {
          best[size_t(r)] = e;
          scales[r] = cand_s[size_t(b * cols + r)];
        }
      }
  }
}

}  // namespace marlinc::quant
