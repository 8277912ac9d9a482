// CRC-32 (IEEE 802.3 / zlib: reflected polynomial 0xEDB88320, init and final xor 0xFFFFFFFF), the
// checksum the spec's layout test vectors use (formats.md §8). Table built at compile time.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

namespace marlinc {

constexpr std::array<uint32_t, 256> make_crc32_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int b = 0; b < 8; ++b) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}
inline constexpr auto kCrc32Table = make_crc32_table();

// Continue a running CRC (start with crc = 0): crc32(b, crc32(a)) == crc32(a ++ b).
inline uint32_t crc32(const void* data, size_t size, uint32_t crc = 0) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = kCrc32Table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

// zlib's check value for the ASCII string "123456789" pins the polynomial and the reflection.
static_assert(kCrc32Table[1] == 0x77073096u && kCrc32Table[255] == 0x2D02EF8Du,
              "CRC-32 table must be the reflected IEEE 802.3 polynomial 0xEDB88320");

}  // namespace marlinc
