// The damping-retry case both GPTQ back ends must pass identically (tests/quantizer/test_gptq.cpp on
// the CPU, tests/gpu/test_gptq_cuda.cpp on the GPU): damping rises by 0.01 until the Cholesky
// succeeds (0.03 here); without retries, and on a Hessian no damping below 1 fixes, the layer falls
// back to RTN with exactly RTN's codes and scales.
#pragma once
#include <cmath>

#include "quantizer/gptq.h"
#include "quantizer/rtn.h"
#include "tests/common.h"
#include "tests/quantizer/synth.h"

namespace marlinc::test {

inline void check_damping_retry(GptqOptions::Device device) {
  const int64_t k = 64, n = 16;
  const Eigen::MatrixXf H = indefinite_hessian(k);  // damping 0.01 and 0.02 fail, 0.03 succeeds
  const SynthLayer L = make_synth_layer(n, k, 1, 1, 2);
  GptqOptions o;
  o.group_size = 32;
  o.device = device;
  GptqStats st;
  gptq_quantize(L.W.data(), n, k, H, o, &st);
  CHECK_FALSE(st.fell_back_to_rtn);
  CHECK(std::fabs(st.damp_used - 0.03) < 1e-9);

  RtnOptions ro;
  ro.group_size = 32;
  const QuantizedLinear rtn = rtn_quantize(L.W.data(), n, k, ro);
  o.auto_damp = false;  // no retry: straight to the RTN fallback
  QuantizedLinear q = gptq_quantize(L.W.data(), n, k, H, o, &st);
  CHECK(st.fell_back_to_rtn);
  CHECK(st.damp_used == 0.0);
  CHECK(q.codes == rtn.codes);
  CHECK(q.scales == rtn.scales);
  // Far from positive definite: every damping up to 1 fails.
  const Eigen::MatrixXf H2 = indefinite_hessian(k, -3.0);
  o.auto_damp = true;
  q = gptq_quantize(L.W.data(), n, k, H2, o, &st);
  CHECK(st.fell_back_to_rtn);
  CHECK(st.damp_used == 0.0);
  CHECK(q.codes == rtn.codes);
}

}  // namespace marlinc::test
