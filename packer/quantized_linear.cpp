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

namespace {

// Columns [c0, c0 + w) of each row of a row-major [rows, cols] table, appended to out.
template <class T>
void take_columns(const std::vector<T>& src, int64_t rows, int64_t cols, int64_t c0, int64_t w, std::vector<T>& out) {
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = src.begin() + r * cols;
    out.insert(out.end(), row + c0, row + c0 + w);
  }
}

// A row-major [rows, w_total] table from parts [rows, w_i] placed side by side.
template <class T>
std::vector<T> side_by_side(const std::vector<const std::vector<T>*>& parts, const std::vector<int64_t>& widths,
                            int64_t rows) {
  std::vector<T> out;
  for (int64_t r = 0; r < rows; ++r)
    for (size_t p = 0; p < parts.size(); ++p) {
      const auto row = parts[p]->begin() + r * widths[p];
      out.insert(out.end(), row, row + widths[p]);
    }
  return out;
}

}  // namespace

QuantizedLinear slice_n(const QuantizedLinear& q, int64_t n0, int64_t n) {
  if (n0 < 0 || n <= 0 || n0 + n > q.n)
    bad_data(q.name + ": output features [" + std::to_string(n0) + ", " + std::to_string(n0 + n) + ") are outside its n = " +
             std::to_string(q.n));
  QuantizedLinear s;
  s.name = q.name;
  s.k = q.k, s.n = n, s.bits = q.bits, s.group_size = q.group_size, s.sym = q.sym, s.scale_type = q.scale_type;
  s.g_idx = q.g_idx;
  take_columns(q.codes, q.k, q.n, n0, n, s.codes);
  take_columns(q.scales, q.groups(), q.n, n0, n, s.scales);
  if (!q.zeros.empty()) take_columns(q.zeros, q.groups(), q.n, n0, n, s.zeros);
  if (!q.mask.empty()) take_columns(q.mask, q.k, q.n, n0, n, s.mask);
  return s;
}

QuantizedLinear concat_n(const std::vector<QuantizedLinear>& parts, const std::string& name) {
  if (parts.empty()) bad_data(name + ": no part to join");
  const QuantizedLinear& a = parts[0];
  QuantizedLinear out;
  out.name = name;
  out.k = a.k, out.n = 0, out.bits = a.bits, out.group_size = a.group_size, out.sym = a.sym, out.scale_type = a.scale_type;
  out.g_idx = a.g_idx;
  std::vector<const std::vector<uint8_t>*> codes, zeros, masks;
  std::vector<const std::vector<uint16_t>*> scales;
  std::vector<int64_t> widths;
  for (const QuantizedLinear& p : parts) {
    if (p.k != a.k || p.bits != a.bits || p.group_size != a.group_size || p.sym != a.sym || p.scale_type != a.scale_type ||
        p.g_idx != a.g_idx || p.mask.empty() != a.mask.empty())
      bad_data(name + ": part " + p.name + " differs from " + a.name +
               " in k, bits, group size, symmetry, scale type, g_idx or 2:4-ness, so they cannot form one module");
    out.n += p.n;
    widths.push_back(p.n);
    codes.push_back(&p.codes);
    scales.push_back(&p.scales);
    zeros.push_back(&p.zeros);
    masks.push_back(&p.mask);
  }
  out.codes = side_by_side(codes, widths, a.k);
  out.scales = side_by_side(scales, widths, a.groups());
  if (!a.sym) out.zeros = side_by_side(zeros, widths, a.groups());
  if (!a.mask.empty()) out.mask = side_by_side(masks, widths, a.k);
  return out;
}

}  // namespace marlinc
