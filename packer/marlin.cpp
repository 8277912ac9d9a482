// Dense Marlin layouts (spec §1.2-§1.8): weights B, scales, zero points. `_ref` functions follow the
// spec's closed forms element by element (with divisions); the fast ones walk 16x64 blocks with a
// 1024-entry offset table built from layout::kWeightPerm*, parallel over rows of B.
#include <algorithm>
#include <array>
#include <string>

#include "packer/gptq.h"
#include "packer/layout_constants.h"
#include "packer/marlin.h"
#include "packer/pack_checks.h"

namespace marlinc::marlin {
namespace {

using namespace marlinc::layout;

void check_dense(const char* fn, int64_t k, int64_t n, int bits) {
  packcheck::bits_4_or_8(fn, bits);
  packcheck::multiple(fn, "k", k, 16, "Marlin tiles k in 16-row tiles");
  packcheck::multiple(fn, "n", n, 64, "Marlin packs 16x64 blocks");
}

// Words of one B row: 16 rows of n codes, 32/bits codes per word.
int64_t row_words(int64_t n, int bits) { return n * 16 / (32 / bits); }

// Closed form §1.5 (4-bit) / §1.7 (8-bit): element (k, n) -> (row, word, slot).
struct Pos { int64_t row, word; int slot; };
Pos dense_pos(int64_t k, int64_t n, int bits) {
  const int64_t kt = k / 16, kr = k % 16, nt = n / 64, nr = n % 64, j = nr / 16, c16 = nr % 16;
  const int64_t i = 4 * (c16 % 8) + (kr % 8) / 2;
  if (bits == 4) return {kt, 128 * nt + 4 * i + j, int(4 * (kr % 2) + 2 * (c16 / 8) + kr / 8)};
  return {kt, 256 * nt + 8 * i + 2 * j + c16 / 8, int(kr / 8 + 2 * (kr % 2))};
}
// Inverse closed form: (row, word, slot) -> (k, n).
void dense_elem(int64_t R, int64_t W, int m, int bits, int64_t& k, int64_t& n) {
  if (bits == 4) {
    const int64_t nt = W / 128, w = W % 128, i = w / 4, j = w % 4;
    k = 16 * R + 8 * (m % 2) + 2 * (i % 4) + m / 4;
    n = 64 * nt + 16 * j + 8 * ((m / 2) % 2) + i / 4;
  } else {
    const int64_t nt = W / 256, w = W % 256, i = w / 8, j = (w % 8) / 2;
    k = 16 * R + 8 * (m % 2) + 2 * (i % 4) + m / 2;
    n = 64 * nt + 16 * j + 8 * (w % 2) + i / 4;
  }
}

// Offset of entry p of a permuted 1024-chunk inside the [16, n] row slab of codes, relative to the
// block's first column: tile-local index perm[p] = 256*tile + 16*kr + c16.
std::array<int64_t, kBlockEntries> block_offsets(const Perm1024& perm, int64_t n) {
  std::array<int64_t, kBlockEntries> off{};
  for (int p = 0; p < kBlockEntries; ++p) {
    const int o = perm[size_t(p)];
    off[size_t(p)] = int64_t((o % 256) / 16) * n + 16 * (o / 256) + o % 16;
  }
  return off;
}

template <int BITS>
void pack_dense_fast(const uint8_t* codes, int64_t k, int64_t n, int32_t* B) {  // B: [k/16, n*BITS/2]
  constexpr int per = 32 / BITS, words = kBlockEntries / per;
  const auto off = block_offsets(BITS == 4 ? kWeightPerm4 : kWeightPerm8, n);
  const int64_t rw = row_words(n, BITS), nblocks = n / 64;
#pragma omp parallel for schedule(static)
  for (long long kt = 0; kt < k / 16; ++kt)
    for (int64_t nt = 0; nt < nblocks; ++nt) {
      const uint8_t* src = codes + kt * 16 * n + nt * 64;
      int32_t* dst = B + kt * rw + nt * words;
      for (int w = 0; w < words; ++w) {
        const int64_t* o = off.data() + w * per;
        uint32_t v = 0;
        for (int t = 0; t < per; ++t) v |= uint32_t(src[o[t]]) << (BITS * t);
        dst[w] = int32_t(v);
      }
    }
}

template <int BITS>
void unpack_dense_fast(const int32_t* B, int64_t k, int64_t n, uint8_t* codes) {
  constexpr int per = 32 / BITS, words = kBlockEntries / per;
  constexpr uint32_t mask = (1u << BITS) - 1;
  const auto off = block_offsets(BITS == 4 ? kWeightPerm4 : kWeightPerm8, n);
  const int64_t rw = row_words(n, BITS), nblocks = n / 64;
#pragma omp parallel for schedule(static)
  for (long long kt = 0; kt < k / 16; ++kt)
    for (int64_t nt = 0; nt < nblocks; ++nt) {
      uint8_t* dst = codes + kt * 16 * n + nt * 64;
      const int32_t* src = B + kt * rw + nt * words;
      for (int w = 0; w < words; ++w) {
        const int64_t* o = off.data() + w * per;
        const uint32_t v = uint32_t(src[w]);
        for (int t = 0; t < per; ++t) dst[o[t]] = uint8_t((v >> (BITS * t)) & mask);
      }
    }
}

// ---- 4-bit slab kernels ---------------------------------------------------------------------------
// A 16-row slab is described by GPTQ-style column words: lo[c] holds rows 0..7 of column c (nibble
// kr), hi[c] rows 8..15. Lane i = 4*c + q of tile j needs rows 2q, 2q+1, 2q+8, 2q+9 of columns c and
// c+8, i.e. byte q of lo/hi at both columns: a 4x4 byte transpose, then the "64207531" interleave is
// "low nibbles of the 4 bytes into the low half-word, high nibbles into the high half-word".
inline uint32_t spread_nibbles(uint32_t x) {
  uint32_t l = x & 0x0F0F0F0Fu, h = (x >> 4) & 0x0F0F0F0Fu;
  l = (l | l >> 4) & 0x00FF00FFu;
  l = (l | l >> 8) & 0x0000FFFFu;
  h = (h | h >> 4) & 0x00FF00FFu;
  h = (h | h >> 8) & 0x0000FFFFu;
  return l | h << 16;
}
inline uint32_t gather_nibbles(uint32_t w) {  // inverse of spread_nibbles
  uint32_t l = w & 0xFFFFu, h = w >> 16;
  l = (l | l << 8) & 0x00FF00FFu;
  l = (l | l << 4) & 0x0F0F0F0Fu;
  h = (h | h << 8) & 0x00FF00FFu;
  h = (h | h << 4) & 0x0F0F0F0Fu;
  return l | h << 4;
}
void slab_to_marlin4(const uint32_t* lo, const uint32_t* hi, int64_t n, uint32_t* dst) {  // dst: [2n] one B row
  for (int64_t nt = 0; nt < n / 64; ++nt)
    for (int j = 0; j < 4; ++j)
      for (int c = 0; c < 8; ++c) {
        const int64_t n0 = 64 * nt + 16 * j + c;
        const uint32_t a = lo[n0], b = hi[n0], a8 = lo[n0 + 8], b8 = hi[n0 + 8];
        uint32_t* d = dst + 128 * nt + 16 * c + j;
        for (int q = 0; q < 4; ++q) {
          const int s = 8 * q;
          const uint32_t x = ((a >> s) & 0xFFu) | ((b >> s) & 0xFFu) << 8 | ((a8 >> s) & 0xFFu) << 16 | ((b8 >> s) & 0xFFu) << 24;
          d[4 * q] = spread_nibbles(x);
        }
      }
}
void marlin4_to_slab(const uint32_t* src, int64_t n, uint32_t* lo, uint32_t* hi) {
  for (int64_t nt = 0; nt < n / 64; ++nt)
    for (int j = 0; j < 4; ++j)
      for (int c = 0; c < 8; ++c) {
        const int64_t n0 = 64 * nt + 16 * j + c;
        const uint32_t* s = src + 128 * nt + 16 * c + j;
        uint32_t a = 0, b = 0, a8 = 0, b8 = 0;
        for (int q = 0; q < 4; ++q) {
          const uint32_t x = gather_nibbles(s[4 * q]);
          a |= (x & 0xFFu) << (8 * q);
          b |= ((x >> 8) & 0xFFu) << (8 * q);
          a8 |= ((x >> 16) & 0xFFu) << (8 * q);
          b8 |= (x >> 24) << (8 * q);
        }
        lo[n0] = a, hi[n0] = b, lo[n0 + 8] = a8, hi[n0 + 8] = b8;
      }
}
// Column words of the 16 code rows starting at `rows`: unit stride in n, so it vectorises.
void codes_to_slab(const uint8_t* rows, int64_t n, uint32_t* lo, uint32_t* hi) {
  for (int64_t c = 0; c < n; ++c) lo[c] = rows[c], hi[c] = rows[8 * n + c];
  for (int kr = 1; kr < 8; ++kr)
    for (int64_t c = 0; c < n; ++c) {
      lo[c] |= uint32_t(rows[kr * n + c]) << (4 * kr);
      hi[c] |= uint32_t(rows[(kr + 8) * n + c]) << (4 * kr);
    }
}
void slab_to_codes(const uint32_t* lo, const uint32_t* hi, int64_t n, uint8_t* rows) {
  for (int kr = 0; kr < 8; ++kr)
    for (int64_t c = 0; c < n; ++c) {
      rows[kr * n + c] = uint8_t((lo[c] >> (4 * kr)) & 15u);
      rows[(kr + 8) * n + c] = uint8_t((hi[c] >> (4 * kr)) & 15u);
    }
}

}  // namespace

std::vector<int32_t> pack_weights_ref(const uint8_t* codes, int64_t k, int64_t n, int bits) {
  check_dense("marlin::pack_weights_ref", k, n, bits);
  packcheck::codes_fit("marlin::pack_weights_ref", codes, k, n, bits);
  const int64_t rw = row_words(n, bits);
  std::vector<uint32_t> B(size_t(k / 16 * rw), 0u);  // [k/16, n*bits/2]
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < n; ++c) {
      const Pos p = dense_pos(r, c, bits);
      B[size_t(p.row * rw + p.word)] |= uint32_t(codes[r * n + c]) << (bits * p.slot);
    }
  return std::vector<int32_t>(B.begin(), B.end());
}

std::vector<int32_t> pack_weights(const uint8_t* codes, int64_t k, int64_t n, int bits) {
  check_dense("marlin::pack_weights", k, n, bits);
  packcheck::codes_fit("marlin::pack_weights", codes, k, n, bits);
  std::vector<int32_t> B(size_t(k / 16 * row_words(n, bits)));  // [k/16, n*bits/2]
  if (bits == 8) {
    pack_dense_fast<8>(codes, k, n, B.data());
    return B;
  }
#pragma omp parallel
  {
    std::vector<uint32_t> lo(static_cast<size_t>(n)), hi(static_cast<size_t>(n));  // [n] each
#pragma omp for schedule(static)
    for (long long kt = 0; kt < k / 16; ++kt) {
      codes_to_slab(codes + kt * 16 * n, n, lo.data(), hi.data());
      slab_to_marlin4(lo.data(), hi.data(), n, reinterpret_cast<uint32_t*>(B.data()) + kt * 2 * n);
    }
  }
  return B;
}

std::vector<uint8_t> unpack_weights_ref(const int32_t* B, int64_t k, int64_t n, int bits) {
  check_dense("marlin::unpack_weights_ref", k, n, bits);
  const int64_t rw = row_words(n, bits);
  const int per = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  std::vector<uint8_t> codes(size_t(k * n));  // [k, n]
  for (int64_t R = 0; R < k / 16; ++R)
    for (int64_t W = 0; W < rw; ++W)
      for (int m = 0; m < per; ++m) {
        int64_t r, c;
        dense_elem(R, W, m, bits, r, c);
        codes[size_t(r * n + c)] = uint8_t((uint32_t(B[R * rw + W]) >> (bits * m)) & mask);
      }
  return codes;
}

std::vector<uint8_t> unpack_weights(const int32_t* B, int64_t k, int64_t n, int bits) {
  check_dense("marlin::unpack_weights", k, n, bits);
  std::vector<uint8_t> codes(size_t(k * n));  // [k, n]
  if (bits == 8) {
    unpack_dense_fast<8>(B, k, n, codes.data());
    return codes;
  }
#pragma omp parallel
  {
    std::vector<uint32_t> lo(static_cast<size_t>(n)), hi(static_cast<size_t>(n));  // [n] each
#pragma omp for schedule(static)
    for (long long kt = 0; kt < k / 16; ++kt) {
      marlin4_to_slab(reinterpret_cast<const uint32_t*>(B) + kt * 2 * n, n, lo.data(), hi.data());
      slab_to_codes(lo.data(), hi.data(), n, codes.data() + kt * 16 * n);
    }
  }
  return codes;
}

// Table-driven generic path, kept for tests: the slab kernels above must agree with it.
std::vector<int32_t> pack_weights_table(const uint8_t* codes, int64_t k, int64_t n, int bits) {
  check_dense("marlin::pack_weights_table", k, n, bits);
  packcheck::codes_fit("marlin::pack_weights_table", codes, k, n, bits);
  std::vector<int32_t> B(size_t(k / 16 * row_words(n, bits)));  // [k/16, n*bits/2]
  if (bits == 4) pack_dense_fast<4>(codes, k, n, B.data());
  else pack_dense_fast<8>(codes, k, n, B.data());
  return B;
}

std::vector<int32_t> pack_weights_from_qweight(const int32_t* qweight, int64_t k, int64_t n, int bits,
                                               const int32_t* perm) {
  const char* fn = "marlin::pack_weights_from_qweight";
  check_dense(fn, k, n, bits);
  if (bits == 8) {  // 8-bit: compose (less common; the table path is already gather-based)
    auto codes = gptq::unpack_qweight(qweight, k, n, 8);
    if (perm) codes = gptq::gather_rows(codes.data(), k, n, perm);
    return pack_weights(codes.data(), k, n, 8);
  }
  if (perm) gptq::invert_permutation(perm, k);  // validates: every row exactly once
  std::vector<int32_t> B(size_t(k / 16 * 2 * n));  // [k/16, 2n]
  const uint32_t* qw = reinterpret_cast<const uint32_t*>(qweight);  // [k/8, n]
#pragma omp parallel
  {
    std::vector<uint32_t> lo(perm ? static_cast<size_t>(n) : 0), hi(perm ? static_cast<size_t>(n) : 0);
#pragma omp for schedule(static)
    for (long long kt = 0; kt < k / 16; ++kt) {
      uint32_t* dst = reinterpret_cast<uint32_t*>(B.data()) + kt * 2 * n;
      if (!perm) {  // a GPTQ word row already is the slab's column words
        slab_to_marlin4(qw + 2 * kt * n, qw + (2 * kt + 1) * n, n, dst);
        continue;
      }
      std::fill(lo.begin(), lo.end(), 0u);
      std::fill(hi.begin(), hi.end(), 0u);
      for (int kr = 0; kr < 16; ++kr) {
        const int64_t src = perm[16 * kt + kr];
        const uint32_t* sw = qw + (src / 8) * n;
        const int sh = int(4 * (src % 8)), dsh = 4 * (kr % 8);
        uint32_t* d = kr < 8 ? lo.data() : hi.data();
        for (int64_t c = 0; c < n; ++c) d[c] |= ((sw[c] >> sh) & 15u) << dsh;
      }
      slab_to_marlin4(lo.data(), hi.data(), n, dst);
    }
  }
  return B;
}

std::vector<int32_t> unpack_weights_to_qweight(const int32_t* B, int64_t k, int64_t n, int bits) {
  check_dense("marlin::unpack_weights_to_qweight", k, n, bits);
  if (bits == 8) {
    auto codes = unpack_weights(B, k, n, 8);
    return gptq::pack_qweight(codes.data(), k, n, 8);
  }
  std::vector<int32_t> qw(size_t(k / 8 * n));  // [k/8, n]
  uint32_t* q = reinterpret_cast<uint32_t*>(qw.data());
#pragma omp parallel for schedule(static)
  for (long long kt = 0; kt < k / 16; ++kt)
    marlin4_to_slab(reinterpret_cast<const uint32_t*>(B) + kt * 2 * n, n, q + 2 * kt * n, q + (2 * kt + 1) * n);
  return qw;
}

// ---- scales (§1.6) -------------------------------------------------------------------------------
namespace {
void check_scales(const char* fn, int64_t groups, int64_t n) {
  packcheck::positive(fn, "groups", groups);
  packcheck::multiple(fn, "n", n, 64, "Marlin scale permutations work on 64-column chunks");
}
// One row of G==1 uses the per-channel 32-perm, any other G the grouped 64-perm (kernels infer
// per-channel from s.size(0) == 1, spec §1.6).
template <size_t P>
std::vector<uint16_t> apply_col_perm(const uint16_t* s, int64_t groups, int64_t n, const std::array<int16_t, P>& perm,
                                     bool inverse) {
  std::vector<uint16_t> out(size_t(groups * n));  // [G, n]
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t b = 0; b < n; b += int64_t(P))
      for (size_t t = 0; t < P; ++t) {
        const int64_t dst = g * n + b + int64_t(t), src = g * n + b + perm[t];
        if (inverse) out[size_t(src)] = s[dst];
        else out[size_t(dst)] = s[src];
      }
  return out;
}
}  // namespace

std::vector<uint16_t> permute_scales(const uint16_t* s, int64_t groups, int64_t n) {
  check_scales("marlin::permute_scales", groups, n);
  return groups == 1 ? apply_col_perm(s, groups, n, kScalePermSingle, false)
                     : apply_col_perm(s, groups, n, kScalePerm, false);
}
std::vector<uint16_t> unpermute_scales(const uint16_t* s, int64_t groups, int64_t n) {
  check_scales("marlin::unpermute_scales", groups, n);
  return groups == 1 ? apply_col_perm(s, groups, n, kScalePermSingle, true)
                     : apply_col_perm(s, groups, n, kScalePerm, true);
}
std::vector<uint16_t> permute_scales_24(const uint16_t* s, int64_t groups, int64_t n) {
  check_scales("marlin::permute_scales_24", groups, n);
  // Per-channel 2:4 scales are stored unpermuted (scale_perm_single_2_4 is the identity, spec §3.5).
  if (groups == 1) return std::vector<uint16_t>(s, s + n);
  return apply_col_perm(s, groups, n, kScalePerm24, false);
}
std::vector<uint16_t> unpermute_scales_24(const uint16_t* s, int64_t groups, int64_t n) {
  check_scales("marlin::unpermute_scales_24", groups, n);
  if (groups == 1) return std::vector<uint16_t>(s, s + n);
  return apply_col_perm(s, groups, n, kScalePerm24, true);
}

// ---- zero points (§1.8) --------------------------------------------------------------------------
namespace {
void check_zp(const char* fn, int64_t groups, int64_t n, int bits) {
  packcheck::bits_4_or_8(fn, bits);
  packcheck::positive(fn, "groups", groups);
  packcheck::multiple(fn, "n", n, 64, "Marlin zero points are permuted in 64-column chunks");
}
// Slot d (= per*word + j) of a 64-column chunk holds column kZpSrc[d]: scale_perm, then the per-word
// interleave, then pack_cols (the three steps of §1.8 folded into one table).
std::array<int16_t, 64> zp_src_table(int bits) {
  const int per = 32 / bits;
  std::array<int16_t, 64> src{};
  for (int d = 0; d < 64; ++d) {
    const int il = bits == 4 ? kInterleave4[size_t(d % per)] : kInterleave8[size_t(d % per)];
    src[size_t(d)] = kScalePerm[size_t((d / per) * per + il)];
  }
  return src;
}
}  // namespace

std::vector<int32_t> pack_zero_points_ref(const uint8_t* z, int64_t groups, int64_t n, int bits) {
  check_zp("marlin::pack_zero_points_ref", groups, n, bits);
  packcheck::codes_fit("marlin::pack_zero_points_ref", z, groups, n, bits, "zero point");
  const int per = 32 / bits;
  const int64_t wpr = n / per;
  std::vector<int32_t> out(size_t(groups * wpr));  // [G, n*bits/32]
  std::vector<int32_t> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  for (int64_t g = 0; g < groups; ++g) {
    // Step 1: every 64-chunk through scale_perm (even for one group).
    for (int64_t c = 0; c < n; ++c) a[size_t(c)] = z[g * n + 64 * (c / 64) + kScalePerm[size_t(c % 64)]];
    // Step 2: per word the interleave.
    for (int64_t c = 0; c < n; ++c) {
      const int il = bits == 4 ? kInterleave4[size_t(c % per)] : kInterleave8[size_t(c % per)];
      b[size_t(c)] = a[size_t(per * (c / per) + il)];
    }
    // Step 3: pack_cols, slot j of word w = entry per*w + j.
    for (int64_t w = 0; w < wpr; ++w) {
      uint32_t v = 0;
      for (int j = 0; j < per; ++j) v |= uint32_t(b[size_t(per * w + j)]) << (bits * j);
      out[size_t(g * wpr + w)] = int32_t(v);
    }
  }
  return out;
}

std::vector<uint8_t> unpack_zero_points_ref(const int32_t* zp, int64_t groups, int64_t n, int bits) {
  check_zp("marlin::unpack_zero_points_ref", groups, n, bits);
  const int per = 32 / bits;
  const int64_t wpr = n / per;
  std::vector<uint8_t> z(size_t(groups * n));  // [G, n]
  // Closed form: 4-bit column c sits at word 8*(c/64) + c%8, nibble [0,4,1,5,2,6,3,7][(c%64)/8];
  // 8-bit at word 16*(c/64) + 2*(c%8) + ((c%64)/8)/4, byte [0,2,1,3][((c%64)/8)%4].
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t c = 0; c < n; ++c) {
      const int64_t q = (c % 64) / 8;
      int64_t word;
      int slot;
      if (bits == 4) {
        static constexpr int nib[8] = {0, 4, 1, 5, 2, 6, 3, 7};
        word = 8 * (c / 64) + c % 8;
        slot = nib[q];
      } else {
        static constexpr int byt[4] = {0, 2, 1, 3};
        word = 16 * (c / 64) + 2 * (c % 8) + q / 4;
        slot = byt[q % 4];
      }
      z[size_t(g * n + c)] = uint8_t((uint32_t(zp[g * wpr + word]) >> (bits * slot)) & ((1u << bits) - 1));
    }
  return z;
}

std::vector<int32_t> pack_zero_points(const uint8_t* z, int64_t groups, int64_t n, int bits) {
  check_zp("marlin::pack_zero_points", groups, n, bits);
  packcheck::codes_fit("marlin::pack_zero_points", z, groups, n, bits, "zero point");
  const int per = 32 / bits;
  const auto src = zp_src_table(bits);
  const int64_t wpr = n / per;
  std::vector<int32_t> out(size_t(groups * wpr));  // [G, n*bits/32]
#pragma omp parallel for schedule(static)
  for (long long g = 0; g < groups; ++g)
    for (int64_t b = 0; b < n; b += 64)
      for (int w = 0; w < 64 / per; ++w) {
        uint32_t v = 0;
        for (int j = 0; j < per; ++j) v |= uint32_t(z[g * n + b + src[size_t(per * w + j)]]) << (bits * j);
        out[size_t(g * wpr + b / per + w)] = int32_t(v);
      }
  return out;
}

std::vector<uint8_t> unpack_zero_points(const int32_t* zp, int64_t groups, int64_t n, int bits) {
  check_zp("marlin::unpack_zero_points", groups, n, bits);
  const int per = 32 / bits;
  const auto src = zp_src_table(bits);
  const int64_t wpr = n / per;
  const uint32_t mask = (1u << bits) - 1;
  std::vector<uint8_t> z(size_t(groups * n));  // [G, n]
#pragma omp parallel for schedule(static)
  for (long long g = 0; g < groups; ++g)
    for (int64_t b = 0; b < n; b += 64)
      for (int w = 0; w < 64 / per; ++w) {
        const uint32_t v = uint32_t(zp[g * wpr + b / per + w]);
        for (int j = 0; j < per; ++j) z[size_t(g * n + b + src[size_t(per * w + j)])] = uint8_t((v >> (bits * j)) & mask);
      }
  return z;
}

}  // namespace marlinc::marlin
