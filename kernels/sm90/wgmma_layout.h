// Index maps of the Hopper (wgmma) Marlin kernel, shared by the kernel (marlin_wgmma.cuh) and its CPU
// model (tests/kernels/test_wgmma_model.cpp), which replays one block's data movement and products on
// a model of wgmma's operand layouts written from the PTX ISA and checks the result against the float64
// reference. Plain constexpr arithmetic: compiles as C++ and CUDA alike.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define MARLINC_HD __host__ __device__
#else
#define MARLINC_HD
#endif

namespace marlinc::kernels::wgmma_layout {

constexpr int kThreads = 256;  // two warpgroups
constexpr int kFeat = 256;     // output columns per tile: four packed 64-wide tiles
constexpr int kTK = 64;        // k per pipeline stage (one 128-byte activation row)
constexpr int kKB = kTK / 16;  // k16 steps per stage
constexpr int kRowBytes = kTK * 2;
constexpr int kWeightRowBytes = kFeat * 8;  // one k16 row of the stage's packed tiles (4 x 512 B)
constexpr int kScaleRowBytes = kFeat * 2;   // one group row of the stage's scales
constexpr int kSwizzleAtom = 1024;          // 8 rows x 128 B: the 128B swizzle repeats every 1024 B
static_assert(kRowBytes == 128, "an activation row of a stage is exactly one 128B-swizzle row");

// Byte offset of 16-byte chunk c (8 k values) of activation row r in a stage: the 128B swizzle XORs
// the chunk index with the row's position inside its 8-row atom (what wgmma's descriptor mode 1 reads).
MARLINC_HD constexpr int act_chunk_byte(int r, int c) { return r * kRowBytes + ((c ^ (r & 7)) << 4); }

// The stage's weight copy: int4 i of a stage goes to k16 row i / 128, int4 i % 128 of the block's four
// packed tiles in that row (contiguous in B: tiles 4 * slice .. 4 * slice + 3).
MARLINC_HD constexpr int weight_int4_row(int i) { return i / (kFeat / 2); }
MARLINC_HD constexpr int weight_int4_col(int i) { return i % (kFeat / 2); }

// Warp w of the block expands packed tile warp_tile(w) (0..3), 16-column subblocks warp_sub0(w) and
// warp_sub0(w) + 1: warpgroup g owns tiles 2g and 2g + 1, and its four warps are the four 16-row slices
// of each 64-row wgmma.
MARLINC_HD constexpr int warp_tile(int warp) { return 2 * (warp >> 2) + (warp & 1); }
MARLINC_HD constexpr int warp_sub0(int warp) { return 2 * ((warp & 3) >> 1); }
// Byte offset, inside one k16 row of the stage's weights, of the lane's two packed words (words sub0 and
// sub0 + 1 of the lane's 16 bytes in its tile, formats.md §1.4).
MARLINC_HD constexpr int weight_byte(int tile, int lane, int sub0) { return (tile * 32 + lane) * 16 + sub0 * 4; }
// Byte offset, inside one group row of the stage's scales, of the lane's two scale words: the lane's
// 16 bytes in its tile hold the scales of columns 16j + lane/4 (low half of word j) and 16j + lane/4 + 8
// (high half), the grouped permutation of §1.6.
MARLINC_HD constexpr int scale_byte(int tile, int lane, int sub0) { return (tile * 8 + (lane >> 2)) * 16 + sub0 * 4; }
// Group row within a stage of k16 step kk (group sizes 32, 64, 128; a stage starts on a 64 boundary).
MARLINC_HD constexpr int scale_row(int kk, int group_shift) { return (kk * 16) >> group_shift; }
// A group spans at least two k16 steps, so step 2j + 1 scales with step 2j's words (the producer-fed
// kernel loads them once per pair).
constexpr bool pairs_share_scale_rows() {
  for (int shift = 5; shift <= 7; ++shift)
    for (int j = 0; 2 * j + 1 < kKB; ++j)
      if (scale_row(2 * j + 1, shift) != scale_row(2 * j, shift)) return false;
  return true;
}
static_assert(pairs_share_scale_rows(), "k16 steps 2j and 2j + 1 share a group row for groups of 32 and up");

// wgmma A register r takes dequant8's pair a_from_pair(r): the pairs are (column c, k 2t..2t+1),
// (c, 2t+8..), (c + 8, 2t..), (c + 8, 2t+8..) and the A fragment wants (row c, 2t..), (c + 8, 2t..),
// (c, 2t+8..), (c + 8, 2t+8..).
MARLINC_HD constexpr int a_from_pair(int r) { return r == 1 ? 2 : r == 2 ? 1 : r; }  // {0, 2, 1, 3}

// Shared-memory byte address that wgmma's descriptor starts at for k16 step kk of a stage whose
// activations begin at `stage` (1024-aligned): 32 bytes per step inside the swizzled row.
MARLINC_HD constexpr unsigned desc_start(unsigned stage, int kk) { return stage + unsigned(kk) * 32u; }

// The descriptor of step kk from step 0's (sw128_desc below): the start address field (bits 0-13,
// address >> 4) grows by 2 per step. The stage is atom-aligned, so its field ends in 6 zero bits and the
// sum never carries out of the field; the kernel thus builds one descriptor per stage, not per step.
MARLINC_HD constexpr uint64_t desc_step(uint64_t desc0, int kk) { return desc0 + uint64_t(kk) * (32u >> 4); }
static_assert(kKB * 32 <= kSwizzleAtom / 8, "a stage's steps stay inside its first 128-byte row");

// wgmma shared-memory matrix descriptor of a K-major operand in the 128B swizzle mode (PTX ISA, "matrix
// descriptor"): bits 0-13 start address >> 4, 16-29 leading byte offset >> 4 (unused by this mode: 1),
// 32-45 stride byte offset >> 4 (8-row groups 1024 B apart), 49-51 base offset (0: atoms are aligned),
// 62-63 swizzle mode (1 = 128B).
MARLINC_HD constexpr uint64_t sw128_desc(unsigned saddr) {
  constexpr uint64_t kLbo = 1, kSbo = kSwizzleAtom >> 4, kSwizzle128 = 1;
  return uint64_t((saddr & 0x3FFFFu) >> 4) | (kLbo << 16) | (kSbo << 32) | (kSwizzle128 << 62);
}

// Accumulator d[4i + 2h + e] of 64-row wgmma j: output column (within the block's 256) and token row
// (within the tile).
MARLINC_HD constexpr int acc_col(int tile, int sub0, int j, int lane, int h) {
  return 64 * tile + 16 * (sub0 + j) + (lane >> 2) + 8 * h;
}
MARLINC_HD constexpr int acc_token(int i, int lane, int e) { return 8 * i + 2 * (lane & 3) + e; }

// Epilogue pairing: lanes l and l ^ 4 hold neighbouring columns (c, c + 1) of tokens (t, t + 1). The
// lane with even lane/4 writes token t, columns (c, c + 1) = (own e = 0, partner's e = 0); the other
// writes token t + 1, columns (c - 1, c) = (partner's e = 1, own e = 1). Each thus sends the value the
// partner needs: its e = 1 value (even lane) or its e = 0 value (odd lane).
MARLINC_HD constexpr bool pair_even(int lane) { return ((lane >> 2) & 1) == 0; }
MARLINC_HD constexpr int pair_send_e(int lane) { return pair_even(lane) ? 1 : 0; }
MARLINC_HD constexpr int pair_token(int i, int lane) { return acc_token(i, lane, pair_even(lane) ? 0 : 1); }
MARLINC_HD constexpr int pair_col(int col, int lane) { return pair_even(lane) ? col : col - 1; }

// Staged epilogue of the producer-fed kernel: a warp's C values pass through a private shared-memory
// buffer of kEpiTokens token rows x the warp's kEpiCols columns, so that each lane then stores 16
// contiguous bytes and every 32-byte sector of C is written whole by one instruction. The direct pair
// stores above write 4 bytes per lane, half sectors on 8 rows per instruction; with them the C write of
// a 128-token tile took ~9 us after the last product (docs/PERF.md, fourteenth session).
constexpr int kEpiCols = 32;    // a warp's columns: its two 16-column subblocks, contiguous in C
constexpr int kEpiTokens = 32;  // token rows per round
constexpr int kEpiWarpBytes = kEpiTokens * kEpiCols * 2;
constexpr int kEpiChunks = kEpiCols * 2 / 16;  // 16-byte chunks per token row
// Warp-relative column (0..31) of accumulator (j, lane, h): acc_col less the warp's first column.
MARLINC_HD constexpr int epi_col(int j, int lane, int h) { return acc_col(0, 0, j, lane, h); }
// Byte of (token lt, warp column col) in a buffer whose token rows are `chunks` 16-byte chunks (4 here, 2 for the
// 128-column tiles below): 8 / chunks tokens per 128-byte row, the chunks XORed with the row index, so that a
// pair-store instruction (8 tokens, one chunk) and each 8-lane phase of a 16-byte read (one row) touch 32 distinct
// banks (checked in tests/kernels/test_wgmma_model.cpp).
MARLINC_HD constexpr int staged_byte(int chunks, int lt, int col) {
  const int sh = chunks == 4 ? 1 : 2;  // log2 of the tokens per 128-byte row
  return (lt >> sh) * 128 + ((((lt & ((1 << sh) - 1)) * chunks + col / 8) ^ ((lt >> sh) & 7)) << 4) + (col % 8) * 2;
}
MARLINC_HD constexpr int epi_byte(int lt, int col) { return staged_byte(kEpiChunks, lt, col); }
// The read phase: instruction s, lane l reads chunk epi_read_chunk of token epi_read_token.
MARLINC_HD constexpr int epi_read_token(int s, int lane) { return (32 * s + lane) / kEpiChunks; }
MARLINC_HD constexpr int epi_read_chunk(int s, int lane) { return (32 * s + lane) % kEpiChunks; }
constexpr int kEpiReads = kEpiTokens * kEpiChunks / 32;  // 16-byte reads per lane per round
static_assert(2 * kEpiChunks * 16 == 128, "two token rows fill one 128-byte bank row");
static_assert(kEpiTokens % 8 == 0 && kEpiTokens * kEpiChunks % 32 == 0, "whole pair-store and read instructions");

// ---- 128-column tiles: 128 or 256 tokens x two packed 64-wide tiles per block, one m64nNT wgmma per warpgroup
// and k16 step (each expanded weight fragment feeds every token of the tile). The producer-fed kernel runs them
// (marlin_wgmma_ws.cuh, FEAT = 128); checked on the CPU model of wgmma (tests/kernels/test_wgmma_model.cpp) and
// the [gpu][wgmma] tests. The maps above that take a tile and a subblock (weight_byte, scale_byte, acc_col,
// act_chunk_byte, the descriptors) hold for them unchanged.
constexpr int kFeat128 = 128;
// 192-column tiles (128 tokens, the producer-fed kernel only): three warpgroups, each one packed tile with the maps
// above (warp_tile128 = warp / 4 up to 2), so that layers with n % 192 == 0 get whole slices where 128 x 256 tiles are
// too few and 128 x 128 ones too many (kernels/marlin_dispatch.h).
constexpr int kFeat192 = 192;
constexpr int kWeightRowBytes128 = kFeat128 * 8;  // one k16 row of the stage's two packed tiles (2 x 512 B)
constexpr int kScaleRowBytes128 = kFeat128 * 2;
// int4 i of such a stage's weight copy: k16 row i / 64, int4 i % 64 of the row's two packed tiles.
MARLINC_HD constexpr int weight_int4_row128(int i) { return i / (kFeat128 / 2); }
MARLINC_HD constexpr int weight_int4_col128(int i) { return i % (kFeat128 / 2); }
// Warp w expands packed tile w / 4 (warpgroup g owns tile g) and its 16-column subblock w % 4 (one packed word
// per k16 step): the four warps of a warpgroup are the four 16-row slices of its one 64-row wgmma.
MARLINC_HD constexpr int warp_tile128(int warp) { return warp >> 2; }
MARLINC_HD constexpr int warp_sub128(int warp) { return warp & 3; }
// Their staged epilogue: a warp's 16 columns (epi_col with j = 0) are 32 bytes of a token row, so four tokens share
// a 128-byte row of the same kEpiWarpBytes buffer, kEpiTokens128 tokens a round, the chunks XORed with the row index
// as in epi_byte (a pair-store instruction and each 8-lane phase of a read touch 32 distinct banks; checked in
// tests/kernels/test_wgmma_model.cpp).
constexpr int kEpiCols128 = 16;
constexpr int kEpiChunks128 = kEpiCols128 * 2 / 16;                // 16-byte chunks per token row
constexpr int kEpiTokens128 = kEpiWarpBytes / (kEpiCols128 * 2);  // token rows per round
MARLINC_HD constexpr int epi_byte128(int lt, int col) { return staged_byte(kEpiChunks128, lt, col); }
MARLINC_HD constexpr int epi_read_token128(int s, int lane) { return (32 * s + lane) / kEpiChunks128; }
MARLINC_HD constexpr int epi_read_chunk128(int s, int lane) { return (32 * s + lane) % kEpiChunks128; }
constexpr int kEpiReads128 = kEpiTokens128 * kEpiChunks128 / 32;  // 16-byte reads per lane per round
static_assert(4 * kEpiChunks128 * 16 == 128, "four token rows fill one 128-byte bank row");
static_assert(kEpiChunks == 4 && kEpiChunks128 == 2, "the two row widths staged_byte maps");
static_assert(kEpiTokens128 % 8 == 0 && kEpiTokens128 * kEpiChunks128 % 32 == 0, "whole pair-store and read instructions");

// Position of column c's per-channel scale in the permuted scale row (§1.6: the single permutation,
// inside each 32-column chunk).
MARLINC_HD constexpr int channel_scale_pos(int c) {
  return 32 * (c / 32) + 8 * ((c % 32 % 8) / 2) + 2 * (c % 32 / 8) + (c % 32 % 2);
}

}  // namespace marlinc::kernels::wgmma_layout
