// The warp-specialized form of the Hopper kernel (marlin_wgmma.cuh): the same packed bytes, stage layout,
// index maps, products and slice reduction, but a producer warpgroup fills the stages and the two consumer
// warpgroups (three on 192-column tiles) only expand weights and run wgmmas. ncu on the block-synchronous kernel
// (docs/PERF.md) showed it issue- and latency-bound: copy addresses were ~1/3 of a tile's instructions, and the
// per-stage block barrier made each warpgroup wait for the slower one.
//
// The producer is one thread issuing three 2D TMA boxes per stage (kernels/tma_maps.h, TmaMaps):
// the activations [NT rows x 64] with the 128B swizzle wgmma's descriptor reads (rows past m zero-filled
// by the TMA unit, or zeroed once where the last row chunk has its own box: below), the weights [4 k16 rows x
// 256 columns of 8-byte units] and the group scales. The stage layout is the block-synchronous kernel's, which is exactly what the boxes write. The other 127
// producer threads only give their registers back (setmaxnreg is per warpgroup) and leave. Against 128
// threads of cp.async (docs/PERF.md, twelfth session, H100, same call): 7-10% faster at m = 1024, 5-8% at
// m = 128 on 70B and 32768^2, level to 1.5% slower on the 8B set and per-channel 32768^2 at m = 64.
//
// Hand-off per stage through two mbarriers: `full` completes when the producer has armed it with the
// stage's byte count and the TMA unit has delivered them, `empty` when the 256 consumer threads have
// retired the wgmmas and word loads that read it (one arrival per thread: each thread's own shared-memory
// reads are ordered before its own release). The ring runs across slices and row chunks, so the producer
// streams the next slice's tiles while the consumers reduce the last one. setmaxnreg moves registers from
// the producer to the consumers (accumulators).
//
// The pair form (CL; 128-row, wide and fit tiles): where every tile is split in two along k (marlin_dispatch.h,
// wgmma_pair_tiles), the two blocks of a tile run as one cluster and add their halves through each other's
// shared memory (wg_pair_finish) instead of the workspace.
//
// Early deposits (128-row tiles, stripes of 1.5 slices or more: marlin_partition.h, slice_early_deposit): the
// next block deposits the finisher's last slice first thing in its stripe, so the producer, once it has issued
// that slice's last tile, copies the deposit from the workspace into the ring behind it, and the consumers add
// it from shared memory after their products instead of reading it from L2 at the end.
//
// The split form (SPLIT; one row chunk, slices in four or more parts of k: marlin_partition.h, wgmma_split_parts):
// each block runs its part of one slice, deposits its partial, and adds up and writes a share of the tile's 8-token
// row groups from every part's deposit (wg_spread_finish), so that no one SM reads all the partials. It is its own
// kernel so that the other forms' code stays as it was.
#pragma once
#include <cstdint>

#include "kernels/marlin_dispatch.h"
#include "kernels/sm90/marlin_wgmma.cuh"

namespace marlinc::kernels::detail {

template <int NT, int BPS, bool CL = false, int FEAT = wgmma_tile_n(NT)>
struct WsShape : WgShape<NT, FEAT> {
  using Base = WgShape<NT, FEAT>;
  static constexpr int kProducerThreads = 128;
  static constexpr int kThreads = kProducerThreads + Base::kThreads;  // producer + two or three consumer warpgroups
  static constexpr int kConsumerThreads = Base::kThreads;
  // Shared memory per block at BPS blocks per SM (the H100 has 228 KB per SM, 1 KB of it reserved per
  // block, and at most 227 KB per block); every stage of the ring may be in flight.
  static constexpr int kSmemPerBlock = BPS == 1 ? 227 * 1024 : (228 * 1024) / BPS - 1024;
  static constexpr int kMaxStages = 8;
  // After the ring: the full/empty barriers (16 bytes per stage, padded to 128) and the pair form's two (CL,
  // below), then each consumer warp's epilogue buffer (wgmma_layout.h, kEpiWarpBytes).
  static constexpr int kPairBarOff = 128;  // from the ring's end: the partner's "ring free" and "half sent"
  static constexpr int kBarBytes = kPairBarOff + 16;
  static constexpr int kEpiBytes = (kConsumerThreads / 32) * wl::kEpiWarpBytes;
  static constexpr int kFitStages = (kSmemPerBlock - Base::kAlign - kBarBytes - kEpiBytes) / Base::kStage;
  static constexpr int kStages = kFitStages < kMaxStages ? kFitStages : kMaxStages;
  static constexpr int kEpiOffset = kStages * Base::kStage + kBarBytes;
  static constexpr int kSmemBytes = kEpiOffset + kEpiBytes + Base::kAlign;
  // Registers: the launch gives every thread kLaunchRegs; the producer gives back all but kProducerRegs,
  // and the consumers take them (setmaxnreg counts are multiples of 8 in 24..256). At BPS = 1 that is
  // 224 for the consumers and 56 for the producer (40 made it spill); BPS = 2 would leave the consumers
  // 104, where ptxas serializes the wgmmas (C7512), so only BPS = 1 is instantiated.
  static constexpr int kLaunchRegs = (65536 / (kThreads * BPS)) / 8 * 8;
  static constexpr int kProducerRegs = BPS == 1 ? 56 : 24;
  static constexpr int kConsumerRegs =
      (kLaunchRegs + (kLaunchRegs - kProducerRegs) * kProducerThreads / kConsumerThreads) / 8 * 8;

  // k16 steps a warp expands together before issuing their wgmmas (one group per step): independent
  // words for the scheduler to interleave, where two consumer warps per scheduler leave the expansion's
  // dependency chains exposed (ncu, 70B gate/up at m = 64: tensor pipe 55% busy, 5.2 cycles per issued
  // instruction per warp).
  static constexpr int kBatch = 2;
  // wgmma groups a warpgroup leaves pending after issuing a batch: that batch's, while the next one is
  // expanded. The A fragments are read asynchronously, and ptxas gives a stage's two batches distinct
  // registers (SASS: R104-R119 and R88-R103 on the 64-row tile) but reuses the first batch's for the next
  // tile's first batch. Two batches in flight (4 groups) therefore overwrote fragments still being read:
  // [wgmma] failed on the H100 (mean relative error 15-16 at m = 256, k = 1024, n = 768).
  // Deeper queues measured no better: one step per batch with three groups pending (four register sets)
  // ran 2-4% slower on most sets at m = 64-512 (docs/PERF.md, thirteenth session).
  static constexpr int kPending = kBatch;
  // After the wait of the batch from step kRelease on, every wgmma of the previous tile has retired.
  static constexpr int kRelease = (kPending - 1) / kBatch * kBatch;

  static_assert(NT == 32 || NT == 48 || NT == 64 || NT == 128 || NT == kWgmmaWideRows || wgmma_fit_tile(NT),
                "token tiles the warp-specialized kernel is built for");
  static_assert(FEAT == wgmma_tile_n(NT) || (NT == 128 && (FEAT == kWgmmaWideTileN || FEAT == kWgmmaTriTileN)),
                "the column widths per token tile");
  static_assert(Base::kKB % kBatch == 0, "a stage is a whole number of batches");
  static_assert(kPending >= kBatch && kPending <= Base::kKB, "the previous tile retires within the next one");
  static_assert(kPending <= Base::kKB - kBatch, "a batch is expanded into registers no wgmma in flight reads");
  static_assert(kStages >= 3, "the ring needs stages in flight on both sides of the one being read");
  static_assert(16 * kMaxStages <= kPairBarOff, "the ring's barriers fit before the pair form's");
  // CL: a tile split in two runs as a cluster of its two blocks (kernels/marlin_dispatch.h, wgmma_pair_tiles).
  // Each block's warpgroup g holds columns 128 g .. 128 g + 127 of the tile (64 g .. 64 g + 63 of a 128-column
  // tile, every token); block (rank) r writes the half of warpgroup r, whose partial the partner's warpgroup r
  // sends into r's ring, free once both blocks' products are done: [j][q][thread] float4, kHalfBytes.
  static constexpr int kHalfBytes = 128 * 2 * Base::kAcc * 4;
  // An early finisher's deposit (wg_early_finisher) comes through the ring after the slice's last tile, as
  // kDepPieces stages of up to kDepRows rows of wg_finish_slice's layout ([j][q][thread] float4: a row is one
  // float4 of every consumer thread).
  static constexpr int kDepRowBytes = kConsumerThreads * 16;
  static constexpr int kDepRows = Base::kStage / kDepRowBytes;
  static constexpr int kDepTotalRows = 2 * Base::kAcc / 4;
  static constexpr int kDepPieces = (kDepTotalRows + kDepRows - 1) / kDepRows;
  static_assert(!CL || kHalfBytes <= kStages * Base::kStage, "the ring holds the partner's half tile");
  static_assert(kDepRows >= 1 && kDepTotalRows * kDepRowBytes == Base::kPart * 4, "a stage holds whole deposit rows");
  static_assert(!CL || (wgmma_pair_tile(NT) && FEAT == wgmma_tile_n(NT) && BPS == 1),
                "the pair form's tiles (marlin_dispatch.h)");
  static_assert(kSmemBytes <= kSmemPerBlock, "the ring fits the block's shared memory");
  static_assert(kConsumerRegs <= 256 && kProducerRegs >= 24, "setmaxnreg bounds");
  static_assert(Base::kABytes % 128 == 0 && Base::kBBytes % 128 == 0,
                "the weight and scale boxes start 128-byte aligned");
};

// mbarrier and register-reallocation wrappers (sm_90).
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Arrival of this thread where `pred` holds, without a branch (see the consumer loop on C7513).
__device__ __forceinline__ void mbar_arrive_if(uint32_t bar, bool pred) {
  asm volatile("{\n .reg .pred p;\n .reg .b64 st;\n setp.ne.b32 p, %1, 0;\n @p mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n"
               ::"r"(bar), "r"(int(pred)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}
// One 2D TMA box global -> shared that completes its bytes on the mbarrier (coordinates: inner, outer).
__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
      ::"r"(dst), "l"(map), "r"(x), "r"(y), "r"(bar) : "memory");
}
// A 3D box (kernels/tma_maps.cu, encode_a3d: the streaming kernel's activations).
__device__ __forceinline__ void tma_3d(uint32_t dst, const CUtensorMap* map, int x, int y, int z, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(dst), "l"(map), "r"(x), "r"(y), "r"(z), "r"(bar) : "memory");
}
// The same with an L2 eviction-priority policy (createpolicy below) on the lines it reads.
__device__ __forceinline__ void tma_2d_hint(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar,
                                            uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;\n"
      ::"r"(dst), "l"(map), "r"(x), "r"(y), "r"(bar), "l"(policy) : "memory");
}
// An L2 policy that evicts the lines it tags before any others.
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// Thread-block clusters (sm_90): the barrier of all the cluster's threads in two halves, the mbarrier
// initialization made visible to the cluster, a shared address mapped to another block of the cluster, and
// a 16-byte store into that block's shared memory counted on its mbarrier.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory"); }
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ uint32_t map_to_rank(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ void st_async_f4(uint32_t dst, const float (&v)[4], uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n"
               ::"r"(dst), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]), "r"(bar) : "memory");
}
// This thread's arrival at another block's mbarrier (a shared::cluster address from map_to_rank), releasing this
// block's earlier accesses to the cluster.
__device__ __forceinline__ void mbar_remote_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// This thread's arrival, which also raises the bytes the current phase waits for.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n"
               ::"r"(bar), "r"(bytes) : "memory");
}
// `bytes` (a multiple of 16) from global memory into this block's shared memory by the TMA unit, completing on
// the mbarrier; and the fence that orders this thread's earlier generic-proxy accesses to global memory (here the
// acquire of a deposit counter) before its later async-proxy ones.
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }
template <int R>
__device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R>
__device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }

// 8 bytes from a shared-window address. The consumers read their words through 32-bit addresses off the
// block's window base: through generic pointers ptxas re-derived that base (S2UR of the CTA id, then a
// dependent ULEA) on every stage, 5-6% of the stall samples at m = 64 (ncu, 70B gate/up).
__device__ __forceinline__ int2 lds64(uint32_t addr) {
  int2 v;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}

// Position in the ring: stage index and the parity of its current use.
struct RingPos {
  int st = 0;
  uint32_t phase = 0;
  template <int kStages>
  __device__ __forceinline__ void next() {
    if (++st == kStages) st = 0, phase ^= 1u;
  }
};

// CL: the end of a tile that a pair of blocks (one cluster, rank r = blockIdx.x % 2) split along k. Every
// consumer thread of both blocks; `pair_bar`: this block's two barriers (S::kPairBarOff), initialized before the
// cluster barrier's arrival at entry. Each block tells the partner that its ring is free; the warpgroup that does
// not write here sends its partial into the partner's ring, the other adds the partner's and writes its half of
// C. One fp32 addition per element of the two halves' sums, as the finisher of a tile in stripes adds the other
// block's deposit (a + b in either order: the bytes do not depend on which block writes).
template <int DT, bool GROUPED, int NT, int BPS, int FEAT>
__device__ __forceinline__ void wg_pair_finish(const KernelArgs& p, float (&acc)[2][WgShape<NT, FEAT>::kAcc],
                                               int slice, int row0, uint32_t ring, uint32_t pair_bar, int cw, int lane,
                                               int ctid, uint32_t epi) {
  using S = WsShape<NT, BPS, true, FEAT>;
  constexpr int kQ = S::kAcc / 4;  // float4 per thread per wgmma accumulator
  const uint32_t rank = blockIdx.x & 1u, partner = rank ^ 1u;
  const uint32_t free_bar = pair_bar, recv_bar = pair_bar + 8;
  const int g = cw >> 2, wtid = ctid & 127;
  tl_mark(p, kTlInfo, ctid == 0, 2u * 2u + 1u);  // as wg_finish_slice: two blocks on the tile, this one writes C
  team_sync<1, S::kConsumerThreads>();  // this block's products are done and its ring read
  cluster_wait();                // the partner's barriers are initialized
  if (ctid == 0) {
    mbar_remote_arrive(map_to_rank(free_bar, partner));
    mbar_expect_tx(recv_bar, S::kHalfBytes);
  }
  if (g != int(rank)) {
    mbar_wait(free_bar, 0);  // the partner's products are done: its ring takes this half
    const uint32_t dst = map_to_rank(ring + wtid * 16, partner), bar = map_to_rank(recv_bar, partner);
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        const float v[4] = {acc[j][4 * q], acc[j][4 * q + 1], acc[j][4 * q + 2], acc[j][4 * q + 3]};
        st_async_f4(dst + (j * kQ + q) * (128 * 16), v, bar);
      }
  } else {
    mbar_wait(recv_bar, 0);  // one tile per block and launch: the barrier's first phase
    tl_mark(p, kTlReduced, wtid == 0);
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        add_f4(&acc[j][4 * q], lds128(ring + ((j * kQ + q) * 128 + wtid) * 16));
      }
    wg_write_c<DT, GROUPED, NT, true, FEAT>(p, acc, slice, row0, cw, lane, epi);
  }
}

// SPLIT: every slice in p.split parts of one block each, finished together (wg_spread_finish); a kernel of its own, so
// that the other forms compile exactly as without it.
template <int DT, bool GROUPED, int NT, int BPS, bool CL, int FEAT, bool SPLIT>
__global__ void __launch_bounds__(WsShape<NT, BPS, CL, FEAT>::kThreads, BPS)
    marlin_wgmma_ws_kernel(const KernelArgs p, const __grid_constant__ TmaMaps maps) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = WsShape<NT, BPS, CL, FEAT>;
  static_assert(!(CL && SPLIT), "a tile split in two, or slices split in parts");
  extern __shared__ __align__(16) unsigned char sh_raw[];
  const uint32_t raw = smem_addr(sh_raw);
  unsigned char* sh = sh_raw + (((raw + S::kAlign - 1) & ~uint32_t(S::kAlign - 1)) - raw);
  const uint32_t sbase = smem_addr(sh);
  const uint32_t full0 = sbase + S::kStages * S::kStage, empty0 = full0 + 8 * S::kStages;  // [kStages] each

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint32_t pair_bar = sbase + S::kStages * S::kStage + S::kPairBarOff;  // CL: "ring free", "half sent"
  if (tid == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      mbar_init(full0 + 8 * s, 1);  // the producer's arrive.expect_tx
      mbar_init(empty0 + 8 * s, S::kConsumerThreads);
    }
    if constexpr (CL) {
      mbar_init(pair_bar, 1);      // the partner's arrival: its ring is free
      mbar_init(pair_bar + 8, 1);  // this block's arrive.expect_tx of the partner's half
      fence_mbarrier_init_cluster();
    }
  }
  // Where m ends inside the last row chunk and every block runs one chunk only, that chunk's activations come
  // through a_tail, whose box has only the rows before m (marlin_partition.h, tma_tail_rows), and its blocks
  // zero the rows past m in every stage once here: nothing writes them afterwards (the deposits and the pair
  // form's partner half fill stages only after the block's last tile), and the products of those tokens then
  // run on zeros as with the full box's zero fill.
  const int tail = tma_tail_rows(p.m, NT);
  const bool tail_box = tail > 0 && p.chunk_groups >= p.par;
  if (tail_box && int(blockIdx.x) / p.chunk_blocks == p.par - 1) {
    constexpr int kRowChunks = wl::kRowBytes / 16;
    const int per_stage = (NT - tail) * kRowChunks;
    for (int i = tid; i < S::kStages * per_stage; i += S::kThreads)
      *reinterpret_cast<int4*>(sh + (i / per_stage) * S::kStage + tail * wl::kRowBytes + (i % per_stage) * 16) =
          make_int4(0, 0, 0, 0);
    fence_proxy_async();  // before the wgmmas (async proxy) read them, after the barrier below
  }
  __syncthreads();  // barriers initialized before anyone waits on or arrives at them
  if constexpr (CL) cluster_arrive();  // waited for (wg_pair_finish) before the first access to the partner
  allow_next_grid();  // see marlin_kernel: every block of this grid is resident before the next starts
  tl_mark(p, kTlEntry, tid == 0);
  tl_mark(p, kTlSm, tid == 0);

  const int k_tiles = p.k / S::kTK, n_tiles = p.n / S::kFeat;
  const int nk = n_tiles * k_tiles;
  const int group = blockIdx.x / p.chunk_blocks, local = blockIdx.x % p.chunk_blocks;
  const int base_b = group * p.chunk_blocks;
  // SPLIT: the block's part of one slice in each row chunk it walks (slice-major tiles [t0, t1)), else its stripe of
  // p.iters tiles from local * p.iters (written out as before the split form, so that the other forms compile the same).
  auto part = [&]() { return stream_ranges(local, p.chunk_blocks, 0, p.split, p.iters, n_tiles, k_tiles); };

  if (warp < S::kProducerThreads / 32) {
    // Producer: the consumers' tile sequence, one stage per tile, each filled once the consumers have
    // released it. Weights and scales of the tiles that fill the fresh ring go out before the wait for the
    // previous kernel (see marlin_kernel), their activations only after it (A may be that kernel's output).
    regs_dec<S::kProducerRegs>();
    if (tid != 0) return;
    const int s_rows = GROUPED ? tile_scale_rows(S::kTK, p.group_shift) : 0;
    const uint32_t tx = S::kABytes + S::kBBytes + s_rows * S::kScaleRowBytes;
    // The last row chunk through a_tail (above): fewer bytes arrive.
    const uint32_t tx_tail = tx - S::kABytes + tail * wl::kRowBytes;
    auto by_tail = [&](int row0) { return tail_box && row0 + NT > p.m; };  // the chunk m ends inside
    auto tx_of = [&](int row0) { return by_tail(row0) ? tx_tail : tx; };
    // The weights pass through L2 once (the row-chunk groups that share them run side by side). Tagged
    // evict-first, they are the first lines L2 gives up, ahead of the activations every column block
    // re-reads and the partial tiles deposited for the finishers (docs/PERF.md, fourteenth session: 5% on
    // 32768^2 at m = 512, the other sets level).
    const uint64_t weights_policy = l2_evict_first();
    auto issue = [&](const RingPos& w, int row0, int slice, int kt, int what) {  // what: 1 weights + scales, 2 A
      const uint32_t stage = sbase + w.st * S::kStage, bar = full0 + 8 * w.st;
      if (what & 1) {
        tma_2d_hint(stage + S::kABytes, &maps.b, slice * S::kFeat, kt * S::kKB, bar, weights_policy);
        if constexpr (GROUPED)
          tma_2d(stage + S::kABytes + S::kBBytes, &maps.s, slice * S::kFeat, (kt * S::kTK) >> p.group_shift, bar);
      }
      if (what & 2) tma_2d(stage, by_tail(row0) ? &maps.a_tail : &maps.a, kt * S::kTK, row0, bar);
    };
    // The first row chunk's first tiles fill the fresh ring without waiting for a release.
    const int first_tiles = group < p.par ? (SPLIT ? part().t1 - part().t0 : min(p.iters, nk - local * p.iters)) : 0;
    const int pre = min(S::kStages, first_tiles);
    RingPos w;
    {
      const int it0 = SPLIT ? part().t0 : local * p.iters;
      for (int i = 0; i < pre; ++i) {
        const int slice = (it0 + i) / k_tiles;
        mbar_expect_tx(full0 + 8 * w.st, tx_of(group * NT));
        issue(w, group * NT, slice, it0 + i - slice * k_tiles, 1);
        w.next<S::kStages>();
      }
    }
    wait_previous_grid();
    w = RingPos{};
    for (int pc = group; pc < p.par; pc += p.chunk_groups) {
      const int row0 = pc * NT;
      int it = SPLIT ? part().t0 : local * p.iters;
      const int it_end = SPLIT ? part().t1 : min(it + p.iters, nk);
      int slice = it / k_tiles, kt = it - slice * k_tiles;
      for (int i = 0; it < it_end; ++it, ++i) {
        if (pc == group && i < pre) {
          issue(w, row0, slice, kt, 2);
        } else {
          mbar_wait(empty0 + 8 * w.st, w.phase ^ 1u);  // a fresh barrier counts its previous phase as done
          mbar_expect_tx(full0 + 8 * w.st, tx_of(row0));
          issue(w, row0, slice, kt, 3);
        }
        w.next<S::kStages>();
        if (++kt == k_tiles) kt = 0, ++slice;
      }
      // An early finisher's last slice: the next block's deposit into the stages after the slice's last tile.
      // That block made it first thing in its stripe; the counter's acquire orders its stores before the copies.
      const int last_slice = (it_end - 1) / k_tiles;
      if (!CL && !SPLIT && it_end > local * p.iters && wg_early_finisher<NT>(p, last_slice, base_b, k_tiles)) {
        const int first_b = int(blockIdx.x);  // an early finisher is its slice's first block, the depositor the next
        int* counter = p.locks + first_b;
        while (ld_acquire(counter) != 1) {
        }
        *counter = 0;  // re-arm for the next launch; nothing else reads it in this one
        fence_proxy_async_global();
        const unsigned char* dep = reinterpret_cast<const unsigned char*>(p.red + size_t(first_b + 1) * S::kPart);
#pragma unroll 1
        for (int i = 0; i < S::kDepPieces; ++i) {
          const int rows = min(S::kDepRows, S::kDepTotalRows - i * S::kDepRows);
          mbar_wait(empty0 + 8 * w.st, w.phase ^ 1u);
          mbar_expect_tx(full0 + 8 * w.st, rows * S::kDepRowBytes);
          bulk_g2s(sbase + w.st * S::kStage, dep + size_t(i) * S::kDepRows * S::kDepRowBytes, rows * S::kDepRowBytes,
                   full0 + 8 * w.st);
          w.next<S::kStages>();
        }
      }
    }
    return;  // every box lands before the consumers, which wait for each one, let the block exit
  }

  // Consumers: warp cw (0..7) of the two warpgroups, with the block-synchronous kernel's roles.
  regs_inc<S::kConsumerRegs>();
  wait_previous_grid();  // C, the workspace and its locks are the previous kernel's until it has finished
  const int ctid = tid - S::kProducerThreads, cw = ctid >> 5;
  // The warp's packed tile and subblock: two subblocks (an int2 of words) on the 256-column tiles, one on the 128-
  // and 192-column tiles (wgmma_layout.h, warp_tile128 / warp_sub128).
  const int tile = S::kOneTile ? wl::warp_tile128(cw) : wl::warp_tile(cw);
  const int sub0 = S::kOneTile ? wl::warp_sub128(cw) : wl::warp_sub0(cw);
  const bool tl0 = ctid == 0;  // the consumers' thread 0 marks the rest of the timeline
  tl_mark(p, kTlWaited, tl0);
  bool tl_first = tl0;
  const int w_byte = S::kABytes + wl::weight_byte(tile, lane, sub0);
  // Scale words of steps 0-1 and 2-3 (the same row unless the group is 32); odd steps reuse the even
  // step's (wl::pairs_share_scale_rows).
  const int s_byte = S::kABytes + S::kBBytes + wl::scale_byte(tile, lane, sub0);
  const int s_step2 = GROUPED ? wl::scale_row(2, p.group_shift) * S::kScaleRowBytes : 0;
  auto words = [&](uint32_t stage, int kk, int2 sv_prev) {
    if constexpr (S::kOneTile) {
      WgWords w{make_int2(int(lds32(stage + kk * S::kWeightRowBytes + w_byte)), 0), sv_prev};
      if (GROUPED && kk % 2 == 0) w.sv = make_int2(int(lds32(stage + s_byte + (kk / 2) * s_step2)), 0);
      return w;
    } else {
      WgWords w{lds64(stage + kk * S::kWeightRowBytes + w_byte), sv_prev};
      if (GROUPED && kk % 2 == 0) w.sv = lds64(stage + s_byte + (kk / 2) * s_step2);
      return w;
    }
  };
  uint32_t cbase = sbase;
  asm volatile("" : "+r"(cbase));  // opaque: kept in a register, not re-derived from the CTA id per stage
  const uint32_t cfull0 = cbase + S::kStages * S::kStage, cempty0 = cfull0 + 8 * S::kStages;
  const uint32_t cepi = cbase + S::kEpiOffset + cw * wl::kEpiWarpBytes;  // this warp's epilogue buffer
  RingPos r;
  for (int pc = group; pc < p.par; pc += p.chunk_groups) {
    int it = SPLIT ? part().t0 : local * p.iters;
    const int it_end = SPLIT ? part().t1 : min(it + p.iters, nk);
    while (it < it_end) {
      const int slice = it / k_tiles;
      const int cnt = min(it_end, (slice + 1) * k_tiles) - it;
      float acc[2][S::kAcc];
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int i = 0; i < S::kAcc; ++i) acc[j][i] = 0.f;
      int prev = 0;
      for (int t = 0; t < cnt; ++t) {
        mbar_wait(cfull0 + 8 * r.st, r.phase);  // TMA writes and wgmma reads are both async proxy: no fence
        tl_mark(p, kTlFirstData, tl_first && t == 0);
        const uint32_t stage = cbase + r.st * S::kStage;
        const uint64_t desc0 = wl::sw128_desc(wl::desc_start(stage, 0));
        WgWords w[S::kBatch];
#pragma unroll
        for (int b = 0; b < S::kBatch; ++b) w[b] = words(stage, b, b ? w[b - 1].sv : make_int2(0, 0));
#pragma unroll
        for (int kk = 0; kk < S::kKB; kk += S::kBatch) {
          uint32_t a[S::kBatch][S::kWords][4];
#pragma unroll
          for (int b = 0; b < S::kBatch; ++b) wg_expand<DT, GROUPED>(w[b], a[b]);
          if (kk + S::kBatch < S::kKB)
#pragma unroll
            for (int b = 0; b < S::kBatch; ++b)
              w[b] = words(stage, kk + S::kBatch + b, b ? w[b - 1].sv : w[S::kBatch - 1].sv);
#pragma unroll
          for (int b = 0; b < S::kBatch; ++b) wg_mma_desc<DT, NT, FEAT>(acc, wl::desc_step(desc0, kk + b), a[b]);
          wgmma_wait<S::kPending>();
          // A predicated arrive, not a branch, while wgmmas are in flight (a branch there makes ptxas
          // serialize them, C7513).
          if (kk == S::kRelease) mbar_arrive_if(cempty0 + 8 * prev, t > 0);
        }
        prev = r.st;
        r.next<S::kStages>();
      }
      wgmma_wait<0>();
      fence_regs(acc[0]);
      fence_regs(acc[1]);
      mbar_arrive_if(cempty0 + 8 * prev, true);
      tl_mark(p, kTlComputed, tl0);
      tl_first = false;
      // An early finisher adds the deposit the producer put into the ring (one fp32 addition per element, as
      // wg_finish_slice would after its wait).
      const bool added = !CL && !SPLIT && it + cnt == it_end && wg_early_finisher<NT>(p, slice, base_b, k_tiles);
      if (added) {
#pragma unroll
        for (int i = 0; i < S::kDepPieces; ++i) {
          mbar_wait(cfull0 + 8 * r.st, r.phase);
          const uint32_t stage = cbase + r.st * S::kStage;
#pragma unroll
          for (int row = i * S::kDepRows; row < S::kDepTotalRows && row < (i + 1) * S::kDepRows; ++row) {
            add_f4(&acc[row / (S::kAcc / 4)][4 * (row % (S::kAcc / 4))],
                   lds128(stage + (row - i * S::kDepRows) * S::kDepRowBytes + ctid * 16));
          }
          mbar_arrive_if(cempty0 + 8 * r.st, true);
          r.next<S::kStages>();
        }
      }
      if constexpr (CL)
        wg_pair_finish<DT, GROUPED, NT, BPS, FEAT>(p, acc, slice, pc * NT, cbase, cbase + (pair_bar - sbase), cw, lane, ctid,
                                             cepi);
      else if constexpr (SPLIT)
        wg_spread_finish<DT, GROUPED, NT, 1, S::kConsumerThreads, FEAT>(p, acc, slice, pc * NT, base_b, cw, lane, ctid);
      else
        wg_finish_slice<DT, GROUPED, NT, 1, S::kConsumerThreads, true, FEAT>(p, acc, slice, pc * NT, base_b, k_tiles,
                                                                             cw, lane, ctid, cepi, added);
      it += cnt;
    }
  }
  tl_mark(p, kTlExit, tl0);
#else
  __trap();  // built only for sm_90a; the host never launches it elsewhere
#endif
}

template <int DT, int NT, int BPS, bool CL, int FEAT, bool SPLIT>
cudaError_t wgmma_ws_prepare(int* blocks_per_sm, int* smem_bytes) {
  using S = WsShape<NT, BPS, CL, FEAT>;
  return prepare_variants(marlin_wgmma_ws_kernel<DT, false, NT, BPS, CL, FEAT, SPLIT>,
                          marlin_wgmma_ws_kernel<DT, true, NT, BPS, CL, FEAT, SPLIT>, S::kThreads, S::kSmemBytes, blocks_per_sm,
                          smem_bytes);
}

template <int DT, int NT, int BPS, bool CL, int FEAT, bool SPLIT>
cudaError_t wgmma_ws_launch(const KernelArgs& a, const TmaMaps& maps, const LaunchOpts& o, cudaStream_t stream) {
  return launch_variant(marlin_wgmma_ws_kernel<DT, false, NT, BPS, CL, FEAT, SPLIT>,
                        marlin_wgmma_ws_kernel<DT, true, NT, BPS, CL, FEAT, SPLIT>, WsShape<NT, BPS, CL, FEAT>::kThreads, a, o,
                        stream, maps);
}

// How many clusters of `size` blocks of the pair form (o.smem_bytes each) the device runs at once.
template <int DT, int NT>
cudaError_t wgmma_ws_max_clusters(int size, const LaunchOpts& o, int* clusters) {
  constexpr int F = wgmma_tile_n(NT);
  return max_active_clusters(marlin_wgmma_ws_kernel<DT, false, NT, 1, true, F, false>,
                             marlin_wgmma_ws_kernel<DT, true, NT, 1, true, F, false>, WsShape<NT, 1>::kThreads, size, o,
                             clusters);
}

// Instantiations: NT-row tiles of FEAT columns (wgmma_tile_n(NT), or 128 beside 128 rows) at BPS blocks per SM; the
// fit tiles (marlin_partition.h, wgmma_fit_tile) in marlin_wgmma_fit_{fp16,bf16}.cu, so that they build in parallel.
#define MARLINC_INSTANTIATE_WGMMA_WS_FS(DT, NT, BPS, CL, FEAT, SPLIT)                                     \
  template cudaError_t wgmma_ws_prepare<DT, NT, BPS, CL, FEAT, SPLIT>(int*, int*);                      \
  template cudaError_t wgmma_ws_launch<DT, NT, BPS, CL, FEAT, SPLIT>(const KernelArgs&, const TmaMaps&, \
                                                                     const LaunchOpts&, cudaStream_t);
#define MARLINC_INSTANTIATE_WGMMA_WS_F(DT, NT, BPS, CL, FEAT) MARLINC_INSTANTIATE_WGMMA_WS_FS(DT, NT, BPS, CL, FEAT, false)
#define MARLINC_INSTANTIATE_WGMMA_WS(DT, NT, BPS) MARLINC_INSTANTIATE_WGMMA_WS_F(DT, NT, BPS, false, wgmma_tile_n(NT))
// The split form (slices in parts finished together: marlin_partition.h, wgmma_split_parts) at one block per SM.
#define MARLINC_INSTANTIATE_WGMMA_WS_SPLIT(DT, NT, FEAT) MARLINC_INSTANTIATE_WGMMA_WS_FS(DT, NT, 1, false, FEAT, true)
// A fit tile, its pair form and its split form.
#define MARLINC_INSTANTIATE_WGMMA_FIT(DT, NT)                                    \
  MARLINC_INSTANTIATE_WGMMA_WS(DT, NT, 1) MARLINC_INSTANTIATE_WGMMA_WS_PAIR(DT, NT) \
  MARLINC_INSTANTIATE_WGMMA_WS_SPLIT(DT, NT, kWgmmaWideTileN)
// The pair form: 128-row, wide and fit tiles at one block per SM (kernels/marlin_dispatch.h, wgmma_pair_tiles).
#define MARLINC_INSTANTIATE_WGMMA_WS_PAIR(DT, NT)                   \
  MARLINC_INSTANTIATE_WGMMA_WS_F(DT, NT, 1, true, wgmma_tile_n(NT)) \
  template cudaError_t wgmma_ws_max_clusters<DT, NT>(int, const LaunchOpts&, int*);

}  // namespace marlinc::kernels::detail
