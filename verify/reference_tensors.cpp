#include "verify/reference_tensors.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "checkpoint/convert_dtype.h"

namespace marlinc {

namespace {

bool is_float(DType d) { return d == DType::F16 || d == DType::BF16 || d == DType::F32 || d == DType::F64; }

// Elements converted per step: a whole embedding table need not sit in memory twice as floats.
constexpr size_t kChunk = size_t(1) << 20;

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

std::vector<std::string> check_reference_tensors(const Checkpoint& ck, const Checkpoint& ref,
                                                 const std::set<std::string>& modules) {
  std::vector<std::string> problems;
  const auto& cfg = ck.config();
  const bool tied = cfg.is_object() && cfg.contains("tie_word_embeddings") && cfg["tie_word_embeddings"] == true;
  for (const std::string& name : ref.tensor_names()) {
    const auto r = ref.find(name);
    const auto c = ck.find(name);
    if (!c) {
      const size_t dot = name.rfind('.');
      const bool quantized = dot != std::string::npos && name.compare(dot, std::string::npos, ".weight") == 0 &&
                             modules.count(name.substr(0, dot));
      if (!quantized && !(tied && name == "lm_head.weight"))
        problems.push_back("reference tensor " + name + " is missing: the checkpoint holds neither it nor a quantized module " +
                           (dot == std::string::npos ? name : name.substr(0, dot)));
      continue;
    }
    if (c->info->shape != r->info->shape) {
      problems.push_back(name + " has shape " + shape_str(c->info->shape) + ", the reference's is " + shape_str(r->info->shape));
      continue;
    }
    const DType cd = c->info->dtype, rd = r->info->dtype;
    const auto cb = c->file->data(*c->info), rb = r->file->data(*r->info);
    if (!is_float(cd) || !is_float(rd)) {
      if (cd != rd || !std::equal(cb.begin(), cb.end(), rb.begin(), rb.end()))
        problems.push_back(name + " differs from the reference's (" + std::string(dtype_name(cd)) + " against " +
                           std::string(dtype_name(rd)) + ", compared byte for byte)");
      continue;
    }
    const size_t n = cb.size() / dtype_size(cd), cs = dtype_size(cd), rs = dtype_size(rd);
    double d2 = 0, r2 = 0;
    int64_t bad = -1;
    std::vector<float> a, b;
    for (size_t at = 0; at < n && bad < 0; at += kChunk) {
      const size_t len = std::min(kChunk, n - at);
      a = to_float(cb.subspan(at * cs, len * cs), cd);
      b = to_float(rb.subspan(at * rs, len * rs), rd);
      for (size_t i = 0; i < len; ++i) {
        if (!std::isfinite(a[i]) && std::isfinite(b[i])) { bad = int64_t(at + i); break; }
        if (!std::isfinite(b[i])) continue;  // the reference's own inf/nan: nothing to hold it to
        d2 += double(a[i] - b[i]) * double(a[i] - b[i]);
        r2 += double(b[i]) * double(b[i]);
      }
    }
    if (bad >= 0) {
      problems.push_back(name + " element " + std::to_string(bad) + " is not finite where the reference's is");
      continue;
    }
    const double rel = r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
    if (rel > kPassThroughMaxRelErr) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.3g (at most %.3g)", rel, kPassThroughMaxRelErr);
      problems.push_back(name + " differs from the reference's: relative error " + buf);
    }
  }
  return problems;
}

}  // namespace marlinc
