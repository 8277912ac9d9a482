#include "cli/output.h"

#include <cstdio>
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
    out.write(contents.data(), std::streamsize(contents.size()));
    out.flush();
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      fail(ErrorKind::Io, tmp.string() + ": write failed");
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

void check_output_file(const std::string& option, const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) bad_usage(option + " " + path.string() + ": is a directory; give a file name");
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  if (!fs::is_directory(dir, ec)) bad_usage(option + " " + path.string() + ": directory " + dir.string() + " does not exist");
  if (::access(dir.c_str(), W_OK) != 0) bad_usage(option + " " + path.string() + ": directory " + dir.string() + " is not writable");
}

void note_stale_outputs(const std::filesystem::path& out) {
  for (const auto& p : stale_temp_outputs(out))
    std::fprintf(stderr, "note: %s is the partial output of an interrupted run (its process has exited); "
                         "remove it to free the space\n", p.c_str());
}

}  // namespace marlinc::cli
