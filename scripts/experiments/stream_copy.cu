// Microbenchmark (docs/PERF.md, eleventh session): how fast can one block per SM stream strided rows into
// a shared-memory ring, by copy mechanism? Block b reads a `chunk`-byte column of every row (a slice of
// B), `stage` bytes per ring stage. mode 0: cp.async.bulk (1D TMA) per row from the producer's lanes;
// mode 3: the same plus one 128-byte copy per stage from a small shared source (an activation row);
// mode 1: one 2D TMA box (cp.async.bulk.tensor) per stage; mode 2: cp.async 16 B per lane from one
// producer warp. stagger 1 starts block b b / grid of the way down its rows (stripe partitions), 0 all at
// row 0. Consumers (16 warps) wait for each stage, read one int4 per thread and release it. Build:
//   nvcc -std=c++17 -O3 -arch=sm_90a scripts/experiments/stream_copy.cu -o /tmp/sc -lcuda
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>

__device__ __forceinline__ uint32_t sa(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint32_t b, int c) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(b), "r"(c)); }
__device__ __forceinline__ void mbar_wait(uint32_t b, uint32_t ph) {
  uint32_t d;
  do { asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0,1,0,p; }" : "=r"(d) : "r"(b), "r"(ph) : "memory"); } while (!d);
}
__device__ __forceinline__ void mbar_arrive(uint32_t b) { asm volatile("{ .reg .b64 s; mbarrier.arrive.shared::cta.b64 s, [%0]; }" ::"r"(b) : "memory"); }
__device__ __forceinline__ void mbar_expect(uint32_t b, uint32_t n) { asm volatile("{ .reg .b64 s; mbarrier.arrive.expect_tx.shared::cta.b64 s, [%0], %1; }" ::"r"(b), "r"(n) : "memory"); }

struct P { const char* src; long long pitch; int rows_total; int chunk; int stage; int stages; int mode; int stages_per_block; int stagger; };

__global__ void __launch_bounds__(544, 1) k(const P p, const __grid_constant__ CUtensorMap tm, int* sink) {
  extern __shared__ __align__(1024) unsigned char sh[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t ring = sa(sh), full = ring + p.stages * p.stage, empty = full + 8 * p.stages;
  if (tid == 0) for (int s = 0; s < p.stages; ++s) { mbar_init(full + 8 * s, p.mode == 2 ? 32 : 1); mbar_init(empty + 8 * s, 512); }
  __syncthreads();
  const int rows_per_stage = p.stage / p.chunk;
  // block b streams columns [b * chunk, (b+1) * chunk) of rows 0.. (like a whole-k slice)
  const long long col = (long long)blockIdx.x * p.chunk;
  if (warp == 16) {
    int st = 0; uint32_t ph = 0;
    for (int i = 0; i < p.stages_per_block; ++i) {
      mbar_wait(empty + 8 * st, ph ^ 1);
      const uint32_t bar = full + 8 * st, dst = ring + st * p.stage;
      // stagger: block b starts b / gridDim of the way down its column (stream-K-like stripes), wrapping
      const int si = p.stagger ? (i + int((long long)blockIdx.x * p.stages_per_block / gridDim.x)) % p.stages_per_block : i;
      const int row0 = si * rows_per_stage;
      if (p.mode == 0 || p.mode == 3) {
        // mode 3: plus one 128-byte copy per stage from a small shared source (the activation row)
        if (lane == 0) mbar_expect(bar, p.stage + (p.mode == 3 ? 128 : 0));
        if (p.mode == 3 && lane == 0)
          asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                       ::"r"(empty + 8 * p.stages + st * 128), "l"(p.src + (i % 512) * 128), "r"(128), "r"(bar) : "memory");
        __syncwarp();
        for (int r = lane; r < rows_per_stage; r += 32)
          asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                       ::"r"(dst + r * p.chunk), "l"(p.src + (row0 + r) * p.pitch + col), "r"(p.chunk), "r"(bar) : "memory");
      } else if (p.mode == 1) {
        if (lane == 0) {
          mbar_expect(bar, p.stage);
          asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                       ::"r"(dst), "l"(&tm), "r"(int(col / 8)), "r"(row0), "r"(bar) : "memory");
        }
      } else {
        const int per_row = p.chunk / 16;
        for (int c = lane; c < rows_per_stage * per_row; c += 32) {
          const int r = c / per_row, j = c % per_row;
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + r * p.chunk + j * 16), "l"(p.src + (row0 + r) * p.pitch + col + j * 16));
        }
        asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
      }
      if (++st == p.stages) st = 0, ph ^= 1;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    return;
  }
  int st = 0; uint32_t ph = 0, acc = 0;
  for (int i = 0; i < p.stages_per_block; ++i) {
    mbar_wait(full + 8 * st, ph);
    const int4 v = *reinterpret_cast<const int4*>(sh + st * p.stage + (tid * 16) % p.stage);
    acc ^= v.x ^ v.w;
    mbar_arrive(empty + 8 * st);
    if (++st == p.stages) st = 0, ph ^= 1;
  }
  if (acc == 0x12345678) sink[0] = acc;
}

int main() {
  int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const long long bytes = 1ll << 30;  // 1 GiB of "weights"
  char* src; cudaMalloc(&src, bytes); cudaMemset(src, 1, bytes);
  int* sink; cudaMalloc(&sink, 4);
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  typedef CUresult (*Enc)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                          const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                          CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  void* fn = nullptr; cudaDriverEntryPointQueryResult q;
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
  Enc enc = (Enc)fn;
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  printf("mode chunk stage stages blocks | us GB/s\n");
  for (int stagger : {0, 1})
  for (int mode : {0, 3, 1, 2})
    for (int chunk : {1024, 2048})
      for (int stage : {8192})
        for (int stages : {12}) {
          if (mode == 1 && chunk / 8 > 256) continue;
          if (mode == 1 && stage / chunk > 256) continue;
          const int blocks = sms;
          const long long pitch = (long long)chunk * blocks;  // rows of all blocks' columns
          const int rows = int(bytes / pitch);
          P p{src, pitch, rows, chunk, stage, stages, mode, int((long long)rows * chunk / stage), stagger};
          CUtensorMap tm{};
          cuuint64_t dims[2] = {cuuint64_t(pitch / 8), cuuint64_t(rows)}, strides[1] = {cuuint64_t(pitch)};
          cuuint32_t box[2] = {cuuint32_t(chunk / 8), cuuint32_t(stage / chunk)}, es[2] = {1, 1};
          CUresult r = enc(&tm, CU_TENSOR_MAP_DATA_TYPE_UINT64, 2, src, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
                           CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
          if (mode == 1 && r != CUDA_SUCCESS) { printf("%d %d %d %d encode failed %d\n", mode, chunk, stage, stages, int(r)); continue; }
          const int smem = stages * stage + 16 * stages + 128 * stages;
          k<<<blocks, 544, smem>>>(p, tm, sink);
          cudaEventRecord(e0);
          for (int it = 0; it < 3; ++it) k<<<blocks, 544, smem>>>(p, tm, sink);
          cudaEventRecord(e1); cudaEventSynchronize(e1);
          float ms; cudaEventElapsedTime(&ms, e0, e1);
          cudaError_t err = cudaGetLastError();
          const double moved = double(p.stages_per_block) * stage * blocks;
          printf("stagger %d mode %d %5d %6d %3d %4d | %8.1f %7.1f %s\n", stagger, mode, chunk, stage, stages, blocks, ms * 1000 / 3,
                 moved / (ms / 3 * 1e-3) / 1e9, err ? cudaGetErrorString(err) : "");
        }
  return 0;
}
