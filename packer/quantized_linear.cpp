#include "packer/quantized_linear.h"

#include "checkpoint/error.h"
#include "checkpoint/half.h"

namespace marlinc {

bool QuantizedLinear::trivial_g_idx() const {
  if (g_idx.empty()) return true;
  for (int64_t r = 0; r < k; ++r)
    if (g_idx[size_t(r)] != (group_size <= 0 ? 0 : r / group_size)) return false;
  return true;
}

float QuantizedLinear::scale_of(int64_t row, int64_t col) const {
  uint16_t s = scales[size_t(group_of(row) * n + col)];
  return word16_to_float(s, scale_type == ScaleType::BF16);
}

float QuantizedLinear::weight(int64_t row, int64_t col) const {
  size_t i = size_t(row * n + col);
  if (!mask.empty() && !mask[i]) return 0.0f;
  return float(int(codes[i]) - zero_of(row, col)) * scale_of(row, col);
}

void QuantizedLinear::validate() const {
  auto bad = [&](const std::string& rule) { bad_data(name + ": " + rule); };
  if (bits != 4 && bits != 8) bad("bits must be 4 or 8, got " + std::to_string(bits));
  if (k <= 0 || n <= 0) bad("shape [k=" + std::to_string(k) + ", n=" + std::to_string(n) + "] must be positive");
  if (group_size != -1 && (group_size <= 0 || k % group_size != 0))
    bad("group size " + std::to_string(group_size) + " must be -1 or divide k=" + std::to_string(k));
  const size_t kn = size_t(k * n), gn = size_t(groups() * n);
  if (codes.size() != kn) bad("codes hold " + std::to_string(codes.size()) + " entries, expected k*n=" + std::to_string(kn));
  if (scales.size() != gn) bad("scales hold " + std::to_string(scales.size()) + " entries, expected G*n=" + std::to_string(gn));
  const int maxq = (1 << bits) - 1;
  for (size_t i = 0; i < kn; ++i)
    if (codes[i] > maxq) bad("code " + std::to_string(codes[i]) + " at (" + std::to_string(i / n) + ", " +
                             std::to_string(i % n) + ") exceeds " + std::to_string(maxq));
  if (sym && !zeros.empty()) bad("symmetric layer must not carry zero points");
  if (!sym) {
    if (zeros.size() != gn) bad("zero points hold " + std::to_string(zeros.size()) + " entries, expected " + std::to_string(gn));
    for (uint8_t z : zeros)
      if (z > maxq) bad("zero point " + std::to_string(z) + " exceeds " + std::to_string(maxq));
  }
  if (!g_idx.empty()) {
    if (g_idx.size() != size_t(k)) bad("g_idx has " + std::to_string(g_idx.size()) + " entries, expected k=" + std::to_string(k));
    for (int64_t r = 0; r < k; ++r)
      if (g_idx[size_t(r)] < 0 || g_idx[size_t(r)] >= groups())
        bad("g_idx[" + std::to_string(r) + "] = " + std::to_string(g_idx[size_t(r)]) + " outside [0, " + std::to_string(groups()) + ")");
  }
  if (!mask.empty()) {
    if (mask.size() != kn) bad("2:4 mask holds " + std::to_string(mask.size()) + " entries, expected k*n");
    if (k % 4 != 0) bad("2:4 sparsity needs k % 4 == 0, k=" + std::to_string(k));
    for (int64_t c = 0; c < n; ++c)
      for (int64_t g = 0; g < k / 4; ++g) {
        int kept = 0;
        for (int t = 0; t < 4; ++t) kept += mask[size_t((4 * g + t) * n + c)] != 0;
        if (kept != 2)
          bad("2:4 mask keeps " + std::to_string(kept) + " of rows " + std::to_string(4 * g) + ".." +
              std::to_string(4 * g + 3) + " in column " + std::to_string(c) + " (exactly 2 required)");
      }
  }
}

std::vector<float> dequantize(const QuantizedLinear& q) {
  std::vector<float> w(size_t(q.k * q.n));
#pragma omp parallel for schedule(static)
  for (long long r = 0; r < q.k; ++r)
    for (int64_t c = 0; c < q.n; ++c) w[size_t(r * q.n + c)] = q.weight(r, c);
  return w;
}

}  // namespace marlinc
