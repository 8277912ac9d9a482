// libFuzzer target for the quantization configs of a checkpoint directory as marlinc reads them:
// config.json (its quantization_config) and quantize_config.json, which the input gives in that order
// separated by a NUL byte after a first byte that picks the tensors beside them: one GPTQ 4-bit g128
// module, one dense Marlin module, or both. Whatever the configs say, opening the directory, detecting the format and
// describing and reading every module either succeed with modules that validate, or throw
// marlinc::Error(BadData / BadUsage). Any other exception, crash, leak or UB report is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/error.h"
#include "checkpoint/format.h"
#include "packer/adapters.h"

namespace fs = std::filesystem;

namespace {

// One tensor of the fixed file: name, dtype, shape and a byte pattern that makes valid-looking data.
struct T {
  std::string name, dtype;
  std::vector<int64_t> shape;
  uint32_t word;  // repeated little-endian (g_idx: row / 128 instead)
};

// set: 1 the GPTQ module, 2 the Marlin module, 3 both.
std::string safetensors_bytes(int set) {
  const int64_t k = 256, n = 64;
  std::vector<T> ts;
  if (set & 1)
    ts.insert(ts.end(), {{"model.layers.0.mlp.up_proj.qweight", "I32", {k / 8, n}, 0x87654321u},
                         {"model.layers.0.mlp.up_proj.qzeros", "I32", {k / 128, n / 8}, 0x77777777u},
                         {"model.layers.0.mlp.up_proj.scales", "F16", {k / 128, n}, 0x2c002c00u},
                         {"model.layers.0.mlp.up_proj.g_idx", "I32", {k}, 0}});
  if (set & 2)
    ts.insert(ts.end(), {{"model.layers.0.mlp.down_proj.B", "I32", {k / 16, n * 2}, 0x12345678u},
                         {"model.layers.0.mlp.down_proj.s", "F16", {k / 128, n}, 0x2c002c00u}});
  std::string header = "{", data;
  for (const T& t : ts) {
    int64_t count = 1;
    for (int64_t d : t.shape) count *= d;
    const size_t elem = t.dtype == "F16" ? 2 : 4, begin = data.size();
    for (int64_t i = 0; i < count; ++i) {
      const uint32_t v = t.name.ends_with("g_idx") ? uint32_t(i / 128) : t.word;
      data.append(reinterpret_cast<const char*>(&v), elem);
    }
    std::string shape;
    for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? "," : "") + std::to_string(t.shape[i]);
    header += (header.size() > 1 ? "," : "") + std::string("\"") + t.name + "\":{\"dtype\":\"" + t.dtype +
              "\",\"shape\":[" + shape + "],\"data_offsets\":[" + std::to_string(begin) + "," +
              std::to_string(data.size()) + "]}";
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  std::string out(8, '\0');
  const uint64_t len = header.size();
  std::memcpy(out.data(), &len, 8);
  return out + header + data;
}

// The three checkpoint directories, written once per process and removed at its exit.
struct Dirs {
  std::vector<fs::path> v;
  Dirs() {
    for (int s = 1; s <= 3; ++s) {
      fs::path p = fs::temp_directory_path() / ("marlinc-fuzz-qc-" + std::to_string(::getpid()) + "-" + std::to_string(s));
      fs::create_directories(p);
      std::ofstream(p / "model.safetensors", std::ios::binary) << safetensors_bytes(s);
      v.push_back(p);
    }
  }
  ~Dirs() {
    std::error_code ec;
    for (const auto& p : v) fs::remove_all(p, ec);
  }
};
const fs::path& dir(int set) {
  static const Dirs d;
  return d.v[size_t(set - 1)];
}

void put(const fs::path& p, std::string_view text) {
  if (text.empty()) {
    std::error_code ec;
    fs::remove(p, ec);
    return;
  }
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(text.data(), std::streamsize(text.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const fs::path& d = dir(1 + data[0] % 3);
  const std::string_view all(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t nul = all.find('\0');
  put(d / "config.json", all.substr(0, nul));
  put(d / "quantize_config.json", nul == std::string_view::npos ? std::string_view() : all.substr(nul + 1));
  try {
    const marlinc::Checkpoint ck = marlinc::Checkpoint::open(d);
    const marlinc::FormatInfo fi = marlinc::detect_format(ck);
    (void)marlinc::quantized_module_shapes(ck, fi);
    for (const marlinc::ModuleDesc& d : marlinc::describe_modules(ck, fi)) {
      try {
        marlinc::read_module(ck, d, fi).validate();
      } catch (const marlinc::Error& e) {
        if (e.kind() != marlinc::ErrorKind::BadData) std::abort();
      }
    }
  } catch (const marlinc::Error& e) {
    if (e.kind() != marlinc::ErrorKind::BadData && e.kind() != marlinc::ErrorKind::BadUsage) std::abort();
  }
  return 0;
}
