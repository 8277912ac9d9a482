// Host API of marlinc's Marlin W4A16 GEMM (CUDA): C[m, n] = A[m, k] · dequant(B, s), consuming exactly
// the packed layout of ../shared/spec/formats.md §1 (B int32 [k/16, 2n], permuted scales [G, n]).
// Raw device pointers, a stream and a caller-owned workspace; every entry point returns a status and
// never throws or prints. Only available in CUDA builds (MARLINC_HAVE_CUDA).
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/act_type.h"

struct cublasContext;  // cublasHandle_t is `cublasContext*`; callers that want the large-m path pass one

namespace marlinc::kernels {

enum class MarlinStatus {
  Ok = 0,
  BadShape,           // m < 1, n % 64 != 0, k % 128 != 0, sizes that overflow int indexing, or num_sms above the device's
  BadGroupSize,       // group_size not in {-1, 32, 64, 128} or not dividing k
  BadAlignment,       // A, B, s, C or workspace not 16-byte aligned
  WorkspaceTooSmall,  // workspace_bytes < marlin_workspace_bytes(...) for the chosen path
  NoConfig,           // a forced tile config that does not fit the shape or device (thread_m_blocks outside
                      // 0..4, wgmma_rows not 0/8/16/32/48/64/128 or 144-256 by 16, wgmma_pipeline not 0..2, 2 on
                      // a tile below 32 rows or 1 on 48 rows or above 128, path Wgmma or Stream where that kernel
                      // cannot run)
  CudaError,          // a CUDA runtime call failed (the sticky error is left for the caller to read)
  CublasError,        // the dequantize + cuBLAS path failed
};
const char* marlin_status_name(MarlinStatus s);

// The weight shapes the kernel takes (BadShape otherwise): n a positive multiple of 64, k of 128.
constexpr bool marlin_shape_supported(int64_t n, int64_t k) {
  return n >= 64 && k >= 128 && n % 64 == 0 && k % 128 == 0;
}

enum class MarlinPath {
  Auto,           // per m and shape, from measurements (marlin_auto_path); on the Hopper kernel, m just past a
                  // whole number of 128-row chunks runs as two launches (kernels/marlin_dispatch.h, auto_split_head)
  Marlin,         // always the fused mma.sync kernel (any CUDA GPU of sm_80 or later)
  DequantCublas,  // always dequantize to a 16-bit scratch and call cuBLAS (needs `cublas`)
  Wgmma,          // always the fused Hopper kernel (warpgroup MMA): NoConfig unless the device is
                  // compute capability 9.0, the build has sm_90a code and n % 256 == 0 (n % 128 == 0
                  // with m > 64: its tiles 128 columns wide)
  Stream,         // always the streaming m <= 16 kernel (one block per SM, TMA ring): NoConfig unless
                  // m <= 16, the device is 9.0 with sm_90a code, and a slice width (thread_n: 0 = chosen,
                  // 128 or 256) divides n with k a multiple of its stage depth (256 and 128 respectively)
};

struct MarlinGemm {
  const void* A = nullptr;     // [m, k] fp16/bf16, row-major
  const int32_t* B = nullptr;  // [k/16, 2n] Marlin-packed uint4b8 codes
  const void* s = nullptr;     // [G, n] Marlin-permuted fp16/bf16 scales (G = k/group_size, or 1)
  void* C = nullptr;           // [m, n] fp16/bf16, row-major (fully overwritten)
  int m = 0, n = 0, k = 0;
  int group_size = -1;         // -1 (per-channel), 32, 64 or 128; group_size == k counts as per-channel
  ActType act = ActType::F16;
  // int32 locks + fp32 partial tiles (+ the dequantize scratch when that path may run). Zero it once
  // before the first call; every call leaves the locks zero again, so it is reused across calls.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
  cublasContext* cublas = nullptr;  // optional; its stream is set to `stream`
  int num_sms = 0;                  // 0: read from the current device; at most the device's SM count
  MarlinPath path = MarlinPath::Auto;
  // Tile overrides of the mma.sync kernel (path Marlin, or Auto where it picks that kernel); with path
  // Stream, thread_n forces the streaming kernel's slice width (128 or 256); with path Wgmma, the Hopper kernel's
  // tile columns (256 up to 128 rows; 128 on taller tiles, or 128 x 128 tiles with wgmma_rows = 128; 192 with
  // wgmma_rows = 128 and n % 192 == 0: 128 x 192 tiles).
  int thread_k = 0, thread_n = 0;   // 0: chosen per shape and m; else force (128,128), (64,256) or (128,64)
  int thread_m_blocks = 0;          // 0: chosen per m; else force 1..4 16-row blocks per tile (row chunks of 16x)
  // mma.sync kernel: 0 chosen per layer; else at most this many blocks share a column slice (1: every block owns
  // whole slices, no partial tiles), by launching fewer blocks; as many as the k tiles or more: the plain stripes
  int mma_parts = 0;
  // Hopper kernel: 0 chosen per m and layer; else force 8/16/32/48/64/128 rows of 256 columns (48: producer warpgroup
  // only), or 144-256 rows by 16 of 128 columns (the fit and the wide tiles, producer warpgroup only)
  int wgmma_rows = 0;
  // Hopper kernel's pipeline: 0 chosen per tile; 1 every warp copies and a block barrier ends each stage;
  // 2 a producer warpgroup copies and mbarriers hand stages over (tiles of 32 rows and more only; the only pipeline
  // of the 48-row tile, which Auto takes at m = 33-48 unless 1 is forced).
  int wgmma_pipeline = 0;
  // Programmatic dependent launch (sm_90+): the kernel may start while the previous kernel on `stream`
  // is still running and stream its first weight tiles (B, s) before waiting for that kernel to finish;
  // A, C and the workspace are touched only after the wait. Set it only when no kernel still in flight
  // writes B or s (inference: weights are constant), never when B/s were just produced on the GPU.
  // Layers of 2^30 weights or more use it only at m <= 2 (measured, see kernels/marlin.cu).
  bool overlap_previous = false;
  // Hopper kernel: its k-split plan where it applies (kernels/marlin_partition.h, wgmma_split_parts: slices in parts
  // of one block each, finished by all of them together). false: stripes and the in-order finisher everywhere (the
  // sums are the same, and the outputs bit for bit where the stripes split k at the same tiles: tests, A/B timings).
  bool wgmma_split = true;
};

// Workspace bytes for a device with `num_sms` multiprocessors; `with_dequant_path` adds the 16-bit
// scratch that the large-m (dequantize + cuBLAS) path streams through.
size_t marlin_workspace_bytes(int num_sms, bool with_dequant_path);

// Runs the GEMM on `stream` (asynchronously). Safe to capture in a CUDA graph.
MarlinStatus marlin_gemm(const MarlinGemm& g);

// Smallest m at which Auto takes the dequantize + cuBLAS path (measured, docs/PERF.md).
int marlin_cublas_min_m(int n, int k);

// The path Auto takes for (m, n, k) on the current device, given a cuBLAS handle and a workspace sized
// with the dequantize scratch (without them, DequantCublas falls back to the fused kernels).
MarlinPath marlin_auto_path(int m, int n, int k);

// Whether the Hopper kernel can run here: a 9.0 device and a build with sm_90a code.
bool marlin_wgmma_available();

// For tests: checks the Hopper kernel's wgmma operand maps on the device. D [64, n] (fp32, row-major) =
// A [64, 64] · B [n, 64]^T with fp16 A and B (row-major, device pointers), n in {8, 16, 32, 64, 128},
// through the kernel's A-fragment, swizzle, descriptor and D-fragment maps. cudaErrorNotSupported where
// marlin_wgmma_available() is false.
cudaError_t marlin_wgmma_probe(const uint16_t* A, const uint16_t* B, float* D, int n, cudaStream_t stream);

// The tile configuration Auto picks for (m, n, k) on `num_sms` SMs (for benchmarks and tests).
// whole_k: each block owns one column slice for the whole depth (kernels/marlin_dispatch.h).
struct MarlinTileChoice { int thread_m_blocks, thread_n, thread_k; bool whole_k = false; };
MarlinTileChoice marlin_choose_tiles(int m, int n, int k, int num_sms);

// Diagnostics of the fixed per-call cost (bench_marlin --timeline). In builds configured with
// MARLINC_TIMELINE=ON, every fused-kernel launch made after marlin_timeline(buf, slots) writes one record
// of kTlRecord 64-bit words per block into slot (launch number % slots) of `buf` (device memory,
// slots * kTlSlotWords words), launch numbers counting from 0 at this call: %globaltimer (ns) where
// the block passes each point, and its SM. marlin_timeline(nullptr, 0) stops it. Returns whether this
// build writes records (without MARLINC_TIMELINE the kernels ignore the buffer).
enum MarlinTimelinePoint : int {
  kTlEntry = 0,      // kernel entry
  kTlWaited = 1,     // past the wait for the previous kernel (griddepcontrol.wait), first slice
  kTlFirstData = 2,  // the first tile's operands are in shared memory
  kTlComputed = 3,   // the last slice's products are done, before its reduction
  kTlExit = 4,       // the block is done
  kTlSm = 5,         // %smid
  kTlReduced = 6,    // a finisher past the wait for its slice's deposits (last slice)
  kTlInfo = 7,       // blocks sharing the last slice * 2 + (this block is its finisher)
  kTlRecord = 8,     // 64-bit words per block
};
constexpr int kTlMaxBlocks = 1024;                    // blocks per slot: more than any grid (SMs x 2)
constexpr int kTlSlotWords = kTlMaxBlocks * kTlRecord;
bool marlin_timeline(unsigned long long* buf, int slots);

}  // namespace marlinc::kernels
