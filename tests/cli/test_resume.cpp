// Resuming an interrupted `marlinc quantize --method gptq` (quantizer/calib/job_file.h), through the
// real binary: a run stopped after a block (MARLINC_TEST_STOP_AFTER_BLOCK, the testing hook) leaves
// no output and a job beside it; the same command then finishes with every output file byte-identical
// to an uninterrupted run and removes the job. A job with other inputs is refused naming what differs,
// --restart discards it, and a corrupt job file is an error naming the file. Plus the block codec:
// round trip, and every truncation and every flipped byte refused.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint/error.h"
#include "checkpoint/sha256.h"
#include "quantizer/calib/job_file.h"
#include "tests/cli/cli_runner.h"
#include "tests/common.h"

namespace fs = std::filesystem;
using marlinc::test::q;
using marlinc::test::Result;
using marlinc::test::run_cli;
using marlinc::test::slurp;
using marlinc::test::TempDir;

namespace {

// The built-in sample has 2 decoder blocks. The first test calibrates on 8 samples the model
// generates (the default); the others, which run more often, on 12 seeded pre-tokenized documents
// without the clip search, which keeps each run to a second or two.
const std::string kSampleOpts = " --method gptq --format marlin --no-clip --samples 8";  // group 128 by default
constexpr uint64_t kSeed = 4242;
constexpr int kDocs = 12, kVocab = 512;

// Writes tokens.jsonl into dir and returns the options that calibrate on 8 of its documents.
std::string fast_opts(const fs::path& dir) {
  std::mt19937_64 rng(kSeed);
  std::ofstream f(dir / "tokens.jsonl");
  for (int d = 0; d < kDocs; ++d) {
    nlohmann::json ids = nlohmann::json::array({1});
    const int len = 16 + int(rng() % 24);
    while (int(ids.size()) < len) ids.push_back(int(2 + rng() % (kVocab - 2)));
    f << ids.dump() << "\n";
  }
  return " --method gptq --format marlin --no-clip --calib-format tokens --min-len 8 --samples 8 --calib " +
         marlinc::test::q(dir / "tokens.jsonl");
}

fs::path sample() { return marlinc::test::sample_model(); }

std::string stop_after(int block) {
  std::string env = "MARLINC_TEST_STOP_AFTER_BLOCK=";
  return env += std::to_string(block);
}

// Every file under dir (relative name -> bytes).
std::map<std::string, std::string> files_of(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = slurp(e.path());
  return out;
}

void require_same_files(const fs::path& a, const fs::path& b) {
  const auto fa = files_of(a), fb = files_of(b);
  REQUIRE(!fa.empty());
  for (const auto& [name, bytes] : fa) {
    INFO(name);
    REQUIRE(fb.count(name) == 1);
    CHECK(fb.at(name) == bytes);
  }
  CHECK(fa.size() == fb.size());
}

// Runs `quantize MODEL OUT opts` stopped after `block`: it must fail, leave no output and a job.
void interrupt(const fs::path& model, const fs::path& out, const std::string& opts, int block, const fs::path& tmp) {
  Result r = run_cli("quantize " + q(model) + " " + q(out) + opts, tmp, stop_after(block));
  INFO(r.out << r.err);
  REQUIRE(r.rc != 0);
  CHECK(r.err.find("run the same command again to resume") != std::string::npos);
  CHECK(!fs::exists(out));
  REQUIRE(fs::exists(marlinc::calib::job_dir_for(out) / "job.json"));
}

}  // namespace

TEST_CASE("gptq resume: an interrupted run finishes byte-identical to an uninterrupted one", "[cli][gptq][resume]") {
  TempDir td("resume");
  const fs::path out = td.path / "out", job = marlinc::calib::job_dir_for(out);
  CHECK(job == td.path / "out.marlinc-job");
  interrupt(sample(), out, kSampleOpts, 1, td.path);
  CHECK(fs::exists(job / "block-00000.bin"));
  CHECK(!fs::exists(job / "block-00001.bin"));

  Result r = run_cli("quantize " + q(sample()) + " " + q(out) + kSampleOpts + " --json " + q(td.path / "r.json"), td.path);
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("resuming: block 1 of 2 finished") != std::string::npos);
  CHECK(r.out.find("block 1/2 replayed") != std::string::npos);
  CHECK(r.out.find("resumed    1 block from an interrupted run") != std::string::npos);
  CHECK(!fs::exists(job));
  // The report is whole: the resumed block's layers come from the job.
  const auto rep = nlohmann::json::parse(slurp(td.path / "r.json"));
  CHECK(rep.at("resumed_blocks") == 1);
  CHECK(rep.at("layers").size() == 14);
  CHECK(rep.at("layers")[0].at("name") == "model.layers.0.self_attn.q_proj");

  Result fresh = run_cli("quantize " + q(sample()) + " " + q(td.path / "ref") + kSampleOpts, td.path);
  REQUIRE(fresh.rc == 0);
  CHECK(fresh.out.find("resuming") == std::string::npos);
  require_same_files(td.path / "ref", out);
}

TEST_CASE("gptq resume: Phi-3's fused modules are split back into their parts when a block is replayed",
          "[cli][gptq][resume]") {
  // The phi3 fixture (tests/data/arch-golden): qkv_proj and gate_up_proj are one module each in the job and the
  // output; replaying block 1 must give block 2 the inputs an uninterrupted run gave it.
  TempDir td("resume-phi3");
  const fs::path model = fs::path(MARLINC_SOURCE_DIR) / "tests" / "data" / "arch-golden" / "phi3";
  {
    std::ofstream f(td.path / "ids.jsonl");  // 10 documents of 30-48 ids below the fixture's vocabulary of 128
    for (int d = 0; d < 10; ++d) {
      f << "[1";
      for (int t = 1; t < 30 + 2 * d; ++t) f << "," << (d * 37 + t * 11) % 128;
      f << "]\n";
    }
  }
  for (const char* order : {"natural", "dynamic"}) {
    INFO("order " << order);
    const std::string opts = " --method gptq --format gptq --group 32 --calib-format tokens --min-len 8 --calib " +
                             q(td.path / "ids.jsonl") + " --order " + order;
    const fs::path out = td.path / (std::string("out-") + order), ref = td.path / (std::string("ref-") + order);
    interrupt(model, out, opts, 1, td.path);
    Result r = run_cli("quantize " + q(model) + " " + q(out) + opts, td.path);
    INFO(r.out << r.err);
    REQUIRE(r.rc == 0);
    CHECK(r.out.find("block 1/2 replayed") != std::string::npos);
    REQUIRE(run_cli("quantize " + q(model) + " " + q(ref) + opts, td.path).rc == 0);
    require_same_files(ref, out);
  }
}

TEST_CASE("gptq resume: an MoE model's experts, some without calibration tokens, replay byte-identical",
          "[cli][gptq][resume][moe]") {
  // The qwen3_moe fixture (8 experts, top-2) on one 3-token sample: most experts get no token, so GPTQ runs on
  // them with H = I and the config names them. Replaying block 1 must give block 2 its inputs (through the
  // router) and the same uncalibrated list.
  TempDir td("resume-moe");
  const fs::path model = fs::path(MARLINC_SOURCE_DIR) / "tests" / "data" / "arch-golden" / "qwen3_moe";
  std::ofstream(td.path / "ids.jsonl") << "[5,9,17]\n";
  const std::string opts = " --method gptq --format gptq --group 32 --calib-format tokens --min-len 2 --calib " +
                           q(td.path / "ids.jsonl");
  const fs::path out = td.path / "out", ref = td.path / "ref";
  interrupt(model, out, opts, 1, td.path);
  Result r = run_cli("quantize " + q(model) + " " + q(out) + opts, td.path);
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("block 1/2 replayed") != std::string::npos);
  CHECK(r.out.find("expert linears had no calibration token routed to them") != std::string::npos);  // replayed too
  Result f = run_cli("quantize " + q(model) + " " + q(ref) + opts, td.path);
  REQUIRE(f.rc == 0);
  CHECK(f.out.find("expert linears had no calibration token routed to them") != std::string::npos);
  require_same_files(ref, out);
  const nlohmann::json cfg = nlohmann::json::parse(slurp(ref / "config.json"));
  const nlohmann::json& unc = cfg["quantization_config"]["marlinc"]["uncalibrated_experts"];
  REQUIRE(unc.is_array());
  // 3 tokens reach at most 6 of 8 experts a block: at least 2 experts x 2 blocks, each listed once.
  CHECK(unc.size() >= 4);
  for (const auto& n : unc) {
    const std::string e = n.get<std::string>();
    CHECK(e.find(".mlp.experts.") != std::string::npos);
    CHECK(e.substr(e.rfind('.') + 1).find_first_not_of("0123456789") == std::string::npos);  // ends at the index
  }
  CHECK(f.out.find(std::to_string(unc.size()) + " experts had no calibration token routed to them") != std::string::npos);
}

TEST_CASE("gptq resume: stories260K with text calibration and --true-sequential, interrupted twice", "[cli][gptq][resume]") {
  MARLINC_REQUIRE_SHARED();
  TempDir td("resume-s260");
  const fs::path model = marlinc::test::shared_dir() / "data" / "stories260K";
  const std::string opts = " --method gptq --format gptq --group 32 --true-sequential --samples 8 --max-len 512 --calib " +
                           q(marlinc::test::shared_dir() / "data" / "calib-tiny.utf8");
  const fs::path out = td.path / "out";
  interrupt(model, out, opts, 2, td.path);
  interrupt(model, out, opts, 4, td.path);  // resumes blocks 1..2, stops again after 4
  CHECK(fs::exists(marlinc::calib::job_dir_for(out) / "block-00003.bin"));
  // A trailing slash names the same output, so the same job.
  Result r = run_cli("quantize " + q(model) + " " + q(out.string() + "/") + opts, td.path);
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("resuming: blocks 1..4 of 5 finished") != std::string::npos);
  CHECK(!fs::exists(marlinc::calib::job_dir_for(out)));
  Result fresh = run_cli("quantize " + q(model) + " " + q(td.path / "ref") + opts, td.path);
  REQUIRE(fresh.rc == 0);
  require_same_files(td.path / "ref", out);
}

TEST_CASE("gptq resume: a job with other inputs is refused naming what differs, --restart starts fresh",
          "[cli][gptq][resume]") {
  TempDir td("resume-mismatch");
  const fs::path out = td.path / "out", job = marlinc::calib::job_dir_for(out);
  const std::string opts = fast_opts(td.path);
  interrupt(sample(), out, opts, 1, td.path);
  const std::string base = "quantize " + q(sample()) + " " + q(out) + opts;

  Result r = run_cli(base + " --group 64", td.path);
  INFO(r.out << r.err);
  CHECK(r.rc == 2);
  CHECK(r.err.find(job.string()) != std::string::npos);
  CHECK(r.err.find("option group: job 128, now 64") != std::string::npos);
  CHECK(r.err.find("--restart") != std::string::npos);
  CHECK(fs::exists(job / "job.json"));  // refused, not touched
  CHECK(!fs::exists(out));

  r = run_cli(base + " --seed 5", td.path);
  CHECK(r.rc == 2);
  CHECK(r.err.find("calibration seed: job 0, now 5") != std::string::npos);

  r = run_cli(base + " --group 64 --restart", td.path);
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("--restart: discarded the unfinished job") != std::string::npos);
  CHECK(r.out.find("resuming") == std::string::npos);
  CHECK(!fs::exists(job));
  Result fresh = run_cli("quantize " + q(sample()) + " " + q(td.path / "ref") + opts + " --group 64", td.path);
  REQUIRE(fresh.rc == 0);
  require_same_files(td.path / "ref", out);
}

TEST_CASE("gptq resume: weights edited in place after the interruption refuse the job", "[cli][gptq][resume]") {
  TempDir td("resume-edited");
  fs::copy(sample(), td.path / "model", fs::copy_options::recursive);
  const fs::path model = td.path / "model", out = td.path / "out";
  const std::string opts = fast_opts(td.path);
  interrupt(model, out, opts, 1, td.path);
  // Same length, same header: only the data and the modification time change.
  const fs::path st = model / "model.safetensors";
  std::string bytes = slurp(st);
  bytes[bytes.size() - 1] ^= 0x40;
  const auto before = fs::last_write_time(st);
  std::ofstream(st, std::ios::binary | std::ios::trunc) << bytes;
  fs::last_write_time(st, before + std::chrono::seconds(1));
  Result r = run_cli("quantize " + q(model) + " " + q(out) + opts, td.path);
  INFO(r.out << r.err);
  CHECK(r.rc == 2);
  CHECK(r.err.find("model.safetensors") != std::string::npos);
  CHECK(r.err.find("mtime") != std::string::npos);
  CHECK(!fs::exists(out));
}

TEST_CASE("gptq resume: a corrupt job file is an error naming the file", "[cli][gptq][resume]") {
  TempDir td("resume-corrupt");
  const fs::path out = td.path / "out", job = marlinc::calib::job_dir_for(out);
  const std::string opts = fast_opts(td.path);
  interrupt(sample(), out, opts, 1, td.path);
  const std::string cmd = "quantize " + q(sample()) + " " + q(out) + opts;
  const fs::path block = job / "block-00000.bin";
  const std::string good = slurp(block);

  std::string bad = good;
  bad[bad.size() / 2] = char(bad[bad.size() / 2] ^ 0x10);
  std::ofstream(block, std::ios::binary | std::ios::trunc) << bad;
  Result r = run_cli(cmd, td.path);
  INFO(r.out << r.err);
  CHECK(r.rc == 1);
  CHECK(r.err.find(block.string() + ": checksum mismatch") != std::string::npos);
  CHECK(r.err.find("run the same command again") == std::string::npos);  // it would not help
  CHECK(!fs::exists(out));

  std::ofstream(block, std::ios::binary | std::ios::trunc) << good.substr(0, 40);
  r = run_cli(cmd, td.path);
  CHECK(r.rc == 1);
  CHECK(r.err.find(block.string()) != std::string::npos);

  fs::remove(block);
  r = run_cli(cmd, td.path);
  CHECK(r.rc == 1);
  CHECK(r.err.find(block.string() + ": listed in job.json but missing") != std::string::npos);

  std::ofstream(job / "job.json", std::ios::trunc) << "{\"marlinc_job\": 1, \"marlinc_job\": 1}";
  r = run_cli(cmd, td.path);
  CHECK(r.rc == 1);
  CHECK(r.err.find((job / "job.json").string()) != std::string::npos);
  CHECK(r.err.find("duplicate") != std::string::npos);

  // An edited input no longer matches the recorded fingerprint: corrupt, not a "different job".
  interrupt(sample(), td.path / "o2", opts, 1, td.path);
  const fs::path j2 = marlinc::calib::job_dir_for(td.path / "o2") / "job.json";
  auto jj = nlohmann::json::parse(slurp(j2));
  jj["inputs"]["options"]["group"] = 64;
  std::ofstream(j2, std::ios::trunc) << jj.dump();
  r = run_cli("quantize " + q(sample()) + " " + q(td.path / "o2") + opts, td.path);
  CHECK(r.rc == 1);
  CHECK(r.err.find("does not match the \"inputs\"") != std::string::npos);
}

TEST_CASE("job block codec: round trip, every truncation and every flipped byte is refused", "[resume]") {
  using marlinc::QuantizedLinear;
  using marlinc::calib::FinishedLayer;
  std::mt19937_64 rng(kSeed);
  auto layer = [&](const std::string& name, int64_t n, int64_t k, int bits, int group, bool sparse, bool gidx) {
    FinishedLayer f;
    QuantizedLinear& l = f.q;
    l.name = name; l.n = n; l.k = k; l.bits = bits; l.group_size = group;
    l.codes.resize(size_t(n * k));
    for (auto& c : l.codes) c = uint8_t(rng() % (1u << bits));
    l.scales.resize(size_t(l.groups() * n));
    for (auto& s : l.scales) s = uint16_t(0x2000 + rng() % 0x1000);
    if (gidx) {
      l.g_idx.resize(size_t(k));
      for (auto& g : l.g_idx) g = int32_t(rng() % uint64_t(l.groups()));
    }
    if (sparse) {
      l.mask.assign(size_t(n * k), 0);
      for (int64_t c = 0; c < n; ++c)
        for (int64_t g = 0; g < k / 4; ++g) {
          const int64_t a = int64_t(rng() % 4), b = (a + 1 + int64_t(rng() % 3)) % 4;
          l.mask[size_t((4 * g + a) * n + c)] = l.mask[size_t((4 * g + b) * n + c)] = 1;
        }
    }
    f.report = {name, n, k, 0.125, 0.5, 3.25, 0.01};
    return f;
  };
  // Odd n * k (the last 4-bit byte is half used), 8-bit, act-order g_idx, 2:4 mask, per-channel.
  const std::vector<FinishedLayer> layers = {layer("model.layers.3.self_attn.q_proj", 7, 64, 4, 32, false, true),
                                             layer("model.layers.3.mlp.down_proj", 16, 32, 8, -1, true, false),
                                             layer("model.layers.3.mlp.up_proj", 5, 16, 4, 16, true, false)};
  const std::string fp(64, 'a');
  const std::string bytes = marlinc::calib::encode_block(fp, 3, layers);
  const auto back = marlinc::calib::decode_block(bytes, fp, 3, "blk");
  REQUIRE(back.size() == layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const QuantizedLinear &a = layers[i].q, &b = back[i].q;
    CHECK(a.name == b.name);
    CHECK((a.n == b.n && a.k == b.k && a.bits == b.bits && a.group_size == b.group_size && a.sym == b.sym));
    CHECK(a.codes == b.codes);
    CHECK(a.scales == b.scales);
    CHECK(a.g_idx == b.g_idx);
    CHECK(a.mask == b.mask);
    CHECK(back[i].report.name == a.name);
    CHECK((back[i].report.loss == 3.25 && back[i].report.damp == 0.01 && back[i].report.seconds == 0.5));
  }
  auto refused = [&](const std::string& b, const std::string& want) {
    try {
      marlinc::calib::decode_block(b, fp, 3, "blk");
    } catch (const marlinc::Error& e) {
      return e.kind() == marlinc::ErrorKind::BadData && std::string(e.what()).rfind("blk: ", 0) == 0 &&
             std::string(e.what()).find(want) != std::string::npos;
    }
    return false;
  };
  CHECK(!refused(bytes, ""));
  size_t bad_cut = 0, bad_flip = 0;
  for (size_t n = 0; n < bytes.size(); ++n) bad_cut += !refused(bytes.substr(0, n), "");
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string b = bytes;
    b[i] = char(b[i] ^ 0x01);
    bad_flip += !refused(b, "checksum mismatch") && i < bytes.size() - 32;
  }
  CHECK(bad_cut == 0);
  CHECK(bad_flip == 0);
  // Past the checksum (a forged trailer), the parser's own bounds checks: every cut of the body is
  // refused, and a flipped byte either decodes (a code is still a code) or is refused as BadData.
  const std::string body = bytes.substr(0, bytes.size() - 32);
  auto forged = [](const std::string& b) {
    marlinc::Sha256 h;
    h.update(b);
    const auto d = h.digest();
    return b + std::string(reinterpret_cast<const char*>(d.data()), d.size());
  };
  size_t cut_accepted = 0, flip_other_error = 0;
  for (size_t n = 0; n < body.size(); ++n) cut_accepted += !refused(forged(body.substr(0, n)), "");
  for (size_t i = 0; i < body.size(); ++i)
    for (int bit : {0, 7}) {
      std::string b = body;
      b[i] = char(b[i] ^ (1 << bit));
      try {
        marlinc::calib::decode_block(forged(b), fp, 3, "blk");
      } catch (const marlinc::Error& e) {
        flip_other_error += e.kind() != marlinc::ErrorKind::BadData;
      }
    }
  CHECK(cut_accepted == 0);
  CHECK(flip_other_error == 0);
  CHECK(refused(marlinc::calib::encode_block(std::string(64, 'b'), 3, layers), "another job"));
  CHECK(refused(marlinc::calib::encode_block(fp, 4, layers), "holds block 4, expected 3"));
}
