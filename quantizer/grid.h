// The symmetric integer grid Marlin expects (spec: gptq.md §1.9, formats.md §4.5): zero point fixed
// at 2^(bits-1) (uint4b8 / uint8b128), scale s = 2·absmax/maxq rounded to fp16 BEFORE any code is
// derived from it, code = clamp(nearbyint(w/s) + zero, 0, maxq), value = (code − zero)·s.
// Shared by RTN, GPTQ (CPU and reference) and the clip searches so that they agree bit for bit.
#pragma once
#include <cmath>
#include <cstdint>

#include "checkpoint/half.h"

namespace marlinc::quant {

inline int max_code(int bits) { return (1 << bits) - 1; }   // 15 / 255
inline int zero_code(int bits) { return 1 << (bits - 1); }  // 8 / 128

// fp16 round trip: the scale the packed file will hold, so the codes and the error feedback agree.
inline float round_to_fp16(float x) { return half_to_float(float_to_half(x)); }

// Scale for a row-group whose clip range is [−c, c] (c = shrink·absmax). An all-zero group gets the
// reference quantizer's [−1, 1] range so the scale is never 0 (its codes are all `zero` anyway).
inline float sym_scale(float c, int bits) {
  if (!(c > 0.0f)) c = 1.0f;
  return round_to_fp16((c + c) / float(max_code(bits)));
}

// Code of w on the grid with fp16-rounded scale s (> 0 finite, or 0/subnormal-flushed: then every
// weight maps to the zero code because no step is representable).
inline int quantize_code(float w, float s, int bits) {
  const int z = zero_code(bits);
  if (!(s > 0.0f)) return z;
  float c = std::nearbyint(w / s) + float(z);
  c = c < 0.0f ? 0.0f : c;
  const float mq = float(max_code(bits));
  c = c > mq ? mq : c;
  return int(c);
}

inline float dequant(int code, float s, int bits) { return float(code - zero_code(bits)) * s; }

// Shrink factor of candidate i of a grid search: p = 1 − i/grid (Marlin: grid 100, i = 0..75).
inline float shrink_factor(int i, int grid) { return float(1.0 - double(i) / double(grid)); }

// Marlin's Hessian-weighted search (gptq.md §2.1): grid 100, i = 0..75 inclusive, p = 1.00 … 0.25.
inline constexpr int kMarlinClipGrid = 100;
inline constexpr int kMarlinClipCandidates = 76;
// GPTQ's unweighted `mse` search (gptq.md §2.2): grid 100, 80 candidates p = 1.00 … 0.21, norm 2.4.
inline constexpr int kMseClipGrid = 100;
inline constexpr int kMseClipCandidates = 80;
inline constexpr float kMseClipNorm = 2.4f;

}  // namespace marlinc::quant
