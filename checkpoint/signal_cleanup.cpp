#include "checkpoint/signal_cleanup.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace marlinc {
namespace {

// Fixed storage; each slot published by its state (0 free, 1 being filled, 2 ready) so the handler
// reads only complete paths.
constexpr int kSlots = 20;
constexpr size_t kPathBytes = 4096;
struct Slot {
  std::atomic<int> state{0};
  CleanupKind kind = CleanupKind::File;
  char path[kPathBytes];
};
Slot g_slots[kSlots];
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler reads the slot states");

// Deletes the files of directory `path` and the directory, with async-signal-safe calls only (what is
// registered is flat: a writer's shards, index, config and tokenizer files; a job's block files).
void remove_flat_dir(const char* path) noexcept {
  const int dfd = ::open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return;
  alignas(8) char buf[4096];
  for (;;) {
    const long n = ::syscall(SYS_getdents64, dfd, buf, sizeof buf);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      // struct linux_dirent64: u64 ino, s64 off, u16 reclen, u8 type, char name[]
      unsigned short reclen;
      std::memcpy(&reclen, buf + off + 16, sizeof reclen);
      const char* name = buf + off + 19;
      if (!(name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0)))) ::unlinkat(dfd, name, 0);
      off += reclen;
    }
  }
  ::close(dfd);
  ::rmdir(path);
}

}  // namespace

int register_cleanup(const std::filesystem::path& path, CleanupKind kind) {
  const std::string& s = path.native();
  if (s.size() >= kPathBytes) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expect = 0;
    if (g_slots[i].state.compare_exchange_strong(expect, 1)) {
      g_slots[i].kind = kind;
      std::memcpy(g_slots[i].path, s.c_str(), s.size() + 1);
      g_slots[i].state.store(2);
      return i;
    }
  }
  return -1;
}

void unregister_cleanup(int slot) noexcept {
  if (slot >= 0 && slot < kSlots) g_slots[slot].state.store(0);
}

void run_cleanup(CleanupKind kind) noexcept {
  for (Slot& slot : g_slots) {
    if (slot.state.load() != 2 || slot.kind != kind) continue;
    if (kind == CleanupKind::FlatDir) remove_flat_dir(slot.path);
    else ::unlink(slot.path);
  }
}

}  // namespace marlinc
