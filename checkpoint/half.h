// fp16 / bf16 <-> fp32 conversion, bit-exact: round-to-nearest-even, NaN kept NaN (quiet),
// infinities and subnormals handled. Scalar functions are the reference; the bulk functions are
// the OpenMP paths used on whole tensors and are tested against them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace marlinc {

inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));  // inf / nan (payload kept)
  if (exp == 0) {
    if (mant == 0) return bits_to_float(sign);
    // Subnormal: value = mant * 2^-24, exact in fp32.
    float v = float(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t float_to_half(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((absu >> 13) & 0x3ffu));  // NaN stays NaN
  if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: overflow to inf
  if (absu < 0x38800000u) {
    // Result is subnormal (or zero) in fp16: add 0.5 in fp32 so the FPU does the RNE shift for us.
    float a = bits_to_float(absu) + 0.5f;
    return uint16_t(sign | uint16_t(float_to_bits(a) - 0x3f000000u));
  }
  // Normal: rebias exponent and round mantissa from 23 to 10 bits, ties to even.
  uint32_t mant_odd = (absu >> 13) & 1u;
  uint32_t r = absu + 0xc8000fffu + mant_odd;  // -(127-15)<<23 plus rounding bias
  return uint16_t(sign | uint16_t(r >> 13));
}

inline float bf16_to_float(uint16_t b) { return bits_to_float(uint32_t(b) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return uint16_t(u >> 16);
}

// Code that holds either 16-bit type (scales, activations) picks it with `bf16`: bf16 words, else fp16.
inline float word16_to_float(uint16_t w, bool bf16) { return bf16 ? bf16_to_float(w) : half_to_float(w); }
inline uint16_t float_to_word16(float f, bool bf16) { return bf16 ? float_to_bf16(f) : float_to_half(f); }
// The round trip through that type (round to nearest even).
inline float round_to_word16(float f, bool bf16) { return word16_to_float(float_to_word16(f, bf16), bf16); }

// Bulk conversions (OpenMP over the element range).
void half_to_float_n(const uint16_t* in, float* out, size_t n);
void float_to_half_n(const float* in, uint16_t* out, size_t n);
void bf16_to_float_n(const uint16_t* in, float* out, size_t n);
void float_to_bf16_n(const float* in, uint16_t* out, size_t n);

}  // namespace marlinc
