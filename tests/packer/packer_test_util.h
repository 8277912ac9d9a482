// Helpers shared by the packer tests: seeded generators for codes and 2:4 masks, and a finder for the
// single non-zero field of a packed buffer (how the spec's element -> (row, word, nibble) examples
// are checked through the real pack functions).
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "checkpoint/error.h"

namespace marlinc::test {

// Deterministic across platforms: raw mt19937_64 output reduced by modulo, no distributions.
struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  uint64_t next() { return g(); }
  int64_t below(int64_t n) { return int64_t(g() % uint64_t(n)); }
};

inline std::vector<uint8_t> random_codes(Rng& r, int64_t rows, int64_t cols, int bits) {
  std::vector<uint8_t> v(size_t(rows * cols));
  for (auto& x : v) x = uint8_t(r.next() & ((1u << bits) - 1));
  return v;
}
inline std::vector<int32_t> random_words(Rng& r, size_t count) {
  std::vector<int32_t> v(count);
  for (auto& x : v) x = int32_t(uint32_t(r.next()));
  return v;
}
// A valid 2:4 mask [k, n]: in every aligned 4 rows of each column, one of the 6 pairs is kept.
inline std::vector<uint8_t> random_mask_24(Rng& r, int64_t k, int64_t n) {
  static const int pairs[6][2] = {{0, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 3}};
  std::vector<uint8_t> m(size_t(k * n), 0);
  for (int64_t g = 0; g < k / 4; ++g)
    for (int64_t c = 0; c < n; ++c) {
      const int* p = pairs[r.below(6)];
      m[size_t((4 * g + p[0]) * n + c)] = 1;
      m[size_t((4 * g + p[1]) * n + c)] = 1;
    }
  return m;
}

// Position of the only non-zero `bits`-wide field in words[rows, cols]; found = false if none or >1.
struct Field {
  bool found = false;
  int64_t row = -1, word = -1;
  int slot = -1;
  uint32_t value = 0;
};
template <class W>
Field single_field(const std::vector<W>& words, int64_t cols, int bits) {
  Field f;
  int hits = 0;
  const int wbits = int(sizeof(W) * 8);
  for (size_t i = 0; i < words.size(); ++i) {
    const uint32_t w = uint32_t(std::make_unsigned_t<W>(words[i]));
    if (!w) continue;
    for (int s = 0; s < wbits / bits; ++s) {
      const uint32_t v = (w >> (bits * s)) & ((1u << bits) - 1);
      if (!v) continue;
      ++hits;
      f = {true, int64_t(i) / cols, int64_t(i) % cols, s, v};
    }
  }
  if (hits != 1) f.found = false;
  return f;
}

// The message of the marlinc::Error that f throws, or "<no error>".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace marlinc::test
