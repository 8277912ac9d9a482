#include "quantizer/calib/quantized_linears.h"

#include "checkpoint/error.h"
#include "packer/quantized_linear.h"

namespace marlinc::calib {

QuantizedLinears::QuantizedLinears(const Checkpoint& ck, const LlamaConfig& c) : ck_(ck), cfg_(c), fi_(detect_format(ck)) {
  if (fi_.format == Format::Plain) bad_usage(ck.source().string() + ": no quantized layers (a plain checkpoint)");
  mods_ = describe_modules(ck, fi_);
  for (size_t i = 0; i < mods_.size(); ++i) by_prefix_[mods_[i].prefix] = i;
}

std::optional<QuantizedLinear> QuantizedLinears::quantized(int64_t block, LinearRef r) const {
  const LinearSource s = linear_source(cfg_, block, r);
  auto it = by_prefix_.find(s.prefix);
  if (it == by_prefix_.end()) return std::nullopt;
  auto check = [&](const QuantizedLinear& q) {
    if (q.n != s.total_rows || q.k != s.in)
      bad_data(ck_.source().string() + ": module " + s.prefix + " is [k=" + std::to_string(q.k) + ", n=" +
               std::to_string(q.n) + "], config.json implies [k=" + std::to_string(s.in) + ", n=" +
               std::to_string(s.total_rows) + "]");
  };
  if (!s.fused()) {
    QuantizedLinear q = read_module(ck_, mods_[it->second], fi_);
    check(q);
    return q;
  }
  std::shared_ptr<const QuantizedLinear> whole;  // a fused module is read once for its parts
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cached_ && cached_prefix_ == s.prefix) whole = cached_;
  }
  if (!whole) {
    whole = std::make_shared<const QuantizedLinear>(read_module(ck_, mods_[it->second], fi_));
    std::lock_guard<std::mutex> lock(cache_mu_);
    cached_prefix_ = s.prefix, cached_ = whole;
  }
  check(*whole);
  return slice_n(*whole, s.row0, s.rows);
}

std::optional<Matrix> QuantizedLinears::weight(int64_t block, LinearRef r) const {
  const std::optional<QuantizedLinear> oq = quantized(block, r);
  if (!oq) return std::nullopt;
  const QuantizedLinear& q = *oq;
  const std::vector<float> w = dequantize(q);  // [k, n]
  Matrix m(q.n, q.k);                          // [out, in]
  for (int64_t r = 0; r < q.k; ++r)
    for (int64_t c = 0; c < q.n; ++c) m(c, r) = w[size_t(r * q.n + c)];
  return m;
}

}  // namespace marlinc::calib
