// Small output helpers shared by the subcommands.
#pragma once
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace marlinc::cli {

// Writes `contents` to `path` through a temporary sibling and a rename, so a reader never sees a
// half-written file and an interrupted run leaves the old file (or none). Throws marlinc::Error (Io).
void write_file_atomic(const std::filesystem::path& path, const std::string& contents);

// JSON text for --json and certificates. Paths and tensor names are bytes, not always UTF-8: invalid
// sequences become U+FFFD instead of failing the command after its work is done.
std::string json_text(const nlohmann::json& j);

// Refuses (BadUsage, naming `option`) an output file path whose directory does not exist or cannot be
// written, or that is a directory: checked before the work, so a run never ends with its main output
// committed and its report lost.
void check_output_file(const std::string& option, const std::filesystem::path& path);

// One line on stderr per partial output an interrupted run left beside `out` (stale_temp_outputs).
void note_stale_outputs(const std::filesystem::path& out);

}  // namespace marlinc::cli
