// The Hopper kernel's fit tiles (kernels/marlin_partition.h, wgmma_fit_tile: 144 to 240 rows of 128 columns) and
// their pair forms for bf16 activations, in a translation unit of their own so that they compile beside the other
// tiles; sm_90a only.
#include "kernels/sm90/marlin_wgmma_ws.cuh"

namespace marlinc::kernels::detail {
MARLINC_FIT_TILES(MARLINC_INSTANTIATE_WGMMA_FIT, 1)
}  // namespace marlinc::kernels::detail
