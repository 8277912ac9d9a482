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
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(std::span<const uint8_t> bytes);
// Hash of a whole file, read in chunks (memory does not grow with the file). Throws Io naming the file.
std::string sha256_file(const std::filesystem::path& path);

}  // namespace marlinc
