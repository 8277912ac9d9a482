// A probe of the wgmma operand model the Hopper kernel relies on, for tests: one warpgroup loads A
// [64, 64] into registers by the A fragment layout, B [N, 64] into shared memory through the kernel's
// own swizzled placement (wgmma_layout::act_chunk_byte), runs four k16 wgmmas through the kernel's
// descriptor (wgmma_layout::sw128_desc / desc_start) and writes D [64, N] back by the D fragment layout.
// If this agrees with A B^T on the GPU and the CPU model (tests/kernels/test_wgmma_model.cpp) agrees
// with the reference, the kernel's operand handling is right; a failing kernel with a passing probe
// points at its pipeline instead.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/marlin_device.cuh"
#include "kernels/sm90/wgmma_layout.h"
#include "kernels/sm90/wgmma_ops.cuh"
#include "kernels/sm90/wgmma_sync.cuh"

namespace marlinc::kernels::detail {

namespace {

namespace wl = wgmma_layout;

template <int N>
__global__ void __launch_bounds__(128) wgmma_probe_kernel(const uint16_t* __restrict__ A, const uint16_t* __restrict__ B,
                                                         float* __restrict__ D) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) unsigned char sB[N * wl::kRowBytes];
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  if ((smem_addr(sB) & (wl::kSwizzleAtom - 1)) != 0) __trap();  // the swizzle needs an aligned atom
  // B rows (tokens) of 64 k: 16-byte chunk c of row r at the swizzled place the kernel's cp.async uses.
  for (int i = tid; i < N * 8; i += 128) {
    const int r = i >> 3, c = i & 7;
    *reinterpret_cast<int4*>(sB + wl::act_chunk_byte(r, c)) = reinterpret_cast<const int4*>(B + r * 64)[c];
  }
  fence_proxy_async();
  __syncthreads();
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  const uint32_t base = smem_addr(sB);
#pragma unroll
  for (int kk = 0; kk < wl::kKB; ++kk) {
    // A fragment: register r of lane l holds row 16w + l/4 + 8 (r % 2), columns 2 (l % 4) + 8 (r / 2)
    // and + 1 (low half first) of this k16 block.
    uint32_t a[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = 16 * w + (lane >> 2) + 8 * (r % 2), col = 16 * kk + 2 * (lane & 3) + 8 * (r / 2);
      a[r] = uint32_t(A[row * 64 + col]) | (uint32_t(A[row * 64 + col + 1]) << 16);
    }
    fence_regs(a);
    wgmma_fence();
    Wgmma<0, N>::run(d, a, wl::sw128_desc(wl::desc_start(base, kk)));
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(d);
  }
  // D fragment: register 4i + 2h + e of lane l is row 16w + l/4 + 8h, column 8i + 2 (l % 4) + e.
#pragma unroll
  for (int reg = 0; reg < N / 2; ++reg) {
    const int i = reg / 4, h = (reg / 2) % 2, e = reg % 2;
    D[(16 * w + (lane >> 2) + 8 * h) * N + 8 * i + 2 * (lane & 3) + e] = d[reg];
  }
#else
  __trap();
#endif
}

}  // namespace

cudaError_t wgmma_probe(const uint16_t* A, const uint16_t* B, float* D, int n, cudaStream_t stream) {
  switch (n) {
    case 8: wgmma_probe_kernel<8><<<1, 128, 0, stream>>>(A, B, D); break;
    case 16: wgmma_probe_kernel<16><<<1, 128, 0, stream>>>(A, B, D); break;
    case 32: wgmma_probe_kernel<32><<<1, 128, 0, stream>>>(A, B, D); break;
    case 64: wgmma_probe_kernel<64><<<1, 128, 0, stream>>>(A, B, D); break;
    case 128: wgmma_probe_kernel<128><<<1, 128, 0, stream>>>(A, B, D); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace marlinc::kernels::detail
