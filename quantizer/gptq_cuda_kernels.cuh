// Device kernels of the GPTQ CUDA back end (gptq_cuda.cu drives them). Layouts: the working weights
// Wt are [k, n] row-major in processing order (one input column = one contiguous row of n floats,
// so the threads of a warp, one output row each, read and write coalesced); U is the [k, k]
// row-major upper factor of the damped permuted H⁻¹. Arithmetic mirrors quantizer/grid.h bit for
// bit: IEEE division, rintf = nearbyint (ties to even), fp16 round trips through __float2half_rn,
// and __fmul_rn wherever the CPU rounds a product before a subtraction (nvcc would otherwise fuse
// it into an FMA and round differently from the host).
#pragma once
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
constexpr int kClipMaxGroup = 128;  // M = [g, g] must fit in shared memory next to the tiles
static_assert(kClipPairs == 64, "thread layout below assumes 16 pair-groups of 4 pairs");

__device__ __forceinline__ float d_round_fp16(float x) { return __half2float(__float2half_rn(x)); }

__device__ __forceinline__ float d_sym_scale(float c, int bits) {
  if (!(c > 0.0f)) c = 1.0f;
  return d_round_fp16((c + c) / float((1 << bits) - 1));
}

__device__ __forceinline__ int d_quantize_code(float w, float s, int bits) {
  const int z = 1 << (bits - 1);
  if (!(s > 0.0f)) return z;
  float c = rintf(w / s) + float(z);
  c = c < 0.0f ? 0.0f : c;
  const float mq = float((1 << bits) - 1);
  c = c > mq ? mq : c;
  return int(c);
}

__device__ __forceinline__ float d_dequant(int code, float s, int bits) {
  return __fmul_rn(float(code - (1 << (bits - 1))), s);
}

// Candidate i of the shrink grid, computed as quant::shrink_factor does (double, then float).
__device__ __forceinline__ float d_shrink(int i, int grid) { return float(1.0 - double(i) / double(grid)); }

// Rounding error of w on the grid with scale s, as the CPU forms it (dequant rounded, then minus w).
__device__ __forceinline__ float d_delta(float w, float s, int bits) {
  return __fsub_rn(d_dequant(d_quantize_code(w, s, bits), s, bits), w);
}

// ---- preparation ---------------------------------------------------------------------------------

// Sets *flag when any of the first `count` values is NaN/Inf (input validation without a host pass).
__global__ void nonfinite_kernel(const float* x, int64_t count, int* flag) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    if (!isfinite(x[i])) { atomicExch(flag, 1); return; }
}

// Hr = J·(Hp + damp·I)·J in column-major, with Hp[a, b] = H[perm[a], perm[b]] and dead diagonals set
// to 1: the index reversal J makes the LOWER Cholesky factor's inverse equal to J·U·J (see
// gptq::inverse_cholesky_upper), so potrf + trtri give U directly.
__global__ void gather_damped_kernel(const float* H /*[k, k]*/, const int32_t* perm /*[k]*/, int64_t k, float damp,
                                     float* Hr /*[k, k]*/) {
  const int64_t a = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, b = blockIdx.y;
  if (a >= k) return;
  const int64_t pa = perm[k - 1 - a], pb = perm[k - 1 - b];
  float v = H[pa + pb * k];
  if (a == b) {
    if (v == 0.0f) v = 1.0f;  // dead column (§1.3)
    v = v + damp;
  }
  Hr[a + b * k] = v;
}

// Failure check of the factorisation, as finite_positive_diag on the CPU: every value of the lower
// triangle of L⁻¹ finite and its diagonal positive.
__global__ void check_factor_kernel(const float* Linv /*[k, k] col-major lower*/, int64_t k, int* bad) {
  const int64_t a = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, b = blockIdx.y;
  if (a >= k || a < b) return;
  const float v = Linv[a + b * k];
  if (!isfinite(v) || (a == b && !(v > 0.0f))) atomicExch(bad, 1);
}

// U[i, j] (row-major) = L⁻¹[k−1−i, k−1−j] for j ≥ i, 0 below the diagonal: a reversed transpose,
// staged through a 32×32 shared tile so reads and writes are both coalesced.
__global__ void reverse_transpose_kernel(const float* Linv /*[k, k] col-major*/, int64_t k, float* U /*[k, k]*/) {
  __shared__ float tile[32][33];
  const int64_t i0 = blockIdx.x * 32, j0 = blockIdx.y * 32;
  for (int y = threadIdx.y; y < 32; y += blockDim.y) {
    const int64_t i = i0 + threadIdx.x, j = j0 + y;
    float v = 0.0f;
    if (i < k && j < k && j >= i) v = Linv[(k - 1 - i) + (k - 1 - j) * k];
    tile[y][threadIdx.x] = v;
  }
  __syncthreads();
  for (int y = threadIdx.y; y < 32; y += blockDim.y) {
    const int64_t i = i0 + y, j = j0 + threadIdx.x;
    if (i < k && j < k) U[i * k + j] = tile[threadIdx.x][y];
  }
}

// Wt[p, r] = W[r, src[p]] (0 for a dead column, src < 0): transpose into processing order.
__global__ void gather_weights_kernel(const float* W /*[n, k]*/, const int32_t* src /*[k]*/, int64_t n, int64_t k,
                                      float* Wt /*[k, n]*/) {
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
    if (p < k && r < n) Wt[p * n + r] = tile[threadIdx.x][y];
  }
}

// M_g = U_gg⁻¹ [g, g] row-major upper (zeros below) for every processing-order group (one CTA per
// group, one column per thread, back substitution): the weighting of Marlin's clip objective.
__global__ void group_inverse_kernel(const float* U /*[k, k]*/, int64_t k, int g, float* M /*[G, g, g]*/) {
  const int64_t base = int64_t(blockIdx.x) * g;
  float* Mg = M + int64_t(blockIdx.x) * g * g;
  for (int u = threadIdx.x; u < g; u += blockDim.x) {
    for (int t = g - 1; t > u; --t) Mg[t * g + u] = 0.0f;
    for (int t = u; t >= 0; --t) {
      const float* urow = U + (base + t) * k + base;
      float acc = t == u ? 1.0f : 0.0f;
      for (int l = t + 1; l <= u; ++l) acc -= urow[l] * Mg[l * g + u];
      Mg[t * g + u] = acc / urow[t];
    }
  }
}

// ---- group scales ----------------------------------------------------------------------------------

// Row index (in Wt) of member t of the group being fitted: consecutive processing rows, or a list
// (static groups gather their natural columns from wherever the order put them).
__device__ __forceinline__ int64_t group_row(const int32_t* rows, int64_t p0, int t) {
  return rows ? int64_t(rows[t]) : p0 + t;
}

__device__ __forceinline__ void store_scale(float s, int64_t srow, int64_t n, int64_t r, float* S, uint16_t* Sh) {
  S[srow * n + r] = s;
  Sh[srow * n + r] = __half_as_ushort(__float2half_rn(s));
}

// Plain absmax scales (no clip search) for one group.
__global__ void absmax_scale_kernel(const float* Wt, int64_t n, const int32_t* rows, int64_t p0, int g, int bits,
                                    int64_t srow, float* S /*[G, n]*/, uint16_t* Sh /*[G, n]*/) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= n) return;
  float a = 0.0f;
  for (int t = 0; t < g; ++t) a = fmaxf(a, fabsf(Wt[group_row(rows, p0, t) * n + r]));
  store_scale(d_sym_scale(a, bits), srow, n, r, S, Sh);
}

// Hessian-weighted clip search (gptq.md §2.1) for one group, all candidates of 16 rows per CTA:
// error(p) = ‖Mᵀ·δ_p‖², δ_p = Q_p(x) − x; M upper (U_gg⁻¹, Schur objective) or lower (chol(H_gg),
// static groups). Ties keep the larger shrink factor (the earlier candidate), as the CPU does.
// Launch: g threads (g % 16 == 0, g <= kClipMaxGroup), dynamic shared memory clip_smem_bytes(g).
__host__ __device__ constexpr size_t clip_smem_bytes(int g) {
  return sizeof(float) * (size_t(g) * g + size_t(g) * kClipRows + size_t(g) * kClipPairs +
                          size_t(g / 16) * kClipPairs + kClipPairs + 3 * kClipRows);
}

template <bool kUpper>
__global__ void clip_search_kernel(const float* Wt, int64_t n, const int32_t* rows, int64_t p0, int g,
                                   const float* M /*[g, g]*/, int bits, int grid, int candidates, int64_t srow,
                                   float* S, uint16_t* Sh) {
  extern __shared__ float sm[];
  float* Ms = sm;                          // [g, g]
  float* X = Ms + g * g;                   // [g, kClipRows] the group's weights
  float* D = X + g * kClipRows;            // [g, kClipPairs] candidate errors δ
  float* red = D + g * kClipPairs;         // [g/16, kClipPairs] partial error sums
  float* err = red + (g / 16) * kClipPairs;  // [kClipPairs]
  float* amax = err + kClipPairs;          // [kClipRows]
  float* best = amax + kClipRows;          // [kClipRows]
  float* best_s = best + kClipRows;        // [kClipRows]
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t r0 = int64_t(blockIdx.x) * kClipRows;
  for (int i = tid; i < g * g; i += nt) Ms[i] = M[i];
  for (int i = tid; i < g * kClipRows; i += nt) {
    const int t = i / kClipRows, rr = i % kClipRows;
    X[i] = r0 + rr < n ? Wt[group_row(rows, p0, t) * n + r0 + rr] : 0.0f;
  }
  __syncthreads();
  if (tid < kClipRows) {
    float a = 0.0f;
    for (int t = 0; t < g; ++t) a = fmaxf(a, fabsf(X[t * kClipRows + tid]));
    amax[tid] = a;
    best[tid] = INFINITY;
    best_s[tid] = d_sym_scale(a, bits);
  }
  __syncthreads();
  const int pg = tid % 16;           // pair group: pairs 4·pg .. 4·pg+3
  const int j = tid / 16;            // chunk pair index: chunks j and nch−1−j of 8 columns of Mᵀδ
  const int nch = g / 8;
  for (int c0 = 0; c0 < candidates; c0 += kClipCandPass) {
    // Pair q = cand·kClipRows + row.
    for (int i = tid; i < g * kClipPairs; i += nt) {
      const int t = i / kClipPairs, q = i % kClipPairs, rr = q % kClipRows, c = c0 + q / kClipRows;
      float d = 0.0f;
      if (c < candidates) {
        const float s = d_sym_scale(d_shrink(c, grid) * amax[rr], bits);
        d = d_delta(X[t * kClipRows + rr], s, bits);
      }
      D[i] = d;
    }
    __syncthreads();
    float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int half = 0; half < 2; ++half) {
      const int ch = half == 0 ? j : nch - 1 - j, u0 = ch * 8;
      float acc[4][8];
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 8; ++b) acc[a][b] = 0.0f;
      // Upper M: (Mᵀδ)_u = Σ_{t ≤ u} M[t, u]·δ_t; lower: Σ_{t ≥ u}.
      const int tb = kUpper ? 0 : u0, te = kUpper ? u0 + 8 : g;
      for (int t = tb; t < te; ++t) {
        const float4 dv = *reinterpret_cast<const float4*>(D + t * kClipPairs + 4 * pg);
        const float4 m0 = *reinterpret_cast<const float4*>(Ms + t * g + u0);
        const float4 m1 = *reinterpret_cast<const float4*>(Ms + t * g + u0 + 4);
        const float dd[4] = {dv.x, dv.y, dv.z, dv.w}, mm[8] = {m0.x, m0.y, m0.z, m0.w, m1.x, m1.y, m1.z, m1.w};
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
          for (int b = 0; b < 8; ++b) acc[a][b] = fmaf(mm[b], dd[a], acc[a][b]);
      }
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 8; ++b) part[a] = fmaf(acc[a][b], acc[a][b], part[a]);
    }
#pragma unroll
    for (int a = 0; a < 4; ++a) red[j * kClipPairs + 4 * pg + a] = part[a];
    __syncthreads();
    for (int q = tid; q < kClipPairs; q += nt) {  // g may be < 64 threads
      float e = 0.0f;
      for (int jj = 0; jj < nch / 2; ++jj) e += red[jj * kClipPairs + q];
      err[q] = e;
    }
    __syncthreads();
    if (tid < kClipRows && amax[tid] != 0.0f) {
      for (int cc = 0; cc < kClipCandPass && c0 + cc < candidates; ++cc) {
        const float e = err[cc * kClipRows + tid];
        if (e < best[tid]) {
          best[tid] = e;
          best_s[tid] = d_sym_scale(d_shrink(c0 + cc, grid) * amax[tid], bits);
        }
      }
    }
    __syncthreads();
  }
  if (tid < kClipRows && r0 + tid < n) store_scale(best_s[tid], srow, n, r0 + tid, S, Sh);
}

// Any group length (slow path for groups the tiled kernel does not cover): one thread per row,
// δ recomputed inside the double loop. M is dense-indexed; its zero triangle just adds zeros.
__global__ void clip_search_generic_kernel(const float* Wt, int64_t n, const int32_t* rows, int64_t p0, int g,
                                           const float* M /*[g, g]*/, int bits, int grid, int candidates,
                                           int64_t srow, float* S, uint16_t* Sh) {
  const int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= n) return;
  float a = 0.0f;
  for (int t = 0; t < g; ++t) a = fmaxf(a, fabsf(Wt[group_row(rows, p0, t) * n + r]));
  float bs = d_sym_scale(a, bits), be = INFINITY;
  if (a != 0.0f)
    for (int c = 0; c < candidates; ++c) {
      const float s = d_sym_scale(d_shrink(c, grid) * a, bits);
      float e = 0.0f;
      for (int u = 0; u < g; ++u) {
        float acc = 0.0f;
        for (int t = 0; t < g; ++t) acc = fmaf(M[t * g + u], d_delta(Wt[group_row(rows, p0, t) * n + r], s, bits), acc);
        e = fmaf(acc, acc, e);
      }
      if (e < be) { be = e; bs = s; }
    }
  store_scale(bs, srow, n, r, S, Sh);
}

// ---- the column loop -------------------------------------------------------------------------------

// Saliency pruning of one 2:4 group, as gptq::prune_24: the 2 smallest w²/d² (ties: lower index).
__device__ __forceinline__ unsigned d_prune_24(const float w[4], const float d[4]) {
  float s[4];
  for (int t = 0; t < 4; ++t) s[t] = __fdiv_rn(__fmul_rn(w[t], w[t]), __fmul_rn(d[t], d[t]));
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
  float* Wt;              // [k, n] working weights, processing order
  const float* U;         // [k, k] row-major upper factor
  const float* S;         // [G, n] current scales (fp16-rounded floats)
  const int32_t* srow;    // [k] scale row of each processing position
  const int32_t* perm;    // [k] processing position -> original column
  uint8_t* codes;         // [k, n] original order
  uint8_t* mask;          // [k, n] original order, or null (dense)
  float* E;               // [B, n] scaled errors of the current block
  double* loss;           // [n] Σ err² per row
  int64_t n, k, i1, i2, p0, p1;
  int bits;
  bool smem;              // block columns [p0, i2) staged in shared memory
};

// Columns [p0, p1) of the lazy block [i1, i2), one output row per thread: quantize (2:4 decisions at
// every 4th column), scaled error e = (w − q)/U_pp, rank-1 OBS update of the block's later columns.
// Sequential in p by construction (column p needs every earlier column's feedback).
__global__ void column_loop_kernel(LoopArgs a) {
  extern __shared__ float tile[];  // [i2 − p0, kLoopThreads] when a.smem
  const int lane = threadIdx.x;
  const int64_t r = blockIdx.x * int64_t(kLoopThreads) + lane;
  if (r >= a.n) return;  // rows are independent: no block-wide synchronisation below
  const int64_t n = a.n, k = a.k;
  float* base = a.smem ? tile + lane : a.Wt + a.p0 * n + r;
  const int64_t ld = a.smem ? kLoopThreads : n;
  if (a.smem)
    for (int64_t t = a.p0; t < a.i2; ++t) base[(t - a.p0) * ld] = a.Wt[t * n + r];
  double l = 0.0;
  unsigned pruned = 0;
  for (int64_t p = a.p0; p < a.p1; ++p) {
    float* wp = base + (p - a.p0) * ld;
    if (a.mask && (p & 3) == 0) {
      float ww[4], dd[4];
      for (int t = 0; t < 4; ++t) {
        ww[t] = wp[t * ld];
        dd[t] = a.U[(p + t) * k + p + t];
      }
      pruned = d_prune_24(ww, dd);
    }
    const float w = *wp, s = a.S[int64_t(a.srow[p]) * n + r], d = a.U[p * k + p];
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
    const float err = __fdiv_rn(__fsub_rn(w, d_dequant(code, s, a.bits)), d);
    a.E[(p - a.i1) * n + r] = err;
    l += double(err) * double(err);
    const float* urow = a.U + p * k;
    for (int64_t t = p + 1; t < a.i2; ++t) {
      float* x = base + (t - a.p0) * ld;
      *x = __fsub_rn(*x, __fmul_rn(__ldg(urow + t), err));
    }
  }
  if (a.smem)
    for (int64_t t = a.p0; t < a.i2; ++t) a.Wt[t * n + r] = base[(t - a.p0) * ld];
  a.loss[r] += l;
}

// U := I (the RTN fallback when every damping failed): H⁻¹ treated as the identity.
__global__ void set_identity_kernel(float* U /*[k, k]*/, int64_t k) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, i = blockIdx.y;
  if (j < k) U[i * k + j] = i == j ? 1.0f : 0.0f;
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
