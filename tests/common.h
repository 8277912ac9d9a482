// Shared helpers for tests: where ../shared is, seeded generators, temporary directories.
#pragma once
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>

#include "tests/catch.hpp"

namespace marlinc::test {

// ../shared relative to the project root (MARLINC_SOURCE_DIR is set by tests/CMakeLists.txt).
inline std::filesystem::path shared_dir() {
  return std::filesystem::path(MARLINC_SOURCE_DIR) / ".." / "shared";
}
inline bool have_shared() { return std::filesystem::exists(shared_dir() / "spec" / "formats.md"); }

// Skips the running test (with a message saying why) when ../shared is absent.
#define MARLINC_REQUIRE_SHARED()                                                              \
  do {                                                                                        \
    if (!::marlinc::test::have_shared()) {                                                    \
      WARN("skipped: ../shared (reference files) is not beside the project root");             \
      return;                                                                                 \
    }                                                                                         \
  } while (0)

// A fresh, empty directory under the build tree, removed at scope exit.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    static std::mt19937_64 rng(std::random_device{}());
    path = std::filesystem::temp_directory_path() / ("marlinc-test-" + tag + "-" + std::to_string(rng()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::error_code ec; std::filesystem::remove_all(path, ec); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace marlinc::test
