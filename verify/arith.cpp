#include "verify/arith.h"

#include <cmath>

#include "checkpoint/half.h"

namespace marlinc {

std::vector<int64_t> sample_columns(int64_t n, int64_t max_cols) {
  std::vector<int64_t> cols;
  if (n <= max_cols) {
    for (int64_t j = 0; j < n; ++j) cols.push_back(j);
    return cols;
  }
  for (int64_t i = 0; i < max_cols; ++i) cols.push_back(i * (n - 1) / (max_cols - 1));
  return cols;
}

namespace {
// Per selected column, the weights exactly as the kernel's tensor cores see them.
std::vector<float> kernel_weights(const QuantizedLinear& q, int64_t col, bool per_channel) {
  std::vector<float> w(size_t(q.k));
  for (int64_t r = 0; r < q.k; ++r) {
    size_t i = size_t(r * q.n + col);
    if (!q.mask.empty() && !q.mask[i]) { w[size_t(r)] = 0.f; continue; }
    float v = float(int(q.codes[i]) - q.zero_of(r, col));
    // The kernel multiplies in 16-bit registers (grouped), so the product is rounded to that type.
    const bool bf16 = bf16_kernel(q);
    w[size_t(r)] = per_channel ? v : round_to_word16(v * q.scale_of(r, col), bf16);
  }
  return w;
}
}  // namespace

std::vector<float> gemm_kernel_numerics(const std::vector<uint16_t>& A, int m, const QuantizedLinear& q,
                                        const std::vector<int64_t>& cols) {
  const bool per_channel = q.groups() == 1, bf16 = bf16_kernel(q);
  std::vector<float> a(A.size());
  for (size_t i = 0; i < A.size(); ++i) a[i] = word16_to_float(A[i], bf16);
  std::vector<float> c(size_t(m) * cols.size());
#pragma omp parallel for schedule(dynamic)
  for (long long ci = 0; ci < (long long)cols.size(); ++ci) {
    std::vector<float> w = kernel_weights(q, cols[size_t(ci)], per_channel);
    const float s = per_channel ? q.scale_of(0, cols[size_t(ci)]) : 1.f;
    for (int i = 0; i < m; ++i) {
      float acc = 0.f;
      const float* ai = a.data() + size_t(i) * size_t(q.k);
      for (int64_t r = 0; r < q.k; ++r) acc += ai[r] * w[size_t(r)];
      c[size_t(i) * cols.size() + size_t(ci)] = round_to_word16(acc * s, bf16);
    }
  }
  return c;
}

std::vector<double> gemm_reference(const std::vector<uint16_t>& A, int m, const QuantizedLinear& q,
                                   const std::vector<int64_t>& cols) {
  std::vector<double> a(A.size());  // [m, k], exact
  for (size_t i = 0; i < A.size(); ++i) a[i] = double(word16_to_float(A[i], bf16_kernel(q)));
  std::vector<double> c(size_t(m) * cols.size());
#pragma omp parallel for schedule(dynamic)
  for (long long ci = 0; ci < (long long)cols.size(); ++ci) {
    const int64_t col = cols[size_t(ci)];
    std::vector<double> w(size_t(q.k));
    for (int64_t r = 0; r < q.k; ++r) w[size_t(r)] = double(q.weight(r, col));
    for (int i = 0; i < m; ++i) {
      const double* ai = a.data() + size_t(i) * size_t(q.k);
      double acc = 0;
      for (int64_t r = 0; r < q.k; ++r) acc += ai[r] * w[size_t(r)];
      c[size_t(i) * cols.size() + size_t(ci)] = acc;
    }
  }
  return c;
}

RelErr compare(const std::vector<float>& c, const std::vector<double>& ref) {
  RelErr e;
  double sum_d = 0, sum_r = 0, max_d = 0, max_r = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    if (!std::isfinite(c[i])) { e.finite = false; continue; }
    double d = std::fabs(double(c[i]) - ref[i]), r = std::fabs(ref[i]);
    sum_d += d; sum_r += r;
    max_d = std::max(max_d, d); max_r = std::max(max_r, r);
  }
  e.mean_rel = sum_r > 0 ? sum_d / sum_r : (sum_d > 0 ? INFINITY : 0);
  e.max_rel = max_r > 0 ? max_d / max_r : (max_d > 0 ? INFINITY : 0);
  return e;
}

std::vector<uint16_t> random_activations(int m, int64_t k, uint64_t seed, bool bf16) {
  std::vector<uint16_t> a(size_t(m) * size_t(k));
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL;
  for (auto& v : a) {
    // splitmix64: the same stream on every platform, unlike std distributions.
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    float u = float(z >> 40) / float(1ULL << 24) * 2.f - 1.f;
    v = float_to_word16(u, bf16);
  }
  return a;
}

}  // namespace marlinc
