// The config `quantize` writes names every linear it leaves unquantized, so loaders do not expect
// quantized tensors there: compressed-tensors `ignore`, GPTQ `dynamic` "-:" rules, AWQ
// `modules_to_not_convert`.
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "quantizer/quantize_checkpoint.h"
#include "tests/common.h"

using namespace marlinc;
namespace fs = std::filesystem;

TEST_CASE("quantize lists lm_head and --skip layers as unquantized in the target's config", "[quantizer][config]") {
  const fs::path model = fs::path(MARLINC_SOURCE_DIR) / "data" / "sample" / "model";
  test::TempDir td("qcfg");
  QuantizeOptions o;
  o.skip = {"down_proj"};
  const std::vector<std::string> down = {"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"};

  o.to = TargetFormat::CompressedTensors;
  quantize_checkpoint(model, td.path / "ct", o);
  const auto ct = Checkpoint::open(td.path / "ct").config().at("quantization_config");
  CHECK(ct.at("ignore") == nlohmann::json({"lm_head", down[0], down[1]}));

  o.to = TargetFormat::GptqV1;
  quantize_checkpoint(model, td.path / "gptq", o);
  const auto gq = Checkpoint::open(td.path / "gptq").quantize_config();
  REQUIRE(gq.contains("dynamic"));
  CHECK(gq.at("dynamic").size() == 2);
  for (const auto& p : down) {
    std::string rx = "-:^";
    for (char c : p) rx += c == '.' ? std::string("\\.") : std::string(1, c);
    CHECK(gq.at("dynamic").contains(rx + "$"));
  }

  o.to = TargetFormat::Awq;
  quantize_checkpoint(model, td.path / "awq", o);
  const auto aq = Checkpoint::open(td.path / "awq").config().at("quantization_config");
  CHECK(aq.at("modules_to_not_convert") == nlohmann::json({"lm_head", down[0], down[1]}));
}
