// The Hopper wgmma kernel for bf16 activations (all token tiles); compiled for sm_90a only
// (kernels/CMakeLists.txt).
#include "kernels/sm90/marlin_wgmma_ws.cuh"

namespace marlinc::kernels::detail {
MARLINC_INSTANTIATE_WGMMA(1, 8)
MARLINC_INSTANTIATE_WGMMA(1, 16)
MARLINC_INSTANTIATE_WGMMA(1, 32)
MARLINC_INSTANTIATE_WGMMA(1, 64)
MARLINC_INSTANTIATE_WGMMA(1, 128)
MARLINC_INSTANTIATE_WGMMA_WS(1, 64, 1)
MARLINC_INSTANTIATE_WGMMA_WS(1, 128, 1)
MARLINC_INSTANTIATE_WGMMA_WS(1, 256, 1)
MARLINC_INSTANTIATE_WGMMA_WS_F(1, 128, 1, false, kWgmmaWideTileN)  // 128 x 128 tiles
MARLINC_INSTANTIATE_WGMMA_WS_F(1, 128, 1, false, kWgmmaTriTileN)   // 128 x 192 tiles
MARLINC_INSTANTIATE_WGMMA_WS_SPLIT(1, 64, kWgmmaTileN)              // the split forms
MARLINC_INSTANTIATE_WGMMA_WS_SPLIT(1, 128, kWgmmaTileN)
MARLINC_INSTANTIATE_WGMMA_WS_SPLIT(1, 128, kWgmmaWideTileN)
MARLINC_INSTANTIATE_WGMMA_WS_PAIR(1, kWgmmaPairRows)
MARLINC_INSTANTIATE_WGMMA_WS_PAIR(1, kWgmmaWideRows)
}  // namespace marlinc::kernels::detail
