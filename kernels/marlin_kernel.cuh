// The fused Marlin W4A16 kernel (our implementation of the design in the Marlin paper), templated on
// element type DT (0 fp16, 1 bf16), MB (16-row m blocks per tile), TN/TK (tile width/depth). Only the
// generated translation units include this file, so each configuration compiles in parallel.
//
// Data flow per thread block: a stripe of consecutive (k-tile) iterations over column slices, loaded
// with a multi-stage cp.async pipeline (A with an XOR swizzle for conflict-free ldmatrix, B streamed
// once with plain 16-byte cp.async.cg, grouped scales beside them), operands double-buffered in
// registers, int4 -> 16-bit dequantization with lop3 straight into mma.sync.m16n8k16 B fragments,
// warps splitting n, then (32-row tiles) m, then k inside a tile and reducing k through shared memory,
// and blocks that share a column slice reducing in fp32 through the workspace (parallel deposits, one
// in-order sum by the slice's first block). Row chunks beyond one tile run side by side in block
// groups. With programmatic dependent launch the first tiles' weights stream before the wait for the
// previous kernel. Layout facts: formats.md §1.3-§1.6.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/kgroup_tree.h"
#include "kernels/marlin_device.cuh"
#include "kernels/marlin_launch.h"

namespace marlinc::kernels::detail {

// ---- mma.sync operands ---------------------------------------------------------------------------

// The _s forms take the shared-window address (a kernel that keeps it skips the generic-to-shared conversion).
__device__ __forceinline__ void ldmatrix_x4_s(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) { ldmatrix_x4_s(r, smem_addr(p)); }

// Two 8x8 matrices (lanes 0-7 and 8-15 give the row addresses): the m16n8k16 B fragment of 8 rows of a
// row-major [rows][k] operand (the streaming kernel's SWAP form, sm90/marlin_stream.cuh).
__device__ __forceinline__ void ldmatrix_x2_s(uint32_t& r0, uint32_t& r1, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}

template <int DT>
__device__ __forceinline__ void mma_16816(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float (&c)[4]) {
  if constexpr (DT == 0) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// ---- the end of a slice (fragments of mma.m16n8 accumulators) ---------------------------------------

// Sums the partial accumulators of the KG k-groups of warps (KG a power of two, GROUP warps each; warp
// `pos` of group wk) in a fixed tree through shared memory `red` (kgroup_red_slots<KG, RADIX>() * GROUP * ACC *
// 32 float4; the tree is kernels/kgroup_tree.h, replayed on the CPU there). Each step costs two barriers; RADIX 4
// takes fewer steps (two for 16 groups, against four) for 1.5 times the shared memory. kBar/kCount: the barrier of
// the threads taking part (team_sync).
template <int KG, int GROUP, int ACC, int kBar = 0, int kCount = 0, int RADIX = 2>
__device__ __forceinline__ void reduce_kgroups(float4* red, float (&acc)[ACC][4], int wk, int pos, int lane) {
  static_assert(RADIX == 2 || RADIX == 4, "tree steps of two or four groups");
#pragma unroll
  for (int active = KG; active > 1; active = kgroup_step(active, RADIX).q) {
    const KgroupStep step = kgroup_step(active, RADIX);
    const int r = step.r, q = step.q;  // groups q .. active - 1 hand over
    if (wk >= q && wk < active) {
      float4* dst = red + (kgroup_write_slot(wk, q) * GROUP + pos) * (ACC * 32);
#pragma unroll
      for (int a = 0; a < ACC; ++a) dst[a * 32 + lane] = make_float4(acc[a][0], acc[a][1], acc[a][2], acc[a][3]);
    }
    team_sync<kBar, kCount>();
    if (wk < q) {
#pragma unroll
      for (int i = 1; i < r; ++i) {
        const float4* src = red + (kgroup_read_slot(wk, q, i) * GROUP + pos) * (ACC * 32);
#pragma unroll
        for (int a = 0; a < ACC; ++a) {
          const float4 v = src[a * 32 + lane];
          acc[a][0] += v.x; acc[a][1] += v.y; acc[a][2] += v.z; acc[a][3] += v.w;
        }
      }
    }
    team_sync<kBar, kCount>();
  }
}

// Blocks sharing a slice: every block but the slice's first deposits its fp32 partial tile in its own
// workspace slot and bumps the slice's counter, all at once; the first block (which reaches the slice
// last, at the end of its stripe) waits for count - 1 deposits, adds them in block order (deterministic)
// and writes C. A serial lock hand-off per block would put `count` global-memory round trips on the
// critical path, which dominates small layers where count reaches 16.
// WMB: the warp's 16-row m blocks, whose accumulators acc[mb * 8 + t][2h], [2h + 1] hold row
// mrow0 + 16 mb + lane / 4 + 8 h, columns 64 wn + 8 t + 2 (lane % 4) and + 1 of the ROWS x TN tile whose
// first row is row0 of C (mma.m16n8 C fragment); `holder`: the warps that hold the tile's sums (the
// others took part in a k reduction before). The team (kBar, kCount: team_sync) is every thread of the
// block that reaches this point, its thread 0 the leader.
template <int DT, bool GROUPED, int WMB, int ROWS, int TN, int kBar = 0, int kCount = 0>
__device__ __forceinline__ void finish_slice_frags(const KernelArgs& p, float (&acc)[WMB * 8][4], int slice,
                                                   int first_b, int last_b, int row0, int mrow0, int valid_rows,
                                                   bool holder, int wn, int lane) {
  auto for_each_pair = [&](auto&& f) {
#pragma unroll
    for (int mb = 0; mb < WMB; ++mb)
#pragma unroll
      for (int t = 0; t < 8; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          f(mb * 8 + t, h, mrow0 + mb * 16 + (lane >> 2) + 8 * h, wn * 64 + 8 * t + 2 * (lane & 3));
  };
  const int count = last_b - first_b + 1;
  const bool finisher = int(blockIdx.x) == first_b;
  tl_mark(p, kTlInfo, threadIdx.x == 0, unsigned(count) * 2u + (finisher ? 1u : 0u));
  if (count > 1) {
    int* counter = p.locks + first_b;
    if (!finisher) {
      if (holder) {
        float* mine = p.red + size_t(blockIdx.x) * (ROWS * TN);  // [ROWS, TN], one slot per block
        for_each_pair([&](int a, int h, int r, int c) {
          if (r < valid_rows)
            __stcg(reinterpret_cast<float2*>(mine + r * TN + c), make_float2(acc[a][2 * h], acc[a][2 * h + 1]));
        });
        __threadfence();  // each writer publishes its own stores before the counter moves
      }
      deposit_done<kBar, kCount>(counter, threadIdx.x == 0);
    } else {
      wait_deposits<kBar, kCount>(counter, count - 1, threadIdx.x == 0);
      tl_mark(p, kTlReduced, threadIdx.x == 0);
      if (holder) {
        for (int b = first_b + 1; b <= last_b; ++b) {
          const float* other = p.red + size_t(b) * (ROWS * TN);
          for_each_pair([&](int a, int h, int r, int c) {
            if (r < valid_rows) {
              const float2 o = __ldcg(reinterpret_cast<const float2*>(other + r * TN + c));
              acc[a][2 * h] += o.x;
              acc[a][2 * h + 1] += o.y;
            }
          });
        }
      }
      if (threadIdx.x == 0) *counter = 0;  // every deposit has been counted: re-arm for the next launch
    }
  }

  if ((count == 1 || finisher) && holder) {
    uint16_t* C = static_cast<uint16_t*>(p.C);
    const uint16_t* s16 = static_cast<const uint16_t*>(p.s);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // Per-channel scales (§1.6 single perm): the lane's 8 values for n8 tiles 4*half..4*half+3 are
      // one contiguous 16-byte run at 32*(n/32) + 8*(lane%4).
      float sc[8];
      if constexpr (!GROUPED) {
        const int4 v = *reinterpret_cast<const int4*>(s16 + slice * TN + wn * 64 + 32 * half + 8 * (lane & 3));
        const uint16_t* hv = reinterpret_cast<const uint16_t*>(&v);
#pragma unroll
        for (int e = 0; e < 8; ++e) sc[e] = to_float<DT>(hv[e]);
      }
#pragma unroll
      for (int mb = 0; mb < WMB; ++mb)
#pragma unroll
        for (int tt = 0; tt < 4; ++tt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int t = 4 * half + tt;
            const int r = mrow0 + mb * 16 + (lane >> 2) + 8 * h;
            if (r < valid_rows) {
              const int c = slice * TN + wn * 64 + 8 * t + 2 * (lane & 3);
              float v0 = acc[mb * 8 + t][2 * h], v1 = acc[mb * 8 + t][2 * h + 1];
              if constexpr (!GROUPED) {
                v0 *= sc[2 * tt];
                v1 *= sc[2 * tt + 1];
              }
              *reinterpret_cast<uint32_t*>(C + size_t(row0 + r) * p.n + c) = pack2<DT>(v0, v1);
            }
          }
    }
  }
}

// ---- the kernel ------------------------------------------------------------------------------------

template <int MB, int TN, int TK>
struct Shape {
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kNWarps = TN / 64;             // a warp owns 64 output columns
  // A 32-row tile at most 128 wide is split between two warps (16 rows each): more k16 steps per warp
  // between barriers and fewer registers, for duplicated dequantization (both warps expand the same
  // weights). Measured on the H100 (docs/PERF.md): 128x128 and 128x64 tiles gain 7-32% per layer at
  // m = 32, 64x256 loses 7-12% (all its warps would duplicate), and 64-row tiles lose 15-30% (two
  // blocks per SM only with register spills).
  static constexpr int kMWarps = MB == 2 && TN <= 128 ? 2 : 1;
  static constexpr int kWarpMB = MB / kMWarps;        // 16-row m blocks per warp
  static constexpr int kKWarps = kWarps / (kNWarps * kMWarps);  // the rest split the tile's k16 blocks
  static constexpr int kKB = TK / 16;                 // k16 blocks per tile
  static constexpr int kKBPerWarp = kKB / kKWarps;
  // A warp's k16 steps of a tile span more than the smallest group (32): load scales per step.
  static constexpr bool kScalePerStep = 16 * kKBPerWarp > 32;
  static constexpr int kBlocksPerSm = kWarpMB <= 2 ? 2 : 1;  // __launch_bounds__ (128 registers for two)
  static constexpr int kRows = MB * 16;
  // More stages where the A tile is small: keeps more weight bytes in flight per SM at small m.
  static constexpr int kStages = MB == 1 ? 6 : 4;
  static constexpr int kAChunks = TK / 8;             // 16-byte chunks per A row
  static constexpr int kAStage = kRows * kAChunks;    // int4 per stage
  static constexpr int kBRow = TN / 2;                // int4 per 16-row of B in the tile (TN*16/8 words)
  static constexpr int kBStage = kKB * kBRow;
  static constexpr int kSRows = TK / 32 > 1 ? TK / 32 : 1;  // groups a tile can span (g >= 32)
  static constexpr int kSRow = TN / 8;
  static constexpr int kSStage = kSRows * kSRow;
  static constexpr int kStage = kAStage + kBStage + kSStage;
  static constexpr int kAcc = kWarpMB * 8;            // float4 accumulators per thread
  static constexpr int kRed = (kKWarps / 2) * kNWarps * kMWarps * kAcc * 32;  // float4, k-warp reduction
  static constexpr int kSmemInt4 = kStages * kStage > kRed ? kStages * kStage : kRed;
  static constexpr int kSmemBytes = kSmemInt4 * 16;

  static_assert(TN % 64 == 0 && kWarps % (kNWarps * kMWarps) == 0, "a warp owns 64 columns (a 16x64 packed block)");
  static_assert(kKB % kKWarps == 0 && kKBPerWarp >= 1, "k-warps split the tile's k16 blocks evenly");
  static_assert(kAChunks >= 8, "the A swizzle XORs the chunk index with row % 8");
  static_assert((kKWarps & (kKWarps - 1)) == 0, "tree reduction over a power-of-two number of k-warps");
  static_assert((kStages * kKBPerWarp) % 2 == 0, "register double-buffer parity repeats every stage round");
  static_assert(MB >= 1 && MB <= kMaxMBlocks && TN <= kMaxThreadN, "workspace slots are sized for these");
};

// GROUPED: group scales applied to the dequantized weights (groups > 1); otherwise per-channel scales
// are applied to the output. A template parameter keeps the branch out of the inner loop.
template <int DT, bool GROUPED, int MB, int TN, int TK>
__global__ void __launch_bounds__(kThreads, Shape<MB, TN, TK>::kBlocksPerSm) marlin_kernel(const KernelArgs p) {
  using S = Shape<MB, TN, TK>;
  extern __shared__ int4 sh[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wn = warp % S::kNWarps, wm = (warp / S::kNWarps) % S::kMWarps;
  const int wk = warp / (S::kNWarps * S::kMWarps);
  const int wmn = wm * S::kNWarps + wn;  // the warp's (m, n) position among the k-warp group
  const int mrow0 = wm * S::kWarpMB * 16;  // the warp's first row within the m tile
  const int k_tiles = p.k / TK, n_tiles = p.n / TN;
  const int nk = n_tiles * k_tiles;  // tiles of one row chunk
  const int a_row = p.k / 8;  // int4 per row of A
  const int b_row = p.n / 2;  // int4 per row of B (2n words)
  const int s_row = p.n / 8;  // int4 per row of s
  const int4* A = static_cast<const int4*>(p.A);
  const int4* B = reinterpret_cast<const int4*>(p.B);
  const int4* Sc = static_cast<const int4*>(p.s);

  // Partition (KernelArgs): the grid is chunk_groups groups of chunk_blocks blocks; every group splits
  // one row chunk's n x k tiles into the same stripes, so the groups read each weight tile at about the
  // same time and all but the first read come from L2. A group takes row chunks group, group +
  // chunk_groups, ... (more than one only when chunk_blocks == 1, i.e. whole slices, no reduction).
  const int group = blockIdx.x / p.chunk_blocks, local = blockIdx.x % p.chunk_blocks;
  const int base_b = group * p.chunk_blocks;  // the group's first block
  // Every block of this grid is resident by the time the next grid can start (a block that has not
  // launched has not made this call), so the stripe reduction's co-residency is kept.
  allow_next_grid();
  const bool tl0 = tid == 0;
  tl_mark(p, kTlEntry, tl0);
  tl_mark(p, kTlSm, tl0);
  bool tl_first = tl0;

  for (int pc = group; pc < p.par; pc += p.chunk_groups) {
    int it = local * p.iters;
    const int it_end = min(it + p.iters, nk);
    while (it < it_end) {
      const int slice = it / k_tiles;  // the column tile within row chunk pc
      const int kt0 = it % k_tiles;
      const int cnt = min(it_end, (slice + 1) * k_tiles) - it;
      const int ncol = slice;
      const int row0 = pc * S::kRows;

      // A tile's activations, and its weights + scales: separate, so that the prologue can stream weights
      // before the previous kernel (which may write A) has finished (MarlinGemm::overlap_previous).
      auto load_a = [&](int st, int kt) {
        int4* sA = sh + st * S::kStage;
#pragma unroll
        for (int i0 = 0; i0 < S::kAStage; i0 += kThreads) {
          const int i = i0 + tid;
          if (S::kAStage % kThreads == 0 || i < S::kAStage) {
            const int r = i / S::kAChunks, c = i % S::kAChunks;
            const bool ok = row0 + r < p.m;
            const int4* src = A + size_t(ok ? row0 + r : 0) * a_row + kt * S::kAChunks + c;
            cp_async16(sA + r * S::kAChunks + (c ^ (r & 7)), src, ok);
          }
        }
      };
      auto load_weights = [&](int st, int kt) {
        int4* sB = sh + st * S::kStage + S::kAStage;
        int4* sS = sB + S::kBStage;
#pragma unroll
        for (int i0 = 0; i0 < S::kBStage; i0 += kThreads) {
          const int i = i0 + tid;
          if (S::kBStage % kThreads == 0 || i < S::kBStage) {
            const int r = i / S::kBRow, c = i % S::kBRow;
            cp_async16(sB + i, B + size_t(kt * S::kKB + r) * b_row + ncol * S::kBRow + c, true);
          }
        }
        if constexpr (GROUPED) {
          const int g0 = (kt * TK) >> p.group_shift;
          const int rows = tile_scale_rows(TK, p.group_shift);
          for (int i = tid; i < rows * S::kSRow; i += kThreads) {
            const int r = i / S::kSRow, c = i % S::kSRow;
            cp_async16(sS + i, Sc + size_t(g0 + r) * s_row + ncol * S::kSRow + c, true);
          }
        }
      };
      auto load_tile = [&](int st, int kt) {
        load_a(st, kt);
        load_weights(st, kt);
      };

      float acc[S::kAcc][4];
#pragma unroll
      for (int a = 0; a < S::kAcc; ++a) acc[a][0] = acc[a][1] = acc[a][2] = acc[a][3] = 0.f;

      // One k16 step's operands in registers: A fragments (ldmatrix), the lane's packed B words and,
      // with kScalePerStep, the step's scales.
      struct Frags {
        uint32_t a[S::kWarpMB][4];
        int4 b;
        int4 s;
      };
      const int s_lane = wn * 8 + (lane >> 2);
      auto load_frags = [&](Frags& f, int st, int kk) {
        const int4* sA = sh + st * S::kStage;
        const int4* sB = sA + S::kAStage;
        const int kb = wk * S::kKBPerWarp + kk;
#pragma unroll
        for (int mb = 0; mb < S::kWarpMB; ++mb) {
          const int r = mrow0 + mb * 16 + (lane & 15), c = kb * 2 + (lane >> 4);
          ldmatrix_x4(f.a[mb], sA + r * S::kAChunks + (c ^ (r & 7)));
        }
        f.b = sB[kb * S::kBRow + wn * 32 + lane];
        if constexpr (GROUPED && S::kScalePerStep)
          f.s = (sB + S::kBStage)[((kb * 16) >> p.group_shift) * S::kSRow + s_lane];
      };
      // Otherwise a warp's k16 steps of one tile lie in one group: one scale load per tile.
      const int s_off = ((wk * S::kKBPerWarp * 16) >> p.group_shift) * S::kSRow + s_lane;
      auto load_scales = [&](int st) -> int4 {
        if constexpr (!GROUPED || S::kScalePerStep) return make_int4(0, 0, 0, 0);
        return (sh + st * S::kStage + S::kAStage + S::kBStage)[s_off];
      };
      auto compute = [&](const Frags& f, const int4& tile_sv) {
        const int4& sv = S::kScalePerStep ? f.s : tile_sv;
        const uint32_t words[4] = {uint32_t(f.b.x), uint32_t(f.b.y), uint32_t(f.b.z), uint32_t(f.b.w)};
        const uint32_t sw[4] = {uint32_t(sv.x), uint32_t(sv.y), uint32_t(sv.z), uint32_t(sv.w)};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t w[4];
          dequant8<DT>(words[j], w);
          if constexpr (GROUPED) {
            // Scale halves 2j (column 16j + c) and 2j + 1 (column 16j + c + 8), §1.6 grouped perm.
            scale2<DT, false>(w[0], w[1], sw[j]);
            scale2<DT, true>(w[2], w[3], sw[j]);
          }
#pragma unroll
          for (int mb = 0; mb < S::kWarpMB; ++mb) {
            mma_16816<DT>(f.a[mb], w[0], w[1], acc[mb * 8 + 2 * j]);
            mma_16816<DT>(f.a[mb], w[2], w[3], acc[mb * 8 + 2 * j + 1]);
          }
        }
      };

      // Pipeline: STAGES-1 tiles in flight ahead of the one being computed. Operands are double-buffered
      // in registers: the next k16 step's shared loads are issued before the current step's dequantize and
      // mma, and at a tile's last step the barrier comes first, so the next tile's first operands load
      // while this tile finishes (shared-memory latency never sits between a barrier and the math). The
      // stage loop is unrolled so that every shared-memory offset is a constant.
      // Prologue: the weights of the first STAGES-1 tiles go out before the wait for the previous kernel,
      // the activations after it. cp.async groups complete in order, so the first group (all prologue
      // weights + A of tile 0) is the one the first tile waits for; later groups hold one A tile each.
#pragma unroll
      for (int st = 0; st < S::kStages - 1; ++st)
        if (st < cnt) load_weights(st, kt0 + st);
      wait_previous_grid();
      tl_mark(p, kTlWaited, tl_first);
#pragma unroll
      for (int st = 0; st < S::kStages - 1; ++st) {
        if (st < cnt) load_a(st, kt0 + st);
        cp_async_commit();
      }
      cp_async_wait<S::kStages - 2>();
      __syncthreads();
      tl_mark(p, kTlFirstData, tl_first);
      tl_first = false;
      Frags fr[2];
      load_frags(fr[0], 0, 0);
      int4 sv_cur = load_scales(0), sv_next = sv_cur;
      int t = 0;
      while (t < cnt) {
#pragma unroll
        for (int pipe = 0; pipe < S::kStages; ++pipe) {
#pragma unroll
          for (int kk = 0; kk < S::kKBPerWarp; ++kk) {
            const int cur = (pipe * S::kKBPerWarp + kk) & 1;  // S * kKBPerWarp is even: parity carries over
            if (kk + 1 < S::kKBPerWarp) {
              load_frags(fr[cur ^ 1], pipe, kk + 1);
            } else {
              // Every warp has its operands of tile t in registers once past this barrier, so the stage
              // that held tile t - 1 is free for tile t + STAGES - 1; tile t + 1 has landed.
              if (t + S::kStages - 1 < cnt) load_tile((pipe + S::kStages - 1) % S::kStages, kt0 + t + S::kStages - 1);
              cp_async_commit();
              cp_async_wait<S::kStages - 2>();
              __syncthreads();
              if (t + 1 < cnt) {
                load_frags(fr[cur ^ 1], (pipe + 1) % S::kStages, 0);
                sv_next = load_scales((pipe + 1) % S::kStages);
              }
            }
            compute(fr[cur], sv_cur);
          }
          sv_cur = sv_next;
          if (++t == cnt) break;
        }
      }
      cp_async_wait<0>();
      __syncthreads();
      tl_mark(p, kTlComputed, tl0);

      // Reduce the k-warps' partial sums through shared memory.
      if constexpr (S::kKWarps > 1)
        reduce_kgroups<S::kKWarps, S::kNWarps * S::kMWarps, S::kAcc>(reinterpret_cast<float4*>(sh), acc, wk, wmn, lane);

      finish_slice_frags<DT, GROUPED, S::kWarpMB, S::kRows, TN>(
          p, acc, slice, slice_first_block(base_b, slice, k_tiles, p.iters),
          slice_last_block(base_b, slice, k_tiles, p.iters), row0, mrow0, min(S::kRows, p.m - row0), wk == 0, wn, lane);
      it += cnt;
      __syncthreads();  // the next slice's prologue overwrites the reduction area
    }
  }
  tl_mark(p, kTlExit, tl0);
}

template <int DT, int MB, int TN, int TK>
cudaError_t marlin_prepare(int* blocks_per_sm, int* smem_bytes) {
  return prepare_variants(marlin_kernel<DT, false, MB, TN, TK>, marlin_kernel<DT, true, MB, TN, TK>, kThreads,
                          Shape<MB, TN, TK>::kSmemBytes, blocks_per_sm, smem_bytes);
}

template <int DT, int MB, int TN, int TK>
cudaError_t marlin_launch(const KernelArgs& a, const LaunchOpts& o, cudaStream_t stream) {
  return launch_variant(marlin_kernel<DT, false, MB, TN, TK>, marlin_kernel<DT, true, MB, TN, TK>, kThreads, a, o,
                        stream);
}

#define MARLINC_INSTANTIATE(DT, MB, TN, TK)                                                   \
  template cudaError_t marlin_prepare<DT, MB, TN, TK>(int*, int*);                            \
  template cudaError_t marlin_launch<DT, MB, TN, TK>(const KernelArgs&, const LaunchOpts&, cudaStream_t);

}  // namespace marlinc::kernels::detail
