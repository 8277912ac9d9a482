// End-to-end: drive the real `marlinc inspect` binary on shared files, the sample, a synthetic GPTQ
// checkpoint and broken inputs; check output, JSON and exit codes.
#include <sys/wait.h>

#include <array>
#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/writer.h"
#include "tests/checkpoint/st_util.h"
#include "tests/common.h"

using namespace marlinc;
using namespace marlinc::test;
namespace fs = std::filesystem;

namespace {

struct Run {
  int rc;
  std::string out;
};

// Runs marlinc with `args` (already shell-quoted); `redirect` picks which streams are captured.
Run run_marlinc(const std::string& args, const std::string& redirect = "2>&1") {
  const std::string cmd = std::string("'") + MARLINC_CLI_PATH + "' " + args + " " + redirect;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}
std::string q(const fs::path& p) { return "'" + p.string() + "'"; }
bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

// GPTQ v1 4-bit g128 module with k x n.
void add_gptq(std::vector<TensorData>& ts, const std::string& p, int64_t k, int64_t n) {
  const int64_t G = k / 128;
  ts.push_back(filled(p + ".qweight", DType::I32, {k / 8, n}, 1));
  ts.push_back(typed(p + ".qzeros", DType::I32, {G, n / 8}, std::vector<uint32_t>(size_t(G * n / 8), 0x77777777u)));
  ts.push_back(filled(p + ".scales", DType::F16, {G, n}, 2));
  std::vector<int32_t> gi(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) gi[size_t(i)] = int32_t(i / 128);
  ts.push_back(typed(p + ".g_idx", DType::I32, {k}, gi));
}

}  // namespace

TEST_CASE("inspect: every golden and data safetensors file and directory, text and JSON") {
  MARLINC_REQUIRE_SHARED();
  std::vector<fs::path> targets = {fs::path(MARLINC_SOURCE_DIR) / "data" / "sample" / "model"};
  for (const auto& dir : {shared_dir() / "golden", shared_dir() / "data"})
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      if (e.path().extension() == ".safetensors") targets.push_back(e.path());
      if (e.is_directory() && (fs::exists(e.path() / "model.safetensors") ||
                               fs::exists(e.path() / "model.safetensors.index.json")))
        targets.push_back(e.path());
    }
  REQUIRE(targets.size() >= 12);
  for (const auto& t : targets) {
    CAPTURE(t.string());
    auto ck = Checkpoint::open(t);
    Run text = run_marlinc("inspect " + q(t));
    CHECK(text.rc == 0);
    // One line per tensor.
    for (const auto& n : ck.tensor_names()) CHECK(contains(text.out, "\n" + n + " "));
    CHECK(contains(text.out, "format: "));
    CHECK(contains(text.out, "totals: " + std::to_string(ck.tensor_names().size()) + " tensors"));
    Run js = run_marlinc("inspect --json " + q(t), "2>/dev/null");
    REQUIRE(js.rc == 0);
    auto j = nlohmann::json::parse(js.out);
    CHECK(j["tensors"].size() == ck.tensor_names().size());
    uint64_t bytes = 0;
    for (const auto& n : ck.tensor_names()) bytes += ck.at(n).info->nbytes();
    CHECK(j["totals"]["bytes"] == bytes);
    const std::string name = t.filename().string();
    if (name.rfind("marlin24_", 0) == 0) {
      CHECK(j["format"]["name"] == "marlin24");
      CHECK(j["layers"].size() == 1);
      CHECK(j["layers"][0]["marlin_ok"] == true);
    } else if (name.rfind("marlin_", 0) == 0) {
      CHECK(j["format"]["name"] == "marlin");
      CHECK(j["layers"][0]["k"] == std::stoll(ck.files()[0].metadata().at("k")));
    } else {
      CHECK(j["format"]["name"] == "plain");
    }
  }
}

TEST_CASE("inspect: sample model layers are all Marlin-compatible, stories260K's are not, with the rule") {
  Run r = run_marlinc("inspect " + q(fs::path(MARLINC_SOURCE_DIR) / "data" / "sample" / "model"));
  REQUIRE(r.rc == 0);
  CHECK(contains(r.out, "marlin: 14 of 14 layers compatible"));
  MARLINC_REQUIRE_SHARED();
  Run s = run_marlinc("inspect " + q(shared_dir() / "data" / "stories260K"));
  REQUIRE(s.rc == 0);
  CHECK(contains(s.out, "FAIL"));
  CHECK(contains(s.out, "k % 128 == 0 required"));
}

TEST_CASE("inspect: synthetic sharded GPTQ checkpoint") {
  TempDir tmp("cli-gptq");
  std::vector<TensorData> ts;
  ts.push_back(filled("model.embed_tokens.weight", DType::F16, {64, 256}, 9));
  add_gptq(ts, "model.layers.0.self_attn.q_proj", 256, 256);
  add_gptq(ts, "model.layers.0.mlp.down_proj", 384, 192);
  WriterOptions o;
  o.max_shard_bytes = 40000;
  write_checkpoint(tmp.path / "m", ts,
                   {{"config.json", R"({"quantization_config":{"quant_method":"gptq","bits":4,"group_size":128,"sym":true,"desc_act":false,"checkpoint_format":"gptq"}})"}},
                   o);
  REQUIRE(fs::exists(tmp.path / "m" / "model.safetensors.index.json"));
  Run r = run_marlinc("inspect " + q(tmp.path / "m"));
  REQUIRE(r.rc == 0);
  CHECK(contains(r.out, "format: gptq-v1 (config: gptq/gptq)  bits 4  group_size 128  sym true  desc_act false"));
  CHECK(contains(r.out, "model-00001-of-"));
  CHECK(contains(r.out, "2 quantized layers"));
  Run js = run_marlinc("inspect --json " + q(tmp.path / "m"), "2>/dev/null");
  REQUIRE(js.rc == 0);
  auto j = nlohmann::json::parse(js.out);
  REQUIRE(j["layers"].size() == 2);
  CHECK(j["layers"][0]["name"] == "model.layers.0.mlp.down_proj");
  CHECK(j["layers"][0]["k"] == 384);
  CHECK(j["layers"][0]["n"] == 192);
  CHECK(j["layers"][0]["marlin_ok"] == true);  // n % 64 holds (vLLM); IST caveat in the rule
  CHECK(contains(j["layers"][0]["rule"].get<std::string>(), "IST kernel"));
  CHECK(j["layers"][1]["marlin_ok"] == true);
  // (qweight + qzeros + scales + g_idx) bytes * 8 / (k*n) over both layers.
  const double qbytes = (32 * 256 * 4 + 2 * 32 * 4 + 2 * 256 * 2 + 256 * 4) + (48 * 192 * 4 + 3 * 24 * 4 + 3 * 192 * 2 + 384 * 4);
  const double want = 8.0 * qbytes / (256.0 * 256 + 384.0 * 192);
  CHECK(std::fabs(j["totals"]["bits_per_weight"].get<double>() - want) < 1e-9);
  CHECK(j["totals"]["parameters"] == 64 * 256 + 256 * 256 + 384 * 192);
}

TEST_CASE("inspect: errors are one line naming file, tensor and rule, with exit codes 1 / 2") {
  TempDir tmp("cli-err");
  SECTION("bad data -> exit 1") {
    auto b = raw_safetensors(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", {0, 0, 0, 0});
    write_bytes(tmp.path / "bad.safetensors", b);
    Run r = run_marlinc("inspect " + q(tmp.path / "bad.safetensors"), "2>&1 >/dev/null");
    CHECK(r.rc == 1);
    CHECK(r.out.rfind("marlinc: error: " + (tmp.path / "bad.safetensors").string() + ": w: shape [2] x F32", 0) == 0);
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  }
  SECTION("truncated file -> exit 1") {
    write_bytes(tmp.path / "t.safetensors", {0x10, 0, 0});
    Run r = run_marlinc("inspect " + q(tmp.path / "t.safetensors"), "2>&1 >/dev/null");
    CHECK(r.rc == 1);
    CHECK(contains(r.out, "truncated file"));
  }
  SECTION("missing path or argument -> exit 2") {
    CHECK(run_marlinc("inspect " + q(tmp.path / "nothing")).rc == 2);
    CHECK(run_marlinc("inspect").rc == 2);
    CHECK(run_marlinc("inspect --bogus x").rc == 2);
  }
  SECTION("--help lists --json") {
    Run r = run_marlinc("inspect --help");
    CHECK(r.rc == 0);
    CHECK(contains(r.out, "--json"));
  }
}

TEST_CASE("inspect --tp: the rules on one GPU's part of each layer, text and JSON") {
  const std::string sample = q(fs::path(MARLINC_SOURCE_DIR) / "data" / "sample" / "model");
  // The sample: hidden 256, intermediate 768, 4 heads of 64 (also 4 k/v heads), group 128 candidates.
  Run two = run_marlinc("inspect " + sample + " --tp 2");
  REQUIRE(two.rc == 0);
  CHECK(contains(two.out, "marlin: 14 of 14 layers compatible at tensor parallel 2"));
  CHECK(contains(two.out, "tensor parallel 2: part [384 x 256]"));  // down_proj split along k
  Run four = run_marlinc("inspect " + sample + " --tp 4");
  REQUIRE(four.rc == 0);
  // o_proj (k 256 -> 64) and down_proj (768 -> 192) break whole groups of 128 in both blocks.
  CHECK(contains(four.out, "marlin: 10 of 14 layers compatible at tensor parallel 4"));
  CHECK(contains(four.out, "does not divide one rank's k = 192"));
  Run eight = run_marlinc("inspect " + sample + " --tp 8 --json", "2>/dev/null");
  REQUIRE(eight.rc == 0);
  const auto j = nlohmann::json::parse(eight.out);
  CHECK(j["tp"] == 8);
  int ok = 0;
  for (const auto& l : j["candidate_layers"]) {
    ok += l["marlin_ok"].get<bool>();
    if (l["name"] == "model.layers.0.self_attn.k_proj") {
      CHECK(l["marlin_ok"] == true);  // 4 k/v heads on 8 ranks: one replicated head of 64 each
      CHECK(l["tp_part"]["n"] == 64);
      CHECK(l["tp_part"]["replicated"] == true);
      CHECK(l["tp_part"]["split"] == "column");
    }
    if (l["name"] == "model.layers.0.self_attn.q_proj") CHECK(l["marlin_ok"] == false);  // 32 columns
  }
  CHECK(ok == 4);  // k_proj and v_proj of both blocks
  Run bad = run_marlinc("inspect " + sample + " --tp 0");
  CHECK(bad.rc == 2);
  CHECK(contains(bad.out, "--tp"));
}
