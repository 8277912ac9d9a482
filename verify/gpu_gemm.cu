// CUDA builds: the arithmetic check runs the packed layer through our Marlin kernel and computes its
// float64 reference on the GPU too (cuBLAS DGEMM on weights dequantized exactly in double), so
// certifying every column of an 8B model's layers takes seconds rather than the minutes a CPU
// float64 GEMM would.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "checkpoint/half.h"
#include "kernels/marlin.h"
#include "packer/gptq.h"
#include "packer/marlin.h"
#include "verify/gpu_gemm.h"

namespace marlinc {

namespace {

// Columns of the double weights dequantized per DGEMM: bounds the scratch to 256 MB whatever the layer.
constexpr size_t kRefScratchBytes = size_t(256) << 20;

// Frees device buffers and the cuBLAS handle on every return path.
struct DeviceScope {
  std::vector<void*> ptrs;
  cublasHandle_t cublas = nullptr;
  void* alloc(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(bytes, 16)) != cudaSuccess) return nullptr;
    ptrs.push_back(p);
    return p;
  }
  ~DeviceScope() {
    for (void* p : ptrs) cudaFree(p);
    if (cublas) cublasDestroy(cublas);
  }
};

// A 16-bit word of the kernel's type as float (bf16: the word is the top half of a float).
__device__ __forceinline__ float word_to_float(uint16_t w, bool bf16) {
  return bf16 ? __uint_as_float(uint32_t(w) << 16) : __half2float(__ushort_as_half(w));
}

// W[r, c0 + j] for j < nc as double, row-major [k, nc]: (code - zero) * scale is exact in double
// (a 4-bit integer times a 16-bit float). Symmetric layers only (the kernel's scope here). The group of
// row r is g_idx[r] (act-order), or r / group when g_idx is null.
__global__ void dequant_f64(const uint8_t* __restrict__ codes /*[k, n]*/, const uint16_t* __restrict__ scales /*[G, n]*/,
                            const int32_t* __restrict__ g_idx /*[k] or null*/, double* __restrict__ W /*[k, nc]*/,
                            int64_t k, int64_t n, int64_t c0, int64_t nc, int group, int zero, bool bf16) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= k * nc) return;
  const int64_t r = i / nc, c = c0 + i % nc;
  const uint16_t sb = scales[int64_t(g_idx ? g_idx[r] : r / group) * n + c];
  W[i] = double(int(codes[r * n + c]) - zero) * double(word_to_float(sb, bf16));
}

__global__ void words_to_f64(const uint16_t* __restrict__ a, double* __restrict__ d, int64_t count, bool bf16) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) d[i] = double(word_to_float(a[i], bf16));
}

int blocks_for(int64_t count, int threads) { return int((count + threads - 1) / threads); }

// Act-order (g_idx not row / group_size): the rows sorted by group (the packer's stable sort, as vLLM's
// gptq_marlin does at load). The layer is then a plain grouped one over permuted inputs,
// A[:, perm] · W[perm, :] = A · W, which the kernel runs. Needs every group to hold exactly group_size
// rows (GPTQ's desc_act order gives that); returns an empty perm otherwise.
std::vector<int32_t> act_order_perm(const QuantizedLinear& q) {
  gptq::ActOrder ao = gptq::act_order_sort(q.g_idx.data(), q.k);
  for (int64_t i = 0; i < q.k; ++i)
    if (ao.g_idx_sorted[size_t(i)] != i / q.group_size) return {};
  return std::move(ao.sort_indices);
}

}  // namespace

bool gpu_available(std::string& device_name) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    device_name.clear();
    return false;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return false;
  device_name = prop.name;
  return true;
}

bool gpu_arith(const std::string& name, const QuantizedLinear& q, const std::vector<uint16_t>& A,
               const std::vector<int>& batches, std::vector<float>& C, std::vector<double>& R, std::string& why) {
  if (q.bits != 4 || !q.sym) {
    why = name + ": the kernel runs symmetric 4-bit layers";
    return false;
  }
  // Checked before packing: the packer refuses an n that is not a multiple of 64 (a GPTQ or AWQ layer may
  // have any width), and such a layer takes the CPU path like every other the kernel cannot run.
  if (!kernels::marlin_shape_supported(q.n, q.k)) {
    why = name + ": the kernel needs n % 64 == 0 and k % 128 == 0 (k = " + std::to_string(q.k) +
          ", n = " + std::to_string(q.n) + ")";
    return false;
  }
  const bool act_order = !q.trivial_g_idx();
  const std::vector<int32_t> perm = act_order && q.group_size > 0 ? act_order_perm(q) : std::vector<int32_t>();
  if (act_order && perm.empty()) {
    why = name + ": act-order groups of unequal sizes (the kernel needs group_size rows per group)";
    return false;
  }
  const bool bf16 = q.scale_type == ScaleType::BF16;  // the bf16 kernel: A, scales and C in bf16
  int64_t M = 0;
  for (int m : batches) M += m;
  if (int64_t(A.size()) != M * q.k) {
    why = name + ": activations hold " + std::to_string(A.size()) + " values, expected (sum of batches) x k";
    return false;
  }
  const int gs = q.groups() == 1 ? -1 : int(q.group_size);
  // 2:4 layers run the dense kernel on the layer's values, each pruned weight a zero code: Sparse-Marlin's
  // numerics are the same (16-bit scaled weights, fp32 sums), and the reference reads the same codes.
  std::vector<uint8_t> dense_codes;
  if (!q.mask.empty()) {
    dense_codes = q.codes;
    const uint8_t zero = uint8_t(q.zero_of(0, 0));
    for (size_t i = 0; i < dense_codes.size(); ++i)
      if (!q.mask[i]) dense_codes[i] = zero;
  }
  const std::vector<uint8_t>& codes = q.mask.empty() ? q.codes : dense_codes;
  // The kernel's operands: with act-order the code rows and A's columns in perm order.
  std::vector<uint8_t> sorted_codes;
  std::vector<uint16_t> A_sorted;
  if (act_order) {
    sorted_codes = gptq::gather_rows(codes.data(), q.k, q.n, perm.data());
    A_sorted.resize(A.size());
    for (size_t row = 0; row < A.size() / size_t(q.k); ++row)
      for (int64_t r = 0; r < q.k; ++r) A_sorted[row * size_t(q.k) + size_t(r)] = A[row * size_t(q.k) + size_t(perm[size_t(r)])];
  }
  const std::vector<uint16_t>& A_kernel = act_order ? A_sorted : A;
  std::vector<int32_t> B = marlin::pack_weights(act_order ? sorted_codes.data() : codes.data(), q.k, q.n, 4);  // [k/16, 2n]
  std::vector<uint16_t> s = marlin::permute_scales(q.scales.data(), q.groups(), q.n);  // [G, n]
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const size_t ws_bytes = kernels::marlin_workspace_bytes(sms, false);
  const int64_t nc_max = std::max<int64_t>(1, int64_t(kRefScratchBytes / (sizeof(double) * size_t(q.k))));
  const int64_t nc_all = std::min<int64_t>(q.n, nc_max);
  DeviceScope d;
  auto* dA = static_cast<uint16_t*>(d.alloc(A.size() * 2));                              // [M, k] fp16/bf16
  auto* dB = static_cast<int32_t*>(d.alloc(B.size() * 4));                               // [k/16, 2n]
  auto* ds = static_cast<uint16_t*>(d.alloc(s.size() * 2));                              // [G, n] permuted
  auto* dC = static_cast<uint16_t*>(d.alloc(size_t(M) * size_t(q.n) * 2));               // [M, n] fp16/bf16
  void* dw = d.alloc(ws_bytes);
  auto* dcodes = static_cast<uint8_t*>(d.alloc(q.codes.size()));                         // [k, n]
  auto* dscales = static_cast<uint16_t*>(d.alloc(q.scales.size() * 2));                  // [G, n] plain
  auto* dgidx = act_order ? static_cast<int32_t*>(d.alloc(q.g_idx.size() * 4)) : nullptr;  // [k]
  auto* dAk = act_order ? static_cast<uint16_t*>(d.alloc(A.size() * 2)) : dA;             // [M, k] A[:, perm]
  auto* dAd = static_cast<double*>(d.alloc(A.size() * sizeof(double)));                  // [M, k]
  auto* dW = static_cast<double*>(d.alloc(size_t(q.k) * size_t(nc_all) * sizeof(double)));  // [k, nc]
  auto* dR = static_cast<double*>(d.alloc(size_t(M) * size_t(q.n) * sizeof(double)));    // [M, n]
  if (!dA || !dB || !ds || !dC || !dw || !dcodes || !dscales || !dAd || !dW || !dR || (act_order && (!dgidx || !dAk))) {
    why = name + ": cudaMalloc failed";
    return false;
  }
  if (cublasCreate(&d.cublas) != CUBLAS_STATUS_SUCCESS) {
    why = name + ": cublasCreate failed";
    return false;
  }
  cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dB, B.data(), B.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(ds, s.data(), s.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dcodes, codes.data(), codes.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dscales, q.scales.data(), q.scales.size() * 2, cudaMemcpyHostToDevice);
  if (act_order) {
    cudaMemcpy(dgidx, q.g_idx.data(), q.g_idx.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dAk, A_kernel.data(), A_kernel.size() * 2, cudaMemcpyHostToDevice);
  }
  cudaMemset(dC, 0xff, size_t(M) * size_t(q.n) * 2);  // NaN poison (fp16 and bf16): every output must be written
  cudaMemset(dw, 0, ws_bytes);

  // Our kernel, one call per batch (each its own m).
  int64_t row = 0;
  for (int m : batches) {
    kernels::MarlinGemm g;
    g.A = dAk + row * q.k; g.B = dB; g.s = ds; g.C = dC + row * q.n;
    g.m = m; g.n = int(q.n); g.k = int(q.k); g.group_size = gs;
    g.act = bf16 ? kernels::ActType::BF16 : kernels::ActType::F16;
    g.workspace = dw; g.workspace_bytes = ws_bytes; g.num_sms = sms;
    g.path = kernels::MarlinPath::Marlin;
    const kernels::MarlinStatus st = kernels::marlin_gemm(g);
    if (st != kernels::MarlinStatus::Ok) {
      why = name + ": kernel refused: " + kernels::marlin_status_name(st);
      return false;
    }
    row += m;
  }

  // The float64 reference, all batches at once: R^T [n, M] (column-major, = R [M, n] row-major)
  // = W^T [n, k] · A^T [k, M], one column chunk of W at a time, from the layer as stored (A and the
  // rows in their own order, groups by g_idx): independent of the permutation the kernel ran.
  words_to_f64<<<blocks_for(M * q.k, 256), 256>>>(dA, dAd, M * q.k, bf16);
  const double one = 1.0, zero = 0.0;
  const int zp = q.zero_of(0, 0);
  const int group = q.groups() == 1 ? int(q.k) : int(q.group_size);
  for (int64_t c0 = 0; c0 < q.n; c0 += nc_all) {
    const int64_t nc = std::min(nc_all, q.n - c0);
    dequant_f64<<<blocks_for(q.k * nc, 256), 256>>>(dcodes, dscales, dgidx, dW, q.k, q.n, c0, nc, group, zp, bf16);
    if (cublasDgemm(d.cublas, CUBLAS_OP_N, CUBLAS_OP_N, int(nc), int(M), int(q.k), &one, dW, int(nc), dAd, int(q.k),
                    &zero, dR + c0, int(q.n)) != CUBLAS_STATUS_SUCCESS) {
      why = name + ": cublasDgemm failed";
      return false;
    }
  }
  std::vector<uint16_t> out(size_t(M) * size_t(q.n));
  R.resize(size_t(M) * size_t(q.n));
  if (cudaMemcpy(out.data(), dC, out.size() * 2, cudaMemcpyDeviceToHost) != cudaSuccess ||
      cudaMemcpy(R.data(), dR, R.size() * sizeof(double), cudaMemcpyDeviceToHost) != cudaSuccess) {
    why = name + ": " + cudaGetErrorString(cudaGetLastError());
    return false;
  }
  C.resize(out.size());
  if (bf16) bf16_to_float_n(out.data(), C.data(), out.size());
  else half_to_float_n(out.data(), C.data(), out.size());
  return true;
}

}  // namespace marlinc
