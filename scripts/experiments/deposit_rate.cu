// Microbenchmark (docs/PERF.md, thirtieth session): how fast can one block per SM hand a 128 KB fp32 partial tile
// (the Hopper kernel's deposit: 256 consumer threads x 32 float4, [q][thread] order) to another block through L2,
// by mechanism, with N blocks doing it at once? Per block, from the first store to the counter's release:
//   mode 0: __stcg per thread, __threadfence per thread, bar.sync, one atomicAdd (the kernel's form today);
//   mode 1: __stcg per thread, bar.sync, the leader's __threadfence and atomicAdd (CUTLASS's semaphore form);
//   mode 2: st.shared into 128 KB of shared memory, fence.proxy.async.shared::cta, bar.sync, the leader issues
//           one cp.async.bulk store (shared -> global) per 16 KB piece, waits for them, fence, atomicAdd;
//   mode 3: as 2, with 8 pieces issued by 8 lanes of warp 0.
// "free" is when the 256 threads could go on (their registers written out): the bar.sync after the stores.
// Also the read side: mode 4 reads R partials of 128 KB per block with __ldcg (the finisher today), mode 5 the
// same through cp.async.bulk into shared memory (16 KB pieces, one mbarrier each).
// Build and run:  nvcc -std=c++17 -O3 -arch=sm_90a scripts/experiments/deposit_rate.cu -o /tmp/dr && /tmp/dr
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <vector>

constexpr int kThreads = 256, kQ = 32;                 // 256 threads x 32 float4 = 128 KB
constexpr int kPartF4 = kThreads * kQ;                 // float4 per partial
constexpr int kPieceBytes = 16384, kPieces = kPartF4 * 16 / kPieceBytes;
constexpr int kReads = 5;                              // partials a finisher reads (8B down at m = 256: up to 5)

__device__ __forceinline__ unsigned long long now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t sa(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__global__ void __launch_bounds__(kThreads, 1) deposit(float4* red, int* counters, int mode,
                                                        unsigned long long* times) {
  extern __shared__ __align__(1024) unsigned char sh[];
  const int tid = threadIdx.x, b = blockIdx.x;
  float4 acc[kQ];
#pragma unroll
  for (int q = 0; q < kQ; ++q) acc[q] = make_float4(b + q, tid, q, 1.f);
  float4* mine = red + size_t(b) * kPartF4;
  __syncthreads();
  const unsigned long long t0 = now();
  unsigned long long tfree = 0;
  if (mode <= 1) {
#pragma unroll
    for (int q = 0; q < kQ; ++q) __stcg(mine + q * kThreads + tid, acc[q]);
    if (mode == 0) __threadfence();
    __syncthreads();
    tfree = now();
    if (tid == 0) {
      if (mode == 1) __threadfence();
      atomicAdd(counters + b, 1);
    }
  } else {
    float4* s = reinterpret_cast<float4*>(sh);
#pragma unroll
    for (int q = 0; q < kQ; ++q) s[q * kThreads + tid] = acc[q];
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    tfree = now();
    const int issuers = mode == 2 ? 1 : 8;
    if (tid < issuers) {
      for (int i = tid; i < kPieces; i += issuers)
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
                         reinterpret_cast<char*>(mine) + size_t(i) * kPieceBytes),
                     "r"(sa(sh + size_t(i) * kPieceBytes)), "n"(kPieceBytes)
                     : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    }
    __syncthreads();
    if (tid == 0) {
      asm volatile("fence.proxy.async.global;" ::: "memory");
      __threadfence();
      atomicAdd(counters + b, 1);
    }
  }
  if (tid == 0) {
    times[3 * b] = t0, times[3 * b + 1] = tfree, times[3 * b + 2] = now();
  }
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}

// Block b reads partials b+1 .. b+kReads (mod grid) and adds them to its registers.
template <int mode>
__global__ void __launch_bounds__(kThreads, 1) gather(const float4* red, int grid, float* sink,
                                                       unsigned long long* times) {
  extern __shared__ __align__(1024) unsigned char sh[];
  __shared__ __align__(8) unsigned long long bars[kPieces];
  const int tid = threadIdx.x, b = blockIdx.x;
  float4 acc[kQ];
#pragma unroll
  for (int q = 0; q < kQ; ++q) acc[q] = make_float4(0, 0, 0, 0);
  if (tid == 0)
    for (int i = 0; i < kPieces; ++i) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(&bars[i])));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
  const unsigned long long t0 = now();
  for (int r = 1; r <= kReads; ++r) {
    const float4* other = red + size_t((b + r) % grid) * kPartF4;
    if constexpr (mode == 4) {
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        const float4 v = __ldcg(other + q * kThreads + tid);
        acc[q].x += v.x, acc[q].y += v.y, acc[q].z += v.z, acc[q].w += v.w;
      }
    } else {
      if (tid == 0)
        for (int i = 0; i < kPieces; ++i) {
          const uint32_t bar = sa(&bars[i]);
          asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "n"(kPieceBytes) : "memory");
          asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                           sa(sh + size_t(i) * kPieceBytes)),
                       "l"(reinterpret_cast<const char*>(other) + size_t(i) * kPieceBytes), "n"(kPieceBytes), "r"(bar)
                       : "memory");
        }
      const float4* s = reinterpret_cast<const float4*>(sh);
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        if (q % (kQ / kPieces) == 0) mbar_wait(sa(&bars[q / (kQ / kPieces)]), (r - 1) & 1);
        const float4 v = s[q * kThreads + tid];
        acc[q].x += v.x, acc[q].y += v.y, acc[q].z += v.z, acc[q].w += v.w;
      }
      __syncthreads();  // every thread has read the pieces before the next partial overwrites them
    }
  }
  float sum = 0;
#pragma unroll
  for (int q = 0; q < kQ; ++q) sum += acc[q].x + acc[q].y + acc[q].z + acc[q].w;
  if (sum == 12345.f) sink[b] = sum;
  __syncthreads();
  if (tid == 0) times[3 * b] = t0, times[3 * b + 1] = now(), times[3 * b + 2] = now();
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int smem = kPartF4 * 16 + 1024;
  cudaFuncSetAttribute(deposit, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(gather<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(gather<5>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  float4* red;
  int* counters;
  float* sink;
  unsigned long long* times;
  cudaMalloc(&red, size_t(sms) * kPartF4 * 16);
  cudaMalloc(&counters, sms * 4);
  cudaMalloc(&sink, sms * 4);
  cudaMalloc(&times, sms * 24);
  cudaMemset(red, 0, size_t(sms) * kPartF4 * 16);
  std::vector<unsigned long long> h(3 * sms);
  const char* names[] = {"stcg+fence/thread", "stcg, leader fence", "smem+bulk, 1 issuer", "smem+bulk, 8 issuers",
                         "ldcg x5 (read)", "bulk x5 (read)"};
  std::printf("%-22s %5s | %12s %12s | %12s | %9s %9s\n", "mode", "grid", "free med us", "release med", "release max",
              "GB/s/SM", "GB/s all");
  for (int mode = 0; mode < 6; ++mode)
    for (int grid : {1, 32, 64, 100, sms}) {
      std::vector<double> fr, rel;
      for (int rep = 0; rep < 7; ++rep) {
        if (mode < 4) deposit<<<grid, kThreads, smem>>>(red, counters, mode, times);
        else if (mode == 4) gather<4><<<grid, kThreads, smem>>>(red, grid, sink, times);
        else gather<5><<<grid, kThreads, smem>>>(red, grid, sink, times);
        cudaError_t e = cudaDeviceSynchronize();
        if (e != cudaSuccess) { std::printf("mode %d grid %d: %s\n", mode, grid, cudaGetErrorString(e)); return 1; }
        cudaMemcpy(h.data(), times, grid * 24, cudaMemcpyDeviceToHost);
        if (rep < 2) continue;  // warm-up
        for (int b = 0; b < grid; ++b) fr.push_back((h[3 * b + 1] - h[3 * b]) / 1e3), rel.push_back((h[3 * b + 2] - h[3 * b]) / 1e3);
      }
      std::sort(fr.begin(), fr.end());
      std::sort(rel.begin(), rel.end());
      const double med = rel[rel.size() / 2], bytes = double(kPartF4) * 16 * (mode >= 4 ? kReads : 1);
      std::printf("%-22s %5d | %12.2f %12.2f | %12.2f | %9.1f %9.0f\n", names[mode], grid, fr[fr.size() / 2], med,
                  rel.back(), bytes / med / 1e3, bytes * grid / rel.back() / 1e3);
    }
  return 0;
}
