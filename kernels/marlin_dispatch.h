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
// - m = 17 to 32 (block-synchronous pipeline, 32-row tiles): faster on layers of 2^25 weights or more
//   (70B m = 32: 215 vs 271 us; 8B down, 2^25.8: 21.5 vs 24.5), slower on smaller ones (8B o 13.7 vs 10.4).
// - m = 33 to 64 (producer warpgroup, 64-row tiles): faster on every set, small layers included (8B m = 64:
//   89 us against 118 for the best mma.sync tiles, 70B 274 vs 428).
// - m = 65 to 2048 (producer warpgroup, 128-row tiles): faster on every set, by 1.7-2.1x over mma.sync,
//   and faster than dequantize + cuBLAS at m = 1024 (70B 2973 vs 4509 us, 8B 782 vs 1024).
// - m = 2048: faster than dequantize + cuBLAS on both layers timed (8B qkv 192 vs 200 us, 70B down 1564
//   vs 2294). m = 4096: on 70B down still faster (3186 vs 3740), on 8B qkv (2^24.6 weights) a tie that
//   dequantize + cuBLAS wins (366 vs 360): above 2048 small layers take that path, above 4096 all do
//   (not measured beyond; cuBLAS's own GEMM runs closer to the tensor peak as m grows).
//
// Before that rule, at m <= 16 on any device: whole-k stripes (whole_k_stripes below).
#pragma once
#include <cstdint>

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

enum class HopperAutoPick { MmaSync, Hopper, DequantCublas };

constexpr int kWgmmaTinyMaxM = 8;
constexpr int64_t kWgmmaTinyMinLayer = int64_t(1) << 24;  // exclusive; weights (n * k)
constexpr int64_t kWgmmaMidMaxLayer = int64_t(1) << 28;   // m <= 16
constexpr int kWgmma16MaxM = 16;
constexpr int64_t kWgmma16MinLayer = int64_t(3) << 25;    // 2^26.6
constexpr int kWgmmaSmallMaxM = 32;
constexpr int64_t kWgmma32MinLayer = int64_t(1) << 25;
constexpr int64_t kWgmmaSmallLayer = int64_t(1) << 26;    // below it, dequantize + cuBLAS above 2048
constexpr int kWgmmaSmallLayerMaxM = 2048;
constexpr int kWgmmaMaxM = 4096;

// weights = n * k of the layer.
constexpr HopperAutoPick hopper_auto_pick(int m, int64_t weights) {
  if (m <= kWgmmaTinyMaxM)
    return weights > kWgmmaTinyMinLayer && weights <= kWgmmaMidMaxLayer ? HopperAutoPick::Hopper
                                                                           : HopperAutoPick::MmaSync;
  if (m <= kWgmma16MaxM)
    return weights >= kWgmma16MinLayer && weights <= kWgmmaMidMaxLayer ? HopperAutoPick::Hopper
                                                                         : HopperAutoPick::MmaSync;
  if (m <= kWgmmaSmallMaxM) return weights >= kWgmma32MinLayer ? HopperAutoPick::Hopper : HopperAutoPick::MmaSync;
  if (m > kWgmmaMaxM || (weights < kWgmmaSmallLayer && m > kWgmmaSmallLayerMaxM)) return HopperAutoPick::DequantCublas;
  return HopperAutoPick::Hopper;
}

}  // namespace marlinc::kernels
