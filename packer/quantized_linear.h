// The neutral value every format reads and writes. A conversion is read(format A) then
// write(format B); no format talks to another directly.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace marlinc {

enum class ScaleType { F16, BF16 };

struct QuantizedLinear {
  std::string name;            // module prefix, e.g. "model.layers.0.self_attn.q_proj"
  int64_t k = 0;               // input features (reduction dim)
  int64_t n = 0;               // output features
  int bits = 4;                // 4 or 8
  int group_size = -1;         // -1 = one group over all of k (per-channel)
  bool sym = true;             // true: zero point is 2^(bits-1) (uint4b8 / uint8b128), `zeros` empty

  std::vector<uint8_t> codes;  // [k, n] unsigned codes 0..2^bits-1, rows in the ORIGINAL input order
  std::vector<uint16_t> scales;  // [G, n] raw fp16 or bf16 bits (see scale_type), row = group id
  ScaleType scale_type = ScaleType::F16;
  std::vector<uint8_t> zeros;  // [G, n] real zero points (asym only; 0..2^bits-1), else empty
  std::vector<int32_t> g_idx;  // [k] group of each input row; empty = trivial (row / group_size)
  std::vector<uint8_t> mask;   // [k, n] 1 = kept weight (2:4 sparse); empty = dense

  int64_t groups() const { return group_size <= 0 ? 1 : (k + group_size - 1) / group_size; }
  int group_of(int64_t row) const {
    if (!g_idx.empty()) return g_idx[size_t(row)];
    return group_size <= 0 ? 0 : int(row / group_size);
  }
  // True when g_idx is absent or equals row / group_size for every row (no act-order).
  bool trivial_g_idx() const;
  int zero_of(int64_t row, int64_t col) const {
    return sym ? (1 << (bits - 1)) : zeros[size_t(group_of(row) * n + col)];
  }
  float scale_of(int64_t row, int64_t col) const;
  // Dequantized weight w[row, col] = (code - zero) * scale, 0 where the 2:4 mask prunes.
  float weight(int64_t row, int64_t col) const;

  // Throws marlinc::Error (BadData) naming `name` and the broken rule when sizes or values are
  // inconsistent (codes out of range, g_idx out of range, 2:4 mask with != 2 kept per 4, ...).
  void validate() const;
};

// Dequantize the whole layer into w[k, n] (row-major, float).
std::vector<float> dequantize(const QuantizedLinear& q);

// Output features [n0, n0 + n) of q: a fused module's part (Phi-3's qkv_proj holds q|k|v). BadData when
// the range leaves q.
QuantizedLinear slice_n(const QuantizedLinear& q, int64_t n0, int64_t n);
// The parts side by side along n, in order (the fused module `name`). Every column keeps its codes,
// scales, zero points and mask, so slice_n takes each part back exactly. The parts must agree on k,
// bits, group size, symmetry, scale type, g_idx and whether they are 2:4 (BadData naming the part).
QuantizedLinear concat_n(const std::vector<QuantizedLinear>& parts, const std::string& name);

}  // namespace marlinc
