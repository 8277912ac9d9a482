#include "cli/output.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <unistd.h>

#include "checkpoint/error.h"
#include "checkpoint/writer.h"

namespace marlinc::cli {

void write_file_atomic(const std::filesystem::path& path, const std::string& contents) {
  std::filesystem::path tmp = path;
  tmp += ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(ErrorKind::Io, tmp.string() + ": cannot create");
    errno = 0;
    out.write(contents.data(), std::streamsize(contents.size()));
    out.flush();
    if (!out) {
      const std::string why = errno ? std::strerror(errno) : "unknown error";  // ENOSPC, EDQUOT...
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      fail(ErrorKind::Io, tmp.string() + ": write failed: " + why);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();  // before remove() reuses ec
    std::filesystem::remove(tmp, ec);
    fail(ErrorKind::Io, path.string() + ": cannot rename the temporary file into place: " + why);
  }
}

std::string json_text(const nlohmann::json& j) { return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace); }

namespace {

// `p` as an absolute, normalized path without a trailing separator ("out/" and "./out" name "out").
std::filesystem::path lexical(const std::filesystem::path& p) {
  std::error_code ec;
  std::filesystem::path a = std::filesystem::absolute(p, ec).lexically_normal();
  if (!a.has_filename() && a.has_parent_path() && a != a.root_path()) a = a.parent_path();
  return a;
}

bool same_place(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ec;
  return lexical(a) == lexical(b) || std::filesystem::equivalent(a, b, ec);
}

}  // namespace

void check_output_file(const std::string& option, const std::filesystem::path& path,
                       const std::filesystem::path& out_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) bad_usage(option + " " + path.string() + ": is a directory; give a file name");
  if (!out_dir.empty()) {
    if (same_place(path, out_dir))
      bad_usage(option + " " + path.string() + ": is the output directory; give a file name (e.g. " +
                (out_dir / "report.json").string() + ")");
    if (same_place(lexical(path).parent_path(), out_dir)) return;  // made by the run, the report written after it
  }
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec))
    bad_usage(option + " " + path.string() + ": " + dir.string() + (fs::exists(dir, ec) ? " is not a directory" : ": directory does not exist"));
  if (::access(dir.c_str(), W_OK) != 0) bad_usage(option + " " + path.string() + ": directory " + dir.string() + " is not writable");
}

void check_not_input_file(const std::string& option, const std::filesystem::path& path,
                          const std::filesystem::path& input, const std::filesystem::path& other) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) return;
  const fs::path dir = fs::is_directory(input, ec) ? input : input.has_parent_path() ? input.parent_path() : ".";
  if ((!fs::is_directory(input, ec) && fs::equivalent(input, path, ec)) || is_checkpoint_file(dir, path))
    bad_usage(option + " " + path.string() + ": is a file of the input checkpoint " + input.string() +
              "; write it elsewhere");
  if (!other.empty() && fs::equivalent(other, path, ec))
    bad_usage(option + " " + path.string() + ": is the input file " + other.string() + "; write it elsewhere");
}

void note_stale_outputs(const std::filesystem::path& out) {
  for (const auto& p : stale_temp_outputs(out))
    std::fprintf(stderr, "note: %s is the partial output of an interrupted run (its process has exited); "
                         "remove it to free the space\n", p.c_str());
}

OutputLock lock_output(const std::filesystem::path& out, const std::string& command, const std::filesystem::path& in) {
  char when[32] = "";
  const std::time_t now = std::time(nullptr);
  std::tm utc {};
  if (gmtime_r(&now, &utc)) std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &utc);
  OutputLock lock = OutputLock::acquire(out, "marlinc " + command + " from " + in.string() + ", started " + when);
  if (!lock.held())
    std::fprintf(stderr, "note: %s: this file system has no file locks; nothing stops another run writing the same "
                         "output at the same time\n", lock.path().c_str());
  return lock;
}

}  // namespace marlinc::cli
