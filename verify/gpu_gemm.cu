// CUDA builds: the arithmetic check runs the packed layer through our Marlin kernel.
#include <cuda_runtime.h>

#include "checkpoint/half.h"
#include "kernels/marlin.h"
#include "packer/marlin.h"
#include "verify/gpu_gemm.h"

namespace marlinc {

namespace {
// Frees device buffers on every return path.
struct DeviceBuffers {
  std::vector<void*> ptrs;
  void* alloc(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
    ptrs.push_back(p);
    return p;
  }
  ~DeviceBuffers() {
    for (void* p : ptrs) cudaFree(p);
  }
};
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

bool gpu_gemm_packed(const std::string& name, const QuantizedLinear& q, const std::vector<uint16_t>& A, int m,
                     std::vector<float>& C, std::string& why) {
  if (q.bits != 4 || !q.sym || !q.mask.empty() || !q.trivial_g_idx()) {
    why = name + ": the kernel runs dense symmetric 4-bit layers without act-order";
    return false;
  }
  const int gs = q.groups() == 1 ? -1 : q.group_size;
  std::vector<int32_t> B = marlin::pack_weights(q.codes.data(), q.k, q.n, 4);                  // [k/16, 2n]
  std::vector<uint16_t> s = marlin::permute_scales(q.scales.data(), q.groups(), q.n);         // [G, n]
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const size_t ws_bytes = kernels::marlin_workspace_bytes(sms, false);
  DeviceBuffers d;
  void* dA = d.alloc(A.size() * 2);
  void* dB = d.alloc(B.size() * 4);
  void* ds = d.alloc(s.size() * 2);
  void* dC = d.alloc(size_t(m) * size_t(q.n) * 2);
  void* dw = d.alloc(ws_bytes);
  if (!dA || !dB || !ds || !dC || !dw) { why = name + ": cudaMalloc failed"; return false; }
  cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dB, B.data(), B.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(ds, s.data(), s.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(dC, 0xff, size_t(m) * size_t(q.n) * 2);  // NaN poison: every output must be written
  cudaMemset(dw, 0, ws_bytes);
  kernels::MarlinGemm g;
  g.A = dA; g.B = static_cast<const int32_t*>(dB); g.s = ds; g.C = dC;
  g.m = m; g.n = int(q.n); g.k = int(q.k); g.group_size = gs;
  g.act = q.scale_type == ScaleType::F16 ? kernels::ActType::F16 : kernels::ActType::BF16;
  g.workspace = dw; g.workspace_bytes = ws_bytes; g.num_sms = sms;
  g.path = kernels::MarlinPath::Marlin;
  if (g.act == kernels::ActType::BF16) {
    why = name + ": bf16 scales are checked on the CPU path";  // activations here are fp16
    return false;
  }
  kernels::MarlinStatus st = kernels::marlin_gemm(g);
  if (st != kernels::MarlinStatus::Ok) { why = name + ": kernel refused: " + kernels::marlin_status_name(st); return false; }
  std::vector<uint16_t> out(size_t(m) * size_t(q.n));
  if (cudaMemcpy(out.data(), dC, out.size() * 2, cudaMemcpyDeviceToHost) != cudaSuccess) {
    why = name + ": " + cudaGetErrorString(cudaGetLastError());
    return false;
  }
  C.resize(out.size());
  half_to_float_n(out.data(), C.data(), out.size());
  return true;
}

}  // namespace marlinc
