// RTN per group with the optional unweighted Lp clip search, and the clip searches themselves.
#include <cmath>

#include "checkpoint/error.h"
#include "checkpoint/half.h"
#include "quantizer/clip.h"
#include "quantizer/grid.h"
#include "quantizer/rtn.h"
#include "tests/catch.hpp"
#include "tests/quantizer/synth.h"

namespace {

using namespace marlinc;

// Fraction of rows where the batched clip search may pick a different candidate than the scalar
// reference: both sum in double, in different orders, so only a near-exact tie can split them.
constexpr double kClipMismatchMax = 0.01;

std::vector<float> random_weights(int64_t n, int64_t k, uint64_t seed) {
  test::Normal g(seed);
  std::vector<float> w(size_t(n * k));
  for (auto& x : w) x = float(0.02 * g.student_t4());
  return w;
}

}  // namespace

TEST_CASE("RTN codes follow the grid: s = fp16(2·absmax/maxq), code = clamp(nearbyint(w/s)+zero)", "[quantizer][rtn]") {
  const int64_t n = 24, k = 256;
  std::vector<float> W = random_weights(n, k, 7);
  for (int64_t c = 0; c < 32; ++c) W[size_t(3 * k + c)] = 0.0f;  // an all-zero group of row 3
  for (int bits : {4, 8})
    for (int group : {-1, 32, 128}) {
      RtnOptions o;
      o.bits = bits;
      o.group_size = group;
      RtnStats st;
      const QuantizedLinear q = rtn_quantize(W.data(), n, k, o, &st);
      q.validate();
      CHECK(q.g_idx.empty());
      CHECK(q.mask.empty());
      const int64_t g = group < 0 ? k : group;
      const int maxq = (1 << bits) - 1, zero = 1 << (bits - 1);
      int bad = 0;
      for (int64_t r = 0; r < n; ++r)
        for (int64_t gi = 0; gi < k / g; ++gi) {
          float absmax = 0.0f;
          for (int64_t c = gi * g; c < (gi + 1) * g; ++c) absmax = std::max(absmax, std::fabs(W[size_t(r * k + c)]));
          const float s = half_to_float(float_to_half(absmax > 0 ? 2.0f * absmax / float(maxq) : 2.0f / float(maxq)));
          bad += q.scales[size_t(gi * n + r)] != float_to_half(s);
          for (int64_t c = gi * g; c < (gi + 1) * g; ++c) {
            const float v = std::nearbyint(W[size_t(r * k + c)] / s) + float(zero);
            const int code = int(std::min(std::max(v, 0.0f), float(maxq)));
            bad += q.codes[size_t(c * n + r)] != code;
            bad += q.weight(c, r) != float(code - zero) * s;
          }
        }
      CHECK(bad == 0);
      for (int64_t c = 0; c < 32; ++c) CHECK(q.codes[size_t(c * n + 3)] == zero);
      CHECK(st.rel_weight_err > 0.0);
      CHECK(st.rel_weight_err < (bits == 4 ? 0.3 : 0.03));
    }
}

TEST_CASE("RTN fast path is bit-exact to the scalar reference, with and without clip", "[quantizer][rtn]") {
  const int64_t n = 40, k = 384;
  const std::vector<float> W = random_weights(n, k, 11);
  for (bool clip : {false, true})
    for (int group : {-1, 64, 128}) {
      RtnOptions o;
      o.group_size = group;
      o.clip = clip;
      const QuantizedLinear a = rtn_quantize(W.data(), n, k, o), b = rtn_quantize_ref(W.data(), n, k, o);
      CHECK(a.codes == b.codes);
      CHECK(a.scales == b.scales);
    }
}

TEST_CASE("Lp clip search never increases the per-row-group Lp error", "[quantizer][rtn][clip]") {
  const int64_t n = 32, k = 256, g = 128;
  const std::vector<float> W = random_weights(n, k, 5);
  RtnOptions o;
  o.group_size = int(g);
  const QuantizedLinear plain = rtn_quantize(W.data(), n, k, o);
  o.clip = true;
  const QuantizedLinear clipped = rtn_quantize(W.data(), n, k, o);
  int strictly_better = 0;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t gi = 0; gi < k / g; ++gi) {
      double e0 = 0, e1 = 0;
      for (int64_t c = gi * g; c < (gi + 1) * g; ++c) {
        const double w = W[size_t(r * k + c)];
        e0 += std::pow(std::fabs(plain.weight(c, r) - w), 2.4);
        e1 += std::pow(std::fabs(clipped.weight(c, r) - w), 2.4);
      }
      CHECK(e1 <= e0 * (1 + 1e-12));
      strictly_better += e1 < e0;
    }
  CHECK(strictly_better > 0);  // heavy tails: shrinking must win somewhere
}

TEST_CASE("weighted clip: identity weighting equals the unweighted L2 search, batched matches scalar", "[quantizer][clip]") {
  const int64_t g = 128, cols = 96;
  const std::vector<float> Xf = random_weights(g, cols, 3);  // [g, cols]
  const std::vector<double> X(Xf.begin(), Xf.end());
  using RowMatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  RowMatD I = RowMatD::Identity(g, g);
  // A random upper-triangular weighting (like U_gg⁻¹): batched (triangular GEMM) vs scalar search.
  test::Normal gen(9);
  RowMatD M = RowMatD::Zero(g, g);
  for (int64_t i = 0; i < g; ++i)
    for (int64_t j = i; j < g; ++j) M(i, j) = i == j ? 1.0 + std::fabs(gen()) : 0.3 * gen();
  for (bool bf16 : {false, true}) {  // the grid of fp16 and of bf16 outputs
    INFO((bf16 ? "bf16" : "fp16") << " scales");
    for (int64_t r = 0; r < cols; ++r) {
      const float a = quant::weighted_clip_scale_ref(X.data() + r, g, cols, I.data(), 4, quant::kMarlinClipGrid,
                                                     quant::kMarlinClipCandidates, bf16);
      const float b = quant::lp_clip_scale(Xf.data() + r, g, cols, 4, 2.0f, quant::kMarlinClipGrid,
                                           quant::kMarlinClipCandidates, bf16);
      CHECK(a == b);
      CHECK(a == round_to_word16(a, bf16));  // a value the stored type holds exactly
    }
    std::vector<float> fast(static_cast<size_t>(cols));
    quant::weighted_clip_scales(X.data(), g, cols, cols, M.data(), quant::Tri::Upper, 4, quant::kMarlinClipGrid,
                                quant::kMarlinClipCandidates, bf16, fast.data());
    std::vector<float> dense(static_cast<size_t>(cols));
    quant::weighted_clip_scales(X.data(), g, cols, cols, M.data(), quant::Tri::Dense, 4, quant::kMarlinClipGrid,
                                quant::kMarlinClipCandidates, bf16, dense.data());
    int mismatch = 0;
    for (int64_t r = 0; r < cols; ++r) {
      const float ref = quant::weighted_clip_scale_ref(X.data() + r, g, cols, M.data(), 4, quant::kMarlinClipGrid,
                                                       quant::kMarlinClipCandidates, bf16);
      mismatch += fast[size_t(r)] != ref;
      CHECK(fast[size_t(r)] == dense[size_t(r)]);
      CHECK(fast[size_t(r)] == round_to_word16(fast[size_t(r)], bf16));
    }
    CHECK(double(mismatch) / double(cols) <= kClipMismatchMax);
  }
}

TEST_CASE("RTN rejects bad options and non-finite weights, naming the layer", "[quantizer][rtn]") {
  std::vector<float> W(size_t(8 * 64), 0.5f);
  RtnOptions o;
  o.name = "model.layers.0.mlp.up_proj";
  o.group_size = 48;
  CHECK(test::throws_with([&] { rtn_quantize(W.data(), 8, 64, o); }, {"up_proj", "group size 48"}));
  o.group_size = 32;
  o.bits = 3;
  REQUIRE_THROWS_AS(rtn_quantize(W.data(), 8, 64, o), marlinc::Error);
  o.bits = 4;
  W[77] = std::nanf("");
  CHECK(test::throws_with([&] { rtn_quantize(W.data(), 8, 64, o); }, {"up_proj", "not finite"}));
}

TEST_CASE("RTN on the bf16 grid (bf16 models): bf16 scales, each code the nearest for its stored scale", "[quantizer][rtn]") {
  // Before the bf16 grid, bf16 outputs stored the fp16 grid's scales re-encoded as bf16: the codes were
  // then nearest for a scale the file does not hold (at 8 bits 3% more weight error than the grid's).
  const int64_t n = 96, k = 512;
  const std::vector<float> W = random_weights(n, k, 21);
  for (int bits : {4, 8})
    for (bool clip : {false, true}) {
      INFO("bits " << bits << " clip " << clip);
      RtnOptions o;
      o.bits = bits;
      o.group_size = 128;
      o.clip = clip;
      o.bf16_scales = true;
      RtnStats sb;
      const QuantizedLinear qb = rtn_quantize(W.data(), n, k, o, &sb);
      CHECK(qb.scale_type == ScaleType::BF16);
      int not_nearest = 0;
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c) {
          const float s = bf16_to_float(qb.scales[size_t((c / 128) * n + r)]);
          not_nearest += qb.codes[size_t(c * n + r)] != quant::quantize_code(W[size_t(r * k + c)], s, bits);
        }
      CHECK(not_nearest == 0);
      const QuantizedLinear ref = rtn_quantize_ref(W.data(), n, k, o);
      CHECK(qb.codes == ref.codes);
      CHECK(qb.scales == ref.scales);
      CHECK(ref.scale_type == ScaleType::BF16);
      // The fp16 grid re-encoded as bf16 (the old output) has more error where codes are fine: at 8 bits.
      o.bf16_scales = false;
      QuantizedLinear qf = rtn_quantize(W.data(), n, k, o);
      for (auto& s : qf.scales) s = float_to_bf16(half_to_float(s));
      qf.scale_type = ScaleType::BF16;
      const double old_err = quant::relative_weight_error(W.data(), qf);
      // Measured: 0.01137 / 0.01131 against 0.01152 / 0.01145 at 8 bits (no clip / clip); level at 4 bits
      // (0.1881 / 0.1730 both ways), where the clip search's Lp objective also moves the choice.
      INFO("bf16 grid " << sb.rel_weight_err << ", fp16 grid re-encoded " << old_err);
      if (bits == 8) CHECK(sb.rel_weight_err < 0.99 * old_err);
      else CHECK(std::fabs(sb.rel_weight_err - old_err) < 0.01 * old_err);
    }
}
