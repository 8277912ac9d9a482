// Quality of GPTQ, Marlin's clip search and joint SparseGPT 2:4 on synthetic layers (gptq.md §2.8,
// §4.5): relative output error (normalised MSE, the spec's measure) on HELD-OUT tokens, compared
// against the baselines the issue names.
#include <cstdio>

#include "quantizer/gptq.h"
#include "quantizer/hessian.h"
#include "quantizer/rtn.h"
#include "tests/catch.hpp"
#include "tests/quantizer/synth.h"

namespace {

// Ratios the issue requires (the spec measured 0.16, 0.57 and 0.13 at 4096×4096).
constexpr double kGptqVsRtnMax = 0.25;
constexpr double kClipVsGptqMax = 0.75;
constexpr double kSparseVsMagnitudeMax = 0.25;
// Orders must not be worse than natural by more than this factor (they reorder, not degrade).
constexpr double kOrderVsNaturalMax = 1.10;

constexpr int64_t kN = 256, kK = 512, kTokCal = 2048, kTokTest = 2048;
constexpr float kDamp = 0.1f;  // the spec's measurement used Marlin's 10%

using namespace marlinc;
using marlinc::test::SynthLayer;

struct Fixture {
  SynthLayer L;
  Eigen::MatrixXf H;
  Fixture() : L(test::make_synth_layer(kN, kK, kTokCal, kTokTest, 1234)) {
    // Variable-length samples, as the calibration runner feeds them.
    HessianAccumulator acc(kK);
    int64_t t0 = 0, len = 7;
    while (t0 < kTokCal) {
      const int64_t t = std::min(len, kTokCal - t0);
      acc.add(L.Xcal.data() + t0 * kK, t);
      t0 += t;
      len = len * 3 % 611 + 1;
    }
    H = acc.finalize();
  }
};

const Fixture& fixture() {
  static const Fixture f;
  return f;
}

GptqOptions base_opts() {
  GptqOptions o;
  o.damp = kDamp;
  o.name = "synthetic";
  return o;
}

// Magnitude 2:4 (2 smallest |w| of every 4 consecutive inputs pruned) then RTN g128 on the result.
double magnitude_24_then_rtn(const SynthLayer& L) {
  std::vector<float> Wp = L.W;
  for (int64_t r = 0; r < L.n; ++r)
    for (int64_t c = 0; c < L.k; c += 4) {
      float* w = Wp.data() + r * L.k + c;
      for (int rep = 0; rep < 2; ++rep) {
        int best = -1;
        for (int t = 0; t < 4; ++t)
          if (w[t] != 0.0f && (best < 0 || std::fabs(w[t]) < std::fabs(w[best]))) best = t;
        if (best >= 0) w[best] = 0.0f;
      }
    }
  RtnOptions ro;
  ro.group_size = 128;
  return test::rel_output_error(L, rtn_quantize(Wp.data(), L.n, L.k, ro));
}

}  // namespace

TEST_CASE("GPTQ beats RTN, clip beats GPTQ, 2:4 joint beats magnitude+RTN on held-out tokens", "[quantizer][quality]") {
  const Fixture& f = fixture();
  RtnOptions ro;
  ro.group_size = 128;
  const double rtn = test::rel_output_error(f.L, rtn_quantize(f.L.W.data(), kN, kK, ro));
  ro.clip = true;
  const double rtn_clip = test::rel_output_error(f.L, rtn_quantize(f.L.W.data(), kN, kK, ro));

  GptqOptions o = base_opts();
  GptqStats st;
  const QuantizedLinear qg = gptq_quantize(f.L.W.data(), kN, kK, f.H, o, &st);
  const double gptq = test::rel_output_error(f.L, qg);
  o.clip = GptqOptions::Marlin;
  const double gptq_clip = test::rel_output_error(f.L, gptq_quantize(f.L.W.data(), kN, kK, f.H, o));
  o.clip = GptqOptions::None;
  o.sparse24 = true;
  const QuantizedLinear qs = gptq_quantize(f.L.W.data(), kN, kK, f.H, o);
  const double sparse = test::rel_output_error(f.L, qs);
  o.clip = GptqOptions::Marlin;
  const double sparse_clip = test::rel_output_error(f.L, gptq_quantize(f.L.W.data(), kN, kK, f.H, o));
  const double mag = magnitude_24_then_rtn(f.L);

  std::printf("[quality %lldx%lld g128] RTN %.4f%%  RTN+L2.4clip %.4f%%  GPTQ %.4f%%  GPTQ+Marlin clip %.4f%%\n",
              (long long)kN, (long long)kK, 100 * rtn, 100 * rtn_clip, 100 * gptq, 100 * gptq_clip);
  std::printf("[quality] GPTQ/RTN %.3f  clip/GPTQ %.3f | 2:4: magnitude+RTN %.3f%%  SparseGPT+4bit %.4f%% "
              "(+clip %.4f%%)  ratio %.3f\n",
              gptq / rtn, gptq_clip / gptq, 100 * mag, 100 * sparse, 100 * sparse_clip, sparse / mag);
  CHECK(gptq <= kGptqVsRtnMax * rtn);
  CHECK(gptq_clip <= kClipVsGptqMax * gptq);
  CHECK(sparse <= kSparseVsMagnitudeMax * mag);
  CHECK(sparse_clip <= sparse);
  CHECK(rtn_clip < rtn);
  CHECK(st.damp_used == kDamp);
  CHECK_FALSE(st.fell_back_to_rtn);
  qs.validate();  // exactly 2 kept per 4, codes in range
}

TEST_CASE("column orders keep quality, act-order variants are not worse than natural", "[quantizer][quality]") {
  const Fixture& f = fixture();
  GptqOptions o = base_opts();
  const double natural = test::rel_output_error(f.L, gptq_quantize(f.L.W.data(), kN, kK, f.H, o));
  for (auto order : {GptqOptions::StaticActOrder, GptqOptions::Gar, GptqOptions::DynamicActOrder}) {
    o.order = order;
    const QuantizedLinear q = gptq_quantize(f.L.W.data(), kN, kK, f.H, o);
    q.validate();
    const double e = test::rel_output_error(f.L, q);
    std::printf("[quality] order %d: %.4f%% (natural %.4f%%)\n", int(order), 100 * e, 100 * natural);
    CHECK(e <= kOrderVsNaturalMax * natural);
  }
}
