// Small output helpers shared by the subcommands.
#pragma once
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/output_lock.h"

namespace marlinc::cli {

// Writes `contents` to `path` through a temporary sibling and a rename, so a reader never sees a
// half-written file and an interrupted run leaves the old file (or none). Throws marlinc::Error (Io).
void write_file_atomic(const std::filesystem::path& path, const std::string& contents);

// JSON text for --json and certificates. Paths and tensor names are bytes, not always UTF-8: invalid
// sequences become U+FFFD instead of failing the command after its work is done.
std::string json_text(const nlohmann::json& j);

// Refuses (BadUsage, naming `option`) an output file path whose directory does not exist or cannot be
// written, or that is a directory: checked before the work, so a run never ends with its main output
// committed and its report lost. `out_dir`, where given, is the output directory the run makes: the path
// may lie in it (the report is written after the output), not be it.
void check_output_file(const std::string& option, const std::filesystem::path& path,
                       const std::filesystem::path& out_dir = {});

// Refuses (BadUsage, naming `option`) an output file path that is one of the checkpoint `input`'s own files
// (`input` a directory or a *.safetensors file; checkpoint/writer.h, is_checkpoint_file) or the file `other`
// (e.g. the calibration text): writing there would destroy an input. Links and hard links count.
void check_not_input_file(const std::string& option, const std::filesystem::path& path,
                          const std::filesystem::path& input, const std::filesystem::path& other = {});

// Takes `out`'s lock for this run (checkpoint/output_lock.h), describing the run as "marlinc COMMAND
// from IN, started TIME" to a run it refuses; a note on stderr when the file system has no locks.
OutputLock lock_output(const std::filesystem::path& out, const std::string& command, const std::filesystem::path& in);

// One line on stderr per partial output an interrupted run left beside `out` (stale_temp_outputs).
void note_stale_outputs(const std::filesystem::path& out);

}  // namespace marlinc::cli
