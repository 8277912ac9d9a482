// CPU-only builds: there is no kernel to run, so the arithmetic check uses the CPU path.
#ifndef MARLINC_HAVE_CUDA
#include "verify/gpu_gemm.h"

namespace marlinc {

bool gpu_available(std::string& device_name) {
  device_name.clear();
  return false;
}

bool gpu_arith(const std::string&, const QuantizedLinear&, const std::vector<uint16_t>&, const std::vector<int>&,
               std::vector<float>&, std::vector<double>&, std::string& why) {
  why = "built without CUDA";
  return false;
}

}  // namespace marlinc
#endif
