// GPTQ / AWQ / compressed-tensors integer layouts (spec §4.2-§4.4, §5, §6.1). `_ref` versions compute
// each element's word and shift with divisions; fast versions walk whole words, rows in parallel.
#include "packer/gptq.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "packer/pack_checks.h"

namespace marlinc::gptq {
namespace {

void check_qweight(const char* fn, int64_t k, int64_t n, int bits) {
  packcheck::bits_248(fn, bits);
  packcheck::multiple(fn, "k", k, 32 / bits, "GPTQ qweight packs 32/bits input rows per int32");
  packcheck::positive(fn, "n", n);
}
void check_qzeros(const char* fn, int64_t groups, int64_t n, int bits) {
  packcheck::bits_248(fn, bits);
  packcheck::positive(fn, "groups", groups);
  packcheck::multiple(fn, "n", n, 32 / bits, "GPTQ qzeros pack 32/bits output columns per int32");
}
uint32_t field_mask(int bits) { return (1u << bits) - 1; }
// 0x11111111 (4-bit), 0x01010101 (8-bit), 0x55555555 (2-bit): a 1 in every field.
uint32_t ones_in_fields(int bits) {
  uint32_t v = 0;
  for (int s = 0; s < 32; s += bits) v |= 1u << s;
  return v;
}

}  // namespace

std::vector<int32_t> pack_qweight_ref(const uint8_t* codes, int64_t k, int64_t n, int bits) {
  check_qweight("gptq::pack_qweight_ref", k, n, bits);
  packcheck::codes_fit("gptq::pack_qweight_ref", codes, k, n, bits);
  const int64_t pf = 32 / bits;
  std::vector<uint32_t> qw(size_t(k / pf * n), 0u);  // [k*bits/32, n]
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < n; ++c) qw[size_t(r / pf * n + c)] |= uint32_t(codes[r * n + c]) << (bits * (r % pf));
  return std::vector<int32_t>(qw.begin(), qw.end());
}

std::vector<int32_t> pack_qweight(const uint8_t* codes, int64_t k, int64_t n, int bits) {
  check_qweight("gptq::pack_qweight", k, n, bits);
  packcheck::codes_fit("gptq::pack_qweight", codes, k, n, bits);
  const int pf = 32 / bits;
  std::vector<int32_t> qw(size_t(k / pf * n));  // [k*bits/32, n]
  // Row-at-a-time OR over the pf source rows: unit stride in n, so the inner loop vectorises.
#pragma omp parallel for schedule(static)
  for (long long w = 0; w < k / pf; ++w) {
    uint32_t* dst = reinterpret_cast<uint32_t*>(qw.data()) + w * n;
    const uint8_t* src = codes + w * pf * n;
    for (int64_t c = 0; c < n; ++c) dst[c] = src[c];
    for (int j = 1; j < pf; ++j)
      for (int64_t c = 0; c < n; ++c) dst[c] |= uint32_t(src[j * n + c]) << (bits * j);
  }
  return qw;
}

std::vector<uint8_t> unpack_qweight_ref(const int32_t* qweight, int64_t k, int64_t n, int bits) {
  check_qweight("gptq::unpack_qweight_ref", k, n, bits);
  const int64_t pf = 32 / bits;
  std::vector<uint8_t> codes(size_t(k * n));  // [k, n]
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < n; ++c)
      codes[size_t(r * n + c)] = uint8_t((uint32_t(qweight[r / pf * n + c]) >> (bits * (r % pf))) & field_mask(bits));
  return codes;
}

std::vector<uint8_t> unpack_qweight(const int32_t* qweight, int64_t k, int64_t n, int bits) {
  check_qweight("gptq::unpack_qweight", k, n, bits);
  const int pf = 32 / bits;
  const uint32_t m = field_mask(bits);
  std::vector<uint8_t> codes(size_t(k * n));  // [k, n]
#pragma omp parallel for schedule(static)
  for (long long w = 0; w < k / pf; ++w) {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(qweight) + w * n;
    uint8_t* dst = codes.data() + w * pf * n;
    for (int j = 0; j < pf; ++j)
      for (int64_t c = 0; c < n; ++c) dst[j * n + c] = uint8_t((src[c] >> (bits * j)) & m);
  }
  return codes;
}

// ---- qzeros --------------------------------------------------------------------------------------
std::vector<int32_t> pack_qzeros(const uint8_t* z, int64_t groups, int64_t n, int bits, ZeroFormat fmt) {
  const char* fn = "gptq::pack_qzeros";
  check_qzeros(fn, groups, n, bits);
  packcheck::codes_fit(fn, z, groups, n, bits, "zero point");
  const int64_t pf = 32 / bits;
  std::vector<uint32_t> out(size_t(groups * (n / pf)), 0u);  // [G, n*bits/32]
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t c = 0; c < n; ++c) {
      int v = z[g * n + c];
      if (fmt == ZeroFormat::V1) {
        if (v == 0)
          bad_data(std::string(fn) + ": zero point 0 at (group " + std::to_string(g) + ", column " + std::to_string(c) +
                   ") cannot be stored in GPTQ v1, which stores z-1 (it would underflow into the neighbouring "
                   "columns); write checkpoint_format gptq_v2");
        v -= 1;
      }
      out[size_t(g * (n / pf) + c / pf)] |= uint32_t(v) << (bits * (c % pf));
    }
  return std::vector<int32_t>(out.begin(), out.end());
}

std::vector<uint8_t> unpack_qzeros(const int32_t* qzeros, int64_t groups, int64_t n, int bits, ZeroFormat fmt) {
  const char* fn = "gptq::unpack_qzeros";
  check_qzeros(fn, groups, n, bits);
  const int64_t pf = 32 / bits;
  const uint32_t m = field_mask(bits);
  std::vector<uint8_t> z(size_t(groups * n));  // [G, n]
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t c = 0; c < n; ++c) {
      uint32_t v = (uint32_t(qzeros[g * (n / pf) + c / pf]) >> (bits * (c % pf))) & m;
      if (fmt == ZeroFormat::V1) {
        if (v == m)
          bad_data(std::string(fn) + ": GPTQ v1 stored zero " + std::to_string(v) + " at (group " + std::to_string(g) +
                   ", column " + std::to_string(c) + ") means z=" + std::to_string(v + 1) + ", outside 0.." +
                   std::to_string(m) + " (an asymmetric v1 file whose z=0 underflowed, spec §4.3); re-export as gptq_v2");
        v += 1;
      }
      z[size_t(g * n + c)] = uint8_t(v);
    }
  return z;
}

std::vector<int32_t> sym_qzeros(int64_t groups, int64_t n, int bits, ZeroFormat fmt) {
  check_qzeros("gptq::sym_qzeros", groups, n, bits);
  const uint32_t field = (1u << (bits - 1)) - (fmt == ZeroFormat::V1 ? 1u : 0u);
  return std::vector<int32_t>(size_t(groups * (n * bits / 32)), int32_t(field * ones_in_fields(bits)));
}

namespace {
std::vector<int32_t> shift_fields(const char* fn, const int32_t* qz, int64_t count, int bits, bool up) {
  packcheck::bits_248(fn, bits);
  const uint32_t m = field_mask(bits), ones = ones_in_fields(bits);
  std::vector<int32_t> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t w = uint32_t(qz[i]);
    for (int s = 0; s < 32; s += bits) {
      const uint32_t f = (w >> s) & m;
      if ((up && f == m) || (!up && f == 0))
        bad_data(std::string(fn) + ": qzeros word " + std::to_string(i) + " field " + std::to_string(s / bits) + " = " +
                 std::to_string(f) + (up ? " would overflow past " + std::to_string(m) : std::string(" would underflow below 0")) +
                 " (the carry would corrupt the neighbouring column; not a valid " + (up ? "v1" : "v2") + " zero)");
    }
    out[size_t(i)] = int32_t(up ? w + ones : w - ones);
  }
  return out;
}
}  // namespace

std::vector<int32_t> qzeros_v1_to_v2(const int32_t* qz, int64_t count, int bits) {
  return shift_fields("gptq::qzeros_v1_to_v2", qz, count, bits, true);
}
std::vector<int32_t> qzeros_v2_to_v1(const int32_t* qz, int64_t count, int bits) {
  return shift_fields("gptq::qzeros_v2_to_v1", qz, count, bits, false);
}

QzerosKind detect_qzeros(const int32_t* qz, int64_t groups, int64_t n, int bits) {
  packcheck::bits_248("gptq::detect_qzeros", bits);
  const int64_t count = groups * (n * bits / 32);
  if (count <= 0) return QzerosKind::AsymmetricOrUnknown;
  const uint32_t ones = ones_in_fields(bits), half = 1u << (bits - 1);
  const uint32_t v1 = (half - 1) * ones, v2 = half * ones;
  const uint32_t first = uint32_t(qz[0]);
  if (first != v1 && first != v2) return QzerosKind::AsymmetricOrUnknown;
  for (int64_t i = 1; i < count; ++i)
    if (uint32_t(qz[i]) != first) return QzerosKind::AsymmetricOrUnknown;
  return first == v1 ? QzerosKind::SymV1 : QzerosKind::SymV2;
}

const char* to_string(QzerosKind kind) {
  switch (kind) {
    case QzerosKind::SymV1: return "symmetric v1 (stored z-1)";
    case QzerosKind::SymV2: return "symmetric v2 (stored z)";
    default: return "asymmetric or unknown";
  }
}

// ---- g_idx ---------------------------------------------------------------------------------------
std::vector<int32_t> trivial_g_idx(int64_t k, int group_size) {
  if (k < 0) bad_data("gptq::trivial_g_idx: k=" + std::to_string(k) + " must be non-negative");
  if (group_size != -1 && group_size <= 0)
    bad_usage("gptq::trivial_g_idx: group_size=" + std::to_string(group_size) + " must be -1 or positive");
  std::vector<int32_t> g(static_cast<size_t>(k));  // [k]
  for (int64_t r = 0; r < k; ++r) g[size_t(r)] = group_size <= 0 ? 0 : int32_t(r / group_size);
  return g;
}

bool is_trivial_g_idx(const int32_t* g_idx, int64_t k, int group_size) {
  for (int64_t r = 0; r < k; ++r)
    if (g_idx[r] != (group_size <= 0 ? 0 : r / group_size)) return false;
  return true;
}

void validate_g_idx(const int32_t* g_idx, int64_t k, int64_t groups) {
  for (int64_t r = 0; r < k; ++r)
    if (g_idx[r] < 0 || g_idx[r] >= groups)
      bad_data("gptq::validate_g_idx: g_idx[" + std::to_string(r) + "] = " + std::to_string(g_idx[r]) + " outside [0, " +
               std::to_string(groups) + ") (one group per scales row)");
}

ActOrder act_order_sort(const int32_t* g_idx, int64_t k) {
  ActOrder a;
  a.sort_indices.resize(size_t(k));
  std::iota(a.sort_indices.begin(), a.sort_indices.end(), 0);
  std::stable_sort(a.sort_indices.begin(), a.sort_indices.end(),
                   [&](int32_t x, int32_t y) { return g_idx[x] < g_idx[y]; });
  a.g_idx_sorted.resize(size_t(k));
  for (int64_t j = 0; j < k; ++j) a.g_idx_sorted[size_t(j)] = g_idx[a.sort_indices[size_t(j)]];
  return a;
}

std::vector<int32_t> invert_permutation(const int32_t* perm, int64_t k) {
  std::vector<int32_t> inv(size_t(k), -1);  // [k]
  for (int64_t j = 0; j < k; ++j) {
    const int32_t p = perm[j];
    if (p < 0 || p >= k || inv[size_t(p)] != -1)
      bad_data("gptq::invert_permutation: entry " + std::to_string(j) + " = " + std::to_string(p) +
               (p < 0 || p >= k ? " is outside [0, " + std::to_string(k) + ")" : std::string(" repeats an earlier entry")) +
               " (a row permutation must use every row exactly once)");
    inv[size_t(p)] = int32_t(j);
  }
  return inv;
}

std::vector<uint8_t> gather_rows(const uint8_t* in, int64_t k, int64_t n, const int32_t* perm) {
  invert_permutation(perm, k);  // validates
  std::vector<uint8_t> out(size_t(k * n));  // [k, n]
#pragma omp parallel for schedule(static)
  for (long long j = 0; j < k; ++j) std::copy_n(in + int64_t(perm[j]) * n, n, out.data() + j * n);
  return out;
}

}  // namespace marlinc::gptq

// ==== AWQ ==========================================================================================
namespace marlinc::awq {
namespace {
void check_cols(const char* fn, int64_t rows, int64_t n, int bits) {
  if (bits != 4 && bits != 8)
    bad_usage(std::string(fn) + ": bits=" + std::to_string(bits) + " unsupported (AWQ GEMM packs 4- or 8-bit codes)");
  packcheck::positive(fn, "rows", rows);
  packcheck::multiple(fn, "n", n, 32 / bits, "AWQ packs 32/bits output columns per int32");
}
constexpr int kOrder4[8] = {0, 2, 4, 6, 1, 3, 5, 7};     // slot i holds column 8w + kOrder4[i]
constexpr int kSlotOf4[8] = {0, 4, 1, 5, 2, 6, 3, 7};    // column 8w + c sits in slot kSlotOf4[c]
constexpr int kOrder8[4] = {0, 2, 1, 3};                 // self-inverse
static_assert(kOrder4[kSlotOf4[1]] == 1 && kOrder4[kSlotOf4[6]] == 6, "AWQ slot map must invert order_map (spec §5)");
int slot_of(int c, int bits) { return bits == 4 ? kSlotOf4[c] : kOrder8[c]; }
int order(int i, int bits) { return bits == 4 ? kOrder4[i] : kOrder8[i]; }
}  // namespace

std::vector<int32_t> pack_cols_ref(const uint8_t* v, int64_t rows, int64_t n, int bits) {
  check_cols("awq::pack_cols_ref", rows, n, bits);
  packcheck::codes_fit("awq::pack_cols_ref", v, rows, n, bits);
  const int64_t pf = 32 / bits, wpr = n / pf;
  std::vector<uint32_t> out(size_t(rows * wpr), 0u);  // [rows, n*bits/32]
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; ++c)
      out[size_t(r * wpr + c / pf)] |= uint32_t(v[r * n + c]) << (bits * slot_of(int(c % pf), bits));
  return std::vector<int32_t>(out.begin(), out.end());
}

std::vector<int32_t> pack_cols(const uint8_t* v, int64_t rows, int64_t n, int bits) {
  check_cols("awq::pack_cols", rows, n, bits);
  packcheck::codes_fit("awq::pack_cols", v, rows, n, bits);
  const int pf = 32 / bits;
  const int64_t wpr = n / pf;
  int src[8];
  for (int i = 0; i < pf; ++i) src[i] = order(i, bits);
  std::vector<int32_t> out(size_t(rows * wpr));  // [rows, n*bits/32]
#pragma omp parallel for schedule(static)
  for (long long r = 0; r < rows; ++r)
    for (int64_t w = 0; w < wpr; ++w) {
      const uint8_t* s = v + r * n + w * pf;
      uint32_t x = 0;
      for (int i = 0; i < pf; ++i) x |= uint32_t(s[src[i]]) << (bits * i);
      out[size_t(r * wpr + w)] = int32_t(x);
    }
  return out;
}

std::vector<uint8_t> unpack_cols_ref(const int32_t* packed, int64_t rows, int64_t n, int bits) {
  check_cols("awq::unpack_cols_ref", rows, n, bits);
  const int64_t pf = 32 / bits, wpr = n / pf;
  std::vector<uint8_t> v(size_t(rows * n));  // [rows, n]
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; ++c)
      v[size_t(r * n + c)] =
          uint8_t((uint32_t(packed[r * wpr + c / pf]) >> (bits * slot_of(int(c % pf), bits))) & ((1u << bits) - 1));
  return v;
}

std::vector<uint8_t> unpack_cols(const int32_t* packed, int64_t rows, int64_t n, int bits) {
  check_cols("awq::unpack_cols", rows, n, bits);
  const int pf = 32 / bits;
  const int64_t wpr = n / pf;
  const uint32_t m = (1u << bits) - 1;
  int src[8];
  for (int i = 0; i < pf; ++i) src[i] = order(i, bits);
  std::vector<uint8_t> v(size_t(rows * n));  // [rows, n]
#pragma omp parallel for schedule(static)
  for (long long r = 0; r < rows; ++r)
    for (int64_t w = 0; w < wpr; ++w) {
      const uint32_t x = uint32_t(packed[r * wpr + w]);
      uint8_t* d = v.data() + r * n + w * pf;
      for (int i = 0; i < pf; ++i) d[src[i]] = uint8_t((x >> (bits * i)) & m);
    }
  return v;
}

}  // namespace marlinc::awq

// ==== compressed-tensors pack-quantized =============================================================
namespace marlinc::ct {
namespace {
void check_ct(const char* fn, int64_t k, int64_t n, int bits) {
  packcheck::bits_4_or_8(fn, bits);
  packcheck::positive(fn, "k", k);
  packcheck::positive(fn, "n", n);
}
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

std::vector<int32_t> pack_weight_ref(const uint8_t* codes, int64_t k, int64_t n, int bits) {
  check_ct("ct::pack_weight_ref", k, n, bits);
  packcheck::codes_fit("ct::pack_weight_ref", codes, k, n, bits);
  const int64_t pf = 32 / bits, kw = ceil_div(k, pf);
  std::vector<uint32_t> out(size_t(n * kw), 0u);  // [n, ceil(k/pf)]
  for (int64_t i = 0; i < k; ++i)
    for (int64_t o = 0; o < n; ++o) out[size_t(o * kw + i / pf)] |= uint32_t(codes[i * n + o]) << (bits * (i % pf));
  return std::vector<int32_t>(out.begin(), out.end());
}

std::vector<int32_t> pack_weight(const uint8_t* codes, int64_t k, int64_t n, int bits) {
  check_ct("ct::pack_weight", k, n, bits);
  packcheck::codes_fit("ct::pack_weight", codes, k, n, bits);
  const int pf = 32 / bits;
  const int64_t kw = ceil_div(k, pf);
  constexpr int64_t kColBlock = 64;  // output rows handled together: reads stay unit-stride in n
  std::vector<int32_t> out(size_t(n * kw));  // [n, ceil(k/pf)]
#pragma omp parallel for schedule(static)
  for (long long ob = 0; ob < n; ob += kColBlock) {
    const int64_t oe = std::min<int64_t>(n, ob + kColBlock);
    uint32_t acc[kColBlock];
    for (int64_t w = 0; w < kw; ++w) {
      const int64_t i0 = w * pf, rows = std::min<int64_t>(pf, k - i0);  // last word may be partial (zero pad)
      for (int64_t o = ob; o < oe; ++o) acc[o - ob] = 0;
      for (int64_t j = 0; j < rows; ++j) {
        const uint8_t* src = codes + (i0 + j) * n;
        for (int64_t o = ob; o < oe; ++o) acc[o - ob] |= uint32_t(src[o]) << (bits * j);
      }
      for (int64_t o = ob; o < oe; ++o) out[size_t(o * kw + w)] = int32_t(acc[o - ob]);
    }
  }
  return out;
}

std::vector<uint8_t> unpack_weight_ref(const int32_t* packed, int64_t k, int64_t n, int bits) {
  check_ct("ct::unpack_weight_ref", k, n, bits);
  const int64_t pf = 32 / bits, kw = ceil_div(k, pf);
  std::vector<uint8_t> codes(size_t(k * n));  // [k, n]; padding fields of the last word are ignored
  for (int64_t i = 0; i < k; ++i)
    for (int64_t o = 0; o < n; ++o)
      codes[size_t(i * n + o)] = uint8_t((uint32_t(packed[o * kw + i / pf]) >> (bits * (i % pf))) & ((1u << bits) - 1));
  return codes;
}

std::vector<uint8_t> unpack_weight(const int32_t* packed, int64_t k, int64_t n, int bits) {
  check_ct("ct::unpack_weight", k, n, bits);
  const int pf = 32 / bits;
  const int64_t kw = ceil_div(k, pf);
  const uint32_t m = (1u << bits) - 1;
  constexpr int64_t kColBlock = 64;
  std::vector<uint8_t> codes(size_t(k * n));  // [k, n]
#pragma omp parallel for schedule(static)
  for (long long ob = 0; ob < n; ob += kColBlock) {
    const int64_t oe = std::min<int64_t>(n, ob + kColBlock);
    for (int64_t w = 0; w < kw; ++w) {
      const int64_t i0 = w * pf, rows = std::min<int64_t>(pf, k - i0);
      for (int64_t j = 0; j < rows; ++j) {
        uint8_t* dst = codes.data() + (i0 + j) * n;
        for (int64_t o = ob; o < oe; ++o) dst[o] = uint8_t((uint32_t(packed[o * kw + w]) >> (bits * j)) & m);
      }
    }
  }
  return codes;
}

std::vector<int32_t> pack_zero_point(const uint8_t* z, int64_t groups, int64_t n, int bits) {
  const char* fn = "ct::pack_zero_point";
  check_ct(fn, groups, n, bits);
  packcheck::codes_fit(fn, z, groups, n, bits, "zero point");
  const int64_t pf = 32 / bits, nw = ceil_div(n, pf);
  std::vector<uint32_t> out(size_t(nw * groups), 0u);  // [ceil(n/pf), G]
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t o = 0; o < n; ++o) out[size_t(o / pf * groups + g)] |= uint32_t(z[g * n + o]) << (bits * (o % pf));
  return std::vector<int32_t>(out.begin(), out.end());
}

std::vector<uint8_t> unpack_zero_point(const int32_t* packed, int64_t groups, int64_t n, int bits) {
  check_ct("ct::unpack_zero_point", groups, n, bits);
  const int64_t pf = 32 / bits;
  std::vector<uint8_t> z(size_t(groups * n));  // [G, n]
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t o = 0; o < n; ++o)
      z[size_t(g * n + o)] = uint8_t((uint32_t(packed[o / pf * groups + g]) >> (bits * (o % pf))) & ((1u << bits) - 1));
  return z;
}

}  // namespace marlinc::ct
