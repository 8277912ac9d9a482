// What a fatal-signal handler removes before the process dies (the CLI installs one): the temporary
// outputs of live writers and the lock files of live runs. Paths sit in fixed storage and are removed
// with async-signal-safe calls only, so the handler allocates nothing and takes no lock.
#pragma once
#include <filesystem>

namespace marlinc {

enum class CleanupKind {
  FlatDir,  // a directory of plain files (a writer's output, a resume job being created)
  File,     // one file (a lock)
};

// A slot for `path`, or -1 when it cannot be kept (longer than the fixed storage, or every slot taken):
// such a path is then left behind by a signal (the next run reports or reuses it).
int register_cleanup(const std::filesystem::path& path, CleanupKind kind);
void unregister_cleanup(int slot) noexcept;
// Removes every registered path of `kind`: a FlatDir's files, then the directory; a File itself.
void run_cleanup(CleanupKind kind) noexcept;

}  // namespace marlinc
