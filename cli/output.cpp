#include "cli/output.h"

#include <fstream>
#include <unistd.h>

#include "checkpoint/error.h"

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
    std::filesystem::remove(tmp, ec);
    fail(ErrorKind::Io, path.string() + ": cannot rename the temporary file into place: " + ec.message());
  }
}

}  // namespace marlinc::cli
