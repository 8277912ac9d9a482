// The streaming Marlin kernel for m <= 16 on Hopper (sm_90a): one block per SM whose stages are filled by
// TMA (tensor copies: per stage one 2D box of weights, one 3D box of the two to eight 64-wide pieces of
// activations and one 2D box of group scales) from one producer thread, and four or eight consumer warps that
// expand and multiply as the mma.sync kernel does (marlin_kernel.cuh: lop3 dequantization into m16n8k16 B
// fragments, ldmatrix for the activations), except that the swapped form scales its fp32 sums once per group run
// instead of every weight (swap_grouped_products).
//
// Why (docs/PERF.md, eighth to eleventh sessions): at m <= 16 the other kernels run two blocks per SM; an
// SM's two blocks finish 10-17% apart, and one block per SM fed by cp.async lost (the second block was
// what kept the weight stream busy). Measured on the H100 with one block per SM (stream_copy.cu): 2D TMA
// boxes stream 3.0-3.1 TB/s, 1D bulk copies of 1-2 KB rows 1.6-3.1 TB/s (by row size and front stagger),
// cp.async from one warp 1.1-1.6.
// The k-split plan (marlin_dispatch.h, stream_plan) keeps the blocks' k fronts aligned, which is worth
// another 10% over staggered stripes (2.74 TB/s).
//
// Tile: a column slice of TN = 64, 128 or 256 columns; a stage holds 32 packed 16x64 blocks (kKRows k16 rows
// of the slice's kNB 64-column blocks), the same k range of A (16 rows, or 8 in the SWAP form; 64-wide boxes
// with the 128B swizzle; rows past m are zero-filled by the TMA unit) and the stage's group scales. Consumer warp
// (wn, wk) expands k16 rows U wk .. U wk + U - 1 (U = 4 or 8) of 64-column block wn in every stage; the kKG warps of a
// column block sum their partial products through shared memory at the end of each slice. The
// cross-block reduction (fp32 deposits, the in-order finisher) and the output are the mma.sync kernel's
// (KernelArgs, marlin_partition.h), over the stripe partition, the k-split (KernelArgs::split) or rounds of
// whole slices before a k-split (KernelArgs::rounds, for layers with more slices than SMs). Where slices are
// split in two, the CLUSTER form runs each pair as a thread-block cluster and adds the partner's sums
// through the finisher's shared memory instead (no global-memory deposit, fence or counter).
#pragma once
#include <cstdint>

#include "kernels/marlin_dispatch.h"
#include "kernels/marlin_kernel.cuh"
#include "kernels/mma_frag.h"
#include "kernels/sm90/marlin_wgmma_ws.cuh"

namespace marlinc::kernels::detail {

// SWAP (m <= kStreamSwapMaxM, marlin_dispatch.h): the weights are the mma's A operand (16 output columns) and
// the activations its B operand (8 tokens), so that a 16x64 packed block takes 4 m16n8k16 products instead of 8
// whose rows past m are zeros, and the A boxes hold 8 rows. Why: the streaming layers run into the H100's 700 W
// cap (cuBLAS does not), and the SM clock drops to 1.4-1.9 GHz (docs/PERF.md, twentieth session); half the
// tensor-core work and activation reads is power the stream can use.
//
// Both forms run eight consumer warps (one exception, below), each expanding U = 4 k16 rows of a stage. With sixteen
// warps of two rows, the k-groups summed at the end of every slice were twice as many (the 16-token form's tree moved
// 48-60 KB through shared memory, 16-28 KB now). H100, same calls (docs/PERF.md, twenty-fifth session), Auto's set
// sums, µs: 8B 48.4-48.8 -> 47.1-47.8 at m = 1-8 and 53.0-53.1 -> 50.5-50.9 at m = 16; 70B 154.5-155.0 -> 152.1-152.9
// at m = 1-8. The gain at m <= 8 is in the stage loop as much as in the tail (70B gate/up, 448 slices: 81.0-81.3 ->
// 79.7-79.9); why is not established: one arrival per warp on the empty barriers instead of one per thread did not help
// (8B 0.3-0.4 µs slower). Four warps (one per scheduler) lost or were level on every layer but 8B down (8B gate/up at m
// = 1: 21.1 -> 30.7 µs).
// A block of the 256-column forms now takes 91-108 KB of shared memory and about 31k registers, so two would fit one
// SM; the grid never exceeds the SMs, and the hardware placed one block per SM in every measurement. Asking for two
// (`__launch_bounds__` minimum 2: 96 registers, no spills) made the 16-token layers at 128 and 256 columns slower (8B
// gate/up at m = 16 22.3 -> 36.0 µs, 70B q/k/v 18.9 -> 27.9; twenty-seventh session), so the forms ask for one.
constexpr int kStreamConsumerWarps = 8;
// The exception: the 16-token form at 64 columns runs four consumer warps of U = 8 rows (the same 512-deep stage) and a
// 3-stage ring. Its stage is the largest (16 KB of activations beside 16 KB of weights), and eight warps took 24 KB for
// their k-group tree: 5 stages and 199 KB a block, 119 KB now. H100, three calls, two runs each (docs/PERF.md,
// twenty-seventh session), µs at m = 9 / 16: 8B o 6.71-6.77 / 6.49-6.55 -> 6.24-6.28 / 5.99-6.21, 8B down 13.33-13.41 /
// 13.33-13.45 -> 12.61-12.77 / 12.61-12.73; the 8B set 50.0-50.4 -> 48.8-49.2. Four warps at 4 stages, eight at 3 and
// four with a tree of steps of two (8 KB, against 12) read 0.1-1.0 µs slower on that set; three stages at 128 columns
// as well cost 8B q/k/v 0.15 µs at m = 16 and 70B gate/up 2 µs at m = 9.
constexpr int kStream16Warps64 = 4;

template <int TN, bool CLUSTER = false, bool SWAP = false>
struct StreamShape {
  static constexpr int kNB = TN / 64;                     // 64-column packed blocks per slice
  static constexpr int kConsumerWarps = TN == 64 && !SWAP ? kStream16Warps64 : kStreamConsumerWarps;
  static constexpr int U = 32 / kConsumerWarps;           // packed 16x64 blocks per consumer warp and stage
  static constexpr int kKG = kConsumerWarps / kNB;        // warps per column block (k-groups)
  static constexpr int kKRows = kKG * U;                  // k16 rows per stage: U per warp
  static constexpr int kTK = 16 * kKRows;                 // stage depth
  static constexpr int kConsumerThreads = 32 * kConsumerWarps;
  static constexpr int kThreads = kConsumerThreads + 32;  // + the producer warp
  static constexpr int kRows = 16;                        // m <= 16: one m16 block of C (SWAP: its rows 0-7)
  static constexpr int kARows = SWAP ? 8 : 16;            // activation rows per box: the mma's n8 or m16
  static constexpr int kBBytes = kKRows * TN * 8;         // one TMA box: kKRows k16 rows x TN columns
  static constexpr int kABox = kARows * 128;              // one TMA box: kARows rows x 64 activations, 128B swizzle
  static constexpr int kABoxes = kTK / 64;
  static constexpr int kABytes = kABoxes * kABox;
  static constexpr int kSBytes = kTK / 32 * TN * 2;       // kTK / 32 group rows of TN scales (groups of 32 at most)
  static constexpr int kStage = kBBytes + kABytes + kSBytes;  // [weights | activations | scales]
  static constexpr int kAcc = 8;                          // n8 tiles per 64-column block (C fragments)
  static constexpr int kAccK = SWAP ? 4 : kAcc;           // SWAP: m16 column groups x n8 tokens while summing k
  // The k-group tree (reduce_kgroups): SWAP sums four groups per step, two steps at most instead of two to four, on
  // the end of every slice, which the small layers' critical path runs through (docs/PERF.md, twenty-second session);
  // its sums are half the 16-token form's, which keeps steps of two at 128 and 256 columns (one and two steps on
  // eight warps; four-way at 128 columns measured level on 8B, twenty-fifth session). At 64 columns the 16-token form
  // has four k-groups: one step of four, which measured 0.1 µs faster on 8B o and down than two of two (twenty-seventh
  // session).
  static constexpr int kRedRadix = SWAP || TN == 64 ? 4 : 2;
  static constexpr int kRedBytes = kgroup_red_slots<kKG, kRedRadix>() * kNB * kAccK * 32 * 16;
  static constexpr int kAlign = 1024;                     // 128B-swizzled boxes start on 1 KB
  static constexpr int kSmemLimit = 227 * 1024;
  // CLUSTER: a slice split in two runs as a cluster of its two blocks (LaunchOpts::cluster): the partner
  // sends its sums into the finisher's shared memory, one 16 x TN fp32 tile as [column block][n8 tile][lane].
  // Clusters of three and four measured slower (kernels/marlin.cu, kStreamClusterSplit).
  static constexpr int kMaxCluster = CLUSTER ? 2 : 1;
  static constexpr int kPartBytes = kRows * TN * 4;
  // What a partner sends: its k-group sums as they stand (SWAP: before the conversion to C fragments, so without
  // the zero rows of tokens 8-15), every holder lane's as float4, [column block][sum][lane].
  static constexpr int kSendBytes = kNB * kAccK * 32 * 16;
  static constexpr int kRecvBytes = (kMaxCluster - 1) * kPartBytes;
  // SWAP frees shared memory (8-row boxes, a smaller k-group area), yet its ring is shallower than the 16-token
  // form's: 4 stages at every width. H100, same calls (docs/PERF.md, twentieth session), 70B set at m = 1-8: all
  // that fits (9-10 stages) 160.2-164.9 us, the 16-token depth 159.1-160.6, two fewer 155.9-157.1, three fewer
  // 155.9-156.3. Once the consumers' loop lost 7 instructions a stage (twenty-third session), two fewer (5 / 6)
  // read 8B gate/up at m = 1 4% slower than before; 4 stages: 8B set 48.5-48.6 us at m = 1 (48.7-48.9 before),
  // 70B 154.7-155.1 (155.6-155.8), 32768^2 g128 175.1-175.5 (180.2-180.5).
  // The 16-token form on eight warps: 4 stages at 128 and 256 columns as well. Same calls (twenty-fifth session), three
  // runs each, 70B set at m = 9 / 16: all that fits (7-9 stages) 160.1-160.8 / 159.7-160.8 us, 6 stages 158.4-159.4 /
  // 158.3-159.5, 4 stages 153.2-153.5 / 154.4-158.3 (70B down 42.1-42.7 -> 40.3-40.4 at m = 9). At 64 columns, on four
  // warps, 3 stages (kStream16Warps64, above).
  // Every form's ring is the depth measured best, never what shared memory leaves (kSmemBytes' assert below).
  static constexpr int kStages = SWAP || TN != 64 ? 4 : 3;
  // [ring | k-group reduction | partner sums | full/empty barriers | the sums' barrier]
  static constexpr int kSmemBytes =
      kAlign + kStages * kStage + kRedBytes + kRecvBytes + 16 * kStages + (CLUSTER ? 16 : 0);
  static constexpr int kBar = 1;                          // named barrier of the consumer warps

  static_assert(TN == 64 || TN == 128 || TN == 256, "slices of one, two or four packed 64-column blocks");
  static_assert(kKG >= 2 && (kKG & (kKG - 1)) == 0, "tree reduction over a power-of-two number of k-groups");
  static_assert(kBBytes == kConsumerWarps * U * 512, "a stage holds U 16x64 packed blocks per consumer warp");
  static_assert(U % 2 == 0, "a warp's rows of a stage come in pairs, 32 k each: one group row of scales a pair");
  static_assert(kTK == stream_tk(TN), "the host encodes the weight boxes with this depth (marlin_dispatch.h)");
  static_assert(kStage % kAlign == 0, "every stage's activation boxes stay 1 KB aligned");
  static_assert(kABox % kAlign == 0, "a 128B-swizzled box spans whole 8-row (1 KB) swizzle atoms");
  static_assert(kARows % 8 == 0, "the 3D activation box's pieces start swizzle atoms (kernels/tma_maps.cu, encode_a3d)");
  static_assert(kARows == (SWAP ? kStreamSwapMaxM : kStreamMaxM), "the host's activation box rows (marlin.cu, run_stream)");
  static_assert(!SWAP || kAccK * 2 == kAcc, "SWAP: one m16 product per pair of n8 tiles");
  static_assert(kPartBytes == kNB * kAcc * 32 * 16, "a partner's sums: every holder lane's acc as float4");
  static_assert(kSendBytes <= kPartBytes, "the receive area holds what a partner sends");
  static_assert(kStages >= 3, "the ring keeps a stage in flight on both sides of the one being read");
  static_assert(kSmemBytes <= kSmemLimit, "one block per SM");
};

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// mbar_wait (kernels/marlin_wgmma_ws.cuh) with its retry loop inside the asm block: ptxas then places the retries,
// and their YIELD, out of line, so a stage whose data has landed costs the consumers' loop one wait and a branch.
__device__ __forceinline__ void mbar_wait_spin(uint32_t bar, uint32_t parity) {
  asm volatile("{\n .reg .pred p;\n WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT;\n}\n"
               ::"r"(bar), "r"(parity) : "memory");
}

// SWAP: the swapped products' C fragments rearranged into the 16-token form's (kernels/mma_frag.h), which the
// reduction and the output take; tokens 8-15, which SWAP never has, are zero. Once per slice: 32 shuffles.
__device__ __forceinline__ void swapped_to_frags(const float (&c)[4][4], float (&acc)[8][4], int lane) {
#pragma unroll
  for (int a = 0; a < 8; ++a) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      // Every lane sends both registers of the pair that holds this (a, e) somewhere; each takes its own.
      const FragSource src = swapped_frag_source(lane, a, e);
      const float x0 = __shfl_sync(0xffffffffu, c[a >> 1][2 * (a & 1)], src.lane);
      const float x1 = __shfl_sync(0xffffffffu, c[a >> 1][2 * (a & 1) + 1], src.lane);
      acc[a][e] = (src.reg & 1) ? x1 : x0;
    }
    acc[a][2] = acc[a][3] = 0.f;
  }
}

// mma_16816 with C = 0 (constants, not the sums' registers): the first product of a run.
template <int DT>
__device__ __forceinline__ void mma_16816_z(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float (&d)[4]) {
  d[0] = d[1] = d[2] = d[3] = 0.f;
  mma_16816<DT>(a, b0, b1, d);
}

// One k16 row of a SWAP consumer warp: its packed word w (four 16-column groups j) expanded and multiplied, unscaled,
// with the row's 8-token B fragment (b0, b1) into d[j]; C = 0 where `fresh` (the first row of a group run).
template <int DT>
__device__ __forceinline__ void swapped_row(uint32_t b0, uint32_t b1, const int4& w, float (&d)[4][4], bool fresh) {
  const uint32_t words[4] = {uint32_t(w.x), uint32_t(w.y), uint32_t(w.z), uint32_t(w.w)};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t v[4];
    dequant8<DT>(words[j], v);
    // The B fragments of n8 tiles 2 j and 2 j + 1 (columns 16 j + lane / 4 and + 8) are, in this order, the A
    // fragment of the 16 columns: rows 0-7 low k, rows 8-15 low k, rows 0-7 high k, rows 8-15 high k.
    const uint32_t w16[4] = {v[0], v[2], v[1], v[3]};
    if (fresh)
      mma_16816_z<DT>(w16, b0, b1, d[j]);
    else
      mma_16816<DT>(w16, b0, b1, d[j]);
  }
}

// One stage of a SWAP consumer warp with group scales: its U = 4 k16 rows (fa: the rows' 8-token B fragments, fb: their
// packed words, fs: the scale words of row pairs 0-1 and 2-3). The products of a run of rows that lie in one group (all
// four; two and two with groups of 32) sum unscaled in fp32, and each run's sums are scaled once and added to acck.
// Why: on the H200 the streaming layers run at the 700 W cap (1.5-1.65 GHz on 70B gate/up and down and on 32768^2,
// where cuBLAS runs at 1.76-1.98), and there the consumers' instructions set the pace. The per-weight scale multiply
// was 64 mul.f16x2 per warp and stage, of about 240 instructions; a run costs 16 fma.f32 and 8 conversions instead.
// H200, same call, two runs each (docs/PERF.md, thirty-seventh session, calls 2 and 4), set sums at m = 1-8, us: 8B
// 41.0-41.2 -> 38.4-38.7, 70B 119.3-127.9 -> 114.4-117.9, 32768^2 g128 161.7-175.3 -> 152.8-161.4. The weights now
// enter the products as the exact integers q - 8 rather than rounded to 16 bits after the scale: one rounding fewer
// per weight (bf16, with 8 significant bits, gains the most).
template <int DT>
__device__ __forceinline__ void swap_grouped_products(const uint32_t (&fa)[4][4], const int4 (&fb)[4],
                                                      const int4 (&fs)[2], float (&acck)[4][4], bool group32) {
  float part[4][4];  // [16-column group j][C fragment] of the current run
  auto products = [&](int u, bool fresh) { swapped_row<DT>(fa[u][0], fa[u][1], fb[u], part, fresh); };
  // Rows g and g + 8 of the swapped C fragment (registers 0-1 and 2-3) are the 16 columns' first and second eight: the
  // low and high half of scale word j, as scale2 applies them to v[0..1] and v[2..3].
  auto flush = [&](const int4& f) {
    const uint32_t sw[4] = {uint32_t(f.x), uint32_t(f.y), uint32_t(f.z), uint32_t(f.w)};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float lo = to_float<DT>(uint16_t(sw[j] & 0xffffu)), hi = to_float<DT>(uint16_t(sw[j] >> 16));
      acck[j][0] = fmaf(part[j][0], lo, acck[j][0]);
      acck[j][1] = fmaf(part[j][1], lo, acck[j][1]);
      acck[j][2] = fmaf(part[j][2], hi, acck[j][2]);
      acck[j][3] = fmaf(part[j][3], hi, acck[j][3]);
    }
  };
  products(0, true);
  products(1, false);
  if (group32) {  // warp-uniform: rows 2-3 are the next group
    flush(fs[0]);
    products(2, true);
  } else {
    products(2, false);
  }
  products(3, false);
  flush(fs[1]);  // groups of 64 or more: the pair's scale row is the same for both pairs
}

template <int DT, bool GROUPED, int TN, bool CLUSTER, bool SWAP>
__global__ void __launch_bounds__(StreamShape<TN, CLUSTER, SWAP>::kThreads, 1)
    marlin_stream_kernel(const KernelArgs p, const __grid_constant__ TmaMaps maps) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = StreamShape<TN, CLUSTER, SWAP>;
  constexpr int U = S::U;
  extern __shared__ __align__(16) unsigned char sh_raw[];
  const uint32_t raw = smem_addr(sh_raw);
  unsigned char* sh = sh_raw + (((raw + S::kAlign - 1) & ~uint32_t(S::kAlign - 1)) - raw);
  const uint32_t ring0 = smem_addr(sh);  // [ring | reduction | partner sums | barriers]
  unsigned char* red_raw = sh + S::kStages * S::kStage;
  constexpr int kRecvOff = S::kStages * S::kStage + S::kRedBytes;  // from ring0; also recv_bar's, below
  constexpr int kRecvBarOff = kRecvOff + S::kRecvBytes + 16 * S::kStages;
  const uint32_t full0 = ring0 + kRecvOff + S::kRecvBytes, empty0 = full0 + 8 * S::kStages;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int k_tiles = p.k / S::kTK, n_tiles = p.n / TN;
  if (tid == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      mbar_init(full0 + 8 * s, 1);                     // the producer's arrive.expect_tx
      mbar_init(empty0 + 8 * s, S::kConsumerThreads);  // each consumer thread once its reads are done
    }
    if constexpr (CLUSTER) {
      mbar_init(ring0 + kRecvBarOff, 1);  // the finisher's arrive.expect_tx of its partner's bytes
      fence_mbarrier_init_cluster();
    }
  }
  __syncthreads();  // barriers initialized before anyone waits on or arrives at them
  if constexpr (CLUSTER) cluster_arrive();  // waited for before the first send into a partner's shared memory
  allow_next_grid();
  tl_mark(p, kTlEntry, tid == 0);
  tl_mark(p, kTlSm, tid == 0);

  // The block's tiles (slice-major tile index): a stripe of p.iters tiles, or with p.split p.rounds whole
  // slices and then part blockIdx % split of a slice, so that the blocks read the same k16 rows of their
  // slices at about the same time (whole rows of B: DRAM locality that staggered stripes lose). As ranges
  // (marlin_dispatch.h, stream_ranges): nr whole slices q * grid + b, then [t0, t1). Walked with running
  // counters: a division per tile cost every streaming layer 7-14% (docs/PERF.md, fourteenth session).
  const int b = blockIdx.x, grid = gridDim.x;
  const StreamRanges ranges = stream_ranges(b, grid, p.rounds, p.split, p.iters, n_tiles, k_tiles);
  const int nr = ranges.rounds, t0 = ranges.t0, t1 = ranges.t1;
  const int tiles = nr * k_tiles + max(t1 - t0, 0);
  const int whole = nr * grid;  // slices that rounds give one block whole

  if (warp == S::kConsumerWarps) {
    // Producer (lane 0 of the last warp): the block's tiles in stripe order, one stage each: one box of
    // weights, one of scales, one of activations (kABoxes pieces). The weights and scales of the first p.prewait
    // tiles go out before the wait for the previous kernel, their activations after it (A may be that
    // kernel's output).
    if (lane != 0) return;
    const int s_rows = GROUPED ? tile_scale_rows(S::kTK, p.group_shift) : 0;
    const uint32_t tx = S::kBBytes + S::kABytes + s_rows * TN * 2;
    const uint64_t weights_policy = l2_evict_first();  // read once: keep L2 for activations and partials
    auto issue = [&](uint32_t stage, uint32_t bar, int it, int what) {  // what: 1 weights + scales, 2 A
      const int slice = it / k_tiles, kt = it - slice * k_tiles;
      if (what & 1) {
        tma_2d_hint(stage, &maps.b, slice * TN, kt * S::kKRows, bar, weights_policy);
        if constexpr (GROUPED)
          tma_2d(stage + S::kBBytes + S::kABytes, &maps.s, slice * TN, (kt * S::kTK) >> p.group_shift, bar);
      }
      // The kABoxes 64-wide pieces of the stage's k range in one copy (A as [k / 64, m, 64]). Why: on the H200
      // the TMA copies per stage, not their bytes, bound one block's stream. Probe (scripts/experiments/
      // stream_copy.cu, `probe boxes`, docs/PERF.md thirty-sixth session), 16 KB weight stages on 132 SMs, GB/s:
      // 0-1 activation boxes 4175-4295, 2D boxes 2 / 4 / 8 3925-3943 / 3318-3365 / 2420-2630, one 3D box of 2 / 4
      // / 8 pieces 4143-4153 (8 with 8 of 16 rows past m 3546-3555). The kernel, same call: 8B set 43.6-44.3 ->
      // 41.0-41.4 us at m = 1-8 (q/k/v 7.4 -> 6.7, down 12.1 -> 10.3), 70B 129.6-136.6 -> 121.7-127.4.
      if (what & 2) tma_3d(stage + S::kBBytes, &maps.a, 0, 0, kt * S::kABoxes, bar);
    };
    const int pre = min(p.prewait, min(S::kStages, tiles));
    // The tile sequence: `it` within range q (whole slice q * grid + b for q < nr, then [t0, t1)).
    int q = 0, it = 0, end = 0;
    auto restart = [&]() { q = 0, it = nr > 0 ? b * k_tiles : t0, end = nr > 0 ? it + k_tiles : t1; };
    auto step = [&]() {
      if (++it == end) {
        ++q;
        it = q < nr ? (q * grid + b) * k_tiles : t0;
        end = q < nr ? it + k_tiles : t1;
      }
    };
    RingPos w;
    restart();
    for (int i = 0; i < pre; ++i, step()) {  // fresh ring: no stage to wait for
      mbar_expect_tx(full0 + 8 * w.st, tx);
      issue(ring0 + w.st * S::kStage, full0 + 8 * w.st, it, 1);
      w.next<S::kStages>();
    }
    wait_previous_grid();
    tl_mark(p, kTlWaited, true);
    w = RingPos{};
    restart();
    for (int i = 0; i < tiles; ++i, step()) {
      if (i >= pre) {
        mbar_wait(empty0 + 8 * w.st, w.phase ^ 1u);  // a fresh barrier counts its previous phase as done
        mbar_expect_tx(full0 + 8 * w.st, tx);
      }
      issue(ring0 + w.st * S::kStage, full0 + 8 * w.st, it, i < pre ? 2 : 3);
      w.next<S::kStages>();
    }
    return;  // every copy lands before the consumers, which wait for each one, let the block exit
  }

  // Consumers.
  wait_previous_grid();  // C, the workspace and its locks are the previous kernel's until it has finished
  const int wn = warp % S::kNB, wk = warp / S::kNB;
  const bool lead = tid == 0;
  bool tl_first = lead;
  // Warp (wn, wk) expands k16 rows wk * U + u of every stage. Activations: 16-byte chunk c of row r of a
  // 64-wide box sits at chunk c ^ (r % 8) (128B swizzle). ldmatrix .x4 (A operand): lanes 0-15 address rows
  // 0-15 at the k16 row's low 8 columns, lanes 16-31 at its high 8; .x2 (SWAP, B operand): lanes 0-7 rows 0-7
  // low, lanes 8-15 high (lanes 16-31 repeat them).
  // Offsets from a stage's shared-window address (the loop keeps that address, not a generic pointer: no window
  // base to recompute per stage). Row u of B is TN * 8 bytes after row 0. Each pair of a warp's rows (32 k from a
  // multiple of 32) lies in one group of scales, so one scale load serves the pair.
  constexpr int kPairs = U / 2;
  int a_off[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int kr = wk * U + u;
    const int a_row = SWAP ? lane & 7 : lane & 15, a_chunk = kr * 2 + (SWAP ? (lane >> 3) & 1 : lane >> 4);
    a_off[u] = S::kBBytes + (a_chunk >> 3) * S::kABox + a_row * 128 + (((a_chunk & 7) ^ (a_row & 7)) << 4);
  }
  const int b_off = wk * U * TN * 8 + (wn * 32 + lane) * 16;
  int s_off[kPairs];
#pragma unroll
  for (int h = 0; h < kPairs; ++h)
    s_off[h] = S::kBBytes + S::kABytes + (((wk * U + 2 * h) * 16) >> p.group_shift) * (TN * 2) + (wn * 8 + (lane >> 2)) * 16;
  RingPos r;
  for (int q = 0; q <= nr; ++q) {
    int it = q < nr ? (q * grid + b) * k_tiles : t0;
    const int it_end = q < nr ? it + k_tiles : t1;
    while (it < it_end) {
      const int slice = it / k_tiles;
      const int cnt = min(it_end, (slice + 1) * k_tiles) - it;
      float acc[S::kAcc][4];   // C fragments (SWAP: set from acck after the k-group sum)
      float acck[S::kAccK][4];  // SWAP: the swapped products while summing k
#pragma unroll
      for (int a = 0; a < S::kAcc; ++a) acc[a][0] = acc[a][1] = acc[a][2] = acc[a][3] = 0.f;
#pragma unroll
      for (int a = 0; a < S::kAccK; ++a) acck[a][0] = acck[a][1] = acck[a][2] = acck[a][3] = 0.f;
      for (int t = 0; t < cnt; ++t) {
        mbar_wait_spin(full0 + 8 * r.st, r.phase);
        tl_mark(p, kTlFirstData, tl_first);
        tl_first = false;
        const uint32_t stage = ring0 + uint32_t(r.st * S::kStage);
        uint32_t fa[U][4];
        int4 fb[U], fs[kPairs] = {};
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if constexpr (SWAP)
            ldmatrix_x2_s(fa[u][0], fa[u][1], stage + a_off[u]);  // the B fragment of 8 tokens
          else
            ldmatrix_x4_s(fa[u], stage + a_off[u]);
          fb[u] = lds128(stage + b_off + u * TN * 8);
        }
        if constexpr (GROUPED)
#pragma unroll
          for (int h = 0; h < kPairs; ++h) fs[h] = lds128(stage + s_off[h]);
        mbar_arrive(empty0 + 8 * r.st);
        r.next<S::kStages>();
        if constexpr (SWAP && GROUPED) {
          static_assert(U == 4 && kPairs == 2, "swap_grouped_products: four k16 rows, two scale rows");
          swap_grouped_products<DT>(fa, fb, fs, acck, p.group_shift == 5);  // groups of 32: two runs of two rows
        } else if constexpr (SWAP) {
#pragma unroll
          for (int u = 0; u < U; ++u) swapped_row<DT>(fa[u][0], fa[u][1], fb[u], acck, false);
        } else {
#pragma unroll
          for (int u = 0; u < U; ++u) {
            const uint32_t words[4] = {uint32_t(fb[u].x), uint32_t(fb[u].y), uint32_t(fb[u].z), uint32_t(fb[u].w)};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              uint32_t v[4];
              dequant8<DT>(words[j], v);
              if constexpr (GROUPED) {
                const int4& f = fs[u / 2];
                const uint32_t sw = uint32_t(j == 0 ? f.x : j == 1 ? f.y : j == 2 ? f.z : f.w);
                scale2<DT, false>(v[0], v[1], sw);
                scale2<DT, true>(v[2], v[3], sw);
              }
              mma_16816<DT>(fa[u], v[0], v[1], acc[2 * j]);
              mma_16816<DT>(fa[u], v[2], v[3], acc[2 * j + 1]);
            }
          }
        }
      }
      tl_mark(p, kTlComputed, lead);

      // The k-groups of each column block, summed in a fixed tree through shared memory.
      if constexpr (SWAP) {
        reduce_kgroups<S::kKG, S::kNB, S::kAccK, S::kBar, S::kConsumerThreads, S::kRedRadix>(
            reinterpret_cast<float4*>(red_raw), acck, wk, wn, lane);
      } else {
        reduce_kgroups<S::kKG, S::kNB, S::kAcc, S::kBar, S::kConsumerThreads, S::kRedRadix>(
            reinterpret_cast<float4*>(red_raw), acc, wk, wn, lane);
      }

      // The reduction across the blocks that share the slice and the output, as in marlin_kernel.
      const int first_b = slice < whole  ? b
                          : p.split > 0 ? (slice - whole) * p.split
                                        : slice_first_block(0, slice, k_tiles, p.iters);
      const int last_b = slice < whole  ? b
                         : p.split > 0 ? first_b + p.split - 1
                                       : slice_last_block(0, slice, k_tiles, p.iters);
      // CLUSTER: a split slice's blocks are one cluster (rank b - first_b): the partner sends its sums into the
      // finisher's shared memory (st.async, counted on its recv_bar) and is done; the finisher adds them in
      // rank order, as the deposits in finish_slice_frags in block order, and writes C alone. No global-memory
      // round trip, fence or counter (docs/PERF.md, sixteenth session).
      const bool clustered = CLUSTER && last_b > first_b;
      // The holders' k-group sums (SWAP: still swapped; swapped_to_frags only moves values, so converting after
      // the partner's sums are added gives the same fp32 additions in the same order, on half the bytes sent).
      float(*const sums)[4] = SWAP ? acck : acc;  // [S::kAccK][4]
      if (clustered) cluster_wait();  // every block of the cluster has initialized its barriers
      if (clustered && b > first_b) {
        if (wk == 0) {
          const uint32_t dst = map_to_rank(ring0 + kRecvOff + ((b - first_b - 1) * S::kNB + wn) * S::kAccK * 512 + lane * 16, 0);
          const uint32_t bar = map_to_rank(ring0 + kRecvBarOff, 0);
#pragma unroll
          for (int a = 0; a < S::kAccK; ++a) st_async_f4(dst + a * 512, sums[a], bar);
        }
      } else {
        if (clustered) {
          const uint32_t recv_bar = ring0 + kRecvBarOff;
          if (tid == 0) mbar_expect_tx(recv_bar, uint32_t(last_b - first_b) * S::kSendBytes);
          if (wk == 0) {
            const float4* recv = reinterpret_cast<const float4*>(sh + kRecvOff);
            mbar_wait(recv_bar, 0);  // one split slice per block and launch: the barrier's first phase
#pragma unroll
            for (int q = 0; q < S::kMaxCluster - 1; ++q)  // unrolled: a loop of unknown count spilled acc
              if (q < last_b - first_b)
#pragma unroll
                for (int a = 0; a < S::kAccK; ++a) {
                  const float4 v = recv[((q * S::kNB + wn) * S::kAccK + a) * 32 + lane];
                  float(&x)[4] = sums[a];
                  x[0] += v.x, x[1] += v.y, x[2] += v.z, x[3] += v.w;
                }
          }
          tl_mark(p, kTlReduced, lead);
        }
        if constexpr (SWAP)
          if (wk == 0) swapped_to_frags(acck, acc, lane);  // the holders (warp-uniform) hold the k-group sums
        finish_slice_frags<DT, GROUPED, 1, S::kRows, TN, S::kBar, S::kConsumerThreads>(
            p, acc, slice, clustered ? b : first_b, clustered ? b : last_b, 0, 0, p.m, wk == 0, wn, lane);
      }
      it += cnt;
    }
  }
  tl_mark(p, kTlExit, lead);
#else
  __trap();  // built only for sm_90a; the host never launches it elsewhere
#endif
}

template <int DT, int TN, bool CL, bool SW>
cudaError_t stream_prepare(int* blocks_per_sm, int* smem_bytes) {
  using S = StreamShape<TN, CL, SW>;
  return prepare_variants(marlin_stream_kernel<DT, false, TN, CL, SW>, marlin_stream_kernel<DT, true, TN, CL, SW>,
                          S::kThreads, S::kSmemBytes, blocks_per_sm, smem_bytes);
}

template <int DT, int TN, bool CL, bool SW>
cudaError_t stream_launch(const KernelArgs& a, const TmaMaps& maps, const LaunchOpts& o, cudaStream_t stream) {
  return launch_variant(marlin_stream_kernel<DT, false, TN, CL, SW>, marlin_stream_kernel<DT, true, TN, CL, SW>,
                        StreamShape<TN, CL, SW>::kThreads, a, o, stream, maps);
}

template <int DT, int TN, bool SW>
cudaError_t stream_max_clusters(int size, const LaunchOpts& o, int* clusters) {
  return max_active_clusters(marlin_stream_kernel<DT, false, TN, true, SW>, marlin_stream_kernel<DT, true, TN, true, SW>,
                             StreamShape<TN, true, SW>::kThreads, size, o, clusters);
}

#define MARLINC_INSTANTIATE_STREAM_CL(DT, TN, CL, SW)                                                      \
  template cudaError_t stream_prepare<DT, TN, CL, SW>(int*, int*);                                         \
  template cudaError_t stream_launch<DT, TN, CL, SW>(const KernelArgs&, const TmaMaps&, const LaunchOpts&,   \
                                                     cudaStream_t);
#define MARLINC_INSTANTIATE_STREAM_SW(DT, TN, SW)                                                           \
  MARLINC_INSTANTIATE_STREAM_CL(DT, TN, false, SW)                                                         \
  MARLINC_INSTANTIATE_STREAM_CL(DT, TN, true, SW)                                                          \
  template cudaError_t stream_max_clusters<DT, TN, SW>(int, const LaunchOpts&, int*);
#define MARLINC_INSTANTIATE_STREAM(DT, TN) MARLINC_INSTANTIATE_STREAM_SW(DT, TN, false) MARLINC_INSTANTIATE_STREAM_SW(DT, TN, true)

}  // namespace marlinc::kernels::detail
