// Host side of the Marlin W4A16 GEMM: argument checks, tile-configuration choice per shape and m,
// the stripe (stream-K-like) partition across SMs, and the large-m path (dequantize to 16-bit +
// cuBLAS). The fused kernel lives in marlin_kernel.cuh, instantiated in kernels/generated/*.cu.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <iterator>
#include <limits>
#include <mutex>

#include "kernels/marlin.h"
#include "kernels/marlin_dispatch.h"
#include "kernels/marlin_launch.h"
#include "kernels/marlin_partition.h"
#include "kernels/tma_maps.h"

namespace marlinc::kernels {
namespace detail {

// Declarations of the generated instantiations (kernels/generated/marlin_dt*_mb*.cu).
#define MARLINC_DECLARE(DT, MB, TN, TK)                                     \
  extern template cudaError_t marlin_prepare<DT, MB, TN, TK>(int*, int*); \
  extern template cudaError_t marlin_launch<DT, MB, TN, TK>(const KernelArgs&, const LaunchOpts&, cudaStream_t);
#define MARLINC_DECLARE_MB(DT, MB) \
  MARLINC_DECLARE(DT, MB, 128, 128) MARLINC_DECLARE(DT, MB, 256, 64) MARLINC_DECLARE(DT, MB, 64, 128)
MARLINC_DECLARE_MB(0, 1) MARLINC_DECLARE_MB(0, 2) MARLINC_DECLARE_MB(0, 3) MARLINC_DECLARE_MB(0, 4)
MARLINC_DECLARE_MB(1, 1) MARLINC_DECLARE_MB(1, 2) MARLINC_DECLARE_MB(1, 3) MARLINC_DECLARE_MB(1, 4)

#if MARLINC_HAVE_SM90A
#define MARLINC_DECLARE_WGMMA(DT, NT)                               \
  extern template cudaError_t wgmma_prepare<DT, NT>(int*, int*); \
  extern template cudaError_t wgmma_launch<DT, NT>(const KernelArgs&, const LaunchOpts&, cudaStream_t);
MARLINC_DECLARE_WGMMA(0, 8) MARLINC_DECLARE_WGMMA(0, 16) MARLINC_DECLARE_WGMMA(0, 32) MARLINC_DECLARE_WGMMA(0, 64)
MARLINC_DECLARE_WGMMA(0, 128) MARLINC_DECLARE_WGMMA(1, 8) MARLINC_DECLARE_WGMMA(1, 16) MARLINC_DECLARE_WGMMA(1, 32)
MARLINC_DECLARE_WGMMA(1, 64) MARLINC_DECLARE_WGMMA(1, 128)
#define MARLINC_DECLARE_WGMMA_WS_F(DT, NT, BPS, CL, F)                                                     \
  extern template cudaError_t wgmma_ws_prepare<DT, NT, BPS, CL, F>(int*, int*);                             \
  extern template cudaError_t wgmma_ws_launch<DT, NT, BPS, CL, F>(const KernelArgs&, const TmaMaps&,        \
                                                                  const LaunchOpts&, cudaStream_t);
#define MARLINC_DECLARE_WGMMA_WS_CL(DT, NT, BPS, CL) MARLINC_DECLARE_WGMMA_WS_F(DT, NT, BPS, CL, wgmma_tile_n(NT))
#define MARLINC_DECLARE_WGMMA_WS_SPLIT(DT, NT, F)                                                         \
  extern template cudaError_t wgmma_ws_prepare<DT, NT, 1, false, F, true>(int*, int*);                      \
  extern template cudaError_t wgmma_ws_launch<DT, NT, 1, false, F, true>(const KernelArgs&, const TmaMaps&, \
                                                                         const LaunchOpts&, cudaStream_t);
#define MARLINC_DECLARE_WGMMA_WS_PAIR(DT, NT)   \
  MARLINC_DECLARE_WGMMA_WS_CL(DT, NT, 1, true) \
  extern template cudaError_t wgmma_ws_max_clusters<DT, NT>(int, const LaunchOpts&, int*);
MARLINC_DECLARE_WGMMA_WS_CL(0, 32, 1, false) MARLINC_DECLARE_WGMMA_WS_CL(0, 48, 1, false)
MARLINC_DECLARE_WGMMA_WS_CL(1, 32, 1, false) MARLINC_DECLARE_WGMMA_WS_CL(1, 48, 1, false)
MARLINC_DECLARE_WGMMA_WS_CL(0, 64, 1, false) MARLINC_DECLARE_WGMMA_WS_CL(0, 128, 1, false)
MARLINC_DECLARE_WGMMA_WS_CL(0, kWgmmaWideRows, 1, false) MARLINC_DECLARE_WGMMA_WS_CL(1, 64, 1, false)
MARLINC_DECLARE_WGMMA_WS_CL(1, 128, 1, false) MARLINC_DECLARE_WGMMA_WS_CL(1, kWgmmaWideRows, 1, false)
MARLINC_DECLARE_WGMMA_WS_F(0, 128, 1, false, kWgmmaWideTileN) MARLINC_DECLARE_WGMMA_WS_F(1, 128, 1, false, kWgmmaWideTileN)
MARLINC_DECLARE_WGMMA_WS_F(0, 128, 1, false, kWgmmaTriTileN)
MARLINC_DECLARE_WGMMA_WS_F(1, 128, 1, false, kWgmmaTriTileN)
MARLINC_DECLARE_WGMMA_WS_SPLIT(0, 32, kWgmmaTileN) MARLINC_DECLARE_WGMMA_WS_SPLIT(0, 48, kWgmmaTileN)
MARLINC_DECLARE_WGMMA_WS_SPLIT(1, 32, kWgmmaTileN) MARLINC_DECLARE_WGMMA_WS_SPLIT(1, 48, kWgmmaTileN)
MARLINC_DECLARE_WGMMA_WS_SPLIT(0, 64, kWgmmaTileN) MARLINC_DECLARE_WGMMA_WS_SPLIT(0, 128, kWgmmaTileN)
MARLINC_DECLARE_WGMMA_WS_SPLIT(0, 128, kWgmmaWideTileN) MARLINC_DECLARE_WGMMA_WS_SPLIT(1, 64, kWgmmaTileN)
MARLINC_DECLARE_WGMMA_WS_SPLIT(1, 128, kWgmmaTileN) MARLINC_DECLARE_WGMMA_WS_SPLIT(1, 128, kWgmmaWideTileN)
// The fit tiles and their pair forms (kernels/sm90/marlin_wgmma_fit_*.cu), in kWsTiles' order (MARLINC_FIT_TILES:
// marlin_launch.h).
#define MARLINC_DECLARE_FIT(DT, NT)                                                   \
  MARLINC_DECLARE_WGMMA_WS_CL(DT, NT, 1, false) MARLINC_DECLARE_WGMMA_WS_PAIR(DT, NT) \
  MARLINC_DECLARE_WGMMA_WS_SPLIT(DT, NT, kWgmmaWideTileN)
MARLINC_FIT_TILES(MARLINC_DECLARE_FIT, 0) MARLINC_FIT_TILES(MARLINC_DECLARE_FIT, 1)
MARLINC_DECLARE_WGMMA_WS_PAIR(0, kWgmmaPairRows) MARLINC_DECLARE_WGMMA_WS_PAIR(0, kWgmmaWideRows)
MARLINC_DECLARE_WGMMA_WS_PAIR(1, kWgmmaPairRows) MARLINC_DECLARE_WGMMA_WS_PAIR(1, kWgmmaWideRows)
#define MARLINC_DECLARE_STREAM_CL(DT, TN, CL, SW)                                                              \
  extern template cudaError_t stream_prepare<DT, TN, CL, SW>(int*, int*);                                  \
  extern template cudaError_t stream_launch<DT, TN, CL, SW>(const KernelArgs&, const TmaMaps&, const LaunchOpts&, \
                                                            cudaStream_t);
#define MARLINC_DECLARE_STREAM_SW(DT, TN, SW)                                                                  \
  MARLINC_DECLARE_STREAM_CL(DT, TN, false, SW) MARLINC_DECLARE_STREAM_CL(DT, TN, true, SW)                    \
  extern template cudaError_t stream_max_clusters<DT, TN, SW>(int, const LaunchOpts&, int*);
#define MARLINC_DECLARE_STREAM(DT, TN) MARLINC_DECLARE_STREAM_SW(DT, TN, false) MARLINC_DECLARE_STREAM_SW(DT, TN, true)
MARLINC_DECLARE_STREAM(0, 64) MARLINC_DECLARE_STREAM(0, 128) MARLINC_DECLARE_STREAM(0, 256)
MARLINC_DECLARE_STREAM(1, 64) MARLINC_DECLARE_STREAM(1, 128) MARLINC_DECLARE_STREAM(1, 256)
#endif

namespace {

// The three tile shapes (thread_n, thread_k): 128x128 for small m, 256x64 when A tiles are large
// (halves A traffic per weight), 64x128 for narrow layers that would otherwise leave SMs idle.
struct TileShape { int tn, tk; };
constexpr TileShape kShapes[3] = {{128, 128}, {256, 64}, {64, 128}};
constexpr int kNumShapes = 3;
// The tile of whole-k stripes (kernels/marlin_dispatch.h, whole_k_stripes).
constexpr int kWholeKShape = 0;
static_assert(kShapes[kWholeKShape].tn == kWholeKTileN && kShapes[kWholeKShape].tk == kWholeKTileK,
              "whole-k stripes are measured on the 128x128 tile");
static_assert(kWholeKMaxM <= 16, "whole-k stripes assume one 16-row chunk (m_blocks_for gives 1)");

using PrepareFn = cudaError_t (*)(int*, int*);
using LaunchFn = cudaError_t (*)(const KernelArgs&, const LaunchOpts&, cudaStream_t);
struct Entry { PrepareFn prepare; LaunchFn launch; };

#define MARLINC_ENTRY(DT, MB, TN, TK) Entry{&marlin_prepare<DT, MB, TN, TK>, &marlin_launch<DT, MB, TN, TK>}
#define MARLINC_ENTRY_MB(DT, MB) \
  {MARLINC_ENTRY(DT, MB, 128, 128), MARLINC_ENTRY(DT, MB, 256, 64), MARLINC_ENTRY(DT, MB, 64, 128)}
const Entry kTable[2][kMaxMBlocks][kNumShapes] = {
    {MARLINC_ENTRY_MB(0, 1), MARLINC_ENTRY_MB(0, 2), MARLINC_ENTRY_MB(0, 3), MARLINC_ENTRY_MB(0, 4)},
    {MARLINC_ENTRY_MB(1, 1), MARLINC_ENTRY_MB(1, 2), MARLINC_ENTRY_MB(1, 3), MARLINC_ENTRY_MB(1, 4)},
};

// The warp-specialized pipeline (wgmma_pipeline 2) is built for the token tiles from kWsMinRows up, and is the only
// one of the 128-column tiles.
constexpr int kWsMinRows = 32;
// Its tiles (rows, columns): 32, 48, 64 and 128 rows of 256 columns (48 only on this pipeline), the wide tile, 128 x
// 128 (Auto on narrow layers, marlin_dispatch.h, wgmma_prefer_128x128; or MarlinGemm::thread_n), 128 x 192
// (wgmma_prefer_192, or thread_n) and the fit tiles (marlin_dispatch.h, wgmma_fit_rows).
struct WsTile { int rows, tn; };
#define MARLINC_WS_FIT_TILE(DT, NT) {NT, kWgmmaWideTileN},
constexpr WsTile kWsTiles[] = {{32, kWgmmaTileN},  {48, kWgmmaTileN}, {64, kWgmmaTileN}, {128, kWgmmaTileN},
                               {kWgmmaWideRows, kWgmmaWideTileN}, {128, kWgmmaWideTileN},
                               {128, kWgmmaTriTileN}, MARLINC_FIT_TILES(MARLINC_WS_FIT_TILE, 0)};
constexpr int kFirstFitTile = 7;
constexpr int kNumWsTiles = int(sizeof(kWsTiles) / sizeof(kWsTiles[0]));
// The Hopper kernel's token tiles (rows of C per tile), smallest first.
constexpr int kWgRows[] = {8, 16, 32, 64, 128};
constexpr int kNumWgRows = int(sizeof(kWgRows) / sizeof(kWgRows[0]));
#if MARLINC_HAVE_SM90A
#define MARLINC_WG_ENTRY(DT, NT) Entry{&wgmma_prepare<DT, NT>, &wgmma_launch<DT, NT>}
const Entry kWgTable[2][kNumWgRows] = {
    {MARLINC_WG_ENTRY(0, 8), MARLINC_WG_ENTRY(0, 16), MARLINC_WG_ENTRY(0, 32), MARLINC_WG_ENTRY(0, 64),
     MARLINC_WG_ENTRY(0, 128)},
    {MARLINC_WG_ENTRY(1, 8), MARLINC_WG_ENTRY(1, 16), MARLINC_WG_ENTRY(1, 32), MARLINC_WG_ENTRY(1, 64),
     MARLINC_WG_ENTRY(1, 128)},
};
// The kernels fed by TMA take the tensor maps as a second argument (kernels/marlin_launch.h, TmaMaps).
using TmaLaunchFn = cudaError_t (*)(const KernelArgs&, const TmaMaps&, const LaunchOpts&, cudaStream_t);
struct TmaEntry { PrepareFn prepare; TmaLaunchFn launch; };
// How many clusters of a kernel's cluster form the device runs at once (size, launch options, result).
using ClustersFn = cudaError_t (*)(int, const LaunchOpts&, int*);
#define MARLINC_WS_ENTRY_F(DT, NT, CL, F) TmaEntry{&wgmma_ws_prepare<DT, NT, 1, CL, F>, &wgmma_ws_launch<DT, NT, 1, CL, F>}
#define MARLINC_WS_ENTRY_CL(DT, NT, CL) MARLINC_WS_ENTRY_F(DT, NT, CL, wgmma_tile_n(NT))
#define MARLINC_WS_FIT_ENTRY(DT, NT) MARLINC_WS_ENTRY_CL(DT, NT, false),
const TmaEntry kWsTable[2][kNumWsTiles] = {  // kWsTiles' order
    {MARLINC_WS_ENTRY_CL(0, 32, false), MARLINC_WS_ENTRY_CL(0, 48, false), MARLINC_WS_ENTRY_CL(0, 64, false),
     MARLINC_WS_ENTRY_CL(0, 128, false),
     MARLINC_WS_ENTRY_CL(0, kWgmmaWideRows, false), MARLINC_WS_ENTRY_F(0, 128, false, kWgmmaWideTileN),
     MARLINC_WS_ENTRY_F(0, 128, false, kWgmmaTriTileN), MARLINC_FIT_TILES(MARLINC_WS_FIT_ENTRY, 0)},
    {MARLINC_WS_ENTRY_CL(1, 32, false), MARLINC_WS_ENTRY_CL(1, 48, false), MARLINC_WS_ENTRY_CL(1, 64, false),
     MARLINC_WS_ENTRY_CL(1, 128, false),
     MARLINC_WS_ENTRY_CL(1, kWgmmaWideRows, false), MARLINC_WS_ENTRY_F(1, 128, false, kWgmmaWideTileN),
     MARLINC_WS_ENTRY_F(1, 128, false, kWgmmaTriTileN), MARLINC_FIT_TILES(MARLINC_WS_FIT_ENTRY, 1)},
};
// The split forms (marlin_partition.h, wgmma_split_parts), in kWsTiles' order, for the tiles of wgmma_split_tile.
#define MARLINC_WS_SPLIT_ENTRY(DT, NT, F) TmaEntry{&wgmma_ws_prepare<DT, NT, 1, false, F, true>, &wgmma_ws_launch<DT, NT, 1, false, F, true>}
#define MARLINC_WS_SPLIT_FIT_ENTRY(DT, NT) MARLINC_WS_SPLIT_ENTRY(DT, NT, kWgmmaWideTileN),
constexpr TmaEntry kWsSplitTable[2][kNumWsTiles] = {
    {MARLINC_WS_SPLIT_ENTRY(0, 32, kWgmmaTileN), MARLINC_WS_SPLIT_ENTRY(0, 48, kWgmmaTileN),
     MARLINC_WS_SPLIT_ENTRY(0, 64, kWgmmaTileN),
     MARLINC_WS_SPLIT_ENTRY(0, 128, kWgmmaTileN), TmaEntry{},
     MARLINC_WS_SPLIT_ENTRY(0, 128, kWgmmaWideTileN), TmaEntry{}, MARLINC_FIT_TILES(MARLINC_WS_SPLIT_FIT_ENTRY, 0)},
    {MARLINC_WS_SPLIT_ENTRY(1, 32, kWgmmaTileN), MARLINC_WS_SPLIT_ENTRY(1, 48, kWgmmaTileN),
     MARLINC_WS_SPLIT_ENTRY(1, 64, kWgmmaTileN),
     MARLINC_WS_SPLIT_ENTRY(1, 128, kWgmmaTileN), TmaEntry{},
     MARLINC_WS_SPLIT_ENTRY(1, 128, kWgmmaWideTileN), TmaEntry{}, MARLINC_FIT_TILES(MARLINC_WS_SPLIT_FIT_ENTRY, 1)},
};
constexpr bool split_table_matches() {
  for (int dt = 0; dt < 2; ++dt)
    for (int i = 0; i < kNumWsTiles; ++i)
      if ((kWsSplitTable[dt][i].prepare != nullptr) != wgmma_split_tile(kWsTiles[i].rows, kWsTiles[i].tn)) return false;
  return true;
}
static_assert(split_table_matches(), "kWsSplitTable holds a split form for exactly the tiles of wgmma_split_tile");
// kWsTiles from kFirstFitTile on (MARLINC_FIT_TILES): every fit tile of wgmma_fit_tile, in order.
constexpr bool fit_tiles_listed() {
  int r = kWgmmaFitMinRows;
  for (int i = kFirstFitTile; i < kNumWsTiles; ++i, r += kWgmmaFitStep)
    if (kWsTiles[i].rows != r || kWsTiles[i].tn != kWgmmaWideTileN || !wgmma_fit_tile(r)) return false;
  return r == kWgmmaWideRows;
}
static_assert(fit_tiles_listed(), "kWsTiles and kWsTable hold every fit tile");
// The pair form (kernels/marlin_dispatch.h, wgmma_pair_tiles), [dt][pair_tile_index]: 128 x 256 tiles, the wide tile,
// then the fit tiles in order (pair_tile_index is meant for these rows only).
constexpr int kNumPairTiles = 2 + (kNumWsTiles - kFirstFitTile);
constexpr int pair_tile_index(int rows) {
  return rows == kWgmmaPairRows ? 0 : rows == kWgmmaWideRows ? 1 : 2 + (rows - kWgmmaFitMinRows) / kWgmmaFitStep;
}
static_assert(pair_tile_index(kWsTiles[kNumWsTiles - 1].rows) == kNumPairTiles - 1, "the last fit tile's pair entry");
#define MARLINC_WS_PAIR_FIT_ENTRY(DT, NT) MARLINC_WS_ENTRY_CL(DT, NT, true),
const TmaEntry kWsPairTable[2][kNumPairTiles] = {
    {MARLINC_WS_ENTRY_CL(0, kWgmmaPairRows, true), MARLINC_WS_ENTRY_CL(0, kWgmmaWideRows, true),
     MARLINC_FIT_TILES(MARLINC_WS_PAIR_FIT_ENTRY, 0)},
    {MARLINC_WS_ENTRY_CL(1, kWgmmaPairRows, true), MARLINC_WS_ENTRY_CL(1, kWgmmaWideRows, true),
     MARLINC_FIT_TILES(MARLINC_WS_PAIR_FIT_ENTRY, 1)}};
#define MARLINC_WS_PAIR_FIT_CLUSTERS(DT, NT) &wgmma_ws_max_clusters<DT, NT>,
const ClustersFn kWsPairClusters[2][kNumPairTiles] = {
    {&wgmma_ws_max_clusters<0, kWgmmaPairRows>, &wgmma_ws_max_clusters<0, kWgmmaWideRows>,
     MARLINC_FIT_TILES(MARLINC_WS_PAIR_FIT_CLUSTERS, 0)},
    {&wgmma_ws_max_clusters<1, kWgmmaPairRows>, &wgmma_ws_max_clusters<1, kWgmmaWideRows>,
     MARLINC_FIT_TILES(MARLINC_WS_PAIR_FIT_CLUSTERS, 1)}};
#endif

#if MARLINC_HAVE_SM90A
#define MARLINC_ST_ENTRY(DT, TN, CL, SW) TmaEntry{&stream_prepare<DT, TN, CL, SW>, &stream_launch<DT, TN, CL, SW>}
#define MARLINC_ST_ENTRY_SW(DT, TN, CL) {MARLINC_ST_ENTRY(DT, TN, CL, false), MARLINC_ST_ENTRY(DT, TN, CL, true)}
#define MARLINC_ST_ENTRY_CL(DT, TN) {MARLINC_ST_ENTRY_SW(DT, TN, false), MARLINC_ST_ENTRY_SW(DT, TN, true)}
const TmaEntry kStreamTable[2][3][2][2] = {  // [dt][width: kStreamTn][cluster form][swapped form]
    {MARLINC_ST_ENTRY_CL(0, 64), MARLINC_ST_ENTRY_CL(0, 128), MARLINC_ST_ENTRY_CL(0, 256)},
    {MARLINC_ST_ENTRY_CL(1, 64), MARLINC_ST_ENTRY_CL(1, 128), MARLINC_ST_ENTRY_CL(1, 256)},
};
#define MARLINC_ST_CLUSTERS(DT, TN) {&stream_max_clusters<DT, TN, false>, &stream_max_clusters<DT, TN, true>}
const ClustersFn kStreamClusters[2][3][2] = {  // [dt][width: kStreamTn][swapped form]
    {MARLINC_ST_CLUSTERS(0, 64), MARLINC_ST_CLUSTERS(0, 128), MARLINC_ST_CLUSTERS(0, 256)},
    {MARLINC_ST_CLUSTERS(1, 64), MARLINC_ST_CLUSTERS(1, 128), MARLINC_ST_CLUSTERS(1, 256)},
};
static_assert(kStreamTn[0] == 64 && kStreamTn[1] == 128 && kStreamTn[2] == 256, "kStreamTable is indexed like kStreamTn");
// Tiles whose weights and scales the streaming kernel requests before the wait for the previous kernel
// (64 KB per SM, as the other kernels' prologues). H100, set sums at m <= 8, one call: 8B 58.9-59.3 us
// against 59.0-59.6 with 2 and 60.1-60.6 with 6; 70B 171.6-174.9 against 176.5-179.1 (2) and 170.3-174.1
// (6). With 8, another call: 8B 62.1-63.0 at m = 1 against 59.5 with 4.
constexpr int kStreamPrewait = 4;
#endif

// Occupancy and shared-memory size per (device, kernel), computed once: the launcher is called per
// layer per token, and cudaFuncSetAttribute + the occupancy query cost host microseconds.
constexpr int kMaxDevices = 16;
struct Prepared { int blocks_per_sm = 0, smem = 0; cudaError_t err = cudaSuccess; bool done = false; };
Prepared g_prepared[kMaxDevices][2][kMaxMBlocks][kNumShapes];
Prepared g_wg_prepared[kMaxDevices][2][kNumWgRows];
Prepared g_ws_prepared[kMaxDevices][2][kNumWsTiles];
Prepared g_ws_pair_prepared[kMaxDevices][2][kNumPairTiles];
Prepared g_ws_split_prepared[kMaxDevices][2][kNumWsTiles];
Prepared g_st_prepared[kMaxDevices][2][3][2][2];
std::mutex g_prepared_mu;

Prepared prepare_once(Prepared& p, const Entry& e) {
  std::lock_guard<std::mutex> lock(g_prepared_mu);
  if (!p.done) {
    p.err = e.prepare(&p.blocks_per_sm, &p.smem);
    p.done = true;
  }
  return p;
}
Prepared prepare_once(Prepared& p, PrepareFn prepare) { return prepare_once(p, Entry{prepare, nullptr}); }
Prepared prepared(int dev, int dt, int mb, int shape) {
  return prepare_once(g_prepared[dev][dt][mb - 1][shape], kTable[dt][mb - 1][shape]);
}

// A device attribute read once per device (the launcher runs per layer per token). The cache holds
// value + 1, so that 0 means "not read yet" and attributes whose value is 0 are cached too.
int cached_attr(int dev, cudaDeviceAttr attr, int (&cache)[kMaxDevices]) {
  std::lock_guard<std::mutex> lock(g_prepared_mu);
  int v = 0;
  if (cache[dev] == 0 && cudaDeviceGetAttribute(&v, attr, dev) == cudaSuccess) cache[dev] = v + 1;
  return cache[dev] > 0 ? cache[dev] - 1 : 0;
}
int sm_count(int dev) {
  static int cache[kMaxDevices] = {};
  return cached_attr(dev, cudaDevAttrMultiProcessorCount, cache);
}
int cc_major(int dev) {
  static int cache[kMaxDevices] = {};
  return cached_attr(dev, cudaDevAttrComputeCapabilityMajor, cache);
}
int cc_minor(int dev) {
  static int cache[kMaxDevices] = {};
  return cached_attr(dev, cudaDevAttrComputeCapabilityMinor, cache);
}
// sm_90a code runs on compute capability 9.0 only (arch-specific features do not carry forward).
bool wgmma_runs_on(int dev) {
#if MARLINC_HAVE_SM90A
  return cc_major(dev) == 9 && cc_minor(dev) == 0;
#else
  (void)dev;
  return false;
#endif
}

// The lock region: one int counter per block, for grids up to kMaxLockBlocks, at a size and place that
// do not depend on num_sms. Calls with different num_sms may share one workspace, and the fp32 partial
// tiles start right after this region. Sized per call, a small grid's partial-tile slots began inside a
// larger grid's counters (which must stay zero between launches); only the fact that no grid's block 0
// ever deposits kept them apart.
constexpr int kMaxLockBlocks = 4096;
constexpr int kMaxSms = kMaxLockBlocks / kMaxBlocksPerSm;
constexpr size_t kLockRegionBytes = size_t(kMaxLockBlocks) * sizeof(int);
constexpr size_t kPartBytesPerBlock = kPartFloatsPerBlock * sizeof(float);
// 16-bit dequantized weight columns per cuBLAS call: small enough to stay in L2 between the
// dequantize kernel writing it and cuBLAS reading it (H100 L2: 50 MB).
constexpr size_t kDequantScratchBytes = size_t(24) << 20;

size_t part_region(int sms) { return size_t(sms) * kMaxBlocksPerSm * kPartBytesPerBlock; }

int ceil_div(int64_t a, int64_t b) { return ceil_div_int(a, b); }
// 16-row m blocks per tile. One tile covers m up to 64 rows, except that on small layers two 32-row
// chunks side by side (two blocks per SM, 16 rows per warp) beat one 64-row tile for 32 < m <= 64:
// measured on the H100 at m = 64 (docs/PERF.md), Llama-3-8B qkv 20.5 vs 25.5 us and o_proj 15.5 vs
// 18.4; from 4096 x 14336 (58.7M weights) up the 64-row tile wins or ties.
// Above m = 64 the 32-row tiles win on smaller layers only, up to kSmallLayerTallWeights: H200 (docs/PERF.md,
// forty-second session, call 8), us at m = 96 / 128 / 256 / 384, 64-row -> 32-row tiles: 896 x 896 19.3 / 19.4 / 17.4 /
// 18.0 -> 7.6 / 7.6 / 8.2 / 9.3, 1536 x 1536 20.7 / 20.7 / 28.2 / 27.0 -> 7.1 / 9.5 / 11.9 / 20.3, 2048 x 2048 15.7 /
// 16.2 / 23.6 / 28.4 -> 10.2 / 10.1 / 19.0 / 23.8, 4864 x 896 28.2 / 28.3 / 27.4 / 27.1 -> 11.9 / 13.0 / 18.6 / 24.3;
// from 2^24 slower but at m = 96 (4096 x 4096 24.3 / 38.6 / 58.4 -> 24.3 / 44.6 / 62.9 at m = 128 / 256 / 384, 4096 x
// 6144 and 2048 x 16384 4-17% slower, 14336 x 4096 level). On a Hopper device Auto gives these layers above m = 64 to
// the Hopper kernel or dequantize + cuBLAS (kernels/marlin_dispatch.h): this is for other GPUs (timed here on the
// H200's mma.sync kernel, not on them), calls without a cuBLAS handle, and path Marlin.
constexpr int64_t kSmallLayerWeights = int64_t(32) << 20;
constexpr int64_t kSmallLayerTallWeights = int64_t(9) << 19;  // 4.7 M: 4864 x 896 and below
int m_blocks_for(int m, int n, int k) {
  const int64_t weights = int64_t(n) * k;
  if (m > 32 && m <= 64 && weights <= kSmallLayerWeights) return 2;
  if (m > 64 && weights <= kSmallLayerTallWeights) return 2;
  return std::min(kMaxMBlocks, ceil_div(m, 16));
}

Partition partition(int m, int n, int k, int rows, TileShape t, int max_blocks, int whole_slices = 0) {
  return marlin_partition(m, n / t.tn, k / t.tk, rows, max_blocks, whole_slices);
}

// Blocks per SM that the model assumes (Shape::kBlocksPerSm): two where a warp's share of the m tile
// fits in 128 registers (up to 32 rows).
int model_blocks_per_sm(int mb) { return mb <= 2 ? 2 : 1; }

// Estimated time of one configuration, in units of "weight elements streamed by the busiest block":
// the stripe length times the tile size (times the row chunks a block walks), with the tile's A
// traffic (re-read per tile from L2 into shared memory) and a pipeline refill per slice a block starts
// as surcharges.
double config_cost(int m, int n, int k, int sms, int mb, TileShape t) {
  const int rows = 16 * mb;
  const Partition P = partition(m, n, k, rows, t, sms * model_blocks_per_sm(mb));
  const int64_t k_tiles = k / t.tk;
  const int chunks_per_block = ceil_div(P.par, P.chunk_groups);
  const double iters = double(P.iters) * chunks_per_block;
  const double tile = double(t.tk) * t.tn;
  const double a_surcharge = 0.5 * double(rows) / t.tn;  // A bytes per weight byte (0.5 B/weight)
  const double slices = iters / double(k_tiles) + chunks_per_block;
  const double refill = 3.0;  // tiles of latency lost when a block starts a new slice
  return (iters * (1.0 + a_surcharge) + slices * refill) * tile;
}

int choose_shape(int m, int n, int k, int sms, int mb) {
  int best = -1;
  double best_cost = std::numeric_limits<double>::max();
  for (int i = 0; i < kNumShapes; ++i) {
    const TileShape t = kShapes[i];
    if (n % t.tn != 0 || k % t.tk != 0) continue;
    const double c = config_cost(m, n, k, sms, mb, t);
    if (c < best_cost * 0.999) {  // ties keep the earlier (preferred) shape
      best_cost = c;
      best = i;
    }
  }
  // Measured on the H100 (docs/PERF.md, tile exploration): for layers up to 16384 wide and deep and
  // m <= 64, 128x128 beats the 64x256 the cost model picks by 3-22% (Llama-3-8B down_proj at m = 16:
  // 20.4 vs 26.2 us); the model's A-traffic term overrates 64x256 there. Up to m = 128 the same holds
  // for layers at most 8192 wide (Llama-3-8B qkv/o/down, 70B o_proj: 0.5-23% faster). Wider or deeper
  // layers keep the model's choice, which measured best or equal.
  constexpr int kWide = 1, kSquare = 0;
  static_assert(kShapes[kWide].tn == 256 && kShapes[kSquare].tn == 128 && kShapes[kSquare].tk == 128,
                "the override below names shapes by index");
  const bool square_wins = (m <= 64 && n <= 16384 && k <= 16384) || (m <= 128 && n <= 8192 && k <= 16384);
  if (best == kWide && square_wins && n % kShapes[kSquare].tn == 0 && k % kShapes[kSquare].tk == 0)
    best = kSquare;
  return best;
}

// ---- dequantize to 16-bit [k, nc] (row-major) for the cuBLAS path ----------------------------------

// One warp per 16x64 packed block (§1.4): lane i loads its four words, one per 16-column tile j, as one 16-byte read,
// multiplies each of its 32 codes by its column's scale (all 16 rows of a block lie in one group, since groups are 32
// deep or more: 8 scale reads a lane), and the warp writes the block's 16 rows of 64 halves through shared memory as
// 16-byte stores. Before the forty-third session one 128-thread block per packed block read a word a thread and a scale
// per code; this form reads a quarter of the scales and launches an eighth of the blocks.
constexpr int kDqWarps = 8;
template <int DT>
__global__ void __launch_bounds__(32 * kDqWarps) dequant_kernel(const int32_t* __restrict__ B,
                                                                const uint16_t* __restrict__ s,
                                                                uint16_t* __restrict__ W, int n, int k, int groups,
                                                                int group_shift, int c0, int nc) {
  __shared__ __align__(16) uint16_t tile[kDqWarps][16][72];  // [16, 64] + 8 padding halves per row, a warp each
  const int warp = threadIdx.x / 32, i = threadIdx.x % 32;
  const int tiles_x = nc / 64, t = blockIdx.x * kDqWarps + warp;
  if (t >= tiles_x * (k / 16)) return;  // no block-wide barrier below
  const int R = t / tiles_x, tx = t % tiles_x, nt = c0 / 64 + tx;
  const int4 q4 = reinterpret_cast<const int4*>(B + size_t(R) * 2 * n + 128 * nt)[i];
  const uint32_t q[4] = {uint32_t(q4.x), uint32_t(q4.y), uint32_t(q4.z), uint32_t(q4.w)};  // word 4 i + j
  const size_t srow = groups > 1 ? size_t((16 * R) >> group_shift) * n : 0;
  uint16_t(*out)[72] = tile[warp];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint16_t sv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // the lane's columns 16 j + 8 h + i / 4 of the block
      const int col = 64 * nt + 16 * j + 8 * h + i / 4;
      int pos;
      if (groups > 1) {  // grouped perm: 8x8 transpose inside each 64-chunk
        pos = 64 * (col / 64) + 8 * (col % 8) + (col % 64) / 8;
      } else {  // per-channel perm inside each 32-chunk
        const int u = col % 32;
        pos = 32 * (col / 32) + 8 * ((u % 8) / 2) + 2 * (u / 8) + (u % 2);
      }
      sv[h] = s[srow + pos];
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int kk = 8 * (e % 2) + 2 * (i % 4) + e / 4;  // §1.5 inverse
      const int h = (e / 2) % 2, nn = 16 * j + 8 * h + i / 4;
      const float code = float(int((q[j] >> (4 * e)) & 0xF) - 8);
      uint16_t v;
      if constexpr (DT == 0) {
        v = __half_as_ushort(__hmul(__float2half_rn(code), __ushort_as_half(sv[h])));
      } else {
        v = __bfloat16_as_ushort(__hmul(__float2bfloat16_rn(code), __ushort_as_bfloat16(sv[h])));
      }
      out[kk][nn] = v;
    }
  }
  __syncwarp();
#pragma unroll
  for (int c = 0; c < 4; ++c) {  // 16 rows x 8 chunks of 8 halves
    const int r = (32 * c + i) / 8, ch = i % 8;
    *reinterpret_cast<int4*>(W + size_t(16 * R + r) * nc + 64 * tx + 8 * ch) =
        *reinterpret_cast<const int4*>(&out[r][8 * ch]);
  }
}

}  // namespace
}  // namespace detail

using namespace detail;

const char* marlin_status_name(MarlinStatus s) {
  switch (s) {
    case MarlinStatus::Ok: return "ok";
    case MarlinStatus::BadShape: return "bad shape (need m >= 1, n % 64 == 0, k % 128 == 0)";
    case MarlinStatus::BadGroupSize: return "bad group size (need -1, 32, 64 or 128 dividing k)";
    case MarlinStatus::BadAlignment: return "pointer not 16-byte aligned";
    case MarlinStatus::WorkspaceTooSmall: return "workspace too small";
    case MarlinStatus::NoConfig:
      return "forced configuration does not fit the shape or device (thread_m_blocks not in 0..4, mma_parts below 0, "
             "wgmma_rows not 0/8/16/32/48/64/128 or 144-256 by 16, wgmma_pipeline not 0..2, 2 below 32 rows or 1 on 48 "
             "or above 128, path Wgmma with thread_n other than 0, 256 (up to 128 rows), 128 (128 rows or more, "
             "pipeline 2) or 192 (128 rows, pipeline 2, n % 192 == 0), path Wgmma without a 9.0 device, sm_90a code "
             "and n % 256 == 0 (n % 128 == 0 with m > 64 on 128-column tiles), or path Stream without those, m <= 16 "
             "and a slice width (thread_n 0/128/256) dividing n with k % (32768 / width) == 0)";
    case MarlinStatus::CudaError: return "CUDA error";
    case MarlinStatus::CublasError: return "cuBLAS error";
  }
  return "unknown";
}

size_t marlin_workspace_bytes(int num_sms, bool with_dequant_path) {
  return kLockRegionBytes + part_region(num_sms) + (with_dequant_path ? kDequantScratchBytes : 0);
}

int marlin_cublas_min_m(int n, int k) {
  (void)n;
  // H100, docs/PERF.md 2026-11-23 (per-layer times at m = 256, 512, 1024): at m = 256 the fused kernel
  // beats dequantize + cuBLAS on every layer; at m = 512 the cuBLAS path wins or ties on layers up to
  // 16384 deep (Llama-3-8B qkv 73 vs 107 us, 70B gate/up 1579 vs 1662) but loses on deeper ones, whose
  // 24 MB dequantize scratch holds few columns per cuBLAS call (70B down k = 28672: 940 vs 804 us;
  // 32768^2: 4328 vs 3743); at m = 1024 it wins everywhere.
  constexpr int kDeep = 16384;
  return k > kDeep ? 1024 : 512;
}

MarlinTileChoice marlin_choose_tiles(int m, int n, int k, int num_sms) {
  const int mb = m_blocks_for(m, n, k);
  if (whole_k_stripes(m, n, k, num_sms * kMaxBlocksPerSm))
    return {mb, kShapes[kWholeKShape].tn, kShapes[kWholeKShape].tk, true};
  const int s = choose_shape(m, n, k, num_sms, mb);
  if (s < 0) return {mb, 0, 0};
  return {mb, kShapes[s].tn, kShapes[s].tk};
}

namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The Hopper kernel addresses a row chunk's activations (up to 128 rows of k / 8 int4, plus one tile)
// and the packed weights (k n / 32 int4) with 32-bit int4 offsets: k below ~1.3e8 and packed weights
// below 32 GiB, beyond any model, but checked rather than assumed.
bool wgmma_offsets_fit(int n, int k) {
  constexpr int64_t kMaxOffset = std::numeric_limits<int32_t>::max();
  return int64_t(kWgRows[kNumWgRows - 1] + 1) * (k / 8) < kMaxOffset && int64_t(k) * n / 32 < kMaxOffset;
}

// Where Auto takes the Hopper kernel: kernels/marlin_dispatch.h (the rule and its measurements).
MarlinPath auto_path(int dev, int m, int n, int k, int sms, bool cublas_ok) {
  if (wgmma_runs_on(dev) && stream_auto(m, n, k, sms)) return MarlinPath::Stream;
  if (whole_k_stripes(m, n, k, sms * kMaxBlocksPerSm)) return MarlinPath::Marlin;
  // n % 256 == 0: hopper_auto_pick; n % 128 == 0 only: hopper_n128_pick (the kernel's 128-column tiles). Their MmaSync
  // is m <= 64, where neither of the dequantize rules below applies.
  if (wgmma_runs_on(dev) && n % kWgmmaWideTileN == 0 && wgmma_offsets_fit(n, k)) {
    const int64_t weights = int64_t(n) * k;
    switch (n % kWgmmaTileN == 0 ? hopper_auto_pick(m, weights) : hopper_n128_pick(m, weights)) {
      case HopperAutoPick::Hopper: return MarlinPath::Wgmma;
      case HopperAutoPick::DequantCublas: return cublas_ok ? MarlinPath::DequantCublas : MarlinPath::Wgmma;
      case HopperAutoPick::MmaSync: return MarlinPath::Marlin;
    }
  }
  if (cublas_ok && wgmma_runs_on(dev) && hopper_mma_only_dq(m, int64_t(n) * k)) return MarlinPath::DequantCublas;
  if (cublas_ok && m >= marlin_cublas_min_m(n, k)) return MarlinPath::DequantCublas;
  return MarlinPath::Marlin;
}

// The token tile for m: the shortest 256-column tile that holds it (the tallest, 128 rows, beyond), among kWgRows and,
// where the producer pipeline runs (`producer`), that pipeline's own (kWsTiles: the 48-row tile at m = 33-48).
int wgmma_rows_for(int m, bool producer) {
  int rows = kWgRows[kNumWgRows - 1];
  for (int r : kWgRows)
    if (m <= r && r < rows) rows = r;
  if (producer)
    for (const WsTile& t : kWsTiles)
      if (t.tn == kWgmmaTileN && m <= t.rows && t.rows < rows) rows = t.rows;
  return rows;
}
// Whether either pipeline has a tile of `rows` token rows (MarlinGemm::wgmma_rows).
bool wgmma_rows_built(int rows) {
  return std::find(std::begin(kWgRows), std::end(kWgRows), rows) != std::end(kWgRows) ||
         std::any_of(std::begin(kWsTiles), std::end(kWsTiles), [rows](const WsTile& t) { return t.rows == rows; });
}

#if MARLINC_HAVE_SM90A
// The Hopper kernel's pipeline per token tile (MarlinGemm::wgmma_pipeline): the producer warpgroup
// wherever it is built. H100 (docs/PERF.md): ncu on 70B gate/up at m = 1024, 1.43 vs 1.64 ms with the
// tensor pipe busy 80% vs 65%; summed per set at m = 64 to 1024 faster in 15 of 16 cases, by up to 33%
// (8B m = 64: 90 vs 134 us), the exception 32768^2 per-channel at m = 64 (300 vs 288 us).
int wgmma_pipeline_for(int rows) { return rows >= kWsMinRows ? 2 : 1; }
#endif

// Overlap pays where launch and tail are a visible part of the call: on the H100 it saved 2-4 us per
// layer up to 8192 x 57344 (470M weights) at every m measured. On 32768^2 (2^30 weights) it saved
// 3-5 us at m <= 2 in every run, and above that measured anywhere from 4% faster to 12% slower.
bool use_pdl(const MarlinGemm& g, int dev) {
  constexpr int64_t kOverlapMaxWeights = int64_t(1) << 30;
  constexpr int kOverlapHugeMaxM = 2;
  return g.overlap_previous && cc_major(dev) >= 9 &&
         (int64_t(g.n) * g.k < kOverlapMaxWeights || g.m <= kOverlapHugeMaxM);
}

// marlin_timeline's state: the buffer, its slots and the launches made since it was set.
// Launches check the atomic flag without the lock, so that the usual case (off) costs one load.
std::mutex g_tl_mu;
std::atomic<bool> g_tl_on{false};
unsigned long long* g_tl_buf = nullptr;
int g_tl_slots = 0;
uint64_t g_tl_launches = 0;

unsigned long long* next_timeline_slot() {
  if (!g_tl_on.load(std::memory_order_acquire)) return nullptr;
  std::lock_guard<std::mutex> lock(g_tl_mu);
  if (g_tl_buf == nullptr) return nullptr;
  return g_tl_buf + size_t(g_tl_launches++ % uint64_t(g_tl_slots)) * kTlSlotWords;
}

// The argument block both fused kernels share (all but the partition).
KernelArgs kernel_args(const MarlinGemm& g, int groups, int shift, int sms, const Partition& P) {
  KernelArgs a{};
  a.timeline = P.grid <= kTlMaxBlocks ? next_timeline_slot() : nullptr;
  a.A = g.A;
  a.B = g.B;
  a.s = g.s;
  a.C = g.C;
  a.locks = static_cast<int*>(g.workspace);
  a.red = reinterpret_cast<float*>(static_cast<char*>(g.workspace) + kLockRegionBytes);
  a.m = g.m;
  a.n = g.n;
  a.k = g.k;
  a.groups = groups;
  a.group_shift = shift;
  a.par = P.par;
  a.iters = P.iters;
  a.chunk_blocks = P.chunk_blocks;
  a.chunk_groups = P.chunk_groups;
  return a;
}

#if MARLINC_HAVE_SM90A
// The TMA kernels' scale box height (per-channel: the single row, which the kernels do not copy).
int scale_box_rows(int groups, int shift, int tk) { return groups > 1 ? tile_scale_rows(tk, shift) : 1; }
#endif

#if MARLINC_HAVE_SM90A
// Whether the device holds the whole grid's clusters of `size` blocks at once (a launch in two waves of clusters
// would idle half the SMs), queried once per (device, kernel) into `cache` (clusters + 1; 0: not queried yet).
bool clusters_fit(int& cache, ClustersFn query, int size, const LaunchOpts& o) {
  int clusters = 0;
  {
    std::lock_guard<std::mutex> lock(g_prepared_mu);
    if (cache == 0) {
      LaunchOpts q = o;
      q.grid = size;
      cache = 1 + (query(size, q, &clusters) == cudaSuccess ? clusters : 0);
    }
    clusters = cache - 1;
  }
  return int64_t(clusters) * size >= o.grid;
}
int g_ws_pair_clusters[kMaxDevices][2][kNumPairTiles];  // clusters_fit's cache for the Hopper kernel's pair forms
#endif

MarlinStatus run_wgmma(const MarlinGemm& g, int groups, int shift, int sms, int dev) {
#if MARLINC_HAVE_SM90A
  // Layers with n % 256 != 0 (n % 128 == 0) run above m = 64 only, on the tiles 128 columns wide (128 x 128, the fit
  // tiles, 128 x 192 where n % 192 == 0): the narrower row tiles are all 256 wide.
  const bool n128 = g.n % kWgmmaTileN != 0;
  if (!wgmma_runs_on(dev) || g.n % kWgmmaWideTileN != 0 || (n128 && g.m <= kWgmma64MaxM))
    return MarlinStatus::NoConfig;
  if (!wgmma_offsets_fit(g.n, g.k)) return MarlinStatus::BadShape;
  // Narrow layers at m > 64 take 128 x 128 tiles (marlin_dispatch.h, wgmma_prefer_128x128) unless the rows or the
  // block-barrier pipeline (which has no 128-column tiles) are forced.
  // The fit tiles go first where wgmma_fit_plan (marlin_dispatch.h) takes them, unless the rows, the block-barrier
  // pipeline or (on path Wgmma) the columns are forced.
  // 128 x 192 tiles come before both where wgmma_prefer_192 takes them, under the same conditions.
  const bool pick = g.wgmma_rows == 0 && g.wgmma_pipeline != 1;
  const bool cols_free = pick && !(g.path == MarlinPath::Wgmma && g.thread_n != 0);
  const int fit_plan = cols_free ? wgmma_fit_plan(g.m, g.n, g.k, sms) : 0;
  const bool tri = cols_free && wgmma_prefer_192(g.m, g.n, g.k, sms, fit_plan);
  const int fit = tri ? 0 : fit_plan;
  const bool narrow = pick && !tri && fit == 0 && (n128 || wgmma_prefer_128x128(g.m, g.n, g.k, sms));
  const int rows = g.wgmma_rows > 0 ? g.wgmma_rows
                   : tri            ? kWgmmaTriRows
                   : fit > 0        ? fit
                   : narrow         ? kWgmmaNarrowRows
                                    : wgmma_rows_for(g.m, g.wgmma_pipeline != 1);
  // Columns per tile: the token tile's own width, or on path Wgmma a forced thread_n (128 x 128 or 128 x 192 tiles).
  const int tn = g.path == MarlinPath::Wgmma && g.thread_n != 0 ? g.thread_n
                 : tri                                          ? kWgmmaTriTileN
                 : narrow                                       ? kWgmmaNarrowCols
                                                                : wgmma_tile_n(rows);
  int ri = -1, wi = -1;
  for (int i = 0; i < kNumWgRows; ++i)
    if (kWgRows[i] == rows && tn == kWgmmaTileN) ri = i;
  for (int i = 0; i < kNumWsTiles; ++i)
    if (kWsTiles[i].rows == rows && kWsTiles[i].tn == tn) wi = i;
  if ((ri < 0 && wi < 0) || g.n % tn != 0) return MarlinStatus::NoConfig;
  const int dt = g.act == ActType::F16 ? 0 : 1;
  const int pipeline = g.wgmma_pipeline != 0 ? g.wgmma_pipeline : wgmma_pipeline_for(rows);
  if ((pipeline == 2 && wi < 0) || (pipeline == 1 && ri < 0)) return MarlinStatus::NoConfig;
  const Prepared pr = pipeline == 2 ? prepare_once(g_ws_prepared[dev][dt][wi], kWsTable[dt][wi].prepare)
                                    : prepare_once(g_wg_prepared[dev][dt][ri], kWgTable[dt][ri]);
  if (pr.err != cudaSuccess || pr.blocks_per_sm < 1) return MarlinStatus::CudaError;
  const TileShape t{tn, kWgmmaTileK};
  if (int64_t(ceil_div(g.m, rows)) * (g.n / t.tn) * (g.k / t.tk) > std::numeric_limits<int>::max() / 2)
    return MarlinStatus::BadShape;
  const int bps = wgmma_blocks_per_sm(pr.blocks_per_sm, rows, tn), max_blocks = sms * bps;
  const int whole = bps == 1 ? wgmma_whole_slices(g.m, g.n, rows, max_blocks, tn) : 0;
  LaunchOpts o;
  o.pdl = use_pdl(g, dev);
  // Tiles split in two as clusters of their two blocks (wgmma_pair_tiles): a partition of exactly two blocks
  // per tile, k_tiles / 2 tiles each.
  int cl = 0;
  Partition P{};
  int pi = 0;  // kWsPairTable's index where the pair form runs
  if (pipeline == 2 && bps == 1 && tn == wgmma_tile_n(rows) && wgmma_pair_tiles(g.m, g.n, g.k, rows, max_blocks)) {
    pi = pair_tile_index(rows);
    const Prepared pc = prepare_once(g_ws_pair_prepared[dev][dt][pi], kWsPairTable[dt][pi].prepare);
    P = partition(g.m, g.n, g.k, rows, t, 2 * ceil_div(g.m, rows) * (g.n / t.tn));
    o.grid = P.grid;
    o.smem_bytes = pc.smem;
    if (pc.err == cudaSuccess && pc.blocks_per_sm >= 1 && P.iters * 2 == g.k / t.tk &&
        clusters_fit(g_ws_pair_clusters[dev][dt][pi], kWsPairClusters[dt][pi], 2, o))
      cl = 1;
  }
  int split = 0;  // the producer form's k-split: parts per slice (marlin_partition.h, wgmma_split_parts)
  if (cl == 0) {
    P = partition(g.m, g.n, g.k, rows, t, max_blocks, whole);
    o.smem_bytes = pr.smem;
    if (pipeline == 2 && whole == 0 && g.wgmma_split && wgmma_split_tile(rows, tn))
      split = wgmma_split_parts(P.par, g.n / t.tn, g.k / t.tk, max_blocks, P.iters);
    if (split > 0) {
      const Prepared ps = prepare_once(g_ws_split_prepared[dev][dt][wi], kWsSplitTable[dt][wi].prepare);
      if (ps.err != cudaSuccess || ps.blocks_per_sm < 1) return MarlinStatus::CudaError;
      P = marlin_split_partition(g.m, g.n / t.tn, g.k / t.tk, rows, split);
      o.smem_bytes = ps.smem;
    }
    o.grid = P.grid;
  }
  o.cluster = cl == 1 ? 2 : 0;
  KernelArgs a = kernel_args(g, groups, shift, sms, P);
  a.split = split;
  if (pipeline == 2) {
    TmaMaps maps;
    const TmaBoxes box{t.tn, t.tk / 16, rows, scale_box_rows(groups, shift, t.tk), tma_tail_rows(g.m, rows)};
    if (!tma_maps(g.A, g.B, g.s, g.m, g.n, g.k, groups, box, &maps)) return MarlinStatus::CudaError;
    const TmaEntry& e = cl == 1 ? kWsPairTable[dt][pi] : split > 0 ? kWsSplitTable[dt][wi] : kWsTable[dt][wi];
    return e.launch(a, maps, o, g.stream) == cudaSuccess ? MarlinStatus::Ok : MarlinStatus::CudaError;
  }
  return kWgTable[dt][ri].launch(a, o, g.stream) == cudaSuccess ? MarlinStatus::Ok : MarlinStatus::CudaError;
#else
  (void)g, (void)groups, (void)shift, (void)sms, (void)dev;
  return MarlinStatus::NoConfig;
#endif
}

#if MARLINC_HAVE_SM90A
// Slices split in two (kStreamClusterSplit, kernels/marlin_dispatch.h) run as clusters of their two blocks,
// which add their sums through shared memory (kernels/sm90/marlin_stream.cuh, CLUSTER). H100 (docs/PERF.md,
// sixteenth session), same call, two runs each, µs per layer: 70B down 42.1-42.8 -> 41.3-41.7 at m = 1-8, 70B
// gate/up (its last slices in halves) 84.3-85.8 -> 83.0-85.3 at m = 1-8, 70B o at m = 16 15.3 -> 14.9; the 70B
// set at m = 1-8 161.5-162.9 -> 159.9-161.6; the other streaming layers level. Clusters of three and four were
// slower in an earlier form (70B q/k/v at m = 16 20.0-20.1 -> 20.2, 8B down at m = 16 16.2-16.3 -> 16.6-16.7).
int g_st_clusters[kMaxDevices][2][3][2];  // clusters + 1; 0: not queried yet (clusters_fit)
bool stream_clusters_fit(int dev, int dt, int ti, int sw, const LaunchOpts& o) {
  return clusters_fit(g_st_clusters[dev][dt][ti][sw], kStreamClusters[dt][ti][sw], kStreamClusterSplit, o);
}
#endif

MarlinStatus run_stream(const MarlinGemm& g, int groups, int shift, int sms, int dev) {
#if MARLINC_HAVE_SM90A
  if (!wgmma_runs_on(dev) || g.m > kStreamMaxM) return MarlinStatus::NoConfig;
  const StreamPlan plan = stream_plan(g.n, g.k, sms, g.thread_n);
  if (plan.tn == 0 || (g.thread_n != 0 && g.thread_n != plan.tn)) return MarlinStatus::NoConfig;
  const int ti = plan.tn == kStreamTn[0] ? 0 : plan.tn == kStreamTn[1] ? 1 : 2;
  const int dt = g.act == ActType::F16 ? 0 : 1;
  const int grid = plan.rounds > 0 ? sms : plan.split > 0 ? (g.n / plan.tn) * plan.split : 0;
  const int sw = g.m <= kStreamSwapMaxM ? 1 : 0;
  int cl = plan.split == kStreamClusterSplit && grid % kStreamClusterSplit == 0 ? 1 : 0;
  Prepared pr = prepare_once(g_st_prepared[dev][dt][ti][cl][sw], kStreamTable[dt][ti][cl][sw].prepare);
  if (cl == 1) {
    LaunchOpts q;
    q.grid = grid;
    q.smem_bytes = pr.smem;
    if (pr.err != cudaSuccess || pr.blocks_per_sm < 1 || !stream_clusters_fit(dev, dt, ti, sw, q)) {
      cl = 0;
      pr = prepare_once(g_st_prepared[dev][dt][ti][0][sw], kStreamTable[dt][ti][0][sw].prepare);
    }
  }
  if (pr.err != cudaSuccess || pr.blocks_per_sm < 1) return MarlinStatus::CudaError;
  const TileShape t{plan.tn, stream_tk(plan.tn)};
  if (int64_t(g.n / t.tn) * (g.k / t.tk) > std::numeric_limits<int>::max() / 2) return MarlinStatus::BadShape;
  const Partition P = partition(g.m, g.n, g.k, kStreamMaxM, t, sms);  // stripes: one block per SM
  KernelArgs a = kernel_args(g, groups, shift, sms, P);
  a.prewait = kStreamPrewait;
  a.split = plan.split;
  a.rounds = plan.rounds;
  TmaMaps maps;
  TmaBoxes box{plan.tn, t.tk / 16, sw ? kStreamSwapMaxM : kStreamMaxM, scale_box_rows(groups, shift, t.tk)};
  box.a_boxes = t.tk / 64;  // one activation copy per stage (marlin_stream.cuh, kABoxes)
  if (!tma_maps(g.A, g.B, g.s, g.m, g.n, g.k, groups, box, &maps)) return MarlinStatus::CudaError;
  LaunchOpts o;
  o.grid = grid > 0 ? grid : P.grid;
  o.smem_bytes = pr.smem;
  o.pdl = use_pdl(g, dev);
  o.cluster = cl == 1 ? kStreamClusterSplit : 0;
  if (kStreamTable[dt][ti][cl][sw].launch(a, maps, o, g.stream) != cudaSuccess) return MarlinStatus::CudaError;
  return MarlinStatus::Ok;
#else
  (void)g, (void)groups, (void)shift, (void)sms, (void)dev;
  return MarlinStatus::NoConfig;
#endif
}

MarlinStatus run_dequant_cublas(const MarlinGemm& g, int groups, int shift, int sms) {
  if (!g.cublas) return MarlinStatus::CublasError;
  if (g.workspace_bytes < marlin_workspace_bytes(sms, true)) return MarlinStatus::WorkspaceTooSmall;
  uint16_t* W = reinterpret_cast<uint16_t*>(static_cast<char*>(g.workspace) + kLockRegionBytes + part_region(sms));
  cublasHandle_t h = g.cublas;
  if (cublasSetStream(h, g.stream) != CUBLAS_STATUS_SUCCESS) return MarlinStatus::CublasError;
  const int64_t cols = int64_t(kDequantScratchBytes / (2 * size_t(g.k)));
  const int nc_max = int(std::max<int64_t>(64, cols / 64 * 64));
  if (int64_t(nc_max) * g.k * 2 > int64_t(kDequantScratchBytes)) return MarlinStatus::BadShape;  // k too deep
  const float alpha = 1.f, beta = 0.f;
  const cudaDataType_t dt = g.act == ActType::F16 ? CUDA_R_16F : CUDA_R_16BF;
  for (int c0 = 0; c0 < g.n; c0 += nc_max) {
    const int nc = std::min(nc_max, g.n - c0);
    const int grid = ceil_div(int64_t(nc / 64) * (g.k / 16), kDqWarps);
    const auto* s16 = static_cast<const uint16_t*>(g.s);
    if (g.act == ActType::F16)
      dequant_kernel<0><<<grid, 32 * kDqWarps, 0, g.stream>>>(g.B, s16, W, g.n, g.k, groups, shift, c0, nc);
    else
      dequant_kernel<1><<<grid, 32 * kDqWarps, 0, g.stream>>>(g.B, s16, W, g.n, g.k, groups, shift, c0, nc);
    if (cudaGetLastError() != cudaSuccess) return MarlinStatus::CudaError;
    // Row-major C[m, n] is column-major C^T [n, m]: C^T[c0:c0+nc, :] = W^T (col-major [nc, k]) · A^T.
    void* Cc = static_cast<char*>(g.C) + size_t(c0) * 2;
    if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, nc, g.m, g.k, &alpha, W, dt, nc, g.A, dt, g.k, &beta, Cc, dt, g.n,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
      return MarlinStatus::CublasError;
  }
  return MarlinStatus::Ok;
}

}  // namespace

bool marlin_timeline(unsigned long long* buf, int slots) {
  std::lock_guard<std::mutex> lock(g_tl_mu);
  g_tl_buf = slots > 0 ? buf : nullptr;
  g_tl_slots = slots > 0 ? slots : 0;
  g_tl_launches = 0;
  g_tl_on.store(g_tl_buf != nullptr, std::memory_order_release);
#if defined(MARLINC_TIMELINE)
  return true;
#else
  return false;
#endif
}

MarlinPath marlin_auto_path(int m, int n, int k) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return MarlinPath::Marlin;
  return auto_path(dev, m, n, k, sm_count(dev), true);
}

bool marlin_wgmma_available() {
  int dev = 0;
  return cudaGetDevice(&dev) == cudaSuccess && dev >= 0 && dev < kMaxDevices && wgmma_runs_on(dev);
}

cudaError_t marlin_wgmma_probe(const uint16_t* A, const uint16_t* B, float* D, int n, cudaStream_t stream) {
  if (!marlin_wgmma_available()) return cudaErrorNotSupported;
#if MARLINC_HAVE_SM90A
  return wgmma_probe(A, B, D, n, stream);
#else
  (void)A, (void)B, (void)D, (void)n, (void)stream;
  return cudaErrorNotSupported;
#endif
}

// Auto's two launches (kernels/marlin_dispatch.h, auto_split_head): rows [0, head) and [head, m), each with Auto's
// own choice. The second may overlap the first (programmatic dependent launch): it touches A, C and the workspace
// only after the first has finished, and the first writes no weights.
MarlinStatus run_split(const MarlinGemm& g, int head) {
  constexpr size_t kElem = 2;  // fp16 / bf16
  MarlinGemm first = g, rest = g;
  first.m = head;
  rest.m = g.m - head;
  rest.A = static_cast<const char*>(g.A) + size_t(head) * size_t(g.k) * kElem;
  rest.C = static_cast<char*>(g.C) + size_t(head) * size_t(g.n) * kElem;
  rest.overlap_previous = true;
  const MarlinStatus st = marlin_gemm(first);
  return st == MarlinStatus::Ok ? marlin_gemm(rest) : st;
}

MarlinStatus marlin_gemm(const MarlinGemm& g) {
  if (g.m < 1 || !marlin_shape_supported(g.n, g.k)) return MarlinStatus::BadShape;
  if (int64_t(g.m) * g.n > int64_t(1) << 40 || int64_t(g.k) * g.n / 8 > std::numeric_limits<int32_t>::max() * int64_t(4))
    return MarlinStatus::BadShape;
  int groups = 1, shift = 0;
  if (g.group_size != -1) {
    if (g.group_size != 32 && g.group_size != 64 && g.group_size != 128) return MarlinStatus::BadGroupSize;
    if (g.k % g.group_size != 0) return MarlinStatus::BadGroupSize;
    groups = g.k / g.group_size;  // == 1 when group_size == k: per-channel layout and semantics (§1.6)
    shift = g.group_size == 32 ? 5 : g.group_size == 64 ? 6 : 7;
  }
  if (!aligned16(g.A) || !aligned16(g.B) || !aligned16(g.s) || !aligned16(g.C) || !aligned16(g.workspace))
    return MarlinStatus::BadAlignment;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return MarlinStatus::CudaError;
  const int dev_sms = sm_count(dev);
  if (dev_sms <= 0) return MarlinStatus::CudaError;
  const int sms = g.num_sms > 0 ? g.num_sms : dev_sms;
  // Every block of a launch must be resident at once (a slice's finisher waits for the others'
  // deposits): a grid sized for more SMs than the device has could wait forever. The lock region
  // counts kMaxLockBlocks blocks.
  if (sms > dev_sms || sms > kMaxSms) return MarlinStatus::BadShape;

  if (g.wgmma_rows != 0 && !wgmma_rows_built(g.wgmma_rows)) return MarlinStatus::NoConfig;
  if (g.wgmma_pipeline < 0 || g.wgmma_pipeline > 2) return MarlinStatus::NoConfig;
  const bool cublas_ok = g.cublas && g.workspace_bytes >= marlin_workspace_bytes(sms, true);
  const MarlinPath path = g.path == MarlinPath::Auto ? auto_path(dev, g.m, g.n, g.k, sms, cublas_ok) : g.path;
  if (path == MarlinPath::DequantCublas) return run_dequant_cublas(g, groups, shift, sms);
  // Not while the timeline records: its slots count one launch per call.
  if (g.path == MarlinPath::Auto && path == MarlinPath::Wgmma && !g_tl_on.load(std::memory_order_acquire) &&
      auto_split_head(g.m) > 0)
    return run_split(g, auto_split_head(g.m));
  if (g.workspace_bytes < marlin_workspace_bytes(sms, false)) return MarlinStatus::WorkspaceTooSmall;
  if (path == MarlinPath::Wgmma) return run_wgmma(g, groups, shift, sms, dev);
  if (path == MarlinPath::Stream) return run_stream(g, groups, shift, sms, dev);
  if (g.thread_m_blocks < 0 || g.thread_m_blocks > kMaxMBlocks || g.mma_parts < 0) return MarlinStatus::NoConfig;
  const int mb = g.thread_m_blocks > 0 ? g.thread_m_blocks : m_blocks_for(g.m, g.n, g.k);
  // Tiles left to the launcher: whole-k stripes where kernels/marlin_dispatch.h's rule holds.
  const bool tiles_free = g.thread_k == 0 && g.thread_n == 0 && g.thread_m_blocks == 0;
  const bool whole_k = tiles_free && whole_k_stripes(g.m, g.n, g.k, sms * kMaxBlocksPerSm);
  int shape = -1;
  if (g.thread_k != 0 || g.thread_n != 0) {
    for (int i = 0; i < kNumShapes; ++i)
      if (kShapes[i].tk == g.thread_k && kShapes[i].tn == g.thread_n) shape = i;
    if (shape < 0 || g.n % kShapes[shape].tn != 0 || g.k % kShapes[shape].tk != 0) return MarlinStatus::NoConfig;
  } else if (whole_k) {
    shape = kWholeKShape;
  } else {
    shape = choose_shape(g.m, g.n, g.k, sms, mb);
    if (shape < 0) return MarlinStatus::NoConfig;
  }
  const int dt = g.act == ActType::F16 ? 0 : 1;
  const Prepared pr = prepared(dev, dt, mb, shape);
  if (pr.err != cudaSuccess || pr.blocks_per_sm < 1) return MarlinStatus::CudaError;

  const TileShape t = kShapes[shape];
  if (int64_t(ceil_div(g.m, 16 * mb)) * (g.n / t.tn) * (g.k / t.tk) > std::numeric_limits<int>::max() / 2)
    return MarlinStatus::BadShape;
  int max_blocks = sms * std::min(pr.blocks_per_sm, kMaxBlocksPerSm);
  if (whole_k) max_blocks = std::min(max_blocks, g.n / t.tn);  // one block per column slice (one row chunk)
  // Fewer blocks per slice: forced, or Auto's on shallow layers (marlin_dispatch.h, mma_auto_parts) where the tiles
  // are the launcher's own.
  const int parts = g.mma_parts > 0 ? g.mma_parts : tiles_free && !whole_k ? mma_auto_parts(g.m, g.k) : 0;
  if (parts > 0) max_blocks = mma_parts_blocks(g.m, g.n / t.tn, g.k / t.tk, 16 * mb, max_blocks, parts);
  const Partition P = partition(g.m, g.n, g.k, 16 * mb, t, max_blocks);

  LaunchOpts o;
  o.grid = P.grid;
  o.smem_bytes = pr.smem;
  o.pdl = use_pdl(g, dev);
  if (kTable[dt][mb - 1][shape].launch(kernel_args(g, groups, shift, sms, P), o, g.stream) != cudaSuccess)
    return MarlinStatus::CudaError;
  return MarlinStatus::Ok;
}

}  // namespace marlinc::kernels
