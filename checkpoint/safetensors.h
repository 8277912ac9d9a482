// safetensors reading (spec: ../shared/spec/formats.md §7.1). parse_safetensors_header is a pure,
// fuzzed function that validates the whole header before anyone touches tensor bytes; SafetensorsFile
// maps a file read-only and hands out zero-copy views into it.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/dtype.h"
#include "checkpoint/error.h"

namespace marlinc {

// Header length cap of the official reader (MAX_HEADER_SIZE): a larger length is corrupt or hostile.
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // [] = scalar
  uint64_t begin = 0, end = 0;  // byte range relative to the data buffer (after the header), end exclusive
  int64_t numel() const;        // product of shape (1 for a scalar)
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // in offset order
  std::map<std::string, std::string> metadata;  // "__metadata__" (string -> string)
  uint64_t data_start = 0;  // file offset of the data buffer: 8 + header length
};

// Validates and parses a safetensors header. `bytes`/`size` is a prefix of the file holding at least the
// 8-byte length and the header (more is fine); `file_size` is the size of the whole file; `label` names
// the file in error messages. Throws Error(BadData) "<label>: <tensor>: <rule>" on any violation:
// truncation, header length past EOF or over kMaxSafetensorsHeader, non-UTF-8 or malformed JSON, not an
// object, unknown dtype, negative dims, shape x dtype size != byte range, ranges outside the buffer,
// overlaps, holes, buffer not tiled exactly up to EOF, duplicate names, non-string metadata.
SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size, uint64_t file_size,
                                           const std::string& label);

// A read-only memory-mapped safetensors file. Movable, not copyable.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);

  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  uint64_t file_size() const { return size_; }
  uint64_t data_start() const { return header_.data_start; }
  // nullptr when absent.
  const TensorInfo* find(std::string_view name) const;
  // Zero-copy bytes of one tensor (info must come from this file).
  std::span<const uint8_t> data(const TensorInfo& t) const;
  // Typed zero-copy view. Throws BadData when sizeof(T) != the dtype size, and when the bytes are not
  // aligned for T (safetensors only guarantees the buffer start is 8-aligned; callers then copy).
  template <class T>
  std::span<const T> view(const TensorInfo& t) const {
    if (sizeof(T) != dtype_size(t.dtype))
      bad_data(path_.string() + ": " + t.name + ": element size " + std::to_string(dtype_size(t.dtype)) +
               " of dtype " + std::string(dtype_name(t.dtype)) + " does not match the requested view type of size " +
               std::to_string(sizeof(T)));
    std::span<const uint8_t> b = data(t);
    if (reinterpret_cast<uintptr_t>(b.data()) % alignof(T) != 0)
      bad_data(path_.string() + ": " + t.name + ": tensor bytes are not " + std::to_string(alignof(T)) +
               "-byte aligned in the file; copy them instead of viewing");
    return {reinterpret_cast<const T*>(b.data()), b.size() / sizeof(T)};
  }

 private:
  SafetensorsFile() = default;
  void release() noexcept;
  std::filesystem::path path_;
  const uint8_t* map_ = nullptr;  // whole file, read-only
  uint64_t size_ = 0;
  SafetensorsHeader header_;
  std::vector<size_t> by_name_;  // indices into header_.tensors sorted by name, for find()
};

}  // namespace marlinc
