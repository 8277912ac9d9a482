// Internal: the argument block of the fused Marlin kernel and the per-configuration entry points that
// the generated translation units (kernels/generated/*.cu) instantiate. Included by .cu files only.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace marlinc::kernels::detail {

// Rows of A per 16-row "m block"; a thread block computes MB of them (MB = 1..4, i.e. 16..64 rows).
constexpr int kMaxMBlocks = 4;
// Widest tile the workspace's fp32 partial-tile slots are sized for (thread_n = 256).
constexpr int kMaxThreadN = 256;
// At most this many co-resident blocks per SM are launched; the stripe reduction needs all blocks of
// one launch resident at once, and the workspace has one lock + partial-tile slot per block.
constexpr int kMaxBlocksPerSm = 2;
constexpr int kThreads = 256;  // 8 warps: warps split n (64 columns each) and then k inside a tile
// fp32 floats of one block's partial-tile slot in the workspace (the mma.sync kernel's largest tile).
constexpr size_t kPartFloatsPerBlock = size_t(kMaxMBlocks) * 16 * kMaxThreadN;

// The Hopper (sm_90a, wgmma) kernel, kernels/sm90/: 256-column x 64-deep tiles and NT = 32, 64 or 128
// token rows per tile. Its blocks deposit partial tiles of up to two mma.sync slots, so a launch has at
// most kMaxBlocksPerSm * kPartFloatsPerBlock / (256 * NT) blocks per SM.
constexpr int kWgmmaTileN = 256;
constexpr int kWgmmaTileK = 64;
constexpr size_t kWgmmaPartFloats = kMaxBlocksPerSm * kPartFloatsPerBlock;

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
};

// Launch options beyond the argument block.
struct LaunchOpts {
  int grid = 0, smem_bytes = 0;
  bool pdl = false;  // cudaLaunchAttributeProgrammaticStreamSerialization (MarlinGemm::overlap_previous)
};

// Dynamic shared memory bytes and occupancy (blocks per SM) of one configuration; also raises the
// kernel's dynamic shared-memory limit. Returns a CUDA error code (cudaSuccess = 0).
template <int DT, int MB, int TN, int TK>
cudaError_t marlin_prepare(int* blocks_per_sm, int* smem_bytes);
template <int DT, int MB, int TN, int TK>
cudaError_t marlin_launch(const KernelArgs& a, const LaunchOpts& o, cudaStream_t stream);

template <int DT, int NT>
cudaError_t wgmma_prepare(int* blocks_per_sm, int* smem_bytes);
template <int DT, int NT>
cudaError_t wgmma_launch(const KernelArgs& a, const LaunchOpts& o, cudaStream_t stream);

}  // namespace marlinc::kernels::detail
