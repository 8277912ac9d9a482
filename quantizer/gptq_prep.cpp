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

bool finite_positive_diag(const RowMatrixXf& U) {
  if (!U.allFinite()) return false;
  for (int64_t i = 0; i < U.rows(); ++i)
    if (!(U(i, i) > 0.0f)) return false;
  return true;
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

bool inverse_cholesky_upper(const Eigen::MatrixXf& Hd, RowMatrixXf& U) {
  const int64_t k = Hd.rows();
  // Reversing the index order turns "upper factor of the inverse" into "inverse of a lower factor":
  // if J·Hd·J = L·Lᵀ then Hd⁻¹ = (J·L⁻ᵀ·J)(J·L⁻¹·J) with J·L⁻¹·J upper and a positive diagonal,
  // which by uniqueness is U. One factorisation and one triangular inverse instead of three.
  Eigen::MatrixXf L = Hd.reverse();
  Eigen::LLT<Eigen::Ref<Eigen::MatrixXf>, Eigen::Lower> llt(L);
  if (llt.info() != Eigen::Success) return false;
  for (int64_t i = 0; i < k; ++i)
    if (!(L(i, i) > 0.0f) || !std::isfinite(L(i, i))) return false;
  Eigen::MatrixXf Linv = Eigen::MatrixXf::Zero(k, k);  // [k, k] lower
  const int64_t panels = (k + kInvPanel - 1) / kInvPanel;
  // Column panel [c0, c1) of L⁻¹ only involves L[c0:, c0:]; panels are independent.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t c0 = p * kInvPanel, w = std::min(kInvPanel, k - c0);
    auto B = Linv.block(c0, c0, k - c0, w);
    B.topRows(w).setIdentity();
    L.bottomRightCorner(k - c0, k - c0).triangularView<Eigen::Lower>().solveInPlace(B);
  }
  U = Linv.reverse();
  U.triangularView<Eigen::StrictlyLower>().setZero();
  return finite_positive_diag(U);
}

bool inverse_cholesky_upper_ref(const Eigen::MatrixXf& Hd, RowMatrixXf& U) {
  const int64_t k = Hd.rows();
  Eigen::LLT<Eigen::MatrixXf, Eigen::Lower> llt(Hd);
  if (llt.info() != Eigen::Success) return false;
  Eigen::MatrixXf Hinv = llt.solve(Eigen::MatrixXf::Identity(k, k));  // cholesky_inverse
  Hinv = (0.5f * (Hinv + Hinv.transpose())).eval();
  Eigen::LLT<Eigen::MatrixXf, Eigen::Upper> llt2(Hinv);
  if (llt2.info() != Eigen::Success) return false;
  U = llt2.matrixU();
  return finite_positive_diag(U);
}

RowMatrixXf static_clip_weight(const Eigen::MatrixXf& H, int64_t gi, int64_t g, double damp_abs, bool fell_back) {
  RowMatrixXf M = RowMatrixXf::Identity(g, g);
  if (fell_back) return M;
  Eigen::MatrixXf Hg = H.block(gi * g, gi * g, g, g);
  for (int64_t t = 0; t < g; ++t)
    if (Hg(t, t) == 0.0f) Hg(t, t) = 1.0f;  // dead column, as in prepare
  Hg.diagonal().array() += float(damp_abs);
  Eigen::LLT<Eigen::MatrixXf> llt(Hg);
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

  // Dead columns (§1.3): the channel never fired, so its weight cannot matter on this data.
  Eigen::MatrixXf Hc = H;  // [k, k] natural order
  std::vector<uint8_t> dead(static_cast<size_t>(k), 0);
  for (int64_t j = 0; j < k; ++j) {
    if (Hc(j, j) < 0.0f) bad_data(who(o) + ": Hessian diagonal H[" + std::to_string(j) + "," + std::to_string(j) + "] is negative");
    if (Hc(j, j) == 0.0f) { Hc(j, j) = 1.0f; dead[size_t(j)] = 1; ++P.dead; }
  }
  std::vector<float> diag(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) diag[size_t(j)] = Hc(j, j);
  P.perm = column_order(o.order, diag.data(), k, o.group_size);

  P.Hp.resize(k, k);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < k; ++b)
    for (int64_t a = 0; a < k; ++a) P.Hp(a, b) = Hc(P.perm[size_t(a)], P.perm[size_t(b)]);
  P.Wt.assign(size_t(k * n), 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < k; ++p) {
    const int64_t c = P.perm[size_t(p)];
    if (dead[size_t(c)]) continue;
    for (int64_t r = 0; r < n; ++r) P.Wt[size_t(p * n + r)] = W[r * k + c];
  }

  // Relative damping with automatic increase (§1.4); RTN (U = I) when it keeps failing.
  double mean = 0.0;
  for (int64_t j = 0; j < k; ++j) mean += P.Hp(j, j);
  mean /= double(k);
  bool ok = false;
  for (int attempt = 0;; ++attempt) {
    const double lambda = double(o.damp) + kDampStep * attempt;
    if (attempt > 0 && (!o.auto_damp || lambda >= kDampMax)) break;
    Eigen::MatrixXf Hd = P.Hp;
    Hd.diagonal().array() += float(lambda * mean);
    ok = ref ? inverse_cholesky_upper_ref(Hd, P.U) : inverse_cholesky_upper(Hd, P.U);
    if (ok) { P.damp_used = lambda; break; }
  }
  if (!ok) {
    P.fell_back = true;
    P.damp_used = 0.0;
    P.U = RowMatrixXf::Identity(k, k);
  }

  if (o.order == GptqOptions::StaticActOrder) {
    // Static groups (§1.7): fitted once on the un-updated weights in natural order. With clip the
    // group's own damped block H_gg = L·Lᵀ weighs the rounding error (δᵀH_ggδ = ‖Lᵀδ‖²).
    const int64_t g = P.group, G = k / g;
    P.static_scales.assign(size_t(G * n), 0.0f);
    std::vector<int32_t> pos(static_cast<size_t>(k));
    for (int64_t p = 0; p < k; ++p) pos[size_t(P.perm[size_t(p)])] = int32_t(p);
    const bool clip = o.clip == GptqOptions::Marlin && o.group_size > 0;
    for (int64_t gi = 0; gi < G; ++gi) {
      std::vector<float> X(size_t(g * n));  // [g, n] natural columns of this group, transposed
      for (int64_t t = 0; t < g; ++t)
        std::copy_n(P.Wt.data() + size_t(pos[size_t(gi * g + t)]) * size_t(n), n, X.data() + t * n);
      float* out = P.static_scales.data() + gi * n;
      if (clip) {
        const RowMatrixXf M = static_clip_weight(Hc, gi, g, P.damp_used * mean, P.fell_back);
        if (ref) {
          for (int64_t r = 0; r < n; ++r)
            out[r] = quant::weighted_clip_scale_ref(X.data() + r, g, n, M.data(), o.bits, quant::kMarlinClipGrid,
                                                    quant::kMarlinClipCandidates);
        } else {
          constexpr int64_t kCols = 128;
#pragma omp parallel for schedule(dynamic, 1)
          for (int64_t c0 = 0; c0 < n; c0 += kCols)
            quant::weighted_clip_scales(X.data() + c0, g, std::min(kCols, n - c0), n, M.data(), quant::Tri::Lower,
                                        o.bits, quant::kMarlinClipGrid, quant::kMarlinClipCandidates, out + c0);
        }
      } else {
        for (int64_t r = 0; r < n; ++r) {
          float absmax = 0.0f;
          for (int64_t t = 0; t < g; ++t) absmax = std::max(absmax, std::fabs(X[size_t(t * n + r)]));
          out[r] = quant::sym_scale(absmax, o.bits);
        }
      }
    }
  }
  return P;
}

}  // namespace marlinc::gptq
