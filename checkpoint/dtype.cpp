#include "checkpoint/dtype.h"

#include <array>

namespace marlinc {

namespace {
struct DTypeRow {
  DType dt;
  std::string_view name;
  size_t size;
};
// One row per enumerator, in enum order (static_assert below keeps them in step).
constexpr std::array<DTypeRow, 19> kTable{{
    {DType::BOOL, "BOOL", 1},       {DType::U8, "U8", 1},
    {DType::I8, "I8", 1},           {DType::I16, "I16", 2},
    {DType::U16, "U16", 2},         {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},       {DType::I32, "I32", 4},
    {DType::U32, "U32", 4},         {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},         {DType::I64, "I64", 8},
    {DType::U64, "U64", 8},         {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::F8_E5M2, "F8_E5M2", 1}, {DType::F8_E8M0, "F8_E8M0", 1},
    {DType::F8_E4M3FNUZ, "F8_E4M3FNUZ", 1}, {DType::F8_E5M2FNUZ, "F8_E5M2FNUZ", 1},
    {DType::C64, "C64", 8},
}};
constexpr bool table_in_enum_order() {
  for (size_t i = 0; i < kTable.size(); ++i)
    if (static_cast<size_t>(kTable[i].dt) != i) return false;
  return true;
}
static_assert(table_in_enum_order(), "kTable is indexed by the DType value");
}  // namespace

size_t dtype_size(DType dt) { return kTable[static_cast<size_t>(dt)].size; }
std::string_view dtype_name(DType dt) { return kTable[static_cast<size_t>(dt)].name; }
std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& r : kTable)
    if (r.name == name) return r.dt;
  return std::nullopt;
}

}  // namespace marlinc
