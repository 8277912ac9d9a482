#include "quantizer/calib/job_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

#include "checkpoint/error.h"
#include "checkpoint/writer.h"
#include "checkpoint/json_strict.h"
#include "checkpoint/sha256.h"
#include "quantizer/calib/job_file_internal.h"

namespace marlinc::calib {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace job_detail;

namespace job_detail {

std::string read_all(const fs::path& p, uint64_t max_bytes, const std::string& what) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(p, ec);
  if (ec) bad_data(p.string() + ": " + what + " cannot be read: " + ec.message());
  if (size > max_bytes) bad_data(p.string() + ": " + std::to_string(size) + " bytes is too large for " + what);
  std::ifstream f(p, std::ios::binary);
  std::string s(size_t(size), '\0');
  if (!f || !f.read(s.data(), std::streamsize(s.size()))) fail(ErrorKind::Io, p.string() + ": cannot read " + what);
  return s;
}

}  // namespace job_detail

namespace {

constexpr char kMagic[8] = {'M', 'L', 'C', 'J', 'O', 'B', 'B', '1'};
constexpr size_t kFingerprintChars = 64;
constexpr size_t kTrailer = 32;          // SHA-256 of everything before it
constexpr uint32_t kMaxLayers = 1024;    // a block has 7 linears; anything near this is corrupt
constexpr uint32_t kMaxName = 4096;
constexpr int64_t kMaxDim = int64_t(1) << 31;

[[noreturn]] void io_fail(const std::string& what) { fail(ErrorKind::Io, what + ": " + std::strerror(errno)); }

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_fail(dir.string() + ": cannot open to fsync");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) io_fail(dir.string() + ": fsync failed");
}

// Temporary name, fsync, rename: a reader (the next run) sees the old file or the new one, never half.
void write_durable(const fs::path& p, const std::string& bytes) {
  fs::path tmp = p;
  tmp += ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) io_fail(tmp.string() + ": cannot create");
  const char* d = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t w = ::write(fd, d, left);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) { const int e = errno; ::close(fd); errno = e; io_fail(tmp.string() + ": write failed"); }
    d += w;
    left -= size_t(w);
  }
  if (::fsync(fd) != 0) { const int e = errno; ::close(fd); errno = e; io_fail(tmp.string() + ": fsync failed"); }
  if (::close(fd) != 0) io_fail(tmp.string() + ": close failed");
  std::error_code ec;
  fs::rename(tmp, p, ec);
  if (ec) fail(ErrorKind::Io, p.string() + ": cannot rename the temporary file into place: " + ec.message());
}

bool is_hex64(const std::string& s) {
  if (s.size() != kFingerprintChars) return false;
  for (char ch : s)
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
  return true;
}

// ---- block file codec ---------------------------------------------------------------------------

// Bounds-checked reads over the verified payload; every failure names the file and the byte offset.
class Reader {
 public:
  Reader(const std::string& s, size_t end, const std::string& label) : s_(s), end_(end), label_(label) {}
  size_t pos() const { return pos_; }
  size_t left() const { return end_ - pos_; }
  [[noreturn]] void bad(const std::string& rule) const {
    bad_data(label_ + ": at byte " + std::to_string(pos_) + ": " + rule);
  }
  const uint8_t* take(size_t n, const char* what) {
    if (n > left()) bad(std::string("truncated reading ") + what);
    const uint8_t* p = reinterpret_cast<const uint8_t*>(s_.data()) + pos_;
    pos_ += n;
    return p;
  }
  uint64_t le(size_t n, const char* what) {
    const uint8_t* p = take(n, what);
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t(p[i]) << (8 * i);
    return v;
  }
  uint8_t u8(const char* w) { return uint8_t(le(1, w)); }
  uint32_t u32(const char* w) { return uint32_t(le(4, w)); }
  uint64_t u64(const char* w) { return le(8, w); }
  int32_t i32(const char* w) { return int32_t(u32(w)); }
  int64_t i64(const char* w) { return int64_t(u64(w)); }
  double f64(const char* w) { return std::bit_cast<double>(u64(w)); }
  // An element count of `bits` each whose bytes must fit in what is left (ceil(c*bits/8) <= left, i.e.
  // c <= 8*left/bits): checked before anything is allocated.
  uint64_t count(unsigned bits, const char* what) {
    const uint64_t c = u64(what);
    if (c > uint64_t(left()) * 8 / bits)
      bad(std::string(what) + ": count " + std::to_string(c) + " does not fit in the " + std::to_string(left()) +
          " bytes left");
    return c;
  }

 private:
  const std::string& s_;
  size_t end_, pos_ = 0;
  std::string label_;
};

void encode_layer(Writer& w, const FinishedLayer& L) {
  const QuantizedLinear& q = L.q;
  const size_t kn = q.codes.size();
  w.u32(uint32_t(q.name.size()));
  w.bytes(q.name.data(), q.name.size());
  w.i64(q.n);
  w.i64(q.k);
  w.u8(uint8_t(q.bits));
  w.i32(q.group_size);
  w.u8(q.sym ? 1 : 0);
  w.u8(q.scale_type == ScaleType::BF16 ? 1 : 0);
  w.u64(kn);
  if (q.bits == 4) {
    for (size_t i = 0; i < kn; i += 2) {
      const uint8_t lo = q.codes[i], hi = i + 1 < kn ? q.codes[i + 1] : 0;
      if (lo > 15 || hi > 15) fail(ErrorKind::Internal, q.name + ": a 4-bit code above 15 cannot be saved to the job");
      w.u8(uint8_t(lo | (hi << 4)));
    }
  } else {
    w.bytes(q.codes.data(), kn);
  }
  w.u64(q.scales.size());
  for (uint16_t v : q.scales) { w.u8(uint8_t(v & 0xff)); w.u8(uint8_t(v >> 8)); }
  w.u64(q.zeros.size());
  w.bytes(q.zeros.data(), q.zeros.size());
  w.u64(q.g_idx.size());
  for (int32_t v : q.g_idx) w.i32(v);
  w.u64(q.mask.size());
  for (size_t i = 0; i < q.mask.size(); i += 8) {
    uint8_t byte = 0;
    for (size_t j = i; j < std::min(i + 8, q.mask.size()); ++j) {
      if (q.mask[j] > 1) fail(ErrorKind::Internal, q.name + ": a 2:4 mask entry other than 0/1 cannot be saved to the job");
      byte |= uint8_t(q.mask[j] << (j - i));
    }
    w.u8(byte);
  }
  w.f64(L.report.rel_weight_err);
  w.f64(L.report.seconds);
  w.f64(L.report.loss);
  w.f64(L.report.damp);
}

FinishedLayer decode_layer(Reader& r, const std::string& label) {
  FinishedLayer L;
  QuantizedLinear& q = L.q;
  const uint32_t name_len = r.u32("name length");
  if (name_len == 0 || name_len > kMaxName) r.bad("layer name length " + std::to_string(name_len) + " outside [1, 4096]");
  const uint8_t* name = r.take(name_len, "name");
  q.name.assign(reinterpret_cast<const char*>(name), name_len);
  q.n = r.i64("n");
  q.k = r.i64("k");
  if (q.n <= 0 || q.k <= 0 || q.n >= kMaxDim || q.k >= kMaxDim)
    r.bad(q.name + ": shape n=" + std::to_string(q.n) + ", k=" + std::to_string(q.k) + " outside [1, 2^31)");
  const uint64_t kn = uint64_t(q.n) * uint64_t(q.k);
  q.bits = r.u8("bits");
  if (q.bits != 4 && q.bits != 8) r.bad(q.name + ": bits " + std::to_string(q.bits) + " is not 4 or 8");
  q.group_size = r.i32("group");
  const uint8_t sym = r.u8("sym"), st = r.u8("scale type");
  if (sym > 1 || st > 1) r.bad(q.name + ": sym/scale-type flags must be 0 or 1");
  q.sym = sym == 1;
  q.scale_type = st == 1 ? ScaleType::BF16 : ScaleType::F16;

  const uint64_t nc = r.count(q.bits == 4 ? 4 : 8, "codes");
  if (nc != kn) r.bad(q.name + ": " + std::to_string(nc) + " codes, expected k*n = " + std::to_string(kn));
  q.codes.resize(nc);
  if (q.bits == 4) {
    const uint8_t* p = r.take(size_t((nc + 1) / 2), "codes");
    for (uint64_t i = 0; i < nc; ++i) q.codes[i] = uint8_t((p[i / 2] >> (4 * (i % 2))) & 0xf);
  } else {
    std::memcpy(q.codes.data(), r.take(size_t(nc), "codes"), size_t(nc));
  }
  const uint64_t ns = r.count(16, "scales");
  q.scales.resize(ns);
  const uint8_t* sp = r.take(size_t(ns * 2), "scales");
  for (uint64_t i = 0; i < ns; ++i) q.scales[i] = uint16_t(sp[2 * i] | (sp[2 * i + 1] << 8));
  const uint64_t nz = r.count(8, "zeros");
  q.zeros.resize(nz);
  if (nz) std::memcpy(q.zeros.data(), r.take(size_t(nz), "zeros"), size_t(nz));
  const uint64_t ng = r.count(32, "g_idx");
  q.g_idx.resize(ng);
  for (uint64_t i = 0; i < ng; ++i) q.g_idx[i] = r.i32("g_idx");
  const uint64_t nm = r.count(1, "mask");
  q.mask.resize(nm);
  const uint8_t* mp = r.take(size_t((nm + 7) / 8), "mask");
  for (uint64_t i = 0; i < nm; ++i) q.mask[i] = uint8_t((mp[i / 8] >> (i % 8)) & 1);

  QuantizedLayerReport& rep = L.report;
  rep.name = q.name;
  rep.n = q.n;
  rep.k = q.k;
  rep.rel_weight_err = r.f64("rel_weight_err");
  rep.seconds = r.f64("seconds");
  rep.loss = r.f64("loss");
  rep.damp = r.f64("damp");
  for (double v : {rep.rel_weight_err, rep.seconds, rep.loss, rep.damp})
    if (!std::isfinite(v)) r.bad(q.name + ": a report value is not finite");
  // The shared consistency rules of the neutral value (ranges, group sizes, 2:4 counts).
  try {
    q.validate();
  } catch (const Error& e) {
    bad_data(label + ": " + e.what());
  }
  return L;
}

// Depth-first over both objects; a key present on one side only shows "(none)" on the other.
std::string shown(const json& v) {
  if (v.is_null()) return "(none)";
  std::string s = v.is_string() ? v.get<std::string>() : dump(v);
  if (s.size() > 40) s = s.substr(0, 16) + "...";
  return s;
}
void diff(const json& a, const json& b, const std::string& label, std::vector<std::string>& out) {
  if (a.is_object() && b.is_object()) {
    std::set<std::string> keys;
    for (auto it = a.begin(); it != a.end(); ++it) keys.insert(it.key());
    for (auto it = b.begin(); it != b.end(); ++it) keys.insert(it.key());
    for (const auto& k : keys) {
      const json& x = a.contains(k) ? a.at(k) : json();
      const json& y = b.contains(k) ? b.at(k) : json();
      diff(x, y, label.empty() ? (k == "options" ? "option" : k) : label + " " + k, out);
    }
    return;
  }
  if (a != b) out.push_back(label + ": job " + shown(a) + ", now " + shown(b));
}

}  // namespace

fs::path job_dir_for(const fs::path& out) { return beside_output(out, ".marlinc-job"); }

std::string JobInputs::fingerprint() const {
  Sha256 h;
  h.update(dump(json));
  return h.hex();
}

std::vector<std::string> describe_differences(const json& job, const json& now) {
  std::vector<std::string> out;
  diff(job, now, "", out);
  return out;
}

bool discard_job(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(dir, ec))) return false;
  fs::remove_all(dir, ec);
  if (ec) fail(ErrorKind::Io, dir.string() + ": cannot remove the unfinished job: " + ec.message());
  return true;
}

std::string encode_block(const std::string& fingerprint, int64_t block, const std::vector<FinishedLayer>& layers) {
  Writer w;
  w.bytes(kMagic, sizeof kMagic);
  w.bytes(fingerprint.data(), fingerprint.size());
  w.i64(block);
  w.u32(uint32_t(layers.size()));
  for (const auto& L : layers) encode_layer(w, L);
  Sha256 h;
  h.update(w.s);
  const auto d = h.digest();
  w.bytes(d.data(), d.size());
  return std::move(w.s);
}

std::vector<FinishedLayer> decode_block(const std::string& bytes, const std::string& fingerprint, int64_t block,
                                        const std::string& label) {
  const size_t fixed = sizeof kMagic + kFingerprintChars + 8 + 4;
  if (bytes.size() < fixed + kTrailer)
    bad_data(label + ": " + std::to_string(bytes.size()) + " bytes is too short for a job block file (truncated)");
  const size_t body = bytes.size() - kTrailer;
  Sha256 h;
  h.update(std::string_view(bytes.data(), body));
  const auto d = h.digest();
  if (std::memcmp(d.data(), bytes.data() + body, kTrailer) != 0)
    bad_data(label + ": checksum mismatch: the file is corrupt (delete the job directory or pass --restart)");
  Reader r(bytes, body, label);
  if (std::memcmp(r.take(sizeof kMagic, "magic"), kMagic, sizeof kMagic) != 0)
    bad_data(label + ": not a marlinc job block file (magic is not MLCJOBB1)");
  const uint8_t* fp = r.take(kFingerprintChars, "fingerprint");
  if (std::string(reinterpret_cast<const char*>(fp), kFingerprintChars) != fingerprint)
    bad_data(label + ": belongs to another job (its fingerprint differs from job.json's)");
  const int64_t b = r.i64("block");
  if (b != block) bad_data(label + ": holds block " + std::to_string(b) + ", expected " + std::to_string(block));
  const uint32_t n = r.u32("layer count");
  if (n > kMaxLayers) r.bad("layer count " + std::to_string(n) + " exceeds " + std::to_string(kMaxLayers));
  std::vector<FinishedLayer> out;
  for (uint32_t i = 0; i < n; ++i) out.push_back(decode_layer(r, label));
  if (r.left() != 0) r.bad(std::to_string(r.left()) + " unexpected bytes after the last layer");
  return out;
}

GptqJob GptqJob::open(const fs::path& dir, const JobInputs& now, int64_t layers) {
  GptqJob j;
  j.dir_ = dir;
  j.inputs_ = now.json;
  j.fingerprint_ = now.fingerprint();
  j.layers_ = layers;
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) return j;
  if (!fs::is_directory(st))
    bad_usage(dir.string() + ": exists but is not a directory (the resume job of this output lives there); remove it");
  const fs::path jf = dir / "job.json";
  if (!fs::exists(jf)) bad_data(jf.string() + ": missing: the job directory is damaged (delete it or pass --restart)");
  auto bad = [&](const std::string& rule) {
    bad_data(jf.string() + ": " + rule + " (delete " + dir.string() + " or pass --restart)");
  };
  const std::string text = read_all(jf, kMaxJobJson, "job.json");
  json jj;
  try {
    jj = detail::parse_json_strict(text, jf.string());
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::BadData) throw;
    bad_data(e.what() + std::string(" (delete ") + dir.string() + " or pass --restart)");
  }
  if (!jj.is_object()) bad("not a JSON object");
  const auto ver = jj.find("marlinc_job");
  if (ver == jj.end() || !ver->is_number_integer()) bad("\"marlinc_job\" (the format version) is missing");
  if (*ver != kJobFormatVersion)
    bad_usage(jf.string() + ": job format " + dump(*ver) + ", this marlinc reads " + std::to_string(kJobFormatVersion) +
              "; delete " + dir.string() + " or pass --restart to start fresh");
  const auto fp = jj.find("fingerprint");
  if (fp == jj.end() || !fp->is_string() || !is_hex64(fp->get<std::string>()))
    bad("\"fingerprint\" must be 64 lowercase hex digits");
  const auto inputs = jj.find("inputs");
  if (inputs == jj.end() || !inputs->is_object()) bad("\"inputs\" must be an object");
  if (JobInputs{*inputs}.fingerprint() != fp->get<std::string>())
    bad("\"fingerprint\" does not match the \"inputs\" beside it (edited or corrupt)");
  const auto nl = jj.find("layers");
  const auto blocks = jj.find("blocks");
  if (nl == jj.end() || !nl->is_number_unsigned()) bad("\"layers\" must be a non-negative integer");
  if (blocks == jj.end() || !blocks->is_array()) bad("\"blocks\" must be an array");
  if (fp->get<std::string>() != j.fingerprint_) {
    std::string what;
    for (const auto& d : describe_differences(*inputs, now.json)) what += (what.empty() ? "" : "; ") + d;
    bad_usage(dir.string() + ": an unfinished job of this output was started with different inputs (" +
              (what.empty() ? "fingerprints differ" : what) + "); delete that directory or pass --restart to discard "
              "it and start fresh");
  }
  if (nl->get<uint64_t>() != uint64_t(layers))
    bad("\"layers\" is " + dump(*nl) + " but the model has " + std::to_string(layers) + " decoder blocks");
  if (blocks->size() > size_t(layers)) bad("\"blocks\" lists more blocks than the model has");
  for (size_t i = 0; i < blocks->size(); ++i)
    if (!(*blocks)[i].is_number_unsigned() || (*blocks)[i].get<uint64_t>() != i)
      bad("\"blocks\" must be 0, 1, 2, ... in order (entry " + std::to_string(i) + " is " + dump((*blocks)[i]) + ")");
  j.finished_ = int64_t(blocks->size());
  j.on_disk_ = true;
  return j;
}

fs::path GptqJob::block_file(int64_t b) const {
  char name[32];
  std::snprintf(name, sizeof name, "block-%05lld.bin", (long long)b);
  return dir_ / name;
}

std::vector<FinishedLayer> GptqJob::load_block(int64_t b) const {
  if (b < 0 || b >= finished_) fail(ErrorKind::Internal, "job: block " + std::to_string(b) + " is not finished");
  const fs::path p = block_file(b);
  if (!fs::exists(p)) bad_data(p.string() + ": listed in job.json but missing (delete the job directory or pass --restart)");
  return decode_block(read_all(p, UINT64_MAX, "a job block file"), fingerprint_, b, p.string());
}

void GptqJob::write_job_json(const fs::path& dir) const {
  json blocks = json::array();
  for (int64_t b = 0; b < finished_; ++b) blocks.push_back(b);
  const json jj = {{"marlinc_job", kJobFormatVersion}, {"fingerprint", fingerprint_}, {"inputs", inputs_},
                   {"layers", layers_}, {"blocks", blocks}};
  write_durable(dir / "job.json", dump(jj, 1) + "\n");
}

void GptqJob::save_block(int64_t b, const std::vector<FinishedLayer>& layers) {
  if (b != finished_) fail(ErrorKind::Internal, "job: block " + std::to_string(b) + " saved out of order");
  const std::string bytes = encode_block(fingerprint_, b, layers);
  if (on_disk_) {
    write_durable(block_file(b), bytes);
    finished_ = b + 1;
    write_job_json(dir_);
    return;
  }
  // The directory appears whole, with job.json and its first block, by one rename.
  fs::path tmp = dir_;
  tmp += ".new";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec) || ec)
    fail(ErrorKind::Io, tmp.string() + ": cannot create the job directory: " + ec.message());
  const LiveTempDir on_signal_remove(tmp);  // a kill before the rename leaves no .new directory
  write_durable(tmp / block_file(b).filename(), bytes);
  finished_ = b + 1;
  write_job_json(tmp);
  fsync_dir(tmp);
  fs::rename(tmp, dir_, ec);
  if (ec) fail(ErrorKind::Io, dir_.string() + ": cannot rename the job directory into place: " + ec.message());
  fsync_dir(dir_.has_parent_path() ? dir_.parent_path() : fs::path("."));
  on_disk_ = true;
}

bool GptqJob::remove(std::string* why) noexcept {
  std::error_code ec;
  fs::remove_all(dir_, ec);
  if (ec && why) *why = ec.message();
  on_disk_ = on_disk_ && ec;
  return !ec;
}

}  // namespace marlinc::calib
