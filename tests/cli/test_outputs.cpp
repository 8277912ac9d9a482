// End-to-end: marlinc never writes over what it reads. An output directory that is the input checkpoint or a folder
// holding it, a --json report or --certificate on one of the checkpoint's files or on the calibration text: refused
// (exit 2, naming the option and the rule) before any work, every input byte unchanged. A report inside the output
// directory the run makes (the README's `--json out/report.json`) is written after the output.
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/output_lock.h"
#include "tests/cli/cli_runner.h"
#include "tests/common.h"

namespace fs = std::filesystem;
using marlinc::test::q;
using marlinc::test::Result;
using marlinc::test::run_cli;
using marlinc::test::slurp;
using marlinc::test::TempDir;

namespace {

fs::path sample() { return marlinc::test::sample_model(); }

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// Runs `args` (in `dir`), which must be refused with `rule` in its message.
void refused(const std::string& args, const fs::path& dir, const std::string& rule) {
  const Result r = run_cli(args, dir);
  INFO(args << "\n" << r.err);
  CHECK(r.rc == 2);
  CHECK(contains(r.err, rule));
}

}  // namespace

TEST_CASE("marlinc quantize and convert refuse an output directory that is or holds the input", "[cli]") {
  TempDir td("outputs-dir");
  const fs::path m = td.path / "parent" / "m";
  fs::create_directories(m.parent_path());
  fs::copy(sample(), m, fs::copy_options::recursive);
  const std::string weights = slurp(m / "model.safetensors");
  const std::string rtn = "quantize --method rtn --overwrite ";
  refused(rtn + q(m) + " " + q(m), td.path, "output directory is the input checkpoint");
  refused(rtn + q(m) + " " + q(m.string() + "/"), td.path, "output directory is the input checkpoint");
  refused(rtn + q(m / "model.safetensors") + " " + q(m), td.path, "output directory is the input checkpoint");
  refused(rtn + q(m) + " " + q(m / ".." / "m"), td.path, "output directory is the input checkpoint");
  refused(rtn + q(m) + " " + q(td.path / "parent"), td.path, "a folder holding the input checkpoint");
  refused(rtn + q(m) + " " + q(td.path), td.path, "a folder holding the input checkpoint");
  // convert: a Marlin checkpoint made from the copy, converted onto a folder holding it.
  REQUIRE(run_cli("quantize --method rtn " + q(m) + " " + q(td.path / "parent" / "q"), td.path).rc == 0);
  refused("convert --to gptq --overwrite " + q(td.path / "parent" / "q") + " " + q(td.path / "parent"), td.path,
          "a folder holding the input checkpoint");
  CHECK(slurp(m / "model.safetensors") == weights);
  CHECK(fs::exists(td.path / "parent" / "q" / "model.safetensors"));
}

TEST_CASE("marlinc quantize --json and verify --certificate refuse the input's own files", "[cli]") {
  TempDir td("outputs-file");
  const fs::path m = td.path / "m";
  fs::copy(sample(), m, fs::copy_options::recursive);
  const std::string weights = slurp(m / "model.safetensors"), config = slurp(m / "config.json");
  const std::string rtn = "quantize --method rtn " + q(m) + " " + q(td.path / "out");
  refused(rtn + " --json " + q(m / "model.safetensors"), td.path, "--json");
  refused(rtn + " --json " + q(m / "config.json"), td.path, "is a file of the input checkpoint");
  refused(rtn + " --json " + q(m / "generation_config.json"), td.path, "is a file of the input checkpoint");
  refused(rtn + " --json " + q(td.path / "out"), td.path, "is the output directory");
  fs::create_symlink(m / "model.safetensors", td.path / "link.safetensors");
  refused(rtn + " --json " + q(td.path / "link.safetensors"), td.path, "is a file of the input checkpoint");
  CHECK_FALSE(fs::exists(td.path / "out"));
  // The calibration text of a GPTQ run.
  const std::string text = "Once upon a time there was a small model.\n";
  std::ofstream(td.path / "calib.txt", std::ios::binary) << text;
  refused("quantize --method gptq --calib " + q(td.path / "calib.txt") + " " + q(m) + " " + q(td.path / "g") +
              " --json " + q(td.path / "calib.txt"),
          td.path, "is the input file");
  CHECK(slurp(td.path / "calib.txt") == text);
  // The README's form: the report inside the output directory the run makes.
  const Result r = run_cli(rtn + " --json " + q(td.path / "out" / "report.json"), td.path);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const nlohmann::json rep = nlohmann::json::parse(slurp(td.path / "out" / "report.json"));
  CHECK(rep.contains("layers"));
  // verify: the certificate over the verified checkpoint's weights or the reference's config is refused; beside them
  // it is written.
  const std::string out_weights = slurp(td.path / "out" / "model.safetensors");
  refused("verify --cpu --certificate " + q(td.path / "out" / "model.safetensors") + " " + q(td.path / "out"), td.path,
          "is a file of the input checkpoint");
  refused("verify --cpu --reference " + q(m) + " --certificate " + q(m / "config.json") + " " + q(td.path / "out"),
          td.path, "is a file of the input checkpoint");
  CHECK(slurp(td.path / "out" / "model.safetensors") == out_weights);
  const Result v = run_cli("verify --cpu --certificate " + q(td.path / "out" / "cert.json") + " " + q(td.path / "out"),
                           td.path);
  INFO(v.err);
  CHECK(v.rc == 0);
  CHECK(fs::exists(td.path / "out" / "cert.json"));
  CHECK(slurp(m / "model.safetensors") == weights);
  CHECK(slurp(m / "config.json") == config);
}

// A signal ignored when marlinc starts stays ignored (nohup ignores SIGHUP; shells ignore SIGINT for
// background jobs): the run finishes. Not ignored, SIGHUP ends it with the signal's status and no output.
TEST_CASE("a signal ignored at start stays ignored as under nohup", "[cli]") {
  TempDir td("nohup");
  auto hup_after_start = [&](const std::string& prelude, const fs::path& out) {
    const std::string run = std::string("'") + MARLINC_CLI_PATH + "' quantize " + q(sample()) + " " + q(out) +
                            " --method gptq --format marlin --samples 16 >/dev/null 2>&1";
    const std::string cmd = "bash -c \"" + prelude + run + " & p=\\$!; sleep 0.3; kill -HUP \\$p; wait \\$p\"";
    const int st = std::system(cmd.c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  CHECK(hup_after_start("trap '' HUP; ", td.path / "ignored") == 0);
  CHECK(fs::exists(td.path / "ignored" / "model.safetensors"));
  CHECK(hup_after_start("", td.path / "caught") == 128 + SIGHUP);
  CHECK(!fs::exists(td.path / "caught"));
}

// The output is swapped in by renaming directories, which cannot move the working directory: refused
// up front (it failed at the end with EBUSY). A --json path under a file names that file.
TEST_CASE("the working directory is refused as the output and a report under a file is refused", "[cli]") {
  TempDir td("cwd-out");
  fs::create_directories(td.path / "w");
  Result r = run_cli("quantize " + q(sample()) + " . --method rtn --format marlin --overwrite", td.path,
                     "cd " + q(td.path / "w") + " &&");
  INFO(r.out << r.err);
  CHECK(r.rc == 2);
  CHECK(r.err.find("is the working directory or holds it") != std::string::npos);
  CHECK(fs::is_empty(td.path / "w"));
  std::ofstream(td.path / "afile") << "x";
  r = run_cli("quantize " + q(sample()) + " " + q(td.path / "o") + " --method rtn --format marlin --json " +
                  q(td.path / "afile" / "r.json"),
              td.path);
  CHECK(r.rc == 2);
  CHECK(r.err.find("afile is not a directory") != std::string::npos);
  CHECK(!fs::exists(td.path / "o"));
}

TEST_CASE("a second run writing the same output directory is refused at once and changes nothing", "[cli][lock]") {
  TempDir td("outputs-lock");
  const fs::path out = td.path / "out";
  REQUIRE(run_cli("quantize " + q(sample()) + " " + q(out) + " --method rtn", td.path).rc == 0);
  const std::string before = slurp(out / "model.safetensors");
  {
    // What a running marlinc holds (flock() conflicts between open files, so this process stands in for it).
    const marlinc::OutputLock held = marlinc::OutputLock::acquire(out, "marlinc quantize from elsewhere");
    for (const std::string& args :
         {"quantize " + q(sample()) + " " + q(out) + " --method rtn --group 64 --overwrite",
          "quantize " + q(sample()) + " " + q(out) + " --method gptq --samples 2 --max-len 64 --overwrite",
          "convert " + q(out) + " " + q(out) + "/ --to gptq --overwrite"}) {
      refused(args, td.path, "another marlinc run is writing this output (pid " + std::to_string(::getpid()) +
                                 ": marlinc quantize from elsewhere, holding " + (td.path / "out.marlinc-lock").string());
    }
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(td.path)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"out", "out.marlinc-lock", "stderr.txt", "stdout.txt"});
    CHECK(slurp(out / "model.safetensors") == before);
  }
  // Released: the same run goes ahead and leaves no lock file beside its output.
  const Result r = run_cli("quantize " + q(sample()) + " " + q(out) + " --method rtn --group 64 --overwrite", td.path);
  INFO(r.err);
  CHECK(r.rc == 0);
  CHECK(slurp(out / "model.safetensors") != before);
  CHECK_FALSE(fs::exists(td.path / "out.marlinc-lock"));
}
