// The part of GPTQ both back ends share: option checks, dead columns, column order, damping retry
// and the upper Cholesky factor of the damped inverse Hessian (spec: gptq.md §1.3–§1.5, §1.8).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "checkpoint/error.h"
#include "quantizer/clip.h"
#include "quantizer/gptq.h"
#include "quantizer/gptq_internal.h"
#include "quantizer/grid.h"
#include "quantizer/rtn.h"

namespace marlinc::gptq {

namespace {

// Columns per parallel panel of the triangular inverse.
constexpr int64_t kInvPanel = 64;
// Damping increment and ceiling of the automatic retry (GPTQModel's damp_auto_increment).
constexpr double kDampStep = 0.01;
constexpr double kDampMax = 1.0;

std::string who(const GptqOptions& o) { return o.name.empty() ? std::string("layer") : o.name; }

bool finite_positive_diag(const RowMatrixXd& U) {
  if (!U.allFinite()) return false;
  for (int64_t i = 0; i < U.rows(); ++i)
    if (!(U(i, i) > 0.0)) return false;
  return true;
}

// H[i, j] of the input with a dead column's zero diagonal replaced by 1 (§1.3), in double.
inline double h_at(const Eigen::MatrixXf& H, const std::vector<uint8_t>& dead, int64_t i, int64_t j) {
  return i == j && dead[size_t(i)] ? 1.0 : double(H(i, j));
}

// Core of inverse_cholesky_upper. A holds J·Hd·J (lower triangle read) and is overwritten by its
// Cholesky factor L. Reversing the index order turns "upper factor of the inverse" into "inverse of
// a lower factor": if J·Hd·J = L·Lᵀ then Hd⁻¹ = (J·L⁻ᵀ·J)(J·L⁻¹·J) with J·L⁻¹·J upper and a positive
// diagonal, which by uniqueness is U. One factorisation and one triangular inverse instead of three.
bool inverse_cholesky_upper_reversed(Eigen::MatrixXd& A, RowMatrixXd& U) {
  const int64_t k = A.rows();
  Eigen::LLT<Eigen::Ref<Eigen::MatrixXd>, Eigen::Lower> llt(A);
  if (llt.info() != Eigen::Success) return false;
  for (int64_t i = 0; i < k; ++i)
    if (!(A(i, i) > 0.0) || !std::isfinite(A(i, i))) return false;
  // U(i, j) = L⁻¹(k−1−i, k−1−j) = Y(k−1−j, k−1−i) with Y = L⁻ᵀ: U's row-major storage is Y's
  // column-major storage read backwards. So Y is solved straight into U's buffer (no second k×k
  // matrix) and the buffer is reversed, a streaming pass instead of a strided transpose.
  U.resize(k, k);
  Eigen::Map<Eigen::MatrixXd> Y(U.data(), k, k);  // [k, k] column-major, upper
  Y.setZero();
  const int64_t panels = (k + kInvPanel - 1) / kInvPanel;
  // Columns [r0, r1) of Y are rows [r0, r1) of L⁻¹, which involve only L[:r1, :r1]: Lᵀ·Y = I solved
  // on that corner. Panels are independent; the largest go first for the dynamic schedule.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < panels; ++i) {
    const int64_t p = panels - 1 - i, r0 = p * kInvPanel, r1 = std::min(k, r0 + kInvPanel);
    auto B = Y.block(0, r0, r1, r1 - r0);
    B.bottomRows(r1 - r0).setIdentity();
    A.topLeftCorner(r1, r1).transpose().triangularView<Eigen::Upper>().solveInPlace(B);
  }
  double* u = U.data();
  const int64_t total = k * k;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < total / 2; ++i) std::swap(u[i], u[total - 1 - i]);
  U.triangularView<Eigen::StrictlyLower>().setZero();
  return finite_positive_diag(U);
}

}  // namespace

void check_options(const GptqOptions& o, int64_t n, int64_t k, const Eigen::MatrixXf& H) {
  check_options(o, n, k, H.rows(), H.cols());
}

void check_options(const GptqOptions& o, int64_t n, int64_t k, int64_t h_rows, int64_t h_cols) {
  quant::check_common(o.name, o.bits, o.group_size, n, k);
  if (h_rows != k || h_cols != k)
    bad_usage(who(o) + ": Hessian is [" + std::to_string(h_rows) + ", " + std::to_string(h_cols) +
              "] but the weight has k=" + std::to_string(k) + " input features (expected [k, k])");
  if (!(o.damp >= 0.0f && o.damp < 1.0f))
    bad_usage(who(o) + ": relative damping " + std::to_string(o.damp) + " must be in [0, 1) (option --damp)");
  if (o.block <= 0) bad_usage(who(o) + ": GPTQ block " + std::to_string(o.block) + " must be positive");
  if (o.sparse24) {
    if (o.order != GptqOptions::Natural)
      bad_usage(who(o) + ": 2:4 sparsity needs natural column order (2:4 groups are 4 consecutive input columns; "
                         "act-order/GAR would split them)");
    if (k % 4 != 0) bad_usage(who(o) + ": 2:4 sparsity needs k % 4 == 0, k=" + std::to_string(k));
    if (o.group_size > 0 && o.group_size % 4 != 0)
      bad_usage(who(o) + ": 2:4 sparsity needs a group size that is a multiple of 4, got " + std::to_string(o.group_size));
  }
  if (o.device == GptqOptions::Device::Cuda) {
#ifndef MARLINC_HAVE_CUDA
    bad_usage(who(o) + ": device cuda requested but marlinc was built without CUDA (configure with -DMARLINC_CUDA=ON)");
#endif
  }
}

std::vector<int32_t> column_order(GptqOptions::Order order, const float* diag, int64_t k, int group_size) {
  std::vector<int32_t> perm(static_cast<size_t>(k));
  std::iota(perm.begin(), perm.end(), 0);
  // Descending diag, ties by column index: a total order, so the permutation is deterministic.
  auto by_diag = [&](int32_t a, int32_t b) { return diag[a] != diag[b] ? diag[a] > diag[b] : a < b; };
  switch (order) {
    case GptqOptions::Natural: break;
    case GptqOptions::StaticActOrder:
    case GptqOptions::DynamicActOrder: std::sort(perm.begin(), perm.end(), by_diag); break;
    case GptqOptions::Gar: {
      const int64_t g = group_size <= 0 ? k : group_size, G = k / g;
      std::vector<float> key(static_cast<size_t>(G));
      for (int64_t i = 0; i < G; ++i) {
        std::sort(perm.begin() + i * g, perm.begin() + (i + 1) * g, by_diag);
        key[size_t(i)] = diag[perm[size_t(i * g)]];  // the group's max diag leads it after the sort
      }
      std::vector<int32_t> gorder(static_cast<size_t>(G));
      std::iota(gorder.begin(), gorder.end(), 0);
      std::sort(gorder.begin(), gorder.end(),
                [&](int32_t a, int32_t b) { return key[size_t(a)] != key[size_t(b)] ? key[size_t(a)] > key[size_t(b)] : a < b; });
      std::vector<int32_t> out;
      out.reserve(size_t(k));
      for (int32_t gi : gorder) out.insert(out.end(), perm.begin() + gi * g, perm.begin() + (gi + 1) * g);
      perm = std::move(out);
      break;
    }
  }
  return perm;
}

bool inverse_cholesky_upper(const Eigen::MatrixXd& Hd, RowMatrixXd& U) {
  Eigen::MatrixXd A = Hd.reverse();
  return inverse_cholesky_upper_reversed(A, U);
}

bool inverse_cholesky_upper_ref(const Eigen::MatrixXd& Hd, RowMatrixXd& U) {
  const int64_t k = Hd.rows();
  Eigen::LLT<Eigen::MatrixXd, Eigen::Lower> llt(Hd);
  if (llt.info() != Eigen::Success) return false;
  Eigen::MatrixXd Hinv = llt.solve(Eigen::MatrixXd::Identity(k, k));  // cholesky_inverse
  Hinv = (0.5 * (Hinv + Hinv.transpose())).eval();
  Eigen::LLT<Eigen::MatrixXd, Eigen::Upper> llt2(Hinv);
  if (llt2.info() != Eigen::Success) return false;
  U = llt2.matrixU();
  return finite_positive_diag(U);
}

RowMatrixXd static_clip_weight(const Eigen::MatrixXf& H, int64_t gi, int64_t g, double damp_abs, bool fell_back) {
  RowMatrixXd M = RowMatrixXd::Identity(g, g);
  if (fell_back) return M;
  Eigen::MatrixXd Hg = H.block(gi * g, gi * g, g, g).cast<double>();
  for (int64_t t = 0; t < g; ++t)
    if (Hg(t, t) == 0.0) Hg(t, t) = 1.0;  // dead column, as in prepare
  Hg.diagonal().array() += damp_abs;
  Eigen::LLT<Eigen::MatrixXd> llt(Hg);
  if (llt.info() == Eigen::Success) M = llt.matrixL();
  return M;
}

Prepared prepare(const float* W, int64_t n, int64_t k, const Eigen::MatrixXf& H, const GptqOptions& o, bool ref) {
  check_options(o, n, k, H);
  quant::check_finite(o.name, W, n * k);
  if (!H.allFinite()) bad_data(who(o) + ": Hessian holds non-finite values");
  Prepared P;
  P.n = n;
  P.k = k;
  P.group = effective_group(o, k);
  P.block = effective_block(o);

  // Dead columns (§1.3): the channel never fired, so its weight cannot matter on this data. H itself
  // is not copied: h_at() applies the fix wherever H is read.
  std::vector<uint8_t> dead(static_cast<size_t>(k), 0);
  std::vector<float> diag(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) {
    if (H(j, j) < 0.0f) bad_data(who(o) + ": Hessian diagonal H[" + std::to_string(j) + "," + std::to_string(j) + "] is negative");
    if (H(j, j) == 0.0f) { dead[size_t(j)] = 1; ++P.dead; }
    diag[size_t(j)] = dead[size_t(j)] ? 1.0f : H(j, j);
  }
  P.perm = column_order(o.order, diag.data(), k, o.group_size);

  P.Wt.assign(size_t(k * n), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < k; ++p) {
    const int64_t c = P.perm[size_t(p)];
    if (dead[size_t(c)]) continue;
    for (int64_t r = 0; r < n; ++r) P.Wt[size_t(p * n + r)] = W[r * k + c];
  }

  // Relative damping with automatic increase (§1.4); RTN (U = I) when it keeps failing. The mean is
  // summed in processing order and the damped matrix built in double, exactly as the CUDA back end.
  double mean = 0.0;
  for (int64_t p = 0; p < k; ++p) mean += double(diag[size_t(P.perm[size_t(p)])]);
  mean /= double(k);
  const int32_t* perm = P.perm.data();
  // [k, k] the damped permuted H (reversed for the fast path), then its factor. Zeroed once: the fast
  // path fills and reads only the lower triangle, so the upper one must not hold garbage.
  Eigen::MatrixXd A = Eigen::MatrixXd::Zero(k, k);
  bool ok = false;
  for (int attempt = 0;; ++attempt) {
    const double lambda = double(o.damp) + kDampStep * attempt;
    if (attempt > 0 && (!o.auto_damp || lambda >= kDampMax)) break;
    const double damp_abs = lambda * mean;
    if (ref) {  // Hd = Hp + damp·I in processing order, both triangles
#pragma omp parallel for schedule(static)
      for (int64_t b = 0; b < k; ++b)
        for (int64_t a = 0; a < k; ++a) A(a, b) = h_at(H, dead, perm[a], perm[b]) + (a == b ? damp_abs : 0.0);
      ok = inverse_cholesky_upper_ref(A, P.U);
    } else {  // J·Hd·J, lower triangle only (all the factorisation reads)
#pragma omp parallel for schedule(static)
      for (int64_t b = 0; b < k; ++b)
        for (int64_t a = b; a < k; ++a)
          A(a, b) = h_at(H, dead, perm[k - 1 - a], perm[k - 1 - b]) + (a == b ? damp_abs : 0.0);
      ok = inverse_cholesky_upper_reversed(A, P.U);
    }
    if (ok) { P.damp_used = lambda; break; }
  }
  A.resize(0, 0);
  if (!ok) {
    P.fell_back = true;
    P.damp_used = 0.0;
    P.U = RowMatrixXd::Identity(k, k);
  }

  if (o.order == GptqOptions::StaticActOrder) {
    // Static groups (§1.7): fitted once on the un-updated weights in natural order. With clip the
    // group's own damped block H_gg = L·Lᵀ weighs the rounding error (δᵀH_ggδ = ‖Lᵀδ‖²).
    const int64_t g = P.group, G = k / g;
    P.static_scales.assign(size_t(G * n), 0.0f);
    std::vector<int32_t> pos(static_cast<size_t>(k));
    for (int64_t p = 0; p < k; ++p) pos[size_t(P.perm[size_t(p)])] = int32_t(p);
    const bool clip = o.clip == GptqOptions::Marlin && o.group_size > 0;
    std::vector<double> X(size_t(g * n));  // [g, n] natural columns of one group, transposed
    for (int64_t gi = 0; gi < G; ++gi) {
      for (int64_t t = 0; t < g; ++t)
        std::copy_n(P.Wt.data() + size_t(pos[size_t(gi * g + t)]) * size_t(n), n, X.data() + t * n);
      float* out = P.static_scales.data() + gi * n;
      if (clip) {
        const RowMatrixXd M = static_clip_weight(H, gi, g, P.damp_used * mean, P.fell_back);
        if (ref) {
          for (int64_t r = 0; r < n; ++r)
            out[r] = quant::weighted_clip_scale_ref(X.data() + r, g, n, M.data(), o.bits, quant::kMarlinClipGrid,
                                                    quant::kMarlinClipCandidates, o.bf16_scales);
        } else {
          constexpr int64_t kCols = 128;
#pragma omp parallel for schedule(dynamic, 1)
          for (int64_t c0 = 0; c0 < n; c0 += kCols)
            quant::weighted_clip_scales(X.data() + c0, g, std::min(kCols, n - c0), n, M.data(), quant::Tri::Lower,
                                        o.bits, quant::kMarlinClipGrid, quant::kMarlinClipCandidates, o.bf16_scales,
                                        out + c0);
        }
      } else {
        for (int64_t r = 0; r < n; ++r) {
          double absmax = 0.0;
          for (int64_t t = 0; t < g; ++t) absmax = std::max(absmax, std::fabs(X[size_t(t * n + r)]));
          out[r] = quant::sym_scale(absmax, o.bits, o.bf16_scales);
        }
      }
    }
  }
  return P;
}

}  // namespace marlinc::gptq
