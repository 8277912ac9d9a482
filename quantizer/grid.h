// The symmetric integer grid Marlin expects (spec: gptq.md §1.9, formats.md §4.5): zero point fixed
// at 2^(bits-1) (uint4b8 / uint8b128), scale s = 2·absmax/maxq rounded to fp16 BEFORE any code is
// derived from it, code = clamp(nearbyint(w/s) + zero, 0, maxq), value = (code − zero)·s.
// Shared by RTN, GPTQ (CPU and reference) and the clip searches, and mirrored operation for
// operation by the CUDA back end (gptq_cuda_kernels.cuh), so that every path rounds alike.
//
// Precision: the quotient w/s and the scale 2c/maxq are formed in double. GPTQ's working weights
// are double (their error feedback decides the codes), and a float quotient would round them
// first; for float inputs (RTN) both formulas are exact roundings of the same real number, so
// double changes nothing there but the rare float-quotient tie.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "checkpoint/half.h"

namespace marlinc::quant {

inline int max_code(int bits) { return (1 << bits) - 1; }   // 15 / 255
inline int zero_code(int bits) { return 1 << (bits - 1); }  // 8 / 128

// Scale for a row-group whose clip range is [−c, c] (c = shrink·absmax). An all-zero group gets the
// reference quantizer's [−1, 1] range so the scale is never 0 (its codes are all `zero` anyway).
// 2c/maxq is rounded to float, then to the scale type the packed file will hold (fp16, or bf16 for a
// bf16 model's outputs other than Sparse-Marlin), so the codes, the error feedback and the stored scale
// agree (the device does the same two steps); for a float c the first rounding equals a float
// division, so RTN's scales are what they always were.
inline float sym_scale(double c, int bits, bool bf16) {
  if (!(c > 0.0)) c = 1.0;
  return round_to_word16(float((c + c) / double(max_code(bits))), bf16);
}

// nearbyint in the default rounding mode (to nearest, ties to even), inline: the x86-64 baseline has
// no SSE4.1 round instruction, so std::nearbyint is a libm call, and the clip searches round ~10⁷
// values per group. Adding ±2^52 leaves no fraction bits, so the addition itself rounds; larger
// magnitudes are integers already. Same value as the device's rint().
inline double round_to_int(double x) {
  constexpr double kNoFraction = 4503599627370496.0;  // 2^52
  const double m = std::copysign(kNoFraction, x);
  return std::fabs(x) < kNoFraction ? (x + m) - m : x;
}

// Code of w on the grid with fp16-rounded scale s (> 0 finite, or 0/subnormal-flushed: then every
// weight maps to the zero code because no step is representable): nearbyint of the double quotient.
inline int quantize_code(double w, float s, int bits) {
  const int z = zero_code(bits);
  if (!(s > 0.0f)) return z;
  double c = round_to_int(w / double(s)) + double(z);
  c = c < 0.0 ? 0.0 : c;
  const double mq = double(max_code(bits));
  c = c > mq ? mq : c;
  return int(c);
}

// Exact: a code of at most 8 bits times an fp16 scale (11 significant bits) fits a float.
inline float dequant(int code, float s, int bits) { return float(code - zero_code(bits)) * s; }

// Rounding error double(dequant(quantize_code(w, s, bits), s, bits)) − w for any scale sym_scale can
// give (finite ≥ 0 or +inf), written without branches or an integer round trip so that the batched
// clip search's inner loop vectorises. The clamp makes round_to_int's range test unnecessary (any
// |w/s| ≥ 2^52 clamps the same way), max(0, ·) maps the 0/0 of a zero scale to a finite code (whose
// value (c − zero)·0 is the zero code's), and (c − zero)·s is exact in double as it is in float.
inline double round_error(double w, float s, int bits) {
  constexpr double kNoFraction = 4503599627370496.0;  // 2^52, as in round_to_int
  const double sd = double(s), z = double(zero_code(bits)), mq = double(max_code(bits));
  const double q = w / sd, m = std::copysign(kNoFraction, q);
  const double c = std::min(mq, std::max(0.0, (q + m) - m + z));
  return (c - z) * sd - w;
}

// Shrink factor of candidate i of a grid search: p = 1 − i/grid (Marlin: grid 100, i = 0..75).
inline double shrink_factor(int i, int grid) { return 1.0 - double(i) / double(grid); }

// Scale of candidate i for a row-group with absolute maximum `absmax` (candidate 0 = sym_scale).
inline float candidate_scale(double absmax, int i, int grid, int bits, bool bf16) {
  return sym_scale(shrink_factor(i, grid) * absmax, bits, bf16);
}

// Marlin's Hessian-weighted search (gptq.md §2.1): grid 100, i = 0..75 inclusive, p = 1.00 … 0.25.
inline constexpr int kMarlinClipGrid = 100;
inline constexpr int kMarlinClipCandidates = 76;
// GPTQ's unweighted `mse` search (gptq.md §2.2): grid 100, 80 candidates p = 1.00 … 0.21, norm 2.4.
inline constexpr int kMseClipGrid = 100;
inline constexpr int kMseClipCandidates = 80;
inline constexpr float kMseClipNorm = 2.4f;

}  // namespace marlinc::quant
