// Streaming, atomic safetensors checkpoint writer (spec: ../shared/spec/formats.md §7.1, §7.3).
// The caller declares every tensor up front (the plan), so the header, shard split and offsets are fixed
// before any data arrives; tensors then stream in any order and are written with pwrite at their
// offsets, so memory does not grow with model size. Everything goes to a temporary sibling directory
// that commit() renames into place; without commit() nothing is left behind.
#pragma once
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/dtype.h"

namespace marlinc {

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

struct WriterOptions {
  uint64_t max_shard_bytes = 0;      // tensor bytes per shard; 0 = one file
  std::string base_name = "model";   // model.safetensors / model-00001-of-0000N.safetensors
  bool overwrite = false;            // replace an existing non-empty out_dir
  // Testing: leave the replaced output in place as when removing it fails (read-only contents, which a
  // test running as root cannot make), so that leftover() and its note can be checked.
  bool test_keep_replaced = false;
};

// `<out><suffix>` beside the output directory (a trailing slash on `out` is ignored): where what belongs
// to an output but cannot live inside it goes (the GPTQ resume job, the run's lock).
std::filesystem::path beside_output(const std::filesystem::path& out, const std::string& suffix);

// Temporary outputs of earlier writers for out_dir (`<out>.tmp-<pid>-<n>` beside it) whose process no
// longer runs on this machine: what a killed run left behind. Listed, never removed (a writer on
// another machine sharing the directory could own one); the CLI points them out.
std::vector<std::filesystem::path> stale_temp_outputs(const std::filesystem::path& out_dir);

// Deletes the temporary output directories of every live writer, with async-signal-safe calls only:
// for a SIGINT/SIGTERM handler, which then re-raises (the CLI installs one). Committed outputs and
// other files are never touched.
void remove_live_temp_outputs() noexcept;

// Registers a flat temporary directory for remove_live_temp_outputs() while this object lives: what a
// fatal signal must not leave half-written (the GPTQ job's directory while its first block goes in).
class LiveTempDir {
 public:
  explicit LiveTempDir(const std::filesystem::path& dir);
  ~LiveTempDir();
  LiveTempDir(const LiveTempDir&) = delete;
  LiveTempDir& operator=(const LiveTempDir&) = delete;

 private:
  int slot_ = -1;
};

class CheckpointWriter {
 public:
  // Validates the plan (unique non-empty names, non-negative dims) and creates the temporary directory.
  CheckpointWriter(std::filesystem::path out_dir, std::vector<TensorSpec> plan, WriterOptions opts = {});
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  ~CheckpointWriter();  // without commit(): removes the temporary output

  // Writes one planned tensor's bytes (any order; each exactly once; size must equal shape x dtype).
  void write(const std::string& name, std::span<const uint8_t> bytes);
  // A non-tensor file in the output directory (e.g. config.json); rel_name is a plain file name or a
  // relative path without "..".
  void add_file(const std::string& rel_name, const std::string& contents);
  void copy_file(const std::filesystem::path& src, const std::string& rel_name);
  // Checks every tensor was written, writes the index when sharded, fsyncs, renames into place.
  void commit();

  // After commit(): where the output it replaced (--overwrite) still lies because it could not be
  // removed (read-only contents), for the caller to report; empty when it was removed or there was none.
  const std::filesystem::path& leftover() const { return leftover_; }
  const std::filesystem::path& out_dir() const { return out_dir_; }
  const std::filesystem::path& temp_dir() const { return tmp_dir_; }
  // Shard file name of a planned tensor (after construction the split is fixed).
  const std::string& shard_of(const std::string& name) const;
  size_t num_shards() const { return shards_.size(); }

 private:
  struct Planned {
    TensorSpec spec;
    uint64_t nbytes;
    size_t shard;
    uint64_t file_offset;  // absolute offset in the shard file
    bool written = false;
  };
  struct Shard {
    std::string file_name;
    std::vector<size_t> tensors;  // indices into plan_, in header (offset) order
    std::string header;           // full prefix: 8-byte length + padded JSON
    uint64_t data_bytes = 0;
    int fd = -1;
  };
  void abort_output() noexcept;
  std::filesystem::path out_dir_, tmp_dir_, leftover_;
  WriterOptions opts_;
  std::vector<Planned> plan_;
  std::vector<size_t> by_name_;  // indices into plan_ sorted by name
  std::vector<Shard> shards_;
  bool committed_ = false;
  int live_slot_ = -1;  // in the registry remove_live_temp_outputs() reads
  size_t find_planned(const std::string& name) const;
};

// The note for a replaced output the writer could not remove (CheckpointWriter::leftover), or "".
std::string leftover_note(const CheckpointWriter& w);

// Copies the non-tensor files a serving stack needs (tokenizer*, generation_config.json,
// special_tokens_map.json, chat_template*, *.tiktoken, tokenizer.model, added_tokens.json, vocab/merges
// files...) from src_dir into the writer's output. Never copies *.safetensors, the index, config.json,
// quantize_config.json or quant_config.json: the caller writes those. Returns the copied names, sorted.
std::vector<std::string> copy_non_tensor_files(const std::filesystem::path& src_dir, CheckpointWriter& w);

// Refuses (BadUsage, naming `out`) an existing output directory that is the checkpoint directory `input_dir` or a
// folder above it: writing the output there, or replacing it with --overwrite, would destroy the input.
void check_output_not_input(const std::filesystem::path& input_dir, const std::filesystem::path& out);

// Whether `path` is (the same file as, links included) one of the checkpoint directory `dir`'s own files: its
// safetensors files and index, its configs, and the non-tensor files copy_non_tensor_files carries. A report or
// certificate must not be written over one of them.
bool is_checkpoint_file(const std::filesystem::path& dir, const std::filesystem::path& path);

}  // namespace marlinc
