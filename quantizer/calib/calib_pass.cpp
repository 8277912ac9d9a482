#include "quantizer/calib/calib_pass.h"

#include <omp.h>

#include <chrono>
#include <exception>
#include <iterator>
#include <map>
#include <utility>

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

std::pair<LinearInput, int32_t> hessian_key(LinearRef r, ExpertCalibration ec) {
  const LinearInput g = input_of(r.l);
  if (ec == ExpertCalibration::All && g == LinearInput::GateUp && r.expert >= 0) return {g, kAllExperts};
  return {g, r.expert};
}

size_t cpu_pass_chunk_samples() { return size_t(std::max(1, 2 * omp_get_max_threads())); }

std::vector<QuantizedLinear> CalibPass::quantize_all(const std::vector<LinearRef>& ls, const std::vector<GptqOptions>& o,
                                                     std::vector<GptqStats>& stats) {
  stats.assign(ls.size(), GptqStats{});
  std::vector<QuantizedLinear> out;
  for (size_t i = 0; i < ls.size(); ++i) out.push_back(quantize(ls[i], o[i], &stats[i]));
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// f(0) .. f(n - 1) on the OpenMP threads, one index at a time. An exception must not leave an OpenMP region
// (std::terminate): the lowest index's is rethrown once all have run.
template <class F>
void parallel_each(size_t n, const F& f) {
  std::vector<std::exception_ptr> err(n);
#pragma omp parallel for schedule(dynamic, 1)
  for (long long i = 0; i < (long long)n; ++i) {
    try {
      f(size_t(i));
    } catch (...) {
      err[size_t(i)] = std::current_exception();
    }
  }
  for (const auto& e : err)
    if (e) std::rethrow_exception(e);
}

// Rows bound for one Hessian, added kStageRows at a time.
class RowStage {
 public:
  static constexpr int64_t kStageRows = 256;
  void add(const Matrix& X, HessianAccumulator& a) {  // X [t, k]
    for (int64_t r = 0; r < X.rows();) {
      if (buf_.rows() == 0) buf_.resize(kStageRows, X.cols());
      const int64_t take = std::min(kStageRows - n_, X.rows() - r);
      buf_.middleRows(n_, take) = X.middleRows(r, take);
      n_ += take, r += take;
      if (n_ == kStageRows) flush(a);
    }
  }
  void flush(HessianAccumulator& a) {
    if (n_ > 0) a.add(buf_.data(), n_);
    n_ = 0;
  }

 private:
  Matrix buf_;  // [kStageRows, k], allocated on first use
  int64_t n_ = 0;
};

class CpuPass : public CalibPass {
 public:
  CpuPass(const LlamaModel& m, const std::vector<std::vector<int32_t>>& samples, ExpertCalibration ec)
      : m_(m), ec_(ec), hs_(samples.size()) {
    const auto t0 = Clock::now();
    for (size_t i = 0; i < hs_.size(); ++i) hs_[i] = m.embed(samples[i]);  // [T_i, hidden]
    t_.forward += since(t0);
  }

  void load(int64_t block) override {
    W_ = m_.load_block(block);
    H_.clear();
    tokens_.clear();
  }

  // The forwards of a chunk of samples run in parallel and keep their captured inputs; the sums then
  // take them in sample order, so the Hessians do not depend on the thread count.
  // An MoE block's experts each have their own Hessians (from the tokens routed to them).
  void capture(std::initializer_list<LinearInput> groups) override {
    const LlamaConfig& c = m_.config();
    std::map<Key, HessianAccumulator> acc;
    for (LinearInput g : groups)
      for (LinearRef r : block_linears(c, W_.index, g))
        acc.try_emplace(hessian_key(r, ec_), group_in_features(c, g, r.expert));
    const size_t chunk = cpu_pass_chunk_samples();
    // The routed experts' accumulators; every other one reads all the tokens (under ExpertCalibration::All the
    // experts' too).
    const auto is_routed = [&](const Key& k) { return k.second >= 0 && ec_ == ExpertCalibration::Routed; };
    std::vector<std::pair<const Key, HessianAccumulator>*> routed;
    std::map<Key, RowStage> stage;  // their rows not yet in their sums
    for (auto& kv : acc)
      if (is_routed(kv.first)) routed.push_back(&kv), stage[kv.first];
    for (size_t c0 = 0; c0 < hs_.size(); c0 += chunk) {
      const size_t cn = std::min(chunk, hs_.size() - c0);
      std::vector<std::map<Key, Matrix>> inputs(cn);  // [sample] (group, expert) -> [T or routed, in]
      const auto t0 = Clock::now();
      parallel_each(cn, [&](size_t i) {
        Matrix x = hs_[c0 + i];
        m_.block_forward(
            x, W_,
            [&](LinearInput g, int32_t expert, const Matrix& X) {
              if (acc.count(Key{g, expert})) inputs[i][Key{g, expert}] = X;
            },
            ec_);
      });
      t_.forward += since(t0);
      const auto th = Clock::now();
      // Each accumulator takes its samples in order. Those that read every token (attention, a dense MLP,
      // the shared expert) split each product across the threads (hessian.cpp). A routed expert sees a few
      // dozen rows per sample, too few to make a pass over its [k, k] sum worth it: the experts take their
      // rows in batches of kStageRows, side by side, each on one thread. The batch boundaries fall at fixed
      // places in the sample-ordered rows, so no sum depends on the thread count.
      for (auto& [key, a] : acc) {
        if (is_routed(key)) continue;
        for (size_t i = 0; i < cn; ++i) {
          const auto it = inputs[i].find(key);
          if (it != inputs[i].end()) a.add(it->second.data(), it->second.rows());
        }
      }
      const bool last = c0 + cn == hs_.size();
      parallel_each(routed.size(), [&](size_t j) {
        auto& [key, a] = *routed[j];
        RowStage& st = stage.at(key);
        for (size_t i = 0; i < cn; ++i) {
          const auto it = inputs[i].find(key);
          if (it != inputs[i].end()) st.add(it->second, a);
        }
        if (last) st.flush(a);  // the rest
      });
      t_.hessian += since(th);
    }
    stage.clear();
    const auto th = Clock::now();
    for (LinearInput g : groups)  // a new capture replaces these groups' Hessians
      for (auto it = H_.begin(); it != H_.end();) it = it->first.first == g ? H_.erase(it) : std::next(it);
    // Each sum is dropped once finalized: 128 experts' Hessians are gigabytes, and twice that would not fit.
    for (auto it = acc.begin(); it != acc.end(); it = acc.erase(it)) {
      tokens_[it->first] = it->second.tokens();
      if (it->second.tokens() > 0) H_.emplace(it->first, it->second.finalize());
    }
    t_.hessian += since(th);
  }

  int64_t hessian_tokens(LinearRef r) const override {
    const auto it = tokens_.find(hessian_key(r, ec_));
    return it == tokens_.end() ? 0 : it->second;
  }

  QuantizedLinear quantize(LinearRef r, const GptqOptions& o, GptqStats* stats) override {
    const Key key = hessian_key(r, ec_);
    if (!tokens_.count(key)) fail(ErrorKind::Internal, o.name + ": quantized before its group's Hessian was captured");
    const auto t0 = Clock::now();
    const Matrix& Wl = W_.weight(r);  // [n, k]
    const auto it = H_.find(key);
    // An expert no token was routed to: H = I, under which GPTQ is round-to-nearest with an unweighted clip
    // search (and magnitude 2:4) -- the weights alone decide, as nothing else is known about its inputs.
    const Eigen::MatrixXf eye = it == H_.end() ? Eigen::MatrixXf::Identity(Wl.cols(), Wl.cols()) : Eigen::MatrixXf();
    QuantizedLinear q = gptq_quantize(Wl.data(), Wl.rows(), Wl.cols(), it == H_.end() ? eye : it->second, o, stats);
    t_.gptq += since(t0);
    return q;
  }

  void set_weight(LinearRef r, const QuantizedLinear& q) override {
    Matrix& Wl = W_.weight(r);               // [n, k]
    const std::vector<float> dq = dequantize(q);  // [k, n]
    for (int64_t r = 0; r < q.k; ++r)
      for (int64_t col = 0; col < q.n; ++col) Wl(col, r) = dq[size_t(r * q.n + col)];
  }

  void advance() override {
    const auto t0 = Clock::now();
    parallel_each(hs_.size(), [&](size_t i) { m_.block_forward(hs_[i], W_); });
    t_.forward += since(t0);
  }

 private:
  using Key = std::pair<LinearInput, int32_t>;  // (input group, expert or kDenseMlp / kSharedExpert)

  const LlamaModel& m_;
  const ExpertCalibration ec_;
  std::vector<Matrix> hs_;  // [samples] x [T_i, hidden]
  BlockWeights W_;
  std::map<Key, Eigen::MatrixXf> H_;  // finalized Hessians [k, k] from the last captures
  std::map<Key, int64_t> tokens_;     // tokens in each of them (0: an expert no token was routed to)
};

}  // namespace

std::unique_ptr<CalibPass> make_cpu_pass(const LlamaModel& m, const std::vector<std::vector<int32_t>>& samples,
                                         ExpertCalibration ec) {
  return std::make_unique<CpuPass>(m, samples, ec);
}

}  // namespace marlinc::calib
