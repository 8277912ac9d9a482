// The Hopper kernel's fit tiles (kernels/marlin_partition.h, wgmma_fit_tile: 160, 192 and 224 rows of 128 columns)
// for bf16 activations, a translation unit of their own so that they compile beside the other tiles; sm_90a only
// (kernels/CMakeLists.txt).
#include "kernels/sm90/marlin_wgmma_ws.cuh"

namespace marlinc::kernels::detail {
MARLINC_INSTANTIATE_WGMMA_WS(1, 160, 1)
MARLINC_INSTANTIATE_WGMMA_WS(1, 192, 1)
MARLINC_INSTANTIATE_WGMMA_WS(1, 224, 1)
}  // namespace marlinc::kernels::detail
