// A check the CPU and GPU calibration-pass tests share: under ExpertCalibration::All every routed expert of
// block 0 has every calibration token in its Hessians, and GPTQ runs on them.
#pragma once
#include <cstdint>

#include "quantizer/calib/calib_pass.h"
#include "tests/catch.hpp"

namespace marlinc::test {

// `pass` has captured block 0 of a model with `experts` routed experts from `tokens` tokens.
inline void check_every_expert_calibrated(calib::CalibPass& pass, int64_t experts, int64_t tokens) {
  using calib::Linear;
  using calib::LinearRef;
  for (int32_t e = 0; e < int32_t(experts); ++e) {
    INFO("expert " << e);
    CHECK(pass.hessian_tokens(LinearRef(Linear::Gate, e)) == tokens);
    CHECK(pass.hessian_tokens(LinearRef(Linear::Up, e)) == tokens);
    CHECK(pass.hessian_tokens(LinearRef(Linear::Down, e)) == tokens);
  }
  GptqOptions o;
  o.group_size = 32;
  o.name = "expert 0 down, every token";
  GptqStats st;
  pass.quantize(LinearRef(Linear::Down, 0), o, &st);
  CHECK(st.loss >= 0);  // calibrated (an uncalibrated expert's report says -1)
}

}  // namespace marlinc::test
