// GPTQ CUDA back end (spec: gptq.md §1.3–§1.11, §2.1, §4): the same algorithm and options as the
// CPU fast path in gptq.cpp. The host does only O(k) work (diagonal, dead columns, column order,
// damping constant, static-group Cholesky blocks of g×g); on the device run the validation of W
// and H, the permuted damped Hessian, potrf + trtri (cuSOLVER) for the upper factor U of H⁻¹ with
// the damping retry, the clip searches, the blocked column loop (one thread per output row) and the
// lazy trailing update (cuBLAS DGEMM). Everything from the damped Hessian on is double, as on the
// CPU (gptq.h), so the two back ends differ by double rounding and agree on the codes.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/error.h"
#include "checkpoint/half.h"
#include "quantizer/gptq_cuda.cuh"
#include "quantizer/gptq_cuda_kernels.cuh"
#include "quantizer/cuda_util.cuh"
#include "quantizer/gptq_internal.h"
#include "quantizer/grid.h"
#include "quantizer/rtn.h"

namespace marlinc {

// The one device-call check: statement, file, line and the layer (`who` must be in scope).
#define CUDA_CHECK(call) ::marlinc::cuda_util::check((call), #call, __FILE__, __LINE__, who)

namespace gptq_cuda {

namespace {

constexpr int kThreads = 256;

struct Ctx;
Ctx& context(const std::string& who);

// Owning device buffer on the calling thread's stream (stream-ordered: several layers quantized at
// once on different threads do not stall each other the way cudaFree would); freed on scope exit,
// so a throw never leaks device memory.
template <class T>
struct DBuf : cuda_util::StreamBuf<T> {
  DBuf() = default;
  DBuf(size_t c, const std::string& who) { alloc(c, who); }
  void alloc(size_t c, const std::string& who);
};

// Per host thread and device: one stream and the library handles. Creating a cuBLAS/cuSOLVER
// handle costs tens of milliseconds, more than a small layer's whole quantization.
struct Ctx {
  int device = -1;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cusolverDnHandle_t solver = nullptr;
  cusolverDnParams_t params = nullptr;
  size_t smem_optin = 0;  // largest dynamic shared memory a CTA may opt into on this device
  ~Ctx() {
    if (params) cusolverDnDestroyParams(params);
    if (solver) cusolverDnDestroy(solver);
    if (blas) cublasDestroy(blas);
    if (stream) cudaStreamDestroy(stream);
  }
};

Ctx& context(const std::string& who) {
  thread_local std::unique_ptr<Ctx> c;
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  if (!c || c->device != dev) {
    c = std::make_unique<Ctx>();
    c->device = dev;
    cuda_util::keep_pool_memory(dev, who);
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cublasCreate(&c->blas));
    CUDA_CHECK(cublasSetStream(c->blas, c->stream));
    // No TF32 for the fp32 Hessian GEMMs (gptq.md §1.12); DGEMM's FP64 tensor cores are IEEE double.
    CUDA_CHECK(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH));
    CUDA_CHECK(cusolverDnCreate(&c->solver));
    CUDA_CHECK(cusolverDnSetStream(c->solver, c->stream));
    CUDA_CHECK(cusolverDnCreateParams(&c->params));
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    c->smem_optin = size_t(optin);
  }
  return *c;
}

template <class T>
void DBuf<T>::alloc(size_t c, const std::string& who) {
  cuda_util::StreamBuf<T>::alloc(c, context(who).stream, who);
}

unsigned blocks_for(int64_t count, int threads = kThreads) { return unsigned((count + threads - 1) / threads); }

// Groups the tiled clip kernel takes (the rest use the one-thread-per-row generic kernel): its
// double tile needs 153 KiB at g = 128, which sm_80/90 allow but e.g. sm_86/89 (99 KiB) do not.
bool clip_tiled(const Ctx& c, int64_t g) {
  return g % 16 == 0 && g <= kClipMaxGroup && clip_smem_bytes(int(g)) <= c.smem_optin;
}

// Upper factor U [k, k] row-major of (Hp + damp·I)⁻¹ into dU (double), retrying with more damping
// exactly as gptq::prepare does (same λ sequence, same double damping constant); false when every
// try failed.
bool factor_with_retry(const std::string& who, Ctx& c, const GptqOptions& o, const float* dH, const int32_t* dperm,
                       int64_t k, double mean, double* dU, double* damp_used) {
  constexpr double kDampStep = 0.01, kDampMax = 1.0;  // gptq_prep.cpp's retry (GPTQModel's increment)
  DBuf<double> dA(size_t(k * k), who);  // [k, k] col-major: J·Hd·J, then L, then L⁻¹
  DBuf<int> dinfo(2, who);              // [potrf/trtri info, failure flag]
  size_t dev_potrf = 0, host_potrf = 0, dev_trtri = 0, host_trtri = 0;
  CUDA_CHECK(cusolverDnXpotrf_bufferSize(c.solver, c.params, CUBLAS_FILL_MODE_LOWER, k, CUDA_R_64F, dA.p, k,
                                         CUDA_R_64F, &dev_potrf, &host_potrf));
  CUDA_CHECK(cusolverDnXtrtri_bufferSize(c.solver, CUBLAS_FILL_MODE_LOWER, CUBLAS_DIAG_NON_UNIT, k, CUDA_R_64F, dA.p,
                                         k, &dev_trtri, &host_trtri));
  DBuf<uint8_t> dwork(std::max<size_t>(1, std::max(dev_potrf, dev_trtri)), who);
  std::vector<uint8_t> hwork(std::max<size_t>(1, std::max(host_potrf, host_trtri)));
  const dim3 grid(blocks_for(k), unsigned(k));
  for (int attempt = 0;; ++attempt) {
    const double lambda = double(o.damp) + kDampStep * attempt;
    if (attempt > 0 && (!o.auto_damp || lambda >= kDampMax)) return false;
    gather_damped_kernel<<<grid, kThreads, 0, c.stream>>>(dH, dperm, k, lambda * mean, dA.p);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cusolverDnXpotrf(c.solver, c.params, CUBLAS_FILL_MODE_LOWER, k, CUDA_R_64F, dA.p, k, CUDA_R_64F,
                                dwork.p, dwork.count, hwork.data(), hwork.size(), dinfo.p));
    int info[2] = {0, 0};
    CUDA_CHECK(cudaMemcpyAsync(info, dinfo.p, sizeof(int), cudaMemcpyDeviceToHost, c.stream));
    CUDA_CHECK(cudaStreamSynchronize(c.stream));
    if (info[0] < 0)
      fail(ErrorKind::Internal, who + ": cusolverDnXpotrf rejected argument " + std::to_string(-info[0]));
    if (info[0] > 0) continue;  // not numerically positive definite at this damping
    CUDA_CHECK(cusolverDnXtrtri(c.solver, CUBLAS_FILL_MODE_LOWER, CUBLAS_DIAG_NON_UNIT, k, CUDA_R_64F, dA.p, k,
                                dwork.p, dwork.count, hwork.data(), hwork.size(), dinfo.p));
    CUDA_CHECK(cudaMemsetAsync(dinfo.p + 1, 0, sizeof(int), c.stream));
    check_factor_kernel<<<grid, kThreads, 0, c.stream>>>(dA.p, k, dinfo.p + 1);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaMemcpyAsync(info, dinfo.p, 2 * sizeof(int), cudaMemcpyDeviceToHost, c.stream));
    CUDA_CHECK(cudaStreamSynchronize(c.stream));
    if (info[0] != 0 || info[1] != 0) continue;  // singular factor or non-finite/non-positive values
    const dim3 tgrid(unsigned((k + 31) / 32), unsigned((k + 31) / 32)), tblock(32, 8);
    reverse_transpose_kernel<<<tgrid, tblock, 0, c.stream>>>(dA.p, k, dU);
    CUDA_CHECK(cudaGetLastError());
    *damp_used = lambda;
    return true;
  }
}

// One group's scales: clip search (Marlin, upper weighting M [g, g]) or plain absmax, into row srow
// of S/Sh. rows: device list of the group's Wt rows, or null for the consecutive rows p0 .. p0+g−1.
// Ds: [g, n] scratch for the generic clip kernel (groups the tiled kernel does not take).
void fit_group(const std::string& who, Ctx& c, const GptqOptions& o, const double* dWt, int64_t n, const int32_t* rows,
               int64_t p0, int g, const double* M, int64_t srow, float* dS, uint16_t* dSh, double* Ds) {
  if (!M) {
    absmax_scale_kernel<<<blocks_for(n), kThreads, 0, c.stream>>>(dWt, n, rows, p0, g, o.bits, o.bf16_scales, srow, dS,
                                                                  dSh);
  } else if (clip_tiled(c, g)) {
    const size_t smem = clip_smem_bytes(g);
    const unsigned grid = unsigned((n + kClipRows - 1) / kClipRows);
    CUDA_CHECK(cudaFuncSetAttribute(clip_search_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    clip_search_kernel<<<grid, g, smem, c.stream>>>(dWt, n, rows, p0, g, M, o.bits, o.bf16_scales, quant::kMarlinClipGrid,
                                                    quant::kMarlinClipCandidates, srow, dS, dSh);
  } else {
    clip_search_generic_kernel<<<blocks_for(n, 64), 64, 0, c.stream>>>(
        dWt, n, rows, p0, g, M, o.bits, o.bf16_scales, quant::kMarlinClipGrid, quant::kMarlinClipCandidates, srow, dS,
        dSh, Ds);
  }
  CUDA_CHECK(cudaGetLastError());
}

template <class T>
void upload(const std::string& who, Ctx& c, DBuf<T>& d, const std::vector<T>& h) {
  d.alloc(h.size(), who);
  CUDA_CHECK(cudaMemcpyAsync(d.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, c.stream));
}

}  // namespace

}  // namespace gptq_cuda

namespace gptq_cuda {
namespace {

// The back end proper. The Hessian comes from the host (H_host) or from device memory (d_H, e.g.
// straight from hessian_add_cuda): then only its diagonal crosses to the host, and the whole matrix
// only for static act-order, whose clip weights are factored there.
QuantizedLinear quantize(const float* W, int64_t n, int64_t k, const Eigen::MatrixXf* H_host, const float* d_H,
                         const GptqOptions& o, GptqStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  if (H_host) gptq::check_options(o, n, k, *H_host);
  else gptq::check_options(o, n, k, k, k);
  const std::string who = o.name.empty() ? std::string("layer") : o.name;
  Ctx& c = context(who);
  cudaStream_t st = c.stream;

  // Inputs up, validated on the device (a host pass over a 14336² Hessian costs ~0.1 s).
  DBuf<float> dH(size_t(k * k), who), dW(size_t(n * k), who);  // [k, k] col-major natural, [n, k] HF
  DBuf<int> dflag(2, who);
  CUDA_CHECK(cudaMemsetAsync(dflag.p, 0, 2 * sizeof(int), st));
  CUDA_CHECK(cudaMemcpyAsync(dW.p, W, size_t(n * k) * sizeof(float), cudaMemcpyHostToDevice, st));
  CUDA_CHECK(cudaMemcpyAsync(dH.p, H_host ? H_host->data() : d_H, size_t(k * k) * sizeof(float),
                             H_host ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice, st));
  nonfinite_kernel<<<1024, kThreads, 0, st>>>(dW.p, n * k, dflag.p);
  nonfinite_kernel<<<1024, kThreads, 0, st>>>(dH.p, k * k, dflag.p + 1);
  CUDA_CHECK(cudaGetLastError());
  int flags[2] = {0, 0};
  CUDA_CHECK(cudaMemcpyAsync(flags, dflag.p, sizeof(flags), cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(cudaStreamSynchronize(st));
  if (flags[0]) quant::check_finite(o.name, W, n * k);  // throws with the element index
  if (flags[1]) bad_data(who + ": Hessian holds non-finite values");

  // O(k) host part of gptq::prepare: diagonal, dead columns, order, damping scale.
  gptq::Prepared P;  // Wt / U stay empty: they live on the device
  P.n = n;
  P.k = k;
  P.group = gptq::effective_group(o, k);
  P.block = gptq::effective_block(o);
  std::vector<float> diag(static_cast<size_t>(k));  // [k] dead-fixed diag H, natural order
  std::vector<uint8_t> dead(static_cast<size_t>(k), 0);
  std::vector<float> hdiag(static_cast<size_t>(k));  // [k] diag H as given
  if (H_host) {
    for (int64_t j = 0; j < k; ++j) hdiag[size_t(j)] = (*H_host)(j, j);
  } else {  // every (k + 1)-th float of the device matrix
    CUDA_CHECK(cudaMemcpy2DAsync(hdiag.data(), sizeof(float), dH.p, size_t(k + 1) * sizeof(float), sizeof(float),
                                 size_t(k), cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
  }
  for (int64_t j = 0; j < k; ++j) {
    float v = hdiag[size_t(j)];
    if (v < 0.0f) bad_data(who + ": Hessian diagonal H[" + std::to_string(j) + "," + std::to_string(j) + "] is negative");
    if (v == 0.0f) { v = 1.0f; dead[size_t(j)] = 1; ++P.dead; }
    diag[size_t(j)] = v;
  }
  P.perm = gptq::column_order(o.order, diag.data(), k, o.group_size);
  double mean = 0.0;  // summed in processing order, as prepare sums diag(Hp)
  for (int64_t p = 0; p < k; ++p) mean += diag[size_t(P.perm[size_t(p)])];
  mean /= double(k);
  const int64_t g = P.group, G = o.group_size <= 0 ? 1 : k / g, B = P.block;
  std::vector<int32_t> src(static_cast<size_t>(k)), srow(static_cast<size_t>(k)), pos(static_cast<size_t>(k));
  for (int64_t p = 0; p < k; ++p) {
    const int32_t cidx = P.perm[size_t(p)];
    src[size_t(p)] = dead[size_t(cidx)] ? -1 : cidx;
    srow[size_t(p)] = int32_t(gptq::scale_row(o, P, p));
    pos[size_t(cidx)] = int32_t(p);
  }
  DBuf<int32_t> dperm, dsrc, dsrow;
  upload(who, c, dperm, P.perm);
  upload(who, c, dsrc, src);
  upload(who, c, dsrow, srow);

  DBuf<double> dWt(size_t(k * n), who);  // [k, n] working weights, processing order
  {
    const dim3 tgrid(unsigned((k + 31) / 32), unsigned((n + 31) / 32)), tblock(32, 8);
    gather_weights_kernel<<<tgrid, tblock, 0, st>>>(dW.p, dsrc.p, n, k, dWt.p);
    CUDA_CHECK(cudaGetLastError());
  }

  DBuf<double> dU(size_t(k * k), who);  // [k, k] row-major upper factor of the damped permuted H⁻¹
  if (!factor_with_retry(who, c, o, dH.p, dperm.p, k, mean, dU.p, &P.damp_used)) {
    P.fell_back = true;  // RTN: U := I, so errors are neither scaled nor propagated
    P.damp_used = 0.0;
    set_identity_kernel<<<dim3(blocks_for(k), unsigned(k)), kThreads, 0, st>>>(dU.p, k);
    CUDA_CHECK(cudaGetLastError());
  }
  dH.reset();
  dW.reset();

  DBuf<float> dS(size_t(G * n), who);       // [G, n] scales as rounded floats (fp16 or bf16 values)
  DBuf<uint16_t> dSh(size_t(G * n), who);   // [G, n] the same as fp16 / bf16 bits
  const bool clip = o.clip == GptqOptions::Marlin && o.group_size > 0;
  const bool dyn = gptq::dynamic_groups(o);
  DBuf<double> dM;  // [G, g, g] upper clip weights per group
  DBuf<double> dDs;  // [g, n] scratch of the generic clip kernel
  if (clip && !clip_tiled(c, g)) dDs.alloc(size_t(g * n), who);
  if (clip && dyn) {
    dM.alloc(size_t(G * g * g), who);
    group_inverse_kernel<<<unsigned(G), unsigned(std::min<int64_t>(g, 1024)), 0, st>>>(dU.p, k, int(g), dM.p);
    CUDA_CHECK(cudaGetLastError());
  }
  if (!dyn) {
    // Static groups (§1.7) on the un-updated weights in natural order; with clip the group's own
    // damped block chol(H_gg) weighs the error, factored on the host by prepare's own helper (g³/3
    // per group, negligible). The clip kernels take an upper M: J·L·J is upper, and with the
    // group's members listed in reverse order ‖(J·L·J)ᵀ·J·δ‖ = ‖Lᵀ·δ‖, the same objective.
    std::vector<int32_t> member(static_cast<size_t>(k));  // [G, g] Wt rows of each natural group
    for (int64_t i = 0; i < k; ++i) member[size_t(i)] = clip ? pos[size_t(i / g * g + (g - 1 - i % g))] : pos[size_t(i)];
    DBuf<int32_t> dmember;
    upload(who, c, dmember, member);
    if (clip) {
      Eigen::MatrixXf H_down;  // [k, k] host copy when the Hessian came from the device
      if (!H_host) {
        H_down.resize(k, k);
        CUDA_CHECK(cudaMemcpyAsync(H_down.data(), d_H, size_t(k * k) * sizeof(float), cudaMemcpyDeviceToHost, st));
        CUDA_CHECK(cudaStreamSynchronize(st));
      }
      const Eigen::MatrixXf& H = H_host ? *H_host : H_down;
      std::vector<double> Ms(size_t(G * g * g));  // [G, g, g] row-major, upper (reversed lower factors)
      for (int64_t gi = 0; gi < G; ++gi) {
        const gptq::RowMatrixXd L = gptq::static_clip_weight(H, gi, g, P.damp_used * mean, P.fell_back);
        double* out = Ms.data() + gi * g * g;
        for (int64_t a = 0; a < g; ++a)
          for (int64_t b = 0; b < g; ++b) out[a * g + b] = L(g - 1 - a, g - 1 - b);
      }
      upload(who, c, dM, Ms);
    }
    for (int64_t gi = 0; gi < G; ++gi)
      fit_group(who, c, o, dWt.p, n, dmember.p + gi * g, 0, int(g), clip ? dM.p + gi * g * g : nullptr, gi, dS.p,
                dSh.p, dDs.p);
    CUDA_CHECK(cudaStreamSynchronize(st));  // dmember and the host vectors go out of scope here
  }

  DBuf<uint8_t> dcodes(size_t(k * n), who), dmask;  // [k, n] original order
  if (o.sparse24) dmask.alloc(size_t(k * n), who);
  DBuf<double> dE(size_t(B * n), who);  // [B, n] scaled errors of the current block
  DBuf<double> dloss(size_t(n), who);   // [n] Σ err² per output row
  CUDA_CHECK(cudaMemsetAsync(dloss.p, 0, size_t(n) * sizeof(double), st));
  LoopArgs la{};
  la.Wt = dWt.p;
  la.U = dU.p;
  la.S = dS.p;
  la.srow = dsrow.p;
  la.perm = dperm.p;
  la.codes = dcodes.p;
  la.mask = dmask.p;
  la.E = dE.p;
  la.loss = dloss.p;
  la.n = n;
  la.k = k;
  la.bits = o.bits;
  // The block's working columns go to shared memory when they fit the default 48 KiB.
  constexpr int64_t kTileLimit = 48 * 1024;
  const unsigned loop_grid = unsigned((n + kLoopThreads - 1) / kLoopThreads);
  const double one = 1.0, minus_one = -1.0;
  for (int64_t i1 = 0; i1 < k; i1 += B) {
    const int64_t i2 = std::min(i1 + B, k);
    for (int64_t p0 = i1; p0 < i2;) {
      int64_t p1 = i2;
      if (dyn) {
        // Fit on the working copy at each group boundary, which carries all earlier feedback.
        if (p0 % g == 0) {
          const int64_t gi = p0 / g;
          fit_group(who, c, o, dWt.p, n, nullptr, p0, int(g), clip ? dM.p + gi * g * g : nullptr, srow[size_t(p0)],
                    dS.p, dSh.p, dDs.p);
        }
        p1 = std::min(i2, (p0 / g + 1) * g);
      }
      la.i1 = i1;
      la.i2 = i2;
      la.p0 = p0;
      la.p1 = p1;
      const size_t tile = size_t(i2 - p0) * kLoopThreads * sizeof(double);
      la.smem = tile <= size_t(kTileLimit);
      column_loop_kernel<<<loop_grid, kLoopThreads, la.smem ? tile : 0, st>>>(la);
      CUDA_CHECK(cudaGetLastError());
      p0 = p1;
    }
    if (i2 < k) {
      // W[:, i2:] −= E·U[i1:i2, i2:]; column-major view: C [n, k−i2] −= E [n, bs] · (U rows)ᵀ.
      CUDA_CHECK(cublasDgemm(c.blas, CUBLAS_OP_N, CUBLAS_OP_T, int(n), int(k - i2), int(i2 - i1), &minus_one, dE.p,
                             int(n), dU.p + i1 * k + i2, int(k), &one, dWt.p + i2 * n, int(n)));
    }
  }

  QuantizedLinear q = gptq::make_result(o, P);
  std::vector<double> loss(static_cast<size_t>(n));  // [n]
  CUDA_CHECK(cudaMemcpyAsync(q.codes.data(), dcodes.p, q.codes.size(), cudaMemcpyDeviceToHost, st));
  if (o.sparse24) CUDA_CHECK(cudaMemcpyAsync(q.mask.data(), dmask.p, q.mask.size(), cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(cudaMemcpyAsync(q.scales.data(), dSh.p, q.scales.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(cudaMemcpyAsync(loss.data(), dloss.p, loss.size() * sizeof(double), cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(cudaStreamSynchronize(st));
  double total = 0.0;
  for (double l : loss) total += l;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  gptq::finish_stats(W, q, P, 0.5 * total, secs, stats);
  return q;
}

}  // namespace
}  // namespace gptq_cuda

QuantizedLinear gptq_quantize_cuda(const float* W, int64_t n, int64_t k, const Eigen::MatrixXf& H,
                                   const GptqOptions& o, GptqStats* stats) {
  return gptq_cuda::quantize(W, n, k, &H, nullptr, o, stats);
}

double gptq_cuda_device_bytes(int64_t n, int64_t k) {
  // quantize()'s largest buffers at once: H (fp32) and its factor U and the factorisation's matrix (fp64),
  // W (fp32), the working weights (fp64) and the codes (bytes); scales and per-block scratch are small.
  const double kk = double(k) * double(k), nk = double(n) * double(k);
  return kk * (4 + 8 + 8) + nk * (4 + 8 + 1);
}

QuantizedLinear gptq_quantize_cuda_device(const float* W, int64_t n, int64_t k, const float* d_H,
                                          const GptqOptions& o, GptqStats* stats) {
  return gptq_cuda::quantize(W, n, k, nullptr, d_H, o, stats);
}

void hessian_add_cuda(float* d_sum, int64_t k, const void* X, int64_t t, ActDtype dtype, bool x_on_device,
                      const std::string& name) {
  using namespace gptq_cuda;
  const std::string& who = name;
  if (k <= 0 || t < 0) bad_usage(who + ": Hessian batch [" + std::to_string(t) + ", " + std::to_string(k) + "] is invalid");
  if (t == 0) return;
  Ctx& c = context(who);
  const size_t elt = dtype == ActDtype::F32 ? 4 : 2;
  DBuf<uint8_t> staged;
  const void* dX = X;
  if (!x_on_device) {
    staged.alloc(size_t(t * k) * elt, who);
    CUDA_CHECK(cudaMemcpyAsync(staged.p, X, size_t(t * k) * elt, cudaMemcpyHostToDevice, c.stream));
    dX = staged.p;
  }
  const cudaDataType in = dtype == ActDtype::F32 ? CUDA_R_32F : dtype == ActDtype::F16 ? CUDA_R_16F : CUDA_R_16BF;
  const float one = 1.0f;
  // X row-major [t, k] is column-major [k, t]: Σ x xᵀ = X_cm·X_cmᵀ, fp32 accumulation (no TF32).
  CUDA_CHECK(cublasGemmEx(c.blas, CUBLAS_OP_N, CUBLAS_OP_T, int(k), int(k), int(t), &one, dX, in, int(k), dX, in,
                          int(k), &one, d_sum, CUDA_R_32F, int(k), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  CUDA_CHECK(cudaStreamSynchronize(c.stream));
}

void hessian_finalize_cuda_device(const float* d_sum, int64_t k, int64_t tokens, float* d_H, const std::string& name) {
  using namespace gptq_cuda;
  const std::string& who = name;  // CUDA_CHECK names it
  if (tokens <= 0) bad_usage(who + ": no calibration token was added, the Hessian is undefined");
  Ctx& c = context(who);
  finalize_hessian_kernel<<<dim3(blocks_for(k), unsigned(k)), kThreads, 0, c.stream>>>(d_sum, k,
                                                                                     float(2.0 / double(tokens)), d_H);
  CUDA_CHECK(cudaGetLastError());
  CUDA_CHECK(cudaStreamSynchronize(c.stream));
}

Eigen::MatrixXf hessian_finalize_cuda(const float* d_sum, int64_t k, int64_t tokens, const std::string& name) {
  using namespace gptq_cuda;
  const std::string& who = name;
  Ctx& c = context(who);
  DBuf<float> dH(size_t(k * k), who);  // [k, k]
  hessian_finalize_cuda_device(d_sum, k, tokens, dH.p, name);
  Eigen::MatrixXf H(k, k);
  CUDA_CHECK(cudaMemcpyAsync(H.data(), dH.p, size_t(k * k) * sizeof(float), cudaMemcpyDeviceToHost, c.stream));
  CUDA_CHECK(cudaStreamSynchronize(c.stream));
  return H;
}

}  // namespace marlinc
