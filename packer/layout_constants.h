// Layout constants of Marlin / Sparse-Marlin (spec: ../shared/spec/formats.md §1.3, §1.6, §1.7, §1.8,
// §3.3-§3.5). Every table is generated at compile time from its definition in the spec (the warp/lane
// walk of the kernel), not typed in, and pinned by static_asserts on the entries the spec prints.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>

namespace marlinc::layout {

// A 16x64 block (four 16x16 tiles) is the unit the Marlin kernel loads per warp: 1024 codes.
inline constexpr int kTile = 16;
inline constexpr int kBlockN = 64;
inline constexpr int kBlockEntries = kTile * kBlockN;  // 1024

using Perm1024 = std::array<int16_t, kBlockEntries>;

// Interleave applied to each word's codes so the kernel's dequant extracts two fp16 pairs with one
// mask (4-bit "64207531": out[t] = in[il[t]]); 8-bit packs 4 codes per word and swaps the middle two.
inline constexpr std::array<int, 8> kInterleave4 = {0, 2, 4, 6, 1, 3, 5, 7};
inline constexpr std::array<int, 4> kInterleave8 = {0, 2, 1, 3};

// Applies the per-word interleave of `bits` to a raw lane-walk list (groups of 32/bits entries).
constexpr Perm1024 apply_interleave(const Perm1024& raw, int bits) {
  Perm1024 out{};
  const int per = 32 / bits;
  for (int base = 0; base < kBlockEntries; base += per)
    for (int t = 0; t < per; ++t)
      out[size_t(base + t)] = raw[size_t(base + (bits == 4 ? kInterleave4[size_t(t)] : kInterleave8[size_t(t)]))];
  return out;
}

// §1.3: lane i of the warp owns, in each of the 4 tiles j, the mma.m16n8k16 B-fragment rows
// r, r+1, r+8, r+9 (r = 2*(i%4)) of columns c and c+8 (c = i/4). Entry = tile-local 16*row+col + 256*j.
constexpr Perm1024 make_weight_perm(int bits) {
  Perm1024 raw{};
  int p = 0;
  for (int i = 0; i < 32; ++i) {
    const int r = 2 * (i % 4), c = i / 4;
    for (int j = 0; j < 4; ++j)
      for (int cc : {c, c + 8})
        for (int rr : {r, r + 1, r + 8, r + 9}) raw[size_t(p++)] = int16_t(16 * rr + cc + 256 * j);
  }
  return apply_interleave(raw, bits);
}

// §3.4: Sparse-Marlin's mma.sp.m16n8k32 B fragment; lane i = 4*col + (row pair), each value repeated
// for 4 adjacent columns (+j, not +256*j) because the compressed tile feeds a k32 instruction.
constexpr Perm1024 make_weight_perm_24(int bits) {
  Perm1024 raw{};
  int p = 0;
  for (int i = 0; i < 32; ++i) {
    const int col = i / 4, col_o = col / 2, r = 2 * (i % 4);
    for (int j = 0; j < 4; ++j)
      for (int block = 0; block < 2; ++block)
        for (int rr : {r, r + 1, r + 8, r + 9})
          raw[size_t(p++)] = int16_t(16 * rr + 256 * col_o + 8 * (col % 2) + 4 * block + j);
  }
  return apply_interleave(raw, bits);
}

inline constexpr Perm1024 kWeightPerm4 = make_weight_perm(4);
inline constexpr Perm1024 kWeightPerm8 = make_weight_perm(8);
inline constexpr Perm1024 kWeightPerm24_4 = make_weight_perm_24(4);
inline constexpr Perm1024 kWeightPerm24_8 = make_weight_perm_24(8);

// §1.6 grouped scales: an 8x8 transpose inside each 64 columns, matching the order in which the
// kernel's threads read one scale per 8 output columns.
constexpr std::array<int16_t, 64> make_scale_perm() {
  std::array<int16_t, 64> p{};
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) p[size_t(8 * i + j)] = int16_t(i + 8 * j);
  return p;
}
// §1.6 per-channel scales: applied to the fp32->fp16 output, whose lanes hold column pairs (c, c+1).
constexpr std::array<int16_t, 32> make_scale_perm_single() {
  std::array<int16_t, 32> p{};
  const int jj[8] = {0, 1, 8, 9, 16, 17, 24, 25};
  for (int i = 0; i < 4; ++i)
    for (int t = 0; t < 8; ++t) p[size_t(8 * i + t)] = int16_t(2 * i + jj[t]);
  return p;
}
// §3.5 grouped 2:4 scales: inside each 8 columns, the 4-bit interleave (Sparse-Marlin output lanes).
constexpr std::array<int16_t, 64> make_scale_perm_24() {
  std::array<int16_t, 64> p{};
  const int jj[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  for (int i = 0; i < 8; ++i)
    for (int t = 0; t < 8; ++t) p[size_t(8 * i + t)] = int16_t(8 * i + jj[t]);
  return p;
}
inline constexpr auto kScalePerm = make_scale_perm();               // [64]
inline constexpr auto kScalePermSingle = make_scale_perm_single();  // [32]
inline constexpr auto kScalePerm24 = make_scale_perm_24();          // [64]

// §3.3 2:4 metadata reorder (CUTLASS ColumnMajorInterleaved<2> after a row shuffle and 2x2 swizzle):
// column, inside one 128-column block of B_meta [k/32, 2n], of output column n%64 when (k/16) is even;
// odd k/16 adds 2. col(n, k) = 128*(n/64) + kMetaCol[n%64] + 2*((k/16)%2), row = k/32, shift 4*((k%16)/4).
constexpr std::array<int16_t, 64> make_meta_col() {
  std::array<int16_t, 64> c{};
  for (int n = 0; n < 64; ++n) {
    const int base = 32 * ((n / 2) % 2) + 4 * (n / 8) + 2 * (n % 2);
    c[size_t(n)] = int16_t(2 * base + (n / 4) % 2);
  }
  return c;
}
inline constexpr auto kMetaCol = make_meta_col();  // [64]

template <class A>
constexpr bool starts_with(const A& a, std::initializer_list<int> v) {
  size_t i = 0;
  for (int x : v)
    if (a[i++] != x) return false;
  return true;
}
template <class A>
constexpr bool is_permutation_of_iota(const A& a) {
  std::array<bool, 1024> seen{};
  for (auto x : a) {
    if (x < 0 || size_t(x) >= a.size() || seen[size_t(x)]) return false;
    seen[size_t(x)] = true;
  }
  return true;
}

// Lane 0 reads rows 0,8 of columns 0,8 first: the "64207531" interleave of (r,c),(r+1,c),(r+8,c),... (§1.3).
static_assert(starts_with(kWeightPerm4, {0, 128, 8, 136, 16, 144, 24, 152, 256, 384, 264, 392, 272, 400, 280, 408,
                                         512, 640, 520, 648, 528, 656, 536, 664, 768, 896, 776, 904, 784, 912, 792, 920}),
              "perm[0:32] must match Marlin's lane-0 B fragments across the four 16x16 tiles (spec §1.3)");
// Lane 1 (i=1) starts at tile row 2: the next mma row pair of the same column (§1.3).
static_assert(starts_with(kWeightPerm4.data() + 32, {32, 160, 40, 168, 48, 176, 56, 184, 288, 416}),
              "perm[32:42] must be lane 1's fragment (rows 2,3,10,11) (spec §1.3)");
// 8-bit packs 4 per word with the [0,2,1,3] interleave: (0,0),(8,0),(1,0),(9,0) in word 0 (§1.7).
static_assert(starts_with(kWeightPerm8, {0, 128, 16, 144, 8, 136, 24, 152}),
              "8-bit perm must put (0,0),(8,0),(1,0),(9,0) in word 0 and the column-8 codes in word 1 (spec §1.7)");
// Sparse-Marlin lanes cover 4 adjacent columns with +j (spec §3.4).
static_assert(starts_with(kWeightPerm24_4, {0, 128, 4, 132, 16, 144, 20, 148, 1, 129, 5, 133, 17, 145, 21, 149, 2,
                                            130, 6, 134, 18, 146, 22, 150, 3, 131, 7, 135, 19, 147, 23, 151}),
              "perm_2_4[0:32] must match Sparse-Marlin's lane-0 fragments (spec §3.4)");
static_assert(is_permutation_of_iota(kWeightPerm4) && is_permutation_of_iota(kWeightPerm8) &&
                  is_permutation_of_iota(kWeightPerm24_4) && is_permutation_of_iota(kWeightPerm24_8),
              "each weight perm must move every code of a 16x64 block exactly once");
// Grouped scales: 8x8 transpose so thread t reads columns t, t+8, ... (spec §1.6).
static_assert(starts_with(kScalePerm, {0, 8, 16, 24, 32, 40, 48, 56, 1, 9, 17, 25}) && kScalePerm[63] == 63,
              "scale_perm must be the 8x8 transpose of each 64-column chunk (spec §1.6)");
// Per-channel scales follow the output fragment's column pairs (spec §1.6).
static_assert(starts_with(kScalePermSingle, {0, 1, 8, 9, 16, 17, 24, 25, 2, 3, 10, 11, 18, 19, 26, 27, 4, 5, 12, 13,
                                             20, 21, 28, 29, 6, 7, 14, 15, 22, 23, 30, 31}),
              "scale_perm_single must pair columns (c, c+1) per output lane (spec §1.6)");
// 2:4 grouped scales: the 4-bit interleave per 8 columns (spec §3.5).
static_assert(starts_with(kScalePerm24, {0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13}),
              "scale_perm_2_4 must apply [0,4,1,5,2,6,3,7] per 8 columns (spec §3.5)");
static_assert(is_permutation_of_iota(kScalePerm) && is_permutation_of_iota(kScalePermSingle) &&
                  is_permutation_of_iota(kScalePerm24),
              "scale tables must be permutations");
constexpr bool meta_cols_tile_block() {
  std::array<bool, 128> seen{};
  for (int n = 0; n < 64; ++n)
    for (int odd = 0; odd < 2; ++odd) {
      const int c = kMetaCol[size_t(n)] + 2 * odd;
      if (c < 0 || c >= 128 || seen[size_t(c)]) return false;
      seen[size_t(c)] = true;
    }
  return true;
}
// 64 columns x 2 k-halves fill a 128-column block of B_meta exactly once (spec §3.3: [k/32, 2n]).
static_assert(meta_cols_tile_block(), "meta reorder must map (n%64, (k/16)%2) onto the 128 columns one-to-one");
// Meta reorder worked examples (0,1)->4, (0,2)->64, (0,3)->68, (0,4)->1, (0,8)->8 (spec §3.3).
static_assert(kMetaCol[0] == 0 && kMetaCol[1] == 4 && kMetaCol[2] == 64 && kMetaCol[3] == 68 && kMetaCol[4] == 1 &&
                  kMetaCol[8] == 8,
              "meta column of n%64 must follow CUTLASS's interleaved-column-major reorder (spec §3.3)");

}  // namespace marlinc::layout
