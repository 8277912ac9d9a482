// A random symmetric 4-bit layer for the arithmetic check's tests (tests/verify/test_arith.cpp and the
// GPU test tests/gpu/test_verify_gpu.cpp).
#pragma once
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "checkpoint/half.h"
#include "packer/quantized_linear.h"
#include "verify/arith.h"

namespace marlinc::test {

// Random codes, and scales uniform in [scale / 2, 3 scale / 2) rounded to the layer's type (bf16 or fp16).
inline QuantizedLinear random_arith_layer(int64_t k, int64_t n, int group, bool bf16, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> code(0, 15);
  std::uniform_real_distribution<float> sd(0.5f * scale, 1.5f * scale);
  QuantizedLinear q;
  q.name = "layer"; q.k = k; q.n = n; q.bits = 4; q.group_size = group;
  q.scale_type = bf16 ? ScaleType::BF16 : ScaleType::F16;
  q.codes.resize(size_t(k * n));
  for (auto& c : q.codes) c = uint8_t(code(rng));
  q.scales.resize(size_t(q.groups() * n));
  for (auto& s : q.scales) s = float_to_word16(sd(rng), bf16);
  return q;
}

// GPTQ act-order (desc_act): rows are quantized in a random order and each run of group_size rows of that
// order is one group, so g_idx[r] = (position of r in the order) / group_size.
inline void make_act_order(QuantizedLinear& q, uint64_t seed) {
  std::vector<int64_t> order(size_t(q.k));
  for (int64_t i = 0; i < q.k; ++i) order[size_t(i)] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  q.g_idx.assign(size_t(q.k), 0);
  for (int64_t pos = 0; pos < q.k; ++pos) q.g_idx[size_t(order[size_t(pos)])] = int32_t(pos / q.group_size);
}

// 2:4 along k: in every column each aligned group of 4 rows keeps 2 (random), and the pruned rows get
// random codes, which every reader of the layer must ignore.
inline void make_24(QuantizedLinear& q, uint64_t seed) {
  std::mt19937_64 rng(seed);
  q.mask.assign(size_t(q.k * q.n), 0);
  for (int64_t c = 0; c < q.n; ++c)
    for (int64_t g = 0; g < q.k / 4; ++g) {
      int rows[4] = {0, 1, 2, 3};
      std::shuffle(rows, rows + 4, rng);
      for (int i = 0; i < 2; ++i) q.mask[size_t((4 * g + rows[i]) * q.n + c)] = 1;
    }
  for (size_t i = 0; i < q.codes.size(); ++i)
    if (!q.mask[i]) q.codes[i] = uint8_t(rng() % 16);
}

}  // namespace marlinc::test
