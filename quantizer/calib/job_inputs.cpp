// The fingerprint inputs of a GPTQ job (job_file.h): the model, the options and the calibration
// data. Apart from the readers and writers in job_file.cpp so those build alone (the fuzzer).
#include <charconv>
#include <fstream>

#include "checkpoint/error.h"
#include "checkpoint/sha256.h"
#include "quantizer/calib/job_file.h"
#include "quantizer/calib/job_file_internal.h"
#include "quantizer/calib/llama.h"

namespace marlinc::calib {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace job_detail;

namespace {

// Shortest text that reads back as the same float, so job.json shows "0.01", not 0.009999999776.
std::string float_text(float v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace

JobInputs job_inputs(const Checkpoint& ck, const QuantizeOptions& qo, const GptqOptions& g, bool true_sequential,
                     bool forward_on_cpu, ExpertCalibration ec, const CalibSet& cs) {
  JobInputs in;
  json model = json::object();
  const fs::path cfg = ck.dir() / "config.json";
  if (fs::exists(cfg)) {
    const std::string bytes = read_all(cfg, kMaxJobJson, "config.json");
    model["config.json"] = {{"size", bytes.size()}, {"sha256", sha256_hex({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()})}};
  }
  json files = json::object();
  for (const SafetensorsFile& f : ck.files()) {
    // The header only: it fixes every tensor's name, dtype, shape and offsets (see the file comment).
    std::ifstream in_f(f.path(), std::ios::binary);
    std::string header(size_t(f.data_start()), '\0');
    if (!in_f || !in_f.read(header.data(), std::streamsize(header.size())))
      fail(ErrorKind::Io, f.path().string() + ": cannot read the safetensors header");
    // The data is not hashed (minutes on a large model at every start); a file edited in place shows
    // in its modification time, which copies that keep it (cp -p, mv) keep with the same bytes.
    std::error_code err;
    const auto mtime = fs::last_write_time(f.path(), err);
    if (err) fail(ErrorKind::Io, f.path().string() + ": cannot read the modification time: " + err.message());
    files[f.path().filename().string()] = {
        {"size", f.file_size()},
        {"header_sha256", sha256_hex({reinterpret_cast<const uint8_t*>(header.data()), header.size()})},
        {"mtime", std::to_string(int64_t(mtime.time_since_epoch().count()))}};
  }
  model["safetensors"] = files;
  in.json["model"] = model;
  in.json["options"] = {{"format", target_name(qo.to)},
                        {"bits", g.bits},
                        {"group", g.group_size},
                        {"clip", g.clip == GptqOptions::Marlin ? "marlin" : "none"},
                        {"damp", float_text(g.damp)},
                        {"auto_damp", g.auto_damp},
                        {"lazy_block", g.block},
                        {"order", order_name(g.order)},
                        {"sparsity", g.sparse24 ? "2:4" : "none"},
                        {"true_sequential", true_sequential},
                        {"device", g.device == GptqOptions::Device::Cuda ? "cuda" : "cpu"},
                        {"skip", qo.skip},
                        {"include_lm_head", qo.include_lm_head},
                        {"tp", qo.tp},
                        // Scales rounded to the stored type (bf16 for bf16 models): jobs from before
                        // that grid hold fp16-grid layers and must not be replayed into a new output.
                        {"scale_grid", "stored-type"},
                        {"shard_size", qo.max_shard_bytes},
                        {"marlinc", MARLINC_VERSION}};
  // Only when set, so that jobs of the default runs keep their fingerprint.
  if (forward_on_cpu) in.json["options"]["forward_device"] = "cpu";
  if (ec == ExpertCalibration::All) in.json["options"]["expert_calibration"] = "all";
  // Each sample as its length then its ids, so [[1, 2], [3]] and [[1], [2, 3]] hash differently.
  Sha256 ids;
  for (const auto& s : cs.samples) {
    Writer w;
    w.u64(s.size());
    for (int32_t t : s) w.i32(t);
    ids.update(w.s);
  }
  json calib = cs.to_json();
  calib["ids_sha256"] = ids.hex();
  in.json["calibration"] = calib;
  return in;
}

}  // namespace marlinc::calib
