#include "quantizer/calib/quantized_linears.h"

#include "checkpoint/error.h"
#include "packer/quantized_linear.h"

namespace marlinc::calib {

QuantizedLinears::QuantizedLinears(const Checkpoint& ck) : ck_(ck), fi_(detect_format(ck)) {
  if (fi_.format == Format::Plain) bad_usage(ck.source().string() + ": no quantized layers (a plain checkpoint)");
  mods_ = describe_modules(ck, fi_);
  for (size_t i = 0; i < mods_.size(); ++i) by_prefix_[mods_[i].prefix] = i;
}

std::optional<QuantizedLinear> QuantizedLinears::quantized(int64_t block, Linear l) const {
  auto it = by_prefix_.find(linear_name(block, l));
  if (it == by_prefix_.end()) return std::nullopt;
  return read_module(ck_, mods_[it->second], fi_);
}

std::optional<Matrix> QuantizedLinears::weight(int64_t block, Linear l) const {
  const std::optional<QuantizedLinear> oq = quantized(block, l);
  if (!oq) return std::nullopt;
  const QuantizedLinear& q = *oq;
  const std::vector<float> w = dequantize(q);  // [k, n]
  Matrix m(q.n, q.k);                          // [out, in]
  for (int64_t r = 0; r < q.k; ++r)
    for (int64_t c = 0; c < q.n; ++c) m(c, r) = w[size_t(r * q.n + c)];
  return m;
}

}  // namespace marlinc::calib
