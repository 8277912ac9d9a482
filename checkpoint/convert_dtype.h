// Whole-tensor dtype conversions on top of checkpoint/half.h's OpenMP bulk functions.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "checkpoint/dtype.h"

namespace marlinc {

// Little-endian bytes of an F32/F16/BF16/F64 tensor -> fp32 values (F64 rounds to nearest).
// Throws BadData for other dtypes or a byte count that is not a multiple of the element size.
std::vector<float> to_float(std::span<const uint8_t> bytes, DType dt);
// The same into a caller's buffer of bytes.size() / dtype_size(dt) floats (no allocation: per-row
// conversions such as embedding lookups).
void to_float_into(std::span<const uint8_t> bytes, DType dt, float* out);
// fp32 values -> little-endian bytes of F32/F16/BF16 (round-to-nearest-even).
std::vector<uint8_t> from_float(std::span<const float> values, DType dt);

}  // namespace marlinc
