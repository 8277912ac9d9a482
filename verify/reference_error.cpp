#include "verify/reference_error.h"

#include <algorithm>
#include <cmath>

#include "checkpoint/half.h"

namespace marlinc {

namespace {

// Error² of one group of one output column: the weights w[0, len) (kept[i] == 0: pruned, error w²).
double group_error2(const double* w, const uint8_t* kept, int64_t len, const NaiveScheme& s) {
  const double maxq = double((1 << s.bits) - 1);
  double lo = 0, hi = 0, absmax = 0;
  bool any = false;
  for (int64_t i = 0; i < len; ++i) {
    if (!kept[i]) continue;
    lo = any ? std::min(lo, w[i]) : w[i];
    hi = any ? std::max(hi, w[i]) : w[i];
    absmax = std::max(absmax, std::fabs(w[i]));
    any = true;
  }
  double scale, zero;
  if (s.sym) {
    scale = absmax > 0 ? 2 * absmax / maxq : 1.0;
    zero = double(1 << (s.bits - 1));
  } else {
    lo = std::min(lo, 0.0), hi = std::max(hi, 0.0);  // the grid holds 0, as GPTQ's asymmetric one does
    scale = hi > lo ? (hi - lo) / maxq : 1.0;
    zero = std::nearbyint(-lo / scale);
  }
  double e2 = 0;
  for (int64_t i = 0; i < len; ++i) {
    if (!kept[i]) { e2 += w[i] * w[i]; continue; }
    const double c = std::clamp(std::nearbyint(w[i] / scale) + zero, 0.0, maxq);
    const double d = (c - zero) * scale - w[i];
    e2 += d * d;
  }
  return e2;
}

}  // namespace

double naive_rtn_error(const float* W, int64_t n, int64_t k, const NaiveScheme& s) {
  const int64_t g = s.group_size > 0 ? s.group_size : k;
  std::vector<double> e2(static_cast<size_t>(n)), w2(static_cast<size_t>(n));
#pragma omp parallel
  {
    std::vector<double> row(static_cast<size_t>(k));
    std::vector<uint8_t> kept(static_cast<size_t>(k), uint8_t{1});
#pragma omp for schedule(static)
    for (long long c = 0; c < n; ++c) {
      const float* wr = W + size_t(c) * size_t(k);
      for (int64_t i = 0; i < k; ++i) row[size_t(i)] = wr[i], w2[size_t(c)] += double(wr[i]) * wr[i];
      if (s.sparse24)
        for (int64_t i = 0; i + 4 <= k; i += 4) {  // keep the two largest magnitudes (first on ties)
          int order[4] = {0, 1, 2, 3};
          std::stable_sort(order, order + 4, [&](int a, int b) { return std::fabs(row[size_t(i + a)]) > std::fabs(row[size_t(i + b)]); });
          for (int j = 0; j < 4; ++j) kept[size_t(i + order[j])] = j < 2;
        }
      for (int64_t i = 0; i < k; i += g)
        e2[size_t(c)] += group_error2(row.data() + i, kept.data() + i, std::min(g, k - i), s);
    }
  }
  double num = 0, den = 0;  // added in column order: the same for every thread count
  for (int64_t c = 0; c < n; ++c) num += e2[size_t(c)], den += w2[size_t(c)];
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

double median_scale_ratio(const float* W, const QuantizedLinear& q, std::span<const uint8_t> kept) {
  const int64_t G = q.groups();
  const double maxq = double((1 << q.bits) - 1);
  const bool bf16 = q.scale_type == ScaleType::BF16;
  std::vector<double> ratios(size_t(q.n) * size_t(G), -1.0);  // -1: a group without range
#pragma omp parallel
  {
    std::vector<double> lo(static_cast<size_t>(G)), hi(static_cast<size_t>(G));
#pragma omp for schedule(static)
    for (long long c = 0; c < q.n; ++c) {
      std::fill(lo.begin(), lo.end(), 0.0), std::fill(hi.begin(), hi.end(), 0.0);
      for (int64_t r = 0; r < q.k; ++r) {
        if (!kept.empty() && !kept[size_t(r * q.n + c)]) continue;
        const size_t j = size_t(q.group_of(r));
        const double w = W[size_t(c) * size_t(q.k) + size_t(r)];
        lo[j] = std::min(lo[j], w), hi[j] = std::max(hi[j], w);
      }
      for (int64_t j = 0; j < G; ++j) {
        const double range = q.sym ? 2 * std::max(-lo[size_t(j)], hi[size_t(j)]) : hi[size_t(j)] - lo[size_t(j)];
        const size_t at = size_t(j) * size_t(q.n) + size_t(c);
        if (range > 0) ratios[at] = double(word16_to_float(q.scales[at], bf16)) / (range / maxq);
      }
    }
  }
  ratios.erase(std::remove(ratios.begin(), ratios.end(), -1.0), ratios.end());
  if (ratios.empty()) return 0;
  std::nth_element(ratios.begin(), ratios.begin() + std::ptrdiff_t(ratios.size() / 2), ratios.end());
  return ratios[ratios.size() / 2];
}

void StepHistogram::add(double steps) {
  const double b = std::isfinite(steps) ? std::max(0.0, steps) * kBinsPerStep : double(bins_.size() - 1);
  bins_[size_t(std::min(b, double(bins_.size() - 1)))]++;
  ++count_;
}

double StepHistogram::fraction_above(double steps) const {
  if (count_ == 0) return 0;
  int64_t above = 0;
  for (size_t i = size_t(std::max(0.0, steps) * kBinsPerStep); i < bins_.size(); ++i) above += bins_[i];
  return double(above) / double(count_);
}

}  // namespace marlinc
