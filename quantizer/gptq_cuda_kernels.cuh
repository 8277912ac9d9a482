// Device kernels of the GPTQ CUDA back end (gptq_cuda.cu drives them). Layouts: the working weights
// Wt are [k, n] row-major in processing order (one input column = one contiguous row of n doubles,
// so the threads of a warp, one output row each, read and write coalesced); U is the [k, k]
// row-major upper factor of the damped permuted H⁻¹. Precision as on the CPU (gptq.h): everything
// that decides a code is double; the grid helpers below are quantizer/grid.h operation for
// operation (IEEE double division, rint = nearbyint (ties to even), double → float → fp16 or bf16 for the
// scale), so the same double input gives the same code and scale on both back ends.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace marlinc::gptq_cuda {

// Output rows per CTA of the column loop: one warp, one row per lane (rows never interact).
constexpr int kLoopThreads = 32;
// Fast clip search tile: 16 output rows × 4 candidates = 64 (row, candidate) pairs per pass, each
// thread owning 4 pairs × two 8-wide chunks of the weighted error (chunks j and last−j, so the
// triangular work is the same for every thread).
constexpr int kClipRows = 16;
constexpr int kClipCandPass = 4;
constexpr int kClipPairs = kClipRows * kClipCandPass;
constexpr int kClipMaxGroup = 128;  // packed M (70 KB of doubles at 128) must fit in shared memory beside the tiles
static_assert(kClipPairs == 64, "thread layout below assumes 16 pair-groups of 4 pairs");

// round_to_word16 (checkpoint/half.h): the round trip through the stored scale type (fp16, or bf16).
__device__ __forceinline__ float d_round_scale(float x, bool bf16) {
  return bf16 ? __bfloat162float(__float2bfloat16_rn(x)) : __half2float(__float2half_rn(x));
}

// quant::sym_scale: 2c/maxq in double, rounded to float, then to the scale type.
__device__ __forceinline__ float d_sym_scale(double c, int bits, bool bf16) {
  if (!(c > 0.0)) c = 1.0;
  return d_round_scale(__double2float_rn((c + c) / double((1 << bits) - 1)), bf16);
}

// quant::quantize_code: rint of the double quotient, clamped.
__device__ __forceinline__ int d_quantize_code(double w, float s, int bits) {
  const int z = 1 << (bits - 1);
  if (!(s > 0.0f)) return z;
  double c = rint(w / double(s)) + double(z);
  c = c < 0.0 ? 0.0 : c;
  const double mq = double((1 << bits) - 1);
  c = c > mq ? mq : c;
  return int(c);
}

// Exact (code of ≤ 8 bits times a 16-bit scale), so contraction cannot change it.
__device__ __forceinline__ float d_dequant(int code, float s, int bits) {
  return __fmul_rn(float(code - (1 << (bits - 1))), s);
}

// quant::candidate_scale: shrink factor 1 − i/grid and its product with absmax in double.
__device__ __forceinline__ float d_candidate_scale(double absmax, int i, int grid, int bits, bool bf16) {
  const double p = 1.0 - double(i) / double(grid);
  return d_sym_scale(__dmul_rn(p, absmax), bits, bf16);
}

// quant::round_error: the rounding error dequant(quantize_code(w, s)) − w in double, branch-free and
// without integer conversions (they run on the H100's quarter-rate conversion unit). s is the 16-bit
// scale held as a double. Adding ±2^52 rounds to an integer exactly as rint does; the clamp covers
// larger quotients; (c − zero)·s is exact, so a fused multiply-add gives the same value.
__device__ __forceinline__ double d_round_error(double w, double s, int bits) {
  const double z = double(1 << (bits - 1)), mq = double((1 << bits) - 1);
  const double q = w / s, m = copysign(4503599627370496.0, q);  // 2^52
  const double c = fmin(mq, fmax(0.0, (q + m) - m + z));
  return (c - z) * s - w;
}

// ---- preparation ---------------------------------------------------------------------------------

// Sets *flag when any of the first `count` values is NaN/Inf (input validation without a host pass).
__global__ void nonfinite_kernel(const float* x, int64_t count, int* flag) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    if (!isfinite(x[i])) { atomicExch(flag, 1); return; }
}

// Hr = J·(Hp + damp·I)·J in column-major double, with Hp[a, b] = H[perm[a], perm[b]] and dead
// diagonals set to 1: the index reversal J makes the LOWER Cholesky factor's inverse equal to J·U·J
// (see gptq::inverse_cholesky_upper), so potrf + trtri give U directly. damp = λ·mean(diag), double,
// added in double exactly as gptq::prepare does.
__global__ void gather_damped_kernel(const float* H /*[k, k]*/, const int32_t* perm /*[k]*/, int64_t k, double damp,
                                     double* Hr /*[k, k]*/) {
  const int64_t a = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, b = blockIdx.y;
  if (a >= k) return;
  const int64_t pa = perm[k - 1 - a], pb = perm[k - 1 - b];
  double v = double(H[pa + pb * k]);
  if (a == b) {
    if (v == 0.0) v = 1.0;  // dead column (§1.3)
    v = v + damp;
  }
  Hr[a + b * k] = v;
}

// Failure check of the factorisation, as finite_positive_diag on the CPU: every value of the lower
// triangle of L⁻¹ finite and its diagonal positive.
__global__ void check_factor_kernel(const double* Linv /*[k, k] col-major lower*/, int64_t k, int* bad) {
  const int64_t a = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, b = blockIdx.y;
  if (a >= k || a < b) return;
  const double v = Linv[a + b * k];
  if (!isfinite(v) || (a == b && !(v > 0.0))) atomicExch(bad, 1);
}

// U[i, j] (row-major) = L⁻¹[k−1−i, k−1−j] for j ≥ i, 0 below the diagonal: a reversed transpose,
// staged through a 32×32 shared tile so reads and writes are both coalesced.
__global__ void reverse_transpose_kernel(const double* Linv /*[k, k] col-major*/, int64_t k, double* U /*[k, k]*/) {
  __shared__ double tile[32][33];
  const int64_t i0 = blockIdx.x * 32, j0 = blockIdx.y * 32;
  for (int y = threadIdx.y; y < 32; y += blockDim.y) {
    const int64_t i = i0 + threadIdx.x, j = j0 + y;
    double v = 0.0;
    if (i < k && j < k && j >= i) v = Linv[(k - 1 - i) + (k - 1 - j) * k];
    tile[y][threadIdx.x] = v;
  }
  __syncthreads();
  for (int y = threadIdx.y; y < 32; y += blockDim.y) {
    const int64_t i = i0 + y, j = j0 + threadIdx.x;
    if (i < k && j < k) U[i * k + j] = tile[threadIdx.x][y];
  }
}

// Wt[p, r] = W[r, src[p]] (0 for a dead column, src < 0): transpose into processing order, widened
// to double (exact).
__global__ void gather_weights_kernel(const float* W /*[n, k]*/, const int32_t* src /*[k]*/, int64_t n, int64_t k,
                                      double* Wt /*[k, n]*/) {
  __shared__ float tile[32][33];
  const int64_t p0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
  for (int y = threadIdx.y; y < 32; y += blockDim.y) {
    const int64_t p = p0 + threadIdx.x, r = r0 + y;
    float v = 0.0f;
    if (p < k && r < n) {
      const int32_t c = src[p];
      v = c < 0 ? 0.0f : W[r * k + c];
    }
    tile[y][threadIdx.x] = v;
  }
  __syncthreads();
  for (int y = threadIdx.y; y < 32; y += blockDim.y) {
    const int64_t p = p0 + y, r = r0 + threadIdx.x;
    if (p < k && r < n) Wt[p * n + r] = double(tile[threadIdx.x][y]);
  }
}

// M_g = U_gg⁻¹ [g, g] row-major upper (zeros below) for every processing-order group (one CTA per
// group, one column per thread, back substitution): the weighting of Marlin's clip objective.
__global__ void group_inverse_kernel(const double* U /*[k, k]*/, int64_t k, int g, double* M /*[G, g, g]*/) {
  const int64_t base = int64_t(blockIdx.x) * g;
  double* Mg = M + int64_t(blockIdx.x) * g * g;
  for (int u = threadIdx.x; u < g; u += blockDim.x) {
    for (int t = g - 1; t > u; --t) Mg[int64_t(t) * g + u] = 0.0;
    for (int t = u; t >= 0; --t) {
      const double* urow = U + (base + t) * k + base;
      double acc = t == u ? 1.0 : 0.0;
      for (int l = t + 1; l <= u; ++l) acc -= urow[l] * Mg[int64_t(l) * g + u];
      Mg[int64_t(t) * g + u] = acc / urow[t];
    }
  }
}

// ---- group scales ----------------------------------------------------------------------------------

// Row index (in Wt) of member t of the group being fitted: consecutive processing rows, or a list
// (static groups gather their natural columns from wherever the order put them).
__device__ __forceinline__ int64_t group_row(const int32_t* rows, int64_t p0, int t) {
  return rows ? int64_t(rows[t]) : p0 + t;
}

__device__ __forceinline__ void store_scale(float s, int64_t srow, int64_t n, int64_t r, float* S, uint16_t* Sh,
                                            bool bf16) {
  S[srow * n + r] = s;
  Sh[srow * n + r] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(s)) : __half_as_ushort(__float2half_rn(s));
}

// Plain absmax scales (no clip search) for one group.
__global__ void absmax_scale_kernel(const double* Wt, int64_t n, const int32_t* rows, int64_t p0, int g, int bits, bool bf16,
                                    int64_t srow, float* S /*[G, n]*/, uint16_t* Sh /*[G, n]*/) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= n) return;
  double a = 0.0;
  for (int t = 0; t < g; ++t) a = fmax(a, fabs(Wt[group_row(rows, p0, t) * n + r]));
  store_scale(d_sym_scale(a, bits, bf16), srow, n, r, S, Sh, bf16);
}

// Packed upper-triangular weighting in shared memory: strip ch holds columns 8ch..8ch+7 of rows
// 0..8ch+7 (the only nonzero ones), 8 doubles per row, at this offset (in doubles). Half the bytes
// of a dense [g, g] block, which is what lets the double tile fit.
__host__ __device__ constexpr int64_t clip_strip_offset(int ch) { return int64_t(32) * ch * (ch + 1); }

// Dynamic shared memory of clip_search_kernel for group length g: doubles first (16-byte aligned
// for the double2 loads), then the chosen float scales. 153 KiB at g = 128 (one CTA per SM).
__host__ __device__ constexpr size_t clip_smem_bytes(int g) {
  return sizeof(double) * (size_t(clip_strip_offset(g / 8)) + size_t(g) * kClipRows + size_t(g) * kClipPairs +
                           size_t(g / 16) * kClipPairs + 2 * kClipPairs + 2 * kClipRows) +
         sizeof(float) * kClipRows;
}

// Hessian-weighted clip search (gptq.md §2.1) for one group, all candidates of 16 rows per CTA:
// error(p) = ‖Mᵀ·δ_p‖², δ_p = Q_p(x) − x, with M [g, g] row-major UPPER (U_gg⁻¹, the Schur
// objective; static groups pass their lower chol(H_gg) index-reversed, which is upper and gives the
// same norm). All in double. Ties keep the larger shrink factor (the earlier candidate), as the CPU
// does. Launch: g threads (g % 16 == 0, g <= kClipMaxGroup), dynamic shared memory clip_smem_bytes(g).
__global__ void __launch_bounds__(kClipMaxGroup)
    clip_search_kernel(const double* Wt, int64_t n, const int32_t* rows, int64_t p0, int g,
                       const double* M /*[g, g]*/, int bits, bool bf16, int grid, int candidates, int64_t srow,
                       float* S, uint16_t* Sh) {
  extern __shared__ __align__(16) unsigned char clip_smem[];
  const int nch = g / 8;
  double* Ms = reinterpret_cast<double*>(clip_smem);  // packed strips, clip_strip_offset(nch)
  double* X = Ms + clip_strip_offset(nch);            // [g, kClipRows] the group's weights
  double* D = X + g * kClipRows;                      // [g, kClipPairs] candidate errors δ
  double* red = D + g * kClipPairs;                   // [g/16, kClipPairs] partial error sums
  double* err = red + (g / 16) * kClipPairs;          // [kClipPairs]
  double* amax = err + kClipPairs;                    // [kClipRows]
  double* best = amax + kClipRows;                    // [kClipRows]
  double* cs = best + kClipRows;                      // [kClipPairs] 16-bit candidate scales of the pass
  float* best_s = reinterpret_cast<float*>(cs + kClipPairs);  // [kClipRows]
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t r0 = int64_t(blockIdx.x) * kClipRows;
  for (int ch = 0; ch < nch; ++ch) {
    double* strip = Ms + clip_strip_offset(ch);
    for (int i = tid; i < (8 * ch + 8) * 8; i += nt) strip[i] = M[int64_t(i / 8) * g + 8 * ch + i % 8];
  }
  for (int i = tid; i < g * kClipRows; i += nt) {
    const int t = i / kClipRows, rr = i % kClipRows;
    X[i] = r0 + rr < n ? Wt[group_row(rows, p0, t) * n + r0 + rr] : 0.0;
  }
  __syncthreads();
  if (tid < kClipRows) {
    double a = 0.0;
    for (int t = 0; t < g; ++t) a = fmax(a, fabs(X[t * kClipRows + tid]));
    amax[tid] = a;
    best[tid] = INFINITY;
    best_s[tid] = d_sym_scale(a, bits, bf16);
  }
  __syncthreads();
  const int pg = tid % 16;  // pair group: pairs 4·pg .. 4·pg+3 (candidate pg/4, rows 4·(pg%4) ..)
  const int j = tid / 16;   // chunk pair index: chunks j and nch−1−j of 8 columns of Mᵀδ
  for (int c0 = 0; c0 < candidates; c0 += kClipCandPass) {
    // Pair q = cand·kClipRows + row.
    for (int q = tid; q < kClipPairs; q += nt) {
      const int c = c0 + q / kClipRows;
      cs[q] = c < candidates ? double(d_candidate_scale(amax[q % kClipRows], c, grid, bits, bf16)) : 1.0;
    }
    __syncthreads();
#pragma unroll 4
    for (int i = tid; i < g * kClipPairs; i += nt) {
      const int t = i / kClipPairs, q = i % kClipPairs;
      D[i] = c0 + q / kClipRows < candidates ? d_round_error(X[t * kClipRows + q % kClipRows], cs[q], bits) : 0.0;
    }
    __syncthreads();
    double part[4] = {0.0, 0.0, 0.0, 0.0};
    for (int half = 0; half < 2; ++half) {
      const int ch = half == 0 ? j : nch - 1 - j;
      const double* strip = Ms + clip_strip_offset(ch);
      double acc[4][8];
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 8; ++b) acc[a][b] = 0.0;
      // (Mᵀδ)_u = Σ_{t ≤ u} M[t, u]·δ_t for the chunk's columns u = 8ch .. 8ch+7.
#pragma unroll 2
      for (int t = 0; t < 8 * ch + 8; ++t) {
        const double2 d01 = *reinterpret_cast<const double2*>(D + t * kClipPairs + 4 * pg);
        const double2 d23 = *reinterpret_cast<const double2*>(D + t * kClipPairs + 4 * pg + 2);
        const double2 m01 = *reinterpret_cast<const double2*>(strip + t * 8);
        const double2 m23 = *reinterpret_cast<const double2*>(strip + t * 8 + 2);
        const double2 m45 = *reinterpret_cast<const double2*>(strip + t * 8 + 4);
        const double2 m67 = *reinterpret_cast<const double2*>(strip + t * 8 + 6);
        const double dd[4] = {d01.x, d01.y, d23.x, d23.y};
        const double mm[8] = {m01.x, m01.y, m23.x, m23.y, m45.x, m45.y, m67.x, m67.y};
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 8; ++b) acc[a][b] = fma(mm[b], dd[a], acc[a][b]);
      }
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 8; ++b) part[a] = fma(acc[a][b], acc[a][b], part[a]);
    }
#pragma unroll
    for (int a = 0; a < 4; ++a) red[j * kClipPairs + 4 * pg + a] = part[a];
    __syncthreads();
    for (int q = tid; q < kClipPairs; q += nt) {  // g may be < 64 threads
      double e = 0.0;
      for (int jj = 0; jj < nch / 2; ++jj) e += red[jj * kClipPairs + q];
      err[q] = e;
    }
    __syncthreads();
    if (tid < kClipRows && amax[tid] != 0.0) {
      for (int cc = 0; cc < kClipCandPass && c0 + cc < candidates; ++cc) {
        const double e = err[cc * kClipRows + tid];
        if (e < best[tid]) {
          best[tid] = e;
          best_s[tid] = float(cs[cc * kClipRows + tid]);
        }
      }
    }
    __syncthreads();
  }
  if (tid < kClipRows && r0 + tid < n) store_scale(best_s[tid], srow, n, r0 + tid, S, Sh, bf16);
}

// Any group length (slow path for groups the tiled kernel does not cover): one thread per row. The
// candidate's δ goes to the caller's scratch column Ds[:, r] (coalesced across the warp) so each
// is divided once, then the upper-triangular M is applied from there.
__global__ void clip_search_generic_kernel(const double* Wt, int64_t n, const int32_t* rows, int64_t p0, int g,
                                           const double* M /*[g, g] upper*/, int bits, bool bf16, int grid, int candidates,
                                           int64_t srow, float* S, uint16_t* Sh, double* Ds /*[g, n]*/) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= n) return;
  double a = 0.0;
  for (int t = 0; t < g; ++t) a = fmax(a, fabs(Wt[group_row(rows, p0, t) * n + r]));
  float bs = d_sym_scale(a, bits, bf16);
  double be = INFINITY;
  if (a != 0.0)
    for (int c = 0; c < candidates; ++c) {
      const float s = d_candidate_scale(a, c, grid, bits, bf16);
      for (int t = 0; t < g; ++t) Ds[int64_t(t) * n + r] = d_round_error(Wt[group_row(rows, p0, t) * n + r], s, bits);
      double e = 0.0;
      for (int u = 0; u < g; ++u) {
        double acc = 0.0;
        for (int t = 0; t <= u; ++t) acc = fma(M[int64_t(t) * g + u], Ds[int64_t(t) * n + r], acc);
        e = fma(acc, acc, e);
      }
      if (e < be) { be = e; bs = s; }
    }
  store_scale(bs, srow, n, r, S, Sh, bf16);
}

// ---- the column loop -------------------------------------------------------------------------------

// Saliency pruning of one 2:4 group, as gptq::prune_24: the 2 smallest w²/d² (ties: lower index).
__device__ __forceinline__ unsigned d_prune_24(const double w[4], const double d[4]) {
  double s[4];
  for (int t = 0; t < 4; ++t) s[t] = (w[t] * w[t]) / (d[t] * d[t]);
  unsigned pruned = 0;
  for (int rep = 0; rep < 2; ++rep) {
    int b = -1;
    for (int t = 0; t < 4; ++t)
      if (!(pruned >> t & 1u) && (b < 0 || s[t] < s[b])) b = t;
    pruned |= 1u << b;
  }
  return pruned;
}

struct LoopArgs {
  double* Wt;             // [k, n] working weights, processing order
  const double* U;        // [k, k] row-major upper factor
  const float* S;         // [G, n] current scales (rounded floats)
  const int32_t* srow;    // [k] scale row of each processing position
  const int32_t* perm;    // [k] processing position -> original column
  uint8_t* codes;         // [k, n] original order
  uint8_t* mask;          // [k, n] original order, or null (dense)
  double* E;              // [B, n] scaled errors of the current block
  double* loss;           // [n] Σ err² per row
  int64_t n, k, i1, i2, p0, p1;
  int bits;
  bool smem;              // block columns [p0, i2) staged in shared memory
};

// Columns [p0, p1) of the lazy block [i1, i2), one output row per thread: quantize (2:4 decisions at
// every 4th column), scaled error e = (w − q)/U_pp, rank-1 OBS update of the block's later columns.
// Sequential in p by construction (column p needs every earlier column's feedback).
__global__ void column_loop_kernel(LoopArgs a) {
  extern __shared__ double loop_tile[];  // [i2 − p0, kLoopThreads] when a.smem
  const int lane = threadIdx.x;
  const int64_t r = blockIdx.x * int64_t(kLoopThreads) + lane;
  if (r >= a.n) return;  // rows are independent: no block-wide synchronisation below
  const int64_t n = a.n, k = a.k;
  double* base = a.smem ? loop_tile + lane : a.Wt + a.p0 * n + r;
  const int64_t ld = a.smem ? kLoopThreads : n;
  if (a.smem)
    for (int64_t t = a.p0; t < a.i2; ++t) base[(t - a.p0) * ld] = a.Wt[t * n + r];
  double l = 0.0;
  unsigned pruned = 0;
  for (int64_t p = a.p0; p < a.p1; ++p) {
    double* wp = base + (p - a.p0) * ld;
    if (a.mask && (p & 3) == 0) {
      double ww[4], dd[4];
      for (int t = 0; t < 4; ++t) {
        ww[t] = wp[t * ld];
        dd[t] = a.U[(p + t) * k + p + t];
      }
      pruned = d_prune_24(ww, dd);
    }
    const double w = *wp, d = a.U[p * k + p];
    const float s = a.S[int64_t(a.srow[p]) * n + r];
    int code;
    bool keep = true;
    if (a.mask && (pruned >> (p & 3) & 1u)) {
      code = 1 << (a.bits - 1);
      keep = false;
    } else {
      code = d_quantize_code(w, s, a.bits);
    }
    const int64_t orig = a.perm[p];
    a.codes[orig * n + r] = uint8_t(code);
    if (a.mask) a.mask[orig * n + r] = keep ? 1 : 0;
    const double err = (w - double(d_dequant(code, s, a.bits))) / d;
    a.E[(p - a.i1) * n + r] = err;
    l += err * err;
    const double* urow = a.U + p * k;
    for (int64_t t = p + 1; t < a.i2; ++t) {
      double* x = base + (t - a.p0) * ld;
      *x -= __ldg(urow + t) * err;
    }
  }
  if (a.smem)
    for (int64_t t = a.p0; t < a.i2; ++t) a.Wt[t * n + r] = base[(t - a.p0) * ld];
  a.loss[r] += l;
}

// U := I (the RTN fallback when every damping failed): H⁻¹ treated as the identity.
__global__ void set_identity_kernel(double* U /*[k, k]*/, int64_t k) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, i = blockIdx.y;
  if (j < k) U[i * k + j] = i == j ? 1.0 : 0.0;
}

// ---- Hessian accumulation helpers --------------------------------------------------------------------

// H = (2/N)·Σ (both triangles from the full GEMM; symmetrised so the factorisation sees an exactly
// symmetric matrix whichever triangle it reads).
__global__ void finalize_hessian_kernel(const float* sum /*[k, k]*/, int64_t k, float scale, float* H /*[k, k]*/) {
  const int64_t a = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, b = blockIdx.y;
  if (a >= k) return;
  const float lo = a >= b ? sum[a + b * k] : sum[b + a * k];
  H[a + b * k] = lo * scale;
}

}  // namespace marlinc::gptq_cuda
