// The warp-specialized form of the Hopper kernel (marlin_wgmma.cuh): the same packed bytes, stage layout,
// index maps, products and slice reduction, but a third warpgroup (the producer) issues every copy and
// the two consumer warpgroups only expand weights and run wgmmas. ncu on the block-synchronous kernel
// (docs/PERF.md) showed it issue- and latency-bound: copy addresses were ~1/3 of a tile's instructions,
// and the per-stage block barrier made each warpgroup wait for the slower one.
//
// Hand-off per stage through two mbarriers: `full` completes when the producer's 128 threads' cp.asyncs
// into the stage have landed (cp.async.mbarrier.arrive.noinc, one arrival per producer thread), `empty`
// when the 256 consumer threads have retired the wgmmas and word loads that read it (one arrival per
// thread: each thread's own shared-memory reads are ordered before its own release). The ring runs
// across slices and row chunks, so the producer streams the next slice's tiles while the consumers
// reduce the last one. setmaxnreg moves registers from the producer to the consumers (accumulators).
#pragma once
#include <cstdint>

#include "kernels/sm90/marlin_wgmma.cuh"

namespace marlinc::kernels::detail {

template <int NT, int BPS>
struct WsShape : WgShape<NT> {
  using Base = WgShape<NT>;
  static constexpr int kProducerThreads = 128;
  static constexpr int kThreads = kProducerThreads + wl::kThreads;  // producer + two consumer warpgroups
  static constexpr int kConsumerThreads = wl::kThreads;
  // Shared memory per block at BPS blocks per SM (the H100 has 228 KB per SM, 1 KB of it reserved per
  // block, and at most 227 KB per block); every stage of the ring may be in flight.
  static constexpr int kSmemPerBlock = BPS == 1 ? 227 * 1024 : (228 * 1024) / BPS - 1024;
  static constexpr int kMaxStages = 8;
  static constexpr int kFitStages = (kSmemPerBlock - Base::kAlign - 16 * kMaxStages) / Base::kStage;
  static constexpr int kStages = kFitStages < kMaxStages ? kFitStages : kMaxStages;
  static constexpr int kSmemBytes = kStages * Base::kStage + 16 * kStages + Base::kAlign;  // + full/empty
  // Registers: the launch gives every thread kLaunchRegs; the producer gives back all but kProducerRegs,
  // and the consumers take them (setmaxnreg counts are multiples of 8 in 24..256). At BPS = 1 that is
  // 224 for the consumers and 56 for the producer (40 made it spill); BPS = 2 would leave the consumers
  // 104, where ptxas serializes the wgmmas (C7512), so only BPS = 1 is instantiated.
  static constexpr int kLaunchRegs = (65536 / (kThreads * BPS)) / 8 * 8;
  static constexpr int kProducerRegs = BPS == 1 ? 56 : 24;
  static constexpr int kConsumerRegs =
      (kLaunchRegs + (kLaunchRegs - kProducerRegs) * kProducerThreads / wl::kThreads) / 8 * 8;

  // wgmma groups a warpgroup leaves pending after issuing a k16 step: the steps whose A fragments are
  // live, and how far the expansion of the next step runs ahead of the tensor pipe.
  static constexpr int kPending = 2;

  static_assert(NT == 64 || NT == 128, "token tiles the warp-specialized kernel is built for");
  static_assert(kPending >= 1 && kPending <= Base::kKB, "the previous tile retires within the next one");
  static_assert(kStages >= 3, "the ring needs stages in flight on both sides of the one being read");
  static_assert(kSmemBytes <= kSmemPerBlock, "the ring fits the block's shared memory");
  static_assert(kConsumerRegs <= 256 && kProducerRegs >= 24, "setmaxnreg bounds");
  static_assert((NT * 8) % kProducerThreads == 0, "every producer thread copies the same number of chunks");
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
// The mbarrier receives one arrival once every cp.async this thread issued so far has landed.
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
template <int R>
__device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R>
__device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }

// Position in the ring: stage index and the parity of its current use.
struct RingPos {
  int st = 0;
  uint32_t phase = 0;
  template <int kStages>
  __device__ __forceinline__ void next() {
    if (++st == kStages) st = 0, phase ^= 1u;
  }
};

template <int DT, bool GROUPED, int NT, int BPS>
__global__ void __launch_bounds__(WsShape<NT, BPS>::kThreads, BPS) marlin_wgmma_ws_kernel(const KernelArgs p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = WsShape<NT, BPS>;
  extern __shared__ __align__(16) unsigned char sh_raw[];
  const uint32_t raw = smem_addr(sh_raw);
  unsigned char* sh = sh_raw + (((raw + S::kAlign - 1) & ~uint32_t(S::kAlign - 1)) - raw);
  const uint32_t sbase = smem_addr(sh);
  const uint32_t full0 = sbase + S::kStages * S::kStage, empty0 = full0 + 8 * S::kStages;  // [kStages] each

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0)
    for (int s = 0; s < S::kStages; ++s) {
      mbar_init(full0 + 8 * s, S::kProducerThreads);
      mbar_init(empty0 + 8 * s, S::kConsumerThreads);
    }
  __syncthreads();  // barriers initialized before anyone waits on or arrives at them
  allow_next_grid();  // see marlin_kernel: every block of this grid is resident before the next starts
  tl_mark(p, kTlEntry, tid == 0);
  tl_mark(p, kTlSm, tid == 0);

  const int k_tiles = p.k / S::kTK, n_tiles = p.n / S::kFeat;
  const int nk = n_tiles * k_tiles;
  const int group = blockIdx.x / p.chunk_blocks, local = blockIdx.x % p.chunk_blocks;
  const int base_b = group * p.chunk_blocks;

  if (warp < S::kProducerThreads / 32) {
    // Producer: the consumers' tile sequence, one stage per tile, each filled once the consumers have
    // released it. Weights of the first tile go out before the wait for the previous kernel (see
    // marlin_kernel), activations only after it. Each thread's chunks sit at fixed offsets from the row
    // chunk's activations and the tile's weights and scales, worked out once (32-bit: the host checks
    // wgmma_offsets_fit); per tile only the tile's base pointers move.
    regs_dec<S::kProducerRegs>();
    constexpr int kAChunks = NT * 8 / S::kProducerThreads, kBChunks = S::kBBytes / 16 / S::kProducerThreads;
    const int a_row = p.k / 8, b_row = p.n / 2, s_row = p.n / 8;  // int4 per row of A, B, s
    const int4* A = static_cast<const int4*>(p.A);
    const int4* B = reinterpret_cast<const int4*>(p.B);
    const int4* Sc = static_cast<const int4*>(p.s);
    int b_off[kBChunks];
#pragma unroll
    for (int j = 0; j < kBChunks; ++j) {
      const int i = j * S::kProducerThreads + tid;
      b_off[j] = wl::weight_int4_row(i) * b_row + wl::weight_int4_col(i);
    }
    const int s_rows = (S::kTK >> p.group_shift) > 1 ? (S::kTK >> p.group_shift) : 1;
    const bool s_in = GROUPED && tid < s_rows * (S::kFeat / 8);
    const int s_off = (tid / (S::kFeat / 8)) * s_row + tid % (S::kFeat / 8);
    bool waited = false;
    RingPos w;
    for (int pc = group; pc < p.par; pc += p.chunk_groups) {
      const int row0 = pc * NT;
      const int4* a_base = A + size_t(row0) * a_row;
      int a_off[kAChunks];
      uint32_t a_ok = 0;  // bit j: chunk j's row is below m (else zero-filled from row row0's address)
#pragma unroll
      for (int j = 0; j < kAChunks; ++j) {
        const int i = j * S::kProducerThreads + tid, r = i >> 3;
        const bool ok = row0 + r < p.m;
        a_ok |= uint32_t(ok) << j;
        a_off[j] = (ok ? r : 0) * a_row + (i & 7);
      }
      int it = local * p.iters;
      const int it_end = min(it + p.iters, nk);
      int slice = it / k_tiles, kt = it - slice * k_tiles;
      for (; it < it_end; ++it) {
        mbar_wait(empty0 + 8 * w.st, w.phase ^ 1u);  // a fresh barrier counts its previous phase as done
        const uint32_t stage = sbase + w.st * S::kStage;
        const int4* b_tile = B + size_t(kt) * S::kKB * b_row + slice * (S::kFeat / 2);
#pragma unroll
        for (int j = 0; j < kBChunks; ++j)
          cp_async16_s(stage + S::kABytes + 16 * (j * S::kProducerThreads + tid), b_tile + b_off[j], true);
        if (s_in) {
          const int g0 = (kt * S::kTK) >> p.group_shift;
          cp_async16_s(stage + S::kABytes + S::kBBytes + 16 * tid,
                       Sc + size_t(g0) * s_row + slice * (S::kFeat / 8) + s_off, true);
        }
        if (!waited) wait_previous_grid(), waited = true;
#pragma unroll
        for (int j = 0; j < kAChunks; ++j) {
          const int i = j * S::kProducerThreads + tid;
          cp_async16_s(stage + wl::act_chunk_byte(i >> 3, i & 7), a_base + (a_off[j] + kt * 8), (a_ok >> j) & 1u);
        }
        cp_async_arrive(full0 + 8 * w.st);
        w.next<S::kStages>();
        if (++kt == k_tiles) kt = 0, ++slice;
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // nothing in flight when the producer exits
    return;
  }

  // Consumers: warp cw (0..7) of the two warpgroups, with the block-synchronous kernel's roles.
  regs_inc<S::kConsumerRegs>();
  wait_previous_grid();  // C, the workspace and its locks are the previous kernel's until it has finished
  const int ctid = tid - S::kProducerThreads, cw = ctid >> 5;
  const bool tl0 = ctid == 0;  // the consumers' thread 0 marks the rest of the timeline
  tl_mark(p, kTlWaited, tl0);
  bool tl_first = tl0;
  const int w_byte = wl::weight_byte(wl::warp_tile(cw), lane, wl::warp_sub0(cw));
  const int s_byte = wl::scale_byte(wl::warp_tile(cw), lane, wl::warp_sub0(cw));
  RingPos r;
  for (int pc = group; pc < p.par; pc += p.chunk_groups) {
    int it = local * p.iters;
    const int it_end = min(it + p.iters, nk);
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
        mbar_wait(full0 + 8 * r.st, r.phase);
        fence_proxy_async();  // the producer's cp.async writes (generic proxy) before wgmma's reads (async)
        tl_mark(p, kTlFirstData, tl_first && t == 0);
        const unsigned char* stage = sh + r.st * S::kStage;
        WgWords w = wg_load_words<NT, GROUPED>(stage, 0, w_byte, s_byte, p.group_shift);
#pragma unroll
        for (int kk = 0; kk < S::kKB; ++kk) {
          wg_issue<DT, GROUPED, NT>(acc, sbase + r.st * S::kStage, kk, w);
          if (kk + 1 < S::kKB) w = wg_load_words<NT, GROUPED>(stage, kk + 1, w_byte, s_byte, p.group_shift);
          wgmma_wait<S::kPending>();
          // After step kPending - 1's wait every wgmma of the previous tile has retired: its stage goes
          // back. A predicated arrive, not a branch, while wgmmas are in flight (a branch there makes
          // ptxas serialize them, C7513).
          if (kk == S::kPending - 1) mbar_arrive_if(empty0 + 8 * prev, t > 0);
        }
        prev = r.st;
        r.next<S::kStages>();
      }
      wgmma_wait<0>();
      fence_regs(acc[0]);
      fence_regs(acc[1]);
      mbar_arrive_if(empty0 + 8 * prev, true);
      tl_mark(p, kTlComputed, tl0);
      tl_first = false;
      wg_finish_slice<DT, GROUPED, NT, 1, wl::kThreads>(p, acc, slice, pc * NT, base_b, k_tiles, cw, lane, ctid);
      it += cnt;
    }
  }
  tl_mark(p, kTlExit, tl0);
#else
  __trap();  // built only for sm_90a; the host never launches it elsewhere
#endif
}

template <int DT, int NT, int BPS>
cudaError_t wgmma_ws_prepare(int* blocks_per_sm, int* smem_bytes) {
  using S = WsShape<NT, BPS>;
  *smem_bytes = S::kSmemBytes;
  return prepare_variants(marlin_wgmma_ws_kernel<DT, false, NT, BPS>, marlin_wgmma_ws_kernel<DT, true, NT, BPS>,
                          S::kThreads, S::kSmemBytes, blocks_per_sm);
}

template <int DT, int NT, int BPS>
cudaError_t wgmma_ws_launch(const KernelArgs& a, const LaunchOpts& o, cudaStream_t stream) {
  return launch_variant(marlin_wgmma_ws_kernel<DT, false, NT, BPS>, marlin_wgmma_ws_kernel<DT, true, NT, BPS>,
                        WsShape<NT, BPS>::kThreads, a, o, stream);
}

#define MARLINC_INSTANTIATE_WGMMA_WS(DT, NT, BPS)                    \
  template cudaError_t wgmma_ws_prepare<DT, NT, BPS>(int*, int*); \
  template cudaError_t wgmma_ws_launch<DT, NT, BPS>(const KernelArgs&, const LaunchOpts&, cudaStream_t);

}  // namespace marlinc::kernels::detail
