// CPU reference GEMM on Marlin-packed bytes. See reference_gemm.h.
#include "kernels/reference_gemm.h"

#include <algorithm>
#include <string>

#include "checkpoint/error.h"
#include "checkpoint/half.h"
#include "packer/marlin.h"

namespace marlinc::kernels {
namespace {

constexpr int kBits = 4;       // dense Marlin codes are uint4b8
constexpr int kZeroCode = 8;   // uint4b8: w = (q - 8) * s (§1.1)
constexpr int64_t kColBlock = 256;  // columns per OpenMP work item (accumulator rows stay in L1/L2)

void check_problem(const char* fn, const RefGemmProblem& p) {
  const std::string where = std::string(fn) + ": ";
  if (!p.A || !p.B || !p.s) bad_usage(where + "A, B and s must be non-null");
  if (p.m < 1) bad_usage(where + "m = " + std::to_string(p.m) + " must be >= 1");
  if (p.k < 16 || p.k % 16 != 0) bad_usage(where + "k = " + std::to_string(p.k) + " must be a positive multiple of 16 (Marlin 16-row tiles)");
  if (p.n < 64 || p.n % 64 != 0) bad_usage(where + "n = " + std::to_string(p.n) + " must be a positive multiple of 64 (Marlin 16x64 blocks)");
  ref_num_groups(p.k, p.group_size);
}

double to_double(uint16_t v, ActType t) {
  return t == ActType::F16 ? double(half_to_float(v)) : double(bf16_to_float(v));
}

std::vector<int64_t> all_rows(const RefGemmProblem& p, const std::vector<int64_t>& rows, const char* fn) {
  std::vector<int64_t> r = rows;
  if (r.empty()) {
    r.resize(size_t(p.m));
    for (int64_t i = 0; i < p.m; ++i) r[size_t(i)] = i;
  }
  for (int64_t x : r)
    if (x < 0 || x >= p.m)
      bad_usage(std::string(fn) + ": requested row " + std::to_string(x) + " is outside [0, m = " + std::to_string(p.m) + ")");
  return r;
}

// Plain scales [G, n] as doubles, from the permuted ones.
std::vector<double> plain_scales(const RefGemmProblem& p) {
  const int64_t G = ref_num_groups(p.k, p.group_size);
  const std::vector<uint16_t> raw = marlin::unpermute_scales(p.s, G, p.n);
  std::vector<double> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = to_double(raw[i], p.act);
  return out;
}

}  // namespace

int64_t ref_num_groups(int64_t k, int64_t group_size) {
  if (group_size == -1) return 1;
  if (group_size <= 0 || k % group_size != 0)
    bad_usage("reference_gemm: group_size = " + std::to_string(group_size) + " must be -1 or a positive divisor of k = " +
              std::to_string(k));
  return k / group_size;
}

std::vector<float> dequantize_ref(const RefGemmProblem& p) {
  check_problem("dequantize_ref", p);
  const std::vector<uint8_t> q = marlin::unpack_weights_ref(p.B, p.k, p.n, kBits);  // [k, n]
  const std::vector<double> s = plain_scales(p);                                    // [G, n]
  const int64_t g = p.group_size == -1 ? p.k : p.group_size;
  std::vector<float> w(size_t(p.k * p.n));  // [k, n]
  for (int64_t kk = 0; kk < p.k; ++kk)
    for (int64_t c = 0; c < p.n; ++c)
      w[size_t(kk * p.n + c)] = float(double(int(q[size_t(kk * p.n + c)]) - kZeroCode) * s[size_t((kk / g) * p.n + c)]);
  return w;
}

std::vector<double> reference_gemm_ref(const RefGemmProblem& p, const std::vector<int64_t>& rows_in) {
  check_problem("reference_gemm_ref", p);
  const std::vector<int64_t> rows = all_rows(p, rows_in, "reference_gemm_ref");
  const std::vector<float> w = dequantize_ref(p);  // [k, n]
  std::vector<double> C(rows.size() * size_t(p.n));  // [rows, n]
  for (size_t ri = 0; ri < rows.size(); ++ri)
    for (int64_t c = 0; c < p.n; ++c) {
      double acc = 0.0;
      for (int64_t kk = 0; kk < p.k; ++kk)
        acc += to_double(p.A[size_t(rows[ri] * p.k + kk)], p.act) * double(w[size_t(kk * p.n + c)]);
      C[ri * size_t(p.n) + size_t(c)] = acc;
    }
  return C;
}

std::vector<double> reference_gemm(const RefGemmProblem& p, const std::vector<int64_t>& rows_in) {
  check_problem("reference_gemm", p);
  const std::vector<int64_t> rows = all_rows(p, rows_in, "reference_gemm");
  const std::vector<uint8_t> q = marlin::unpack_weights(p.B, p.k, p.n, kBits);  // [k, n]
  const std::vector<double> s = plain_scales(p);                                // [G, n]
  const int64_t g = p.group_size == -1 ? p.k : p.group_size;
  const int64_t R = int64_t(rows.size());
  // Activations of the requested rows as doubles, transposed to [k, R] so the inner loop is contiguous.
  std::vector<double> a(size_t(p.k * R));
  for (int64_t ri = 0; ri < R; ++ri)
    for (int64_t kk = 0; kk < p.k; ++kk) a[size_t(kk * R + ri)] = to_double(p.A[size_t(rows[size_t(ri)] * p.k + kk)], p.act);
  std::vector<double> C(size_t(R * p.n), 0.0);  // [R, n]
  const int64_t blocks = (p.n + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kColBlock, c1 = std::min(p.n, c0 + kColBlock), w = c1 - c0;
    std::vector<double> acc(static_cast<size_t>(R * w), 0.0);  // [R, w]
    std::vector<double> wrow(static_cast<size_t>(w));
    for (int64_t kk = 0; kk < p.k; ++kk) {
      const uint8_t* qr = q.data() + kk * p.n + c0;
      const double* sr = s.data() + (kk / g) * p.n + c0;
      for (int64_t c = 0; c < w; ++c) wrow[size_t(c)] = double(float(double(int(qr[c]) - kZeroCode) * sr[c]));
      const double* ar = a.data() + kk * R;
      for (int64_t ri = 0; ri < R; ++ri) {
        const double av = ar[ri];
        double* accr = acc.data() + ri * w;
        for (int64_t c = 0; c < w; ++c) accr[c] += av * wrow[size_t(c)];
      }
    }
    for (int64_t ri = 0; ri < R; ++ri)
      std::copy(acc.begin() + ri * w, acc.begin() + (ri + 1) * w, C.begin() + ri * p.n + c0);
  }
  return C;
}

}  // namespace marlinc::kernels
