#include "quantizer/rtn.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "checkpoint/error.h"
#include "checkpoint/half.h"
#include "quantizer/clip.h"

namespace marlinc {

namespace quant {

void check_common(const std::string& name, int bits, int group_size, int64_t n, int64_t k) {
  const std::string who = name.empty() ? std::string("layer") : name;
  if (bits != 4 && bits != 8)
    bad_usage(who + ": bits must be 4 or 8, got " + std::to_string(bits) + " (option --bits)");
  if (n <= 0 || k <= 0)
    bad_usage(who + ": weight shape [n=" + std::to_string(n) + ", k=" + std::to_string(k) + "] must be positive");
  if (group_size != -1 && (group_size <= 0 || k % group_size != 0))
    bad_usage(who + ": group size " + std::to_string(group_size) + " must be -1 or divide k=" + std::to_string(k) +
              " (option --group)");
}

void check_finite(const std::string& name, const float* W, int64_t count) {
  int64_t bad = -1;
#pragma omp parallel for schedule(static) reduction(max : bad)
  for (int64_t i = 0; i < count; ++i)
    if (!std::isfinite(W[i])) bad = std::max(bad, i);
  if (bad >= 0)
    bad_data((name.empty() ? std::string("layer") : name) + ": weight element " + std::to_string(bad) +
             " is not finite (NaN/Inf cannot be quantized)");
}

double relative_weight_error(const float* W, const QuantizedLinear& q) {
  // Square tiles: the codes [k, n] and the weight [n, k] are transposes of each other, so a plain
  // sweep reads one of them with a cache miss per element (most of a 4096² layer's time). One partial
  // per tile, summed in tile order: the value does not depend on the thread count.
  constexpr int64_t kTile = 64;
  const int64_t n = q.n, k = q.k, tr = (k + kTile - 1) / kTile, tc = (n + kTile - 1) / kTile;
  std::vector<double> num(static_cast<size_t>(tr * tc)), den(static_cast<size_t>(tr * tc));  // [tiles]
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tr * tc; ++t) {
    const int64_t r0 = t / tc * kTile, c0 = t % tc * kTile;
    const int64_t r1 = std::min(k, r0 + kTile), c1 = std::min(n, c0 + kTile);
    double a = 0.0, b = 0.0;
    for (int64_t r = r0; r < r1; ++r) {  // input row r of the codes
      const int64_t grow = q.group_of(r) * n;
      const uint8_t* codes = q.codes.data() + r * n;
      const uint8_t* mask = q.mask.empty() ? nullptr : q.mask.data() + r * n;
      for (int64_t c = c0; c < c1; ++c) {
        const uint16_t sb = q.scales[size_t(grow + c)];
        const float s = word16_to_float(sb, q.scale_type == ScaleType::BF16);
        const int zero = q.sym ? zero_code(q.bits) : int(q.zeros[size_t(grow + c)]);
        const float v = mask && !mask[c] ? 0.0f : float(int(codes[c]) - zero) * s;  // QuantizedLinear::weight
        const double w = W[c * k + r], d = double(v) - w;
        a += d * d;
        b += w * w;
      }
    }
    num[size_t(t)] = a;
    den[size_t(t)] = b;
  }
  double sn = 0.0, sd = 0.0;
  for (size_t i = 0; i < num.size(); ++i) {
    sn += num[i];
    sd += den[i];
  }
  return sd > 0 ? std::sqrt(sn / sd) : std::sqrt(sn);
}

}  // namespace quant

namespace {

QuantizedLinear empty_result(const RtnOptions& o, int64_t n, int64_t k) {
  QuantizedLinear q;
  q.name = o.name;
  q.k = k;
  q.n = n;
  q.bits = o.bits;
  q.group_size = o.group_size;
  q.sym = true;
  q.scale_type = o.bf16_scales ? ScaleType::BF16 : ScaleType::F16;
  q.codes.assign(size_t(k * n), 0);
  q.scales.assign(size_t(q.groups() * n), 0);
  return q;
}

void check_rtn(const float* W, int64_t n, int64_t k, const RtnOptions& o) {
  quant::check_common(o.name, o.bits, o.group_size, n, k);
  if (o.clip && (o.clip_grid <= 0 || o.clip_candidates <= 0 || o.clip_candidates > o.clip_grid ||
                 !(o.clip_norm > 0.0f)))
    bad_usage(o.name + ": clip search needs grid > 0, 0 < candidates <= grid and norm > 0 (got grid " +
              std::to_string(o.clip_grid) + ", candidates " + std::to_string(o.clip_candidates) + ")");
  quant::check_finite(o.name, W, n * k);
}

// One (output row, group): choose the scale, write codes [k, n] column `row` and the scale.
void quantize_row_group(const float* wrow, int64_t row, int64_t n, int64_t g0, int64_t len, int64_t gid,
                        const RtnOptions& o, QuantizedLinear& q) {
  float s;
  if (o.clip) {
    s = quant::lp_clip_scale(wrow + g0, len, 1, o.bits, o.clip_norm, o.clip_grid, o.clip_candidates, o.bf16_scales);
  } else {
    float absmax = 0.0f;
    for (int64_t i = 0; i < len; ++i) absmax = std::max(absmax, std::fabs(wrow[g0 + i]));
    s = quant::sym_scale(absmax, o.bits, o.bf16_scales);
  }
  q.scales[size_t(gid * n + row)] = float_to_word16(s, o.bf16_scales);
  for (int64_t i = 0; i < len; ++i)
    q.codes[size_t((g0 + i) * n + row)] = uint8_t(quant::quantize_code(wrow[g0 + i], s, o.bits));
}

}  // namespace

QuantizedLinear rtn_quantize_ref(const float* W, int64_t n, int64_t k, const RtnOptions& o) {
  check_rtn(W, n, k, o);
  QuantizedLinear q = empty_result(o, n, k);
  const int64_t g = o.group_size <= 0 ? k : o.group_size;
  for (int64_t row = 0; row < n; ++row)
    for (int64_t gid = 0; gid < k / g; ++gid) quantize_row_group(W + row * k, row, n, gid * g, g, gid, o, q);
  return q;
}

QuantizedLinear rtn_quantize(const float* W, int64_t n, int64_t k, const RtnOptions& o, RtnStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  check_rtn(W, n, k, o);
  QuantizedLinear q = empty_result(o, n, k);
  const int64_t g = o.group_size <= 0 ? k : o.group_size, G = k / g;
  // Rows are independent; each (row, group) writes disjoint codes/scales, so the result does not
  // depend on the thread count. Codes are written transposed ([k, n]), a strided store per row.
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t row = 0; row < n; ++row)
    for (int64_t gid = 0; gid < G; ++gid) quantize_row_group(W + row * k, row, n, gid * g, g, gid, o, q);
  if (stats) {
    stats->rel_weight_err = quant::relative_weight_error(W, q);
    stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return q;
}

}  // namespace marlinc
