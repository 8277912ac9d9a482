// The arithmetic check's CPU numerics follow the kernel of the layer's scale type (verify/arith.h):
// fp16 scales -> fp16 words throughout, bf16 scales -> bf16 words. The GPU test
// (tests/gpu/test_verify_gpu.cpp) checks the same numerics against the kernels themselves.
#include <cmath>
#include <vector>

#include "checkpoint/half.h"
#include "tests/common.h"
#include "tests/verify/arith_fixture.h"
#include "verify/arith.h"

using namespace marlinc;

namespace {

bool representable(float v, bool bf16) { return round_to_word16(v, bf16) == v; }

}  // namespace

TEST_CASE("arith: random activations are the same draws in either type", "[verify][arith]") {
  const auto h = random_activations(3, 256, 11, false), b = random_activations(3, 256, 11, true);
  REQUIRE(h.size() == b.size());
  size_t differ = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    const float fh = half_to_float(h[i]), fb = bf16_to_float(b[i]);
    CHECK(fb >= -1.f);
    CHECK(fb <= 1.f);
    // Both round one uniform draw in [-1, 1): bf16 to 2^-9 of it at most, fp16 to 2^-12.
    CHECK(std::fabs(fh - fb) <= std::ldexp(1.f, -8));
    differ += h[i] != b[i];
  }
  CHECK(differ > h.size() / 2);  // the words are of the other type, not fp16 bits relabelled
}

TEST_CASE("arith: kernel numerics round to the layer's type and bf16 outputs pass fp16's range", "[verify][arith]") {
  for (int group : {128, -1}) {
    for (bool bf16 : {false, true}) {
      // bf16 layers with large scales: |C| past 65504, where fp16 numerics would overflow.
      const float scale = bf16 ? 2048.f : 0.01f;
      const QuantizedLinear q = test::random_arith_layer(512, 64, group, bf16, scale, 5 + uint64_t(bf16));
      const int m = 5;
      const auto A = random_activations(m, q.k, 3, bf16);
      std::vector<int64_t> cols;
      for (int64_t c = 0; c < q.n; ++c) cols.push_back(c);
      const std::vector<float> got = gemm_kernel_numerics(A, m, q, cols);
      const std::vector<double> ref = gemm_reference(A, m, q, cols);
      INFO("group " << group << (bf16 ? " bf16" : " fp16"));
      double big = 0;
      for (float v : got) {
        REQUIRE(std::isfinite(v));
        CHECK(representable(v, bf16));
        big = std::max(big, double(std::fabs(v)));
      }
      if (bf16) CHECK(big > 65504.0);
      const RelErr e = compare(got, ref);
      CHECK(e.finite);
      // Within the type's gate, and for bf16 above fp16's: the rounding is bf16's, not fp16's.
      CHECK(e.mean_rel <= (bf16 ? 4e-3 : 1e-3));
      if (bf16) CHECK(e.mean_rel > 1e-3);  // measured 1.5e-3-2.1e-3; fp16 numerics give 1.8e-4-2.5e-4
    }
  }
}
