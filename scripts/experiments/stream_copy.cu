// Microbenchmark (docs/PERF.md, eleventh session): how fast can one block per SM stream strided rows into
// a shared-memory ring, by copy mechanism? Block b reads a `chunk`-byte column of every row (a slice of
// B), `stage` bytes per ring stage. mode 0: cp.async.bulk (1D TMA) per row from the producer's lanes;
// mode 3: the same plus one 128-byte copy per stage from a small shared source (an activation row);
// mode 1: one 2D TMA box (cp.async.bulk.tensor) per stage; mode 2: cp.async 16 B per lane from one
// producer warp. stagger 1 starts block b b / grid of the way down its rows (stripe partitions), 0 all at
// row 0. Consumers (16 warps) wait for each stage, read one int4 per thread and release it. With an
// argument, the sixteenth session's probe instead (see probe() below: the streaming kernel's 16 KB stages,
// part-row coverage, extra small activation boxes per stage, ring depth). Build and run:
//   nvcc -std=c++17 -O3 -arch=sm_90a scripts/experiments/stream_copy.cu -o /tmp/sc -lcuda
//   /tmp/sc; /tmp/sc probe; /tmp/sc probe stages; [SC_EXTRA=1 | SC_TWO=1] /tmp/sc probe boxes (thirty-sixth session)
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

// extra (mode 1 only): that many more 2D copies per stage, each a 16 x 64 16-bit box with the 128B swizzle
// from a small hot tensor `ta` (an activation box; rows past its height read as zeros), after the stage's
// bytes in its ring slot. slot = stage + extra * 2048.
struct P { const char* src; long long pitch; int rows_total; int chunk; int stage; int stages; int mode; int stages_per_block; int stagger; int extra; int slot; int nsplit = 1; int issuers = 1; int a3d = 0; };

typedef CUresult (*Enc)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                        const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                        CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
// The "weights": [rows, pitch / 8] 8-byte units, boxes of box_rows rows x box_bytes.
CUresult encode_weights(Enc enc, CUtensorMap* tm, char* src, long long pitch, int rows, int box_bytes, int box_rows) {
  cuuint64_t dims[2] = {cuuint64_t(pitch / 8), cuuint64_t(rows)}, strides[1] = {cuuint64_t(pitch)};
  cuuint32_t box[2] = {cuuint32_t(box_bytes / 8), cuuint32_t(box_rows)}, es[2] = {1, 1};
  return enc(tm, CU_TENSOR_MAP_DATA_TYPE_UINT64, 2, src, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}
// The "activations": [arows, 4096] fp16 in 16 x 64 boxes with the 128B swizzle (rows past arows zero-filled).
CUresult encode_act(Enc enc, CUtensorMap* ta, unsigned short* a, int arows) {
  cuuint64_t adims[2] = {4096, cuuint64_t(arows)}, astr[1] = {4096 * 2};
  cuuint32_t abox[2] = {64, 16}, es[2] = {1, 1};
  return enc(ta, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, a, adims, astr, abox, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

__global__ void __launch_bounds__(544, 1) k(const P p, const __grid_constant__ CUtensorMap tm,
                                            const __grid_constant__ CUtensorMap ta, int* sink) {
  extern __shared__ __align__(1024) unsigned char sh[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t ring = (sa(sh) + 1023) & ~1023u, full = ring + p.stages * p.slot, empty = full + 8 * p.stages;
  if (tid == 0) for (int s = 0; s < p.stages; ++s) { mbar_init(full + 8 * s, p.mode == 2 ? 32 : 1); mbar_init(empty + 8 * s, 512); }
  __syncthreads();
  const int rows_per_stage = p.stage / p.chunk;
  // block b streams columns [b * chunk, (b+1) * chunk) of rows 0.. (like a whole-k slice)
  const long long col = (long long)blockIdx.x * p.chunk;
  if (warp == 16) {
    int st = 0; uint32_t ph = 0;
    for (int i = 0; i < p.stages_per_block; ++i) {
      mbar_wait(empty + 8 * st, ph ^ 1);
      const uint32_t bar = full + 8 * st, dst = ring + st * p.slot;
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
        if (p.nsplit > 1 && lane < p.issuers) {
          // `boxes` probe: the stage as nsplit boxes of rows_per_stage / nsplit rows each, issued by `issuers` lanes
          // (the expect_tx may land after a box's complete_tx: the phase's tx count goes negative meanwhile).
          if (lane == 0) mbar_expect(bar, p.stage + p.extra * 2048);
          const int rows = rows_per_stage / p.nsplit;
          for (int j = lane; j < p.nsplit; j += p.issuers)
            asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                         ::"r"(dst + j * (p.stage / p.nsplit)), "l"(&tm), "r"(int(col / 8)), "r"(row0 + j * rows), "r"(bar) : "memory");
        }
        if (lane == 0) {
          if (p.nsplit == 1) mbar_expect(bar, p.stage + p.extra * 2048);
          const int nbox = p.nsplit > 1 ? 0 : p.chunk > 2048 ? p.chunk / 2048 : 1;  // rows wider than one box (256 x 8 bytes)
          for (int j = 0; j < nbox; ++j)
            asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                         ::"r"(dst + j * (p.stage / nbox)), "l"(&tm), "r"(int(col / 8) + 256 * j), "r"(row0), "r"(bar) : "memory");
          if (p.a3d && p.extra > 0)  // the stage's activation boxes as one 3D box: [extra][16 rows][64]
            asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
                         ::"r"(dst + p.stage), "l"(&ta), "r"(0), "r"(0), "r"((i * p.extra) % 64 / p.extra * p.extra), "r"(bar) : "memory");
          for (int e = 0; e < (p.a3d ? 0 : p.extra); ++e)
            asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                         ::"r"(dst + p.stage + e * 2048), "l"(&ta), "r"(((i * p.extra + e) % 64) * 64), "r"(0), "r"(bar) : "memory");
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
    const int4 v = *reinterpret_cast<const int4*>(sh + (ring - sa(sh)) + st * p.slot + (tid * 16) % p.stage);
    acc ^= v.x ^ v.w;
    mbar_arrive(empty + 8 * st);
    if (++st == p.stages) st = 0, ph ^= 1;
  }
  if (acc == 0x12345678) sink[0] = acc;
}

// Probe (any argument): mode 1 only, 16 KB stages (the streaming kernel's), 8 stages, chunk 1 or 2 KB,
// aligned fronts; `cover` = the fraction of each row the blocks' columns span together (1, 1/2, 132/448:
// one round of slices over a wider layer), `extra` small copies per stage from a 4096-wide activation
// tensor of `arows` rows (1: only row 0 in bounds, the rest zero-filled; 16: all read).
// `stages` as the second argument instead: the ring depth at the streaming kernel's stage shapes (1 KB
// rows with four activation boxes, 2 KB rows with two), every row whole. `runs`: longer contiguous runs per
// block and row (1-16 KB; 2D boxes of at most 2 KB side by side, or one 1D bulk copy per row), whole rows.
int probe(int sms, char* src, long long bytes, int* sink, void* fn, bool stages);
int probe_runs(int sms, char* src, long long bytes, int* sink, void* fn);
// `boxes`: 512 B / 1 KB / 2 KB rows (the streaming kernel's 64-, 128- and 256-column slices) on 96 and all blocks, 4
// stages, each 16 KB stage as 1, 2 or 4 boxes issued by one lane or one lane per box.
int probe_boxes(int sms, char* src, long long bytes, int* sink, void* fn);

int main(int argc, char** argv) {
  int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const long long bytes = 1ll << 30;  // 1 GiB of "weights"
  char* src; cudaMalloc(&src, bytes); cudaMemset(src, 1, bytes);
  int* sink; cudaMalloc(&sink, 4);
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  void* fn = nullptr; cudaDriverEntryPointQueryResult q;
  cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
  Enc enc = (Enc)fn;
  if (argc > 2 && argv[2][0] == 'r') return probe_runs(sms, src, bytes, sink, fn);
  if (argc > 2 && argv[2][0] == 'b') return probe_boxes(sms, src, bytes, sink, fn);
  // `probe stages` also on fewer blocks than SMs (one per SM still): the streaming plans that leave SMs idle (8B q/k/v
  // on 96 blocks, gate/up on 112).
  if (argc > 2 && argv[2][0] == 's') {
    for (int blocks : {96, 112, sms}) probe(blocks, src, bytes, sink, fn, true);
    return 0;
  }
  if (argc > 1) return probe(sms, src, bytes, sink, fn, false);
  CUtensorMap none{};
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
          P p{src, pitch, rows, chunk, stage, stages, mode, int((long long)rows * chunk / stage), stagger, 0, stage};
          CUtensorMap tm{};
          CUresult r = encode_weights(enc, &tm, src, pitch, rows, chunk, stage / chunk);
          if (mode == 1 && r != CUDA_SUCCESS) { printf("%d %d %d %d encode failed %d\n", mode, chunk, stage, stages, int(r)); continue; }
          const int smem = 1024 + stages * stage + 16 * stages + 128 * stages;
          k<<<blocks, 544, smem>>>(p, tm, none, sink);
          cudaEventRecord(e0);
          for (int it = 0; it < 3; ++it) k<<<blocks, 544, smem>>>(p, tm, none, sink);
          cudaEventRecord(e1); cudaEventSynchronize(e1);
          float ms; cudaEventElapsedTime(&ms, e0, e1);
          cudaError_t err = cudaGetLastError();
          const double moved = double(p.stages_per_block) * stage * blocks;
          printf("stagger %d mode %d %5d %6d %3d %4d | %8.1f %7.1f %s\n", stagger, mode, chunk, stage, stages, blocks, ms * 1000 / 3,
                 moved / (ms / 3 * 1e-3) / 1e9, err ? cudaGetErrorString(err) : "");
        }
  return 0;
}

// The probes' timing: one warm-up launch, then the fastest of three runs of three launches (ms per run).
float best_of_3(const P& p, const CUtensorMap& tm, const CUtensorMap& ta, int* sink, int sms, int smem) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  k<<<sms, 544, smem>>>(p, tm, ta, sink);
  float best = 1e30f;
  for (int rep = 0; rep < 3; ++rep) {
    cudaEventRecord(e0);
    for (int it = 0; it < 3; ++it) k<<<sms, 544, smem>>>(p, tm, ta, sink);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    best = ms < best ? ms : best;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return best;
}

int probe(int sms, char* src, long long bytes, int* sink, void* fn, bool sweep_stages) {
  Enc enc = (Enc)fn;
  const int stage = 16384;
  unsigned short* a; cudaMalloc(&a, 16 * 4096 * 2); cudaMemset(a, 0x3c, 16 * 4096 * 2);
  printf("chunk cover(blocks/row-slices) extra arows stages | us GB/s\n");
  for (int chunk : {1024, 2048})
    for (int slices : {sms, 2 * sms, 448})  // slices per row; the blocks read the first sms of them
      for (int extra : {0, 1, 2, 4})
        for (int arows : {1, 16})
          for (int stages : {2, 3, 4, 5, 6, 8, 10}) {
          if (extra == 0 && arows == 16) continue;
          if (sweep_stages != (slices == sms && arows == 1 && extra == (chunk == 1024 ? 4 : 2))) continue;
          if (!sweep_stages && stages != 8) continue;
          const long long pitch = (long long)chunk * slices;
          const int rows = int(bytes / pitch) / (stage / chunk) * (stage / chunk);
          P p{src, pitch, rows, chunk, stage, stages, 1, int((long long)rows * chunk / stage), 0, extra, stage + extra * 2048};
          CUtensorMap tm{}, ta{};
          const CUresult r = encode_weights(enc, &tm, src, pitch, rows, chunk, stage / chunk), r2 = encode_act(enc, &ta, a, arows);
          if (r != CUDA_SUCCESS || r2 != CUDA_SUCCESS) { printf("encode failed %d %d\n", int(r), int(r2)); continue; }
          const float best = best_of_3(p, tm, ta, sink, sms, 1024 + stages * p.slot + 16 * stages);
          cudaError_t err = cudaGetLastError();
          const double moved = double(p.stages_per_block) * stage * sms;  // weights only
          printf("%5d %4d/%4d %d %2d %2d | %8.1f %7.1f %s\n", chunk, sms, slices, extra, arows, stages, best * 1000 / 3,
                 moved / (best / 3 * 1e-3) / 1e9, err ? cudaGetErrorString(err) : "");
        }
  return 0;
}

int probe_runs(int sms, char* src, long long bytes, int* sink, void* fn) {
  Enc enc = (Enc)fn;
  CUtensorMap none{};
  printf("mode chunk stage stages | us GB/s\n");
  for (int stage : {16384, 32768})
    for (int mode : {1, 0})
      for (int chunk : {1024, 2048, 4096, 8192, 16384}) {
        if (chunk > stage || (mode == 0 && stage / chunk > 32)) continue;
        const int stages = stage == 16384 ? 8 : 5;
        const long long pitch = (long long)chunk * sms;
        const int rows = int(bytes / pitch) / (stage / chunk) * (stage / chunk);
        P p{src, pitch, rows, chunk, stage, stages, mode, int((long long)rows * chunk / stage), 0, 0, stage};
        CUtensorMap tm{};
        const int inner = chunk > 2048 ? 2048 : chunk;
        if (encode_weights(enc, &tm, src, pitch, rows, inner, stage / chunk) != CUDA_SUCCESS) {
          printf("encode failed\n");
          continue;
        }
        const float best = best_of_3(p, tm, none, sink, sms, 1024 + stages * p.slot + 16 * stages + 128 * stages);
        cudaError_t err = cudaGetLastError();
        const double moved = double(p.stages_per_block) * stage * sms;
        printf("%d %5d %5d %d | %8.1f %7.1f %s\n", mode, chunk, stage, stages, best * 1000 / 3,
               moved / (best / 3 * 1e-3) / 1e9, err ? cudaGetErrorString(err) : "");
      }
  return 0;
}

int probe_boxes(int sms, char* src, long long bytes, int* sink, void* fn) {
  Enc enc = (Enc)fn;
  const int stage = 16384, stages = 4;
  unsigned short* a; cudaMalloc(&a, 16 * 4096 * 2); cudaMemset(a, 0x3c, 16 * 4096 * 2);
  printf("chunk blocks boxes issuers extra arows a3d | us GB/s\n");
  const bool two = std::getenv("SC_TWO") != nullptr;  // SC_TWO: one box per stage on 1 and 2 blocks per SM only
  // SC_EXTRA: one weight box per stage and 0-8 activation boxes (16 x 64 fp16, arows of them in the tensor) on all SMs.
  const bool ex = std::getenv("SC_EXTRA") != nullptr;
  for (int chunk : {512, 1024, 2048})
    for (int blocks : {96, sms, 2 * sms})
      for (int nsplit : {1, 2, 4})
        for (int issuers : {1, nsplit})
          for (int extra : {0, 1, 2, 4, 8})
            for (int arows : {1, 8, 16})
              for (int a3d : {0, 1}) {
          if (a3d && (!ex || extra < 2)) continue;
          if (nsplit == 1 && issuers > 1) continue;
          if (ex ? nsplit > 1 || blocks != sms || chunk == 1024 || (extra == 0 && arows > 1) : extra != 2 || arows != 1) continue;
          if (!ex && (two ? nsplit > 1 || blocks == 96 : blocks > sms)) continue;
          const long long pitch = (long long)chunk * blocks;
          const int rps = stage / chunk, rows = int(bytes / pitch) / rps * rps;
          P p{src, pitch, rows, chunk, stage, stages, 1, int((long long)rows * chunk / stage), 0, extra, stage + extra * 2048};
          p.nsplit = nsplit, p.issuers = issuers;
          if (p.slot * stages + 1024 + 16 * stages > 200 * 1024) continue;
          CUtensorMap tm{}, ta{};
          const CUresult r = encode_weights(enc, &tm, src, pitch, rows, chunk, rps / nsplit);
          // a3d: A as [k / 64][arows][64] (strides 128 B and 8 KB), box [extra][16][64]: the same shared layout.
          cuuint64_t adims3[3] = {64, cuuint64_t(arows), 64}, astr3[2] = {4096 * 2, 128};
          cuuint32_t abox3[3] = {64, 16, cuuint32_t(extra > 0 ? extra : 1)}, es3[3] = {1, 1, 1};
          CUresult r2 = a3d ? enc(&ta, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, a, adims3, astr3, abox3, es3, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
                            : encode_act(enc, &ta, a, arows);
          if (r != CUDA_SUCCESS || r2 != CUDA_SUCCESS) { printf("encode failed %d %d\n", int(r), int(r2)); continue; }
          p.a3d = a3d;
          const float best = best_of_3(p, tm, ta, sink, blocks, 1024 + stages * p.slot + 16 * stages);
          cudaError_t err = cudaGetLastError();
          const double moved = double(p.stages_per_block) * stage * blocks;
          printf("%5d %4d %d %d %d %2d %d | %8.1f %7.1f %s\n", chunk, blocks, nsplit, issuers, extra, arows, a3d, best * 1000 / 3,
                 moved / (best / 3 * 1e-3) / 1e9, err ? cudaGetErrorString(err) : "");
        }
  return 0;
}
