// What job_file.cpp and job_inputs.cpp share; not an interface for anything else.
#pragma once
#include <bit>
#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace marlinc::calib::job_detail {

inline constexpr uint64_t kMaxJobJson = 64u << 20;  // job.json is a few KB; a huge one is not ours

// json dumps that never throw on a non-UTF-8 file name, the same way on write and on re-hash.
inline std::string dump(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The whole file, at most max_bytes (BadData naming the file beyond that or when unreadable).
std::string read_all(const std::filesystem::path& p, uint64_t max_bytes, const std::string& what);

// Little-endian serialisation into a string.
class Writer {
 public:
  std::string s;
  void bytes(const void* p, size_t n) { s.append(static_cast<const char*>(p), n); }
  void u8(uint8_t v) { s.push_back(char(v)); }
  void u32(uint32_t v) { for (int i = 0; i < 4; ++i) s.push_back(char((v >> (8 * i)) & 0xff)); }
  void u64(uint64_t v) { for (int i = 0; i < 8; ++i) s.push_back(char((v >> (8 * i)) & 0xff)); }
  void i32(int32_t v) { u32(uint32_t(v)); }
  void i64(int64_t v) { u64(uint64_t(v)); }
  void f64(double v) { u64(std::bit_cast<uint64_t>(v)); }
};

}  // namespace marlinc::calib::job_detail
