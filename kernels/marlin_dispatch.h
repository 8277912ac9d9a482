// Which kernel MarlinPath::Auto runs on a device where the Hopper (sm_90a, wgmma) kernel can run (a 9.0
// device, sm_90a code, n % 256 == 0): plain C++, so that the rule is tested on machines without a GPU
// (tests/kernels/test_marlin_dispatch.cpp). The launcher (kernels/marlin.cu) applies it.
//
// Measured on the H100 (docs/PERF.md, 2026-11-23), against the mma.sync kernel and dequantize + cuBLAS:
// - m <= 8 (block-synchronous pipeline, 8-row tiles), per layer over four runs: faster on layers of
//   2^24 to 2^28 weights (8B q/k/v 9.5-10.1 vs 10.4-12.1 us, 8B down 15.4-16.6 vs 15.8-18.5, 70B o, q/k/v
//   and down 1-7%), level on 8B gate/up, slower on 8B o (2^24: 8.4 vs 7.6) and on 2^28.8 and more (70B
//   gate/up 87.5 vs 85.8, 32768^2 per-channel 183.5 vs 181.3).
// - m = 9 to 16 (16-row tiles), per layer over four runs: faster on 8B gate/up (2^26.8: 27.2 vs 28.4 us)
//   and 70B down (2^27.8: 50.3-51.0 vs 53.4-53.6), level on 70B q/k/v (2^26.3) and gate/up, slower on 8B
//   o, q/k/v, down and 70B o (8192^2: 17.9 vs 17.3). Derived from those per-layer times and not timed as
//   a set: a set's time is the sum of its layers'.
// - m = 17 to 32: until the forty-first session the block-synchronous pipeline's 32-row tiles, faster than mma.sync
//   on layers of 2^25 weights or more only (70B m = 32: 215 vs 271 us; 8B o 13.7 vs 10.4). Since then the producer
//   warpgroup's 32-row tiles, with its k-split (marlin_partition.h, wgmma_split_parts), from kWgmma64MinLayer weights:
//   H200 (docs/PERF.md, forty-first session, calls 3 and 4), µs at m = 17 / 32, mma.sync -> 32-row producer tiles:
//   8B o 10.3 / 10.5 -> 8.6 / 8.7, 3584 x 3584 10.5 / 11.0 -> 7.7 / 7.9, 2048 x 2048 7.1 / 7.6 -> 6.5 / 6.5; block-
//   synchronous -> producer tiles: 8B down 21.2 / 21.7 -> 15.3 / 15.4, 70B o 20.4 / 21.1 -> 16.3 / 16.9.
// - m = 33 to 64 (producer warpgroup, 64-row tiles; 48-row ones at m = 33-48 since the forty-first session, kernels/
//   marlin.cu, wgmma_rows_for: 8B set 67.0-68.6 -> 62.4-64.2 us, 70B 217-232 -> 204-216, H200, call 5): faster on every
//   set, small layers included (8B m = 64: 89 us against 118 for the best mma.sync tiles, 70B 274 vs 428). Below
//   kWgmma64MinLayer weights mma.sync: H200 (docs/PERF.md, forty-first session, call 2, the k-split in place), µs at
//   m = 33 / 64, mma.sync against Hopper: 2048 x 1024 7.3 / 7.6 against 8.2 / 8.3, 1536 x 2048 6.6 / 6.9 against 7.3;
//   at 2^22 a tie (2048 x 2048 7.4 / 7.6 against 7.3 / 7.6), above it Hopper (2048 x 3072 10.0 / 10.2 against 7.7 /
//   7.8). Below 2^22 the 32-row tiles at m = 17-32 won on some layers and lost on others (1024 x 1024 6.2 -> 5.3,
//   1536 x 1536 6.4 -> 7.4 at m = 17).
// - m = 65 to 2048 (producer warpgroup, 128-row tiles; on narrow layers 128 x 128 ones since the thirty-first
//   session, 64-row ones before: wgmma_prefer_128x128 below; from m = 129 fit tiles of 144-240 rows where they pad
//   m less, since the thirty-third: wgmma_fit_rows, and per layer where whole slices need more chunks of them, since
//   the thirty-fourth: wgmma_fit_plan; 128 x 192 tiles where n % 192 == 0 gives whole slices, since the thirty-fifth:
//   wgmma_prefer_192; 128 x 128 tiles over fit stripes cut in many parts on small shallow layers since the forty-
//   third: wgmma_fit_split_shallow): faster on every set, by 1.7-2.1x over mma.sync, and faster
//   than dequantize + cuBLAS at m = 1024 (70B 2973 vs 4509 us, 8B 782 vs 1024). Tiny layers (up to 2.6 M weights)
//   take dequantize + cuBLAS at m = 129-512 since the forty-second session, 129-896 since the forty-fourth
//   (kWgmmaTinyDqMaxLayer below). Layers with n % 256 != 0 but n % 128 == 0 take the Hopper kernel's 128-column
//   tiles above m = 64 since the forty-third, where hopper_n128_pick (below) says.
// - m = 17 to 240, one row chunk: where the slices split along k into four or more parts of one block each, the
//   Hopper kernel's blocks finish each slice together (marlin_partition.h, wgmma_split_parts, since the fortieth
//   session; from m = 17 since the forty-first).
// - m = 2048: faster than dequantize + cuBLAS on both layers timed (8B qkv 192 vs 200 us, 70B down 1564
//   vs 2294). m = 4096: on 70B down still faster (3186 vs 3740), on 8B qkv (2^24.6 weights) a tie that
//   dequantize + cuBLAS wins (366 vs 360): above 2048 small layers take that path, above 4096 all do
//   (not measured beyond; cuBLAS's own GEMM runs closer to the tensor peak as m grows).
//
// Before that rule, at m <= 16: the streaming kernel on a 9.0 device where stream_auto holds, then on any
// device whole-k stripes (whole_k_stripes below).
#pragma once
#include <cstdint>

#include "kernels/marlin_partition.h"

namespace marlinc::kernels {

// m <= 16: the mma.sync kernel's 128x128 tile gives each block one whole column slice (k deep, no
// cross-block reduction) where the n / 128 slices fill 75-100% of the SM slots (`slots` = SMs x 2
// blocks). Measured on the H100 (docs/PERF.md, tenth session), Auto's set sums against the previous
// rule in one call, two runs each: Llama-3-8B (gate/up: 224 slices on 264 slots, before on the Hopper
// kernel) 58.3-58.4 -> 57.0-57.3 us at m = 1, 63.4-63.6 -> 60.9-61.0 at m = 16; 32768^2 (256 slices)
// per-channel 190.0-191.3 -> 181.1-182.2 at m = 8 and 195.0-196.0 -> 183.0-183.2 at m = 16, g128 level.
// Whole-k on the 64x256 tile lost on 70B gate/up (224 slices of 8192 x 256: the 70B set 172.3-172.5
// against 166.8-167.4 us at m = 1), so only the 128x128 tile takes it. With fewer slices the idle SMs
// cost more than the reduction saves (8B o on 64 blocks: 10.3-10.7 against 7.6 us).
constexpr int kWholeKMaxM = 16;
constexpr int kWholeKTileN = 128, kWholeKTileK = 128;
constexpr int kWholeKMinFillPct = 75;
constexpr bool whole_k_stripes(int m, int n, int k, int slots) {
  if (m < 1 || m > kWholeKMaxM || slots < 1 || n % kWholeKTileN != 0 || k % kWholeKTileK != 0) return false;
  const int64_t slices = n / kWholeKTileN;
  return slices <= slots && slices * 100 >= int64_t(slots) * kWholeKMinFillPct;
}

// The mma.sync kernel's blocks per column slice on shallow layers (m <= 64), where the stripes' partial tiles cost more
// than the depth they cut: a slice shared by several blocks waits for their fp32 deposits, about 1.5 us plus 0.3 per
// deposit, while a 128-deep tile streams in about 0.3 us. So whole slices (1) up to kMmaWholeMaxK deep (at m <= 16 up
// to kMmaWholeMaxK16), kMmaFewParts parts up to kMmaFewPartsMaxK deep at m <= 32; 0 elsewhere (the plain stripes).
// The grid shrinks to fit (marlin_partition.h, mma_parts_blocks), so a layer with more slices than blocks keeps its
// stripes. H200 (docs/PERF.md, forty-second session, call 3), us at m = 1 / 16 / 32 / 64, stripes -> this rule:
// - whole: 896 x 896 5.1 / 5.8 / 6.4 / 6.6 -> 3.2 / 3.4 / 4.5 / 4.5, 896 x 1152 5.1 / 5.8 / 6.3 / 6.7 -> 3.2 / 3.5 /
//   4.5 / 4.5, 1024 x 1152 5.4 / 6.2 / 6.8 / 6.2 -> 3.5 / 3.6 / 4.9 / 5.0, 1152 x 1536 5.7 / 6.6 / 7.2 / 8.0 -> 3.8 /
//   3.9 / 5.4 / 5.5; 1536 x 1536 5.3 / 6.0 -> 4.6 / 4.7 (at m = 48 9.4 against 6.7: not past m = 16);
// - four parts: 2048 x 1024 7.3 / 8.6 / 9.3 -> 5.1 / 5.6 / 6.9, 3072 x 1024 6.7 / 7.7 / 8.7 -> 5.9 / 6.3 / 8.1, 1536 x
//   1536 at m = 32 6.8 -> 6.5 (at m = 48-64 level or slower: 3072 x 1024 8.0 / 8.1 -> 8.4 / 8.7);
// - left alone: 4864 and 6912 deep, where the stripes were fastest from m = 32 (4864 x 896 11.2 against 12.0-18.3).
// Llama-3's layers (4096 deep and more) keep their stripes. On a Hopper device the streaming kernel takes most layers
// 1536-3072 deep at m <= 16 before this rule applies (stream_small_stripes, below).
constexpr int kMmaWholeMaxK = 1152, kMmaWholeMaxK16 = 1536;
constexpr int kMmaFewParts = 4, kMmaFewPartsMaxK = 3072, kMmaFewPartsMaxM = 32;
constexpr int mma_auto_parts(int m, int k) {
  if (m < 1 || m > 64) return 0;
  if (k <= kMmaWholeMaxK || (m <= 16 && k <= kMmaWholeMaxK16)) return 1;
  return m <= kMmaFewPartsMaxM && k <= kMmaFewPartsMaxK ? kMmaFewParts : 0;
}

// m <= 16 on the Hopper device: the streaming kernel (kernels/sm90/marlin_stream.cuh, one block per SM fed
// by TMA). stream_plan picks its slice width and k-split: blocks = slices x split at most one per SM, the
// split that keeps the most SMs busy, the narrower slice on ties (fewer partial tiles); split 0 (stripes
// of the stripe partition) where no plan fills 75% of the SMs. Blocks of one part index then read the
// same k16 rows of every slice at about the same time, which staggered stripes do not (2D TMA over one
// block per SM: 3.05 TB/s with aligned fronts, 2.74 TB/s staggered; scripts/experiments/stream_copy.cu).
// With more slices than SMs, a plan in rounds keeps the fronts aligned too: `rounds` rounds in which every
// block owns one whole slice, then the remaining slices split `split` ways (stream_ranges). It is taken only
// where it fills the SMs strictly better than every plan without rounds (70B gate/up: 448 slices of 128 on
// 132 SMs, 3 rounds and 52 slices in halves, 97%; its 224 slices of 256 had only stripes). H100 (docs/PERF.md,
// fourteenth session), same call, two runs each: 70B gate/up on it against the mma.sync stripes Auto took
// before, 85.9-86.3 -> 84.0-85.3 us at m = 1, 88-90 -> 85-87 at m = 4-8, 95-96 -> 88-90 at m = 16.
constexpr int kStreamMaxM = 16;
// Up to this m the streaming kernel takes its swapped form (sm90/marlin_stream.cuh, SWAP): the weights as the
// mma's 16-row operand and 8 tokens as its 8-column one, half the tensor-core products of the 16-token form.
// H100, same call, two runs each (docs/PERF.md, twentieth session), Auto's set sums at m = 1 / 4 / 8: 70B
// 160.1-160.5 / 159.7-159.9 / 159.6-162.2 -> 155.9-156.1 / 156.4-156.5 / 155.9-156.2 us, 8B gate/up 22.5-23.0 ->
// 21.2-21.4 us; after 1.5 s of back-to-back calls (`bench_marlin --soak`), 70B at m = 1 / 8 164.9 / 172.8 -> 158.8 /
// 158.9 us (one stage more than now), with the SM clock under the power cap up by as much as 157 MHz.
constexpr int kStreamSwapMaxM = 8;
// The slice widths the kernel is built for. The fill search below takes 128 and 256; 64 only by the short rule
// (stream_short_plan), where it cuts slices into fewer parts (stream_fewest_parts), or when a caller forces it
// (MarlinGemm::thread_n).
constexpr int kStreamTn[3] = {64, 128, 256};
constexpr int kStreamMinFillPct = 75;
// A stage holds 32 packed 16x64 blocks (two per consumer warp): 512 deep at 64 columns, 256 at 128, 128 at 256.
constexpr int stream_tk(int tn) { return 32768 / tn; }
// Whether slices of `tn` columns and whole stages tile the layer.
constexpr bool stream_width_fits(int n, int k, int tn) { return n % tn == 0 && k % stream_tk(tn) == 0; }
// The parts each of `slices` slices of `deep` stages splits into where they share `sms` SMs (one block each).
constexpr int stream_split(int slices, int deep, int sms) { return sms / slices < deep ? sms / slices : deep; }
struct StreamPlan { int tn = 0, split = 0, rounds = 0; };  // tn 0: no width fits n and k
constexpr int kStreamClusterSplit = 2;  // slices split this many ways run as clusters (kernels/marlin.cu)
// The short rule: on layers whose 64-column slices fit one wave (no rounds at any width), a plan whose slices are
// whole or in halves (no deposit in the workspace: halves run as two-block clusters), wherever one fills 70% of the
// SMs: the most blocks, the wider slice on ties (half the activation reads; below). Such a plan beats the fill
// search's deeper splits, whose finisher waits for 3-8 deposits; Auto takes the streaming kernel wherever it applies
// (stream_auto). Wider layers keep the fill search, whose rounds fill the SMs better.
// H100, same calls (docs/PERF.md, twentieth session), µs at m = 1 / 8 / 16:
// - 8B o, 64 slices of 64 in halves: 6.6 / 6.5 / 7.1 against Auto's 7.6 / 7.7 / 8.1 before (mma.sync 128 x 64)
//   and the search's 128-column quarters 8.4 / 8.4 / 9.3;
// - 8B down, the same plan: 13.5 / 13.5 / 14.5 against 15.1-15.3 (Hopper kernel) and 16.2 (quarters at m = 16);
// - 8B q/k/v, 48 slices of 128 in halves (96 blocks, 73%): 8.0-8.2 / 8.0 / 8.7 against 9.4-11.6 (Hopper kernel),
//   10.8-10.9 (mma.sync at m = 16) and the search's 256-column fifths 10.6-10.9 / 10.9 / 11.7; whole slices of
//   64 (the tie) 7.9-8.3 / 7.9 / 8.7;
// - 70B o and down keep the search's plan (128-column halves; whole slices of 64 tie and measured level or
//   slower: 70B o 14.1 / 13.9 / 15.3 against 14.1 / 14.0 / 14.9, 70B down 42.7-53.6 against 41.3-44.2).
// Ties go to the narrower slice below kStreamShortNarrowTieLayer weights: 8B q/k/v then takes 96 whole slices of 64
// (no cluster exchange) instead of 48 of 128 in halves. H100, two calls, two runs each (docs/PERF.md,
// twenty-seventh session), µs at m = 1 / 9 / 16: 7.61-7.64 / 8.13-8.17 / 8.06-8.17 -> 7.34-7.45 / 7.95-8.05 /
// 7.94-8.04. On 70B o and down (2^26 and more) the narrower lost: 13.45 -> 13.67 and 40.0 -> 40.6 at m = 1.
// Until the thirty-ninth session the rule began at 2^24 weights, the smallest Llama-3 layer (8B o); below it Auto ran
// the mma.sync kernel, which the short plans beat on the narrower layers of other models. H200 (docs/PERF.md,
// thirty-ninth session, call 4), same call, two runs each, µs at m = 1 / 16, mma.sync -> 64-column halves: 3072 x 3072
// (Llama-3.2-3B o) 8.1 / 8.8 -> 4.0 / 4.7, 3584 x 3584 (Qwen2.5-7B o) 8.5 / 9.2 -> 4.8 / 5.5, 2048 x 3072
// (Llama-3.2-1B q/k/v) 8.0-8.3 / 8.2-8.3 -> 3.7 / 3.9.
constexpr int64_t kStreamShortNarrowTieLayer = int64_t(1) << 25;
constexpr int kStreamShortMinFillPct = 70;
constexpr StreamPlan stream_short_plan(int n, int k, int sms) {
  StreamPlan best;
  int64_t best_blocks = 0;
  if (sms < 1 || n / kStreamTn[0] > sms) return best;
  const bool wider_on_ties = int64_t(n) * k >= kStreamShortNarrowTieLayer;
  for (int tn : kStreamTn) {  // narrowest first
    if (!stream_width_fits(n, k, tn)) continue;
    const int64_t slices = n / tn, deep = k / stream_tk(tn);
    for (int split = 1; split <= kStreamClusterSplit && split <= deep; ++split) {
      const int64_t blocks = slices * split;
      if (blocks > sms || blocks * 100 < int64_t(sms) * kStreamShortMinFillPct) continue;
      if (blocks > best_blocks || (blocks == best_blocks && wider_on_ties)) best_blocks = blocks, best = {tn, split, 0};
    }
  }
  return best;
}
// A plan without rounds that fills kStreamMinFillPct of the SMs with fewer parts per slice than `best` (the fill
// search's pick), the fewest, 64-column slices included; `best` where none does. Each part more gives the slice's
// finisher one more deposit to wait for and add, which costs more than the better fill gains. H200 (docs/PERF.md,
// thirty-ninth session, call 2, --explore), µs at m = 1 / 16, 128-column slices against 256-column ones at about the
// same bytes per block: 3584 x 4608 (3 against 7 parts) 6.1 / 7.5 against 7.4 / 9.6, 3072 x 3072 (5 against 11) 5.6 /
// 6.8 against 7.3 / 9.6, 18944 x 3584 (4 against 9) 13.0 / 15.9 against 14.2 / 17.5; and 64 against 128 columns (call
// 5): 2048 x 2048 (4 against 8 parts) 4.5 / 4.9 against 5.5 / 6.5, 8192 x 2048 (4 against 8) 6.5 / 7.4 against 7.8 /
// 9.6. The Llama-3 layers the fill search plans have one candidate only (70B q/k/v: 80 slices of 128 fill 61%, 160 of
// 64 are more than the SMs), or rounds.
constexpr StreamPlan stream_fewest_parts(int n, int k, int sms, StreamPlan best) {
  for (int tn : kStreamTn) {
    if (!stream_width_fits(n, k, tn) || n / tn > sms) continue;
    const int slices = n / tn, split = stream_split(slices, k / stream_tk(tn), sms);
    if (split < best.split && int64_t(slices) * split * 100 >= int64_t(sms) * kStreamMinFillPct) best = {tn, split, 0};
  }
  return best;
}
// The fill search alone (stream_plan without the short rule).
constexpr StreamPlan stream_fill_plan(int n, int k, int sms, int tn_forced) {
  StreamPlan best;
  // Fill as a fraction num / den of the SMs' time: slices x split / (sms x (rounds x split + 1)) in rounds,
  // slices x split / sms without.
  int64_t best_num = 0, best_den = 1;
  for (int pass = 0; pass < 2; ++pass)  // plans without rounds first: rounds must beat them strictly
    for (int tn : kStreamTn) {
      if (tn_forced != 0 ? tn != tn_forced : tn == kStreamTn[0]) continue;
      if (!stream_width_fits(n, k, tn) || sms < 1) continue;
      if (best.tn == 0) best.tn = tn;
      const int slices = n / tn, deep = k / stream_tk(tn);
      if ((slices > sms) != (pass == 1)) continue;
      const int rounds = pass == 1 ? slices / sms : 0, rest = slices - rounds * sms;
      const int split = rest > 0 ? stream_split(rest, deep, sms) : (deep < 1 ? deep : 1);
      const int64_t num = int64_t(slices) * split, den = int64_t(rounds) * split + (rest > 0 ? 1 : 0);
      if (num * best_den > best_num * den) best_num = num, best_den = den, best = {tn, split, rounds};
    }
  if (best_num * 100 < int64_t(sms) * kStreamMinFillPct * best_den) {
    best.split = 0, best.rounds = 0;
    if (tn_forced == 0 && n % 256 == 0 && k % stream_tk(256) == 0) best.tn = 256;  // stripes: fewer slices
  } else if (tn_forced == 0 && best.rounds == 0) {
    best = stream_fewest_parts(n, k, sms, best);
  }
  return best;
}
// Small layers that neither the short rule nor the fill search plans (too few slices to fill the SMs): stripes of
// 64-column slices, one 512-deep stage a block where the stripes are short, up to kStreamSmallMaxLayer weights and
// kStreamSmallMinK to kStreamSmallMaxK deep (three to six stages: as many deposits per slice as were timed). Against
// the mma.sync kernel's whole slices or four parts (mma_auto_parts) they cost a deposit per stage but stream each
// block's one stage by TMA. H200 (docs/PERF.md, forty-second session; call 5, Auto before and after, two runs each:
// 1536 x 1536 5.3 -> 4.1 us at m = 1, 2048 x 1024 7.3 -> 4.3, 3072 x 1024 6.6-6.7 -> 4.9; call 4, --explore), us at m =
// 1 / 8 / 16, mma.sync -> 64-column stripes: 1536 x 1536 4.7 / 4.7 / 4.7 -> 4.2 / 4.2 / 4.5, 1536 x 2048 4.7 / 4.7 /
// 4.7 -> 4.2 / 4.2 / 4.6, 2048 x 1024 5.2 / 5.2 / 5.7 -> 4.3 / 4.4 / 4.8, 3072 x 1024 5.9 / 5.9 / 6.4 -> 4.9 / 5.0 /
// 5.5; 1024 deep (two stages) they lost to whole slices: 1024 x 1152 3.5 / 3.6 / 3.7 against 3.7 / 3.6 / 4.0.
constexpr int64_t kStreamSmallMaxLayer = int64_t(1) << 22;
constexpr int kStreamSmallMinK = 3 * 512, kStreamSmallMaxK = 6 * 512;
constexpr bool stream_small_stripes(int n, int k) {
  return int64_t(n) * k <= kStreamSmallMaxLayer && k >= kStreamSmallMinK && k <= kStreamSmallMaxK &&
         stream_width_fits(n, k, kStreamTn[0]);
}
constexpr StreamPlan stream_plan(int n, int k, int sms, int tn_forced) {
  if (tn_forced == 0) {
    const StreamPlan s = stream_short_plan(n, k, sms);
    if (s.tn != 0) return s;
  }
  const StreamPlan f = stream_fill_plan(n, k, sms, tn_forced);
  if (tn_forced == 0 && f.split == 0 && f.rounds == 0 && stream_small_stripes(n, k)) return {kStreamTn[0], 0, 0};
  return f;
}
// A block's tiles in the streaming kernel (slice-major tile index), as ranges: `rounds` whole slices
// r x grid + b (r < rounds), then [t0, t1): part b % split of slice rounds x grid + b / split (empty where
// that slice does not exist), or with split 0 the block's stripe of `iters` tiles (t1 < t0: none).
struct StreamRanges { int rounds, t0, t1; };
constexpr StreamRanges stream_ranges(int b, int grid, int rounds, int split, int iters, int n_tiles, int k_tiles) {
  if (split <= 0) {
    const int t0 = b * iters, nk = n_tiles * k_tiles;
    return {0, t0, t0 + iters < nk ? t0 + iters : nk};
  }
  const int tail = rounds * grid + b / split, part = b % split, t0 = tail * k_tiles + part * k_tiles / split;
  return {rounds, t0, tail < n_tiles ? tail * k_tiles + (part + 1) * k_tiles / split : t0};
}

// Where Auto takes the streaming kernel (H100, docs/PERF.md, eleventh session; per layer, two runs each,
// against the kernels Auto took before): where stream_plan splits (stripes lost everywhere they were timed, e.g. 70B
// gate/up 89.6 against 85.9 us at m = 1; in rounds it now splits, above). Faster: 8B gate/up at m <= 4
// (23.4-23.7 against 24.1-24.3 us), 8B down at m = 16 (16.0 against 17.0), 70B o at m = 16 (16.0 against
// 17.1), 70B down at m = 2..16 (45.9-46.4 against 46.6-49.9), 32768^2 g128 at m = 4..16 (181-187 against
// 197-221); level on 70B down at m = 1, 70B q/k/v at m = 16 and 32768^2 at m <= 2 and per-channel. Slower
// on the smaller layers the thresholds leave out (8B q/k/v 10.6-12.0 against 9.4-10.8, 8B o 8.9-9.4
// against 7.5-8.0, 70B o at m <= 8 16.0-16.3 against 15.7-15.9, 70B q/k/v at m <= 8 19.5-19.8 against
// 19.0-19.2, 8B down at m = 1 and 4 15.6 against 15.2).
// The m <= 8 threshold was 3 x 2^25, with layers from 2^26 let in where the plan splits the slices in two (run as
// two-block clusters, kernels/marlin.cu kStreamClusterSplit, whose tail is short). H100 (docs/PERF.md, sixteenth
// session), one call, two runs, µs: 70B o (2^26, 64 slices of 128 in halves) 16.3-16.8 / 15.7-15.9 / 15.8 on the
// Hopper kernel against 15.0 / 14.8-14.9 / 14.8 at m = 1 / 4 / 8; 70B q/k/v (2^26.3, 40 slices of 256 in thirds: no
// cluster) level, 19.0-19.1 against 18.9-19.2. Since the thirty-sixth session the threshold is 2^26 whatever the split,
// which takes in 70B q/k/v too: faster on the H200, whose weight stream the Hopper kernel's plan leaves further behind,
// 18.7-18.9 -> 15.3 us at m = 1 (docs/PERF.md, thirty-sixth session, call 4, --explore).
// Since the thirty-ninth session there is no threshold (it was 2^26 weights at m <= 8 and 3 x 2^24 at m = 9..16): the
// small layers it was set against take the short rule now, and the ones it still kept out, narrower than Llama-3's,
// stream faster than the kernels Auto gave them. H200 (docs/PERF.md, thirty-ninth session, call 4), same call, two
// runs each, µs at m = 1 / 16, before -> the fill search's plan (slice width x parts): 3584 x 4608 (mma.sync; 128 x 3)
// 8.8-8.9 / 9.4 -> 6.2 / 7.6, 3072 x 5120 (mma.sync; 128 x 3) 7.2 / 7.6 -> 6.0 / 7.2, 5120 x 5120 (Hopper kernel,
// mma.sync; 128 x 3) 9.2 / 11.8 -> 7.4 / 8.9, 2048 x 16384 (Hopper, mma.sync; 128 x 1) 9.4-9.5 / 10.4-10.5 -> 6.6-6.7
// / 8.5, 3072 x 16384 at m <= 8 (Hopper; 128 x 1) 12.3 -> 8.5, 2048 x 2048 (mma.sync; 128 x 8) 6.0 / 6.8 -> 5.5 /
// 6.6, 8192 x 2048 (mma.sync; 128 x 8) 8.5 / 9.3 -> 7.9 / 9.6, slower at m = 9..16; both take 64 x 4 since call 5
// (stream_fewest_parts): 4.5 / 4.9 and 6.9 / 7.3 in call 7.
constexpr bool stream_auto(int m, int n, int k, int sms) {
  if (m < 1 || m > kStreamMaxM) return false;
  if (stream_short_plan(n, k, sms).tn != 0) return true;  // the short rule (above): measured at m = 1-16
  const StreamPlan p = stream_fill_plan(n, k, sms, 0);
  return p.tn != 0 && (p.split > 0 || (p.rounds == 0 && stream_small_stripes(n, k)));
}

// m > 64 on the Hopper kernel: 128 x 256 tiles, or 128 x 128 ones where the 128 x 256 partition leaves so few
// output tiles T = n / 256 x ceil(m / 128) that each is split across many blocks and the in-order finisher's
// reduction outweighs the work. The measure is the partial tiles the finisher reads per k tile a block computes,
// (sms / T - 1) / (T (k / 64) / sms); 128 x 128 from kWgmmaNarrowPct / 100 up, on layers up to kWgmmaNarrowMaxK
// deep. The 128 x 128 tile (one m64n128 wgmma per warpgroup and k16 step, one packed word per warp) has twice the
// tiles of 128 x 256; per product it is slower (3-16% on the layers that keep 128 x 256 below), and it replaces the
// 64-row tiles this rule picked before, which had the same tile count and a slower main loop (25-40% at m >= 512,
// docs/PERF.md, thirty-first session, call 6). H100 (same, call 7), µs per layer, Auto before against 128 x 128, two
// runs each (the measure in brackets):
// - faster: 8B q/k/v at m = 128 (0.39) 17.4-17.5 -> 15.4-15.5, 8B o at 128 (0.94) 14.6-15.4 -> 13.3-13.4, 8B down
//   at 128 (0.27) 31.1-32.4 -> 28.5-28.6, 8B q/k/v at 256 (0.075) 27.0-29.6 -> 23.6, 8B o at 256 (0.20) 18.7-19.4 ->
//   17.1-17.5, 8B down at 256 (0.058) 59.1-62.7 -> 58.1-59.7, 8B o at 512 (0.034, pairs before) 31.7-32.2 -> 27.0-29.0,
//   70B q/k/v at 128 (0.059) 43.7-44.0 -> 39.6-40.4, 70B o at 128 (0.10) 36.7-39.6 -> 34.5;
// - slower: 70B down at 128 (0.029, k = 28672) 100.6-100.7 -> 106.5-107.5, 8B down at 512 (0.010) 86.5-88.3 ->
//   96.2-101.8, 70B o at 256 (0.017) 61.6-62.8 -> 63.1-64.7, and every layer with T >= sms;
// - below the threshold and 4% faster, left out: 8B q/k/v at 512 (0.008) and 70B q/k/v at 256 (0.008).
constexpr int kWgmmaNarrowPct = 3;
constexpr int kWgmmaNarrowMaxK = 16384;
constexpr int kWgmmaNarrowRows = 128, kWgmmaNarrowCols = kWgmmaWideTileN;  // the tile it picks
constexpr bool wgmma_prefer_128x128(int m, int n, int k, int sms) {
  if (m <= 64 || n < 256 || n % 128 != 0 || k < 64 || k > kWgmmaNarrowMaxK || sms < 1) return false;
  const int64_t tiles = int64_t(n / 256) * ((m + 127) / 128), kt = k / 64;
  if (tiles >= sms) return false;
  // (sms / T - 1) / (T kt / sms) >= pct / 100, in integers.
  return 100 * (sms - tiles) * int64_t(sms) >= int64_t(kWgmmaNarrowPct) * tiles * tiles * kt;
}

// The Hopper kernel's partition at one block per SM: where whole column slices load the blocks evenly
// enough, each block of a row chunk's group owns `each` whole slices (whole k, no partial tiles) instead
// of a stripe cut across slices. `each` is the fewest slices per block that the chunk's blocks can hold,
// ceil(slices / per_chunk); the fill is slices / (each x per_chunk), an even split's share of the busiest
// block's. Taken from kWgmmaWholeMinFillPct at one slice per block and kWgmmaWholeMultiMinFillPct at
// several (m > 64 only). Returns each, or 0 for stripes. H100 (docs/PERF.md), per layer, same call, two
// runs each:
// - one slice (twelfth session): 70B down at m = 512 397-400 -> 367-371 us, 70B o at 512 120-123 ->
//   105-107, 8B gate/up at 128 55.7-62.6 -> 50.9-51.7, 32768^2 at 128 433 -> 407-419 (g128) and 397-417
//   -> 379-396 (per-channel);
// - several (fifteenth session): at a 97% fill 32768^2 at m = 512 1628-1644 -> 1593-1599 (g128) and
//   1559-1566 -> 1505-1527 (per-channel), level at 256 and on 70B gate/up at 512 (712-720 -> 712-713); at
//   85% or less they lost or were level: 70B gate/up at 256 375 -> 390, 8B q/k/v at 1024 (75%) 77-79 ->
//   95-98, 70B q/k/v at 1024 (83%) 245-251 -> 271-274, 8B gate/up at 256 and 512 +1-2%.
// At two blocks per SM it would load the SMs unevenly (70B gate/up at m = 32, 224 blocks on 264 slots:
// 116-118 -> 120-121), so the launcher applies it at one only.
constexpr int kWgmmaWholeMinFillPct = 75;
constexpr int kWgmmaWholeMultiMinFillPct = 95;
constexpr int kWgmmaWholeMultiMinM = 65;
constexpr int wgmma_whole_slices(int m, int n, int rows, int max_blocks, int tile_n = 0) {
  const int tn = tile_n > 0 ? tile_n : wgmma_tile_n(rows);
  if (m < 1 || rows < 1 || n < tn || max_blocks < 1) return 0;
  const int64_t par = (int64_t(m) + rows - 1) / rows, slices = n / tn;
  if (par > max_blocks) return 0;
  const int64_t per_chunk = max_blocks / par, each = (slices + per_chunk - 1) / per_chunk;
  if (each > 1 && m < kWgmmaWholeMultiMinM) return 0;
  const int64_t pct = each > 1 ? kWgmmaWholeMultiMinFillPct : kWgmmaWholeMinFillPct;
  return slices * 100 >= each * per_chunk * pct ? int(each) : 0;
}

// m > 64 on the Hopper kernel's 128-row tiles where no whole-slice plan applies: output tiles split in exactly two
// along k, each pair of blocks one thread-block cluster that adds its halves through distributed shared memory
// (kernels/sm90/marlin_wgmma_ws.cuh, CL: each block's idle warpgroup sends its partial to the partner, which
// writes half the tile) instead of an fp32 deposit in the workspace, a counter and a read by the finisher. Taken
// where the T = n / 256 x ceil(m / 128) tiles in pairs fill kWgmmaPairMinFillPct of the blocks, so that the
// stripes would cut the tiles in two or three anyway. H100 timeline (docs/PERF.md, twenty-first session): 8B o at
// m = 512 (64 tiles, 128 blocks) spent 7.6 of its 32.3 us in the deposit, the wait, the read and the C write.
// Same calls, median of four runs each, pairs against stripes: 8B o at m = 512 30.3 against 32.6 us, 8B down at
// 512 89.3 against 94.7, 70B o at 256 59.2 against 64.6, 70B down at 256 181.2 against 184.3. On 64-row tiles the
// pairs lost (8B o at m = 256 21.3 against 19.6, 70B o at 128 40.0 against 38.1), so they are not built there.
// The wide tile (kWgmmaWideRows rows of 128 columns) and the fit tiles (wgmma_fit_plan, below) have the same form,
// under the same rule: with fit tiles it takes 8B o and down at m = 257-480 (2 row chunks x 32 slices) and 70B o and
// down at m = 129-240 (1 x 64), whose stripes cut slices in two or three. H200 (docs/PERF.md, thirty-eighth session,
// call 1), us per layer, stripes -> pairs, two runs each: 8B o at m = 392 27.9, 25.7 -> 24.4, 25.5, 450 31.3, 29.1 ->
// 28.1, 27.4, 480 30.5, 29.7 -> 27.2, 27.9; 8B down at 350 73.8, 76.4 -> 71.4, 72.1, 450 93.7, 96.2 -> 91.3, 89.4;
// 70B o at 200 58.0, 59.2 -> 52.3, 50.7; 70B down at 200 155.9, 157.0 -> 149.3, 153.5, 240 176.3, 178.1 -> 171.4,
// 171.4; level within 2 us elsewhere (8B o at 260 18.5, 18.1 -> 17.8, 18.0; 70B down at 160 125.9, 123.7 -> 127.5,
// 125.6). Where wgmma_prefer_128x128 holds (8B o at m = 512 among them since the thirty-first session), Auto takes
// 128 x 128 tiles instead, which have no pair form: built and timed in the thirty-eighth session (call 2), they were
// level or slower than their stripes (8B down at m = 256 59.3, 57.7 -> 62.4, 62.1 us).
constexpr int kWgmmaPairRows = 128;
constexpr int kWgmmaPairMinFillPct = 90;
// The token tiles the pair form is built for (kernels/sm90/marlin_wgmma_ws.cuh checks its instantiations against it).
MARLINC_PART_HD constexpr bool wgmma_pair_tile(int rows) {
  return rows == kWgmmaPairRows || rows == kWgmmaWideRows || wgmma_fit_tile(rows);
}
constexpr bool wgmma_pair_tiles(int m, int n, int k, int rows, int max_blocks) {
  const int tn = wgmma_tile_n(rows);  // the pair form is built for each token tile's own width only
  if (m <= 64 || !wgmma_pair_tile(rows) || n < tn || max_blocks < 2 || k % (2 * 64) != 0) return false;
  if (wgmma_whole_slices(m, n, rows, max_blocks) != 0) return false;
  const int64_t tiles = int64_t(n / tn) * ((int64_t(m) + rows - 1) / rows);
  return 2 * tiles <= max_blocks && 2 * tiles * 100 >= int64_t(max_blocks) * kWgmmaPairMinFillPct;
}

// m from 129 to kWgmmaFitMaxM on the Hopper kernel: m in as few row chunks as the fit tiles allow (144 to 240 rows of
// 128 columns, kernels/marlin_partition.h), each the shortest fit tile that holds them, where those chunks pad m no
// more than 128-row chunks (else 0: the 128-row tiles). Fewer, taller chunks: the per-row cost of products falls
// with the tile's height (70B gate/up at m = 640, us per padded row: 1.47 on 160-row tiles, 1.42 on 224, 1.43 on
// 128 x 256, 1.35 on 256), and three chunks of 224 rows (672) lost 5-9% to five of 128 (640). Auto's two launches
// (auto_split_head below) come first: at m = 264 they matched or beat 2 x 160 rows (compare m = 300's fit tiles).
// The wide tile (256 rows) is left to callers that force it. H100 (docs/PERF.md, thirty-third session), set sums in
// us, same call, two runs each:
// - call 5, Auto's 128-row tiles -> fit tiles (the then rule, 32-row steps: the fewest padded rows): m = 150
//   (1 x 160): 8B 170.6-171.8 -> 131.4-136.4, 70B 609-618 -> 452-463, 32768^2 704-718 -> 516-519; 300 (2 x 160): 8B
//   276-282 -> 242-254, 70B 947-960 -> 839-844, 32768^2 1135-1142 -> 1019-1020; 420 (2 x 224) 8B 356-359 -> 337-344,
//   70B 1237-1247 -> 1121-1127; 560 (3 x 192) 70B 1622-1629 -> 1525-1538; 384 (2 x 192, as many padded rows) 8B
//   292.6-295.3 -> 294.5-302.4, 70B 1013-1018 -> 983-996, 32768^2 1208-1210 -> 1221; 768 (4 x 192) 8B 526-542 ->
//   507-525, 70B 1981-1983 -> 1963, 32768^2 2387-2408 -> 2410-2427;
// - call 4, tiles forced against Auto's 128-row ones: every tile whose chunks pad m more than 128-row chunks lost;
// - call 8, the then rule -> this one (16-row steps, fewest chunks): m = 176 / 200 / 280 / 350 4-10% faster on every
//   set (8B at 280 243-246 -> 220, 70B at 350 969-979 -> 910), 700 (3 x 240) 1-5%, 640 (5 x 128 instead of 4 x 160)
//   8B and 70B 2% slower, 32768^2 1% faster.
constexpr int kWgmmaFitMaxM = 1024;
constexpr int wgmma_fit_rows(int m) {
  if (m <= 128 || m > kWgmmaFitMaxM) return 0;
  const int tallest = kWgmmaWideRows - kWgmmaFitStep;
  const int chunks = (m + tallest - 1) / tallest;
  const int rows = ((m + chunks - 1) / chunks + kWgmmaFitStep - 1) / kWgmmaFitStep * kWgmmaFitStep;
  const int pad128 = (m + 127) / 128 * 128;
  return wgmma_fit_tile(rows) && chunks * rows <= pad128 ? rows : 0;
}

// Per-block work of the Hopper kernel's partition at one block per SM, in token rows x columns x 64-deep k tiles: the
// `each` whole slices of wgmma_whole_slices where it takes them, else a stripe of ceil(slices x k tiles / blocks per
// row chunk) k tiles (marlin_partition.h; row chunks looped over where they outnumber the blocks).
constexpr int64_t wgmma_block_work(int m, int n, int k, int rows, int tn, int max_blocks) {
  if (m < 1 || rows < 1 || tn < 1 || max_blocks < 1) return 0;
  const int64_t par = (int64_t(m) + rows - 1) / rows, kt = k / kWgmmaTileK, slices = n / tn;
  if (par > max_blocks) return (par + max_blocks - 1) / max_blocks * slices * kt * rows * tn;
  const int64_t each = wgmma_whole_slices(m, n, rows, max_blocks, tn), per_chunk = max_blocks / par;
  return (each > 0 ? each * kt : (slices * kt + per_chunk - 1) / per_chunk) * rows * tn;
}

// Auto's rows on the Hopper kernel from m = 129 to kWgmmaFitMaxM, per layer: wgmma_fit_rows's tiles (the fewest
// chunks), unless a fit tile in more chunks gives every block one or two whole column slices of 128 (no partial tiles,
// no deposits) for at most wgmma_fit_whole_slack_pct(k) % more products per block than the plan it replaces (those rows
// or, where they are 0, the 128-row tiles), which has none of its own. Only on layers narrow enough for one or two
// slices a block: with more the blocks of one row chunk read weights the other chunks' blocks read at other times (8B
// gate/up at m = 560 on 4 x 144 rows, seven slices a block: 222-224 -> 239-284 us). H100 (docs/PERF.md, thirty-fourth
// session, calls 1 and 3), us per layer, Auto's tiles against the forced fit tile, two runs each:
// - 8B o (32 slices, 4 chunks of 32 blocks): m = 560 (3 x 192 stripes -> 4 x 144) 35.4, 38.5 -> 30.1, 30.2; 640
//   (5 x 128 x 256 stripes -> 4 x 160) 44.9, 40.3 -> 31.0, 31.8; 700 (3 x 240 -> 4 x 176) 47.8, 42.6 -> 36.6, 38.4;
// - 8B down: 560 108.0, 111.1 -> 106.4, 106.8; 640 119.8, 121.8 -> 109.7, 106.9; 700 134.3, 133.1 -> 121.4, 119.6;
// - 70B o and down (64 slices, two a block): 700 150.4, 149.5 -> 142.2, 142.3 and 533.5, 536.7 -> 498.1, 499.5; 560
//   down 431.7, 432.6 -> 413.0, 414.7, o level (122.4, 123.9 -> 126.1, 121.4).
// Those run 0-3% more products than the stripes. With more, the stripes' partial tiles still cost more than the extra
// products where a slice is short and its deposit large beside its products (call 3):
// - 5-6% more (m = 600, 3 x 208 -> 4 x 160): 8B down 118.2, 118.7 -> 113.7, 113.7; 70B o 131.8, 131.1 -> 125.2, 130.0;
//   70B down level (471.6, 473.1 -> 464.5, 474.4);
// - 11-12% more (m = 520, 3 x 176 -> 4 x 144): 8B o (k = 4096) 32.1, 31.8 -> 28.8, 28.8; 70B o level (110.3, 119.3 ->
//   112.6, 120.9); 8B down 99.3, 101.3 -> 104.1, 104.7 and 70B down 403.6, 398.0 -> 437.0, 442.5 slower;
// so the slack is kWgmmaFitWholeSlackPct plus kWgmmaFitWholeSlackDepth / k (20% at k = 4096, 12% at 8192, 9% at 14336,
// 7% at 28672). 128 x 128 tiles (slower per product) are not a candidate: in 4 chunks at m = 420 and 450 (10-18% more
// products than 2 x 224 or 2 x 240 rows) they won on 8B o (32.1, 30.2 -> 28.7, 29.1) but lost on 8B down (85.2, 90.4
// -> 104.7, 107.2; call 1).
constexpr int kWgmmaFitWholeMaxEach = 2;
constexpr int kWgmmaFitWholeSlackPct = 5;
constexpr int kWgmmaFitWholeSlackDepth = 15 * 4096;  // percent x k
constexpr int wgmma_fit_whole_slack_pct(int k) {
  return kWgmmaFitWholeSlackPct + (k > 0 ? kWgmmaFitWholeSlackDepth / k : 0);
}
// Per-block work of the plan that a whole-slice candidate (wgmma_fit_plan, wgmma_prefer_192) would replace: `fit` rows
// of 128 columns where fit > 0, else the 128-row tiles (128 x 128 where wgmma_prefer_128x128 holds, else 128 x 256);
// 0 where that plan has whole slices itself or its columns do not divide n, so that nothing replaces it.
constexpr int64_t wgmma_replaced_work(int m, int n, int k, int sms, int fit) {
  const int rows0 = fit > 0 ? fit : kWgmmaNarrowRows;
  const int tn0 = fit > 0 ? kWgmmaWideTileN : wgmma_prefer_128x128(m, n, k, sms) ? kWgmmaNarrowCols : kWgmmaTileN;
  if (n % tn0 != 0 || wgmma_whole_slices(m, n, rows0, sms, tn0) > 0) return 0;
  return wgmma_block_work(m, n, k, rows0, tn0, sms);
}
// One chunk of fit rows on a shallow, narrow layer, whose stripes cut every slice into kWgmmaFitDeepParts or more
// parts (the finisher waits for three or more deposits and adds them after its products), gives way to two 128-row
// chunks, which cut each slice in about two, where those pad at most kWgmmaFitDeepPadPct % more rows. Only at k up to
// kWgmmaFitDeepMaxK, where the deposits weigh most beside the products. H200 (docs/PERF.md, thirty-eighth session,
// calls 2 and 6), 8B o (32 slices of 64 k tiles: one chunk's stripes are 16 tiles), us, Auto's fit tile against 128 x
// 128 tiles forced: m = 200 (208 rows, 256 with the 128-row chunks) 21.1, 19.6 -> 18.6, 18.5; 240 20.7, 20.8 -> 17.6,
// 17.4; with more padding it lost (m = 136 and 160: 13.9 and 15.0 -> 17.1-17.3 in pairs), as on the deep 8B down (k =
// 14336: 49.3 -> 57.2-58.1 at 200). 8B q/k/v (48 slices: three parts) is left out.
constexpr int kWgmmaFitDeepParts = 4;
constexpr int kWgmmaFitDeepPadPct = 25;
constexpr int kWgmmaFitDeepMaxK = 4096;
constexpr bool wgmma_fit_split_deep(int m, int n, int k, int sms, int rows) {
  if (rows <= 0 || sms < 1 || k > kWgmmaFitDeepMaxK || (m + rows - 1) / rows != 1) return false;
  const int64_t kt = k / kWgmmaTileK, iters = (int64_t(n / kWgmmaWideTileN) * kt + sms - 1) / sms;
  const int64_t pad128 = (int64_t(m) + 127) / 128 * 128;
  return iters * kWgmmaFitDeepParts <= kt && pad128 * 100 <= int64_t(rows) * (100 + kWgmmaFitDeepPadPct);
}
// Two or more chunks of fit rows on a shallow, narrow layer, whose stripes still cut every slice into
// kWgmmaFitShallowParts2 / 2 or more parts, give way to the 128 x 128 tiles (wgmma_prefer_128x128) where those cost at
// most kWgmmaFitShallowSlackPct % more products per block: their three to five chunks of 128 rows give each chunk fewer
// blocks, so fewer parts per slice and fewer deposits to wait for, which on these layers weigh more than the fit tiles'
// cheaper products. Only at k up to kWgmmaFitDeepMaxK. Set on the H200's forced tiles (docs/PERF.md, forty-second
// session, call 7: with two parts or fewer the fit tiles won, 8B o at m = 384 26.1, 26.4 against 27.0, 29.2, 1024 x
// 4096 at 320 8.7 against 10.8, every layer at m = 768; so did they with 20% more products or more, m = 288: up to 43%
// on 8B o). Auto before -> after (forty-third session, call 2), us, two runs each, level within 3%: 1536 x 2048 at m =
// 432 14.0, 14.1 -> 10.4, at 704 16.1, 16.2 -> 12.6; 2048 x 2048 at 480 15.1, 15.2 -> 11.4; 2048 x 3072 at 480 17.6 ->
// 14.6; 3072 x 3072 at 384 17.9, 18.0 -> 16.3, 16.2; 3072 x 1024 at 432 18.1, 18.2 -> 11.5, 11.8; 1536 x 1536 at 608
// 15.1 -> 10.2, 10.1; 4096 x 2048 at 480 20.1, 20.0 -> 17.6, 17.3, at 544-576 level (21.0-22.1 -> 21.0-22.3).
constexpr int kWgmmaFitShallowParts2 = 5;  // twice the parts: 2.5
constexpr int kWgmmaFitShallowSlackPct = 15;
constexpr bool wgmma_fit_split_shallow(int m, int n, int k, int sms, int rows) {
  if (rows <= 0 || sms < 1 || k > kWgmmaFitDeepMaxK || n % kWgmmaWideTileN != 0) return false;
  const int64_t par = (int64_t(m) + rows - 1) / rows;
  if (par < 2 || par > sms || wgmma_whole_slices(m, n, rows, sms, kWgmmaWideTileN) > 0) return false;
  if (!wgmma_prefer_128x128(m, n, k, sms)) return false;
  const int64_t kt = k / kWgmmaTileK, per_chunk = sms / par;
  const int64_t iters = (int64_t(n / kWgmmaWideTileN) * kt + per_chunk - 1) / per_chunk;
  if (iters * kWgmmaFitShallowParts2 > kt * 2) return false;
  const int64_t w128 = wgmma_block_work(m, n, k, kWgmmaNarrowRows, kWgmmaNarrowCols, sms);
  return w128 * 100 <= wgmma_block_work(m, n, k, rows, kWgmmaWideTileN, sms) * (100 + kWgmmaFitShallowSlackPct);
}
// On layers with n % 256 != 0 (n % 128 == 0; hopper_n128_pick below) fit rows in two or more chunks give way to the
// 128 x 128 tiles. H200 (docs/PERF.md, forty-third session, call 5), us, fit tiles against 128 x 128 forced, two runs
// each: 4864 x 896 at m = 384 (2 x 192 rows, eight parts a slice) 18.9, 18.8 -> 13.1, 13.1, at 768 (4 x 192) 19.8 ->
// 16.2; 6912 x 1152 at 384 20.5 -> 16.2, 16.1, at 768 25.6, 26.6 -> 25.1, 25.3; one chunk kept its fit tile (m = 192:
// 4864 x 896 11.4, 11.3 against 12.8, 6912 x 1152 13.0 against 14.6).
constexpr bool wgmma_fit_n128_chunks(int m, int n, int rows) {
  return n % kWgmmaTileN != 0 && rows > 0 && (m + rows - 1) / rows > 1;
}
// Tiny layers (up to kWgmmaTinyDqMaxLayer weights; hopper_auto_pick below gives them to dequantize + cuBLAS at m =
// 129-896, so this is Auto's at m = 897-1024 and path Wgmma's) with n % 256 == 0 take no fit tiles in two or more row
// chunks: the 128-row tiles (128 x 128, wgmma_prefer_128x128). Their few tiles leave the fixed cost of the taller tiles
// exposed. H200 (docs/PERF.md, forty-fourth session, calls 2 and 3), us, fit tiles against 128 x 128, two runs each:
// 1152 x 1536 at m = 576 (3 x 192 rows) 13.5, 13.5 -> 9.3, 9.3, at 960 (4 x 240) 15.1, 15.1 -> 9.2, 9.2; 1536 x 1536
// at 960 16.1, 16.1 -> 11.2, 11.1; 2048 x 1024, 1024 x 2048 and 2048 x 512 level at 576-992. One chunk keeps its fit
// tile: at m = 160 the 128-row tiles' two chunks were slower (2048 x 512 8.3 -> 12.5, 1536 x 1536 8.7 -> 9.9).
constexpr int64_t kWgmmaTinyDqMaxLayer = int64_t(5) << 19;  // 2.6M, above 1536 x 1536
constexpr int wgmma_fit_plan(int m, int n, int k, int sms) {
  const int base = wgmma_fit_rows(m);
  if (wgmma_fit_n128_chunks(m, n, base)) return 0;  // the 128 x 128 tiles
  if (m <= 128 || m > kWgmmaFitMaxM || sms < 1 || n % kWgmmaTileN != 0 || k % kWgmmaTileK != 0) return base;
  if (int64_t(n) * k <= kWgmmaTinyDqMaxLayer && base > 0 && (m + base - 1) / base > 1) return 0;  // the 128-row tiles
  if (wgmma_fit_split_deep(m, n, k, sms, base)) return 0;  // the 128-row tiles
  const int64_t work0 = wgmma_replaced_work(m, n, k, sms, base);  // those rows, or the 128-row tiles
  if (work0 == 0) return base;
  const int pad128 = (m + 127) / 128 * 128;
  int best = 0;
  int64_t best_work = 0;
  for (int rows = kWgmmaFitMinRows; wgmma_fit_tile(rows); rows += kWgmmaFitStep) {
    const int each = wgmma_whole_slices(m, n, rows, sms, kWgmmaWideTileN);
    if ((m + rows - 1) / rows * rows > pad128 || each < 1 || each > kWgmmaFitWholeMaxEach) continue;
    const int64_t w = wgmma_block_work(m, n, k, rows, kWgmmaWideTileN, sms);
    if (best == 0 || w < best_work) best = rows, best_work = w;
  }
  if (best > 0 && best_work * 100 <= work0 * (100 + wgmma_fit_whole_slack_pct(k))) return best;
  return wgmma_fit_split_shallow(m, n, k, sms, base) ? 0 : base;  // 0: the 128-row tiles
}

// 128 x 192 tiles (three consumer warpgroups; kernels/marlin_partition.h, kWgmmaTriTileN) on layers with n % 192 == 0,
// where they give every block one whole slice of 128 rows and the plan they replace (wgmma_fit_plan's rows, else the
// 128-row tiles) cuts slices into stripes, for at most wgmma_fit_whole_slack_pct(k) % more products per block (as for
// the whole-slice fit tiles above: the stripes' partial tiles cost more than the extra products). cuBLAS runs 192 x 128
// tiles on 8B q/k/v there (docs/PERF.md, thirty-first session, call 5). H100 (docs/PERF.md, thirty-fifth session, call
// 5), 8B q/k/v (k 4096, n 6144: 32 slices in 4 chunks on 132 SMs), us, Auto's tiles against 128 x 192, two runs each:
// m = 512 (128 x 256 stripes, 3% more products) 51.3, 49.7 -> 42.8, 42.2; 480 (2 x 240 fit rows, 10%) 42.7, 45.0 ->
// 38.6, 37.7; 450 (2 x 240, 10%) 40.5, 41.0 -> 37.3, 36.6; 420 (2 x 224, 18%) 42.1, 42.0 -> 41.2, 41.1; left out: 392
// (2 x 208, 27%) level (38.6, 40.4 -> 38.1, 40.7), and stripes of 128 x 192 (m = 560-768) slower.
constexpr int kWgmmaTriRows = 128;
// `fit` is wgmma_fit_plan(m, n, k, sms), passed in so that the launcher, which needs it either way, computes it once.
constexpr bool wgmma_prefer_192(int m, int n, int k, int sms, int fit) {
  if (m <= 128 || m > kWgmmaFitMaxM || sms < 1 || n % kWgmmaTriTileN != 0 || k % kWgmmaTileK != 0) return false;
  if (wgmma_whole_slices(m, n, kWgmmaTriRows, sms, kWgmmaTriTileN) != 1) return false;
  const int64_t work0 = wgmma_replaced_work(m, n, k, sms, fit);
  const int64_t work = wgmma_block_work(m, n, k, kWgmmaTriRows, kWgmmaTriTileN, sms);
  return work0 > 0 && work * 100 <= work0 * (100 + wgmma_fit_whole_slack_pct(k));
}
constexpr bool wgmma_prefer_192(int m, int n, int k, int sms) {
  return wgmma_prefer_192(m, n, k, sms, wgmma_fit_plan(m, n, k, sms));
}

// m a little past a whole number of 128-row chunks, where no fit tile applies (wgmma_fit_rows; so from m = 1025): Auto
// runs the whole chunks and the rows past them as two launches (kernels/marlin.cu, run_split) instead of one whose last
// row chunk computes 128 rows of products for a few real ones. The second launch (m <= 16: Auto's small-m kernel for
// the layer) reads the weights once more. H100 (docs/PERF.md, thirty-second session), set sums in us, one launch
// against two, same call, two runs each: 8B at m = 129 / 257 / 1025 162.7-173.3 / 260.9-268.0 / 765-775 -> 160.6-161.6
// / 248.9-249.4 / 738; 70B 586-597 / 901-903 / 2884-2894 -> 525-549 / 854-860 / 2722-2745; every m with 1-16 rows past
// the chunks 4-9% faster (means of two runs). With 32-64 rows past them (a second launch of the 32- or 64-row tiles)
// the 70B set gained up to 5% but the 8B set lost 3-11% (m = 160: 172-175 -> 193-195), so those stay one launch. Since
// the thirty-fourth session the fit tiles come first: with 144 rows they pad m = 129-144 and 257-272 less than the 160
// rows the split was weighed against, and they beat the split at every m measured (call 1, forced fit rows against
// Auto's two launches, set sums in us, two runs each: m = 136 (1 x 144) 8B 158.2, 157.1 -> 124.9, 118.6, 70B 562.6,
// 535.8 -> 409.1, 400.4, 32768^2 588.0, 588.6 -> 490.5, 493.6; 264 (2 x 144) 8B 244.7, 248.0 -> 219.3, 220.1, 70B
// 863.5, 856.6 -> 790.1, 786.8; 392 (2 x 208) 8B 349.1, 358.6 -> 303.9, 301.6, 70B 1156.9, 1160.7 -> 1052.0, 1058.6;
// 520 (3 x 176) 8B 414.2, 425.0 -> 390.6, 385.2, 70B 1438.4, 1452.2 -> 1414.2, 1434.6).
constexpr int kSplitChunkRows = 128;
constexpr int kSplitTailMaxRows = 16;
constexpr int auto_split_head(int m) {
  const int r = m % kSplitChunkRows;
  return m > kSplitChunkRows && r > 0 && r <= kSplitTailMaxRows && wgmma_fit_rows(m) == 0 ? m - r : 0;
}

enum class HopperAutoPick { MmaSync, Hopper, DequantCublas };

constexpr int kWgmmaTinyMaxM = 8;
constexpr int64_t kWgmmaTinyMinLayer = int64_t(1) << 24;  // exclusive; weights (n * k)
constexpr int64_t kWgmmaMidMaxLayer = int64_t(1) << 28;   // m <= 16
constexpr int kWgmma16MaxM = 16;
constexpr int64_t kWgmma16MinLayer = int64_t(3) << 25;    // 2^26.6
constexpr int kWgmma64MaxM = 64;                          // m = 17 to 64
constexpr int64_t kWgmma64MinLayer = int64_t(1) << 22;    // Llama-3.2-1B o (2^22) and up
constexpr int64_t kWgmmaSmallLayer = int64_t(1) << 26;    // below it, dequantize + cuBLAS above 2048
constexpr int kWgmmaSmallLayerMaxM = 2048;
constexpr int kWgmmaMaxM = 4096;
// Tiny layers at m = 129 to 896: dequantize + cuBLAS. Their whole product is a few microseconds of cuBLAS, and the
// Hopper kernel's 12-24 tiles of 128 x 128 (or fewer fit tiles) leave its fixed cost, deposits and finish exposed. H200
// (docs/PERF.md, forty-second session, call 5), us at m = 144 / 256 / 384 / 512, 128 x 128 tiles (Auto's at m = 256 and
// 512; the fit tiles Auto takes at 144 and 384 were slower still, call 4) against dequantize + cuBLAS: 1152 x 1536 9.1
// / 9.3 / 10.1 / 10.1 -> 7.4 / 7.4 / 7.9 / 8.6, 1536 x 1536 9.9 / 10.1 / 10.6 / 10.8 -> 8.5 / 8.7 / 9.2 / 10.2, 2048 x
// 1024 10.1 / 10.2 / 10.8 / 10.1 -> 8.8 / 9.2 / 9.1 / 9.4; from 3 x 2^20 weights level or slower (1536 x 2048 9.4 / 9.2
// / 10.6 / 10.1 against 9.2 / 9.7 / 10.5 / 11.5, 3072 x 1024, 2048 x 2048). Up to m = 896 since the forty-fourth session
// (call 1, us, path Wgmma -> dequantize + cuBLAS at m = 576 / 640 / 704 / 768 / 896, two runs alike): 1152 x 1536 13.4 /
// 9.1 / 10.8 / 10.8 / 10.4 -> 8.7 / 8.6 / 8.7 / 9.3 / 9.8, 1536 x 1536 10.1 / 10.0 / 11.9 / 11.8 / 11.8 -> 9.9 / 9.9 /
// 10.2 / 10.8 / 11.7, 2048 x 1024 11.3 / 11.2 / 11.8 / 11.6 / 12.2 -> 9.4 / 9.1 / 13.6 / 9.5 / 10.6 (cuBLAS itself slow
// at 704), 1024 x 2048 10.5 / 10.4 / 10.8 / 9.6 / 10.5 -> 10.5 / 8.9 / 10.3 / 9.6 / 10.8; at m = 1024 the Hopper
// kernel is faster on three of the four (8.9 / 10.8 / 11.3 / 8.8 against 10.1 / 12.3 / 10.7 / 10.9).
constexpr int kWgmmaTinyDqMinM = 129, kWgmmaTinyDqMaxM = 896;

// weights = n * k of the layer.
constexpr HopperAutoPick hopper_auto_pick(int m, int64_t weights) {
  if (m <= kWgmmaTinyMaxM)
    return weights > kWgmmaTinyMinLayer && weights <= kWgmmaMidMaxLayer ? HopperAutoPick::Hopper
                                                                           : HopperAutoPick::MmaSync;
  if (m <= kWgmma16MaxM)
    return weights >= kWgmma16MinLayer && weights <= kWgmmaMidMaxLayer ? HopperAutoPick::Hopper
                                                                         : HopperAutoPick::MmaSync;
  if (m <= kWgmma64MaxM) return weights >= kWgmma64MinLayer ? HopperAutoPick::Hopper : HopperAutoPick::MmaSync;
  if (m >= kWgmmaTinyDqMinM && m <= kWgmmaTinyDqMaxM && weights <= kWgmmaTinyDqMaxLayer)
    return HopperAutoPick::DequantCublas;
  if (m > kWgmmaMaxM || (weights < kWgmmaSmallLayer && m > kWgmmaSmallLayerMaxM)) return HopperAutoPick::DequantCublas;
  return HopperAutoPick::Hopper;
}

// m > 64 on a Hopper device, on layers with n % 256 != 0 but n % 128 == 0 (Qwen2.5-0.5B's q/k/v, o and down,
// Gemma-3-1B's o and down), which the Hopper kernel runs on its tiles 128 columns wide only (128 x 128, the fit tiles,
// 128 x 192) since the forty-third session: dequantize + cuBLAS on layers of up to kWgmmaTinyDqMaxLayer weights, as on
// the tiny layers above, at every m; on larger ones hopper_auto_pick's choice. H200 (docs/PERF.md, forty-third session,
// call 4), us, dequantize + cuBLAS (Auto before) against path Wgmma, two runs each, at m = 65 / 128 / 256 / 512 / 1024:
// 4864 x 896 11.6, 11.4 / 12.7, 12.6 / 13.8, 13.9 / 14.9, 15.0 / 18.9, 19.1 -> 8.2, 8.1 / 8.0 / 13.1, 13.0 / 14.2 /
// 18.6, 18.7 (slower at 384, 15.8 -> 18.8, and 768, 17.5 -> 19.6, on fit tiles in two and four row chunks, which such
// layers no longer take: wgmma_fit_n128_chunks, 13.1 and 16.2 on 128 x 128); 6912 x 1152 16.0, 15.6 / 15.7, 15.6 /
// 18.9, 18.8 / 22.3, 22.2 / 38.5, 38.2 -> 9.1 / 9.8 / 14.5, 14.4 / 18.2 / 28.0, 28.4, faster at every m timed; 896 x
// 896, 896 x 1152 and 1024 x 1152 level at m = 65 and slower above (896 x 896 at 128 5.7 -> 7.0, at 384 6.0 -> 12.4).
constexpr HopperAutoPick hopper_n128_pick(int m, int64_t weights) {
  if (m <= kWgmma64MaxM) return HopperAutoPick::MmaSync;
  return weights <= kWgmmaTinyDqMaxLayer ? HopperAutoPick::DequantCublas : hopper_auto_pick(m, weights);
}

// m > 64 on a Hopper device, on layers the Hopper kernel cannot run (n % 128 != 0; before the forty-third session every
// n % 256 != 0, the layers above among them): dequantize + cuBLAS from m = 65 on layers of up to kMmaOnlyDqMaxLayer
// weights, from kMmaOnlyDqMinM on every layer, instead of the mma.sync kernel (whose 64-row tiles ran these layers at a
// fifth to a third of cuBLAS's speed). H200 (docs/PERF.md, forty-second session, call 1), us, mma.sync against
// dequantize + cuBLAS: 896 x 896 at m = 128 / 256 / 384 19.5 / 17.3 / 18.0 -> 5.6 / 5.8 / 5.8, 896 x 1152 19.9 / 17.9 /
// 16.2 -> 5.9 / 6.6 / 6.7, 4864 x 896 29.6 / 27.6 / 27.2 -> 14.1 / 14.7 / 16.4; on the Llama-3.2 layers (timed on the
// mma.sync kernel, which Auto no longer gives them) at m = 128 3072 x 3072 26.7 -> 18.3 and 2048 x 3072 20.1 -> 13.3,
// but 3072 x 5120 (2^23.9) 29.8 -> 34.5 and 8192 x 2048 29.5 -> 40.8 slower; at m = 256 every layer faster or level
// (2048 x 16384 77.5 -> 67.6, 8192 x 2048 45.0 -> 44.6) and at 384 every one faster.
constexpr int kMmaOnlyDqMinM = 256;
constexpr int64_t kMmaOnlyDqMaxLayer = int64_t(3) << 22;  // 2^23.6, above 3072 x 3072
constexpr bool hopper_mma_only_dq(int m, int64_t weights) {
  return m > kWgmma64MaxM && (m >= kMmaOnlyDqMinM || weights <= kMmaOnlyDqMaxLayer);
}

}  // namespace marlinc::kernels
