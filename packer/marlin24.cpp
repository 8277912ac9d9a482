// Sparse-Marlin 2:4 layouts (spec §3.2-§3.4): kept values B_24 and metadata B_meta from codes plus an
// EXPLICIT mask. The mask alone decides what is kept (pruning already happened); codes at pruned
// positions are never read, so a kept code of 8 (value 0) cannot be mistaken for a pruned one (§9.6).
#include <array>
#include <string>

#include "packer/layout_constants.h"
#include "packer/marlin.h"
#include "packer/pack_checks.h"

namespace marlinc::marlin {
namespace {

using namespace marlinc::layout;

void check_24(const char* fn, int64_t k, int64_t n, int bits) {
  packcheck::bits_4_or_8(fn, bits);
  packcheck::multiple(fn, "k", k, 32, "2:4 metadata pairs k/16 columns and values tile k/2 in 16 rows");
  packcheck::multiple(fn, "n", n, 64, "Sparse-Marlin packs 16x64 blocks and reorders meta in 64-column groups");
}
int64_t row_words_24(int64_t n, int bits) { return n * 16 / (32 / bits); }

// 4-bit mask pattern (bit t = row 4g+t kept) -> meta nibble idx0 | idx1 << 2, or -1 unless exactly two
// are kept. With two kept the §3.2 selection rule records exactly those two (idx0 < idx1).
constexpr std::array<int8_t, 16> make_pattern_nibble() {
  std::array<int8_t, 16> t{};
  for (int p = 0; p < 16; ++p) {
    int idx[4], c = 0;
    for (int b = 0; b < 4; ++b)
      if (p >> b & 1) idx[c++] = b;
    t[size_t(p)] = c == 2 ? int8_t(idx[0] | idx[1] << 2) : int8_t(-1);
  }
  return t;
}
constexpr auto kPatternNibble = make_pattern_nibble();
// §3.2 table (m0 m1 m2 m3): 0011 -> 0xE, 1100 -> 0x4, 0110 -> 0x9, 0101 -> 0xD, 1010 -> 0x8, 1001 -> 0xC
// (the pattern bits here are LSB = row 0, so the literals read reversed).
static_assert(kPatternNibble[0b1100] == 0xE && kPatternNibble[0b0011] == 0x4 && kPatternNibble[0b0110] == 0x9 &&
                  kPatternNibble[0b1010] == 0xD && kPatternNibble[0b0101] == 0x8 && kPatternNibble[0b1001] == 0xC,
              "kept pair -> meta nibble must match the CUTLASS 2:4 selection table (spec §3.2)");

bool valid_nibble(unsigned nib) { return (nib & 3) < (nib >> 2); }

// Throws naming the first column and row group whose mask does not keep exactly 2 of 4.
void validate_mask_24(const char* fn, const uint8_t* mask, int64_t k, int64_t n) {
  for (int64_t g = 0; g < k / 4; ++g)
    for (int64_t c = 0; c < n; ++c) {
      int kept = 0;
      for (int t = 0; t < 4; ++t) kept += mask[(4 * g + t) * n + c] != 0;
      if (kept != 2)
        bad_data(std::string(fn) + ": 2:4 mask keeps " + std::to_string(kept) + " of rows " + std::to_string(4 * g) +
                 ".." + std::to_string(4 * g + 3) + " in column " + std::to_string(c) +
                 " (exactly 2 of every aligned 4 along k are required)");
    }
}

// §3.4 closed form, compressed element (kc, n) -> (row, word, slot).
void values_pos(int64_t kc, int64_t n, int bits, int64_t& row, int64_t& word, int& slot) {
  const int64_t kt = kc / 16, kr = kc % 16, nt = n / 64, nr = n % 64, c16 = nr % 16;
  const int64_t col = 2 * (nr / 16) + c16 / 8, i = 4 * col + (kr % 8) / 2;
  row = kt;
  if (bits == 4) {
    word = 128 * nt + 4 * i + c16 % 4;
    slot = int(4 * (kr % 2) + 2 * ((c16 % 8) / 4) + kr / 8);
  } else {  // [0,2,1,3] interleave, 4 per word
    word = 256 * nt + 8 * i + 2 * (c16 % 4) + (c16 % 8) / 4;
    slot = int(kr / 8 + 2 * (kr % 2));
  }
}
// Inverse of values_pos.
void values_elem(int64_t R, int64_t W, int m, int bits, int64_t& kc, int64_t& n) {
  if (bits == 4) {
    const int64_t nt = W / 128, w = W % 128, i = w / 4, j = w % 4, col = i / 4, block = (m / 2) % 2;
    kc = 16 * R + 8 * (m % 2) + 2 * (i % 4) + m / 4;
    n = 64 * nt + 16 * (col / 2) + 8 * (col % 2) + 4 * block + j;
  } else {
    const int64_t nt = W / 256, w = W % 256, i = w / 8, j = (w % 8) / 2, col = i / 4, block = w % 2;
    kc = 16 * R + 8 * (m % 2) + 2 * (i % 4) + m / 2;
    n = 64 * nt + 16 * (col / 2) + 8 * (col % 2) + 4 * block + j;
  }
}
// §3.3 closed form: group starting at row k (k % 4 == 0), column n -> flat index in [k/32, 2n], shift.
void meta_pos(int64_t k, int64_t n, int64_t ncols, int64_t& flat, int& shift) {
  const int64_t base = 64 * (n / 64) + 32 * ((n / 2) % 2) + 4 * ((n % 64) / 8) + 2 * (n % 2);
  const int64_t row = k / 32, col = 2 * (base + (k / 16) % 2) + (n / 4) % 2;
  flat = row * 2 * ncols + col;
  shift = int(4 * ((k % 16) / 4));
}
void meta_elem(int64_t R, int64_t C, int t, int64_t& k, int64_t& n) {
  k = 32 * R + 16 * ((C / 2) % 2) + 4 * t;
  n = 64 * (C / 128) + 8 * ((C % 64) / 8) + 4 * (C % 2) + 2 * ((C / 64) % 2) + (C / 4) % 2;
}

std::array<int64_t, kBlockEntries> block_offsets(const Perm1024& perm, int64_t n) {
  std::array<int64_t, kBlockEntries> off{};
  for (int p = 0; p < kBlockEntries; ++p) {
    const int o = perm[size_t(p)];
    off[size_t(p)] = int64_t((o % 256) / 16) * n + 16 * (o / 256) + o % 16;
  }
  return off;
}

}  // namespace

Sparse24 pack_24_ref(const uint8_t* codes, const uint8_t* mask, int64_t k, int64_t n, int bits) {
  const char* fn = "marlin::pack_24_ref";
  check_24(fn, k, n, bits);
  validate_mask_24(fn, mask, k, n);
  const int64_t rw = row_words_24(n, bits);
  const int maxq = (1 << bits) - 1;
  std::vector<uint32_t> B(size_t(k / 32 * rw), 0u);  // [k/32, n*bits/2]
  std::vector<uint16_t> M(size_t(k / 32 * 2 * n), 0u);  // [k/32, 2n]
  for (int64_t g = 0; g < k / 4; ++g)
    for (int64_t c = 0; c < n; ++c) {
      int idx[2], cnt = 0;
      for (int t = 0; t < 4; ++t)
        if (mask[(4 * g + t) * n + c]) idx[cnt++] = t;
      int64_t flat;
      int shift;
      meta_pos(4 * g, c, n, flat, shift);
      M[size_t(flat)] = uint16_t(M[size_t(flat)] | unsigned(idx[0] | idx[1] << 2) << shift);
      for (int s = 0; s < 2; ++s) {
        const int64_t r = 4 * g + idx[s];
        const uint8_t q = codes[r * n + c];
        if (q > maxq)
          bad_data(std::string(fn) + ": kept code " + std::to_string(q) + " at (" + std::to_string(r) + ", " +
                   std::to_string(c) + ") exceeds " + std::to_string(maxq) + " (" + std::to_string(bits) + "-bit codes)");
        int64_t row, word;
        int slot;
        values_pos(2 * g + s, c, bits, row, word, slot);
        B[size_t(row * rw + word)] |= uint32_t(q) << (bits * slot);
      }
    }
  Sparse24 out;
  out.B24.assign(B.begin(), B.end());
  out.meta.assign(M.begin(), M.end());
  return out;
}

Sparse24 pack_24(const uint8_t* codes, const uint8_t* mask, int64_t k, int64_t n, int bits) {
  check_24("marlin::pack_24", k, n, bits);
  const int per = 32 / bits, words = kBlockEntries / per;
  const int64_t rw = row_words_24(n, bits), nblocks = n / 64;
  const auto off = block_offsets(bits == 4 ? kWeightPerm24_4 : kWeightPerm24_8, n);
  Sparse24 out;
  out.B24.resize(size_t(k / 32 * rw));     // [k/32, n*bits/2]
  out.meta.resize(size_t(k / 32 * 2 * n));  // [k/32, 2n]
  unsigned bad_mask = 0, code_or = 0;
  // Each B_24 row and each meta row covers the same 32 original rows: one task per row pair.
#pragma omp parallel reduction(| : bad_mask, code_or)
  {
    std::vector<uint8_t> comp(size_t(16 * n));  // [16, n] compressed codes of this row
#pragma omp for schedule(static)
    for (long long R = 0; R < k / 32; ++R) {
      int16_t* meta = out.meta.data() + R * 2 * n;
      for (int64_t c = 0; c < 2 * n; ++c) meta[c] = 0;
      for (int gl = 0; gl < 8; ++gl) {
        const uint8_t* m0 = mask + (32 * R + 4 * gl) * n;
        const uint8_t* q0 = codes + (32 * R + 4 * gl) * n;
        const int shift = 4 * (gl % 4), half = 2 * (gl / 4);
        for (int64_t c = 0; c < n; ++c) {
          const unsigned pat = unsigned(m0[c] != 0) | unsigned(m0[n + c] != 0) << 1 | unsigned(m0[2 * n + c] != 0) << 2 |
                               unsigned(m0[3 * n + c] != 0) << 3;
          const int nib = kPatternNibble[pat];
          if (nib < 0) { bad_mask = 1; continue; }
          const uint8_t a = q0[(nib & 3) * n + c], b = q0[(nib >> 2) * n + c];
          code_or |= unsigned(a) | unsigned(b);
          comp[size_t(2 * gl * n + c)] = a;
          comp[size_t((2 * gl + 1) * n + c)] = b;
          int16_t& mw = meta[128 * (c / 64) + kMetaCol[size_t(c % 64)] + half];
          mw = int16_t(uint16_t(mw) | unsigned(nib) << shift);
        }
      }
      for (int64_t nt = 0; nt < nblocks; ++nt) {
        const uint8_t* src = comp.data() + nt * 64;
        int32_t* dst = out.B24.data() + R * rw + nt * words;
        for (int w = 0; w < words; ++w) {
          const int64_t* o = off.data() + w * per;
          uint32_t v = 0;
          for (int t = 0; t < per; ++t) v |= uint32_t(src[o[t]]) << (bits * t);
          dst[w] = int32_t(v);
        }
      }
    }
  }
  // Errors are raised outside the parallel region; the reference names the first offender.
  if (bad_mask || (code_or >> bits) != 0) pack_24_ref(codes, mask, k, n, bits);
  return out;
}

void unpack_24_ref(const int32_t* B24, const int16_t* meta, int64_t k, int64_t n, int bits, uint8_t* codes,
                   uint8_t* mask) {
  const char* fn = "marlin::unpack_24_ref";
  check_24(fn, k, n, bits);
  std::vector<uint8_t> nibs(size_t(k / 4 * n));  // [k/4, n] meta nibble of each group
  for (int64_t R = 0; R < k / 32; ++R)
    for (int64_t C = 0; C < 2 * n; ++C)
      for (int t = 0; t < 4; ++t) {
        int64_t r, c;
        meta_elem(R, C, t, r, c);
        const unsigned nib = (uint16_t(meta[R * 2 * n + C]) >> (4 * t)) & 0xFu;
        if (!valid_nibble(nib))
          bad_data(std::string(fn) + ": meta nibble 0x" + "0123456789abcdef"[nib] + " for rows " + std::to_string(r) +
                   ".." + std::to_string(r + 3) + " of column " + std::to_string(c) + " (meta[" + std::to_string(R) +
                   "][" + std::to_string(C) + "]) does not name two distinct kept rows idx0 < idx1");
        nibs[size_t(r / 4 * n + c)] = uint8_t(nib);
      }
  const uint8_t zero = uint8_t(1 << (bits - 1));
  for (int64_t i = 0; i < k * n; ++i) { codes[i] = zero; mask[i] = 0; }
  const int64_t rw = row_words_24(n, bits);
  const int per = 32 / bits;
  for (int64_t R = 0; R < k / 32; ++R)
    for (int64_t W = 0; W < rw; ++W)
      for (int m = 0; m < per; ++m) {
        int64_t kc, c;
        values_elem(R, W, m, bits, kc, c);
        const unsigned nib = nibs[size_t(kc / 2 * n + c)];
        const int64_t r = 4 * (kc / 2) + (kc % 2 == 0 ? (nib & 3) : (nib >> 2));
        codes[r * n + c] = uint8_t((uint32_t(B24[R * rw + W]) >> (bits * m)) & ((1u << bits) - 1));
        mask[r * n + c] = 1;
      }
}

void unpack_24(const int32_t* B24, const int16_t* meta, int64_t k, int64_t n, int bits, uint8_t* codes,
               uint8_t* mask) {
  check_24("marlin::unpack_24", k, n, bits);
  const int per = 32 / bits, words = kBlockEntries / per;
  const uint32_t vmask = (1u << bits) - 1;
  const uint8_t zero = uint8_t(1 << (bits - 1));
  const int64_t rw = row_words_24(n, bits), nblocks = n / 64;
  const auto off = block_offsets(bits == 4 ? kWeightPerm24_4 : kWeightPerm24_8, n);
  unsigned bad = 0;
#pragma omp parallel reduction(| : bad)
  {
    std::vector<uint8_t> comp(size_t(16 * n));  // [16, n]
#pragma omp for schedule(static)
    for (long long R = 0; R < k / 32; ++R) {
      for (int64_t nt = 0; nt < nblocks; ++nt) {
        uint8_t* dst = comp.data() + nt * 64;
        const int32_t* src = B24 + R * rw + nt * words;
        for (int w = 0; w < words; ++w) {
          const int64_t* o = off.data() + w * per;
          const uint32_t v = uint32_t(src[w]);
          for (int t = 0; t < per; ++t) dst[o[t]] = uint8_t((v >> (bits * t)) & vmask);
        }
      }
      const int16_t* mrow = meta + R * 2 * n;
      for (int gl = 0; gl < 8; ++gl) {
        uint8_t* q0 = codes + (32 * R + 4 * gl) * n;
        uint8_t* m0 = mask + (32 * R + 4 * gl) * n;
        const int shift = 4 * (gl % 4), half = 2 * (gl / 4);
        for (int64_t c = 0; c < n; ++c) {
          const unsigned nib = (uint16_t(mrow[128 * (c / 64) + kMetaCol[size_t(c % 64)] + half]) >> shift) & 0xFu;
          for (int t = 0; t < 4; ++t) { q0[t * n + c] = zero; m0[t * n + c] = 0; }
          if (!valid_nibble(nib)) { bad = 1; continue; }
          q0[(nib & 3) * n + c] = comp[size_t(2 * gl * n + c)];
          q0[(nib >> 2) * n + c] = comp[size_t((2 * gl + 1) * n + c)];
          m0[(nib & 3) * n + c] = 1;
          m0[(nib >> 2) * n + c] = 1;
        }
      }
    }
  }
  if (bad) unpack_24_ref(B24, meta, k, n, bits, codes, mask);  // throws naming the first bad nibble
}

}  // namespace marlinc::marlin
