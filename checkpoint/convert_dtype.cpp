#include "checkpoint/convert_dtype.h"

#include <cstring>
#include <string>

#include "checkpoint/error.h"
#include "checkpoint/half.h"

namespace marlinc {

namespace {
void check_len(std::span<const uint8_t> bytes, DType dt) {
  if (bytes.size() % dtype_size(dt) != 0)
    bad_data("to_float: " + std::to_string(bytes.size()) + " bytes is not a whole number of " +
             std::string(dtype_name(dt)) + " elements");
}
}  // namespace

std::vector<float> to_float(std::span<const uint8_t> bytes, DType dt) {
  check_len(bytes, dt);
  std::vector<float> out(bytes.size() / dtype_size(dt));
  to_float_into(bytes, dt, out.data());
  return out;
}

void to_float_into(std::span<const uint8_t> bytes, DType dt, float* out) {
  check_len(bytes, dt);
  const size_t n = bytes.size() / dtype_size(dt);
  switch (dt) {
    case DType::F32:
      if (n) std::memcpy(out, bytes.data(), n * 4);
      break;
    case DType::F16:
    case DType::BF16: {
      // The mapped bytes are only guaranteed 2-aligned by the official writer's ordering; copy when not.
      std::vector<uint16_t> tmp;
      const uint16_t* src = reinterpret_cast<const uint16_t*>(bytes.data());
      if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint16_t) != 0) {
        tmp.resize(n);
        if (n) std::memcpy(tmp.data(), bytes.data(), n * 2);
        src = tmp.data();
      }
      if (dt == DType::F16) half_to_float_n(src, out, n);
      else bf16_to_float_n(src, out, n);
      break;
    }
    case DType::F64: {
#pragma omp parallel for schedule(static) if (n >= (1u << 16))
      for (long long i = 0; i < (long long)n; ++i) {
        double d;
        std::memcpy(&d, bytes.data() + size_t(i) * 8, 8);
        out[size_t(i)] = float(d);
      }
      break;
    }
    default:
      bad_data("to_float: dtype " + std::string(dtype_name(dt)) + " is not a floating-point type (F64/F32/F16/BF16)");
  }
}

std::vector<uint8_t> from_float(std::span<const float> values, DType dt) {
  const size_t n = values.size();
  std::vector<uint8_t> out;
  switch (dt) {
    case DType::F32:
      out.resize(n * 4);
      if (n) std::memcpy(out.data(), values.data(), n * 4);
      break;
    case DType::F16:
    case DType::BF16: {
      std::vector<uint16_t> tmp(n);
      if (dt == DType::F16) float_to_half_n(values.data(), tmp.data(), n);
      else float_to_bf16_n(values.data(), tmp.data(), n);
      out.resize(n * 2);
      if (n) std::memcpy(out.data(), tmp.data(), n * 2);
      break;
    }
    default:
      bad_usage("from_float: dtype " + std::string(dtype_name(dt)) + " is not F32/F16/BF16");
  }
  return out;
}

}  // namespace marlinc
