// End-to-end: the real `marlinc convert` binary on synthetic sharded GPTQ checkpoints (bias, embeddings,
// norms, lm_head, config and tokenizer files): round trips are byte-exact, --json is machine-readable,
// incompatible shapes exit 1 naming the tensor and rule with no output left, usage errors exit 2.
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/format.h"
#include "tests/cli/cli_runner.h"
#include "tests/common.h"
#include "tests/formats/synth_checkpoint.h"

namespace fs = std::filesystem;
using namespace marlinc;
using marlinc::test::TempDir;
using marlinc::test::Result;
using marlinc::test::q;
using marlinc::test::run_cli;

namespace {

constexpr uint64_t kShard = 200'000;  // several shards for the 2-block synthetic model

void require_same_tensors(const fs::path& a_dir, const fs::path& b_dir) {
  Checkpoint a = Checkpoint::open(a_dir), b = Checkpoint::open(b_dir);
  REQUIRE(a.tensor_names() == b.tensor_names());
  for (const auto& n : a.tensor_names()) {
    INFO(n);
    REQUIRE(a.at(n).info->dtype == b.at(n).info->dtype);
    REQUIRE(a.at(n).info->shape == b.at(n).info->shape);
    auto da = a.data(n), db = b.data(n);
    REQUIRE(da.size() == db.size());
    REQUIRE(std::memcmp(da.data(), db.data(), da.size()) == 0);
  }
}

}  // namespace

TEST_CASE("marlinc convert: GPTQ v1 -> marlin -> gptq is byte-exact through the CLI", "[cli][convert]") {
  TempDir td("cli-conv");
  synth::Options o;
  o.shard_bytes = kShard;
  o.seed = 101;
  synth::write_checkpoint(td.path / "src", o);
  Result r = run_cli("convert " + q(td.path / "src") + " " + q(td.path / "m") + " --to marlin --shard-size 150KB", td.path);
  INFO(r.out << r.err);
  REQUIRE(r.rc == 0);
  // One line per layer with its shape and the conversion, and a summary.
  REQUIRE(r.out.find("model.layers.1.mlp.down_proj") != std::string::npos);
  REQUIRE(r.out.find("[512 x 256]") != std::string::npos);
  REQUIRE(r.out.find("gptq-v1  -> marlin") != std::string::npos);
  REQUIRE(r.out.find("summary: 14 modules converted") != std::string::npos);
  REQUIRE(fs::exists(td.path / "m" / "model.safetensors.index.json"));
  REQUIRE(fs::exists(td.path / "m" / "tokenizer_config.json"));
  REQUIRE(detect_format(Checkpoint::open(td.path / "m")).format == Format::Marlin);

  Result b = run_cli("convert " + q(td.path / "m") + " " + q(td.path / "back") + " --to gptq --json", td.path);
  INFO(b.out << b.err);
  REQUIRE(b.rc == 0);
  nlohmann::json j = nlohmann::json::parse(b.out);
  REQUIRE(j.at("ok") == true);
  REQUIRE(j.at("source_format") == "marlin");
  REQUIRE(j.at("modules").size() == 14);
  REQUIRE(j.at("modules")[0].at("to") == "gptq");
  REQUIRE(j.at("passthrough_tensors").get<int>() == 3 + 2 + 4);  // embed, norm, lm_head, 2 layernorms, 4 biases
  require_same_tensors(td.path / "src", td.path / "back");

  // The output exists now: without --overwrite the CLI refuses (usage error), with it it replaces.
  Result again = run_cli("convert " + q(td.path / "m") + " " + q(td.path / "back") + " --to gptq", td.path);
  REQUIRE(again.rc == 2);
  REQUIRE(again.err.find("back") != std::string::npos);
  Result over = run_cli("convert " + q(td.path / "m") + " " + q(td.path / "back") + " --to gptq_v2 --overwrite", td.path);
  REQUIRE(over.rc == 0);
  REQUIRE(Checkpoint::open(td.path / "back").quantize_config().at("checkpoint_format") == "gptq_v2");
}

TEST_CASE("marlinc convert: incompatible shapes exit 1 with the rule and leave no output", "[cli][convert]") {
  TempDir td("cli-inc");
  synth::Options o;
  o.layers = synth::default_layers();
  o.layers.push_back({"model.layers.0.mlp.odd_proj", 136, 72, false});
  o.group = -1;
  o.seed = 103;
  synth::write_checkpoint(td.path / "src", o);
  Result r = run_cli("convert " + q(td.path / "src") + " " + q(td.path / "m") + " --to marlin", td.path);
  INFO(r.out << r.err);
  REQUIRE(r.rc == 1);
  REQUIRE(r.err.find("model.layers.0.mlp.odd_proj") != std::string::npos);
  REQUIRE(r.err.find("k % 128") != std::string::npos);
  REQUIRE(r.err.find("--keep-incompatible") != std::string::npos);
  REQUIRE_FALSE(fs::exists(td.path / "m"));

  Result k = run_cli("convert " + q(td.path / "src") + " " + q(td.path / "m") + " --to marlin --keep-incompatible", td.path);
  INFO(k.out << k.err);
  REQUIRE(k.rc == 0);
  REQUIRE(k.out.find("kept dequantized: model.layers.0.mlp.odd_proj") != std::string::npos);
  REQUIRE(Checkpoint::open(td.path / "m").contains("model.layers.0.mlp.odd_proj.weight"));

  Result bad = run_cli("convert " + q(td.path / "src") + " " + q(td.path / "x") + " --to exl2", td.path);
  REQUIRE(bad.rc == 2);
  REQUIRE(bad.err.find("exl2") != std::string::npos);
}

TEST_CASE("marlinc convert: dense marlin -> marlin24 is refused unless the codes are 2:4", "[cli][convert]") {
  TempDir td("cli-24");
  synth::Options o;
  o.layers = {{"model.layers.0.mlp.up_proj", 256, 256, false}};
  o.seed = 105;
  synth::write_checkpoint(td.path / "src", o);
  Result r = run_cli("convert " + q(td.path / "src") + " " + q(td.path / "s") + " --to marlin24", td.path);
  INFO(r.out << r.err);
  REQUIRE(r.rc == 1);
  REQUIRE(r.err.find("model.layers.0.mlp.up_proj") != std::string::npos);
  REQUIRE(r.err.find("2 of every 4") != std::string::npos);
  REQUIRE_FALSE(fs::exists(td.path / "s"));
  // --json: the stop is a report on stdout too.
  Result j = run_cli("convert " + q(td.path / "src") + " " + q(td.path / "s") + " --to marlin24 --json", td.path);
  INFO(j.out << j.err);
  REQUIRE(j.rc == 1);
  const nlohmann::json rep = nlohmann::json::parse(j.out);
  CHECK(rep.at("ok") == false);
  CHECK(rep.at("error").get<std::string>().find("2 of every 4") != std::string::npos);
  REQUIRE_FALSE(fs::exists(td.path / "s"));
}

TEST_CASE("marlinc convert --tp: a layer whose part on one GPU breaks the target's rules is incompatible", "[cli][convert]") {
  TempDir td("cli-tp");
  synth::Options o;  // hidden 256, group 128: k_proj/v_proj n = 64, o_proj k = 256, down_proj k = 512
  o.seed = 107;
  synth::write_checkpoint(td.path / "src", o);
  // 2 ranks: k_proj/v_proj keep 32 columns each, below Marlin's 64; GPTQ packs 8 and takes them.
  Result m = run_cli("convert " + q(td.path / "src") + " " + q(td.path / "m") + " --to marlin --tp 2", td.path);
  INFO(m.out << m.err);
  REQUIRE(m.rc == 1);
  CHECK(m.err.find("4 module(s) cannot be written as marlin") != std::string::npos);
  CHECK(m.err.find("model.layers.0.self_attn.k_proj") != std::string::npos);
  CHECK(m.err.find("tensor parallel 2: one rank's column-parallel part: n % 64 == 0 required") != std::string::npos);
  REQUIRE_FALSE(fs::exists(td.path / "m"));
  Result g = run_cli("convert " + q(td.path / "src") + " " + q(td.path / "g") + " --to gptq --tp 2", td.path);
  INFO(g.out << g.err);
  CHECK(g.rc == 0);
  // 4 ranks: o_proj keeps 64 of its 256 input rows, half a group of 128.
  Result g4 = run_cli("convert " + q(td.path / "src") + " " + q(td.path / "g4") + " --to gptq --tp 4", td.path);
  INFO(g4.out << g4.err);
  CHECK(g4.rc == 1);
  CHECK(g4.err.find("model.layers.1.self_attn.o_proj") != std::string::npos);
  CHECK(g4.err.find("does not divide one rank's k = 64") != std::string::npos);
  // Without --tp (1) the same checkpoint converts to Marlin.
  Result one = run_cli("convert " + q(td.path / "src") + " " + q(td.path / "m1") + " --to marlin", td.path);
  CHECK(one.rc == 0);
  Result bad = run_cli("convert " + q(td.path / "src") + " " + q(td.path / "x") + " --to marlin --tp 0", td.path);
  CHECK(bad.rc == 2);
  CHECK(bad.err.find("--tp") != std::string::npos);
}
