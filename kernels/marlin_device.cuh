// Device helpers shared by the fused Marlin kernels (mma.sync in marlin_kernel.cuh, wgmma in
// marlin_wgmma.cuh): cp.async, the lop3 int4 -> 16-bit dequantization into fragment order, the scale
// multiply, 16-bit conversions, programmatic dependent launch and an acquire load. Layout facts:
// formats.md §1.3-§1.6.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/marlin_launch.h"
#include "kernels/marlin_partition.h"

namespace marlinc::kernels::detail {

// ---- small PTX wrappers -------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; `pred == false` zero-fills (rows of A past m) without reading.
// The _s form takes the shared-window address, which a kernel can keep instead of converting a generic
// pointer per copy.
__device__ __forceinline__ void cp_async16_s(uint32_t dst, const void* src, bool pred) {
  const int n = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool pred) {
  cp_async16_s(smem_addr(dst), src, pred);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// (a & b) | c in one instruction: masks a nibble pair and ORs in the exponent of a magic number.
__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// One packed word -> four 16-bit pairs (q - 8): f[0] = (e0,e1), f[1] = (e2,e3) are the b0/b1 registers
// of the B fragment for column c of the 16-wide tile, f[2], f[3] the same for column c + 8 (§1.3: the
// 64207531 interleave puts (e0,e1) in nibbles 0/4, (e2,e3) in 1/5, (e4,e5) in 2/6, (e6,e7) in 3/7).
template <int DT>
__device__ __forceinline__ void dequant8(uint32_t q, uint32_t (&f)[4]) {
  if constexpr (DT == 0) {
    // fp16: 0x6400 is 1024.0 whose ulp is 1, so OR-ing a nibble into the mantissa gives 1024 + v;
    // the high nibble lands as 1024 + 16 v and is scaled by 1/16 while subtracting (64 + 8).
    constexpr uint32_t kLo = 0x000f000f, kHi = 0x00f000f0, kExp = 0x64006400;
    constexpr uint32_t kSub = 0x64086408;  // 1032 = 1024 + 8 (fuses the uint4b8 zero point)
    constexpr uint32_t kMul = 0x2c002c00;  // 1/16
    constexpr uint32_t kAdd = 0xd480d480;  // -72 = -(64 + 8)
    const uint32_t lo0 = lop3_and_or(q, kLo, kExp), hi0 = lop3_and_or(q, kHi, kExp);
    q >>= 8;
    const uint32_t lo1 = lop3_and_or(q, kLo, kExp), hi1 = lop3_and_or(q, kHi, kExp);
    asm("sub.f16x2 %0, %1, %2;\n" : "=r"(f[0]) : "r"(lo0), "r"(kSub));
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(f[1]) : "r"(hi0), "r"(kMul), "r"(kAdd));
    asm("sub.f16x2 %0, %1, %2;\n" : "=r"(f[2]) : "r"(lo1), "r"(kSub));
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(f[3]) : "r"(hi1), "r"(kMul), "r"(kAdd));
  } else {
    // bf16 has a 7-bit mantissa, so 16 v would not fit: each nibble pair is shifted to the bottom and
    // OR-ed into 0x4300 (128.0, ulp 1), then 136 = 128 + 8 is subtracted with an fma by 1.0.
    constexpr uint32_t kLo = 0x000f000f, kExp = 0x43004300;
    constexpr uint32_t kOne = 0x3f803f80, kNeg136 = 0xc308c308;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t x = lop3_and_or(q >> (4 * i), kLo, kExp);
      asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(f[i]) : "r"(x), "r"(kOne), "r"(kNeg136));
    }
  }
}

// Multiplies the two dequantized pairs f0, f1 by the low (HI = false) or high half of the scale word s,
// broadcast to both halves. Written as a `mov {l, h}` split and a `{l, l}` join, the pattern ptxas folds
// into the multiply's operand selector (R.H0_H0 / R.H1_H1) instead of spending a PRMT per broadcast.
// bf16 multiplies as fma with -0 (an exact product, like mul.bf16x2, which needs sm_90).
template <int DT, bool HI>
__device__ __forceinline__ void scale2(uint32_t& f0, uint32_t& f1, uint32_t s) {
  if constexpr (DT == 0) {
    if constexpr (!HI)
      asm("{\n .reg .b16 l, h;\n .reg .b32 b;\n mov.b32 {l, h}, %2;\n mov.b32 b, {l, l};\n"
          " mul.f16x2 %0, %0, b;\n mul.f16x2 %1, %1, b;\n}\n" : "+r"(f0), "+r"(f1) : "r"(s));
    else
      asm("{\n .reg .b16 l, h;\n .reg .b32 b;\n mov.b32 {l, h}, %2;\n mov.b32 b, {h, h};\n"
          " mul.f16x2 %0, %0, b;\n mul.f16x2 %1, %1, b;\n}\n" : "+r"(f0), "+r"(f1) : "r"(s));
  } else {
    if constexpr (!HI)
      asm("{\n .reg .b16 l, h;\n .reg .b32 b;\n mov.b32 {l, h}, %2;\n mov.b32 b, {l, l};\n"
          " fma.rn.bf16x2 %0, %0, b, %3;\n fma.rn.bf16x2 %1, %1, b, %3;\n}\n"
          : "+r"(f0), "+r"(f1) : "r"(s), "r"(0x80008000u));
    else
      asm("{\n .reg .b16 l, h;\n .reg .b32 b;\n mov.b32 {l, h}, %2;\n mov.b32 b, {h, h};\n"
          " fma.rn.bf16x2 %0, %0, b, %3;\n fma.rn.bf16x2 %1, %1, b, %3;\n}\n"
          : "+r"(f0), "+r"(f1) : "r"(s), "r"(0x80008000u));
  }
}

template <int DT>
__device__ __forceinline__ float to_float(uint16_t h) {
  if constexpr (DT == 0) return __half2float(__ushort_as_half(h));
  else return __bfloat162float(__ushort_as_bfloat16(h));
}
template <int DT>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (DT == 0) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// Programmatic dependent launch (sm_90): let the next kernel on the stream launch now (its blocks take
// SM slots as ours exit), and wait until the previous kernel has finished and its writes are visible.
// Both are no-ops when the launch carried no programmatic-serialization attribute.
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}
__device__ __forceinline__ void wait_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Timeline mark (KernelArgs::timeline): the block's record of point `pt` is written where `on` holds.
// A predicated store, not a branch: the Hopper kernel marks between wgmmas (a branch there makes ptxas
// serialize them, C7513).
__device__ __forceinline__ void tl_mark(const KernelArgs& p, int pt, bool on = true, unsigned long long info = 0) {
#if defined(MARLINC_TIMELINE)
  unsigned long long v = info;
  if (pt == kTlInfo) {
  } else if (pt == kTlSm) {
    unsigned int sm;
    asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
    v = sm;
  } else {
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(v));
  }
  unsigned long long* dst = p.timeline + size_t(blockIdx.x) * kTlRecord + pt;
  asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n @q st.global.u64 [%0], %1;\n}\n"
               ::"l"(dst), "l"(v), "r"(int(on && p.timeline != nullptr)) : "memory");
#else
  (void)p, (void)pt, (void)on, (void)info;
#endif
}

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The barrier of the threads that share a slice reduction: the whole block (kBar = 0, __syncthreads), or
// named barrier kBar of kCount threads (the consumer warpgroups of the warp-specialized Hopper kernel,
// whose producer warpgroup never reaches the reduction).
template <int kBar, int kCount>
__device__ __forceinline__ void team_sync() {
  if constexpr (kBar == 0) __syncthreads();
  else asm volatile("bar.sync %0, %1;\n" ::"n"(kBar), "n"(kCount) : "memory");
}

// The cross-block slice reduction's hand-off (both fused kernels): a depositing block, once every thread
// that stored its partial tile has fenced its own stores, bumps the slice's counter; the finishing block
// waits until `expected` deposits are counted. The finisher re-arms the counter to 0 after reading.
// `leader` is one thread of the team (thread 0 of the block unless a team barrier is named).
template <int kBar = 0, int kCount = 0>
__device__ __forceinline__ void deposit_done(int* counter, bool leader) {
  team_sync<kBar, kCount>();
  if (leader) atomicAdd(counter, 1);
}
template <int kBar = 0, int kCount = 0>
__device__ __forceinline__ void wait_deposits(const int* counter, int expected, bool leader) {
  if (leader)
    while (ld_acquire(counter) != expected) {
    }
  team_sync<kBar, kCount>();
}

// ---- host side of both kernels -----------------------------------------------------------------

// Raises the dynamic shared-memory limit of a kernel's per-channel and grouped variants to `smem` and reports
// it, with the smaller occupancy (one grid size serves both).
template <typename Kernel>
cudaError_t prepare_variants(Kernel per_channel, Kernel grouped, int threads, int smem, int* blocks_per_sm,
                             int* smem_bytes) {
  *smem_bytes = smem;
  int occ[2] = {0, 0};
  const Kernel kerns[2] = {per_channel, grouped};
  for (int i = 0; i < 2; ++i) {
    cudaError_t e = cudaFuncSetAttribute(kerns[i], cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ[i], kerns[i], threads, smem);
    if (e != cudaSuccess) return e;
  }
  *blocks_per_sm = occ[0] < occ[1] ? occ[0] : occ[1];
  return cudaSuccess;
}

// Launches `kernel(args...)` on o.grid blocks, with programmatic stream serialization when o.pdl.
template <typename Kernel, typename... Args>
cudaError_t launch_kernel(Kernel kernel, int threads, const LaunchOpts& o, cudaStream_t stream, const Args&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(o.grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = size_t(o.smem_bytes);
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (o.pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (o.cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n++].val.clusterDim = {unsigned(o.cluster), 1, 1};
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// How many clusters of `size` blocks of a kernel's per-channel and grouped variants (o.smem_bytes each) the
// device runs at once: the smaller count, which holds for either.
template <typename Kernel>
cudaError_t max_active_clusters(Kernel per_channel, Kernel grouped, int threads, int size, const LaunchOpts& o,
                                int* clusters) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(o.grid);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = size_t(o.smem_bytes);
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim = {unsigned(size), 1, 1};
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n[2] = {0, 0};
  cudaError_t e = cudaOccupancyMaxActiveClusters(&n[0], per_channel, &cfg);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveClusters(&n[1], grouped, &cfg);
  *clusters = n[0] < n[1] ? n[0] : n[1];
  return e;
}

// Launches the variant that matches a.groups, with a and any further kernel arguments (the TMA kernels' maps).
template <typename Kernel, typename... Extra>
cudaError_t launch_variant(Kernel per_channel, Kernel grouped, int threads, const KernelArgs& a, const LaunchOpts& o,
                           cudaStream_t stream, const Extra&... extra) {
  return launch_kernel(a.groups > 1 ? grouped : per_channel, threads, o, stream, a, extra...);
}

}  // namespace marlinc::kernels::detail
