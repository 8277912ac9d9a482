// Format detection on synthetic checkpoints of every kind (built with CheckpointWriter), GPTQ v1/v2
// decided from qzeros data, and the Marlin kernel shape rules.
#include "checkpoint/format.h"
#include "checkpoint/convert_dtype.h"
#include "checkpoint/half.h"
#include <cmath>
#include "tests/checkpoint/st_util.h"
#include "tests/common.h"

using namespace marlinc;
using namespace marlinc::test;
namespace fs = std::filesystem;

namespace {

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }
bool any_note(const FormatInfo& fi, const std::string& sub) {
  for (const auto& n : fi.notes)
    if (contains(n, sub)) return true;
  return false;
}

const char* kQ = "model.layers.0.self_attn.q_proj";
const char* kUp = "model.layers.0.mlp.up_proj";

// Plain tensors every synthetic model carries.
void add_plain(std::vector<TensorData>& ts) {
  ts.push_back(filled("model.embed_tokens.weight", DType::F16, {32, 256}, 5));
  ts.push_back(filled("model.norm.weight", DType::F16, {256}, 6));
}

// GPTQ 4-bit module: qweight [k/8, n], qzeros [G, n/8] filled with `zero_word`, scales [G, n], g_idx [k].
void add_gptq(std::vector<TensorData>& ts, const std::string& p, int64_t k, int64_t n, int g, uint32_t zero_word,
              bool act_order = false) {
  const int64_t G = g == -1 ? 1 : k / g;
  ts.push_back(filled(p + ".qweight", DType::I32, {k / 8, n}, 11));
  ts.push_back(typed(p + ".qzeros", DType::I32, {G, n / 8}, std::vector<uint32_t>(size_t(G * n / 8), zero_word)));
  ts.push_back(filled(p + ".scales", DType::F16, {G, n}, 12));
  std::vector<int32_t> gi(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) gi[size_t(i)] = int32_t(g == -1 ? 0 : (act_order ? (k - 1 - i) : i) / g);
  ts.push_back(typed(p + ".g_idx", DType::I32, {k}, gi));
}

std::string gptq_config(const std::string& ckfmt, bool desc_act = false) {
  return R"({"model_type":"llama","quantization_config":{"quant_method":"gptq","bits":4,"group_size":128,"sym":true,"desc_act":)" +
         std::string(desc_act ? "true" : "false") + R"(,"checkpoint_format":")" + ckfmt + R"("}})";
}

}  // namespace

TEST_CASE("plain checkpoints are plain") {
  TempDir tmp("fplain");
  std::vector<TensorData> ts;
  add_plain(ts);
  ts.push_back(filled(std::string(kQ) + ".weight", DType::F16, {256, 256}, 1));
  write_checkpoint(tmp.path / "m", ts);
  auto ck = Checkpoint::open(tmp.path / "m");
  auto fi = detect_format(ck);
  CHECK(fi.format == Format::Plain);
  CHECK(fi.notes.empty());
  CHECK(quantized_module_shapes(ck, fi).empty());
}

TEST_CASE("GPTQ v1 / v2 / mislabelled are decided from the qzeros data") {
  TempDir tmp("fgptq");
  struct Case {
    const char* label;
    uint32_t zero;
    Format want;
    const char* note;  // "" = no note expected
  };
  const Case cases[] = {
      {"gptq", 0x77777777u, Format::GptqV1, ""},
      {"gptq_v2", 0x88888888u, Format::GptqV2, ""},
      {"gptq", 0x88888888u, Format::GptqV2, "qzeros hold v2 values (8)"},
      {"gptq_v2", 0x77777777u, Format::GptqV1, "qzeros hold v1 values (7)"},
  };
  int i = 0;
  for (const auto& c : cases) {
    const fs::path dir = tmp.path / ("m" + std::to_string(i++));
    std::vector<TensorData> ts;
    add_plain(ts);
    add_gptq(ts, kQ, 256, 256, 128, c.zero);
    add_gptq(ts, kUp, 256, 768, 128, c.zero);
    write_checkpoint(dir, ts, {{"config.json", gptq_config(c.label)}});
    auto ck = Checkpoint::open(dir);
    auto fi = detect_format(ck);
    CAPTURE(c.label, c.zero);
    CHECK(fi.format == c.want);
    CHECK(fi.bits == 4);
    CHECK(fi.group_size == 128);
    CHECK(fi.sym);
    CHECK(!fi.desc_act);
    CHECK(fi.label_in_config == std::string("gptq/") + c.label);
    if (*c.note) CHECK(any_note(fi, c.note));
    else CHECK(fi.notes.empty());
    CHECK(quantized_modules(ck, fi.format) == std::vector<std::string>{kUp, kQ});
    auto mods = quantized_module_shapes(ck, fi);
    REQUIRE(mods.size() == 2);
    CHECK(mods[0].k == 256);
    CHECK(mods[0].n == 768);
    CHECK(mods[1].n == 256);
    CHECK(mods[1].group_size == 128);
    CHECK(mods[1].tensors.size() == 4);
    // qweight 32x256x4 + qzeros 2x32x4 + scales 2x256x2 + g_idx 256x4
    CHECK(mods[1].stored_bytes == 32768u + 256u + 1024u + 1024u);
  }
}

TEST_CASE("a GPTQ qweight that fits neither GPTQ's nor AWQ's layout names both") {
  TempDir tmp("fbadw");
  std::vector<TensorData> ts;
  add_plain(ts);
  ts.push_back(filled(std::string(kUp) + ".qweight", DType::I32, {32, 768}, 11));
  ts.push_back(filled(std::string(kUp) + ".scales", DType::F16, {2, 512}, 12));  // n = 512: mismatched
  write_checkpoint(tmp.path / "m", ts, {{"config.json", gptq_config("gptq")}});
  std::string msg;
  try {
    auto ck = Checkpoint::open(tmp.path / "m");
    detect_format(ck);
  } catch (const Error& e) {
    msg = e.what();
  }
  CAPTURE(msg);
  CHECK(contains(msg, std::string(kUp) + ".qweight"));
  CHECK(contains(msg, "neither GPTQ's [k/8, n] nor AWQ's [k, n/8]"));
}

TEST_CASE("one malformed module beside good ones: the format is the others' and the module is set aside by name") {
  // The layout vote is by majority, and detect_format describes the checkpoint from the well-formed
  // modules; verify then fails the broken one as a layer (tests/verify).
  TempDir tmp("fbadone");
  std::vector<TensorData> ts;
  add_plain(ts);
  add_gptq(ts, kQ, 256, 256, 128, 0x77777777u);
  ts.push_back(filled(std::string(kUp) + ".qweight", DType::I32, {32, 768}, 11));
  ts.push_back(filled(std::string(kUp) + ".scales", DType::F16, {2, 512}, 12));
  write_checkpoint(tmp.path / "m", ts, {{"config.json", gptq_config("gptq")}});
  auto ck = Checkpoint::open(tmp.path / "m");
  const FormatInfo fi = detect_format(ck);
  CHECK(fi.format == Format::GptqV1);
  std::vector<std::pair<std::string, std::string>> malformed;
  const auto mods = quantized_module_shapes(ck, fi, &malformed);
  REQUIRE(mods.size() == 1);
  CHECK(mods[0].prefix == kQ);
  REQUIRE(malformed.size() == 1);
  CHECK(malformed[0].first == kUp);
  CHECK(contains(malformed[0].second, std::string(kUp) + ".qweight"));
  CHECK_THROWS_AS(quantized_module_shapes(ck, fi), Error);  // without the list: the error, as before
}

TEST_CASE("GPTQ without config: bits from g_idx, act-order from g_idx data") {
  TempDir tmp("fgptq2");
  std::vector<TensorData> ts;
  add_plain(ts);
  add_gptq(ts, kQ, 256, 256, 128, 0x77777777u, /*act_order=*/true);
  write_checkpoint(tmp.path / "m", ts);
  auto ck = Checkpoint::open(tmp.path / "m");
  auto fi = detect_format(ck);
  CHECK(fi.format == Format::GptqV1);
  CHECK(fi.bits == 4);
  CHECK(fi.group_size == 128);
  CHECK(fi.desc_act);
  CHECK(any_note(fi, "act-order"));
  CHECK(fi.label_in_config.empty());
}

TEST_CASE("Marlin and Marlin-24 checkpoints") {
  TempDir tmp("fmarlin");
  SECTION("dense Marlin, one incompatible layer") {
    std::vector<TensorData> ts;
    add_plain(ts);
    ts.push_back(filled(std::string(kQ) + ".B", DType::I32, {256 / 16, 2 * 256}, 1));
    ts.push_back(filled(std::string(kQ) + ".s", DType::F16, {2, 256}, 2));
    ts.push_back(filled(std::string(kUp) + ".B", DType::I32, {192 / 16, 2 * 192}, 3));  // k = 192, n = 192
    ts.push_back(filled(std::string(kUp) + ".s", DType::F16, {1, 192}, 4));
    write_checkpoint(tmp.path / "m", ts, {{"quantize_config.json", R"({"bits":4,"group_size":128,"checkpoint_format":"marlin"})"}});
    auto ck = Checkpoint::open(tmp.path / "m");
    auto fi = detect_format(ck);
    CHECK(fi.format == Format::Marlin);
    CHECK(fi.bits == 4);
    CHECK(fi.label_in_config == "marlin");
    auto mods = quantized_module_shapes(ck, fi);
    REQUIRE(mods.size() == 2);
    CHECK(mods[0].prefix == kUp);
    CHECK(mods[0].k == 192);
    CHECK(mods[0].n == 192);
    CHECK(mods[0].group_size == -1);
    CHECK(mods[1].k == 256);
    CHECK(mods[1].group_size == 128);
    CHECK(!marlin_compatible(mods[0].k, mods[0].n, mods[0].group_size, 4, false).ok);
    CHECK(marlin_compatible(mods[1].k, mods[1].n, mods[1].group_size, 4, false).ok);
  }
  SECTION("vLLM Marlin-24") {
    std::vector<TensorData> ts;
    add_plain(ts);
    ts.push_back(filled(std::string(kQ) + ".B_24", DType::I32, {512 / 32, 2 * 256}, 1));
    ts.push_back(filled(std::string(kQ) + ".B_meta", DType::I16, {512 / 32, 2 * 256}, 2));
    ts.push_back(filled(std::string(kQ) + ".s", DType::F16, {4, 256}, 3));
    write_checkpoint(tmp.path / "m", ts, {{"quantize_config.json", R"({"bits":4,"group_size":128,"checkpoint_format":"marlin_24"})"}});
    auto ck = Checkpoint::open(tmp.path / "m");
    auto fi = detect_format(ck);
    CHECK(fi.format == Format::Marlin24);
    auto mods = quantized_module_shapes(ck, fi);
    REQUIRE(mods.size() == 1);
    CHECK(mods[0].k == 512);
    CHECK(mods[0].n == 256);
    CHECK(mods[0].bits == 4);
    CHECK(mods[0].group_size == 128);
    CHECK(fi.notes.empty());
  }
  SECTION("mislabelled: config says gptq, tensors are Marlin") {
    std::vector<TensorData> ts;
    ts.push_back(filled(std::string(kQ) + ".B", DType::I32, {16, 512}, 1));
    ts.push_back(filled(std::string(kQ) + ".s", DType::F16, {1, 256}, 2));
    write_checkpoint(tmp.path / "m", ts, {{"config.json", gptq_config("gptq")}});
    auto fi = detect_format(Checkpoint::open(tmp.path / "m"));
    CHECK(fi.format == Format::Marlin);
    CHECK(any_note(fi, "but the tensors are marlin"));
  }
}

TEST_CASE("golden files are detected as Marlin / Marlin-24 with the metadata's k, n, group") {
  MARLINC_REQUIRE_SHARED();
  for (const auto& e : fs::directory_iterator(shared_dir() / "golden")) {
    if (e.path().extension() != ".safetensors") continue;
    auto ck = Checkpoint::open(e.path());
    auto fi = detect_format(ck);
    const auto& md = ck.files()[0].metadata();
    const bool sparse = e.path().filename().string().rfind("marlin24", 0) == 0;
    CAPTURE(e.path().filename().string());
    CHECK(fi.format == (sparse ? Format::Marlin24 : Format::Marlin));
    auto mods = quantized_module_shapes(ck, fi);
    REQUIRE(mods.size() == 1);
    CHECK(mods[0].prefix == "");
    CHECK(mods[0].k == std::stoll(md.at("k")));
    CHECK(mods[0].n == std::stoll(md.at("n")));
    CHECK(mods[0].group_size == std::stoi(md.at("group_size")));
    CHECK(mods[0].bits == 4);
    CHECK(marlin_compatible(mods[0].k, mods[0].n, mods[0].group_size, 4, sparse).ok);
  }
}

TEST_CASE("AWQ and compressed-tensors checkpoints") {
  TempDir tmp("fawq");
  SECTION("AWQ GEMM") {
    std::vector<TensorData> ts;
    add_plain(ts);
    ts.push_back(filled(std::string(kQ) + ".qweight", DType::I32, {256, 256 / 8}, 1));
    ts.push_back(filled(std::string(kQ) + ".qzeros", DType::I32, {2, 256 / 8}, 2));
    ts.push_back(filled(std::string(kQ) + ".scales", DType::F16, {2, 256}, 3));
    write_checkpoint(tmp.path / "m", ts,
                     {{"config.json", R"({"quantization_config":{"quant_method":"awq","zero_point":true,"group_size":128,"bits":4,"version":"gemm"}})"}});
    auto ck = Checkpoint::open(tmp.path / "m");
    auto fi = detect_format(ck);
    CHECK(fi.format == Format::Awq);
    CHECK(!fi.sym);
    CHECK(fi.group_size == 128);
    CHECK(fi.notes.empty());
    auto mods = quantized_module_shapes(ck, fi);
    REQUIRE(mods.size() == 1);
    CHECK(mods[0].k == 256);
    CHECK(mods[0].n == 256);
  }
  SECTION("AWQ shapes under a GPTQ label are reported") {
    std::vector<TensorData> ts;
    ts.push_back(filled(std::string(kQ) + ".qweight", DType::I32, {256, 32}, 1));
    ts.push_back(filled(std::string(kQ) + ".qzeros", DType::I32, {2, 32}, 2));
    ts.push_back(filled(std::string(kQ) + ".scales", DType::F16, {2, 256}, 3));
    write_checkpoint(tmp.path / "m", ts, {{"config.json", gptq_config("gptq")}});
    auto fi = detect_format(Checkpoint::open(tmp.path / "m"));
    CHECK(fi.format == Format::Awq);
    CHECK(any_note(fi, "disagrees with tensor shapes"));
  }
  SECTION("compressed-tensors pack-quantized") {
    std::vector<TensorData> ts;
    add_plain(ts);
    ts.push_back(filled(std::string(kQ) + ".weight_packed", DType::I32, {768, 256 / 8}, 1));
    ts.push_back(filled(std::string(kQ) + ".weight_scale", DType::BF16, {768, 2}, 2));
    ts.push_back(typed<int64_t>(std::string(kQ) + ".weight_shape", DType::I64, {2}, {768, 256}));
    write_checkpoint(tmp.path / "m", ts, {{"config.json", R"({"quantization_config":{"quant_method":"compressed-tensors","format":"pack-quantized",
      "config_groups":{"group_0":{"targets":["Linear"],"weights":{"num_bits":4,"type":"int","symmetric":true,"group_size":128,"strategy":"group","actorder":null}}}}})"}});
    auto ck = Checkpoint::open(tmp.path / "m");
    auto fi = detect_format(ck);
    CHECK(fi.format == Format::CompressedTensorsPack);
    CHECK(fi.bits == 4);
    CHECK(fi.group_size == 128);
    CHECK(fi.sym);
    CHECK(!fi.desc_act);
    CHECK(fi.label_in_config == "compressed-tensors/pack-quantized");
    auto mods = quantized_module_shapes(ck, fi);
    REQUIRE(mods.size() == 1);
    CHECK(mods[0].k == 256);
    CHECK(mods[0].n == 768);
    // actorder: only group/dynamic/true mean g_idx.
    // llm-compressor's default is "static" (= "weight"): calibration order only, contiguous groups.
    for (const auto& [order, act] : std::vector<std::pair<std::string, bool>>{
             {"\"static\"", false}, {"\"weight\"", false}, {"\"Weight\"", false}, {"false", false},
             {"\"group\"", true}, {"\"dynamic\"", true}, {"true", true}}) {
      INFO("actorder " << order);
      const fs::path dir = tmp.path / ("m" + std::to_string(std::hash<std::string>{}(order)));
      write_checkpoint(dir, ts, {{"config.json", R"({"quantization_config":{"quant_method":"compressed-tensors","format":"pack-quantized",
        "config_groups":{"group_0":{"targets":["Linear"],"weights":{"num_bits":4,"type":"int","symmetric":true,"group_size":128,"strategy":"group","actorder":)" +
                                                     order + "}}}}}"}});
      CHECK(detect_format(Checkpoint::open(dir)).desc_act == act);
    }
  }
  SECTION("compressed-tensors marlin-24") {
    std::vector<TensorData> ts;
    ts.push_back(filled(std::string(kQ) + ".weight_packed", DType::I32, {256 / 32, 2 * 512}, 1));
    ts.push_back(filled(std::string(kQ) + ".meta", DType::I16, {256 / 32, 2 * 512}, 2));
    ts.push_back(filled(std::string(kQ) + ".scale_packed", DType::F16, {2, 512}, 3));
    write_checkpoint(tmp.path / "m", ts, {{"config.json", R"({"quantization_config":{"quant_method":"compressed-tensors","format":"marlin-24",
      "config_groups":{"group_0":{"weights":{"num_bits":4,"symmetric":true,"group_size":128,"strategy":"group"}}}}})"}});
    auto ck = Checkpoint::open(tmp.path / "m");
    auto fi = detect_format(ck);
    CHECK(fi.format == Format::CompressedTensorsMarlin24);
    auto mods = quantized_module_shapes(ck, fi);
    REQUIRE(mods.size() == 1);
    CHECK(mods[0].k == 256);
    CHECK(mods[0].n == 512);
    CHECK(mods[0].group_size == 128);
  }
  SECTION("inconsistent module shapes are a named error") {
    std::vector<TensorData> ts;
    ts.push_back(filled(std::string(kQ) + ".qweight", DType::I32, {32, 256}, 1));
    ts.push_back(filled(std::string(kQ) + ".qzeros", DType::I32, {3, 32}, 2));
    ts.push_back(filled(std::string(kQ) + ".scales", DType::F16, {2, 256}, 3));
    write_checkpoint(tmp.path / "m", ts, {{"config.json", gptq_config("gptq")}});
    REQUIRE_THROWS_WITH(detect_format(Checkpoint::open(tmp.path / "m")),
                        Catch::Contains(std::string(kQ) + ".qzeros: qzeros [3, 32] should be [2, 32]"));
  }
  SECTION("a lone qweight is unknown, not silently plain") {
    write_checkpoint(tmp.path / "m", {filled(std::string(kQ) + ".qweight", DType::I32, {32, 256}, 1)});
    auto fi = detect_format(Checkpoint::open(tmp.path / "m"));
    CHECK(fi.format == Format::Unknown);
    CHECK(any_note(fi, "companion tensors"));
  }
}

TEST_CASE("Marlin kernel rules name the failing rule") {
  CHECK(marlin_compatible(256, 256, 128, 4, false).ok);
  CHECK(marlin_compatible(256, 256, 128, 4, false).rule.empty());
  CHECK(marlin_compatible(4096, 11008, -1, 8, false).ok);
  auto r = marlin_compatible(192, 256, 128, 4, false);
  CHECK(!r.ok);
  CHECK(contains(r.rule, "k % 128"));
  r = marlin_compatible(256, 96, 128, 4, false);
  CHECK(!r.ok);
  CHECK(contains(r.rule, "n % 64"));
  r = marlin_compatible(256, 192, 128, 4, false);  // vLLM fine, IST kernel not at all batch sizes
  CHECK(r.ok);
  CHECK(contains(r.rule, "IST kernel"));
  r = marlin_compatible(256, 384, 128, 4, false);
  CHECK(r.ok);
  CHECK(contains(r.rule, "only batch <= 16"));
  r = marlin_compatible(256, 256, 64, 4, false);
  CHECK(r.ok);
  CHECK(contains(r.rule, "group 64 unsupported"));
  r = marlin_compatible(256, 256, 256, 4, false);  // group == k is per-channel
  CHECK(r.ok);
  r = marlin_compatible(512, 256, 256, 4, false);
  CHECK(!r.ok);
  CHECK(contains(r.rule, "group size must be -1, 32, 64 or 128"));
  r = marlin_compatible(256, 256, 128, 3, false);
  CHECK(!r.ok);
  CHECK(contains(r.rule, "bits must be 4 or 8"));
  CHECK(marlin_compatible(512, 512, -1, 4, true).ok);
  r = marlin_compatible(512, 384, 128, 4, true);
  CHECK(!r.ok);
  CHECK(contains(r.rule, "n % 256"));
  r = marlin_compatible(512, 512, 64, 4, true);
  CHECK(!r.ok);
  CHECK(contains(r.rule, "2:4 group size"));
}

TEST_CASE("to_float converts F32/F16/BF16/F64 and rejects integer dtypes") {
  std::vector<uint16_t> h = {0x3c00, 0xc000, 0x7c00, 0x0001};
  auto f = to_float(as_bytes(h), DType::F16);
  CHECK(f[0] == 1.0f);
  CHECK(f[1] == -2.0f);
  CHECK(std::isinf(f[2]));
  CHECK(f[3] == 5.9604644775390625e-08f);
  std::vector<uint16_t> b = {0x3f80, 0x4049};
  auto g = to_float(as_bytes(b), DType::BF16);
  CHECK(g[0] == 1.0f);
  CHECK(g[1] == bits_to_float(0x40490000u));
  std::vector<double> d = {0.1, -3.5};
  auto dd = to_float(as_bytes(d), DType::F64);
  CHECK(dd[0] == 0.1f);
  CHECK(dd[1] == -3.5f);
  REQUIRE_THROWS_AS(to_float(as_bytes(d), DType::I32), Error);
  std::vector<uint8_t> odd(3);
  REQUIRE_THROWS_AS(to_float(odd, DType::F16), Error);
  // Misaligned F16 input (odd start) still converts.
  std::vector<uint8_t> mis = {0, 0x00, 0x3c};
  CHECK(to_float(std::span<const uint8_t>(mis).subspan(1), DType::F16)[0] == 1.0f);
  // from_float round trip.
  std::vector<float> v = {1.0f, -0.5f, 65504.0f};
  CHECK(to_float(from_float(v, DType::F16), DType::F16) == v);
  CHECK(to_float(from_float(v, DType::F32), DType::F32) == v);
}

TEST_CASE("config.json and quantize_config.json disagreeing is reported, letter case of strings aside") {
  TempDir tmp("fconf");
  std::vector<TensorData> ts;
  add_plain(ts);
  const std::string cfg = R"({"quantization_config":{"quant_method":"awq","bits":4,"version":"gemm"}})";
  write_checkpoint(tmp.path / "same", ts, {{"config.json", cfg}, {"quant_config.json", R"({"version":"GEMM","w_bit":4})"}});
  CHECK(Checkpoint::open(tmp.path / "same").quantize_config_conflicts().empty());  // AutoAWQ's spelling
  write_checkpoint(tmp.path / "diff", ts, {{"config.json", cfg}, {"quantize_config.json", R"({"bits":8})"}});
  auto c = Checkpoint::open(tmp.path / "diff").quantize_config_conflicts();
  REQUIRE(c.size() == 1);
  CHECK(c[0] == "quantize_config.json says bits = 8 but config.json:quantization_config says 4");
}
