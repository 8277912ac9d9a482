// wgmma's ordering primitives (sm_90a), shared by the Hopper kernel and its probe: the fence before a
// stage's wgmmas, commit and wait of wgmma groups, register pins that keep the compiler from moving
// operands into or across the asynchronous window, and the generic -> async proxy fence for shared memory.
#pragma once
#include <cstdint>

namespace marlinc::kernels::detail {

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Keep the compiler from moving register reads or writes into or across the asynchronous wgmma window:
// accumulators after the last wait, and the A fragments before wgmma.fence (an expansion scheduled
// between two wgmmas of one stage would make ptxas serialize them, C7513).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
// cp.async writes are generic-proxy writes; wgmma reads shared memory through the async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

}  // namespace marlinc::kernels::detail
