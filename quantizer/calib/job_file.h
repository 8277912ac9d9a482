// The resume job of `marlinc quantize --method gptq`: the blocks an interrupted run finished, kept in
// a directory beside the output (`<OUT_DIR>.marlinc-job/`; the output itself only appears at the
// writer's final rename, so nothing can live inside it). A resumed run replays the saved blocks and
// goes on from the first missing one, giving the same output bytes as an uninterrupted run.
//
// Layout:
//   job.json          {"marlinc_job": 1, "fingerprint": HEX, "inputs": {...}, "layers": L, "blocks": [0, 1, ...]}
//   block-00000.bin   one per finished decoder block (format below)
// Every file is written to a temporary name, fsynced and renamed, and a block file lands before the
// job.json that lists it, so a kill at any moment leaves a consistent job (at worst a block file
// that job.json does not list yet, which is recomputed and replaced).
//
// The fingerprint is the SHA-256 of `inputs` (JSON, keys sorted): the model (config.json bytes; each
// safetensors file's name, size and header bytes — not the multi-GB tensor payload, which would take
// minutes to hash: the header pins every tensor's name, dtype, shape and offsets), every option that
// changes the output bytes (including --device: the CUDA and CPU back ends round differently; not the
// thread count, which does not change them), the marlinc version, and the calibration record plus
// the SHA-256 of the token ids actually used, in order (so generated calibration is covered too).
// `inputs` is kept readable so that a refused job can say what differs.
//
// Block file (little-endian; every count is checked against the bytes left before anything is
// allocated, and the SHA-256 trailer is checked before any field is believed):
//   magic "MLCJOBB1" | fingerprint 64 hex chars | u64 block | u32 layers | layer... | sha256[32] of all before
//   layer: u32 name length, name | i64 n, k | u8 bits | i32 group | u8 sym | u8 scale type (0 f16, 1 bf16)
//          | u64 count, codes (4-bit: two per byte, low nibble first; 8-bit: one per byte)
//          | u64 count, scales u16... | u64 count, zeros u8... | u64 count, g_idx i32...
//          | u64 count, mask bits (8 per byte, LSB first) | f64 rel_weight_err, seconds, loss, damp
// The QuantizedLinear is saved as gptq_quantize returned it (before the packer re-encodes scales),
// so replaying it through write_quantized repeats exactly what the uninterrupted run did.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "packer/quantized_linear.h"
#include "quantizer/calib/calib_data.h"
#include "quantizer/gptq.h"
#include "quantizer/quantize_checkpoint.h"

namespace marlinc::calib {

inline constexpr int kJobFormatVersion = 1;

// `<out>.marlinc-job` beside the output directory (a trailing slash on `out` is ignored).
std::filesystem::path job_dir_for(const std::filesystem::path& out);

// What a job's results were computed from. Sections: "model", "options", "calibration".
struct JobInputs {
  nlohmann::json json = nlohmann::json::object();
  std::string fingerprint() const;  // SHA-256 hex of json.dump()
};
enum class ExpertCalibration;  // llama.h

// `gptq` is the effective per-layer options (bits, group and 2:4 already filled in by the runner).
JobInputs job_inputs(const Checkpoint& ck, const QuantizeOptions& qo, const GptqOptions& gptq, bool true_sequential,
                     bool forward_on_cpu, ExpertCalibration ec, const CalibSet& cs);
// One line per difference, e.g. "options group: job 128, now 64" (long values shortened).
std::vector<std::string> describe_differences(const nlohmann::json& job, const nlohmann::json& now);

// One finished linear: its result as gptq_quantize returned it, and its row of the report.
struct FinishedLayer {
  QuantizedLinear q;
  QuantizedLayerReport report;
};

// Removes a job directory; false when there was none. Throws Io when it cannot be removed.
bool discard_job(const std::filesystem::path& dir);

class GptqJob {
 public:
  // No directory: a fresh job, nothing on disk until the first save_block. A directory: reads and
  // checks job.json (BadData naming the file when it is unreadable or malformed) and compares its
  // fingerprint with `now`: a different one is BadUsage naming the directory and each difference,
  // with the way out (delete it or --restart). `layers` is the model's decoder block count.
  static GptqJob open(const std::filesystem::path& dir, const JobInputs& now, int64_t layers);

  const std::filesystem::path& dir() const { return dir_; }
  bool on_disk() const { return on_disk_; }
  // Blocks 0 .. finished_blocks()-1 are saved.
  int64_t finished_blocks() const { return finished_; }
  std::filesystem::path block_file(int64_t b) const;

  // A saved block's layers in the order they were produced. Throws BadData naming the file when its
  // checksum, magic, fingerprint, block number or any field is wrong.
  std::vector<FinishedLayer> load_block(int64_t b) const;
  // Saves block b (must be finished_blocks()) and then lists it in job.json; creates the directory
  // on the first call. Throws Io naming the file.
  void save_block(int64_t b, const std::vector<FinishedLayer>& layers);
  // After the output is committed. A failure to remove is reported, not thrown: the output is done.
  bool remove(std::string* why = nullptr) noexcept;

 private:
  void write_job_json(const std::filesystem::path& dir) const;
  std::filesystem::path dir_;
  nlohmann::json inputs_;
  std::string fingerprint_;
  int64_t layers_ = 0, finished_ = 0;
  bool on_disk_ = false;
};

// The block file codec, exposed for tests: encode gives the whole file (trailer included); decode
// checks everything and throws BadData prefixed with `label`.
std::string encode_block(const std::string& fingerprint, int64_t block, const std::vector<FinishedLayer>& layers);
std::vector<FinishedLayer> decode_block(const std::string& bytes, const std::string& fingerprint, int64_t block,
                                        const std::string& label);

}  // namespace marlinc::calib
