// One writer per output directory. Two runs given the same OUT_DIR would otherwise share the GPTQ
// resume job beside it (each saving blocks the other then replays) and race to rename their outputs
// into place, the loser failing only at the end of its work. A run holds `<OUT_DIR>.marlinc-lock`
// with flock() from before it reads anything of the job until it exits; a second run is refused at
// once, naming the holder. flock() locks die with their process, so a killed run never leaves a lock
// that blocks the next one (its empty lock file is reused, and removed by the next run that ends).
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace marlinc {

// `<out>.marlinc-lock` beside the output directory (a trailing slash on `out` is ignored).
std::filesystem::path output_lock_path(const std::filesystem::path& out);

class OutputLock {
 public:
  // Takes the lock of `out`, creating its missing parent directories as the writer would (and removing
  // them again on release when they stayed empty). `holder` describes this run for a refused one, e.g.
  // "marlinc quantize". Throws BadUsage naming the lock file and its holder when another process holds
  // it; Io when the lock file cannot be created. On a file system without flock() (some network
  // mounts) the run goes on unlocked: held() is false.
  static OutputLock acquire(const std::filesystem::path& out, const std::string& holder);

  OutputLock(OutputLock&& o) noexcept;
  OutputLock& operator=(OutputLock&&) = delete;
  OutputLock(const OutputLock&) = delete;
  ~OutputLock();  // removes the lock file, then releases the lock

  bool held() const { return fd_ >= 0; }
  const std::filesystem::path& path() const { return path_; }

 private:
  OutputLock() = default;
  std::filesystem::path path_;
  std::vector<std::filesystem::path> created_dirs_;  // deepest first
  int fd_ = -1;
  int live_slot_ = -1;
};

// Removes the lock files of this process's held locks, with async-signal-safe calls only: for the
// SIGINT/SIGTERM handler (the lock itself dies with the process).
void remove_live_output_locks() noexcept;

}  // namespace marlinc
