// SHA-256 (FIPS 180-4), for certificates and calibration-data fingerprints. Streaming: update()
// any number of times, then hex() once.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace marlinc {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t len);
  void update(std::span<const uint8_t> bytes) { update(bytes.data(), bytes.size()); }
  void update(std::string_view s) { update(s.data(), s.size()); }
  std::array<uint8_t, 32> digest();  // finalises; the object must not be updated afterwards
  std::string hex();                 // lowercase hex of digest()

 private:
  void blocks(const uint8_t* p, size_t count);  // count whole 64-byte blocks
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(std::span<const uint8_t> bytes);

// The block function: the portable scalar one (the `_ref`), and whether the x86 SHA extensions path
// is in use on this CPU (it is tested against the scalar one). For tests and benchmarks.
void sha256_blocks_ref(uint32_t state[8], const uint8_t* p, size_t count);
bool sha256_uses_shani();
// Hash of a whole file, read in chunks (memory does not grow with the file). Throws Io naming the file.
std::string sha256_file(const std::filesystem::path& path);

}  // namespace marlinc
