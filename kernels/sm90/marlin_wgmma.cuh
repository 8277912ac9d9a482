// The Hopper (sm_90a) Marlin kernel for larger m: the same packed bytes and the same stripe partition
// as marlin_kernel.cuh, but the products run on warpgroup MMA (wgmma), which the H100's tensor cores
// need to approach their peak (mma.sync reaches about 65-75% of it). Checked by the CPU model
// (tests/kernels/test_wgmma_model.cpp), the [gpu][wgmma] tests and the sanitizers; Auto takes it on a
// 9.0 device for m >= 17 where the H100 timed it faster (marlin.cu, auto_path; docs/PERF.md).
//
// The GEMM is computed transposed, C^T[n, m] = W^T[n, k] · A^T[k, m], so that the dequantized weights
// are wgmma's A operand (registers: the only place the lop3 expansion can write) and the activations,
// stored row-major [m, k], are its K-major B operand in shared memory. A Marlin word expands to exactly
// one wgmma A fragment: the mma.sync B fragment pairs (f0, f1) / (f2, f3) of columns c and c + 8 become
// the A registers {f0, f2, f1, f3} of rows c and c + 8 (formats.md §1.3-§1.5).
//
// Block: two warpgroups over a 256-column x NT-row tile (NT = 8, 16, 32, 64 or 128 tokens; 48 in the producer-fed
// form only); warpgroup g owns packed 64-wide tiles 2g and 2g + 1 (two 64-row wgmmas per k16 step), warp w of it
// expands tile 2g + (w & 1), 16-column subblocks 2 (w >> 1) and 2 (w >> 1) + 1. Activations land through cp.async in
// 128-byte rows with the 128B swizzle wgmma's descriptor names; weights and scales beside them. Stripes,
// row-chunk groups, fp32 partial tiles in the workspace and the in-order finisher are those of the
// mma.sync kernel (KernelArgs), so the host partition code serves both.
//
// The producer-fed form (marlin_wgmma_ws.cuh) also runs 128-column tiles of 128 or 256 tokens (FEAT = 128):
// warpgroup g owns packed tile g and issues one 64-row wgmma over all NT tokens per k16 step, warp w of it
// expands subblock w & 3 (one word per step). Auto takes 128 x 128 on narrow layers at m > 64
// (marlin_dispatch.h, wgmma_prefer_128x128); 256 x 128 is forced only (MarlinGemm::wgmma_rows = 256). 128 x 192 tiles
// (FEAT = 192) have the same form with three warpgroups (marlin_dispatch.h, wgmma_prefer_192).
#pragma once
#include <cstdint>

#include "kernels/marlin_device.cuh"
#include "kernels/marlin_launch.h"
#include "kernels/sm90/wgmma_layout.h"
#include "kernels/sm90/wgmma_ops.cuh"
#include "kernels/sm90/wgmma_sync.cuh"

namespace marlinc::kernels::detail {

namespace wl = wgmma_layout;

template <int NT, int FEAT = wgmma_tile_n(NT)>
struct WgShape {
  // FEAT = 128 (NT = 128 to 256 tokens in steps of 16): the 128-column tiles (wgmma_layout.h, kFeat128): warpgroup g
  // expands packed tile g, one word per warp and k16 step, into one m64nNT wgmma; its accumulators are acc[2][NT / 4],
  // acc[j] tokens NT / 2 j .. NT / 2 (j + 1) - 1 (wgmma_ops.cuh, WgmmaSplit). FEAT = 192 (NT = 128, the producer form
  // only): the same with three warpgroups (wgmma_layout.h, kFeat192). FEAT = 256: acc[j] is packed tile 2 g + j's
  // 64-row wgmma over all NT tokens.
  static constexpr bool kOneTile = FEAT != wl::kFeat;  // one packed tile per warpgroup
  static constexpr int kThreads = (FEAT == wl::kFeat192 ? 3 : 2) * 128;  // the warpgroups that hold the tile
  static constexpr int kFeat = FEAT;
  static constexpr int kWords = kOneTile ? 1 : 2;  // packed words a warp expands per k16 step
  static constexpr int kTK = wl::kTK;
  static constexpr int kKB = wl::kKB;
  static constexpr int kWeightRowBytes = kFeat * 8;  // one k16 row of the stage's packed tiles
  static constexpr int kScaleRowBytes = kFeat * 2;   // one group row of the stage's scales
  // Stages in the ring; kStages - 2 tiles are in flight while one is computed and the one before it
  // may still be read by the last wgmma (see the main loop).
  static constexpr int kStages = NT == 128 ? 5 : 6;
  static constexpr int kABytes = NT * wl::kRowBytes;     // [NT, 64] 16-bit activations, swizzled rows
  static constexpr int kBBytes = kKB * kWeightRowBytes;  // [4 k16 rows][kFeat / 64 packed tiles x 512 B]
  static constexpr int kSBytes = 2 * kScaleRowBytes;     // up to two group rows (group 32)
  static constexpr int kAlign = wl::kSwizzleAtom;        // swizzle atoms must be address-aligned
  static constexpr int kStage = (kABytes + kBBytes + kSBytes + kAlign - 1) / kAlign * kAlign;
  static constexpr int kSmemBytes = kStages * kStage + kAlign;  // + slack to align the dynamic base
  static constexpr int kAcc = kOneTile ? NT / 4 : NT / 2;  // fp32 accumulators per thread in acc[j]
  static constexpr int kPart = kFeat * NT;          // floats in one deposited partial tile
  static constexpr bool kHoistCopies = NT <= 64;    // copy addresses once per slice (see the loaders)

  static_assert(FEAT == wl::kFeat    ? (NT == 8 || NT == 16 || NT == 32 || NT == 48 || NT == 64 || NT == 128)
                : FEAT == wl::kFeat192 ? NT == 128
                                       : FEAT == wl::kFeat128 && NT >= 128 && NT <= 256 && NT % 16 == 0,
                "tiles with a wgmma of NT tokens in wgmma_ops.cuh");
  static_assert(kStage % kAlign == 0, "every stage's activation tile starts on a swizzle atom");
  static_assert(kTK == kWgmmaTileK, "the host partitions with these tiles");
  static_assert(FEAT != wl::kFeat128 || kWeightRowBytes == wl::kWeightRowBytes128, "wgmma_layout.h's rows");
  static_assert(FEAT != wl::kFeat || kWeightRowBytes == wl::kWeightRowBytes, "wgmma_layout.h's rows");
  static_assert(kThreads / 128 * 64 * (kOneTile ? 1 : 2) == kFeat, "warpgroups x packed tiles cover the columns");
  static_assert(2 * kAcc * kThreads == kPart, "a partial tile is every thread's acc[2][kAcc]");
  static_assert(kAcc % 4 == 0, "partial tiles are deposited as float4");
  static_assert(NT % 8 == 0, "tokens come in 8-row swizzle atoms");
  static_assert(size_t(kPart) <= kWgmmaPartFloats, "a block's partial tile fits its workspace slot");
};

// 4 bytes to, and 16 bytes from, a shared-window address (the staged epilogue, the pair form's partner half).
__device__ __forceinline__ void sts32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ int4 lds128(uint32_t addr) {
  int4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// One k16 step's packed words (two 16-column subblocks of the warp's tile) and scale words, read from a
// stage in shared memory; both kernels lay a stage out as [activations | weights | scales].
struct WgWords { int2 q, sv; };

template <int NT, bool GROUPED>
__device__ __forceinline__ WgWords wg_load_words(const unsigned char* stage, int kk, int w_byte, int s_byte,
                                                 int group_shift) {
  using S = WgShape<NT>;
  WgWords w{*reinterpret_cast<const int2*>(stage + S::kABytes + kk * wl::kWeightRowBytes + w_byte), make_int2(0, 0)};
  if constexpr (GROUPED)
    w.sv = *reinterpret_cast<const int2*>(stage + S::kABytes + S::kBBytes +
                                          wl::scale_row(kk, group_shift) * wl::kScaleRowBytes + s_byte);
  return w;
}

// One k16 step's expansion: the W words (q.x, then q.y) into W A fragments (scaled when grouped).
template <int DT, bool GROUPED, int W>
__device__ __forceinline__ void wg_expand(const WgWords& w, uint32_t (&a)[W][4]) {
#pragma unroll
  for (int j = 0; j < W; ++j) {
    uint32_t f[4];
    dequant8<DT>(uint32_t(j == 0 ? w.q.x : w.q.y), f);
    if constexpr (GROUPED) {
      scale2<DT, false>(f[0], f[1], uint32_t(j == 0 ? w.sv.x : w.sv.y));
      scale2<DT, true>(f[2], f[3], uint32_t(j == 0 ? w.sv.x : w.sv.y));
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) a[j][r] = f[wl::a_from_pair(r)];
  }
}

// One k16 step's wgmmas on the activations that descriptor `desc` names, from fragments `a`, committed as one
// group: two 64-row ones, or the 128-column tiles' one over both accumulator halves.
template <int DT, int NT, int FEAT = wgmma_tile_n(NT)>
__device__ __forceinline__ void wg_mma_desc(float (&acc)[2][WgShape<NT, FEAT>::kAcc], uint64_t desc,
                                            uint32_t (&a)[WgShape<NT, FEAT>::kWords][4]) {
#pragma unroll
  for (int j = 0; j < WgShape<NT, FEAT>::kWords; ++j) fence_regs(a[j]);
  wgmma_fence();
  if constexpr (WgShape<NT, FEAT>::kOneTile) {
    WgmmaSplit<DT, NT>::run(acc[0], acc[1], a[0], desc);
  } else {
    Wgmma<DT, NT>::run(acc[0], a[0], desc);
    Wgmma<DT, NT>::run(acc[1], a[1], desc);
  }
  wgmma_commit();
}

// The same on step kk of the stage at shared-window address `stage`.
template <int DT, int NT>
__device__ __forceinline__ void wg_mma(float (&acc)[2][NT / 2], uint32_t stage, int kk, uint32_t (&a)[2][4]) {
  wg_mma_desc<DT, NT>(acc, wl::sw128_desc(wl::desc_start(stage, kk)), a);
}

// One k16 step's issue: expansion and wgmmas. The caller loads the next step's words while these run,
// then waits until at most this step is in flight, so the A registers of two steps back may be
// overwritten next.
template <int DT, bool GROUPED, int NT>
__device__ __forceinline__ void wg_issue(float (&acc)[2][NT / 2], uint32_t stage, int kk, const WgWords& w) {
  uint32_t a[2][4];
  wg_expand<DT, GROUPED>(w, a);
  wg_mma<DT, NT>(acc, stage, kk, a);
}

// A lane's scaled sums (v0, v1) of output column c, tokens tok and tok + 1 of a wgmma accumulator row, into C as
// 4-byte pairs of adjacent columns: the lane swaps one value with its neighbour column's lane (lane ^ 4).
// Every lane of the warp calls it (the shuffle); only tokens below m are stored.
template <int DT>
__device__ __forceinline__ void wg_store_pair(const KernelArgs& p, float v0, float v1, int c, int tok, int lane) {
  const float other = __shfl_xor_sync(0xffffffffu, wl::pair_send_e(lane) ? v1 : v0, 4);
  if (tok < p.m)
    *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(p.C) + size_t(tok) * p.n + wl::pair_col(c, lane)) =
        wl::pair_even(lane) ? pack2<DT>(v0, other) : pack2<DT>(other, v1);
}

// The warp's share of a finished tile into C: wgmma D layout (per warp 16 rows): acc[j][4i + 2h + e] is column
// wl::acc_col(.., j, lane, h), token wl::acc_token(i, lane, e). Lanes l and l ^ 4 swap one value so that each
// writes a 4-byte pair of one token row (wl::pair_*), with per-channel scales applied first. Warp-synchronous
// only: any subset of the tile's warps may call it. STAGED, epi: as for wg_finish_slice below.
template <int DT, bool GROUPED, int NT, bool STAGED, int FEAT = wgmma_tile_n(NT)>
__device__ __forceinline__ void wg_write_c(const KernelArgs& p, const float (&acc)[2][WgShape<NT, FEAT>::kAcc],
                                           int slice, int row0, int warp, int lane, uint32_t epi) {
  using S = WgShape<NT, FEAT>;
  const int tile = wl::warp_tile(warp), sub0 = wl::warp_sub0(warp);
  uint16_t* C = static_cast<uint16_t*>(p.C);
  const uint16_t* s16 = static_cast<const uint16_t*>(p.s);
  const bool even = wl::pair_even(lane);
  if constexpr (STAGED) {
    // Per round, kTokens tokens of the warp's kJ 16-column subblocks into its buffer, then out as 16-byte rows.
    // 256-column tiles: two subblocks, acc[j] subblock j over all NT tokens, buffer map epi_byte. 128-column tiles
    // (only staged): one subblock (warp_sub128 of packed tile warp_tile128), acc[j] tokens NT / 2 j .., epi_byte128.
    // The fit tiles (NT / 2 not a multiple of kTokens) end each accumulator array with a shorter round, the 48-row
    // tile (NT not a multiple of kTokens) its one pass over all tokens.
    constexpr bool k128 = S::kOneTile;
    constexpr int kJ = k128 ? 1 : 2;
    constexpr int kTokens = k128 ? wl::kEpiTokens128 : wl::kEpiTokens, kReads = k128 ? wl::kEpiReads128 : wl::kEpiReads;
    constexpr int kI = kTokens / 8;                    // 8-token accumulator rows per (whole) round
    constexpr int kRows = S::kAcc / 4;                 // 8-token accumulator rows in each acc[j]
    constexpr int kHalfRounds = (kRows + kI - 1) / kI;  // rounds per accumulator array (k128), or of all tokens
    constexpr int kRounds = k128 ? 2 * kHalfRounds : kHalfRounds;
    static_assert(k128 || kReads * (kRows % kI) % kI == 0, "a short round on 256 columns reads whole rows");
    auto byte = [](int lt, int col) { return k128 ? wl::epi_byte128(lt, col) : wl::epi_byte(lt, col); };
    const int wc0 = slice * S::kFeat + (k128 ? wl::acc_col(wl::warp_tile128(warp), wl::warp_sub128(warp), 0, 0, 0)
                                             : wl::acc_col(tile, sub0, 0, 0, 0));  // the warp's first column
    float sc[kJ][2];
#pragma unroll
    for (int j = 0; j < kJ; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        sc[j][h] = GROUPED ? 1.f : to_float<DT>(s16[wl::channel_scale_pos(wc0 + wl::epi_col(j, lane, h))]);
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      const int i0 = (r % kHalfRounds) * kI;                  // the round's first accumulator row
      const int ni = kRows - i0 < kI ? kRows - i0 : kI;      // and its rows (compile-time after unrolling)
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        const float* a = acc[k128 ? r / kHalfRounds : j];
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int ii = 0; ii < ni; ++ii) {
            const int i = i0 + ii;
            const float v0 = a[4 * i + 2 * h] * sc[j][h], v1 = a[4 * i + 2 * h + 1] * sc[j][h];
            const float other = __shfl_xor_sync(0xffffffffu, wl::pair_send_e(lane) ? v1 : v0, 4);
            sts32(epi + byte(wl::pair_token(ii, lane), wl::pair_col(wl::epi_col(j, lane, h), lane)),
                  even ? pack2<DT>(v0, other) : pack2<DT>(other, v1));
          }
      }
      __syncwarp();  // the round's pairs are in the buffer before any lane reads a row
      // A short round of an odd number of accumulator rows (the fit tiles of 144, 176, 208 and 240 rows) ends with a
      // read of half the lanes; the 48-row tile's (two rows of four) reads whole rows.
      const int reads = kReads * ni / kI, lanes = (kReads * ni % kI) * 32 / kI;
#pragma unroll
      for (int s = 0; s < reads + (lanes > 0 ? 1 : 0); ++s) {
        const int lt = k128 ? wl::epi_read_token128(s, lane) : wl::epi_read_token(s, lane);
        const int x = k128 ? wl::epi_read_chunk128(s, lane) : wl::epi_read_chunk(s, lane);
        if (s < reads || lane < lanes) {
          const int4 v = lds128(epi + byte(lt, 8 * x));
          const int tok = row0 + (k128 ? (r / kHalfRounds) * (NT / 2) : 0) + i0 * 8 + lt;
          if (tok < p.m) *reinterpret_cast<int4*>(C + size_t(tok) * p.n + wc0 + 8 * x) = v;
        }
      }
      __syncwarp();  // every lane has read the round before the next one overwrites it
    }
  } else {
    static_assert(!S::kOneTile, "the 128- and 192-column tiles stage their C");
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = slice * S::kFeat + wl::acc_col(tile, sub0, j, lane, h);
        const float sc = GROUPED ? 1.f : to_float<DT>(s16[wl::channel_scale_pos(c)]);
#pragma unroll
        for (int i = 0; i < NT / 8; ++i)
          wg_store_pair<DT>(p, acc[j][4 * i + 2 * h] * sc, acc[j][4 * i + 2 * h + 1] * sc, c,
                            row0 + wl::pair_token(i, lane), lane);
      }
  }
}

// Whether this block finishes `slice` of its row chunk from a deposit that arrives early (marlin_partition.h,
// slice_early_deposit): the slice is shared with exactly the next block, which deposits it first thing in its
// stripe, and this block reaches it at the end of its own. The warp-specialized form then fetches the deposit
// through its ring while the slice's last tiles are computed (marlin_wgmma_ws.cuh) instead of reading it after.
template <int NT>
__device__ __forceinline__ bool wg_early_finisher(const KernelArgs& p, int slice, int base_b, int k_tiles) {
  const int first_b = slice_first_block(base_b, slice, k_tiles, p.iters);
  return int(blockIdx.x) == first_b && slice_last_block(base_b, slice, k_tiles, p.iters) == first_b + 1 &&
         slice_early_deposit(p.iters, k_tiles, NT);
}

// acc[0..3] += the four fp32 values of a 16-byte load (a partner's or a deposit's sums).
__device__ __forceinline__ void add_f4(float* acc, const int4& v) {
  acc[0] += __int_as_float(v.x);
  acc[1] += __int_as_float(v.y);
  acc[2] += __int_as_float(v.z);
  acc[3] += __int_as_float(v.w);
}

// The end of a slice, for the 256 threads that hold its accumulators (team_tid 0..255; team barrier
// kBar/kCount, see team_sync): the cross-block reduction as in marlin_kernel (deposits in thread order,
// coalesced float4, one in-order sum by the slice's first block), then the finisher (or a block that owns
// the whole slice) writes C.
// STAGED: C passes through the warp's kEpiWarpBytes buffer at shared-window address `epi` (wgmma_layout.h,
// epi_byte); otherwise each lane stores 4-byte pairs straight from its accumulators. `added`: the finisher
// has added the deposit already (wg_early_finisher), so only C is left.
template <int DT, bool GROUPED, int NT, int kBar, int kCount, bool STAGED = false, int FEAT = wgmma_tile_n(NT)>
__device__ __forceinline__ void wg_finish_slice(const KernelArgs& p, float (&acc)[2][WgShape<NT, FEAT>::kAcc], int slice, int row0,
                                                int base_b, int k_tiles, int warp, int lane, int team_tid,
                                                uint32_t epi = 0, bool added = false) {
  using S = WgShape<NT, FEAT>;
  const int first_b = slice_first_block(base_b, slice, k_tiles, p.iters);
  const int last_b = slice_last_block(base_b, slice, k_tiles, p.iters);
  const int count = last_b - first_b + 1;
  const bool finisher = int(blockIdx.x) == first_b, leader = team_tid == 0;
  constexpr int kQ = S::kAcc / 4;  // float4 per thread per wgmma accumulator
  tl_mark(p, kTlInfo, leader, unsigned(count) * 2u + (finisher ? 1u : 0u));
  if (count > 1 && added) {
    tl_mark(p, kTlReduced, leader);
  } else if (count > 1) {
    int* counter = p.locks + first_b;
    if (!finisher) {
      float4* mine = reinterpret_cast<float4*>(p.red + size_t(blockIdx.x) * S::kPart);
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int q = 0; q < kQ; ++q)
          __stcg(mine + (j * kQ + q) * S::kThreads + team_tid,
                 make_float4(acc[j][4 * q], acc[j][4 * q + 1], acc[j][4 * q + 2], acc[j][4 * q + 3]));
      __threadfence();  // each thread publishes its own stores before the counter moves
      deposit_done<kBar, kCount>(counter, leader);
    } else {
      wait_deposits<kBar, kCount>(counter, count - 1, leader);
      tl_mark(p, kTlReduced, leader);
      for (int b = first_b + 1; b <= last_b; ++b) {
        const int4* other = reinterpret_cast<const int4*>(p.red + size_t(b) * S::kPart);
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int q = 0; q < kQ; ++q) add_f4(&acc[j][4 * q], __ldcg(other + (j * kQ + q) * S::kThreads + team_tid));
      }
      if (leader) *counter = 0;  // re-arm for the next launch
    }
  }

  if (count == 1 || finisher) wg_write_c<DT, GROUPED, NT, STAGED, FEAT>(p, acc, slice, row0, warp, lane, epi);
}

// The end of a slice split in p.split parts, one block each (marlin_partition.h, wgmma_split_parts), for the
// kCount threads that hold the tile's accumulators (team barrier kBar, as wg_finish_slice). Every block deposits the
// live 8-token row groups of its partial tile (wg_finish_slice's [j][q][thread] float4 rows); each block that owns a
// share (spread_share_begin) waits for all the deposits, adds its groups' rows in block order and writes them to C.
// That is the in-order finisher's order, so where stripes cut a slice into the same parts the outputs are the same
// bit for bit. The slice's counter counts the deposits, then the owners past their wait; the last of those re-arms it.
// Row r = j kQ + q holds group q of both accumulator arrays on 256-column tiles (acc[j]: packed tile 2g + j over all
// NT tokens), group r on the 128- and 192-column ones (acc[j]: tokens NT / 2 j .. NT / 2 (j + 1) - 1).
template <int DT, bool GROUPED, int NT, int kBar, int kCount, int FEAT = wgmma_tile_n(NT)>
__device__ __forceinline__ void wg_spread_finish(const KernelArgs& p, const float (&acc)[2][WgShape<NT, FEAT>::kAcc],
                                                 int slice, int row0, int base_b, int warp, int lane, int team_tid) {
  using S = WgShape<NT, FEAT>;
  constexpr int kQ = S::kAcc / 4;             // float4 rows per accumulator array
  constexpr int kGroups = NT / 8;             // 8-token row groups of the tile
  constexpr int kRows = S::kOneTile ? 1 : 2;  // float4 rows per group
  static_assert(kRows * kGroups == 2 * kQ && kCount == S::kThreads, "every float4 row in one group");
  auto group_of = [](int r) { return S::kOneTile ? r : r % kQ; };
  const int parts = p.split, first_b = base_b + slice * parts;
  const int me = int(blockIdx.x) - first_b;
  const int live = min(kGroups, (p.m - row0 + 7) / 8);  // groups with a token below m
  const bool leader = team_tid == 0;
  tl_mark(p, kTlInfo, leader, unsigned(parts) * 2u + (me == 0 ? 1u : 0u));
  float4* mine = reinterpret_cast<float4*>(p.red + size_t(blockIdx.x) * S::kPart);
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int q = 0; q < kQ; ++q)
      if (group_of(j * kQ + q) < live)
        __stcg(mine + (j * kQ + q) * kCount + team_tid,
               make_float4(acc[j][4 * q], acc[j][4 * q + 1], acc[j][4 * q + 2], acc[j][4 * q + 3]));
  __threadfence();  // each thread publishes its own stores before the counter moves
  int* counter = p.locks + first_b;
  deposit_done<kBar, kCount>(counter, leader);
  const int g0 = spread_share_begin(me, live, parts), g1 = spread_share_begin(me + 1, live, parts);
  if (g0 == g1) return;  // the whole team alike
  if (leader) {
    while (ld_acquire(counter) < parts) {
    }
    if (atomicAdd(counter, 1) == parts + spread_owners(live, parts) - 1) atomicExch(counter, 0);
  }
  team_sync<kBar, kCount>();
  tl_mark(p, kTlReduced, leader);
  const uint16_t* s16 = static_cast<const uint16_t*>(p.s);
  const float4* red = reinterpret_cast<const float4*>(p.red) + team_tid;
  for (int g = g0; g < g1; ++g) {
    float4 sum[kRows];
#pragma unroll
    for (int x = 0; x < kRows; ++x) sum[x] = __ldcg(red + size_t(first_b) * (S::kPart / 4) + (x * kQ + g) * kCount);
#pragma unroll 4
    for (int b = first_b + 1; b < first_b + parts; ++b)
#pragma unroll
      for (int x = 0; x < kRows; ++x) {
        const float4 v = __ldcg(red + size_t(b) * (S::kPart / 4) + (x * kQ + g) * kCount);
        sum[x].x += v.x, sum[x].y += v.y, sum[x].z += v.z, sum[x].w += v.w;
      }
#pragma unroll
    for (int x = 0; x < kRows; ++x) {
      // Row x kQ + g: accumulator array j, float4 q of it (8-token row q of that array's tokens).
      const int j = S::kOneTile ? g / kQ : x, q = S::kOneTile ? g % kQ : g;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = slice * S::kFeat + (S::kOneTile
                                              ? wl::acc_col(wl::warp_tile128(warp), wl::warp_sub128(warp), 0, lane, h)
                                              : wl::acc_col(wl::warp_tile(warp), wl::warp_sub0(warp), j, lane, h));
        const float sc = GROUPED ? 1.f : to_float<DT>(s16[wl::channel_scale_pos(c)]);
        const int tok = row0 + (S::kOneTile ? (NT / 2) * j : 0) + wl::pair_token(q, lane);
        wg_store_pair<DT>(p, (h ? sum[x].z : sum[x].x) * sc, (h ? sum[x].w : sum[x].y) * sc, c, tok, lane);
      }
    }
  }
}

template <int DT, bool GROUPED, int NT>
__global__ void __launch_bounds__(256, NT <= 64 ? 2 : 1) marlin_wgmma_kernel(const KernelArgs p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = WgShape<NT>;
  static_assert(!S::kOneTile, "the 128- and 192-column tiles run on the producer-fed form only (marlin_wgmma_ws.cuh)");
  extern __shared__ __align__(16) unsigned char sh_raw[];
  const uint32_t raw = smem_addr(sh_raw);
  unsigned char* sh = sh_raw + (((raw + S::kAlign - 1) & ~uint32_t(S::kAlign - 1)) - raw);
  const uint32_t sbase = smem_addr(sh);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int tile = wl::warp_tile(warp);  // the packed 64-wide tile this warp expands
  const int sub0 = wl::warp_sub0(warp);  // its first 16-column subblock (of two)
  const int k_tiles = p.k / S::kTK, n_tiles = p.n / S::kFeat;
  const int nk = n_tiles * k_tiles;
  const int a_row = p.k / 8, b_row = p.n / 2, s_row = p.n / 8;  // int4 per row of A, B, s
  const int4* A = static_cast<const int4*>(p.A);
  const int4* B = reinterpret_cast<const int4*>(p.B);
  const int4* Sc = static_cast<const int4*>(p.s);

  const int group = blockIdx.x / p.chunk_blocks, local = blockIdx.x % p.chunk_blocks;
  const int base_b = group * p.chunk_blocks;
  allow_next_grid();  // see marlin_kernel: every block of this grid is resident before the next starts
  const bool tl0 = tid == 0;
  tl_mark(p, kTlEntry, tl0);
  tl_mark(p, kTlSm, tl0);
  bool tl_first = tl0;

  for (int pc = group; pc < p.par; pc += p.chunk_groups) {
    int it = local * p.iters;
    const int it_end = min(it + p.iters, nk);
    while (it < it_end) {
      const int slice = it / k_tiles, kt0 = it % k_tiles;
      const int cnt = min(it_end, (slice + 1) * k_tiles) - it;
      const int row0 = pc * NT;

      // Copy addresses. With kHoistCopies (NT <= 64) each thread's chunks are worked out once per slice,
      // as 32-bit int4 offsets from the row chunk's activations and the slice's weights and scales, and
      // the destinations stay shared-window addresses: a tile's copies then cost an add and a wide
      // multiply each (worked out per tile they were ~100 of a tile's ~300 instructions, and the kernel
      // is issue-bound there). Offsets stay below 2^31: the host takes this kernel only where a row
      // chunk of A (up to 129 rows of k / 8 int4) and all of B (k n / 32 int4) fit (wgmma_offsets_fit);
      // s holds k n / 256 int4, less still. The 128-token tile, at ptxas's register limit,
      // keeps the per-tile arithmetic: hoisted, its loop spilled into rematerialization and ran 3-5% slower.
      constexpr int kAChunks = (NT * 8 + S::kThreads - 1) / S::kThreads;  // per thread per tile
      constexpr int kBChunks = S::kBBytes / 16 / S::kThreads;
      const int4* a_base = A + size_t(row0) * a_row;
      int a_off[kAChunks];
      bool a_in[kAChunks], a_ok[kAChunks];
#pragma unroll
      for (int j = 0; j < kAChunks; ++j) {
        const int i = j * S::kThreads + tid, r = i >> 3, c = i & 7;
        a_in[j] = NT * 8 % S::kThreads == 0 || i < NT * 8;
        a_ok[j] = row0 + r < p.m;  // rows past m: zero-filled, from row row0's address (row0 < m)
        a_off[j] = (a_ok[j] ? r : 0) * a_row + c;
      }
      int b_off[kBChunks];
#pragma unroll
      for (int j = 0; j < kBChunks; ++j) {
        const int i = j * S::kThreads + tid;
        b_off[j] = wl::weight_int4_row(i) * b_row + slice * (S::kFeat / 2) + wl::weight_int4_col(i);
      }
      const int s_rows = tile_scale_rows(S::kTK, p.group_shift);
      const bool s_in = tid < s_rows * (S::kFeat / 8);
      const int s_off = (tid / (S::kFeat / 8)) * s_row + slice * (S::kFeat / 8) + tid % (S::kFeat / 8);

      auto load_a = [&](int st, int kt) {
        if constexpr (S::kHoistCopies) {
          const uint32_t sA = sbase + st * S::kStage;
#pragma unroll
          for (int j = 0; j < kAChunks; ++j) {
            const int i = j * S::kThreads + tid;
            if (a_in[j]) cp_async16_s(sA + wl::act_chunk_byte(i >> 3, i & 7), a_base + (a_off[j] + kt * 8), a_ok[j]);
          }
        } else {
          unsigned char* sA = sh + st * S::kStage;
#pragma unroll
          for (int i0 = 0; i0 < NT * 8; i0 += S::kThreads) {
            const int i = i0 + tid;
            if (NT * 8 % S::kThreads == 0 || i < NT * 8) {
              const int r = i >> 3, c = i & 7;
              const bool ok = row0 + r < p.m;
              cp_async16(sA + wl::act_chunk_byte(r, c), A + size_t(ok ? row0 + r : 0) * a_row + kt * 8 + c, ok);
            }
          }
        }
      };
      auto load_weights = [&](int st, int kt) {
        if constexpr (S::kHoistCopies) {
          const uint32_t sB = sbase + st * S::kStage + S::kABytes;
          const int4* b_tile = B + kt * S::kKB * b_row;
#pragma unroll
          for (int j = 0; j < kBChunks; ++j) cp_async16_s(sB + (j * S::kThreads + tid) * 16, b_tile + b_off[j], true);
          if constexpr (GROUPED) {
            const int g0 = (kt * S::kTK) >> p.group_shift;
            if (s_in) cp_async16_s(sB + S::kBBytes + tid * 16, Sc + (g0 * s_row + s_off), true);
          }
        } else {
          int4* sB = reinterpret_cast<int4*>(sh + st * S::kStage + S::kABytes);
#pragma unroll
          for (int i0 = 0; i0 < S::kBBytes / 16; i0 += S::kThreads) {
            const int i = i0 + tid, kk = wl::weight_int4_row(i), c = wl::weight_int4_col(i);
            cp_async16(sB + i, B + size_t(kt * S::kKB + kk) * b_row + slice * (S::kFeat / 2) + c, true);
          }
          if constexpr (GROUPED) {
            int4* sS = sB + S::kBBytes / 16;
            const int g0 = (kt * S::kTK) >> p.group_shift;
            const int rows = tile_scale_rows(S::kTK, p.group_shift);
            if (tid < rows * (S::kFeat / 8)) {
              const int r = tid / (S::kFeat / 8), c = tid % (S::kFeat / 8);
              cp_async16(sS + tid, Sc + size_t(g0 + r) * s_row + slice * (S::kFeat / 8) + c, true);
            }
          }
        }
      };

      float acc[2][S::kAcc];
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int i = 0; i < S::kAcc; ++i) acc[j][i] = 0.f;

      const int w_byte = wl::weight_byte(tile, lane, sub0), s_byte = wl::scale_byte(tile, lane, sub0);

      // Prologue: weights of the first kStages - 2 tiles before the wait for the previous kernel (see
      // marlin_kernel), activations after it; one cp.async group per tile from then on.
      constexpr int kAhead = S::kStages - 2;
#pragma unroll
      for (int st = 0; st < kAhead; ++st)
        if (st < cnt) load_weights(st, kt0 + st);
      wait_previous_grid();
      tl_mark(p, kTlWaited, tl_first);
#pragma unroll
      for (int st = 0; st < kAhead; ++st) {
        if (st < cnt) load_a(st, kt0 + st);
        cp_async_commit();
      }
      int st = 0;
      for (int t = 0; t < cnt; ++t) {
        // Tile t has landed for every thread (and is visible to the async proxy) past this barrier; every
        // warpgroup has also retired the wgmmas of tile t - 2 (each step waits for the one before it), so
        // that tile's stage takes tile t + kStages - 2.
        cp_async_wait<kAhead - 1>();
        fence_proxy_async();
        __syncthreads();
        tl_mark(p, kTlFirstData, tl_first && t == 0);
        // The copies go out before step 0 (tile t - 1's last wgmmas are still running): issued between
        // a wgmma and its wait, their branches make ptxas serialize every wgmma (C7513).
        if (t + kAhead < cnt) {
          const int dst = (st + kAhead) % S::kStages;
          load_a(dst, kt0 + t + kAhead);
          load_weights(dst, kt0 + t + kAhead);
        }
        cp_async_commit();
        const unsigned char* stage = sh + st * S::kStage;
        WgWords w = wg_load_words<NT, GROUPED>(stage, 0, w_byte, s_byte, p.group_shift);
#pragma unroll
        for (int kk = 0; kk < S::kKB; ++kk) {
          wg_issue<DT, GROUPED, NT>(acc, sbase + st * S::kStage, kk, w);
          if (kk + 1 < S::kKB) w = wg_load_words<NT, GROUPED>(stage, kk + 1, w_byte, s_byte, p.group_shift);
          wgmma_wait<1>();
        }
        st = st + 1 == S::kStages ? 0 : st + 1;
      }
      wgmma_wait<0>();
      fence_regs(acc[0]);
      fence_regs(acc[1]);
      cp_async_wait<0>();
      tl_mark(p, kTlComputed, tl0);
      tl_first = false;

      wg_finish_slice<DT, GROUPED, NT, 0, 0>(p, acc, slice, row0, base_b, k_tiles, warp, lane, tid);
      it += cnt;
      __syncthreads();  // the next slice's prologue overwrites the stages
    }
  }
  tl_mark(p, kTlExit, tl0);
#else
  __trap();  // built only for sm_90a; the host never launches it elsewhere
#endif
}

template <int DT, int NT>
cudaError_t wgmma_prepare(int* blocks_per_sm, int* smem_bytes) {
  return prepare_variants(marlin_wgmma_kernel<DT, false, NT>, marlin_wgmma_kernel<DT, true, NT>, WgShape<NT>::kThreads,
                          WgShape<NT>::kSmemBytes, blocks_per_sm, smem_bytes);
}

template <int DT, int NT>
cudaError_t wgmma_launch(const KernelArgs& a, const LaunchOpts& o, cudaStream_t stream) {
  return launch_variant(marlin_wgmma_kernel<DT, false, NT>, marlin_wgmma_kernel<DT, true, NT>, WgShape<NT>::kThreads,
                        a, o, stream);
}

#define MARLINC_INSTANTIATE_WGMMA(DT, NT)                    \
  template cudaError_t wgmma_prepare<DT, NT>(int*, int*); \
  template cudaError_t wgmma_launch<DT, NT>(const KernelArgs&, const LaunchOpts&, cudaStream_t);

}  // namespace marlinc::kernels::detail
