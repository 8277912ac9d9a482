// The streaming m <= 16 kernel (marlin_stream.cuh), fp16 and bf16, every slice width; sm_90a only
// (kernels/CMakeLists.txt).
#include "kernels/sm90/marlin_stream.cuh"

namespace marlinc::kernels::detail {
MARLINC_INSTANTIATE_STREAM(0, 64)
MARLINC_INSTANTIATE_STREAM(0, 128)
MARLINC_INSTANTIATE_STREAM(0, 256)
MARLINC_INSTANTIATE_STREAM(1, 64)
MARLINC_INSTANTIATE_STREAM(1, 128)
MARLINC_INSTANTIATE_STREAM(1, 256)
}  // namespace marlinc::kernels::detail
