// The floor under a layer's time at small m (bench_marlin --floor): a kernel that does nothing but read
// the layer's weight bytes once, cold, from the same rotating buffers the GEMMs read, launched under the
// constraints our kernels have. At m <= 16 a W4A16 layer is a read of its packed weights plus a fixed
// cost (launch, first bytes, the slowest SM, the split reduction, the write of C); this kernel has only
// the first three, so cuBLAS's time over this one bounds the speedup that any kernel reading these bytes
// can reach in the benchmark (docs/PERF.md, nineteenth session).
//
// Each block reads a contiguous 1/grid of every segment with UNROLL (4 or 8) 16-byte loads in flight per
// thread (64 or 128 KB per SM at 1024 threads) and folds them into one word, so that the loads stay. It
// writes that word only after the wait for the previous call, as our kernels write C: with programmatic
// dependent launch a call reads while the previous one finishes. ReadFloorConfig::smem_bytes only
// reserves shared memory, so that 1 or 2 blocks fit on an SM, as for the streaming kernel (one block per
// SM) and the others (two): a call's blocks then take an SM only once the previous call's blocks there
// have exited.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace marlinc::bench {

struct ReadSegment {
  const int4* p;
  size_t words;  // 16-byte words
};

template <int UNROLL>
__device__ __forceinline__ uint32_t read_fold(const int4* __restrict__ p, size_t words) {
  const size_t per = (words + gridDim.x - 1) / gridDim.x;
  const size_t lo = per * blockIdx.x < words ? per * blockIdx.x : words;
  const size_t hi = lo + per < words ? lo + per : words;
  const size_t T = blockDim.x;
  uint32_t x = 0;
  for (size_t i = lo + threadIdx.x; i < hi; i += UNROLL * T) {
    int4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) v[u] = i + u * T < hi ? __ldcs(p + i + u * T) : make_int4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) x ^= uint32_t(v[u].x ^ v[u].y ^ v[u].z ^ v[u].w);
  }
  return x;
}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Reads segments a and b (weights, scales) and nothing else. tail_ns > 0 (an experiment, --floor-tail):
// the block then holds its SM that long after the wait, as a GEMM's products, reduction and write of C do.
template <int UNROLL>
__global__ void read_floor_kernel(ReadSegment a, ReadSegment b, uint32_t* sink, int tail_ns) {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");  // no-op without the launch attribute
  const uint32_t x = read_fold<UNROLL>(a.p, a.words) ^ read_fold<UNROLL>(b.p, b.words);
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  if (tail_ns > 0) {
    if (threadIdx.x == 0)
      for (const uint64_t t0 = global_ns(); global_ns() - t0 < uint64_t(tail_ns);) {
      }
    __syncthreads();
  }
  if (x == 0x9e3779b9u) sink[blockIdx.x] = x;  // never taken on random bytes in practice; keeps the loads
}

struct ReadFloorConfig {
  const char* name;
  int blocks_per_sm, threads, smem_bytes;  // blocks_per_sm: of one call; smem_bytes: reserved so that
                                           // 1 or 2 blocks fit on an SM, 0: no limit
  int unroll;                              // 4 or 8 loads in flight per thread
  bool ours;                               // our kernels' residency: counts toward the floor
};

// 1 and 2 blocks per SM as our kernels run (a call fills its SMs: the next call's blocks wait for its
// exits), each with 4 and 8 loads in flight; the floor is the fastest of these. Two more for comparison:
// "free", unconstrained (8 small blocks per SM fit beside the previous call's), the rate with no residency
// limit at all; "1/SM+", one block per SM of half an SM's resources, so that two consecutive calls share
// each SM.
constexpr ReadFloorConfig kReadFloorConfigs[] = {
    {"1/SM", 1, 1024, 120 << 10, 4, true},  {"2/SM", 2, 512, 100 << 10, 4, true},
    {"1/SM u8", 1, 1024, 120 << 10, 8, true}, {"2/SM u8", 2, 512, 100 << 10, 8, true},
    {"free", 4, 256, 0, 4, false},          {"1/SM+", 1, 512, 100 << 10, 4, false},
};
constexpr int kReadFloorConfigCount = int(sizeof(kReadFloorConfigs) / sizeof(kReadFloorConfigs[0]));

inline cudaError_t read_floor_launch(const ReadFloorConfig& c, int sms, ReadSegment a, ReadSegment b, uint32_t* sink,
                                     cudaStream_t st, int tail_ns = 0) {
  static bool prepared = false;
  if (!prepared) {
    for (auto* k : {read_floor_kernel<4>, read_floor_kernel<8>}) {
      const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 120 << 10);
      if (e != cudaSuccess) return e;
    }
    prepared = true;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(sms * c.blocks_per_sm));
  cfg.blockDim = dim3(unsigned(c.threads));
  cfg.dynamicSmemBytes = size_t(c.smem_bytes);
  cfg.stream = st;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return c.unroll == 8 ? cudaLaunchKernelEx(&cfg, read_floor_kernel<8>, a, b, sink, tail_ns)
                       : cudaLaunchKernelEx(&cfg, read_floor_kernel<4>, a, b, sink, tail_ns);
}

}  // namespace marlinc::bench
