// Small output helpers shared by the subcommands.
#pragma once
#include <filesystem>
#include <string>

namespace marlinc::cli {

// Writes `contents` to `path` through a temporary sibling and a rename, so a reader never sees a
// half-written file and an interrupted run leaves the old file (or none). Throws marlinc::Error (Io).
void write_file_atomic(const std::filesystem::path& path, const std::string& contents);

// One line on stderr per partial output an interrupted run left beside `out` (stale_temp_outputs).
void note_stale_outputs(const std::filesystem::path& out);

}  // namespace marlinc::cli
