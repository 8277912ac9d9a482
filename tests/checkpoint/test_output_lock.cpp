// OutputLock: one writer per output directory, refused runs told who holds it, nothing left behind.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <optional>

#include "checkpoint/error.h"
#include "checkpoint/output_lock.h"
#include "tests/checkpoint/st_util.h"
#include "tests/common.h"

using namespace marlinc;
using namespace marlinc::test;
namespace fs = std::filesystem;

namespace {
// The BadUsage message of a refused acquire, or "" when it was taken.
std::string refusal(const fs::path& out) {
  try {
    OutputLock l = OutputLock::acquire(out, "second");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::BadUsage);
    return e.what();
  }
  return "";
}
bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }
std::string text_of(const fs::path& p) {
  const std::vector<uint8_t> b = read_bytes(p);
  return std::string(b.begin(), b.end());
}
}  // namespace

TEST_CASE("output lock: a second writer of the same output is refused naming the holder and the lock file",
          "[writer][lock]") {
  TempDir tmp("lock1");
  const fs::path out = tmp.path / "out";
  CHECK(output_lock_path(out) == tmp.path / "out.marlinc-lock");
  CHECK(output_lock_path(tmp.path / "out/") == tmp.path / "out.marlinc-lock");
  {
    OutputLock first = OutputLock::acquire(out, "marlinc quantize from m");
    REQUIRE(first.held());
    REQUIRE(fs::exists(first.path()));
    CHECK(contains(text_of(first.path()), "pid " + std::to_string(::getpid()) + ": marlinc quantize from m"));
    // flock() locks belong to the open file, so a second open in this process conflicts as another run's would.
    for (const fs::path& spelled : {out, tmp.path / "out/", tmp.path / "." / "out"}) {
      const std::string why = refusal(spelled);
      CHECK(contains(why, "another marlinc run is writing this output"));
      CHECK(contains(why, "marlinc quantize from m"));
      CHECK(contains(why, (tmp.path / "out.marlinc-lock").string()));
    }
    CHECK(refusal(tmp.path / "other").empty());  // another output is independent
  }
  CHECK_FALSE(fs::exists(tmp.path / "out.marlinc-lock"));  // released: the file goes
  CHECK(refusal(out).empty());
  CHECK(fs::is_empty(tmp.path));
}

TEST_CASE("output lock: the file a killed run left does not block, and a live one in another process does",
          "[writer][lock]") {
  TempDir tmp("lock2");
  const fs::path out = tmp.path / "out";
  // A killed run's lock file: present, unlocked, with its stale description.
  write_text(output_lock_path(out), "pid 99999999: marlinc quantize from gone\n");
  CHECK(refusal(out).empty());
  CHECK_FALSE(fs::exists(output_lock_path(out)));

  int ready[2], done[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(done) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int rc = 0;
    try {
      OutputLock l = OutputLock::acquire(out, "the child");
      char c = 'r';
      if (::write(ready[1], &c, 1) != 1) rc = 5;
      if (::read(done[0], &c, 1) != 1) rc = 6;  // hold until the parent has tried
    } catch (...) {
      rc = 4;
    }
    ::_exit(rc);
  }
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  CHECK(contains(refusal(out), "pid " + std::to_string(child) + ": the child"));
  REQUIRE(::write(done[1], &c, 1) == 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(refusal(out).empty());  // the child's exit released it
  for (int fd : {ready[0], ready[1], done[0], done[1]}) ::close(fd);
}

TEST_CASE("output lock: missing parents are made for the run and removed when they stayed empty", "[writer][lock]") {
  TempDir tmp("lock3");
  {
    OutputLock l = OutputLock::acquire(tmp.path / "a" / "b" / "out", "r");
    CHECK(fs::is_directory(tmp.path / "a" / "b"));
  }
  CHECK_FALSE(fs::exists(tmp.path / "a"));  // a failed run leaves no directories it made
  {
    OutputLock l = OutputLock::acquire(tmp.path / "c" / "d" / "out", "r");
    fs::create_directories(tmp.path / "c" / "d" / "out");  // what a committed output does
  }
  CHECK(fs::is_directory(tmp.path / "c" / "d" / "out"));
  // A parent that is a file: the lock file cannot be made, and the error names it.
  write_text(tmp.path / "f", "x");
  try {
    OutputLock l = OutputLock::acquire(tmp.path / "f" / "out", "r");
    FAIL("a lock under a file was taken");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Io);
    CHECK(contains(e.what(), (tmp.path / "f").string()));
  }
}

TEST_CASE("output lock: on a fatal signal the held lock files are removed", "[writer][lock]") {
  TempDir tmp("lock4");
  CHECK(exit_status_after_sigterm(remove_live_output_locks, [&] {
          std::optional<OutputLock> l;
          try {
            l.emplace(OutputLock::acquire(tmp.path / "out", "r"));
          } catch (...) {
            ::_exit(3);
          }
          if (!fs::exists(tmp.path / "out.marlinc-lock")) ::_exit(5);
          ::raise(SIGTERM);
        }) == 7);
  CHECK(fs::is_empty(tmp.path));
}
