// MarlinPath::Auto's choice on a Hopper device (kernels/marlin_dispatch.h), on the layers whose H100
// timings set it (docs/PERF.md): a change of the rule that moves one of these layers to the kernel that
// measured slower fails here.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/marlin_dispatch.h"
#include "kernels/marlin_partition.h"
#include "kernels/mma_frag.h"
#include "tests/common.h"

using namespace marlinc::kernels;

namespace {

struct Layer { const char* name; int k, n; };
const Layer kQkv8B{"8B q/k/v", 4096, 6144}, kO8B{"8B o", 4096, 4096}, kGateUp8B{"8B gate/up", 4096, 28672},
    kDown8B{"8B down", 14336, 4096}, kQkv70B{"70B q/k/v", 8192, 10240}, kO70B{"70B o", 8192, 8192},
    kGateUp70B{"70B gate/up", 8192, 57344}, kDown70B{"70B down", 28672, 8192}, kLarge{"32768^2", 32768, 32768};
// Narrower layers of other models (bench_marlin's llama3.2-1b, llama3.2-3b, qwen2.5-7b and qwen2.5-32b sets).
const Layer kQkv1B{"1B q/k/v", 2048, 3072}, kO1B{"1B o", 2048, 2048}, kGateUp1B{"1B gate/up", 2048, 16384},
    kDown1B{"1B down", 8192, 2048}, kQkv3B{"3B q/k/v", 3072, 5120}, kO3B{"3B o", 3072, 3072},
    kGateUp3B{"3B gate/up", 3072, 16384}, kQkvQ7B{"Qwen 7B q/k/v", 3584, 4608}, kOQ7B{"Qwen 7B o", 3584, 3584},
    kOQ32B{"Qwen 32B o", 5120, 5120};

HopperAutoPick pick(int m, const Layer& L) { return hopper_auto_pick(m, int64_t(L.k) * L.n); }

}  // namespace

TEST_CASE("dispatch: m <= 8 takes the Hopper kernel on mid-sized layers only", "[kernels][dispatch]") {
  for (int m : {1, 2, 4, 7, 8}) {
    INFO("m " << m);
    for (const Layer& L : {kQkv8B, kGateUp8B, kDown8B, kQkv70B, kO70B, kDown70B}) {
      INFO(L.name);
      CHECK(pick(m, L) == HopperAutoPick::Hopper);
    }
    for (const Layer& L : {kO8B, kGateUp70B, kLarge}) {
      INFO(L.name);
      CHECK(pick(m, L) == HopperAutoPick::MmaSync);
    }
  }
}

TEST_CASE("dispatch: m = 9..16 takes the Hopper kernel on 8B gate/up and 70B down only", "[kernels][dispatch]") {
  for (int m : {9, 12, 16}) {
    INFO("m " << m);
    for (const Layer& L : {kGateUp8B, kDown70B}) {
      INFO(L.name);
      CHECK(pick(m, L) == HopperAutoPick::Hopper);
    }
    for (const Layer& L : {kQkv8B, kO8B, kDown8B, kQkv70B, kO70B, kGateUp70B, kLarge}) {
      INFO(L.name);
      CHECK(pick(m, L) == HopperAutoPick::MmaSync);
    }
  }
}

TEST_CASE("dispatch: m = 17..64 takes the Hopper kernel from 2^22 weights", "[kernels][dispatch]") {
  const Layer k1536{"1536 x 1536", 1536, 1536}, k2048x1024{"2048 x 1024", 2048, 1024};  // 2^21.2 and 2^21
  for (int m : {17, 24, 32, 33, 48, 64}) {
    INFO("m " << m);
    for (const Layer& L : {kQkv8B, kO8B, kGateUp8B, kDown8B, kQkv70B, kO70B, kGateUp70B, kDown70B, kLarge, kQkv1B, kO1B,
                           kDown1B, kO3B, kOQ7B}) {
      INFO(L.name);
      CHECK(pick(m, L) == HopperAutoPick::Hopper);
    }
    for (const Layer& L : {k1536, k2048x1024}) {  // Hopper slower on both at m = 33-64, at 17-32 on 1536^2 only
      INFO(L.name);
      CHECK(pick(m, L) == HopperAutoPick::MmaSync);
    }
  }
  CHECK(hopper_auto_pick(17, (int64_t(1) << 22) - 1) == HopperAutoPick::MmaSync);
  CHECK(hopper_auto_pick(64, (int64_t(1) << 22) - 1) == HopperAutoPick::MmaSync);
  CHECK(hopper_auto_pick(64, int64_t(1) << 22) == HopperAutoPick::Hopper);
  CHECK(hopper_auto_pick(65, int64_t(1) << 20) == HopperAutoPick::Hopper);
  CHECK(hopper_auto_pick(16, int64_t(1) << 22) == HopperAutoPick::MmaSync);
}

TEST_CASE("dispatch: above m = 16 never mma.sync on Llama-3's layers, dequantize + cuBLAS only for large m",
          "[kernels][dispatch]") {
  const std::vector<Layer> all{kQkv8B, kO8B, kGateUp8B, kDown8B, kQkv70B, kO70B, kGateUp70B, kDown70B, kLarge};
  for (int m : {17, 32, 33, 64, 100, 128, 256, 1000, 1024, 2048}) {
    INFO("m " << m);
    for (const Layer& L : all) {
      INFO(L.name);
      CHECK(pick(m, L) == HopperAutoPick::Hopper);
    }
  }
  // Above 2048 layers below 2^26 weights (8B q/k/v tied at 4096) go to dequantize + cuBLAS, above 4096 all.
  for (const Layer& L : {kQkv8B, kO8B, kDown8B}) {
    INFO(L.name);
    CHECK(pick(2049, L) == HopperAutoPick::DequantCublas);
    CHECK(pick(4096, L) == HopperAutoPick::DequantCublas);
  }
  for (const Layer& L : {kO70B, kDown70B, kGateUp8B, kLarge}) {
    INFO(L.name);
    CHECK(pick(4096, L) == HopperAutoPick::Hopper);
  }
  for (const Layer& L : all) {
    INFO(L.name);
    CHECK(pick(4097, L) == HopperAutoPick::DequantCublas);
    CHECK(pick(1 << 20, L) == HopperAutoPick::DequantCublas);
  }
}

// Small models' shallow layers (Qwen2.5-0.5B, Gemma-3-1B, Qwen3-0.6B, Qwen2.5-1.5B) on the mma.sync kernel: whole
// slices up to 1152 deep (1536 at m <= 16), four parts up to 3072 deep at m <= 32; Llama-3's layers keep their stripes.
TEST_CASE("dispatch: the mma.sync kernel's blocks per slice on shallow layers", "[kernels][dispatch]") {
  for (int m : {1, 16, 17, 33, 64}) {
    INFO("m " << m);
    CHECK(mma_auto_parts(m, 896) == 1);
    CHECK(mma_auto_parts(m, 1152) == 1);
    CHECK(mma_auto_parts(m, 4864) == 0);
    for (const Layer& L : {kQkv8B, kO8B, kGateUp8B, kDown8B, kQkv70B, kDown70B, kLarge, kDown1B}) {
      INFO(L.name);
      CHECK(mma_auto_parts(m, L.k) == 0);
    }
  }
  CHECK(mma_auto_parts(16, 1536) == 1);
  CHECK(mma_auto_parts(17, 1536) == kMmaFewParts);  // 1536 x 1536 at m = 48: whole slices 9.4 against 6.7 us
  CHECK(mma_auto_parts(32, 3072) == kMmaFewParts);
  CHECK(mma_auto_parts(33, 2048) == 0);  // 3072 x 1024 at m = 48-64: four parts slower
  CHECK(mma_auto_parts(8, 3200) == 0);
  CHECK(mma_auto_parts(65, 896) == 0);
  CHECK(mma_auto_parts(0, 896) == 0);
}

// Small layers that no other streaming plan takes: 64-column stripes from three 512-deep stages, up to 2^22 weights.
TEST_CASE("dispatch: small layers stream in 64-column stripes at m <= 16", "[kernels][dispatch]") {
  constexpr int kSms = 132;
  const int stripes[][2] = {{1536, 1536}, {1536, 2048}, {2048, 1024}, {3072, 1024}};
  for (auto& kn : stripes) {
    INFO("k " << kn[0] << " n " << kn[1]);
    CHECK(stream_small_stripes(kn[1], kn[0]));
    const StreamPlan p = stream_plan(kn[1], kn[0], kSms, 0);
    CHECK(p.tn == 64);
    CHECK(p.split == 0);
    CHECK(p.rounds == 0);
    CHECK(stream_auto(16, kn[1], kn[0], kSms));
    CHECK_FALSE(stream_auto(17, kn[1], kn[0], kSms));
  }
  CHECK_FALSE(stream_small_stripes(1152, 1024));  // two stages: the mma.sync kernel's whole slices were faster
  CHECK_FALSE(stream_small_stripes(896, 4864));   // 4864 is not a whole number of 512-deep stages
  CHECK_FALSE(stream_small_stripes(2048, 3072));  // above 2^22 weights
  CHECK_FALSE(stream_small_stripes(192, 4096));   // eight stages: deeper splits than timed
  CHECK_FALSE(stream_auto(1, 1152, 1024, kSms));
  // 2048 x 2048 (2^22) keeps the fill search's 64-column quarters.
  CHECK(stream_plan(2048, 2048, kSms, 0).split == 4);
}

// Tiny layers the Hopper kernel runs (Gemma-3-1B q/k/v 1152 x 1536, Qwen2.5-1.5B o 1536 x 1536, Qwen3-0.6B o 2048 x
// 1024): dequantize + cuBLAS at m = 129-896; 1536 x 2048 (3 x 2^20) and Llama-3.2-1B o (2^22) keep the Hopper kernel.
TEST_CASE("dispatch: dequantize + cuBLAS on tiny layers at m = 129-896", "[kernels][dispatch]") {
  for (int64_t w : {int64_t(1152) * 1536, int64_t(1536) * 1536, int64_t(2048) * 1024}) {
    CHECK(hopper_auto_pick(128, w) == HopperAutoPick::Hopper);
    for (int m : {129, 512, 513, 768, 896}) CHECK(hopper_auto_pick(m, w) == HopperAutoPick::DequantCublas);
    CHECK(hopper_auto_pick(897, w) == HopperAutoPick::Hopper);
    CHECK(hopper_auto_pick(1024, w) == HopperAutoPick::Hopper);
  }
  for (int64_t w : {int64_t(1536) * 2048, int64_t(2048) * 2048, int64_t(1024) * 4096})
    for (int m : {129, 256, 512, 768}) CHECK(hopper_auto_pick(m, w) == HopperAutoPick::Hopper);
}

// Layers with n % 256 != 0 but n % 128 == 0 above m = 64 (hopper_n128_pick): the Hopper kernel's 128-column tiles on
// Qwen2.5-0.5B's 4864 x 896 and Gemma-3-1B's 6912 x 1152 (up to m = 2048, as for other layers below 2^26 weights),
// dequantize + cuBLAS on the tiny 896 x 896, 896 x 1152 and 1024 x 1152 at every m; nothing of it at m <= 64.
TEST_CASE("dispatch: Hopper kernel or dequantize + cuBLAS above m = 64 on layers 128 columns wide",
          "[kernels][dispatch]") {
  for (int64_t w : {int64_t(4864) * 896, int64_t(6912) * 1152}) {
    CHECK(hopper_n128_pick(64, w) == HopperAutoPick::MmaSync);
    for (int m : {65, 128, 129, 384, 512, 1024, 2048}) CHECK(hopper_n128_pick(m, w) == HopperAutoPick::Hopper);
    CHECK(hopper_n128_pick(2049, w) == HopperAutoPick::DequantCublas);
  }
  // Their fit tiles in one row chunk only; in more the 128 x 128 tiles (wgmma_fit_n128_chunks).
  const Layer narrow[] = {{"4864 x 896", 4864, 896}, {"6912 x 1152", 6912, 1152}, {"512 x 384", 512, 384}};
  for (const Layer& L : narrow)
    for (int m = 129; m <= 1024; ++m) {
      INFO(L.name << " m " << m);
      const int base = wgmma_fit_rows(m);
      CHECK(wgmma_fit_plan(m, L.n, L.k, 132) == (base > 0 && m <= base ? base : 0));
    }
  CHECK(wgmma_fit_plan(192, 896, 4864, 132) == 192);
  CHECK(wgmma_fit_plan(384, 896, 4864, 132) == 0);
  CHECK(wgmma_fit_plan(384, 1024, 4864, 132) == 192);  // n % 256 == 0: the rules above
  for (int64_t w : {int64_t(896) * 896, int64_t(896) * 1152, int64_t(1024) * 1152}) {
    CHECK(hopper_n128_pick(1, w) == HopperAutoPick::MmaSync);
    CHECK(hopper_n128_pick(64, w) == HopperAutoPick::MmaSync);
    for (int m : {65, 128, 512, 513, 4096}) CHECK(hopper_n128_pick(m, w) == HopperAutoPick::DequantCublas);
  }
}

// Layers the Hopper kernel cannot run (n % 128 != 0) above m = 64 on a Hopper device: dequantize + cuBLAS on small
// layers, on every layer from m = 256 (set on Qwen2.5-0.5B's and Gemma-3-1B's layers before the Hopper kernel ran
// layers 128 columns wide).
TEST_CASE("dispatch: dequantize + cuBLAS above m = 64 on small layers the Hopper kernel cannot run",
          "[kernels][dispatch]") {
  for (int64_t w : {int64_t(896) * 896, int64_t(896) * 1152, int64_t(4864) * 896, int64_t(6912) * 1152}) {
    CHECK_FALSE(hopper_mma_only_dq(64, w));
    CHECK(hopper_mma_only_dq(65, w));
    CHECK(hopper_mma_only_dq(511, w));
  }
  CHECK(hopper_mma_only_dq(100, int64_t(3072) * 3072));
  CHECK_FALSE(hopper_mma_only_dq(255, int64_t(3072) * 5120));  // mma.sync 29.8 against 34.5 us at m = 128
  CHECK(hopper_mma_only_dq(256, int64_t(3072) * 5120));
  CHECK(hopper_mma_only_dq(4096, int64_t(1) << 30));
}

TEST_CASE("dispatch: whole-k stripes at m <= 16 where 128-wide slices fill 75-100% of the SM slots",
          "[kernels][dispatch]") {
  constexpr int kH100Slots = 132 * 2;  // SMs x blocks per SM of the 16-row mma.sync kernel
  for (int m : {1, 8, 16}) {
    INFO("m " << m);
    for (const Layer& L : {kGateUp8B, kLarge}) {  // 224 and 256 slices
      INFO(L.name);
      CHECK(whole_k_stripes(m, L.n, L.k, kH100Slots));
    }
    // Too few slices for the SMs (idle SMs cost more than the reduction saves), or more than one wave
    // (70B gate/up: 448; whole-k on its 256-wide tile measured slower).
    for (const Layer& L : {kQkv8B, kO8B, kDown8B, kQkv70B, kO70B, kGateUp70B, kDown70B}) {
      INFO(L.name);
      CHECK_FALSE(whole_k_stripes(m, L.n, L.k, kH100Slots));
    }
  }
  CHECK_FALSE(whole_k_stripes(17, kGateUp8B.n, kGateUp8B.k, kH100Slots));  // two 16-row chunks
  CHECK_FALSE(whole_k_stripes(0, kGateUp8B.n, kGateUp8B.k, kH100Slots));
  // The fill bounds: 198 slices on 264 slots is exactly 75%, 197 below; 264 is a full wave, 265 over.
  CHECK(whole_k_stripes(1, 198 * 128, 4096, kH100Slots));
  CHECK_FALSE(whole_k_stripes(1, 197 * 128, 4096, kH100Slots));
  CHECK(whole_k_stripes(1, 264 * 128, 4096, kH100Slots));
  CHECK_FALSE(whole_k_stripes(1, 265 * 128, 4096, kH100Slots));
  // The tile must divide the layer; a few SMs (tests' num_sms) scale the bound.
  CHECK_FALSE(whole_k_stripes(1, 198 * 128 + 64, 4096, kH100Slots));
  CHECK_FALSE(whole_k_stripes(1, 224 * 128, 4096 + 64, kH100Slots));
  CHECK(whole_k_stripes(1, 512, 1024, 4));
  CHECK_FALSE(whole_k_stripes(1, 512, 1024, 0));
}

TEST_CASE("dispatch: the streaming kernel's slice width and k-split per layer", "[kernels][dispatch]") {
  constexpr int kSms = 132;  // one block per SM
  struct Want { Layer L; int tn, split, rounds; };
  const Want wants[] = {
      {kQkv8B, 64, 1, 0},   // the short rule: 96 x 1 (73%; 128 x 2 ties: the narrower below 2^25 weights)
      {kO8B, 64, 2, 0},     // the short rule: 64 slices of 64 in halves (clusters)
      {kGateUp8B, 256, 1, 0},  // 112 of 132; 224 slices of 128 in rounds (1 + 92 whole) fill no better
      {kDown8B, 64, 2, 0}, {kQkv70B, 256, 3, 0}, {kO70B, 128, 2, 0},  // 70B o: 128 x 2 ties 64 x 1, the wider
      {kGateUp70B, 128, 2, 3},  // 448 slices of 128: 3 rounds of 132, then 52 in halves (97%)
      {kDown70B, 128, 2, 0}, {kLarge, 256, 1, 0}};  // 128 of 132; 256 of 128 in rounds tie
  for (const Want& w : wants) {
    INFO(w.L.name);
    const StreamPlan p = stream_plan(w.L.n, w.L.k, kSms, 0);
    CHECK(p.tn == w.tn);
    CHECK(p.split == w.split);
    CHECK(p.rounds == w.rounds);
  }
  // The fill bound: 99 slices of 256 on 132 SMs is exactly 75%, 98 below it (stripes). Left free to take
  // 128 columns, the same layers go to rounds (198 slices: 1 round, 66 in halves, 100%).
  CHECK(stream_plan(99 * 256, 4096, kSms, 256).split == 1);
  CHECK(stream_plan(98 * 256, 4096, kSms, 256).split == 0);
  CHECK(stream_plan(99 * 256, 4096, kSms, 0).rounds == 1);
  // Rounds below the bound fall back to stripes: 6 slices of 128, one 256-deep stage each, on 5 SMs take
  // 2 rounds' time for 1.2 rounds' work (60%).
  CHECK(stream_plan(768, 256, 5, 128).split == 0);
  CHECK(stream_plan(768, 256, 5, 128).rounds == 0);
  // A forced width keeps its slices (stripes where its split fills too few SMs); widths that do not
  // divide n, or stages that do not divide k, are not offered.
  CHECK(stream_plan(kQkv8B.n, kQkv8B.k, kSms, 128).tn == 128);
  CHECK(stream_plan(kQkv8B.n, kQkv8B.k, kSms, 128).split == 0);
  CHECK(stream_plan(kQkv8B.n, kQkv8B.k, kSms, 96).tn == 0);   // no such width
  // The short rule (whole slices or halves filling 70%, the wider on ties from 2^25 weights) against the fill search.
  CHECK(stream_short_plan(kDown70B.n, kDown70B.k, kSms).tn == 128);  // 128 x 2 ties 64 x 1: the wider from 2^25
  CHECK(stream_short_plan(6144, 6144, kSms).tn == 128);  // 2^25.2 weights: 128 x 2 ties 64 x 1, the wider
  CHECK(stream_short_plan(6144, 5120, kSms).tn == 64);   // 2^24.9: the narrower
  CHECK(stream_plan(kDown70B.n, kDown70B.k, kSms, 64).split == 1);
  CHECK(stream_short_plan(kQkv70B.n, kQkv70B.k, kSms).tn == 0);      // 80 blocks at most (61%): the search
  CHECK(stream_short_plan(kGateUp70B.n, kGateUp70B.k, kSms).tn == 0);  // more slices than SMs: rounds
  CHECK(stream_short_plan(kGateUp8B.n, kGateUp8B.k, kSms).tn == 0);  // 448 slices of 64: left to the search
  CHECK(stream_short_plan(4096, 2048, kSms).split == 2);     // 2^23 weights: 64 slices of 64 in halves
  CHECK(stream_fill_plan(4096, 2048, kSms, 256).split == 8);  // 16 x 8; 32 x 4 and 64 x 2 cut fewer parts
  CHECK(stream_fill_plan(4096, 2048, kSms, 0).tn == 64);
  CHECK(stream_fill_plan(4096, 2048, kSms, 0).split == 2);
  CHECK(stream_short_plan(4096, 4096, 100).tn == 0);         // 64 blocks of 100 SMs at most (64%)
  CHECK(stream_short_plan(4096, 4096, 128).split == 2);      // 128 of 128
  CHECK(stream_short_plan(4096, 4096, 127).tn == 0);         // 128 blocks do not fit 127 SMs; 64 is 50%
  CHECK(stream_plan(192, 4096, kSms, 0).tn == 0);
  CHECK(stream_plan(192, 4096, kSms, 64).tn == 64);            // 3 slices of 64: stripes
  CHECK(stream_plan(4096, 128, kSms, 0).tn == 256);    // 256-deep stages of the 128 slice do not divide 128
  CHECK(stream_plan(4096, 128, kSms, 128).tn == 0);
  CHECK(stream_plan(512, 1024, 4, 0).split == 1);      // tests' few SMs: 4 slices of 128 on 4 SMs
  CHECK(stream_plan(512, 1024, 5, 256).split == 2);    // 2 slices of 256 split in two on 5 SMs (80%)
}

TEST_CASE("dispatch: Auto takes the streaming kernel on large layers at m <= 16", "[kernels][dispatch]") {
  constexpr int kSms = 132;
  for (int m : {1, 2, 4, 8}) {
    INFO("m " << m);
    // 70B o (2^26): its plan splits 64 slices of 128 in two, which run as clusters (kStreamClusterSplit).
    for (const Layer& L : {kGateUp8B, kDown70B, kLarge, kGateUp70B, kO70B}) {
      INFO(L.name);
      CHECK(stream_auto(m, L.n, L.k, kSms));
    }
    // The short rule's layers (8B o and down: 64-column slices in halves; 8B q/k/v: whole 64-column slices).
    for (const Layer& L : {kO8B, kDown8B, kQkv8B}) {
      INFO(L.name);
      CHECK(stream_auto(m, L.n, L.k, kSms));
    }
    // 70B q/k/v (2^26.3) splits 40 slices of 256 in three: in since kStreamSmallMLayer is 2^26 (faster on the H200).
    CHECK(stream_auto(m, kQkv70B.n, kQkv70B.k, kSms));
    // No size threshold since the thirty-ninth session: 1B gate/up (n 16384, k 2048: 2^25, 256 slices of 64, so no
    // short plan) takes the search's 128 whole slices of 128.
    CHECK(stream_short_plan(16384, 2048, kSms).tn == 0);
    CHECK(stream_auto(m, 16384, 2048, kSms));
  }
  for (int m : {9, 12, 16}) {
    INFO("m " << m);
    for (const Layer& L : {kGateUp8B, kDown8B, kO8B, kQkv8B, kQkv70B, kO70B, kDown70B, kLarge, kGateUp70B}) {
      INFO(L.name);
      CHECK(stream_auto(m, L.n, L.k, kSms));
    }
    CHECK(stream_auto(m, 4096, 2048, kSms));  // 2^23 weights: 64 slices of 64 in halves (the short rule)
  }
  // Layers too narrow for any plan to fill 75% of the SMs keep the other kernels: 16 slices of 64 or 128 at most.
  CHECK_FALSE(stream_auto(1, 1024, 1024, kSms));
  CHECK(stream_plan(kO70B.n, kO70B.k, kSms, 0).split == kStreamClusterSplit);
  CHECK(stream_plan(kQkv70B.n, kQkv70B.k, kSms, 0).split == 3);
  CHECK_FALSE(stream_auto(17, kLarge.n, kLarge.k, kSms));
  CHECK_FALSE(stream_auto(0, kLarge.n, kLarge.k, kSms));
}

TEST_CASE("dispatch: narrower layers than Llama-3's stream at m <= 16, with the fewest parts per slice",
          "[kernels][dispatch]") {
  constexpr int kSms = 132;
  struct Want { Layer L; int tn, split; };
  const Want wants[] = {
      {kQkv1B, 64, 2}, {kO3B, 64, 2}, {kOQ7B, 64, 2},  // the short rule below 2^24: 48, 48 and 56 slices in halves
      {kQkv3B, 128, 3}, {kOQ32B, 128, 3},              // 40 slices of 128 in thirds tie 20 of 256 in sixths
      {kQkvQ7B, 128, 3},   // 36 x 3 (82%) before 18 of 256 x 7 (95%): fewer parts
      {kO1B, 64, 4}, {kDown1B, 64, 4},                 // 32 x 4 before 16 x 8 and 8 x 16 (all 97%)
      {kGateUp1B, 128, 1}, {kGateUp3B, 128, 1}};       // 128 whole slices of 128 (97%), as many as 64 of 256 in halves
  for (const Want& w : wants) {
    INFO(w.L.name);
    const StreamPlan p = stream_plan(w.L.n, w.L.k, kSms, 0);
    CHECK(p.tn == w.tn);
    CHECK(p.split == w.split);
    CHECK(p.rounds == 0);
    for (int m : {1, 8, 9, 16}) CHECK(stream_auto(m, w.L.n, w.L.k, kSms));
  }
  // The fill search's own pick where its widths' parts are compared: 256 columns fill more, 128 cut fewer parts.
  CHECK(stream_fill_plan(kQkvQ7B.n, kQkvQ7B.k, kSms, 256).split == 7);
  CHECK(stream_fewest_parts(kQkvQ7B.n, kQkvQ7B.k, kSms, StreamPlan{256, 7, 0}).tn == 128);
  CHECK(stream_fewest_parts(kQkvQ7B.n, kQkvQ7B.k, kSms, StreamPlan{128, 3, 0}).tn == 128);
  CHECK(stream_fewest_parts(kQkvQ7B.n, kQkvQ7B.k, 100, StreamPlan{256, 5, 0}).split == 5);  // 36 x 2: 72%, too few
  // The GPU test's case ([stream]): 512 x 2048 on 32 SMs, eight 64-column slices in four parts.
  CHECK(stream_plan(512, 2048, 32, 0).tn == 64);
  CHECK(stream_plan(512, 2048, 32, 0).split == 4);
}

TEST_CASE("dispatch: 128 x 128 Hopper tiles above m = 64 where 128 x 256 tiles leave few output tiles",
          "[kernels][dispatch]") {
  constexpr int kSms = 132;
  // Measured faster with 128 x 128 tiles (docs/PERF.md, thirty-first session, call 7).
  for (const Layer& L : {kO8B, kQkv8B, kDown8B, kO70B, kQkv70B}) {
    INFO(L.name);
    CHECK(wgmma_prefer_128x128(128, L.n, L.k, kSms));
    CHECK(wgmma_prefer_128x128(100, L.n, L.k, kSms));  // one 128-row chunk, as at 128
  }
  for (const Layer& L : {kO8B, kQkv8B, kDown8B}) {
    INFO(L.name);
    CHECK(wgmma_prefer_128x128(256, L.n, L.k, kSms));
  }
  CHECK(wgmma_prefer_128x128(512, kO8B.n, kO8B.k, kSms));
  // Measured slower with them: deep (70B down at 128) or tiles enough (8B down at 512, 70B o at 256).
  CHECK_FALSE(wgmma_prefer_128x128(128, kDown70B.n, kDown70B.k, kSms));
  CHECK_FALSE(wgmma_prefer_128x128(512, kDown8B.n, kDown8B.k, kSms));
  CHECK_FALSE(wgmma_prefer_128x128(256, kO70B.n, kO70B.k, kSms));
  for (const Layer& L : {kGateUp70B, kGateUp8B, kLarge}) {
    INFO(L.name);
    CHECK_FALSE(wgmma_prefer_128x128(128, L.n, L.k, kSms));
    CHECK_FALSE(wgmma_prefer_128x128(256, L.n, L.k, kSms));
  }
  // Large m fills the SMs with 128 x 256 tiles; m <= 64 has its own tiles.
  for (const Layer& L : {kO8B, kQkv8B, kDown8B}) {
    INFO(L.name);
    CHECK_FALSE(wgmma_prefer_128x128(1024, L.n, L.k, kSms));
  }
  CHECK_FALSE(wgmma_prefer_128x128(512, kQkv8B.n, kQkv8B.k, kSms));  // 4% faster, below the threshold (0.008)
  CHECK_FALSE(wgmma_prefer_128x128(64, kO8B.n, kO8B.k, kSms));
  // Few SMs (the tests' forced grids): tiles >= SMs never split; n must hold whole 128-column slices.
  CHECK_FALSE(wgmma_prefer_128x128(128, kO8B.n, kO8B.k, 3));
  CHECK_FALSE(wgmma_prefer_128x128(128, 0, kO8B.k, kSms));
  CHECK_FALSE(wgmma_prefer_128x128(128, 256 + 64, kO8B.k, kSms));
}

TEST_CASE("dispatch: Hopper launches give blocks whole column slices where those fill a chunk's blocks evenly",
          "[kernels][dispatch]") {
  constexpr int kSms = 132;
  // One slice per block. 70B down and o at m = 512: 4 row chunks of 128 rows, 33 blocks each, 32 slices.
  CHECK(wgmma_whole_slices(512, kDown70B.n, 128, kSms) == 1);
  CHECK(wgmma_whole_slices(512, kO70B.n, 128, kSms) == 1);
  // 8B gate/up at m = 128 (112 slices of 132 blocks) and 32768^2 at m = 64 and 128 (128 of 132).
  CHECK(wgmma_whole_slices(128, kGateUp8B.n, 128, kSms) == 1);
  CHECK(wgmma_whole_slices(64, kLarge.n, 64, kSms) == 1);
  // The rule itself knows no blocks per SM (the launcher applies it at one): 224 slices of 264 blocks.
  CHECK(wgmma_whole_slices(32, kGateUp70B.n, 32, 2 * kSms) == 1);
  // Several slices per block from m = 65 where they fill 95%: 70B gate/up at 512 (7 each of 33 blocks, 97%),
  // 32768^2 at 256 and 512 (97%), and where stripes were whole slices already (8B gate/up at 1024: 7 x 16).
  CHECK(wgmma_whole_slices(512, kGateUp70B.n, 128, kSms) == 7);
  CHECK(wgmma_whole_slices(256, kLarge.n, 128, kSms) == 2);
  CHECK(wgmma_whole_slices(512, kLarge.n, 128, kSms) == 4);
  CHECK(wgmma_whole_slices(1024, kGateUp8B.n, 128, kSms) == 7);
  // Stripes where the slices fill less: 8B o at m = 512 (16 of 33 blocks), 70B q/k/v at 512 (40 of 2 x 33),
  // 8B gate/up at 256 and 512 and 70B gate/up at 128 and 256 (85%), 8B q/k/v at 1024 (2 x 16: 75%), 70B
  // q/k/v at 1024 (3 x 16: 83%); and at m <= 64 where a block would need several (70B gate/up at m = 64:
  // 224 slices of 132 blocks).
  CHECK(wgmma_whole_slices(512, kO8B.n, 128, kSms) == 0);
  CHECK(wgmma_whole_slices(512, kQkv70B.n, 128, kSms) == 0);
  for (int m : {256, 512}) CHECK(wgmma_whole_slices(m, kGateUp8B.n, 128, kSms) == 0);
  for (int m : {128, 256}) CHECK(wgmma_whole_slices(m, kGateUp70B.n, 128, kSms) == 0);
  CHECK(wgmma_whole_slices(1024, kQkv8B.n, 128, kSms) == 0);
  CHECK(wgmma_whole_slices(1024, kQkv70B.n, 128, kSms) == 0);
  CHECK(wgmma_whole_slices(64, kGateUp70B.n, 64, kSms) == 0);
  CHECK(wgmma_whole_slices(128, kO8B.n, 64, kSms) == 0);
  // More row chunks than blocks: the partition already gives blocks whole chunks.
  CHECK(wgmma_whole_slices(100000, kO8B.n, 128, kSms) == 0);
  CHECK(wgmma_whole_slices(128, 128, 128, kSms) == 0);  // no 256-wide slice
  // The partition it asks for: whole slices, the grid within the blocks, the last block fewer.
  for (int m : {128, 256, 512, 1024})
    for (int n : {kGateUp8B.n, kGateUp70B.n, kQkv8B.n, kQkv70B.n, kLarge.n}) {
      const int each = wgmma_whole_slices(m, n, 128, kSms);
      if (each == 0) continue;
      INFO("m " << m << " n " << n << " each " << each);
      const int slices = n / 256, k_tiles = 64;
      const Partition P = marlin_partition(m, slices, k_tiles, 128, kSms, each);
      CHECK(P.grid <= kSms);
      CHECK(P.iters == each * k_tiles);
      CHECK(P.chunk_blocks == (slices + each - 1) / each);
      CHECK(slice_first_block(0, slices - 1, k_tiles, P.iters) == slice_last_block(0, slices - 1, k_tiles, P.iters));
    }
}

// The Hopper kernel's pair form (wgmma_pair_tiles): the layers timed faster with pairs take them, the 64-row tiles
// that measured slower do not; and the partition the launcher asks for gives each tile exactly two consecutive
// blocks (one cluster, rank = block % 2), half the k tiles each.
// One chunk of fit rows whose stripes cut 8B o's slices into four parts gives way to two 128-row chunks where those
// pad at most 25% more rows (wgmma_fit_split_deep): 8B o at m = 193-240; not with more padding (m = 192: 33%), not on
// the deep 8B down nor on 8B q/k/v (three parts).
TEST_CASE("dispatch: shallow narrow layers take 128-row chunks over one deeply cut fit chunk", "[kernels][dispatch]") {
  constexpr int kSms = 132;
  for (int m : {193, 200, 208, 224, 240}) {
    INFO("m " << m);
    CHECK(wgmma_fit_rows(m) > 0);
    CHECK(wgmma_fit_plan(m, kO8B.n, kO8B.k, kSms) == 0);
    CHECK(wgmma_prefer_128x128(m, kO8B.n, kO8B.k, kSms));  // so Auto runs 2 x 32 tiles of 128 x 128
    CHECK(wgmma_fit_plan(m, kDown8B.n, kDown8B.k, kSms) == wgmma_fit_rows(m));
    CHECK(wgmma_fit_plan(m, kQkv8B.n, kQkv8B.k, kSms) == wgmma_fit_rows(m));
  }
  CHECK(wgmma_fit_plan(192, kO8B.n, kO8B.k, kSms) == 192);
  CHECK(wgmma_fit_plan(160, kO8B.n, kO8B.k, kSms) == 160);
  CHECK(wgmma_fit_plan(300, kO8B.n, kO8B.k, kSms) == wgmma_fit_rows(300));  // two chunks: pairs
  CHECK_FALSE(wgmma_fit_split_deep(200, kO70B.n, kO70B.k, kSms, 208));    // k = 8192, and 64 slices
}

// Two or more chunks of fit rows whose stripes cut every slice into 2.5 parts or more give way to the 128 x 128 tiles
// where those cost at most 15% more products per block (wgmma_fit_split_shallow): the small layers timed faster on them
// (1536 x 2048, 2048 x 2048, 2048 x 3072 at m = 384 and 448; 1536 x 2048 and 2048 x 2048 at 576), not the layers whose
// fit stripes cut slices in two or fewer (8B o, 1024 x 4096, 3072 x 5120: slower), not at m = 288 (33% more products)
// nor at 768 (two parts), and no Llama-3 layer at any m.
TEST_CASE("dispatch: small shallow layers take 128 x 128 tiles over fit chunks cut in many parts",
          "[kernels][dispatch]") {
  constexpr int kSms = 132;
  const Layer kQkvQ15B{"Qwen 1.5B q/k/v", 1536, 2048};
  for (int m : {336, 384, 432, 480}) {
    INFO("m " << m);
    for (const Layer& L : {kQkvQ15B, kO1B, kQkv1B, kO3B}) {
      INFO(L.name);
      CHECK(wgmma_fit_rows(m) > 0);
      CHECK(wgmma_fit_split_shallow(m, L.n, L.k, kSms, wgmma_fit_rows(m)));
      CHECK(wgmma_fit_plan(m, L.n, L.k, kSms) == 0);
      CHECK(wgmma_prefer_128x128(m, L.n, L.k, kSms));  // so Auto runs 128 x 128 tiles
      CHECK_FALSE(wgmma_prefer_192(m, L.n, L.k, kSms));
    }
  }
  for (const Layer& L : {kQkvQ15B, kO1B}) CHECK(wgmma_fit_plan(576, L.n, L.k, kSms) == 0);
  for (const Layer& L : {kQkvQ15B, kO1B, kQkv1B, kO3B}) {
    INFO(L.name);
    CHECK(wgmma_fit_plan(288, L.n, L.k, kSms) == wgmma_fit_rows(288));
    CHECK(wgmma_fit_plan(768, L.n, L.k, kSms) == wgmma_fit_rows(768));
  }
  const Layer kWide{"1024 x 4096", 1024, 4096};
  for (int m : {320, 384, 400, 448})
    for (const Layer& L : {kO8B, kWide, kQkv3B}) {
      INFO(L.name << " m " << m);
      CHECK(wgmma_fit_plan(m, L.n, L.k, kSms) != 0);  // fit tiles: the fewest chunks, or whole slices in more
      CHECK_FALSE(wgmma_fit_split_shallow(m, L.n, L.k, kSms, wgmma_fit_rows(m)));
    }
  // Above 4096 deep the rule does not apply; nor with one chunk (wgmma_fit_split_deep's case).
  CHECK_FALSE(wgmma_fit_split_shallow(432, kO1B.n, 4096 + 512, kSms, wgmma_fit_rows(432)));
  CHECK_FALSE(wgmma_fit_split_shallow(400, kO1B.n, kO1B.k, kSms, wgmma_fit_rows(400)));  // 4 x 128 rows pad 23% more
  CHECK_FALSE(wgmma_fit_split_shallow(200, kO1B.n, kO1B.k, kSms, 208));
  for (const Layer& L : {kQkv8B, kO8B, kGateUp8B, kDown8B, kQkv70B, kO70B, kGateUp70B, kDown70B, kLarge})
    for (int m = 129; m <= kWgmmaFitMaxM; ++m) {
      const int base = wgmma_fit_rows(m);
      if (base == 0) continue;
      INFO(L.name << " m " << m);
      CHECK_FALSE(wgmma_fit_split_shallow(m, L.n, L.k, kSms, base));
    }
}

TEST_CASE("dispatch: Hopper tiles split in two as clusters where pairs fill 90% of the SMs", "[kernels][dispatch]") {
  constexpr int kSms = 132;
  // 64 tiles of 128 rows, 128 blocks: 8B o and down at m = 512, 70B o and down at 256.
  CHECK(wgmma_pair_tiles(512, kO8B.n, kO8B.k, 128, kSms));
  CHECK(wgmma_pair_tiles(512, kDown8B.n, kDown8B.k, 128, kSms));
  CHECK(wgmma_pair_tiles(256, kO70B.n, kO70B.k, 128, kSms));
  CHECK(wgmma_pair_tiles(256, kDown70B.n, kDown70B.k, 128, kSms));
  CHECK(wgmma_pair_tiles(200, kO70B.n, kO70B.k, 128, kSms));  // a partial last row chunk
  // 64-row tiles (8B o at m = 256, 70B o at 128: slower in pairs), whole-slice plans (70B o and down at 512),
  // too many tiles (8B q/k/v at 512: 96), too few (8B o at 256 in 128-row tiles: 32 of 132 blocks in pairs),
  // m <= 64, and k not a whole number of two-tile halves.
  CHECK_FALSE(wgmma_pair_tiles(256, kO8B.n, kO8B.k, 64, kSms));
  CHECK_FALSE(wgmma_pair_tiles(128, kO70B.n, kO70B.k, 64, kSms));
  CHECK_FALSE(wgmma_pair_tiles(512, kO70B.n, kO70B.k, 128, kSms));
  CHECK_FALSE(wgmma_pair_tiles(512, kDown70B.n, kDown70B.k, 128, kSms));
  CHECK_FALSE(wgmma_pair_tiles(512, kQkv8B.n, kQkv8B.k, 128, kSms));
  CHECK_FALSE(wgmma_pair_tiles(256, kO8B.n, kO8B.k, 128, kSms));
  CHECK_FALSE(wgmma_pair_tiles(64, kO70B.n, kO70B.k, 128, kSms));
  CHECK_FALSE(wgmma_pair_tiles(512, kO8B.n, 4096 + 64, 128, kSms));
  // Auto's fit tiles (wgmma_fit_plan) in pairs: 8B o and down at m = 257-480 (2 row chunks x 32 slices of 128), 70B o
  // and down at 129-240 (1 x 64); not 8B q/k/v there (2 x 48: 192 blocks) nor 8B o at 600 (3 x 32).
  for (const Layer& L : {kO8B, kDown8B})
    for (int m : {257, 300, 392, 450, 480}) {
      INFO(L.name << " m " << m);
      CHECK(wgmma_pair_tiles(m, L.n, L.k, wgmma_fit_plan(m, L.n, L.k, kSms), kSms));
    }
  for (const Layer& L : {kO70B, kDown70B})
    for (int m : {129, 160, 200, 240}) {
      INFO(L.name << " m " << m);
      CHECK(wgmma_pair_tiles(m, L.n, L.k, wgmma_fit_plan(m, L.n, L.k, kSms), kSms));
    }
  CHECK_FALSE(wgmma_pair_tiles(392, kQkv8B.n, kQkv8B.k, wgmma_fit_rows(392), kSms));
  CHECK_FALSE(wgmma_pair_tiles(600, kO8B.n, kO8B.k, wgmma_fit_rows(600), kSms));
  // Every benchmark layer at every m: where the rule holds on 128-row tiles or Auto's fit tiles, the pair partition.
  for (int m : {65, 100, 128, 129, 200, 256, 300, 392, 480, 512, 700, 1024, 2048})
    for (const Layer& L : {kQkv8B, kO8B, kGateUp8B, kDown8B, kQkv70B, kO70B, kGateUp70B, kDown70B, kLarge}) {
      const int fit = wgmma_fit_plan(m, L.n, L.k, kSms), rows = fit > 0 ? fit : 128;
      if (!wgmma_pair_tiles(m, L.n, L.k, rows, kSms)) continue;
      INFO(L.name << " m " << m << " rows " << rows);
      const int par = (m + rows - 1) / rows, n_tiles = L.n / wgmma_tile_n(rows), k_tiles = L.k / 64;
      const Partition P = marlin_partition(m, n_tiles, k_tiles, rows, 2 * par * n_tiles);
      CHECK(P.grid <= kSms);
      CHECK(P.grid * 100 >= kSms * kWgmmaPairMinFillPct);
      CHECK(P.iters * 2 == k_tiles);
      CHECK(P.chunk_groups == par);
      for (int t = 0; t < n_tiles; ++t) {
        CHECK(slice_first_block(0, t, k_tiles, P.iters) == 2 * t);
        CHECK(slice_last_block(0, t, k_tiles, P.iters) == 2 * t + 1);
      }
    }
}

// The streaming kernel's tile sequences (stream_ranges, walked as the kernel walks them): every (slice,
// k tile) once; the blocks that share a slice are the contiguous split blocks the kernel names as its
// first/last block, and round slices have one block each. Where the launcher runs slices split in two as
// two-block clusters, each slice's blocks are one cluster with the finisher at rank 0, which the CLUSTER form
// assumes when its partner maps the finisher's shared memory (marlin_stream.cuh, map_to_rank(..., 0)).
TEST_CASE("dispatch: the streaming kernel's rounds cover every tile once", "[kernels][dispatch]") {
  struct Case { int n, k, sms, tn; };
  const Case cases[] = {{57344, 8192, 132, 0}, {768, 1024, 1, 128}, {768, 1024, 5, 128}, {1280, 2048, 3, 128},
                        {2048, 512, 7, 256}, {99 * 256, 4096, 132, 0}, {512, 1024, 5, 256}, {768, 256, 5, 128},
                        {8192, 8192, 132, 0}, {8192, 28672, 132, 0}, {256, 2048, 4, 128}};
  int clustered_cases = 0;
  for (const Case& c : cases) {
    INFO("n " << c.n << " k " << c.k << " sms " << c.sms << " tn " << c.tn);
    const StreamPlan pl = stream_plan(c.n, c.k, c.sms, c.tn);
    REQUIRE(pl.tn != 0);
    const int n_tiles = c.n / pl.tn, k_tiles = c.k / stream_tk(pl.tn), nk = n_tiles * k_tiles;
    // The launcher's grid and stripe length (marlin.cu, run_stream; stripes: one block per SM).
    const int iters = (nk + c.sms - 1) / c.sms;
    const int grid = pl.rounds > 0 ? c.sms : pl.split > 0 ? n_tiles * pl.split : (nk + iters - 1) / iters;
    REQUIRE(grid <= c.sms);
    std::vector<int> seen(size_t(nk), 0), owner_lo(size_t(n_tiles), 1 << 30), owner_hi(size_t(n_tiles), -1);
    for (int b = 0; b < grid; ++b) {
      const StreamRanges r = stream_ranges(b, grid, pl.rounds, pl.split, iters, n_tiles, k_tiles);
      for (int q = 0; q <= r.rounds; ++q) {
        const int lo = q < r.rounds ? (q * grid + b) * k_tiles : r.t0, hi = q < r.rounds ? lo + k_tiles : r.t1;
        for (int it = lo; it < hi; ++it) {
          REQUIRE(it >= 0);
          REQUIRE(it < nk);
          ++seen[size_t(it)];
          owner_lo[size_t(it / k_tiles)] = std::min(owner_lo[size_t(it / k_tiles)], b);
          owner_hi[size_t(it / k_tiles)] = std::max(owner_hi[size_t(it / k_tiles)], b);
        }
      }
    }
    for (int v : seen) REQUIRE(v == 1);
    if (pl.split == 0) continue;  // stripes: the partition replay (test_marlin_partition.cpp) covers them
    // The kernel's first/last block of each slice (marlin_stream.cuh) are the blocks that computed it.
    const int whole = pl.rounds * grid;
    for (int slice = 0; slice < n_tiles; ++slice) {
      const int first = slice < whole ? slice % grid : (slice - whole) * pl.split;
      const int last = slice < whole ? first : first + pl.split - 1;
      REQUIRE(owner_lo[size_t(slice)] == first);
      REQUIRE(owner_hi[size_t(slice)] == last);
    }
    // The launcher's cluster condition (marlin.cu, run_stream): split in two and an even grid, so that the
    // clusters of blockIdx.x / 2 tile it.
    if (pl.split != kStreamClusterSplit || grid % kStreamClusterSplit != 0) continue;
    ++clustered_cases;
    for (int slice = whole; slice < n_tiles; ++slice) {
      REQUIRE(owner_lo[size_t(slice)] % kStreamClusterSplit == 0);  // the finisher is its cluster's rank 0
      REQUIRE(owner_hi[size_t(slice)] / kStreamClusterSplit == owner_lo[size_t(slice)] / kStreamClusterSplit);
    }
  }
  CHECK(clustered_cases >= 3);  // 70B gate/up (rounds, then halves), 70B o and down, the [stream] GPU shapes
}

TEST_CASE("dispatch: the streaming kernel's swapped fragments map onto the 16-token ones", "[kernels][dispatch]") {
  // Element (row, column) of a product held by each lane and register of an m16n8 C fragment (PTX ISA).
  auto frag_row = [](int lane, int reg) { return lane / 4 + 8 * (reg / 2); };
  auto frag_col = [](int lane, int reg) { return 2 * (lane % 4) + reg % 2; };
  int checked = 0;
  for (int lane = 0; lane < 32; ++lane)
    for (int a = 0; a < 8; ++a)
      for (int e = 0; e < 2; ++e) {
        // The 16-token form: acc[a] register e is token frag_row, column 8 a + frag_col of the 64-column block.
        const int token = frag_row(lane, e), column = 8 * a + frag_col(lane, e);
        const FragSource src = swapped_frag_source(lane, a, e);
        INFO("lane " << lane << " tile " << a << " element " << e);
        REQUIRE(src.lane >= 0);
        REQUIRE(src.lane < 32);
        REQUIRE(src.reg >= 0);
        REQUIRE(src.reg < 4);
        CHECK(src.reg / 2 == a % 2);  // the kernel shuffles registers 2 (a % 2) and + 1 of c[a / 2]
        // SWAP: c[a / 2] register r is column 16 (a / 2) + frag_row, token frag_col.
        CHECK(16 * (a / 2) + frag_row(src.lane, src.reg) == column);
        CHECK(frag_col(src.lane, src.reg) == token);
        ++checked;
      }
  CHECK(checked == 32 * 8 * 2);
}

// Auto's two launches (auto_split_head): only past a whole number of 128-row chunks by at most
// kSplitTailMaxRows rows and where no fit tile applies, the first launch whole chunks and the second the rest.
TEST_CASE("dispatch: m just past whole row chunks splits into whole chunks and the rest", "[kernels][dispatch]") {
  for (int m = 1; m <= 5000; ++m) {
    const int head = auto_split_head(m);
    INFO("m " << m);
    if (head == 0) {
      CHECK((m <= kSplitChunkRows || m % kSplitChunkRows == 0 || m % kSplitChunkRows > kSplitTailMaxRows ||
             wgmma_fit_rows(m) > 0));
      continue;
    }
    CHECK(wgmma_fit_rows(m) == 0);
    CHECK(m > kWgmmaFitMaxM);  // every m with 1-16 rows past whole chunks up to there has a fit tile
    CHECK(head % kSplitChunkRows == 0);
    CHECK(head >= kSplitChunkRows);
    CHECK(m - head >= 1);
    CHECK(m - head <= kSplitTailMaxRows);
    CHECK(auto_split_head(head) == 0);      // the first launch does not split again
    CHECK(auto_split_head(m - head) == 0);  // nor the rest
  }
  CHECK(auto_split_head(129) == 0);  // 1 x 144 rows (the fit tiles come first since the thirty-fourth session)
  CHECK(auto_split_head(264) == 0);  // 2 x 144
  CHECK(auto_split_head(1025) == 1024);
  CHECK(auto_split_head(1000) == 0);  // 104 rows past 896: one launch
  CHECK(auto_split_head(100) == 0);   // one chunk
}

// The fit tiles (wgmma_fit_rows): from m = 129 to kWgmmaFitMaxM a built fit tile, in as few chunks as the tallest fit
// tile needs, the shortest that holds m in them, padding m no more than 128-row chunks; 0 only where no such tile does;
// nothing outside that range.
TEST_CASE("dispatch: fit tiles in the fewest row chunks where those pad m no more than 128-row chunks",
          "[kernels][dispatch]") {
  const int tallest = kWgmmaWideRows - kWgmmaFitStep;
  for (int m = 1; m <= 5000; ++m) {
    const int fit = wgmma_fit_rows(m);
    INFO("m " << m << " fit " << fit);
    if (m <= 128 || m > kWgmmaFitMaxM) {
      CHECK(fit == 0);
      continue;
    }
    const int chunks = (m + tallest - 1) / tallest, pad128 = (m + 127) / 128 * 128;
    if (fit == 0) {  // no fit tile holds m in that many chunks within the 128-row chunks' rows
      for (int r = kWgmmaFitMinRows; r <= tallest; r += kWgmmaFitStep)
        CHECK((chunks * r < m || chunks * r > pad128));
      continue;
    }
    CHECK(wgmma_fit_tile(fit));
    CHECK((m + fit - 1) / fit == chunks);                       // as few chunks as any fit tile allows
    CHECK((fit == kWgmmaFitMinRows || chunks * (fit - kWgmmaFitStep) < m));  // the shortest that holds m
    CHECK(chunks * fit <= pad128);
  }
  // The measured points (docs/PERF.md, thirty-third session) and the m that keep 128-row tiles.
  CHECK(wgmma_fit_rows(150) == 160);
  CHECK(wgmma_fit_rows(300) == 160);
  CHECK(wgmma_fit_rows(384) == 192);
  CHECK(wgmma_fit_rows(420) == 224);
  CHECK(wgmma_fit_rows(560) == 192);
  CHECK(wgmma_fit_rows(768) == 192);
  CHECK(wgmma_fit_rows(640) == 0);  // 3 x 224 = 672 rows against 5 x 128 = 640
  for (int m : {128, 256, 512, 1024}) CHECK(wgmma_fit_rows(m) == 0);
}

// Auto's rows per layer (wgmma_fit_plan): wgmma_fit_rows's, or a fit tile in more chunks that gives every block one or
// two whole column slices for at most wgmma_fit_whole_slack_pct(k) % more products per block than the plan it replaces,
// where that plan has no whole slices of its own, or the 128-row tiles where wgmma_fit_split_deep holds.
TEST_CASE("dispatch: fit tiles in more chunks where those give every block whole slices", "[kernels][dispatch]") {
  constexpr int kSms = 132;  // the H100's SMs, one block each
  const Layer layers[] = {kQkv8B, kO8B, kGateUp8B, kDown8B, kQkv70B, kO70B, kGateUp70B, kDown70B, kLarge,
                          {"3072 x 1024", 3072, 1024}, {"2048 x 1536", 2048, 1536}};
  int changed = 0;
  for (const Layer& L : layers)
    for (int sms : {kSms, 16, 33, 64, 100})
      for (int m = 1; m <= 1100; ++m) {
        const int base = wgmma_fit_rows(m), rows = wgmma_fit_plan(m, L.n, L.k, sms);
        if (rows == base) continue;
        INFO(L.name << " m " << m << " on " << sms << " SMs: " << base << " -> " << rows);
        ++changed;
        if (rows == 0) {  // fit rows whose stripes cut the slices deeply: the 128-row tiles
          CHECK((wgmma_fit_split_deep(m, L.n, L.k, sms, base) || wgmma_fit_split_shallow(m, L.n, L.k, sms, base)));
          continue;
        }
        REQUIRE(wgmma_fit_tile(rows));
        const int each = wgmma_whole_slices(m, L.n, rows, sms, kWgmmaWideTileN);
        CHECK(each >= 1);
        CHECK(each <= kWgmmaFitWholeMaxEach);
        CHECK((m + rows - 1) / rows * rows <= (m + 127) / 128 * 128);
        CHECK((m + rows - 1) / rows > (base > 0 ? (m + base - 1) / base : 0));  // more chunks than the fewest
        // The plan it replaces: those rows, or 128-row tiles (128 x 128 where wgmma_prefer_128x128 holds).
        const int rows0 = base > 0 ? base : 128;
        const int tn0 = base > 0 ? kWgmmaWideTileN : wgmma_prefer_128x128(m, L.n, L.k, sms) ? 128 : kWgmmaTileN;
        CHECK(wgmma_whole_slices(m, L.n, rows0, sms, tn0) == 0);
        const int64_t w = wgmma_block_work(m, L.n, L.k, rows, kWgmmaWideTileN, sms);
        const int64_t w0 = wgmma_block_work(m, L.n, L.k, rows0, tn0, sms);
        CHECK(w * 100 <= w0 * (100 + wgmma_fit_whole_slack_pct(L.k)));
        CHECK(w == int64_t(each) * (L.k / 64) * rows * kWgmmaWideTileN);  // whole slices: the whole depth
      }
  CHECK(changed > 0);
  // The measured layers (docs/PERF.md, thirty-fourth session, call 1): 8B o and down in 4 chunks of one slice a block,
  // 70B o and down of two; the wider layers keep the fewest chunks.
  for (const Layer& L : {kO8B, kDown8B}) {
    INFO(L.name);
    CHECK(wgmma_fit_plan(560, L.n, L.k, kSms) == 144);
    CHECK(wgmma_fit_plan(640, L.n, L.k, kSms) == 160);
    CHECK(wgmma_fit_plan(700, L.n, L.k, kSms) == 176);
    CHECK(wgmma_fit_plan(420, L.n, L.k, kSms) == 224);  // 128 x 128 in 4 chunks lost on 8B down
  }
  for (const Layer& L : {kO70B, kDown70B}) {
    INFO(L.name);
    CHECK(wgmma_fit_plan(700, L.n, L.k, kSms) == 176);
    CHECK(wgmma_fit_plan(560, L.n, L.k, kSms) == 144);
  }
  // The slack by depth (call 3): 5-6% more products at m = 600 taken on 8B down and 70B o and down; 11-12% at 520 on
  // 8B o (k = 4096) only.
  for (const Layer& L : {kDown8B, kO70B, kDown70B}) {
    INFO(L.name);
    CHECK(wgmma_fit_plan(600, L.n, L.k, kSms) == 160);
    CHECK(wgmma_fit_plan(520, L.n, L.k, kSms) == 176);
  }
  CHECK(wgmma_fit_plan(520, kO8B.n, kO8B.k, kSms) == 144);
  CHECK(wgmma_fit_whole_slack_pct(4096) == 20);
  CHECK(wgmma_fit_whole_slack_pct(28672) == 7);
  for (const Layer& L : {kQkv8B, kGateUp8B, kQkv70B, kGateUp70B, kLarge}) {
    INFO(L.name);
    for (int m : {560, 640, 700}) CHECK(wgmma_fit_plan(m, L.n, L.k, kSms) == wgmma_fit_rows(m));
  }
  // The m values keep their tiles; so does every m outside the fit tiles' range.
  for (const Layer& L : layers)
    for (int m : {1, 64, 128, 256, 512, 1024, 1025, 2048}) CHECK(wgmma_fit_plan(m, L.n, L.k, kSms) == 0);
}

// Tiny layers (up to kWgmmaTinyDqMaxLayer weights) with n % 256 == 0 take the 128-row tiles where the fit rows come in
// two or more chunks, on every SM count; the next larger keep their fit tiles.
TEST_CASE("dispatch: no fit tiles in several chunks on tiny layers", "[kernels][dispatch]") {
  const Layer tiny[] = {{"1152 x 1536", 1152, 1536}, {"1536 x 1536", 1536, 1536}, {"2048 x 1024", 2048, 1024},
                        {"1024 x 2048", 1024, 2048}, {"2048 x 512", 2048, 512}, {"1152 x 256", 1152, 256}};
  for (const Layer& L : tiny) {
    REQUIRE(int64_t(L.k) * L.n <= kWgmmaTinyDqMaxLayer);
    for (int sms : {132, 16, 33, 64, 100})
      for (int m = 1; m <= 1100; ++m) {
        INFO(L.name << " m " << m << " on " << sms << " SMs");
        const int base = wgmma_fit_rows(m), rows = wgmma_fit_plan(m, L.n, L.k, sms);
        if (base > 0 && (m + base - 1) / base > 1) CHECK(rows == 0);
      }
  }
  CHECK(wgmma_fit_rows(960) == 240);
  CHECK(wgmma_fit_plan(960, 1536, 1152, 132) == 0);
  CHECK(wgmma_fit_plan(576, 1536, 1152, 132) == 0);
  CHECK(wgmma_fit_plan(160, 1536, 1536, 132) == 160);  // one chunk: the rules for larger layers
  CHECK(wgmma_fit_plan(192, 512, 2048, 132) == 192);
  CHECK(wgmma_fit_plan(192, 2048, 1536, 132) == 192);  // 3 x 2^20 weights: above the tiny layers
  CHECK(wgmma_fit_plan(576, 3072, 2048, 132) == 192);
}

// 128 x 192 tiles (wgmma_prefer_192): only on layers with n % 192 == 0, one whole slice a block, in place of stripes,
// within the same slack as the whole-slice fit tiles; on the H100's 132 SMs that is 8B q/k/v at m = 417-512 only.
TEST_CASE("dispatch: 128 x 192 tiles where they give every block one whole slice", "[kernels][dispatch]") {
  constexpr int kSms = 132;
  const Layer layers[] = {kQkv8B, kO8B, kGateUp8B, kDown8B, kQkv70B, kO70B, kGateUp70B, kDown70B, kLarge,
                          {"1024 x 1536", 1024, 1536}, {"2048 x 768", 2048, 768}};
  int taken = 0;
  for (const Layer& L : layers)
    for (int sms : {kSms, 17, 33, 34, 64, 100})
      for (int m = 1; m <= 1100; ++m) {
        if (!wgmma_prefer_192(m, L.n, L.k, sms)) continue;
        INFO(L.name << " m " << m << " on " << sms << " SMs");
        ++taken;
        CHECK(L.n % 192 == 0);
        CHECK(wgmma_whole_slices(m, L.n, 128, sms, 192) == 1);
        const int fit = wgmma_fit_plan(m, L.n, L.k, sms);
        const int rows0 = fit > 0 ? fit : 128;
        const int tn0 = fit > 0 ? 128 : wgmma_prefer_128x128(m, L.n, L.k, sms) ? 128 : 256;
        CHECK(wgmma_whole_slices(m, L.n, rows0, sms, tn0) == 0);
        const int64_t w = wgmma_block_work(m, L.n, L.k, 128, 192, sms);
        CHECK(w == int64_t(L.k / 64) * 128 * 192);  // one whole slice
        CHECK(w * 100 <= wgmma_block_work(m, L.n, L.k, rows0, tn0, sms) * (100 + wgmma_fit_whole_slack_pct(L.k)));
        const Partition P = marlin_partition(m, L.n / 192, L.k / 64, 128, sms, 1);
        CHECK(P.grid <= sms);
      }
  CHECK(taken > 0);
  // The measured layer (docs/PERF.md, thirty-fifth session, call 5): 8B q/k/v from 420 (2 x 224 fit rows, 18% more
  // products) to 512 (128 x 256 stripes); not at 392 (2 x 208, 27%: level), 256 (64 tiles) or 560 and up (stripes).
  for (int m : {420, 450, 480, 512}) CHECK(wgmma_prefer_192(m, kQkv8B.n, kQkv8B.k, kSms));
  for (int m : {128, 256, 392, 560, 640, 768, 1024}) CHECK_FALSE(wgmma_prefer_192(m, kQkv8B.n, kQkv8B.k, kSms));
  for (const Layer& L : {kO8B, kGateUp8B, kDown8B, kQkv70B, kO70B, kGateUp70B, kDown70B, kLarge})
    for (int m = 129; m <= 1024; ++m) CHECK_FALSE(wgmma_prefer_192(m, L.n, L.k, kSms));
}
