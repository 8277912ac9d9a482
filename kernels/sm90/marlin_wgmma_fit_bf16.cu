// The Hopper kernel's fit tiles (kernels/marlin_partition.h, wgmma_fit_tile: 144 to 240 rows of 128 columns in steps
// of 16) for bf16 activations, a translation unit of their own so that they compile beside the other tiles; sm_90a only
// (kernels/CMakeLists.txt).
#include "kernels/sm90/marlin_wgmma_ws.cuh"

namespace marlinc::kernels::detail {
MARLINC_INSTANTIATE_WGMMA_WS(1, 144, 1)
MARLINC_INSTANTIATE_WGMMA_WS(1, 160, 1)
MARLINC_INSTANTIATE_WGMMA_WS(1, 176, 1)
MARLINC_INSTANTIATE_WGMMA_WS(1, 192, 1)
MARLINC_INSTANTIATE_WGMMA_WS(1, 208, 1)
MARLINC_INSTANTIATE_WGMMA_WS(1, 224, 1)
MARLINC_INSTANTIATE_WGMMA_WS(1, 240, 1)
}  // namespace marlinc::kernels::detail
