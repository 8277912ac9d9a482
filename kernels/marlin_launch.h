// Internal: the argument block of the fused Marlin kernel and the per-configuration entry points that
// the generated translation units (kernels/generated/*.cu) instantiate. Included by .cu files only.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda.h>  // CUtensorMap (the type only: the encoder is reached through the runtime, no -lcuda)
#include <cuda_runtime_api.h>

#include "kernels/marlin.h"
#include "kernels/marlin_partition.h"

namespace marlinc::kernels::detail {

constexpr int kThreads = 256;  // 8 warps: warps split n (64 columns each) and then k inside a tile
// Workspace slot sizes and the Hopper kernel's tiles: kernels/marlin_partition.h.

// Group rows of scales that one tile of depth tk spans, groups of 2^group_shift (at least one: a group
// deeper than the tile still needs its row). Every kernel's scale copy and the TMA boxes use it.
__host__ __device__ constexpr int tile_scale_rows(int tk, int group_shift) {
  return (tk >> group_shift) > 1 ? (tk >> group_shift) : 1;
}

struct KernelArgs {
  const void* A;        // [m, k] 16-bit activations
  const int32_t* B;     // [k/16, 2n] packed codes
  const void* s;        // [G, n] permuted scales
  void* C;              // [m, n] output
  int* locks;           // [grid] per-slice deposit counters, indexed by the slice's first block (zero between launches)
  float* red;           // [grid, MB*16*thread_n] fp32 partial tile each block deposits for a shared slice
  int m, n, k;
  int groups;           // G; 1 = per-channel (scales applied to the output)
  int group_shift;      // log2(group_size) when groups > 1
  int par;              // row chunks of MB*16 rows
  int iters;            // tiles per block stripe, within one row chunk's n_tiles x k_tiles
  int chunk_blocks;     // blocks sharing one row chunk (ceil(n_tiles * k_tiles / iters))
  int chunk_groups;     // groups of chunk_blocks blocks; grid = chunk_groups * chunk_blocks
  unsigned long long* timeline;  // [grid, kTlRecord] per-block timestamps, or null (MARLINC_TIMELINE builds)
  int prewait;          // streaming kernel: tiles whose weights go out before the wait for the previous kernel
  int split;            // streaming kernel and the Hopper kernel's producer form: 0 stripes of `iters` tiles, else
                        // block b owns part b % split of slice b / split (k-split: kernels/marlin_dispatch.h
                        // stream_plan; marlin_partition.h wgmma_split_parts, whose slices finish spread)
  int rounds;           // streaming kernel: with split > 0, rounds of one whole slice per block before the
                        // split slices (marlin_dispatch.h, stream_ranges)
};

// The per-block timeline record layout (kTlEntry ...): kernels/marlin.h, marlin_timeline.

// Launch options beyond the argument block.
struct LaunchOpts {
  int grid = 0, smem_bytes = 0;
  bool pdl = false;  // cudaLaunchAttributeProgrammaticStreamSerialization (MarlinGemm::overlap_previous)
  int cluster = 0;   // > 1: cudaLaunchAttributeClusterDimension (cluster x 1 x 1; grid % cluster == 0)
};

// Dynamic shared memory bytes and occupancy (blocks per SM) of one configuration; also raises the
// kernel's dynamic shared-memory limit. Returns a CUDA error code (cudaSuccess = 0).
template <int DT, int MB, int TN, int TK>
cudaError_t marlin_prepare(int* blocks_per_sm, int* smem_bytes);
template <int DT, int MB, int TN, int TK>
cudaError_t marlin_launch(const KernelArgs& a, const LaunchOpts& o, cudaStream_t stream);

// kernels/sm90/wgmma_probe.cu: one warpgroup, D [64, n] (fp32) = A [64, 64] · B [n, 64]^T (fp16) through
// the Hopper kernel's operand maps, n in {8, 16, 32, 64, 128}.
cudaError_t wgmma_probe(const uint16_t* A, const uint16_t* B, float* D, int n, cudaStream_t stream);

template <int DT, int NT>
cudaError_t wgmma_prepare(int* blocks_per_sm, int* smem_bytes);
template <int DT, int NT>
cudaError_t wgmma_launch(const KernelArgs& a, const LaunchOpts& o, cudaStream_t stream);
// The kernels fed by TMA take three tensor maps (kernels/tma_maps.h, tma_maps): B as [k / 16, n]
// 8-byte units, A as [m, k] 16-bit (128B swizzle, rows past m zero-filled), s as [G, n] 16-bit; the box
// sizes are the kernel's stage.
struct TmaMaps {
  // a_tail: A again, its box exactly the rows of the last row chunk where m is not a whole number of chunks
  // (kernels/marlin_partition.h, tma_tail_rows), else a copy of a.
  CUtensorMap b, a, s, a_tail;
};
// The warp-specialized form (kernels/sm90/marlin_wgmma_ws.cuh): NT-row tiles at BPS blocks per SM; CL: its form
// for launches whose tiles are split in two, each pair one cluster (LaunchOpts::cluster = 2); SPLIT: its form for
// launches whose slices are split in parts finished together (KernelArgs::split; marlin_partition.h,
// wgmma_split_parts). FEAT: the tile's columns (wgmma_tile_n(NT), or 128 beside 128 rows: kernels/marlin_partition.h).
template <int DT, int NT, int BPS, bool CL, int FEAT, bool SPLIT = false>
cudaError_t wgmma_ws_prepare(int* blocks_per_sm, int* smem_bytes);
// The fit tiles' rows (kernels/marlin_partition.h, wgmma_fit_tile), in order: X(DT, rows) for each, for their
// instantiations (kernels/sm90/marlin_wgmma_fit_*.cu) and the launcher's table (kernels/marlin.cu, kWsTiles).
#define MARLINC_FIT_TILES(X, DT) X(DT, 144) X(DT, 160) X(DT, 176) X(DT, 192) X(DT, 208) X(DT, 224) X(DT, 240)
template <int DT, int NT, int BPS, bool CL, int FEAT, bool SPLIT = false>
cudaError_t wgmma_ws_launch(const KernelArgs& a, const TmaMaps& maps, const LaunchOpts& o, cudaStream_t stream);
// How many clusters of `size` blocks of the CL form (NT = kWgmmaPairRows, kWgmmaWideRows or a fit tile's rows,
// o.smem_bytes each) the device runs at once.
template <int DT, int NT>
cudaError_t wgmma_ws_max_clusters(int size, const LaunchOpts& o, int* clusters);
// The streaming m <= 16 kernel (kernels/sm90/marlin_stream.cuh): TN-column slices, one block per SM; CL: its
// form for launches whose slices are split in two, each pair one cluster (LaunchOpts::cluster = 2); SW: the
// form for m <= kStreamSwapMaxM (weights as the mma's A operand, 8-row activation boxes).
template <int DT, int TN, bool CL, bool SW>
cudaError_t stream_prepare(int* blocks_per_sm, int* smem_bytes);
template <int DT, int TN, bool CL, bool SW>
cudaError_t stream_launch(const KernelArgs& a, const TmaMaps& maps, const LaunchOpts& o, cudaStream_t stream);
// How many clusters of `size` blocks of the CL form (o.smem_bytes each) the device runs at once.
template <int DT, int TN, bool SW>
cudaError_t stream_max_clusters(int size, const LaunchOpts& o, int* clusters);

}  // namespace marlinc::kernels::detail
