// Reading golden matrices written by transformers (safetensors, fp32) and comparing a forward pass's
// output with them; shared by the forward-pass tests of this folder.
#pragma once
#include <string>

#include "checkpoint/safetensors.h"
#include "quantizer/calib/llama.h"
#include "tests/catch.hpp"

namespace marlinc::test {

inline calib::Matrix golden_matrix(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  REQUIRE(t != nullptr);
  REQUIRE(t->shape.size() == 2);
  auto v = f.view<float>(*t);
  return Eigen::Map<const calib::Matrix>(v.data(), t->shape[0], t->shape[1]);
}

// max |a - b| / max |b|
inline double rel_err(const calib::Matrix& a, const calib::Matrix& b) {
  REQUIRE(a.rows() == b.rows());
  REQUIRE(a.cols() == b.cols());
  return (a - b).cwiseAbs().maxCoeff() / b.cwiseAbs().maxCoeff();
}

}  // namespace marlinc::test
