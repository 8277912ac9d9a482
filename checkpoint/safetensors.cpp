#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <set>

#include "checkpoint/json_strict.h"

namespace marlinc {

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated not to overflow by the parser
  return n;
}

namespace {

using json = nlohmann::json;

[[noreturn]] void fail_at(const std::string& label, const std::string& what, const std::string& rule) {
  bad_data(label + ": " + what + ": " + rule);
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// A JSON number that is a non-negative integer literal. nlohmann stores every literal without a sign
// as unsigned; a float such as 2.0, a negative literal and "-0" (signed) are rejected like the
// official reader does.
bool as_u64(const json& v, uint64_t& out) {
  if (!v.is_number_unsigned()) return false;
  out = v.get<uint64_t>();
  return true;
}

TensorInfo parse_entry(const std::string& label, const std::string& name, const json& e) {
  if (!e.is_object()) fail_at(label, name, "header entry is not a JSON object (need dtype, shape, data_offsets)");
  TensorInfo t;
  t.name = name;
  auto dt_it = e.find("dtype");
  if (dt_it == e.end() || !dt_it->is_string()) fail_at(label, name, "missing or non-string \"dtype\"");
  const std::string& dts = dt_it->get_ref<const std::string&>();
  auto dt = dtype_from_name(dts);
  if (!dt) fail_at(label, name, "unknown dtype \"" + dts + "\"");
  t.dtype = *dt;

  auto sh_it = e.find("shape");
  if (sh_it == e.end() || !sh_it->is_array()) fail_at(label, name, "missing or non-array \"shape\"");
  uint64_t numel = 1;
  for (const json& d : *sh_it) {
    uint64_t v;
    if (!as_u64(d, v)) fail_at(label, name, "shape entry " + d.dump() + " is not a non-negative integer");
    if (v > uint64_t(INT64_MAX) || __builtin_mul_overflow(numel, v, &numel))
      fail_at(label, name, "shape " + sh_it->dump() + " overflows 64-bit element count");
    t.shape.push_back(int64_t(v));
  }
  uint64_t nbytes;
  if (__builtin_mul_overflow(numel, uint64_t(dtype_size(t.dtype)), &nbytes) || nbytes > uint64_t(INT64_MAX))
    fail_at(label, name, "shape " + shape_str(t.shape) + " overflows 64-bit byte count");

  auto off_it = e.find("data_offsets");
  if (off_it == e.end() || !off_it->is_array() || off_it->size() != 2)
    fail_at(label, name, "missing \"data_offsets\" or it is not [BEGIN, END]");
  if (!as_u64((*off_it)[0], t.begin) || !as_u64((*off_it)[1], t.end))
    fail_at(label, name, "data_offsets " + off_it->dump() + " are not non-negative integers");
  if (t.end < t.begin)
    fail_at(label, name, "data_offsets " + off_it->dump() + " end before they begin");
  if (t.end - t.begin != nbytes)
    fail_at(label, name, "shape " + shape_str(t.shape) + " x " + std::string(dtype_name(t.dtype)) + " (" +
                             std::to_string(dtype_size(t.dtype)) + " bytes) = " + std::to_string(nbytes) +
                             " bytes but data_offsets " + off_it->dump() + " span " +
                             std::to_string(t.end - t.begin) + " bytes");
  return t;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size, uint64_t file_size,
                                           const std::string& label) {
  const std::string hdr = "header";
  if (size > file_size) fail_at(label, hdr, "internal: prefix longer than the file");
  if (file_size < 8)
    fail_at(label, hdr, "truncated file: " + std::to_string(file_size) +
                            " bytes, shorter than the 8-byte header length");
  if (size < 8) fail_at(label, hdr, "truncated prefix: fewer than 8 bytes available");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian u64
  if (n > kMaxSafetensorsHeader)
    fail_at(label, hdr, "header length " + std::to_string(n) + " exceeds the " +
                            std::to_string(kMaxSafetensorsHeader) + "-byte cap");
  if (n > file_size - 8)
    fail_at(label, hdr, "header length " + std::to_string(n) + " runs past the end of the file (" +
                            std::to_string(file_size) + " bytes): truncated file");
  if (n > size - 8) fail_at(label, hdr, "truncated prefix: header of " + std::to_string(n) + " bytes not all available");
  std::string_view text(reinterpret_cast<const char*>(bytes + 8), size_t(n));
  if (text.empty() || text[0] != '{') fail_at(label, hdr, "header does not start with '{' (not a JSON object)");
  if (!detail::valid_utf8(text)) fail_at(label, hdr, "header is not valid UTF-8");
  // Depth 3 is the deepest structure marlinc reads (root object > entry > shape array), but the official
  // reader skips unknown fields nested up to serde_json's recursion limit (128), so files with deep
  // extra fields load there and must load here.
  json root = detail::parse_json_strict(text, label, 128);
  if (!root.is_object()) fail_at(label, hdr, "header JSON is not an object");

  SafetensorsHeader h;
  h.data_start = 8 + n;
  const uint64_t buf_len = file_size - h.data_start;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& key = it.key();
    if (key == "__metadata__") {
      if (it->is_null()) continue;  // the official reader takes null as no metadata
      if (!it->is_object()) fail_at(label, key, "__metadata__ is not a JSON object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          fail_at(label, "__metadata__", "value of \"" + m.key() + "\" is " + std::string(m->type_name()) +
                                             ", but metadata must map strings to strings");
        h.metadata.emplace(m.key(), m->get<std::string>());
      }
      continue;
    }
    TensorInfo t = parse_entry(label, key, *it);
    if (t.end > buf_len)
      fail_at(label, key, "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                              "] run past the end of the data buffer (" + std::to_string(buf_len) + " bytes)");
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  // The official validator: in offset order, every tensor starts where the previous one ended.
  uint64_t pos = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : h.tensors) {
    if (t.begin < pos)
      fail_at(label, t.name, "byte range [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                                 ") overlaps tensor " + (prev ? prev->name : std::string("?")) + " [" +
                                 std::to_string(prev ? prev->begin : 0) + ", " + std::to_string(pos) + ")");
    if (t.begin > pos)
      fail_at(label, t.name, "hole in the data buffer: bytes [" + std::to_string(pos) + ", " +
                                 std::to_string(t.begin) + ") before this tensor belong to no tensor");
    pos = t.end;
    prev = &t;
  }
  if (pos != buf_len)
    fail_at(label, prev ? prev->name : hdr,
            "data buffer is " + std::to_string(buf_len) + " bytes but the tensors cover " + std::to_string(pos) +
                " (trailing bytes after the last tensor)");
  return h;
}

// ---- SafetensorsFile ------------------------------------------------------------------------------

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile f;
  f.path_ = path;
  const std::string label = path.string();
  // O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer; the regular-file check below
  // then refuses it. It changes nothing for a regular file, which is only mapped.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(ErrorKind::Io, label + ": cannot open: " + std::strerror(errno));
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail(ErrorKind::Io, label + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(ErrorKind::BadData, label + ": header: not a regular file");
  }
  f.size_ = uint64_t(st.st_size);
  if (f.size_ > 0) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      fail(ErrorKind::Io, label + ": cannot mmap: " + std::strerror(e));
    }
    f.map_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
  f.header_ = parse_safetensors_header(f.map_, f.size_, f.size_, label);  // f's destructor unmaps on throw
  f.by_name_.resize(f.header_.tensors.size());
  std::iota(f.by_name_.begin(), f.by_name_.end(), size_t(0));
  const auto& ts = f.header_.tensors;
  std::sort(f.by_name_.begin(), f.by_name_.end(), [&](size_t a, size_t b) { return ts[a].name < ts[b].name; });
  // Duplicate names are rejected by the strict JSON parse; this guards the find() invariant anyway.
  for (size_t i = 1; i < f.by_name_.size(); ++i)
    if (ts[f.by_name_[i]].name == ts[f.by_name_[i - 1]].name)
      fail_at(label, ts[f.by_name_[i]].name, "duplicate tensor name");
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)), map_(o.map_), size_(o.size_), header_(std::move(o.header_)),
      by_name_(std::move(o.by_name_)) {
  o.map_ = nullptr;
  o.size_ = 0;
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    map_ = o.map_;
    size_ = o.size_;
    header_ = std::move(o.header_);
    by_name_ = std::move(o.by_name_);
    o.map_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { release(); }

void SafetensorsFile::release() noexcept {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
  map_ = nullptr;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  const auto& ts = header_.tensors;
  auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                             [&](size_t i, std::string_view n) { return ts[i].name < n; });
  if (it == by_name_.end() || ts[*it].name != name) return nullptr;
  return &ts[*it];
}

std::span<const uint8_t> SafetensorsFile::data(const TensorInfo& t) const {
  const auto& ts = header_.tensors;
  if (ts.empty() || &t < ts.data() || &t >= ts.data() + ts.size())
    fail(ErrorKind::Internal, path_.string() + ": " + t.name + ": TensorInfo does not belong to this file");
  if (t.begin == t.end) return {};
  return {map_ + header_.data_start + t.begin, size_t(t.end - t.begin)};
}

}  // namespace marlinc
