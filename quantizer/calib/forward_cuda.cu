// The calibration forward pass on the GPU: see forward_cuda.h. The arithmetic follows
// LlamaModel::block_forward (llama.cpp) step for step; what differs is only where values are rounded:
// the linears and attention products read 16-bit inputs (fp32 accumulation, fp32 outputs), the
// residual stream, norms, RoPE and softmax stay fp32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>

#include "kernels/marlin.h"
#include "quantizer/calib/forward_cuda.h"
#include "quantizer/cuda_util.cuh"

#define FWD_CHECK(call) ::marlinc::cuda_util::check((call), #call, __FILE__, __LINE__, who)

namespace marlinc::calib {

namespace {

using cuda_util::DBuf;

constexpr int kThreads = 256;
constexpr int kLinears = 7;

unsigned blocks_for(int64_t count, int threads = kThreads) { return unsigned((count + threads - 1) / threads); }

// ---- element conversions --------------------------------------------------------------------------

template <class T> __device__ __forceinline__ T to_act(float x);
template <> __device__ __forceinline__ __half to_act<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 to_act<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float load_raw(const void* src, int64_t i, int dt) {  // dt: 0 f32, 1 f16, 2 bf16
  if (dt == 0) return static_cast<const float*>(src)[i];
  if (dt == 1) return __half2float(static_cast<const __half*>(src)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(src)[i]);
}

// ---- kernels ---------------------------------------------------------------------------------------

// Checkpoint bytes [out, in] (any float type) into the block's 16-bit weight [out, in].
template <class T>
__global__ void convert_kernel(const void* src, int dt, int64_t count, T* dst) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = to_act<T>(load_raw(src, i, dt));
}

// A quantized linear [k, n] dequantized (QuantizedLinear::weight) and transposed into [n, k] 16-bit.
struct DequantArgs {
  const uint8_t* codes;    // [k, n]
  const uint16_t* scales;  // [G, n]
  const uint8_t* zeros;    // [G, n] or null (symmetric)
  const int32_t* g_idx;    // [k] or null
  const uint8_t* mask;     // [k, n] or null
  int64_t k, n;
  int bits, group_size;
  bool bf16_scales;
};
template <class T>
__global__ void dequant_transpose_kernel(DequantArgs a, T* w /*[n, k]*/) {
  __shared__ float tile[32][33];
  const int64_t r0 = int64_t(blockIdx.y) * 32, c0 = int64_t(blockIdx.x) * 32;  // rows of codes (k), cols (n)
  for (int dy = threadIdx.y; dy < 32; dy += blockDim.y) {
    const int64_t r = r0 + dy, c = c0 + threadIdx.x;
    if (r >= a.k || c >= a.n) continue;
    const int64_t i = r * a.n + c;
    float v = 0.0f;
    if (!a.mask || a.mask[i]) {
      const int64_t g = a.g_idx ? a.g_idx[r] : a.group_size > 0 ? r / a.group_size : 0;
      const int zero = a.zeros ? int(a.zeros[g * a.n + c]) : 1 << (a.bits - 1);
      const uint16_t sb = a.scales[g * a.n + c];
      const float sc = a.bf16_scales ? __uint_as_float(uint32_t(sb) << 16) : __half2float(__ushort_as_half(sb));
      v = __fmul_rn(float(int(a.codes[i]) - zero), sc);
    }
    tile[dy][threadIdx.x] = v;
  }
  __syncthreads();
  for (int dy = threadIdx.y; dy < 32; dy += blockDim.y) {
    const int64_t o = c0 + dy, i = r0 + threadIdx.x;
    if (o < a.n && i < a.k) w[o * a.k + i] = to_act<T>(tile[threadIdx.x][dy]);
  }
}

// Block-wide sum of one float per thread (blockDim.x a multiple of 32, at most 1024).
__device__ float block_sum(float v) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float t = 0.0f;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) t += part[w];
  return t;
}

// 1 / sqrt(mean(xr²) + eps) of one row [n], by the whole block.
__device__ float row_inv_rms(const float* xr, int64_t n, float eps) {
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) ss += xr[j] * xr[j];
  return 1.0f / sqrtf(block_sum(ss) / float(n) + eps);
}

// Gemma 2/3's output norms: y[r] += w ⊙ x[r] / sqrt(mean(x[r]²) + eps), x the sub-block's fp32 output,
// y the fp32 residual stream. One block per row.
__global__ void rms_norm_add_kernel(const float* x /*[rows, n]*/, int64_t n, const float* w, float eps, float* y) {
  const float* xr = x + int64_t(blockIdx.x) * n;
  const float inv = row_inv_rms(xr, n, eps);
  float* yr = y + int64_t(blockIdx.x) * n;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] += w[j] * (xr[j] * inv);
}

// y[r] = w ⊙ x[r] / sqrt(mean(x[r]²) + eps), one block per row, into the GEMM input type.
template <class T>
__global__ void rms_norm_kernel(const float* x /*[rows, n]*/, int64_t n, const float* w, float eps, T* y) {
  const float* xr = x + int64_t(blockIdx.x) * n;
  const float inv = row_inv_rms(xr, n, eps);
  T* yr = y + int64_t(blockIdx.x) * n;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] = to_act<T>(w[j] * (xr[j] * inv));
}

// Where each token of the calibration set sits: its sample's first token and length, its position.
struct TokenMap {
  const int64_t* start;  // [T] global index of the sample's first token
  const int32_t* len;    // [T]
  const int32_t* pos;    // [T] position within the sample (0-based)
};

// q/k/v projections [Tc, heads·hd] fp32 -> bias, per-head RMSNorm (Qwen3), RoPE (rotate_half pairs
// (i, i + rot/2) for i < rot/2; dims from rot on pass through: Phi's partial rotary, SmolLM3's NoPE layers
// with rot 0), into the attention
// layout: per sample, per head, [len, hd] 16-bit. One block per (token, head of q|k|v); thread i < hd/2
// owns elements i and i + hd/2 (one rotation pair when rot == hd; through shared memory when rot < hd).
struct QkvArgs {
  const float *q, *k, *v;                    // [Tc, H·hd], [Tc, KV·hd], [Tc, KV·hd]
  const float *qb, *kb, *vb;                 // biases or null
  const float *qn, *kn;                      // q/k norm weights [hd] or null
  const float *cosv, *sinv;                  // [max_len, rot/2]
  const float *cosv_long, *sinv_long;        // longrope's table for samples longer than long_after, or null
  int64_t long_after;
  int64_t t0;                                // global index of the chunk's first token
  int heads, kv_heads, hd, rot;
  float eps;
};
template <class T>
__global__ void qkv_rope_kernel(QkvArgs a, TokenMap tm, T* Qt, T* Kt, T* Vt) {
  const int64_t t = blockIdx.x;  // chunk-relative token
  const int hh = blockIdx.y;     // 0..H-1 q, then KV k heads, then KV v heads
  const int i = threadIdx.x, half = a.hd / 2;
  const int64_t g = a.t0 + t;
  const int64_t s0 = tm.start[g] - a.t0;  // the sample's first token, chunk-relative
  const int64_t L = tm.len[g], p = tm.pos[g];
  // transformers picks longrope's table per forward by its length: here per sample.
  const bool long_table = a.cosv_long && L > a.long_after;
  const float* cosv = long_table ? a.cosv_long : a.cosv;
  const float* sinv = long_table ? a.sinv_long : a.sinv;
  const float *src, *bias, *nw;
  T* dst;
  int head, nheads;
  if (hh < a.heads) {
    head = hh; nheads = a.heads; src = a.q; bias = a.qb; nw = a.qn; dst = Qt;
  } else if (hh < a.heads + a.kv_heads) {
    head = hh - a.heads; nheads = a.kv_heads; src = a.k; bias = a.kb; nw = a.kn; dst = Kt;
  } else {
    head = hh - a.heads - a.kv_heads; nheads = a.kv_heads; src = a.v; bias = a.vb; nw = nullptr; dst = Vt;
  }
  const int64_t col = int64_t(head) * a.hd;
  const float* row = src + t * int64_t(nheads) * a.hd + col;
  // The block is rounded up to whole warps for block_sum; the extra threads only add zeros.
  const bool mine = i < half;
  float x0 = mine ? row[i] : 0.0f, x1 = mine ? row[i + half] : 0.0f;
  if (bias && mine) { x0 += bias[col + i]; x1 += bias[col + i + half]; }
  const bool is_v = hh >= a.heads + a.kv_heads;
  if (!is_v && nw) {  // uniform per block: every thread reaches block_sum
    const float inv = 1.0f / sqrtf(block_sum(x0 * x0 + x1 * x1) / float(a.hd) + a.eps);
    if (mine) {
      x0 = nw[i] * (x0 * inv);
      x1 = nw[i + half] * (x1 * inv);
    }
  }
  if (!is_v && a.rot != a.hd) {  // uniform per block: every thread reaches the barriers
    extern __shared__ float head[];  // [hd] the normalised head, for pairs that cross threads
    if (mine) { head[i] = x0; head[i + half] = x1; }
    __syncthreads();
    const int rh = a.rot / 2;
    auto rotated = [&](int e) {  // element e after RoPE: pair (j, j + rh) for e < rot, else as it is
      if (e >= a.rot) return head[e];
      const int j = e < rh ? e : e - rh;
      const float co = cosv[p * rh + j], si = sinv[p * rh + j];
      return e < rh ? head[j] * co - head[j + rh] * si : head[j + rh] * co + head[j] * si;
    };
    if (mine) { x0 = rotated(i); x1 = rotated(i + half); }
  }
  if (!mine) return;
  if (!is_v && a.rot == a.hd) {
    const float co = cosv[p * half + i], si = sinv[p * half + i];
    const float r0 = x0 * co - x1 * si, r1 = x1 * co + x0 * si;
    x0 = r0; x1 = r1;
  }
  T* out = dst + s0 * int64_t(nheads) * a.hd + (int64_t(head) * L + p) * a.hd;
  out[i] = to_act<T>(x0);
  out[i + half] = to_act<T>(x1);
}

// Rows of scores S [rows, L] (already scaled): causal (and windowed) softmax into P [rows, L] 16-bit,
// zero outside the mask. Row r is query position r mod L. One block per row. softcap > 0 first maps
// each score to softcap·tanh(score / softcap) in place (Gemma 2).
template <class T>
__global__ void softmax_kernel(float* S, int64_t L, int64_t window, float softcap, T* P) {
  const int64_t r = blockIdx.x, i = r % L;
  const int64_t lo = i - window + 1 > 0 ? i - window + 1 : 0;
  float* s = S + r * L;
  T* p = P + r * L;
  __shared__ float red[32];
  if (softcap > 0.0f) {  // each thread rewrites the entries it reads below
    for (int64_t j = lo + threadIdx.x; j <= i; j += blockDim.x) s[j] = softcap * tanhf(s[j] / softcap);
    __syncthreads();  // the last loop reads the row in another partition
  }
  float mx = -INFINITY;
  for (int64_t j = lo + threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, s[j]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
  __syncthreads();
  mx = -INFINITY;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) mx = fmaxf(mx, red[w]);
  float sum = 0.0f;
  for (int64_t j = lo + threadIdx.x; j <= i; j += blockDim.x) sum += expf(s[j] - mx);
  const float inv = 1.0f / block_sum(sum);
  for (int64_t j = threadIdx.x; j < L; j += blockDim.x)
    p[j] = to_act<T>(j >= lo && j <= i ? expf(s[j] - mx) * inv : 0.0f);
}

// Attention outputs in the per-sample head layout (fp32) back to token rows [Tc, H·hd] 16-bit, the
// o_proj input.
template <class T>
__global__ void gather_heads_kernel(const float* Ot, TokenMap tm, int64_t t0, int64_t tc, int heads, int hd, T* out) {
  const int64_t width = int64_t(heads) * hd;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < tc * width; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / width, c = e % width, h = c / hd, d = c % hd;
    const int64_t g = t0 + t, s0 = tm.start[g] - t0, L = tm.len[g], p = tm.pos[g];
    out[e] = to_act<T>(Ot[s0 * width + (h * L + p) * hd + d]);
  }
}

// y [rows, n] += b [n].
__global__ void add_bias_kernel(float* y, const float* b, int64_t rows, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < rows * n; e += int64_t(gridDim.x) * blockDim.x)
    y[e] += b[e % n];
}

// down_proj's input: act(gate) · up, as the CPU pass forms it (llama.cpp's activation_ref): silu
// g / (1 + e^-g), tanh gelu ½g(1 + tanh(√(2/π)(g + 0.044715 g³))) or exact gelu ½g(1 + erf(g/√2)).
template <class T>
__global__ void glu_kernel(const float* g, const float* u, int64_t count, GpuActivation a, T* out) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f, kInvSqrt2 = 0.7071067811865476f;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < count; e += int64_t(gridDim.x) * blockDim.x) {
    const float x = g[e];
    const float y = a == GpuActivation::Silu       ? x / (1.0f + expf(-x))
                    : a == GpuActivation::GeluTanh ? 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kCubic * x * x * x)))
                                                   : 0.5f * x * (1.0f + erff(x * kInvSqrt2));
    out[e] = to_act<T>(y * u[e]);
  }
}

// y [count] = beta·y + c (the Marlin kernel's 16-bit output widened into the fp32 stream).
template <class T>
__global__ void widen_add_kernel(float* y, float beta, const T* c, int64_t count) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < count; e += int64_t(gridDim.x) * blockDim.x)
    y[e] = (beta != 0.0f ? beta * y[e] : 0.0f) + float(c[e]);
}

// y [count] += a·x (Granite's scaled residual add).
__global__ void scaled_add_kernel(float* y, float a, const float* x, int64_t count) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < count; e += int64_t(gridDim.x) * blockDim.x)
    y[e] += a * x[e];
}

// An MoE block's gathered inputs: out[i] = x[rows[i]], rows of n elements (each expert's tokens together).
template <class T>
__global__ void gather_rows_kernel(const T* x, const int32_t* rows, int64_t count, int64_t n, T* out) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < count * n; e += int64_t(gridDim.x) * blockDim.x)
    out[e] = x[int64_t(rows[e / n]) * n + e % n];
}

// An MoE block's output into the residual stream: h[t] += Σ_j w[t, j]·y[pos[t, j]] (j in expert index order,
// as the CPU pass sums) + sigmoid(sg[t])·ys[t] when there is a shared expert (ys non-null).
struct CombineArgs {
  const float* y;      // [rows, n] the routed experts' outputs, in gathered order
  const int32_t* pos;  // [tokens, top_k] each pick's row in y
  const float* w;      // [tokens, top_k] its routing weight
  const float *ys, *sg;  // [tokens, n], [tokens] the shared expert's output and gate logit, or null
  int64_t tokens, n;
  int top_k;
};
__global__ void moe_combine_kernel(CombineArgs a, float* h) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < a.tokens * a.n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / a.n, d = e % a.n;
    float o = 0.0f;
    for (int j = 0; j < a.top_k; ++j) o += a.w[t * a.top_k + j] * a.y[int64_t(a.pos[t * a.top_k + j]) * a.n + d];
    if (a.ys) o += (1.0f / (1.0f + expf(-a.sg[t]))) * a.ys[e];
    h[e] += o;
  }
}

__global__ void nonfinite_kernel(const float* x, int64_t count, int* flag) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < count; e += int64_t(gridDim.x) * blockDim.x)
    if (!isfinite(x[e])) *flag = 1;
}

// Grid for the grid-stride kernels: enough blocks to fill the GPU, never more than the work.
unsigned stride_grid(int64_t count) { return std::max(1u, std::min(blocks_for(count), 65535u * 4)); }


}  // namespace

// ---- state -----------------------------------------------------------------------------------------

namespace {
enum : int { kQ, kK, kV, kO, kGate, kUp, kDown };       // llama.h's Linear
enum : int { kGQKV, kGO, kGGateUp, kGDown, kGroups };   // llama.h's LinearInput
constexpr int kSlots = kGpuSharedGate + 1;               // the seven, the router, the shared-expert gate
static_assert(kGpuRouter == kLinears, "the router follows llama.h's seven linears");
const char* const kLinearNames[kSlots] = {"q_proj",   "k_proj",  "v_proj",   "o_proj",           "gate_proj",
                                          "up_proj",  "down_proj", "router", "shared_expert_gate"};

// One linear's weights on the device: 16-bit [out, in] for cuBLAS, or Marlin's packed tiles.
struct Slot {
  DBuf<uint16_t> W;   // [out, in] 16-bit
  DBuf<int32_t> mB;   // Marlin tiles [in/16, 2·out]
  DBuf<uint16_t> mS;  // permuted scales [G, out]
  int group = -1;
  bool marlin = false;
  bool loaded() const { return W.p || marlin; }
};
constexpr int kVecs = int(GpuVec::MlpOutNorm) + 1;
const char* const kVecNames[kVecs] = {"input_layernorm", "the MLP's input norm", "q_norm", "k_norm",
                                      "q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias",
                                      "gate_proj.bias", "up_proj.bias", "down_proj.bias",
                                      "the attention's output norm", "the MLP's output norm"};
}  // namespace

struct CudaForward::Impl {
  GpuDims c;
  GpuAct act = GpuAct::F16;
  std::string who = "gpu forward";
  std::vector<size_t> len;   // [samples]
  std::vector<int64_t> off;  // [samples + 1] prefix sums
  struct Chunk { size_t s0, s1; int64_t t0, tc; };
  std::vector<Chunk> chunks;
  int64_t T = 0, max_len = 0, max_chunk = 0, kv_batch = 1;

  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;

  DBuf<float> hidden;                      // [T, hidden]
  DBuf<int64_t> tok_start;                 // [T]
  DBuf<int32_t> tok_len, tok_pos;          // [T]
  DBuf<float> cosv, sinv;                  // [max_len, hd/2]
  DBuf<float> cosv_local, sinv_local;      // [max_len, rot/2] the local table, or empty
  DBuf<float> cosv_long, sinv_long;        // [max_len, rot/2] longrope's long table, or empty
  bool layer_sliding = true, layer_local = false, layer_rope = true;  // set_layer
  bool layer_moe = false;
  bool experts_see_all = false;            // set_experts_see_all
  std::array<Slot, kSlots> dense;          // the block's linears, a dense MLP's, the router, the shared gate
  std::unique_ptr<std::array<Slot, 3>[]> routed;  // [experts] gate, up, down of each routed expert
  std::array<Slot, 3> shared;              // Qwen2-MoE's shared expert
  DBuf<uint8_t> m_work;                    // the kernel's workspace (locks zeroed once)
  DBuf<uint16_t> m_out;                    // its 16-bit output [rows, out], the largest call's so far
  int sms = 0;
  std::array<DBuf<float>, kVecs> vec;      // norms and biases
  std::array<bool, kVecs> has_vec{};
  DBuf<uint8_t> staging;                   // raw weight bytes on their way to W
  // Σ x xᵀ per (group, MLP: kGpuDenseMlp, a routed expert, kGpuSharedExpert) and the rows in each.
  std::map<std::pair<int, int32_t>, DBuf<float>> hess;
  std::map<std::pair<int, int32_t>, int64_t> hess_rows;
  // Per-chunk scratch, sized for the largest chunk and kept across blocks.
  DBuf<float> res;                         // [tc, hidden] working copy when not updating
  DBuf<uint16_t> xin;                      // [tc, max(hidden, qd)] 16-bit GEMM input
  DBuf<float> qf, kf, vf;                  // [tc, qd], [tc, kvd], [tc, kvd]
  DBuf<uint16_t> Qt, Kt, Vt;               // attention layout
  DBuf<float> S, Ot;                       // scores [kv_batch·g·L·L], outputs [tc, qd] (head layout)
  DBuf<uint16_t> P;                        // probabilities
  DBuf<float> gate, up;                    // [tc, inter]
  DBuf<float> sub;                         // [tc, hidden] a sub-block's output before its norm (Gemma 2/3)
  DBuf<uint16_t> act16;                    // [tc, inter]
  // MoE scratch: the router's logits, the routing on the host and on the device, the gathered rows.
  DBuf<float> logits;                      // [tc, experts]
  std::vector<float> h_logits, h_weight;   // [tc, experts], [tc, top_k]
  std::vector<int32_t> h_expert, h_route;  // [tc, top_k] picks; perm [tc·top_k] | pos [tc, top_k]
  std::vector<float> h_cw;                 // [tc, top_k] weights in expert order
  std::vector<int64_t> first;              // [experts + 1] each expert's first gathered row
  DBuf<int32_t> route;                     // perm | pos on the device
  DBuf<float> cw;                          // [tc, top_k]
  DBuf<uint16_t> xg;                       // [tc·top_k, hidden] gathered 16-bit inputs
  DBuf<float> yg;                          // [tc·top_k, hidden] the experts' outputs
  DBuf<float> sg;                          // [tc] the shared-expert gate's logits
  DBuf<int> flag;
  // Event pairs around the Hessian GEMMs of the current run, summed after it synchronises.
  std::vector<cudaEvent_t> events;
  size_t events_used = 0;
  double gram_seconds = 0;
  cudaEvent_t next_event() {
    if (events_used == events.size()) {
      cudaEvent_t e = nullptr;
      FWD_CHECK(cudaEventCreate(&e));
      events.push_back(e);
    }
    return events[events_used++];
  }

  int64_t qd() const { return c.heads * c.head_dim; }
  int64_t kvd() const { return c.kv_heads * c.head_dim; }
  cudaDataType dtype() const { return act == GpuAct::F16 ? CUDA_R_16F : CUDA_R_16BF; }
  // The intermediate size of MLP `expert`.
  static int64_t inter_of(const GpuDims& c, int32_t expert) {
    return expert == kGpuDenseMlp ? c.intermediate : expert == kGpuSharedExpert ? c.shared_intermediate : c.expert_intermediate;
  }
  static int64_t in_of(const GpuDims& c, int g, int32_t expert = kGpuDenseMlp) {
    return g == kGO ? c.heads * c.head_dim : g == kGDown ? inter_of(c, expert) : c.hidden;
  }
  std::pair<int64_t, int64_t> shape(int l, int32_t expert = kGpuDenseMlp) const {  // {out, in}
    switch (l) {
      case kQ: return {qd(), c.hidden};
      case kK: case kV: return {kvd(), c.hidden};
      case kO: return {c.hidden, qd()};
      case kGate: case kUp: return {inter_of(c, expert), c.hidden};
      case kDown: return {c.hidden, inter_of(c, expert)};
      case kGpuRouter: return {c.experts, c.hidden};
      default: return {1, c.hidden};  // kGpuSharedGate
    }
  }
  // "q_proj", "experts.5.up_proj", "shared_expert.down_proj": names in errors.
  static std::string label(int l, int32_t expert) {
    const std::string n = kLinearNames[l];
    return expert == kGpuDenseMlp ? n : expert == kGpuSharedExpert ? "shared_expert." + n
                                                                    : "experts." + std::to_string(expert) + "." + n;
  }
  // The slot of linear l of MLP `expert`; BadUsage for an index the configuration does not have.
  Slot& slot(int l, int32_t expert) {
    const bool mlp = l == kGate || l == kUp || l == kDown;
    if (l < 0 || l >= kSlots || (expert != kGpuDenseMlp && !mlp) || expert < kGpuSharedExpert ||
        (expert >= 0 && expert >= c.experts) || (expert == kGpuSharedExpert && c.shared_intermediate == 0) ||
        ((l == kGpuRouter || l == kGpuSharedGate) && c.experts == 0) || (l == kGpuSharedGate && c.shared_intermediate == 0))
      bad_usage(who + ": no linear " + std::to_string(l) + " of MLP " + std::to_string(expert) + " in this model");
    if (expert == kGpuDenseMlp) return dense[size_t(l)];
    return (expert == kGpuSharedExpert ? shared : routed[size_t(expert)])[size_t(l - kGate)];
  }
  int64_t vec_len(GpuVec v) const {
    switch (v) {
      case GpuVec::InputNorm: case GpuVec::PostNorm: case GpuVec::AttnOutNorm: case GpuVec::MlpOutNorm: return c.hidden;
      case GpuVec::QNorm: case GpuVec::KNorm: return c.head_dim;
      default: return shape(int(v) - int(GpuVec::BiasQ)).first;  // the dense linears' biases
    }
  }
  const float* vec_or_null(GpuVec v) const { return has_vec[size_t(v)] ? vec[size_t(v)].p : nullptr; }

  // Y [rows, out] fp32 (= beta·Y +) X [rows, in] · W[l]ᵀ (+ bias). Row-major X is column-major
  // [in, rows] and W [out, in] is column-major [in, out], so Yᵀ = op_T(W)·X in cuBLAS's terms.
  void linear(int l, const void* X, int64_t rows, float* Y, float beta, bool with_bias = true,
              int32_t expert = kGpuDenseMlp) {
    const auto [out, in] = shape(l, expert);
    const float one = 1.0f;
    Slot& w = slot(l, expert);
    if (w.marlin) {
      marlin_linear(l, expert, X, rows, Y, beta);
    } else {
      FWD_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(out), int(rows), int(in), &one, w.W.p, dtype(), int(in),
                             X, dtype(), int(in), &beta, Y, CUDA_R_32F, int(out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    // Only the block's own linears have biases (experts, the router and the shared gate have none).
    const float* b = with_bias && l < kLinears && expert == kGpuDenseMlp ? vec_or_null(GpuVec(int(GpuVec::BiasQ) + l))
                                                                          : nullptr;
    if (b) {
      add_bias_kernel<<<stride_grid(rows * out), kThreads, 0, stream>>>(Y, b, rows, out);
      FWD_CHECK(cudaGetLastError());
    }
  }
  void marlin_linear(int l, int32_t expert, const void* X, int64_t rows, float* Y, float beta) {
    const auto [out, in] = shape(l, expert);
    const Slot& w = slot(l, expert);
    if (!sms) FWD_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const size_t ws = kernels::marlin_workspace_bytes(sms, false);
    if (m_work.count < ws) {
      m_work.reserve(ws, who + ": Marlin workspace");
      FWD_CHECK(cudaMemsetAsync(m_work.p, 0, ws, stream));  // the kernel leaves its locks zero again
    }
    m_out.reserve(size_t(rows * out), who + ": Marlin output");
    kernels::MarlinGemm g;
    g.A = X;
    g.B = w.mB.p;
    g.s = w.mS.p;
    g.C = m_out.p;
    g.m = int(rows);
    g.n = int(out);
    g.k = int(in);
    g.group_size = w.group;
    g.act = act == GpuAct::F16 ? kernels::ActType::F16 : kernels::ActType::BF16;
    g.workspace = m_work.p;
    g.workspace_bytes = m_work.count;
    g.stream = stream;
    g.num_sms = sms;
    g.path = kernels::MarlinPath::Marlin;  // the fused kernel at every m: this is what it is here to run
    const kernels::MarlinStatus st = kernels::marlin_gemm(g);
    if (st != kernels::MarlinStatus::Ok)
      fail(ErrorKind::Internal, who + ": " + label(l, expert) + ": the Marlin kernel refused [m=" + std::to_string(rows) +
                                    ", n=" + std::to_string(out) + ", k=" + std::to_string(in) +
                                    "]: " + kernels::marlin_status_name(st));
    const int64_t count = rows * out;
    if (act == GpuAct::F16)
      widen_add_kernel<<<stride_grid(count), kThreads, 0, stream>>>(Y, beta, reinterpret_cast<const __half*>(m_out.p), count);
    else
      widen_add_kernel<<<stride_grid(count), kThreads, 0, stream>>>(Y, beta,
                                                                    reinterpret_cast<const __nv_bfloat16*>(m_out.p), count);
    FWD_CHECK(cudaGetLastError());
  }

  // sum [k, k] += Xᵀ X for X [rows, k] 16-bit (fp32 accumulation, both triangles).
  void gram(int g, const void* X, int64_t rows, int32_t expert = kGpuDenseMlp) {
    const int64_t k = in_of(c, g, expert);
    DBuf<float>& h = hess[{g, expert}];
    if (!h.p) {
      h.reserve(size_t(k * k), who + ": Hessian sum");
      FWD_CHECK(cudaMemsetAsync(h.p, 0, size_t(k * k) * sizeof(float), stream));
    }
    hess_rows[{g, expert}] += rows;
    const float one = 1.0f;
    FWD_CHECK(cudaEventRecord(next_event(), stream));
    FWD_CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_T, int(k), int(k), int(rows), &one, X, dtype(), int(k), X,
                           dtype(), int(k), &one, h.p, CUDA_R_32F, int(k), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    FWD_CHECK(cudaEventRecord(next_event(), stream));
  }

  template <class T> void run_chunk(const Chunk& ch, const bool want[4], int last, bool update);
  template <class A> bool moe(const Chunk& ch, const bool want[4], int last, bool update, const A* x, float* h);
  void route_chunk(int64_t tc);
  template <class T> void attention(const Chunk& ch);
};

CudaForward::CudaForward(const GpuDims& d, const std::vector<size_t>& lengths, GpuAct act,
                         const std::vector<float>& inv_freq, size_t chunk_tokens,
                         const std::vector<float>& inv_freq_local, const std::vector<float>& inv_freq_long)
    : p_(std::make_unique<Impl>()) {
  Impl& I = *p_;
  const std::string& who = I.who;
  I.c = d;
  I.act = act;
  if (lengths.empty()) bad_usage(who + ": no calibration sample");
  if (d.hidden <= 0 || d.intermediate <= 0 || d.heads <= 0 || d.kv_heads <= 0 || d.head_dim % 2 != 0 ||
      d.head_dim <= 0 || d.head_dim > 2048 || d.heads % d.kv_heads != 0)
    bad_usage(who + ": head_dim " + std::to_string(d.head_dim) + " (even, at most 2048) and heads " +
              std::to_string(d.heads) + " / kv heads " + std::to_string(d.kv_heads) + " (a multiple) are required");
  if (d.rotary_dim < 0 || d.rotary_dim > d.head_dim || d.rotary_dim % 2 != 0)
    bad_usage(who + ": rotary_dim " + std::to_string(d.rotary_dim) + " must be even and at most head_dim");
  if (I.c.rotary_dim == 0) I.c.rotary_dim = d.head_dim;
  if (int64_t(inv_freq.size()) != I.c.rotary_dim / 2 ||
      (!inv_freq_local.empty() && int64_t(inv_freq_local.size()) != I.c.rotary_dim / 2) ||
      (!inv_freq_long.empty() && int64_t(inv_freq_long.size()) != I.c.rotary_dim / 2) ||
      (d.rope_long_after > 0) != !inv_freq_long.empty())
    bad_usage(who + ": RoPE table of the wrong size");
  if (!(d.attn_scale >= 0) || !(d.attn_softcap >= 0)) bad_usage(who + ": attention scale and soft-cap must be >= 0");
  if (d.sandwich_norms && d.residual_scale != 1.0) bad_usage(who + ": output norms and a residual multiplier together");
  if (d.experts < 0 || (d.experts > 0 && (d.top_k < 1 || d.top_k > d.experts || d.expert_intermediate <= 0 ||
                                          d.shared_intermediate < 0 || !d.route || d.sandwich_norms ||
                                          d.residual_scale != 1.0)))
    bad_usage(who + ": mixture of experts with " + std::to_string(d.experts) + " experts, top_k " +
              std::to_string(d.top_k) + ", expert intermediate " + std::to_string(d.expert_intermediate) +
              " (top_k in [1, experts], a routing rule, no output norms or residual multiplier)");
  if (d.experts > 0) I.routed = std::make_unique<std::array<Slot, 3>[]>(size_t(d.experts));
  I.len = lengths;
  I.off.assign(1, 0);
  for (size_t n : I.len) {
    if (n == 0) bad_usage(who + ": a calibration sample has no token");
    I.off.push_back(I.off.back() + int64_t(n));
    I.max_len = std::max<int64_t>(I.max_len, int64_t(n));
  }
  I.T = I.off.back();
  if (I.T >= int64_t(std::numeric_limits<int32_t>::max()))
    bad_usage(who + ": " + std::to_string(I.T) + " calibration tokens is more than the GPU pass takes (2^31 - 1)");
  for (size_t s = 0; s < I.len.size();) {
    Impl::Chunk ch{s, s, I.off[s], 0};
    while (ch.s1 < I.len.size() && (ch.s1 == s || I.off[ch.s1 + 1] - ch.t0 <= int64_t(chunk_tokens))) ++ch.s1;
    ch.tc = I.off[ch.s1] - ch.t0;
    I.max_chunk = std::max(I.max_chunk, ch.tc);
    I.chunks.push_back(ch);
    s = ch.s1;
  }
  const int64_t g = d.heads / d.kv_heads, L = I.max_len;
  const double per_kv = double(g) * double(L) * double(L) * (4.0 + 2.0);
  I.kv_batch = std::clamp<int64_t>(int64_t(kScoreBudgetBytes / per_kv), 1, d.kv_heads);

  FWD_CHECK(cudaStreamCreateWithFlags(&I.stream, cudaStreamNonBlocking));
  FWD_CHECK(cublasCreate(&I.blas));
  FWD_CHECK(cublasSetStream(I.blas, I.stream));

  // Token map and RoPE tables, computed on the host as the CPU pass does (fp32 angle, double cos/sin
  // rounded to fp32).
  std::vector<int64_t> st(size_t(I.T));
  std::vector<int32_t> ln(size_t(I.T)), ps(size_t(I.T));
  for (size_t s = 0; s < I.len.size(); ++s)
    for (int64_t t = I.off[s]; t < I.off[s + 1]; ++t) {
      st[size_t(t)] = I.off[s];
      ln[size_t(t)] = int32_t(I.len[s]);
      ps[size_t(t)] = int32_t(t - I.off[s]);
    }
  auto up = [&](auto& dst, const auto& h) {
    dst.reserve(h.size(), who);
    FWD_CHECK(cudaMemcpy(dst.p, h.data(), h.size() * sizeof(h[0]), cudaMemcpyHostToDevice));
  };
  const int64_t half = I.c.rotary_dim / 2;
  const float rs = float(d.rope_scale);
  auto tables = [&](const std::vector<float>& freq, DBuf<float>& cos_dst, DBuf<float>& sin_dst) {
    std::vector<float> co(size_t(L * half)), si(size_t(L * half));
    for (int64_t t = 0; t < L; ++t)
      for (int64_t i = 0; i < half; ++i) {
        const float ang = freq[size_t(i)] * float(t);
        co[size_t(t * half + i)] = float(std::cos(double(ang))) * rs;
        si[size_t(t * half + i)] = float(std::sin(double(ang))) * rs;
      }
    up(cos_dst, co);
    up(sin_dst, si);
  };
  up(I.tok_start, st);
  up(I.tok_len, ln);
  up(I.tok_pos, ps);
  tables(inv_freq, I.cosv, I.sinv);
  if (!inv_freq_local.empty()) tables(inv_freq_local, I.cosv_local, I.sinv_local);
  if (!inv_freq_long.empty()) tables(inv_freq_long, I.cosv_long, I.sinv_long);
  I.hidden.reserve(size_t(I.T * d.hidden), who + ": hidden states");
  I.flag.reserve(1, who);
}

CudaForward::~CudaForward() {
  if (!p_) return;
  for (cudaEvent_t e : p_->events) cudaEventDestroy(e);
  if (p_->blas) cublasDestroy(p_->blas);
  if (p_->stream) cudaStreamDestroy(p_->stream);
}

size_t CudaForward::tokens() const { return size_t(p_->T); }
GpuAct CudaForward::act() const { return p_->act; }
size_t CudaForward::samples() const { return p_->len.size(); }
size_t CudaForward::sample_tokens(size_t sample) const { return sample < p_->len.size() ? p_->len[sample] : 0; }

double CudaForward::device_bytes(const GpuDims& d, const std::vector<size_t>& lengths, size_t chunk_tokens) {
  double T = 0, L = 0, chunk = 0, run = 0;
  for (size_t n : lengths) {
    T += double(n);
    L = std::max(L, double(n));
    run = (run > 0 && run + double(n) > double(chunk_tokens)) ? double(n) : run + double(n);
    chunk = std::max(chunk, run);
  }
  const double h = double(d.hidden), f = double(d.intermediate), qd = double(d.heads * d.head_dim),
               kvd = double(d.kv_heads * d.head_dim), g = double(d.heads / std::max<int64_t>(1, d.kv_heads));
  const double weights = 2.0 * (h * qd * 2 + h * kvd * 2 + 3 * h * f) + 4.0 * std::max(h * f, h * qd);  // + staging
  const double hess = 4.0 * (2 * h * h + qd * qd + f * f);
  const double per_kv = g * L * L * 6.0;
  const double scores = std::clamp(std::floor(kScoreBudgetBytes / per_kv), 1.0, double(d.kv_heads)) * per_kv;
  const double scratch = chunk * (4 * h + 2 * std::max(h, qd) + 4 * (qd + 2 * kvd) + 2 * (qd + 2 * kvd) + 4 * qd +
                                  8 * f + 2 * f);
  const double sandwich = d.sandwich_norms || d.residual_scale != 1.0 ? 4.0 * chunk * h : 0.0;
  double moe = 0;  // an MoE block's experts, their Hessian sums and the routed rows' scratch
  if (d.experts > 0) {
    const double E = double(d.experts), mi = double(d.expert_intermediate), si = double(d.shared_intermediate),
                 rows = chunk * double(d.top_k);
    const double weights_moe = 2.0 * (E * 3 * h * mi + E * h + 3 * h * si + h);
    const double hess_moe = 4.0 * (E * (h * h + mi * mi) + (si > 0 ? h * h + si * si : 0));
    // gate, up (fp32) and act16 over the routed rows or the shared expert's, beyond the dense MLP's 10·f a token
    const double mlp_extra = std::max(0.0, 10.0 * std::max(rows * mi, chunk * si) - 10.0 * chunk * f);
    const double gathered = rows * (2 * h + 4 * h + 12) + chunk * (4 * E + 4 * h + 4);  // xg, yg, routes, logits, sub, sg
    moe = weights_moe + hess_moe + mlp_extra + gathered;
  }
  return 4.0 * T * h + 16.0 * T + weights + hess + scores + scratch + sandwich + moe;
}

void CudaForward::set_hidden(size_t sample, const float* h, size_t count) {
  Impl& I = *p_;
  const std::string& who = I.who;
  if (sample >= I.len.size() || count != I.len[sample] * size_t(I.c.hidden))
    bad_usage(who + ": hidden state for sample " + std::to_string(sample) + " has the wrong size");
  FWD_CHECK(cudaMemcpy(I.hidden.p + I.off[sample] * I.c.hidden, h, count * sizeof(float), cudaMemcpyHostToDevice));
}

void CudaForward::get_hidden(size_t sample, float* h, size_t count) const {
  const Impl& I = *p_;
  const std::string& who = I.who;
  if (sample >= I.len.size() || count != I.len[sample] * size_t(I.c.hidden))
    bad_usage(who + ": hidden state for sample " + std::to_string(sample) + " has the wrong size");
  FWD_CHECK(cudaMemcpy(h, I.hidden.p + I.off[sample] * I.c.hidden, count * sizeof(float), cudaMemcpyDeviceToHost));
}

void CudaForward::set_linear(int l, const void* bytes, size_t nbytes, GpuRaw raw, int32_t expert) {
  Impl& I = *p_;
  Slot& w = I.slot(l, expert);
  const std::string who = I.who + ": " + Impl::label(l, expert);
  const auto [out, in] = I.shape(l, expert);
  const size_t elt = raw == GpuRaw::F32 ? 4 : 2;
  if (nbytes != size_t(out * in) * elt)
    bad_usage(who + ": expected [" + std::to_string(out) + ", " + std::to_string(in) + "] of " + std::to_string(elt) +
              "-byte elements, got " + std::to_string(nbytes) + " bytes");
  w.W.reserve(size_t(out * in), who);
  w.marlin = false;
  const bool same = (raw == GpuRaw::F16 && I.act == GpuAct::F16) || (raw == GpuRaw::BF16 && I.act == GpuAct::BF16);
  if (same) {
    FWD_CHECK(cudaMemcpyAsync(w.W.p, bytes, nbytes, cudaMemcpyHostToDevice, I.stream));
  } else {
    I.staging.reserve(nbytes, who);
    FWD_CHECK(cudaMemcpyAsync(I.staging.p, bytes, nbytes, cudaMemcpyHostToDevice, I.stream));
    const int code = raw == GpuRaw::F32 ? 0 : raw == GpuRaw::F16 ? 1 : 2;
    if (I.act == GpuAct::F16)
      convert_kernel<__half><<<stride_grid(out * in), kThreads, 0, I.stream>>>(
          I.staging.p, code, out * in, reinterpret_cast<__half*>(w.W.p));
    else
      convert_kernel<__nv_bfloat16><<<stride_grid(out * in), kThreads, 0, I.stream>>>(
          I.staging.p, code, out * in, reinterpret_cast<__nv_bfloat16*>(w.W.p));
    FWD_CHECK(cudaGetLastError());
  }
  FWD_CHECK(cudaStreamSynchronize(I.stream));  // the caller may release the host bytes now
}

void CudaForward::set_linear_quantized(int l, const GpuQuantized& q, int32_t expert) {
  Impl& I = *p_;
  Slot& w = I.slot(l, expert);
  const std::string who = I.who + ": " + Impl::label(l, expert);
  const auto [out, in] = I.shape(l, expert);
  if (q.k != in || q.n != out || (q.bits != 4 && q.bits != 8) || !q.codes || !q.scales || (!q.sym && !q.zeros) ||
      (q.group_size > 0 && q.k % q.group_size != 0))
    bad_usage(who + ": quantized weights [k=" + std::to_string(q.k) + ", n=" + std::to_string(q.n) + "], " +
              std::to_string(q.bits) + "-bit, group " + std::to_string(q.group_size) + " do not fit [k=" +
              std::to_string(in) + ", n=" + std::to_string(out) + "]");
  const int64_t G = q.group_size > 0 ? q.k / q.group_size : 1;
  if (q.g_idx)
    for (int64_t r = 0; r < q.k; ++r)  // the kernel indexes scales with it
      if (q.g_idx[r] < 0 || q.g_idx[r] >= G)
        bad_data(who + ": g_idx[" + std::to_string(r) + "] = " + std::to_string(q.g_idx[r]) + " is outside [0, " +
                 std::to_string(G) + ")");
  const size_t kn = size_t(q.k * q.n), gn = size_t(G * q.n);
  // One staging buffer: codes | mask | zeros | scales | g_idx, each at a 16-byte boundary.
  auto up16 = [](size_t b) { return (b + 15) / 16 * 16; };
  const size_t o_mask = up16(kn), o_zero = o_mask + (q.mask ? up16(kn) : 0), o_scale = o_zero + (q.zeros ? up16(gn) : 0),
               o_gidx = o_scale + up16(gn * 2), total = o_gidx + (q.g_idx ? size_t(q.k) * 4 : 0);
  w.W.reserve(kn, who);
  w.marlin = false;
  I.staging.reserve(total, who);
  uint8_t* st = I.staging.p;
  FWD_CHECK(cudaMemcpyAsync(st, q.codes, kn, cudaMemcpyHostToDevice, I.stream));
  if (q.mask) FWD_CHECK(cudaMemcpyAsync(st + o_mask, q.mask, kn, cudaMemcpyHostToDevice, I.stream));
  if (q.zeros) FWD_CHECK(cudaMemcpyAsync(st + o_zero, q.zeros, gn, cudaMemcpyHostToDevice, I.stream));
  FWD_CHECK(cudaMemcpyAsync(st + o_scale, q.scales, gn * 2, cudaMemcpyHostToDevice, I.stream));
  if (q.g_idx) FWD_CHECK(cudaMemcpyAsync(st + o_gidx, q.g_idx, size_t(q.k) * 4, cudaMemcpyHostToDevice, I.stream));
  const DequantArgs a{st,
                      reinterpret_cast<const uint16_t*>(st + o_scale),
                      q.zeros ? st + o_zero : nullptr,
                      q.g_idx ? reinterpret_cast<const int32_t*>(st + o_gidx) : nullptr,
                      q.mask ? st + o_mask : nullptr,
                      q.k, q.n, q.bits, q.group_size, q.bf16_scales};
  const dim3 grid(blocks_for(q.n, 32), blocks_for(q.k, 32)), block(32, 8);
  if (I.act == GpuAct::F16)
    dequant_transpose_kernel<__half><<<grid, block, 0, I.stream>>>(a, reinterpret_cast<__half*>(w.W.p));
  else
    dequant_transpose_kernel<__nv_bfloat16><<<grid, block, 0, I.stream>>>(a, reinterpret_cast<__nv_bfloat16*>(w.W.p));
  FWD_CHECK(cudaGetLastError());
  FWD_CHECK(cudaStreamSynchronize(I.stream));  // the caller may release the host arrays now
}

void CudaForward::set_linear_marlin(int l, const int32_t* B, size_t b_count, const uint16_t* s, size_t s_count,
                                    int group_size, int32_t expert) {
  Impl& I = *p_;
  Slot& w = I.slot(l, expert);
  const std::string who = I.who + ": " + Impl::label(l, expert);
  const auto [out, in] = I.shape(l, expert);
  const int64_t G = group_size > 0 && group_size < in ? in / group_size : 1;
  if (in % 128 != 0 || out % 64 != 0 || b_count != size_t(in / 16 * 2 * out) || s_count != size_t(G * out) ||
      (group_size > 0 && in % group_size != 0))
    bad_usage(who + ": Marlin tiles of " + std::to_string(b_count) + " words and " + std::to_string(s_count) +
              " scales (group " + std::to_string(group_size) + ") do not fit [k=" + std::to_string(in) +
              ", n=" + std::to_string(out) + "] (k % 128 == 0 and n % 64 == 0 are needed)");
  w.mB.reserve(b_count, who);
  w.mS.reserve(s_count, who);
  FWD_CHECK(cudaMemcpy(w.mB.p, B, b_count * 4, cudaMemcpyHostToDevice));
  FWD_CHECK(cudaMemcpy(w.mS.p, s, s_count * 2, cudaMemcpyHostToDevice));
  w.group = G == 1 ? -1 : group_size;
  w.marlin = true;
}

void CudaForward::set_layer(bool sliding, bool local_rope, bool rope, bool moe) {
  Impl& I = *p_;
  if (local_rope && !I.cosv_local.p) bad_usage(I.who + ": a local-RoPE layer, but no local RoPE table was given");
  if (moe && I.c.experts == 0) bad_usage(I.who + ": a mixture-of-experts layer in a model without experts");
  I.layer_moe = moe;
  I.layer_sliding = sliding;
  I.layer_local = local_rope;
  I.layer_rope = rope;
}

void CudaForward::set_experts_see_all(bool all) { p_->experts_see_all = all; }

void CudaForward::set_vector(GpuVec which, const float* v, size_t count) {
  Impl& I = *p_;
  const int w = int(which);
  if (w < 0 || w >= kVecs) bad_usage(I.who + ": no vector " + std::to_string(w));
  const std::string who = I.who + ": " + kVecNames[w];
  const bool optional = which != GpuVec::InputNorm && which != GpuVec::PostNorm;
  if (count == 0 && optional) {
    I.has_vec[size_t(w)] = false;
    return;
  }
  const int64_t n = I.vec_len(which);
  if (count != size_t(n)) bad_usage(who + ": " + std::to_string(count) + " values, expected " + std::to_string(n));
  I.vec[size_t(w)].reserve(size_t(n), who);
  FWD_CHECK(cudaMemcpy(I.vec[size_t(w)].p, v, size_t(n) * sizeof(float), cudaMemcpyHostToDevice));
  I.has_vec[size_t(w)] = true;
}

template <class T>
void CudaForward::Impl::attention(const Chunk& ch) {
  const int64_t H = c.heads, KV = c.kv_heads, hd = c.head_dim, g = H / KV;
  const float scale = c.attn_scale > 0 ? float(c.attn_scale) : 1.0f / std::sqrt(float(hd)), one = 1.0f, zero = 0.0f;
  const T* Q = reinterpret_cast<const T*>(Qt.p);
  const T* K = reinterpret_cast<const T*>(Kt.p);
  const T* V = reinterpret_cast<const T*>(Vt.p);
  T* Pp = reinterpret_cast<T*>(P.p);
  for (size_t s = ch.s0; s < ch.s1; ++s) {
    const int64_t L = int64_t(len[s]), o = off[s] - ch.t0;
    const int64_t window = c.sliding_window > 0 && layer_sliding ? c.sliding_window : L + 1;
    for (int64_t j0 = 0; j0 < KV; j0 += kv_batch) {
      const int64_t nb = std::min(kv_batch, KV - j0);
      // S_j [g·L, L] = Q_j [g·L, hd] · K_jᵀ: the g query heads of KV head j are consecutive in the
      // per-sample head layout, so one strided batch over KV heads covers GQA.
      FWD_CHECK(cublasGemmStridedBatchedEx(
          blas, CUBLAS_OP_T, CUBLAS_OP_N, int(L), int(g * L), int(hd), &scale, K + (o * KV + j0 * L) * hd, dtype(),
          int(hd), L * hd, Q + (o * H + j0 * g * L) * hd, dtype(), int(hd), g * L * hd, &zero, S.p, CUDA_R_32F, int(L),
          g * L * L, int(nb), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      softmax_kernel<T><<<unsigned(nb * g * L), 128, 0, stream>>>(S.p, L, window, float(c.attn_softcap), Pp);
      FWD_CHECK(cudaGetLastError());
      // O_j [g·L, hd] = P_j [g·L, L] · V_j [L, hd].
      FWD_CHECK(cublasGemmStridedBatchedEx(
          blas, CUBLAS_OP_N, CUBLAS_OP_N, int(hd), int(g * L), int(L), &one, V + (o * KV + j0 * L) * hd, dtype(),
          int(hd), L * hd, Pp, dtype(), int(L), g * L * L, &zero, Ot.p + (o * H + j0 * g * L) * hd, CUDA_R_32F,
          int(hd), g * L * hd, int(nb), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
}

template <class T>
void CudaForward::Impl::run_chunk(const Chunk& ch, const bool want[4], int last, bool update) {
  const int64_t tc = ch.tc, hid = c.hidden, inter = c.intermediate;
  T* x = reinterpret_cast<T*>(xin.p);
  float* h = hidden.p + ch.t0 * hid;
  if (!update) {
    FWD_CHECK(cudaMemcpyAsync(res.p, h, size_t(tc * hid) * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    h = res.p;
  }
  const float eps = float(c.rms_eps);
  const TokenMap tm{tok_start.p, tok_len.p, tok_pos.p};
  auto stop_after = [&](int g) { return !update && last == g; };

  // Attention.
  rms_norm_kernel<T><<<unsigned(tc), kThreads, 0, stream>>>(h, hid, vec[size_t(GpuVec::InputNorm)].p, eps, x);
  FWD_CHECK(cudaGetLastError());
  if (want[kGQKV]) gram(kGQKV, x, tc);
  if (stop_after(kGQKV)) return;
  // The q/k/v biases go in with RoPE (qkv_rope_kernel): one pass over the projections instead of two.
  linear(kQ, x, tc, qf.p, 0.0f, false);
  linear(kK, x, tc, kf.p, 0.0f, false);
  linear(kV, x, tc, vf.p, 0.0f, false);
  const QkvArgs qa{qf.p, kf.p, vf.p, vec_or_null(GpuVec::BiasQ), vec_or_null(GpuVec::BiasK), vec_or_null(GpuVec::BiasV),
                   vec_or_null(GpuVec::QNorm), vec_or_null(GpuVec::KNorm),
                   layer_local ? cosv_local.p : cosv.p, layer_local ? sinv_local.p : sinv.p,
                   cosv_long.p, sinv_long.p, c.rope_long_after, ch.t0, int(c.heads), int(c.kv_heads), int(c.head_dim),
                   layer_rope ? int(c.rotary_dim) : 0, eps};  // rot 0: a NoPE layer passes every dim through
  const unsigned pair_threads = unsigned((c.head_dim / 2 + 31) / 32 * 32);
  const size_t rope_smem = qa.rot == c.head_dim ? 0 : size_t(c.head_dim) * sizeof(float);
  qkv_rope_kernel<T><<<dim3(unsigned(tc), unsigned(c.heads + 2 * c.kv_heads)), pair_threads, rope_smem, stream>>>(
      qa, tm, reinterpret_cast<T*>(Qt.p), reinterpret_cast<T*>(Kt.p), reinterpret_cast<T*>(Vt.p));
  FWD_CHECK(cudaGetLastError());
  attention<T>(ch);
  gather_heads_kernel<T><<<stride_grid(tc * qd()), kThreads, 0, stream>>>(Ot.p, tm, ch.t0, tc, int(c.heads),
                                                                         int(c.head_dim), x);
  FWD_CHECK(cudaGetLastError());
  if (want[kGO]) gram(kGO, x, tc);
  if (stop_after(kGO)) return;
  // The residual add: the GEMM's beta = 1, or after Gemma 2/3's output norm, or Granite's multiplier
  // (on the output with its bias, as transformers scales it).
  auto add_output = [&](int l, const void* in, GpuVec out_norm) {
    if (c.residual_scale != 1.0) {
      linear(l, in, tc, sub.p, 0.0f);
      scaled_add_kernel<<<stride_grid(tc * hid), kThreads, 0, stream>>>(h, float(c.residual_scale), sub.p, tc * hid);
      FWD_CHECK(cudaGetLastError());
      return;
    }
    if (!c.sandwich_norms) {
      linear(l, in, tc, h, 1.0f);
      return;
    }
    linear(l, in, tc, sub.p, 0.0f);
    rms_norm_add_kernel<<<unsigned(tc), kThreads, 0, stream>>>(sub.p, hid, vec[size_t(out_norm)].p, eps, h);
    FWD_CHECK(cudaGetLastError());
  };
  add_output(kO, x, GpuVec::AttnOutNorm);

  // MLP.
  rms_norm_kernel<T><<<unsigned(tc), kThreads, 0, stream>>>(h, hid, vec[size_t(GpuVec::PostNorm)].p, eps, x);
  FWD_CHECK(cudaGetLastError());
  if (layer_moe) {
    if (!moe<T>(ch, want, last, update, x, h)) return;
  } else {
    if (want[kGGateUp]) gram(kGGateUp, x, tc);
    if (stop_after(kGGateUp)) return;
    linear(kGate, x, tc, gate.p, 0.0f);
    linear(kUp, x, tc, up.p, 0.0f);
    T* a = reinterpret_cast<T*>(act16.p);
    glu_kernel<T><<<stride_grid(tc * inter), kThreads, 0, stream>>>(gate.p, up.p, tc * inter, c.activation, a);
    FWD_CHECK(cudaGetLastError());
    if (want[kGDown]) gram(kGDown, a, tc);
    if (!update) return;
    add_output(kDown, a, GpuVec::MlpOutNorm);
  }
  nonfinite_kernel<<<stride_grid(tc * hid), kThreads, 0, stream>>>(h, tc * hid, flag.p);
  FWD_CHECK(cudaGetLastError());
}

// The router's logits of the chunk's normed tokens come down, and the CPU pass's rule routes them. On the
// device go the gather order (each expert's tokens together, experts in index order, tokens in order within
// each: `first` marks where each expert's rows start) and, per token, where its picks' outputs land and their
// weights, in expert index order (the order the CPU pass adds the experts' outputs in).
void CudaForward::Impl::route_chunk(int64_t tc) {
  const int64_t E = c.experts, K = c.top_k;
  h_logits.resize(size_t(tc * E));
  FWD_CHECK(cudaMemcpyAsync(h_logits.data(), logits.p, h_logits.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
  FWD_CHECK(cudaStreamSynchronize(stream));
  h_expert.resize(size_t(tc * K));
  h_weight.resize(size_t(tc * K));
  c.route(h_logits.data(), tc, h_expert.data(), h_weight.data());
  first.assign(size_t(E + 1), 0);
  for (int32_t e : h_expert) {
    if (e < 0 || e >= E) fail(ErrorKind::Internal, who + ": routing picked expert " + std::to_string(e));
    ++first[size_t(e + 1)];
  }
  for (int64_t e = 0; e < E; ++e) first[size_t(e + 1)] += first[size_t(e)];
  h_route.resize(size_t(2 * tc * K));
  h_cw.resize(size_t(tc * K));
  int32_t* perm = h_route.data();
  int32_t* pos = perm + tc * K;
  std::vector<int64_t> next(first.begin(), first.end() - 1);
  std::vector<int32_t> picks(static_cast<size_t>(K));
  for (int64_t t = 0; t < tc; ++t) {
    const int32_t* ex = h_expert.data() + t * K;
    for (int64_t j = 0; j < K; ++j) picks[size_t(j)] = int32_t(j);
    std::sort(picks.begin(), picks.end(), [&](int32_t a, int32_t b) { return ex[a] < ex[b]; });
    for (int64_t i = 0; i < K; ++i) {
      const int32_t j = picks[size_t(i)], e = ex[j];
      const int64_t row = next[size_t(e)]++;
      perm[row] = int32_t(t);
      pos[t * K + i] = int32_t(row);
      h_cw[size_t(t * K + i)] = h_weight[size_t(t * K + j)];
    }
  }
  FWD_CHECK(cudaMemcpyAsync(route.p, h_route.data(), h_route.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  FWD_CHECK(cudaMemcpyAsync(cw.p, h_cw.data(), h_cw.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
  FWD_CHECK(cudaStreamSynchronize(stream));  // the host vectors are rewritten by the next chunk
}

// The MoE MLP of a chunk from its normed input x [tc, hidden]: each routed expert on its gathered rows,
// Qwen2-MoE's shared expert on all of them, the weighted sum into h. Returns false when the pass stops
// early (no update, the last captured group done).
// (A: the 16-bit GEMM input type; Impl's member T is the token count.)
template <class A>
bool CudaForward::Impl::moe(const Chunk& ch, const bool want[4], int last, bool update, const A* x, float* h) {
  const int64_t tc = ch.tc, hid = c.hidden, E = c.experts, K = c.top_k, mi = c.expert_intermediate,
                si = c.shared_intermediate, rows = tc * K;
  linear(kGpuRouter, x, tc, logits.p, 0.0f, false);
  route_chunk(tc);
  const int32_t* perm = route.p;
  A* xe = reinterpret_cast<A*>(xg.p);
  gather_rows_kernel<A><<<stride_grid(rows * hid), kThreads, 0, stream>>>(x, perm, rows, hid, xe);
  FWD_CHECK(cudaGetLastError());
  auto each_expert = [&](auto&& fn) {  // fn(e, first row, rows) for each expert some token reached
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = first[size_t(e)], n = first[size_t(e + 1)] - r0;
      if (n > 0) fn(int32_t(e), r0, n);
    }
  };
  if (want[kGGateUp]) {
    if (experts_see_all) gram(kGGateUp, x, tc, kGpuAllExperts);
    else each_expert([&](int32_t e, int64_t r0, int64_t n) { gram(kGGateUp, xe + r0 * hid, n, e); });
    if (si > 0) gram(kGGateUp, x, tc, kGpuSharedExpert);
  }
  if (!update && last == kGGateUp) return false;
  A* a = reinterpret_cast<A*>(act16.p);
  each_expert([&](int32_t e, int64_t r0, int64_t n) {
    linear(kGate, xe + r0 * hid, n, gate.p + r0 * mi, 0.0f, false, e);
    linear(kUp, xe + r0 * hid, n, up.p + r0 * mi, 0.0f, false, e);
  });
  glu_kernel<A><<<stride_grid(rows * mi), kThreads, 0, stream>>>(gate.p, up.p, rows * mi, c.activation, a);
  FWD_CHECK(cudaGetLastError());
  if (want[kGDown] && !experts_see_all)
    each_expert([&](int32_t e, int64_t r0, int64_t n) { gram(kGDown, a + r0 * mi, n, e); });
  if (update)
    each_expert([&](int32_t e, int64_t r0, int64_t n) { linear(kDown, a + r0 * mi, n, yg.p + r0 * hid, 0.0f, false, e); });
  // Each expert's down input on every token, in the MLP scratch the routed experts are done with.
  if (want[kGDown] && experts_see_all)
    for (int32_t e = 0; e < int32_t(E); ++e) {
      linear(kGate, x, tc, gate.p, 0.0f, false, e);
      linear(kUp, x, tc, up.p, 0.0f, false, e);
      glu_kernel<A><<<stride_grid(tc * mi), kThreads, 0, stream>>>(gate.p, up.p, tc * mi, c.activation, a);
      FWD_CHECK(cudaGetLastError());
      gram(kGDown, a, tc, e);
    }
  // The shared expert reuses the MLP scratch too.
  if (si > 0) {
    linear(kGate, x, tc, gate.p, 0.0f, false, kGpuSharedExpert);
    linear(kUp, x, tc, up.p, 0.0f, false, kGpuSharedExpert);
    glu_kernel<A><<<stride_grid(tc * si), kThreads, 0, stream>>>(gate.p, up.p, tc * si, c.activation, a);
    FWD_CHECK(cudaGetLastError());
    if (want[kGDown]) gram(kGDown, a, tc, kGpuSharedExpert);
  }
  if (!update) return false;
  if (si > 0) {
    linear(kDown, a, tc, sub.p, 0.0f, false, kGpuSharedExpert);
    linear(kGpuSharedGate, x, tc, sg.p, 0.0f, false);
  }
  const CombineArgs ca{yg.p, route.p + rows, cw.p, si > 0 ? sub.p : nullptr, si > 0 ? sg.p : nullptr, tc, hid, int(K)};
  moe_combine_kernel<<<stride_grid(tc * hid), kThreads, 0, stream>>>(ca, h);
  FWD_CHECK(cudaGetLastError());
  return true;
}

void CudaForward::run(const bool capture[4], bool update, int64_t block) {
  Impl& I = *p_;
  const std::string who = I.who + " (block " + std::to_string(block) + ")";
  // The block's linears: attention and a dense MLP, or attention, the router and every expert's.
  auto require = [&](int l, int32_t expert) {
    if (!I.slot(l, expert).loaded()) bad_usage(who + ": " + Impl::label(l, expert) + " was not loaded");
  };
  for (int l = 0; l < (I.layer_moe ? kGate : kLinears); ++l) require(l, kGpuDenseMlp);
  if (I.layer_moe) {
    require(kGpuRouter, kGpuDenseMlp);
    for (int32_t e = 0; e < int32_t(I.c.experts); ++e)
      for (int l : {kGate, kUp, kDown}) require(l, e);
    if (I.c.shared_intermediate > 0) {
      for (int l : {kGate, kUp, kDown}) require(l, kGpuSharedExpert);
      require(kGpuSharedGate, kGpuDenseMlp);
    }
  }
  if (!I.has_vec[size_t(GpuVec::InputNorm)] || !I.has_vec[size_t(GpuVec::PostNorm)] ||
      (I.c.sandwich_norms && (!I.has_vec[size_t(GpuVec::AttnOutNorm)] || !I.has_vec[size_t(GpuVec::MlpOutNorm)])))
    bad_usage(who + ": the block's norms were not loaded");
  int last = -1;
  for (int g = 0; g < kGroups; ++g)
    if (capture[g]) last = g;
  if (!update && last < 0) return;
  const int64_t tc = I.max_chunk, hid = I.c.hidden, inter = I.c.intermediate, g = I.c.heads / I.c.kv_heads;
  if (!update) I.res.reserve(size_t(tc * hid), who);
  I.xin.reserve(size_t(tc * std::max(hid, I.qd())), who);
  I.qf.reserve(size_t(tc * I.qd()), who);
  I.kf.reserve(size_t(tc * I.kvd()), who);
  I.vf.reserve(size_t(tc * I.kvd()), who);
  I.Qt.reserve(size_t(tc * I.qd()), who);
  I.Kt.reserve(size_t(tc * I.kvd()), who);
  I.Vt.reserve(size_t(tc * I.kvd()), who);
  I.Ot.reserve(size_t(tc * I.qd()), who);
  I.S.reserve(size_t(I.kv_batch * g * I.max_len * I.max_len), who + ": attention scores");
  I.P.reserve(size_t(I.kv_batch * g * I.max_len * I.max_len), who + ": attention probabilities");
  // The MLP scratch: a dense MLP's, or the routed experts' rows (each token top_k times) and the shared expert's.
  const int64_t mlp = I.layer_moe ? std::max(tc * I.c.top_k * I.c.expert_intermediate, tc * I.c.shared_intermediate)
                                  : tc * inter;
  I.gate.reserve(size_t(mlp), who);
  I.up.reserve(size_t(mlp), who);
  I.act16.reserve(size_t(mlp), who);
  if (I.c.sandwich_norms || I.c.residual_scale != 1.0 || (I.layer_moe && I.c.shared_intermediate > 0))
    I.sub.reserve(size_t(tc * hid), who);
  if (I.layer_moe) {
    const int64_t rows = tc * I.c.top_k;
    I.logits.reserve(size_t(tc * I.c.experts), who + ": router logits");
    I.route.reserve(size_t(2 * rows), who);
    I.cw.reserve(size_t(rows), who);
    I.xg.reserve(size_t(rows * hid), who + ": gathered expert inputs");
    I.yg.reserve(size_t(rows * hid), who + ": expert outputs");
    if (I.c.shared_intermediate > 0) I.sg.reserve(size_t(tc), who);
  }
  FWD_CHECK(cudaMemsetAsync(I.flag.p, 0, sizeof(int), I.stream));
  I.events_used = 0;
  for (const auto& ch : I.chunks) {
    if (I.act == GpuAct::F16) I.run_chunk<__half>(ch, capture, last, update);
    else I.run_chunk<__nv_bfloat16>(ch, capture, last, update);
  }
  int flag = 0;
  FWD_CHECK(cudaMemcpyAsync(&flag, I.flag.p, sizeof(int), cudaMemcpyDeviceToHost, I.stream));
  FWD_CHECK(cudaStreamSynchronize(I.stream));
  for (size_t e = 0; e + 1 < I.events_used; e += 2) {
    float ms = 0;
    FWD_CHECK(cudaEventElapsedTime(&ms, I.events[e], I.events[e + 1]));
    I.gram_seconds += double(ms) / 1e3;
  }
  if (flag)
    bad_data(who + ": the hidden states became non-finite on the GPU (a " +
             std::string(I.act == GpuAct::F16 ? "fp16" : "bf16") +
             " GEMM input overflowed, or the weights hold inf/NaN); run with --device cpu to compute in fp32");
}

const float* CudaForward::hessian_sum(int group, int32_t expert) const {
  const auto it = p_->hess.find({group, expert});
  return it == p_->hess.end() ? nullptr : it->second.p;
}

int64_t CudaForward::hessian_rows(int group, int32_t expert) const {
  const auto it = p_->hess_rows.find({group, expert});
  return it == p_->hess_rows.end() ? 0 : it->second;
}

double CudaForward::hessian_seconds() const { return p_->gram_seconds; }

void CudaForward::release_hessian(int group, int32_t expert) { p_->hess.erase({group, expert}); }

void CudaForward::clear_hessians() {
  p_->hess.clear();
  p_->hess_rows.clear();
}

}  // namespace marlinc::calib
