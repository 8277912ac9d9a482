// Catch2 v2 (Debian bookworm: 2.13) and v3 (the GPU machine: 3.4) both work: include this header,
// never a Catch2 header directly.
#pragma once
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
// v3 renamed the substring matcher; tests spell it as v2 did.
namespace Catch {
inline auto Contains(const std::string& s, CaseSensitive cs = CaseSensitive::Yes) {
  return Matchers::ContainsSubstring(s, cs);
}
}  // namespace Catch
#else
#include <catch2/catch.hpp>
#endif
