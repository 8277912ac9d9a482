// safetensors element types (spec: ../shared/spec/formats.md §7.1): names, sizes, lookup.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace marlinc {

// Every dtype string the official safetensors reader accepts whose element size is a whole number of
// bytes. Sub-byte types (F4, F6_*) are rejected by name lookup: no format here uses them.
enum class DType {
  BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64,
  F8_E4M3, F8_E5M2, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, C64,
};

// Bytes per element.
size_t dtype_size(DType dt);
// The safetensors spelling, e.g. "BF16".
std::string_view dtype_name(DType dt);
// Inverse of dtype_name; nullopt for anything unknown (exact, case-sensitive match).
std::optional<DType> dtype_from_name(std::string_view name);

}  // namespace marlinc
