#include "checkpoint/output_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "checkpoint/error.h"
#include "checkpoint/signal_cleanup.h"
#include "checkpoint/writer.h"

namespace fs = std::filesystem;

namespace marlinc {
namespace {

// A refused run shows at most this much of the holder's description (the file is someone else's bytes).
constexpr size_t kHolderShown = 200;
// Opening the lock file races with its removal by a finishing holder; each lost race retries.
constexpr int kAcquireAttempts = 64;

std::string holder_of(int fd) {
  char buf[kHolderShown];
  const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  std::string s;
  for (ssize_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(buf[i]);
    if (c == '\n') break;
    s += (c >= 0x20 && c < 0x7f) ? char(c) : '?';
  }
  return s.empty() ? "another process" : s;
}

// The same file: the path was not removed or replaced between open() and flock().
bool still_named(int fd, const fs::path& p) {
  struct stat a {}, b {};
  return ::fstat(fd, &a) == 0 && ::stat(p.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace

fs::path output_lock_path(const fs::path& out) { return beside_output(out, ".marlinc-lock"); }

OutputLock OutputLock::acquire(const fs::path& out, const std::string& holder) {
  if (out.empty()) bad_usage("output directory is empty");
  OutputLock lock;
  lock.path_ = output_lock_path(out);
  const fs::path parent = lock.path_.has_parent_path() ? lock.path_.parent_path() : fs::path(".");
  std::error_code ec;
  for (fs::path d = parent; !d.empty() && !fs::exists(d, ec); d = d.parent_path()) {
    lock.created_dirs_.push_back(d);
    if (d == d.parent_path()) break;
  }
  if (!lock.created_dirs_.empty()) {
    fs::create_directories(parent, ec);
    if (ec) fail(ErrorKind::Io, parent.string() + ": cannot create the output's parent directory: " + ec.message());
  }
  for (int attempt = 0; attempt < kAcquireAttempts; ++attempt) {
    const int fd = ::open(lock.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
      fail(ErrorKind::Io, lock.path_.string() + ": cannot create the output's lock file: " + std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        const std::string who = holder_of(fd);
        ::close(fd);
        bad_usage(out.string() + ": another marlinc run is writing this output (" + who + ", holding " +
                  lock.path_.string() + "); wait for it to end or choose another output directory");
      }
      ::close(fd);
      if (err == EINTR) continue;
      ::unlink(lock.path_.c_str());
      return lock;  // no flock() here (ENOLCK, EOPNOTSUPP...): unlocked, as before locks existed
    }
    if (!still_named(fd, lock.path_)) {  // a finishing holder removed it after our open(): take the new one
      ::close(fd);
      continue;
    }
    const std::string text = "pid " + std::to_string(::getpid()) + ": " + holder + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != ssize_t(text.size())) {
      // The description is only for a refused run's message; the lock itself holds.
    }
    lock.fd_ = fd;
    lock.live_slot_ = register_cleanup(lock.path_, CleanupKind::File);
    return lock;
  }
  fail(ErrorKind::Io, lock.path_.string() + ": the lock file kept being replaced while taking it (" +
                          std::to_string(kAcquireAttempts) + " attempts)");
}

OutputLock::OutputLock(OutputLock&& o) noexcept
    : path_(std::move(o.path_)), created_dirs_(std::move(o.created_dirs_)), fd_(o.fd_), live_slot_(o.live_slot_) {
  o.fd_ = -1;
  o.live_slot_ = -1;
  o.created_dirs_.clear();
}

OutputLock::~OutputLock() {
  if (fd_ >= 0) {
    // Out of the signal registry first: once the file is unlinked another run may lock a new one at the
    // same path, which a signal arriving here must not remove (at worst our own file stays, empty).
    unregister_cleanup(live_slot_);
    // Removed while still held: a run that opened the file meanwhile sees it unnamed and retries.
    ::unlink(path_.c_str());
    ::close(fd_);
  }
  // Only empty directories go (rmdir refuses others): the output, when committed, keeps its parents.
  for (const fs::path& d : created_dirs_) ::rmdir(d.c_str());
}

void remove_live_output_locks() noexcept { run_cleanup(CleanupKind::File); }

}  // namespace marlinc
