#include "quantizer/calib/calib_pass.h"

#include <omp.h>

#include <array>
#include <chrono>

#include "checkpoint/error.h"
#include "quantizer/hessian.h"

namespace marlinc::calib {

LinearInput input_of(Linear l) {
  switch (l) {
    case Linear::Q: case Linear::K: case Linear::V: return LinearInput::QKV;
    case Linear::O: return LinearInput::O;
    case Linear::Gate: case Linear::Up: return LinearInput::GateUp;
    case Linear::Down: return LinearInput::Down;
  }
  return LinearInput::QKV;
}

std::vector<QuantizedLinear> CalibPass::quantize_all(const std::vector<Linear>& ls, const std::vector<GptqOptions>& o,
                                                     std::vector<GptqStats>& stats) {
  stats.assign(ls.size(), GptqStats{});
  std::vector<QuantizedLinear> out;
  for (size_t i = 0; i < ls.size(); ++i) out.push_back(quantize(ls[i], o[i], &stats[i]));
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

class CpuPass : public CalibPass {
 public:
  CpuPass(const LlamaModel& m, const std::vector<std::vector<int32_t>>& samples) : m_(m), hs_(samples.size()) {
    const auto t0 = Clock::now();
    for (size_t i = 0; i < hs_.size(); ++i) hs_[i] = m.embed(samples[i]);  // [T_i, hidden]
    t_.forward += since(t0);
  }

  void load(int64_t block) override {
    W_ = m_.load_block(block);
    for (auto& h : H_) h.reset();
  }

  // The forwards of a chunk of samples run in parallel and keep their captured inputs; the sums then
  // take them in sample order, so the Hessians do not depend on the thread count.
  void capture(std::initializer_list<LinearInput> groups) override {
    std::array<std::unique_ptr<HessianAccumulator>, 4> acc;
    for (LinearInput g : groups) acc[size_t(g)] = std::make_unique<HessianAccumulator>(in_features(g));
    const size_t chunk = size_t(std::max(1, 2 * omp_get_max_threads()));
    for (size_t c0 = 0; c0 < hs_.size(); c0 += chunk) {
      const size_t cn = std::min(chunk, hs_.size() - c0);
      std::vector<std::array<Matrix, 4>> inputs(cn);  // [sample][group] -> [T, in]
      const auto t0 = Clock::now();
#pragma omp parallel for schedule(dynamic, 1)
      for (long long i = 0; i < (long long)cn; ++i) {
        Matrix x = hs_[c0 + size_t(i)];
        m_.block_forward(x, W_, [&](LinearInput g, const Matrix& X) {
          if (acc[size_t(g)]) inputs[size_t(i)][size_t(g)] = X;
        });
      }
      t_.forward += since(t0);
      const auto th = Clock::now();
      for (size_t i = 0; i < cn; ++i)
        for (size_t g = 0; g < 4; ++g)
          if (acc[g]) acc[g]->add(inputs[i][g].data(), inputs[i][g].rows());
      t_.hessian += since(th);
    }
    const auto th = Clock::now();
    for (size_t g = 0; g < 4; ++g) H_[g] = acc[g] ? std::make_unique<Eigen::MatrixXf>(acc[g]->finalize()) : nullptr;
    t_.hessian += since(th);
  }

  QuantizedLinear quantize(Linear l, const GptqOptions& o, GptqStats* stats) override {
    const auto& H = H_[size_t(input_of(l))];
    if (!H) fail(ErrorKind::Internal, o.name + ": quantized before its group's Hessian was captured");
    const auto t0 = Clock::now();
    const Matrix& Wl = W_.weight(l);  // [n, k]
    QuantizedLinear q = gptq_quantize(Wl.data(), Wl.rows(), Wl.cols(), *H, o, stats);
    t_.gptq += since(t0);
    return q;
  }

  void set_weight(Linear l, const QuantizedLinear& q) override {
    Matrix& Wl = W_.weight(l);               // [n, k]
    const std::vector<float> dq = dequantize(q);  // [k, n]
    for (int64_t r = 0; r < q.k; ++r)
      for (int64_t col = 0; col < q.n; ++col) Wl(col, r) = dq[size_t(r * q.n + col)];
  }

  void advance() override {
    const auto t0 = Clock::now();
#pragma omp parallel for schedule(dynamic, 1)
    for (long long i = 0; i < (long long)hs_.size(); ++i) m_.block_forward(hs_[size_t(i)], W_);
    t_.forward += since(t0);
  }

 private:
  int64_t in_features(LinearInput g) const {
    const LlamaConfig& c = m_.config();
    return g == LinearInput::O ? c.heads * c.head_dim : g == LinearInput::Down ? c.intermediate : c.hidden;
  }

  const LlamaModel& m_;
  std::vector<Matrix> hs_;  // [samples] x [T_i, hidden]
  BlockWeights W_;
  std::array<std::unique_ptr<Eigen::MatrixXf>, 4> H_;  // finalized, per group, from the last capture
};

}  // namespace

std::unique_ptr<CalibPass> make_cpu_pass(const LlamaModel& m, const std::vector<std::vector<int32_t>>& samples) {
  return std::make_unique<CpuPass>(m, samples);
}

}  // namespace marlinc::calib
