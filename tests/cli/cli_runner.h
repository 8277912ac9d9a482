// Runs the real marlinc binary for end-to-end tests, capturing exit code, stdout and stderr.
#pragma once
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace marlinc::test {

struct Result {
  int rc;
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs `[env] marlinc args`, capturing stdout and stderr through files in `tmp`.
inline Result run_cli(const std::string& args, const std::filesystem::path& tmp, const std::string& env = "") {
  const std::filesystem::path o = tmp / "stdout.txt", e = tmp / "stderr.txt";
  const std::string cmd = env + (env.empty() ? "" : " ") + "'" + MARLINC_CLI_PATH + "' " + args + " >'" + o.string() +
                          "' 2>'" + e.string() + "'";
  int st = std::system(cmd.c_str());
  return Result{WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(o), slurp(e)};
}

// The built-in sample checkpoint (data/sample/model).
inline std::filesystem::path sample_model() {
  return std::filesystem::path(MARLINC_SOURCE_DIR) / "data" / "sample" / "model";
}

// A path quoted for the shell.
// (Appended piecewise: gcc 12 warns falsely about "'" + std::string&& under -O2.)
inline std::string q(const std::filesystem::path& p) {
  std::string s = "'";
  s += p.string();
  return s += "'";
}

}  // namespace marlinc::test
