#include "quantizer/calib/gpu_calib.h"

#ifdef MARLINC_HAVE_CUDA
#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <thread>

#include "checkpoint/convert_dtype.h"
#include "checkpoint/error.h"
#include "kernels/marlin.h"
#include "packer/marlin.h"
#include "quantizer/calib/calib_pass.h"
#include "quantizer/cuda_util.cuh"
#include "quantizer/gptq_cuda.cuh"

namespace marlinc::calib {

// forward_cuda.cu indexes linears, groups and biases by these values.
static_assert(int(Linear::Q) == 0 && int(Linear::O) == 3 && int(Linear::Down) == 6, "CudaForward's linear order");
static_assert(int(LinearInput::QKV) == 0 && int(LinearInput::O) == 1 && int(LinearInput::GateUp) == 2 &&
              int(LinearInput::Down) == 3, "CudaForward's group order");
static_assert(int(GpuVec::BiasDown) - int(GpuVec::BiasQ) == int(Linear::Down), "biases follow the linear order");
static_assert(kGpuDenseMlp == kDenseMlp && kGpuSharedExpert == kSharedExpert && kGpuAllExperts == kAllExperts,
              "CudaForward's MLP indices");
static_assert(int(GpuActivation::Silu) == int(Activation::Silu) && int(GpuActivation::GeluTanh) == int(Activation::GeluTanh) &&
              int(GpuActivation::Gelu) == int(Activation::Gelu), "the activations' order");

void require_cuda_device(const std::string& what) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky error
    bad_usage(what + ": no CUDA device is visible (" +
              std::string(e != cudaSuccess ? cudaGetErrorString(e) : "device count 0") + "); use --device cpu");
  }
}

// Device memory free to allocate: the driver's free memory and what the stream-ordered pool (GPTQ's scratch,
// cudaMallocAsync) holds unused.
double available_device_bytes() {
  size_t free_b = 0, total = 0;
  if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) return 0;
  int dev = 0;
  cudaMemPool_t pool = nullptr;
  uint64_t reserved = 0, used = 0;
  if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetDefaultMemPool(&pool, dev) == cudaSuccess &&
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) == cudaSuccess &&
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess && reserved > used)
    free_b += size_t(reserved - used);
  cudaGetLastError();  // a failed query above must not stick
  return double(free_b);
}

size_t gpu_gptq_at_once(const LlamaConfig& c) {
  // q/k/v and gate/up are the groups of a dense block: three covers them. An MoE block's group holds two or three
  // linears per expert, each small: more at once keep the GPU busy (16 measured no faster than 8).
  return c.has_moe() ? 8 : 3;
}

GpuDims gpu_dims(const LlamaConfig& c) {
  GpuDims d;
  d.hidden = c.hidden;
  d.intermediate = c.intermediate;
  d.heads = c.heads;
  d.kv_heads = c.kv_heads;
  d.head_dim = c.head_dim;
  d.sliding_window = c.sliding_window;
  d.rms_eps = c.rms_eps;
  d.activation = GpuActivation(int(c.act));
  d.attn_scale = c.attn_scale;
  d.attn_softcap = c.attn_softcap;
  d.sandwich_norms = c.sandwich_norms;
  d.rotary_dim = c.rotary_dim;
  const bool longrope = c.rope_scaling.type == "longrope";
  d.rope_scale = longrope ? c.rope_scaling.attention_factor : 1.0;
  d.rope_long_after = longrope ? c.rope_scaling.original_max_position_embeddings : 0;
  d.residual_scale = c.residual_multiplier;
  if (c.has_moe()) {
    d.experts = c.moe.experts;
    d.top_k = c.moe.top_k;
    d.expert_intermediate = c.moe.expert_intermediate;
    d.shared_intermediate = c.moe.shared_intermediate;
    // The CPU pass's routing rule (moe_forward.cpp) on the GPU's logits.
    d.route = [c](const float* logits, int64_t tokens, int32_t* expert, float* weight) {
      route_logits(c, logits, tokens, c.moe.experts, expert, weight);
    };
  }
  return d;
}

namespace {

// The checkpoint bytes of a block linear's plain weight [rows, in]: its rows of a fused module.
std::span<const uint8_t> linear_bytes(const LlamaModel& m, int64_t b, LinearRef r, DType* dtype) {
  const LinearSource s = linear_source(m.config(), b, r);
  const std::string name = s.prefix + ".weight";
  const auto ref = m.checkpoint().at(name);
  const DType dt = ref.info->dtype;
  if (dt != DType::F32 && dt != DType::F16 && dt != DType::BF16)
    bad_data(name + ": dtype " + std::string(dtype_name(dt)) + "; the GPU pass reads F32, F16 or BF16");
  if (ref.info->shape != std::vector<int64_t>{s.total_rows, s.in})
    bad_data(name + ": shape differs from the [" + std::to_string(s.total_rows) + ", " + std::to_string(s.in) +
             "] config.json implies");
  if (dtype) *dtype = dt;
  const size_t row = size_t(s.in) * dtype_size(dt);
  return ref.file->data(*ref.info).subspan(size_t(s.row0) * row, size_t(s.rows) * row);
}

}  // namespace

GpuAct gpu_act_for(const LlamaModel& m) {
  const auto ref = m.checkpoint().find(linear_source(m.config(), 0, Linear::Q).prefix + ".weight");
  return ref && ref->info->dtype == DType::BF16 ? GpuAct::BF16 : GpuAct::F16;
}

std::unique_ptr<CudaForward> make_gpu_forward(const LlamaModel& m, const std::vector<std::vector<int32_t>>& samples,
                                              GpuAct act, size_t chunk_tokens) {
  std::vector<size_t> lengths;
  for (const auto& s : samples) lengths.push_back(s.size());
  const LlamaConfig& c = m.config();

  auto f = std::make_unique<CudaForward>(
      gpu_dims(c), lengths, act, rope_inv_freq(c), chunk_tokens,
      c.local_rope_theta > 0 ? rope_inv_freq(c, /*local=*/true) : std::vector<float>(),
      c.rope_scaling.type == "longrope" ? rope_inv_freq(c, false, /*long_seq=*/true) : std::vector<float>());
  // Embedded in parallel, a bounded batch of samples at a time, uploaded in sample order.
  constexpr size_t kBatch = 64;
  for (size_t s0 = 0; s0 < samples.size(); s0 += kBatch) {
    const size_t sn = std::min(kBatch, samples.size() - s0);
    std::vector<Matrix> h(sn);  // [T_i, hidden] each
    std::vector<std::exception_ptr> err(sn);  // an exception must not leave the parallel region
#pragma omp parallel for schedule(dynamic, 1)
    for (long long i = 0; i < (long long)sn; ++i) {
      try {
        h[size_t(i)] = m.embed(samples[s0 + size_t(i)]);
      } catch (...) {
        err[size_t(i)] = std::current_exception();
      }
    }
    for (size_t i = 0; i < sn; ++i) {
      if (err[i]) std::rethrow_exception(err[i]);
      f->set_hidden(s0 + i, h[i].data(), size_t(h[i].size()));
    }
  }
  return f;
}

std::unique_ptr<CudaForward> make_gpu_forward(const LlamaModel& m, const std::vector<std::vector<int32_t>>& samples,
                                              size_t chunk_tokens) {
  return make_gpu_forward(m, samples, gpu_act_for(m), chunk_tokens);
}

std::string marlin_rule(const QuantizedLinear& q, GpuAct act) {
  if (q.bits != 4 || !q.sym) return "4-bit symmetric codes";
  if (!q.mask.empty()) return "dense weights (2:4 layers run dequantized)";
  if (!q.trivial_g_idx()) return "no act-order g_idx";
  if (!kernels::marlin_shape_supported(q.n, q.k)) return "k % 128 == 0 and n % 64 == 0";
  if (q.group_size > 0 && q.group_size < q.k && q.group_size != 32 && q.group_size != 64 && q.group_size != 128)
    return "group size -1, 32, 64 or 128";
  if ((q.scale_type == ScaleType::BF16) != (act == GpuAct::BF16)) return "scales of the activations' type";
  return "";
}

void upload_block(CudaForward& f, const LlamaModel& m, int64_t b, const QuantizedLinears* ql, bool kernel,
                  GpuLinearCounts* counts) {
  const LlamaConfig& c = m.config();
  const BlockWeights w = m.load_block(b, nullptr, /*linears=*/false);
  GpuLinearCounts n;
  for (LinearInput g : {LinearInput::QKV, LinearInput::O, LinearInput::GateUp, LinearInput::Down})
    for (LinearRef r : block_linears(c, b, g)) {
      const int l = int(r.l);
      const std::optional<QuantizedLinear> q = ql ? ql->quantized(b, r) : std::nullopt;
      if (q && kernel && marlin_rule(*q, f.act()).empty()) {
        const std::vector<int32_t> B = marlin::pack_weights(q->codes.data(), q->k, q->n, 4);           // [k/16, 2n]
        const std::vector<uint16_t> s = marlin::permute_scales(q->scales.data(), q->groups(), q->n);  // [G, n]
        f.set_linear_marlin(l, B.data(), B.size(), s.data(), s.size(), q->group_size, r.expert);
        ++n.kernel;
      } else if (q) {
        upload_quantized(f, r, *q);
        ++n.dequantized;
      } else {
        DType dt = DType::F32;
        const auto bytes = linear_bytes(m, b, r, &dt);
        f.set_linear(l, bytes.data(), bytes.size(),
                     dt == DType::F32 ? GpuRaw::F32 : dt == DType::F16 ? GpuRaw::F16 : GpuRaw::BF16, r.expert);
        ++n.plain;
      }
      if (r.expert != kDenseMlp) continue;  // experts have no biases
      const Vector& bias = w.bias(r);
      f.set_vector(GpuVec(int(GpuVec::BiasQ) + l), bias.data(), size_t(bias.size()));
    }
  if (w.moe) {  // the router and Qwen2-MoE's shared-expert gate stay 16-bit in every checkpoint
    f.set_linear(kGpuRouter, w.router.data(), size_t(w.router.size()) * sizeof(float), GpuRaw::F32);
    if (w.shared_gate.size())
      f.set_linear(kGpuSharedGate, w.shared_gate.data(), size_t(w.shared_gate.size()) * sizeof(float), GpuRaw::F32);
  }
  f.set_vector(GpuVec::InputNorm, w.input_norm.data(), size_t(w.input_norm.size()));
  f.set_vector(GpuVec::PostNorm, w.post_norm.data(), size_t(w.post_norm.size()));
  f.set_vector(GpuVec::QNorm, w.q_norm.data(), size_t(w.q_norm.size()));
  f.set_vector(GpuVec::KNorm, w.k_norm.data(), size_t(w.k_norm.size()));
  f.set_vector(GpuVec::AttnOutNorm, w.attn_out_norm.data(), size_t(w.attn_out_norm.size()));
  f.set_vector(GpuVec::MlpOutNorm, w.mlp_out_norm.data(), size_t(w.mlp_out_norm.size()));
  f.set_layer(c.layer_slides(b), c.layer_local_rope(b), c.layer_rope(b), c.layer_moe(b));
  if (counts) {
    counts->plain += n.plain;
    counts->kernel += n.kernel;
    counts->dequantized += n.dequantized;
  }
}

std::vector<Matrix> gpu_final_hidden(const LlamaModel& m, const std::vector<std::vector<int32_t>>& windows,
                                     const QuantizedLinears* ql, bool kernel, GpuLinearCounts* counts) {
  // bf16 activations when the checkpoint's plain tensors are bf16 (a quantized one has no q_proj weight
  // to judge by: its norms tell).
  const auto norm = m.checkpoint().at("model.norm.weight");
  const GpuAct act = norm.info->dtype == DType::BF16 ? GpuAct::BF16 : GpuAct::F16;
  auto f = make_gpu_forward(m, windows, act, CudaForward::kDefaultChunkTokens);
  for (int64_t b = 0; b < m.config().layers; ++b) {
    upload_block(*f, m, b, ql, kernel, counts);
    run_block(*f, {}, true, b);
  }
  std::vector<Matrix> out;
  for (size_t w = 0; w < windows.size(); ++w) out.push_back(download_hidden(*f, w, m.config().hidden));
  return out;
}

void upload_quantized(CudaForward& f, LinearRef r, const QuantizedLinear& q) {
  GpuQuantized g;
  g.k = q.k;
  g.n = q.n;
  g.bits = q.bits;
  g.group_size = q.group_size;
  g.sym = q.sym;
  g.bf16_scales = q.scale_type == ScaleType::BF16;
  if (q.codes.size() != size_t(q.k * q.n) || q.scales.size() != size_t(q.groups() * q.n) ||
      (!q.sym && q.zeros.size() != q.scales.size()) || (!q.g_idx.empty() && q.g_idx.size() != size_t(q.k)) ||
      (!q.mask.empty() && q.mask.size() != q.codes.size()))
    bad_data(q.name + ": quantized arrays do not match [k=" + std::to_string(q.k) + ", n=" + std::to_string(q.n) + "]");
  g.codes = q.codes.data();
  g.scales = q.scales.data();
  g.zeros = q.sym ? nullptr : q.zeros.data();
  g.g_idx = q.g_idx.empty() ? nullptr : q.g_idx.data();
  g.mask = q.mask.empty() ? nullptr : q.mask.data();
  f.set_linear_quantized(int(r.l), g, r.expert);
}

void run_block(CudaForward& f, std::initializer_list<LinearInput> capture, bool update, int64_t block) {
  bool want[4] = {false, false, false, false};
  for (LinearInput g : capture) want[int(g)] = true;
  f.run(want, update, block);
}

Matrix download_hidden(const CudaForward& f, size_t sample, int64_t hidden) {
  Matrix h(int64_t(f.sample_tokens(sample)), hidden);
  f.get_hidden(sample, h.data(), size_t(h.size()));
  return h;
}

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Host threads that live as long as the pass, so that what gptq_cuda.cu keeps per thread (a CUDA
// stream, cuBLAS and cuSOLVER handles: tens of milliseconds to create) is made once, and that are not
// OpenMP threads, so the OpenMP loops inside each layer's GPTQ still get a team of their own.
class Workers {
 public:
  explicit Workers(size_t n) {
    for (size_t w = 0; w < n; ++w) threads_.emplace_back([this, w] { loop(w); });
  }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;
  ~Workers() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  size_t size() const { return threads_.size(); }
  // fn(i) for i in [0, count), index i on worker i % size(); returns when all are done and rethrows
  // the error of the lowest failing index.
  void run(size_t count, const std::function<void(size_t)>& fn) {
    std::vector<std::exception_ptr> err(count);
    {
      std::lock_guard<std::mutex> lk(m_);
      fn_ = &fn;
      err_ = &err;
      count_ = count;
      busy_ = threads_.size();
      ++generation_;
    }
    cv_.notify_all();
    std::unique_lock<std::mutex> lk(m_);
    done_cv_.wait(lk, [&] { return busy_ == 0; });
    fn_ = nullptr;
    for (auto& e : err)
      if (e) std::rethrow_exception(e);
  }

 private:
  void loop(size_t w) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(size_t)>* fn;
      std::vector<std::exception_ptr>* err;
      size_t count;
      {
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        fn = fn_;
        err = err_;
        count = count_;
      }
      for (size_t i = w; i < count; i += threads_.size()) {
        try {
          (*fn)(i);
        } catch (...) {
          (*err)[i] = std::current_exception();
        }
      }
      {
        std::lock_guard<std::mutex> lk(m_);
        --busy_;
      }
      done_cv_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(size_t)>* fn_ = nullptr;
  std::vector<std::exception_ptr>* err_ = nullptr;
  size_t count_ = 0, busy_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

// H = I [k, k] in device memory, without a k x k host matrix (Mixtral's is 822 MB).
void identity(float* H, int64_t k, const std::string& who) {
  const std::vector<float> ones(size_t(k), 1.0f);
  cuda_util::check(cudaMemset(H, 0, size_t(k * k) * sizeof(float)), "cudaMemset", __FILE__, __LINE__, who);
  cuda_util::check(cudaMemcpy2D(H, size_t(k + 1) * sizeof(float), ones.data(), sizeof(float), sizeof(float), size_t(k),
                                cudaMemcpyHostToDevice),
                   "cudaMemcpy2D", __FILE__, __LINE__, who);
  // The copy from pageable memory may return early; GPTQ reads H on its own non-blocking stream.
  cuda_util::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", __FILE__, __LINE__, who);
}

// Everything on the device: hidden states, the block, the Hessians (finalized in device memory and
// handed to GPTQ there). Only the linear being quantized crosses as fp32 (GPTQ's host interface) and
// its dequantized result comes back.
class GpuPass : public CalibPass {
 public:
  // The share of the free device memory the concurrent GPTQs may plan on (the rest: fragmentation, cuBLAS).
  static constexpr double kGptqMemoryShare = 0.8;
  GpuPass(const LlamaModel& m, const std::vector<std::vector<int32_t>>& samples, ExpertCalibration ec)
      : m_(m), ec_(ec), workers_(gpu_gptq_at_once(m.config())) {
    const auto t0 = Clock::now();
    f_ = make_gpu_forward(m, samples);
    f_->set_experts_see_all(ec == ExpertCalibration::All);
    t_.forward += since(t0);
  }

  void load(int64_t block) override {
    block_ = block;
    upload_block(*f_, m_, block);
    H_.clear();
    captured_.fill(false);
  }

  void capture(std::initializer_list<LinearInput> groups) override {
    f_->clear_hessians();
    H_.clear();
    captured_.fill(false);
    const auto t0 = Clock::now();
    const double g0 = f_->hessian_seconds();
    run_block(*f_, groups, false, block_);
    for (LinearInput g : groups) captured_[size_t(g)] = true;
    const double gram = f_->hessian_seconds() - g0;
    t_.forward += since(t0) - gram;
    t_.hessian += gram;
  }

  QuantizedLinear quantize(LinearRef r, const GptqOptions& o, GptqStats* stats) override {
    std::vector<GptqStats> st;
    QuantizedLinear q = std::move(quantize_all({r}, {o}, st)[0]);
    if (stats) *stats = st[0];
    return q;
  }

  int64_t hessian_tokens(LinearRef r) const override {
    const auto [g, e] = hessian_key(r, ec_);
    return f_->hessian_rows(int(g), e);
  }

  // The Hessians are finalized first, in order, each replacing its sum (so an MoE block holds one k x k matrix per
  // expert and group, not two); then the linears run on the pass's worker threads, as many at once as the
  // device's free memory takes.
  std::vector<QuantizedLinear> quantize_all(const std::vector<LinearRef>& ls, const std::vector<GptqOptions>& o,
                                            std::vector<GptqStats>& stats) override {
    const LlamaConfig& c = m_.config();
    const auto th = Clock::now();
    for (size_t i = 0; i < ls.size(); ++i) {
      const auto [gi, expert] = hessian_key(ls[i], ec_);
      const int g = int(gi);
      const Key key{g, expert};
      if (!captured_[size_t(g)]) fail(ErrorKind::Internal, o[i].name + ": quantized before its group's Hessian was captured");
      if (H_.count(key)) continue;
      const int64_t k = group_in_features(c, gi, ls[i].expert), rows = f_->hessian_rows(g, expert);
      cuda_util::DBuf<float> H;
      H.reserve(size_t(k * k), o[i].name + ": Hessian");
      if (rows > 0) {
        const float* sum = f_->hessian_sum(g, expert);
        if (!sum) fail(ErrorKind::Internal, o[i].name + ": its Hessian sum was released before it was finalized");
        hessian_finalize_cuda_device(sum, k, rows, H.p, o[i].name);
        f_->release_hessian(g, expert);
      } else {
        identity(H.p, k, o[i].name);  // an expert no token was routed to: H = I, as the CPU pass gives it
      }
      cuda_util::DBuf<float>& dst = H_[key];  // only a finished matrix enters H_ (DBuf does not move)
      std::swap(dst.p, H.p);
      std::swap(dst.count, H.count);
    }
    t_.hessian += since(th);
    const auto t0 = Clock::now();
    std::vector<std::vector<float>> W(ls.size());  // [n, k] fp32, GPTQ's host interface
    double per_layer = 0;
    for (size_t i = 0; i < ls.size(); ++i) {
      DType dt = DType::F32;
      const auto bytes = linear_bytes(m_, block_, ls[i], &dt);
      W[i] = to_float(bytes, dt);
      const int64_t k = group_in_features(c, input_of(ls[i].l), ls[i].expert);
      per_layer = std::max(per_layer, gptq_cuda_device_bytes(int64_t(W[i].size()) / k, k));
    }
    // Mixtral's down_proj needs about 5 GB each: eight at once would not fit beside a large model's Hessians.
    const size_t at_once = std::clamp<size_t>(size_t(kGptqMemoryShare * available_device_bytes() / per_layer), 1,
                                              workers_.size());
    std::vector<QuantizedLinear> out(ls.size());
    stats.assign(ls.size(), GptqStats{});
    for (size_t i0 = 0; i0 < ls.size(); i0 += at_once) {
      workers_.run(std::min(at_once, ls.size() - i0), [&](size_t j) {
        const size_t i = i0 + j;
        const auto [g, expert] = hessian_key(ls[i], ec_);
        const Key key{int(g), expert};
        const int64_t k = group_in_features(c, input_of(ls[i].l), ls[i].expert);
        GptqOptions go = o[i];
        go.device = GptqOptions::Device::Cuda;
        out[i] = gptq_quantize_cuda_device(W[i].data(), int64_t(W[i].size()) / k, k, H_.at(key).p, go, &stats[i]);
      });
    }
    t_.gptq += since(t0);
    return out;
  }

  void set_weight(LinearRef r, const QuantizedLinear& q) override { upload_quantized(*f_, r, q); }

  void advance() override {
    const auto t0 = Clock::now();
    run_block(*f_, {}, true, block_);
    t_.forward += since(t0);
  }

 private:
  using Key = std::pair<int, int32_t>;  // (input group, expert or kDenseMlp / kSharedExpert)

  const LlamaModel& m_;
  const ExpertCalibration ec_;
  std::unique_ptr<CudaForward> f_;
  int64_t block_ = -1;
  std::map<Key, cuda_util::DBuf<float>> H_;  // finalized Hessians [k, k] on the device
  std::array<bool, 4> captured_{};           // groups of the last capture
  Workers workers_;
};

}  // namespace

std::unique_ptr<CalibPass> make_gpu_pass(const LlamaModel& m, const std::vector<std::vector<int32_t>>& samples,
                                         ExpertCalibration ec) {
  return std::make_unique<GpuPass>(m, samples, ec);
}

}  // namespace marlinc::calib
#endif  // MARLINC_HAVE_CUDA
