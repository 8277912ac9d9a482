#include <cmath>
#include <limits>
#include <vector>

#include "checkpoint/half.h"
#include "tests/common.h"

using namespace marlinc;

TEST_CASE("fp16 round trip is exact for every fp16 bit pattern", "[half]") {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = half_to_float(uint16_t(h));
    uint16_t back = float_to_half(f);
    if (std::isnan(f)) {
      REQUIRE(((back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0));
    } else {
      REQUIRE(back == h);
    }
  }
}

TEST_CASE("fp32 -> fp16 rounds to nearest even", "[half]") {
  CHECK(float_to_half(1.0f) == 0x3c00);
  CHECK(float_to_half(65504.0f) == 0x7bff);
  CHECK(float_to_half(65519.0f) == 0x7bff);  // below the halfway point to 65536
  CHECK(float_to_half(65520.0f) == 0x7c00);  // halfway rounds up to infinity
  CHECK(float_to_half(-std::numeric_limits<float>::infinity()) == 0xfc00);
  // 1 + 2^-11 is exactly halfway between 1 and 1+2^-10: ties to even -> 1.
  CHECK(float_to_half(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even) -> up.
  CHECK(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  // Smallest subnormal 2^-24 and halfway below it (2^-25 ties to even = 0).
  CHECK(float_to_half(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(float_to_half(std::ldexp(1.0f, -25)) == 0x0000);
  CHECK(float_to_half(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(float_to_half(-0.0f) == 0x8000);
  // Largest subnormal rounding up into the smallest normal.
  CHECK(float_to_half(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -26)) == 0x0400);
}

TEST_CASE("fp32 -> fp16 matches a double-precision nearest-even model on random floats", "[half]") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int it = 0; it < 200000; ++it) {
    float f = bits_to_float(bits(rng) & 0x8fffffffu);  // exponents spanning fp16's range and beyond
    if (std::isnan(f)) continue;
    uint16_t h = float_to_half(f);
    double got = half_to_float(h);
    // The two neighbours around f must not be strictly closer than the chosen value.
    uint16_t lo = h == 0 || h == 0x8000 ? h : uint16_t(h - 1), hi = uint16_t(h + 1);
    if (std::isinf(got)) { REQUIRE(std::fabs(f) >= 65520.0f); continue; }
    double err = std::fabs(got - double(f));
    for (uint16_t nb : {lo, hi}) {
      double v = half_to_float(nb);
      if (std::isnan(v) || std::isinf(v)) continue;
      REQUIRE(err <= std::fabs(v - double(f)));
    }
  }
}

TEST_CASE("bf16 conversion: round to nearest even, NaN stays NaN", "[half]") {
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(bits_to_float(0x3f808000u)) == 0x3f80);  // tie -> even (down)
  CHECK(float_to_bf16(bits_to_float(0x3f818000u)) == 0x3f82);  // tie -> even (up)
  CHECK(float_to_bf16(bits_to_float(0x3f808001u)) == 0x3f81);
  uint16_t nan = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
  CHECK(std::isnan(bf16_to_float(nan)));
  CHECK(std::isnan(bf16_to_float(float_to_bf16(bits_to_float(0x7f800001u)))));  // signalling payload
  for (uint32_t b = 0; b < 0x10000; ++b) {
    float f = bf16_to_float(uint16_t(b));
    if (!std::isnan(f)) REQUIRE(float_to_bf16(f) == b);
  }
}

TEST_CASE("bulk conversions equal the scalar reference", "[half]") {
  std::vector<float> f(300000);
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.f, 100.f);
  for (auto& x : f) x = d(rng);
  std::vector<uint16_t> h(f.size()), b(f.size());
  float_to_half_n(f.data(), h.data(), f.size());
  float_to_bf16_n(f.data(), b.data(), f.size());
  std::vector<float> fh(f.size()), fb(f.size());
  half_to_float_n(h.data(), fh.data(), f.size());
  bf16_to_float_n(b.data(), fb.data(), f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    REQUIRE(h[i] == float_to_half(f[i]));
    REQUIRE(b[i] == float_to_bf16(f[i]));
    REQUIRE(float_to_bits(fh[i]) == float_to_bits(half_to_float(h[i])));
    REQUIRE(float_to_bits(fb[i]) == float_to_bits(bf16_to_float(b[i])));
  }
}
