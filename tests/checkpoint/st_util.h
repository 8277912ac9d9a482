// Test helpers: hand-built safetensors bytes (so malformed files can be made on purpose) and a small
// synthetic-checkpoint builder on top of CheckpointWriter.
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/writer.h"

namespace marlinc::test {

// What a SIGTERM handler runs in exit_status_after_sigterm's child (a handler takes no captures).
inline void (*g_sigterm_cleanup)() = nullptr;

// Forks; the child installs a SIGTERM handler that runs `cleanup` (as the CLI's handler does) and exits 7,
// runs `setup` (which may _exit with another status when a precondition fails) and raises SIGTERM. Returns
// the child's exit status, -1 when it did not exit normally (an exception, a crash).
inline int exit_status_after_sigterm(void (*cleanup)(), const std::function<void()>& setup) {
  const pid_t child = ::fork();
  if (child < 0) return -2;
  if (child == 0) {
    g_sigterm_cleanup = cleanup;
    struct sigaction sa {};
    sa.sa_handler = [](int) { g_sigterm_cleanup(); ::_exit(7); };
    sigaction(SIGTERM, &sa, nullptr);
    setup();
    ::raise(SIGTERM);
    ::_exit(4);  // not reached
  }
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// 8-byte little-endian length + header text (unpadded) + data.
inline std::vector<uint8_t> raw_safetensors(const std::string& header, const std::vector<uint8_t>& data,
                                            uint64_t length_override = UINT64_MAX) {
  std::vector<uint8_t> out(8 + header.size() + data.size());
  uint64_t n = length_override == UINT64_MAX ? header.size() : length_override;
  for (int b = 0; b < 8; ++b) out[size_t(b)] = uint8_t(n >> (8 * b));
  if (!header.empty()) std::memcpy(out.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + header.size(), data.data(), data.size());
  return out;
}

inline void write_bytes(const std::filesystem::path& p, const std::vector<uint8_t>& b) {
  std::ofstream o(p, std::ios::binary | std::ios::trunc);
  o.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}
inline void write_text(const std::filesystem::path& p, const std::string& s) {
  std::ofstream o(p, std::ios::binary | std::ios::trunc);
  o << s;
}
inline std::vector<uint8_t> read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

template <class T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A tensor with its bytes, for building whole checkpoints in one call.
struct TensorData {
  TensorSpec spec;
  std::vector<uint8_t> bytes;
};

inline TensorData filled(const std::string& name, DType dt, std::vector<int64_t> shape, uint32_t seed) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<uint8_t> b(size_t(n) * dtype_size(dt));
  uint32_t x = seed * 2654435761u + 12345u;
  for (auto& c : b) { x = x * 1664525u + 1013904223u; c = uint8_t(x >> 24); }
  return {{name, dt, std::move(shape)}, std::move(b)};
}
template <class T>
TensorData typed(const std::string& name, DType dt, std::vector<int64_t> shape, const std::vector<T>& v) {
  return {{name, dt, std::move(shape)}, as_bytes(v)};
}

inline void write_checkpoint(const std::filesystem::path& dir, const std::vector<TensorData>& ts,
                             const std::map<std::string, std::string>& files = {}, WriterOptions opts = {}) {
  std::vector<TensorSpec> plan;
  for (const auto& t : ts) plan.push_back(t.spec);
  CheckpointWriter w(dir, plan, opts);
  for (auto it = ts.rbegin(); it != ts.rend(); ++it) w.write(it->spec.name, it->bytes);  // out of order on purpose
  for (const auto& [n, c] : files) w.add_file(n, c);
  w.commit();
}

}  // namespace marlinc::test
