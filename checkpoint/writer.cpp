#include "checkpoint/writer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>

#include <nlohmann/json.hpp>

#include "checkpoint/error.h"
#include "checkpoint/signal_cleanup.h"

namespace marlinc {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void io_fail(const std::string& what) {
  fail(ErrorKind::Io, what + ": " + std::strerror(errno));
}

void pwrite_all(int fd, const uint8_t* p, size_t n, uint64_t off, const std::string& label) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, off_t(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      io_fail(label + ": write failed");
    }
    p += w;
    n -= size_t(w);
    off += uint64_t(w);
  }
}

void fsync_path(const fs::path& p, bool dir) {
  int fd = ::open(p.c_str(), (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) io_fail(p.string() + ": cannot open to fsync");
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    errno = e;
    io_fail(p.string() + ": fsync failed");
  }
  ::close(fd);
}

// Relative output names must stay inside the output directory.
void check_rel_name(const std::string& rel) {
  fs::path p(rel);
  if (rel.empty() || p.is_absolute()) bad_usage("output file name \"" + rel + "\" must be a relative path");
  for (const auto& part : p)
    if (part == "..") bad_usage("output file name \"" + rel + "\" must not contain \"..\"");
}

std::string shard_name(const std::string& base, size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", i + 1, n);
  return base + buf;
}

std::atomic<unsigned> g_writer_seq{0};

}  // namespace

LiveTempDir::LiveTempDir(const fs::path& dir) : slot_(register_cleanup(dir, CleanupKind::FlatDir)) {}
LiveTempDir::~LiveTempDir() { unregister_cleanup(slot_); }

void remove_live_temp_outputs() noexcept { run_cleanup(CleanupKind::FlatDir); }

CheckpointWriter::CheckpointWriter(fs::path out_dir, std::vector<TensorSpec> plan, WriterOptions opts)
    : out_dir_(std::move(out_dir)), opts_(std::move(opts)) {
  if (out_dir_.empty()) bad_usage("output directory is empty");
  while (!out_dir_.empty() && !out_dir_.has_filename()) out_dir_ = out_dir_.parent_path();  // "a/b/" -> "a/b"
  if (opts_.base_name.empty() || opts_.base_name.find('/') != std::string::npos)
    bad_usage("writer base_name \"" + opts_.base_name + "\" must be a plain, non-empty file name");
  std::error_code ec;
  if (fs::exists(out_dir_, ec)) {
    if (!fs::is_directory(out_dir_)) bad_usage(out_dir_.string() + ": exists and is not a directory");
    // The output is swapped in by renaming directories, which cannot move the working directory or one
    // that holds it (EBUSY, or the temporary output nested inside the old one).
    const fs::path here = fs::weakly_canonical(fs::current_path(ec), ec), out = fs::weakly_canonical(out_dir_, ec);
    if (!ec && !out.empty() && std::mismatch(out.begin(), out.end(), here.begin(), here.end()).first == out.end())
      bad_usage(out_dir_.string() + ": is the working directory or holds it; give the output a directory of its own");
    if (!fs::is_empty(out_dir_) && !opts_.overwrite)
      bad_usage(out_dir_.string() + ": output directory exists and is not empty (pass --overwrite to replace it)");
    // --overwrite replaces the directory and everything in it: only an earlier output (a checkpoint,
    // which has *.safetensors files), not a directory of other things named by mistake.
    if (!fs::is_empty(out_dir_) && opts_.overwrite) {
      bool checkpoint = false;
      for (const auto& e : fs::directory_iterator(out_dir_, ec))
        checkpoint |= e.path().extension() == ".safetensors" && e.is_regular_file(ec);
      if (!checkpoint)
        bad_usage(out_dir_.string() + ": --overwrite replaces an earlier output and everything in it, and this "
                  "directory holds no *.safetensors file (not a checkpoint): remove or empty it yourself");
    }
  }

  // Validate and size the plan.
  plan_.reserve(plan.size());
  for (auto& s : plan) {
    if (s.name.empty() || s.name == "__metadata__") bad_usage("tensor name \"" + s.name + "\" is not allowed in safetensors");
    uint64_t numel = 1;
    for (int64_t d : s.shape) {
      if (d < 0) bad_usage(s.name + ": negative dimension in planned shape");
      if (__builtin_mul_overflow(numel, uint64_t(d), &numel)) bad_usage(s.name + ": shape overflows");
    }
    uint64_t nb;
    if (__builtin_mul_overflow(numel, uint64_t(dtype_size(s.dtype)), &nb)) bad_usage(s.name + ": shape overflows");
    plan_.push_back(Planned{std::move(s), nb, 0, 0, false});
  }
  by_name_.resize(plan_.size());
  std::iota(by_name_.begin(), by_name_.end(), size_t(0));
  std::sort(by_name_.begin(), by_name_.end(), [&](size_t a, size_t b) { return plan_[a].spec.name < plan_[b].spec.name; });
  for (size_t i = 1; i < by_name_.size(); ++i)
    if (plan_[by_name_[i]].spec.name == plan_[by_name_[i - 1]].spec.name)
      bad_usage(plan_[by_name_[i]].spec.name + ": tensor planned twice");

  // Shard split in name order (keeps a layer's tensors together), then within a shard the official
  // writer's order: dtype alignment descending, then name, so every tensor is aligned to its element size.
  std::vector<std::vector<size_t>> groups(1);
  uint64_t cur = 0;
  for (size_t i : by_name_) {
    const uint64_t nb = plan_[i].nbytes;
    if (opts_.max_shard_bytes > 0 && !groups.back().empty() && cur + nb > opts_.max_shard_bytes) {
      groups.emplace_back();
      cur = 0;
    }
    groups.back().push_back(i);
    cur += nb;
  }
  shards_.resize(groups.size());
  for (size_t s = 0; s < groups.size(); ++s) {
    Shard& sh = shards_[s];
    sh.file_name = groups.size() == 1 ? opts_.base_name + ".safetensors" : shard_name(opts_.base_name, s, groups.size());
    sh.tensors = groups[s];
    std::sort(sh.tensors.begin(), sh.tensors.end(), [&](size_t a, size_t b) {
      const size_t aa = dtype_size(plan_[a].spec.dtype), ab = dtype_size(plan_[b].spec.dtype);
      if (aa != ab) return aa > ab;
      return plan_[a].spec.name < plan_[b].spec.name;
    });
    // Compact JSON, "__metadata__" first, entries in offset order with keys dtype, shape, data_offsets.
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    h["__metadata__"] = {{"format", "pt"}};
    uint64_t off = 0;
    for (size_t i : sh.tensors) {
      nlohmann::ordered_json e = nlohmann::ordered_json::object();
      e["dtype"] = std::string(dtype_name(plan_[i].spec.dtype));
      e["shape"] = plan_[i].spec.shape;
      e["data_offsets"] = {off, off + plan_[i].nbytes};
      h[plan_[i].spec.name] = std::move(e);
      plan_[i].shard = s;
      plan_[i].file_offset = off;  // made absolute below
      off += plan_[i].nbytes;
    }
    sh.data_bytes = off;
    std::string text = h.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // buffer starts 8-byte aligned
    sh.header.resize(8);
    uint64_t n = text.size();
    for (int b = 0; b < 8; ++b) sh.header[b] = char((n >> (8 * b)) & 0xff);
    sh.header += text;
    for (size_t i : sh.tensors) plan_[i].file_offset += sh.header.size();
  }

  // Temporary sibling directory: same file system, so commit() is a rename.
  const fs::path parent = out_dir_.has_parent_path() ? out_dir_.parent_path() : fs::path(".");
  fs::create_directories(parent, ec);
  tmp_dir_ = parent / (out_dir_.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                       std::to_string(g_writer_seq++));
  fs::remove_all(tmp_dir_, ec);
  if (!fs::create_directory(tmp_dir_, ec) || ec)
    fail(ErrorKind::Io, tmp_dir_.string() + ": cannot create temporary output directory: " + ec.message());
  live_slot_ = register_cleanup(tmp_dir_, CleanupKind::FlatDir);
  try {
    for (Shard& sh : shards_) {
      const fs::path p = tmp_dir_ / sh.file_name;
      sh.fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (sh.fd < 0) io_fail(p.string() + ": cannot create");
      pwrite_all(sh.fd, reinterpret_cast<const uint8_t*>(sh.header.data()), sh.header.size(), 0, p.string());
      if (::ftruncate(sh.fd, off_t(sh.header.size() + sh.data_bytes)) != 0) io_fail(p.string() + ": cannot size file");
    }
  } catch (...) {
    abort_output();
    throw;
  }
}

CheckpointWriter::~CheckpointWriter() {
  if (!committed_) abort_output();
}

void CheckpointWriter::abort_output() noexcept {
  for (Shard& sh : shards_) {
    if (sh.fd >= 0) ::close(sh.fd);
    sh.fd = -1;
  }
  std::error_code ec;
  if (!tmp_dir_.empty()) fs::remove_all(tmp_dir_, ec);
  unregister_cleanup(live_slot_);
  live_slot_ = -1;
}

size_t CheckpointWriter::find_planned(const std::string& name) const {
  auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                             [&](size_t i, const std::string& n) { return plan_[i].spec.name < n; });
  if (it == by_name_.end() || plan_[*it].spec.name != name)
    bad_usage(out_dir_.string() + ": " + name + ": tensor was not in the writer's plan");
  return *it;
}

const std::string& CheckpointWriter::shard_of(const std::string& name) const {
  return shards_[plan_[find_planned(name)].shard].file_name;
}

void CheckpointWriter::write(const std::string& name, std::span<const uint8_t> bytes) {
  if (committed_) fail(ErrorKind::Internal, out_dir_.string() + ": " + name + ": write after commit");
  Planned& p = plan_[find_planned(name)];
  if (p.written) fail(ErrorKind::Internal, out_dir_.string() + ": " + name + ": tensor written twice");
  if (bytes.size() != p.nbytes)
    fail(ErrorKind::Internal, out_dir_.string() + ": " + name + ": got " + std::to_string(bytes.size()) +
                                  " bytes, plan says " + std::to_string(p.nbytes) + " (shape x " +
                                  std::string(dtype_name(p.spec.dtype)) + ")");
  const Shard& sh = shards_[p.shard];
  pwrite_all(sh.fd, bytes.data(), bytes.size(), p.file_offset, (tmp_dir_ / sh.file_name).string());
  p.written = true;
}

void CheckpointWriter::add_file(const std::string& rel_name, const std::string& contents) {
  check_rel_name(rel_name);
  const fs::path p = tmp_dir_ / rel_name;
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  errno = 0;
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  if (!out) io_fail(p.string() + ": cannot create");
  out.write(contents.data(), std::streamsize(contents.size()));
  out.close();
  if (!out) io_fail(p.string() + ": write failed");  // errno from the failed write or close (ENOSPC, EDQUOT...)
}

void CheckpointWriter::copy_file(const fs::path& src, const std::string& rel_name) {
  check_rel_name(rel_name);
  const fs::path p = tmp_dir_ / rel_name;
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  std::error_code ec;
  fs::copy_file(src, p, fs::copy_options::overwrite_existing, ec);
  if (ec) fail(ErrorKind::Io, src.string() + ": cannot copy to " + p.string() + ": " + ec.message());
}

void CheckpointWriter::commit() {
  if (committed_) return;
  for (const Planned& p : plan_)
    if (!p.written) bad_usage(out_dir_.string() + ": " + p.spec.name + ": planned tensor was never written");
  try {
    if (shards_.size() > 1) {
      nlohmann::json idx;
      uint64_t total = 0;
      nlohmann::json wm = nlohmann::json::object();
      for (const Planned& p : plan_) {
        total += p.nbytes;
        wm[p.spec.name] = shards_[p.shard].file_name;
      }
      idx["metadata"] = {{"total_size", total}};
      idx["weight_map"] = std::move(wm);
      // transformers: json.dumps(index, indent=2, sort_keys=True) + "\n" (ASCII-escaped like Python).
      add_file(opts_.base_name + ".safetensors.index.json", idx.dump(2, ' ', true) + "\n");
    }
    for (Shard& sh : shards_) {
      if (::fsync(sh.fd) != 0) io_fail((tmp_dir_ / sh.file_name).string() + ": fsync failed");
      if (::close(sh.fd) != 0) { sh.fd = -1; io_fail((tmp_dir_ / sh.file_name).string() + ": close failed"); }
      sh.fd = -1;
    }
    for (const auto& e : fs::recursive_directory_iterator(tmp_dir_))
      if (e.is_regular_file()) fsync_path(e.path(), false);
    fsync_path(tmp_dir_, true);

    // rename() cannot replace a non-empty directory. An existing (empty, or --overwrite) output is
    // swapped with the new one in one step (renameat2 RENAME_EXCHANGE), so `out` always holds a whole
    // output; the old one, now under the temporary name, is deleted after. File systems without the
    // exchange move the old output aside first.
    std::error_code ec;
    fs::path old;
    if (fs::exists(out_dir_, ec)) {
      if (!fs::is_empty(out_dir_) && !opts_.overwrite)
        bad_usage(out_dir_.string() + ": output directory appeared while writing and is not empty");
      if (::renameat2(AT_FDCWD, tmp_dir_.c_str(), AT_FDCWD, out_dir_.c_str(), RENAME_EXCHANGE) == 0) {
        committed_ = true;
        if (!opts_.test_keep_replaced) fs::remove_all(tmp_dir_, ec);  // the previous output
        if (fs::exists(fs::symlink_status(tmp_dir_, ec))) {
          // Out of the temporary name, which a later run would take for an interrupted run's output.
          leftover_ = out_dir_.parent_path() / (out_dir_.filename().string() + ".old-" + std::to_string(::getpid()) +
                                                "-" + std::to_string(g_writer_seq++));
          fs::rename(tmp_dir_, leftover_, ec);
          if (ec) leftover_ = tmp_dir_;
        }
        unregister_cleanup(live_slot_);
        live_slot_ = -1;
        fsync_path(out_dir_.has_parent_path() ? out_dir_.parent_path() : fs::path("."), true);
        return;
      }
      old = out_dir_.parent_path() / (out_dir_.filename().string() + ".old-" + std::to_string(::getpid()) + "-" +
                                      std::to_string(g_writer_seq++));
      fs::rename(out_dir_, old);
    }
    fs::rename(tmp_dir_, out_dir_, ec);
    if (ec) {
      if (!old.empty()) fs::rename(old, out_dir_);  // put the previous output back
      fail(ErrorKind::Io, out_dir_.string() + ": cannot rename temporary output into place: " + ec.message());
    }
    committed_ = true;
    unregister_cleanup(live_slot_);
    live_slot_ = -1;
    if (!old.empty()) {
      if (!opts_.test_keep_replaced) fs::remove_all(old, ec);
      if (fs::exists(fs::symlink_status(old, ec))) leftover_ = old;
    }
    fsync_path(out_dir_.has_parent_path() ? out_dir_.parent_path() : fs::path("."), true);
  } catch (const fs::filesystem_error& e) {
    abort_output();
    committed_ = true;  // nothing left to clean
    fail(ErrorKind::Io, out_dir_.string() + ": " + e.what());
  } catch (...) {
    abort_output();
    committed_ = true;
    throw;
  }
}

namespace {

bool name_starts(const std::string& n, const char* p) { return n.rfind(p, 0) == 0; }
bool name_ends(const std::string& n, const char* s) {
  const size_t l = std::strlen(s);
  return n.size() >= l && n.compare(n.size() - l, l, s) == 0;
}
// The files a checkpoint's writer writes itself: tensors, their index and the (quantization) configs.
bool is_written_file(const std::string& n) {
  return name_ends(n, ".safetensors") || name_ends(n, ".safetensors.index.json") || n == "config.json" ||
         n == "quantize_config.json" || n == "quant_config.json";
}
// The non-tensor files carried into an output. *.py: remote code that config.json's auto_map names
// (configuration_*.py, modeling_*.py, tokenization_*.py); without it trust_remote_code models do not load.
bool is_carried_file(const std::string& n) {
  if (is_written_file(n)) return false;
  return name_starts(n, "tokenizer") || name_starts(n, "chat_template") || name_ends(n, ".tiktoken") ||
         name_ends(n, ".py") || n == "generation_config.json" || n == "special_tokens_map.json" ||
         n == "added_tokens.json" || n == "vocab.json" || n == "vocab.txt" || n == "merges.txt" ||
         n == "spiece.model" || n == "sentencepiece.bpe.model" || n == "preprocessor_config.json" ||
         n == "processor_config.json";
}

}  // namespace

void check_output_not_input(const fs::path& input_dir, const fs::path& out) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return;  // a path still to be made holds nothing
  fs::path p = fs::weakly_canonical(fs::absolute(input_dir, ec), ec);
  for (bool first = true; !p.empty(); first = false) {
    if (fs::equivalent(p, out, ec)) {
      const std::string what =
          first ? std::string("the input checkpoint") : "a folder holding the input checkpoint " + input_dir.string();
      bad_usage(out.string() + ": output directory is " + what + "; write to a new directory");
    }
    if (p == p.parent_path()) break;
    p = p.parent_path();
  }
}

bool is_checkpoint_file(const fs::path& dir, const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec) || !fs::is_directory(dir, ec)) return false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if ((is_written_file(n) || is_carried_file(n)) && fs::equivalent(e.path(), path, ec)) return true;
  }
  return false;
}

std::vector<std::string> copy_non_tensor_files(const fs::path& src_dir, CheckpointWriter& w) {
  std::vector<std::string> copied;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(src_dir, ec)) {
    if (!e.is_regular_file()) continue;
    const std::string n = e.path().filename().string();
    if (is_carried_file(n)) copied.push_back(n);
  }
  if (ec) fail(ErrorKind::Io, src_dir.string() + ": cannot list directory: " + ec.message());
  std::sort(copied.begin(), copied.end());
  for (const std::string& n : copied) w.copy_file(src_dir / n, n);
  return copied;
}

std::string leftover_note(const CheckpointWriter& w) {
  return w.leftover().empty() ? std::string()
                              : "the output this run replaced could not be removed (read-only contents?); it is now at " +
                                    w.leftover().string() + ": remove it yourself";
}

fs::path beside_output(const fs::path& out, const std::string& suffix) {
  fs::path o = out.lexically_normal();
  if (!o.has_filename() && o.has_parent_path()) o = o.parent_path();
  o += suffix;
  return o;
}

std::vector<fs::path> stale_temp_outputs(const fs::path& out_dir) {
  std::vector<fs::path> out;
  fs::path o = out_dir;
  if (!o.has_filename()) o = o.parent_path();  // "out/" names "out"
  const fs::path parent = o.has_parent_path() ? o.parent_path() : fs::path(".");
  const std::string prefix = o.filename().string() + ".tmp-";
  std::error_code ec;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    // "<pid>-<n>", both decimal.
    const std::string rest = name.substr(prefix.size());
    const size_t dash = rest.find('-');
    if (dash == 0 || dash == std::string::npos || dash + 1 == rest.size() ||
        rest.find_first_not_of("0123456789-") != std::string::npos || rest.find('-', dash + 1) != std::string::npos)
      continue;
    long long pid = 0;
    try {
      pid = std::stoll(rest.substr(0, dash));
    } catch (...) {
      continue;
    }
    // kill(pid, 0) probes without signalling: ESRCH means no such process here.
    const bool gone = pid > 0 && (pid > 0x7fffffffLL || (::kill(pid_t(pid), 0) != 0 && errno == ESRCH));
    if (gone && it->is_directory(ec)) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace marlinc
