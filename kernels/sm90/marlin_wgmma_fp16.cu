// The Hopper wgmma kernel for fp16 activations (all token tiles); compiled for sm_90a only
// (kernels/CMakeLists.txt).
#include "kernels/sm90/marlin_wgmma_ws.cuh"

namespace marlinc::kernels::detail {
MARLINC_INSTANTIATE_WGMMA(0, 8)
MARLINC_INSTANTIATE_WGMMA(0, 16)
MARLINC_INSTANTIATE_WGMMA(0, 32)
MARLINC_INSTANTIATE_WGMMA(0, 64)
MARLINC_INSTANTIATE_WGMMA(0, 128)
MARLINC_INSTANTIATE_WGMMA_WS(0, 64, 1)
MARLINC_INSTANTIATE_WGMMA_WS(0, 128, 1)
MARLINC_INSTANTIATE_WGMMA_WS(0, 256, 1)
MARLINC_INSTANTIATE_WGMMA_WS_F(0, 128, 1, false, kWgmmaWideTileN)  // 128 x 128 tiles
MARLINC_INSTANTIATE_WGMMA_WS_F(0, 128, 1, false, kWgmmaTriTileN)   // 128 x 192 tiles
MARLINC_INSTANTIATE_WGMMA_WS_SPLIT(0, 64, kWgmmaTileN)              // the split forms
MARLINC_INSTANTIATE_WGMMA_WS_SPLIT(0, 128, kWgmmaTileN)
MARLINC_INSTANTIATE_WGMMA_WS_SPLIT(0, 128, kWgmmaWideTileN)
MARLINC_INSTANTIATE_WGMMA_WS_PAIR(0, kWgmmaPairRows)
MARLINC_INSTANTIATE_WGMMA_WS_PAIR(0, kWgmmaWideRows)
}  // namespace marlinc::kernels::detail
