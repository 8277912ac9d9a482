// Round trips through convert_checkpoint on synthetic checkpoints: GPTQ v1/v2 <-> Marlin byte-exact,
// dequantized weights bit-identical, act-order kept exactly, asymmetric (GPTQ v2 / AWQ) via Marlin zero
// points, compressed-tensors <-> GPTQ, incompatible shapes, mislabeled v2, determinism, sharding.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/error.h"
#include "packer/adapters.h"
#include "packer/formats/convert.h"
#include "tests/common.h"
#include "tests/formats/synth_checkpoint.h"

namespace fs = std::filesystem;
using namespace marlinc;
using marlinc::test::TempDir;

namespace {

// Small shards so every synthetic checkpoint has several files and modules split across them.
constexpr uint64_t kSmallShard = 200'000;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// Every tensor of `a` exists in `b` with identical dtype, shape and bytes; returns how many compared.
size_t require_same_tensors(const Checkpoint& a, const Checkpoint& b) {
  for (const auto& name : a.tensor_names()) {
    INFO("tensor " << name);
    auto rb = b.find(name);
    REQUIRE(rb.has_value());
    const TensorInfo& ta = *a.at(name).info;
    REQUIRE(ta.dtype == rb->info->dtype);
    REQUIRE(ta.shape == rb->info->shape);
    auto da = a.data(name), db = b.data(name);
    REQUIRE(da.size() == db.size());
    REQUIRE(std::memcmp(da.data(), db.data(), da.size()) == 0);
  }
  return a.tensor_names().size();
}

// Dequantized weights of every module of two checkpoints are equal bit for bit.
void require_same_dequant(const Checkpoint& a, const Checkpoint& b) {
  FormatInfo fa = detect_format(a), fb = detect_format(b);
  auto da = describe_modules(a, fa), db = describe_modules(b, fb);
  REQUIRE(da.size() == db.size());
  for (size_t i = 0; i < da.size(); ++i) {
    INFO("module " << da[i].prefix);
    REQUIRE(da[i].prefix == db[i].prefix);
    QuantizedLinear qa = read_module(a, da[i], fa), qb = read_module(b, db[i], fb);
    qa.validate();
    qb.validate();
    auto wa = dequantize(qa), wb = dequantize(qb);
    REQUIRE(wa.size() == wb.size());
    REQUIRE(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)) == 0);
  }
}

ConvertReport run(const fs::path& in, const fs::path& out, TargetFormat to, bool keep = false,
                  uint64_t shard = kSmallShard) {
  ConvertOptions o;
  o.to = to;
  o.keep_incompatible = keep;
  o.max_shard_bytes = shard;
  return convert_checkpoint(in, out, o);
}

}  // namespace

TEST_CASE("GPTQ v1 and v2 -> Marlin -> GPTQ restores every tensor byte for byte", "[formats][convert]") {
  for (auto kind : {synth::Kind::GptqV1, synth::Kind::GptqV2}) {
    for (int group : {128, -1}) {
      for (ScaleType st : {ScaleType::F16, ScaleType::BF16}) {
        const bool v2 = kind == synth::Kind::GptqV2;
        INFO((v2 ? "v2" : "v1") << " group " << group << (st == ScaleType::BF16 ? " bf16" : " fp16"));
        TempDir td("rt");
        synth::Options o;
        o.kind = kind;
        o.group = group;
        o.scale_type = st;
        o.shard_bytes = kSmallShard;
        o.seed = 11 + uint64_t(group > 0) + 2 * uint64_t(v2) + 4 * uint64_t(st == ScaleType::BF16);
        synth::write_checkpoint(td.path / "src", o);
        ConvertReport r1 = run(td.path / "src", td.path / "marlin", TargetFormat::Marlin);
        REQUIRE(r1.ok);
        REQUIRE(r1.modules.size() == 14);
        REQUIRE(r1.shards > 1);
        ConvertReport r2 = run(td.path / "marlin", td.path / "back", v2 ? TargetFormat::GptqV2 : TargetFormat::GptqV1);
        REQUIRE(r2.ok);

        Checkpoint src = Checkpoint::open(td.path / "src"), mar = Checkpoint::open(td.path / "marlin"),
                   back = Checkpoint::open(td.path / "back");
        REQUIRE(detect_format(mar).format == Format::Marlin);
        REQUIRE(mar.sharded());
        REQUIRE(require_same_tensors(src, back) == src.tensor_names().size());
        REQUIRE(src.tensor_names() == back.tensor_names());
        require_same_dequant(src, mar);
        // Marlin holds B/s only (symmetric, no act-order) and unquantized tensors unchanged.
        REQUIRE(mar.contains("model.layers.0.self_attn.q_proj.B"));
        REQUIRE(mar.contains("model.layers.0.self_attn.q_proj.s"));
        REQUIRE_FALSE(mar.contains("model.layers.0.self_attn.q_proj.qzeros"));
        REQUIRE_FALSE(mar.contains("model.layers.0.self_attn.q_proj.perm"));
        for (const char* t : {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                              "model.layers.1.self_attn.k_proj.bias"}) {
          INFO(t);
          auto a = src.data(t), b = mar.data(t);
          REQUIRE(a.size() == b.size());
          REQUIRE(std::memcmp(a.data(), b.data(), a.size()) == 0);
        }
        // Config rewritten for the target, non-tensor files copied.
        REQUIRE(mar.quantize_config().at("checkpoint_format") == "marlin");
        REQUIRE(mar.config().at("quantization_config").at("checkpoint_format") == "marlin");
        REQUIRE(mar.config().at("model_type") == "llama");
        REQUIRE(back.quantize_config().at("checkpoint_format") == (v2 ? "gptq_v2" : "gptq"));
        REQUIRE(back.quantize_config().at("damp_percent") == 0.01);
        REQUIRE(slurp(td.path / "marlin" / "tokenizer.json") == slurp(td.path / "src" / "tokenizer.json"));
        REQUIRE(fs::exists(td.path / "back" / "generation_config.json"));
      }
    }
  }
}

TEST_CASE("act-order GPTQ -> Marlin keeps g_idx and the row permutation exactly", "[formats][convert]") {
  TempDir td("act");
  synth::Options o;
  o.act_order = true;
  o.seed = 23;
  auto gen = synth::write_checkpoint(td.path / "src", o);
  REQUIRE(run(td.path / "src", td.path / "m", TargetFormat::Marlin).ok);
  Checkpoint src = Checkpoint::open(td.path / "src"), m = Checkpoint::open(td.path / "m");
  REQUIRE(m.quantize_config().at("desc_act") == true);
  REQUIRE(m.quantize_config().contains("marlinc"));
  const std::string p = "model.layers.0.mlp.down_proj";
  REQUIRE(m.contains(p + ".perm"));
  // The stored g_idx is sorted and equals the original g_idx gathered through perm.
  auto gs = m.data(p + ".g_idx"), pm = m.data(p + ".perm");
  std::vector<int32_t> g(gs.size() / 4), perm(pm.size() / 4);
  std::memcpy(g.data(), gs.data(), gs.size());
  std::memcpy(perm.data(), pm.data(), pm.size());
  const QuantizedLinear& orig = gen.layers.at(p);
  for (size_t j = 0; j < g.size(); ++j) {
    REQUIRE(g[j] == orig.g_idx[size_t(perm[j])]);
    if (j) REQUIRE(g[j] >= g[j - 1]);
  }
  require_same_dequant(src, m);
  REQUIRE(run(td.path / "m", td.path / "back", TargetFormat::GptqV1).ok);
  Checkpoint back = Checkpoint::open(td.path / "back");
  require_same_tensors(src, back);
  // Sparse-Marlin cannot hold act-order: reported per module, nothing written.
  ConvertReport r = run(td.path / "src", td.path / "s24", TargetFormat::Marlin24);
  REQUIRE_FALSE(r.ok);
  REQUIRE_FALSE(fs::exists(td.path / "s24"));
}

TEST_CASE("compressed-tensors <-> GPTQ round trips exactly", "[formats][convert]") {
  for (bool sym : {true, false}) {
    INFO("sym " << sym);
    TempDir td("ct");
    synth::Options o;
    o.kind = synth::Kind::GptqV2;
    o.sym = sym;
    o.seed = 31 + uint64_t(sym);
    synth::write_checkpoint(td.path / "src", o);
    REQUIRE(run(td.path / "src", td.path / "ct", TargetFormat::CompressedTensors).ok);
    Checkpoint c = Checkpoint::open(td.path / "ct");
    REQUIRE(detect_format(c).format == Format::CompressedTensorsPack);
    const auto& qc = c.config().at("quantization_config");
    REQUIRE(qc.at("quant_method") == "compressed-tensors");
    REQUIRE(qc.at("format") == "pack-quantized");
    REQUIRE(qc.at("config_groups").at("group_0").at("weights").at("symmetric") == sym);
    REQUIRE(qc.at("config_groups").at("group_0").at("weights").at("group_size") == 128);
    REQUIRE(qc.at("ignore") == nlohmann::json::array({"lm_head"}));
    REQUIRE(c.contains("model.layers.0.mlp.up_proj.weight_shape"));
    REQUIRE(c.contains("model.layers.0.mlp.up_proj.weight_zero_point") == !sym);
    require_same_dequant(Checkpoint::open(td.path / "src"), c);
    REQUIRE(run(td.path / "ct", td.path / "back", TargetFormat::GptqV2).ok);
    require_same_tensors(Checkpoint::open(td.path / "src"), Checkpoint::open(td.path / "back"));
  }
}

TEST_CASE("asymmetric GPTQ and AWQ -> Marlin with zero points: dequantization identical", "[formats][convert]") {
  for (auto kind : {synth::Kind::GptqV2, synth::Kind::GptqV1, synth::Kind::Awq}) {
    INFO("kind " << int(kind));
    TempDir td("asym");
    synth::Options o;
    o.kind = kind;
    o.sym = false;
    o.seed = 41 + uint64_t(kind);
    synth::write_checkpoint(td.path / "src", o);
    REQUIRE(run(td.path / "src", td.path / "m", TargetFormat::Marlin).ok);
    Checkpoint src = Checkpoint::open(td.path / "src"), m = Checkpoint::open(td.path / "m");
    REQUIRE(m.contains("model.layers.1.mlp.gate_proj.qzeros"));
    REQUIRE(m.quantize_config().at("sym") == false);
    require_same_dequant(src, m);
    const TargetFormat back = kind == synth::Kind::Awq ? TargetFormat::Awq
                              : kind == synth::Kind::GptqV2 ? TargetFormat::GptqV2 : TargetFormat::GptqV1;
    REQUIRE(run(td.path / "m", td.path / "back", back).ok);
    require_same_tensors(src, Checkpoint::open(td.path / "back"));
  }
}

TEST_CASE("shapes the target cannot hold are reported per module and nothing is written", "[formats][convert]") {
  TempDir td("inc");
  synth::Options o;
  o.layers = synth::default_layers();
  o.layers.push_back({"model.layers.1.mlp.odd_proj", 136, 72, false});  // k % 128 and n % 64 both fail
  o.group = -1;
  o.seed = 51;
  auto gen = synth::write_checkpoint(td.path / "src", o);
  ConvertReport r = run(td.path / "src", td.path / "out", TargetFormat::Marlin);
  REQUIRE_FALSE(r.ok);
  REQUIRE(r.incompatible.size() == 1);
  REQUIRE(r.incompatible[0].prefix == "model.layers.1.mlp.odd_proj");
  REQUIRE(r.incompatible[0].rule.find("k % 128") != std::string::npos);
  REQUIRE_FALSE(fs::exists(td.path / "out"));
  // k_proj (n = 64) fits dense Marlin but not Sparse-Marlin (n % 256).
  ConvertReport r24 = run(td.path / "src", td.path / "out", TargetFormat::Marlin24);
  REQUIRE_FALSE(r24.ok);
  bool kproj = false;
  for (const auto& m : r24.incompatible)
    if (m.prefix == "model.layers.0.self_attn.k_proj") kproj = m.rule.find("n % 256") != std::string::npos;
  REQUIRE(kproj);
  REQUIRE_FALSE(fs::exists(td.path / "out"));

  // --keep-incompatible: the layer becomes a plain fp16 weight [n, k], listed as not converted.
  ConvertReport rk = run(td.path / "src", td.path / "out", TargetFormat::Marlin, true);
  REQUIRE(rk.ok);
  Checkpoint out = Checkpoint::open(td.path / "out");
  const std::string p = "model.layers.1.mlp.odd_proj";
  REQUIRE(out.at(p + ".weight").info->shape == std::vector<int64_t>{72, 136});
  REQUIRE_FALSE(out.contains(p + ".qweight"));
  REQUIRE(out.quantize_config().at("dynamic").contains("-:^model\\.layers\\.1\\.mlp\\.odd_proj$"));
  auto wb = out.data(p + ".weight");
  std::vector<uint16_t> w(wb.size() / 2);
  std::memcpy(w.data(), wb.data(), wb.size());
  const QuantizedLinear& q = gen.layers.at(p);
  for (int64_t r0 = 0; r0 < q.k; ++r0)
    for (int64_t c = 0; c < q.n; ++c) REQUIRE(w[size_t(c * q.k + r0)] == float_to_half(q.weight(r0, c)));
}

TEST_CASE("v2 zeros labelled as gptq are detected from the data", "[formats][convert]") {
  TempDir td("mis");
  synth::Options o;
  o.kind = synth::Kind::GptqV2;
  o.config_format = "gptq";  // the label lies
  o.seed = 61;
  synth::write_checkpoint(td.path / "src", o);
  Checkpoint src = Checkpoint::open(td.path / "src");
  FormatInfo fi = detect_format(src);
  REQUIRE(fi.format == Format::GptqV2);
  ConvertReport r = run(td.path / "src", td.path / "m", TargetFormat::Marlin);
  REQUIRE(r.ok);
  bool noted = false;
  for (const auto& n : r.notes) noted = noted || n.find("v2") != std::string::npos;
  REQUIRE(noted);
  // Converting to v1 rewrites the zeros as 7 (z - 1): the weights are what v2 meant.
  REQUIRE(run(td.path / "m", td.path / "v1", TargetFormat::GptqV1).ok);
  Checkpoint v1 = Checkpoint::open(td.path / "v1");
  auto qz = v1.data("model.layers.0.self_attn.q_proj.qzeros");
  uint32_t w0;
  std::memcpy(&w0, qz.data(), 4);
  REQUIRE(w0 == 0x77777777u);
  require_same_dequant(src, v1);
}

TEST_CASE("conversion is deterministic: same input, same bytes", "[formats][convert]") {
  TempDir td("det");
  synth::Options o;
  o.act_order = true;
  o.seed = 71;
  synth::write_checkpoint(td.path / "src", o);
  for (TargetFormat t : {TargetFormat::Marlin, TargetFormat::CompressedTensors}) {
    fs::remove_all(td.path / "a");
    fs::remove_all(td.path / "b");
    REQUIRE(run(td.path / "src", td.path / "a", t).ok);
    REQUIRE(run(td.path / "src", td.path / "b", t).ok);
    std::vector<std::string> fa, fb;
    for (auto& e : fs::directory_iterator(td.path / "a")) fa.push_back(e.path().filename().string());
    for (auto& e : fs::directory_iterator(td.path / "b")) fb.push_back(e.path().filename().string());
    std::sort(fa.begin(), fa.end());
    std::sort(fb.begin(), fb.end());
    REQUIRE(fa == fb);
    REQUIRE(fa.size() > 3);
    for (const auto& f : fa) {
      INFO(f);
      REQUIRE(slurp(td.path / "a" / f) == slurp(td.path / "b" / f));
    }
  }
}

TEST_CASE("convert refuses plain checkpoints, an existing output and writing over the input", "[formats][convert]") {
  TempDir td("use");
  synth::Options o;
  o.seed = 81;
  synth::write_checkpoint(td.path / "src", o);
  fs::create_directories(td.path / "busy");
  synth::write_text(td.path / "busy" / "x.txt", "keep me");
  REQUIRE_THROWS_AS(run(td.path / "src", td.path / "busy", TargetFormat::Marlin), Error);
  REQUIRE(slurp(td.path / "busy" / "x.txt") == "keep me");
  REQUIRE_THROWS_AS(run(td.path / "src", td.path / "src", TargetFormat::Marlin), Error);
  REQUIRE(parse_size("5GB") == 5'000'000'000ull);
  REQUIRE(parse_size("2GiB") == 2ull << 30);
  REQUIRE(parse_size("500mb") == 500'000'000ull);
  REQUIRE(parse_size("0") == 0);
  REQUIRE_THROWS_AS(parse_size("5 parsecs"), Error);
  REQUIRE(parse_size(" 1.5 GB ") == 1'500'000'000ull);
  REQUIRE(parse_size("0.5KiB") == 512);
  for (const char* bad : {"0.5", "1.5.3MB", "1 2GB", ".", "", "GB", "-1GB", "1e3", "99999999999TB"}) {
    INFO(bad);
    REQUIRE_THROWS_AS(parse_size(bad), Error);
  }
}

TEST_CASE("8-bit GPTQ -> Marlin (uint8b128) -> GPTQ is exact, 8-bit zero points are refused for Marlin", "[formats][convert]") {
  TempDir td("b8");
  synth::Options o;
  o.bits = 8;
  o.seed = 95;
  synth::write_checkpoint(td.path / "src", o);
  ConvertReport r = run(td.path / "src", td.path / "m", TargetFormat::Marlin);
  REQUIRE(r.ok);
  Checkpoint src = Checkpoint::open(td.path / "src"), m = Checkpoint::open(td.path / "m");
  // 8-bit Marlin B is [k/16, 4n].
  REQUIRE(m.at("model.layers.0.mlp.up_proj.B").info->shape == std::vector<int64_t>{256 / 16, 4 * 512});
  require_same_dequant(src, m);
  REQUIRE(run(td.path / "m", td.path / "back", TargetFormat::GptqV1).ok);
  require_same_tensors(src, Checkpoint::open(td.path / "back"));

  synth::Options a = o;
  a.sym = false;
  a.kind = synth::Kind::GptqV2;
  synth::write_checkpoint(td.path / "asym", a);
  ConvertReport ra = run(td.path / "asym", td.path / "am", TargetFormat::Marlin);
  REQUIRE_FALSE(ra.ok);
  REQUIRE(ra.incompatible.size() == 14);
  REQUIRE(ra.incompatible[0].rule.find("4-bit") != std::string::npos);
  // compressed-tensors holds 8-bit asymmetric layers.
  REQUIRE(run(td.path / "asym", td.path / "ct", TargetFormat::CompressedTensors).ok);
  require_same_dequant(Checkpoint::open(td.path / "asym"), Checkpoint::open(td.path / "ct"));
}
