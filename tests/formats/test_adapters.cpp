// Adapter-level checks against the spec's test vectors (formats.md §8): the D1 -> D2 chain through
// read_gptq / write_marlin / read_marlin / write_gptq, the scale vectors S1-S3, the 2:4 vectors P1/P2
// through mask_24_from_codes + write_marlin24, 2:4-sparse GPTQ <-> marlin24 through convert, and the
// config keys each target writes.
#include <cstring>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/error.h"
#include "checkpoint/half.h"
#include "checkpoint/writer.h"
#include "packer/adapters.h"
#include "packer/crc32.h"
#include "packer/formats/convert.h"
#include "packer/gptq.h"
#include "packer/marlin.h"
#include "tests/common.h"
#include "tests/formats/synth_checkpoint.h"

namespace fs = std::filesystem;
using namespace marlinc;
using marlinc::test::TempDir;

namespace {

constexpr int64_t kK = 256, kN = 256;  // §8 vector shapes

uint32_t crc_bytes(const std::vector<uint8_t>& b) { return crc32(b.data(), b.size()); }

const PackedTensor& find(const std::vector<PackedTensor>& v, const std::string& name) {
  for (const auto& t : v)
    if (t.spec.name == name) return t;
  FAIL("tensor " << name << " not written");
  return v.front();
}

// Writes one module's tensors + a quantize_config as a checkpoint directory.
void write_module_dir(const fs::path& dir, const std::vector<PackedTensor>& ts, const nlohmann::json& qc) {
  std::vector<TensorSpec> plan;
  for (const auto& t : ts) plan.push_back(t.spec);
  CheckpointWriter w(dir, plan, WriterOptions{0, "model", true});
  for (const auto& t : ts) w.write(t.spec.name, t.bytes);
  w.add_file("quantize_config.json", qc.dump());
  w.commit();
}

// §8 D1 codes, with S1 (G = 2) or S2 (G = 1) scales.
QuantizedLinear d1_layer(int64_t groups) {
  QuantizedLinear q;
  q.name = "layer";
  q.k = kK;
  q.n = kN;
  q.bits = 4;
  q.group_size = groups == 1 ? -1 : int(kK / groups);
  q.codes.resize(size_t(kK * kN));
  for (int64_t k = 0; k < kK; ++k)
    for (int64_t n = 0; n < kN; ++n) q.codes[size_t(k * kN + n)] = uint8_t((7 * k + 3 * n + (k * n) % 11) % 16);
  q.scales.resize(size_t(groups * kN));
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t n = 0; n < kN; ++n) q.scales[size_t(g * kN + n)] = float_to_half(float(groups == 1 ? n : 256 * g + n));
  return q;
}

}  // namespace

TEST_CASE("D1 -> D2 chain through the adapters reproduces the spec's CRC32s", "[formats][adapters]") {
  for (int64_t groups : {2, 1}) {
    INFO("groups " << groups);
    TempDir td("d1");
    QuantizedLinear d1 = d1_layer(groups);
    // The GPTQ source is packed with the packer's layout functions, not the adapter under test.
    std::vector<PackedTensor> src = {
        {{"layer.qweight", DType::I32, {kK / 8, kN}}, {}},
        {{"layer.qzeros", DType::I32, {groups, kN / 8}}, {}},
        {{"layer.scales", DType::F16, {groups, kN}}, {}},
        {{"layer.g_idx", DType::I32, {kK}}, {}}};
    auto put = [](PackedTensor& t, const auto& v) {
      t.bytes.resize(v.size() * sizeof(v[0]));
      std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    };
    put(src[0], gptq::pack_qweight(d1.codes.data(), kK, kN, 4));
    put(src[1], gptq::sym_qzeros(groups, kN, 4, gptq::ZeroFormat::V1));
    put(src[2], d1.scales);
    put(src[3], gptq::trivial_g_idx(kK, d1.group_size));
    REQUIRE(crc_bytes(src[0].bytes) == 0x30795d0fu);  // D1 itself
    const nlohmann::json qc = {{"bits", 4}, {"group_size", groups == 1 ? -1 : 128}, {"sym", true},
                               {"desc_act", false}, {"quant_method", "gptq"}, {"checkpoint_format", "gptq"}};
    write_module_dir(td.path / "gptq", src, qc);

    Checkpoint g = Checkpoint::open(td.path / "gptq");
    FormatInfo gi = detect_format(g);
    REQUIRE(gi.format == Format::GptqV1);
    QuantizedLinear q = read_gptq(g, "layer", gi);
    REQUIRE(q.codes == d1.codes);
    auto marlin = write_marlin(q);
    REQUIRE(marlin.size() == 2);
    REQUIRE(crc_bytes(find(marlin, "layer.B").bytes) == 0x061fa373u);  // D2
    REQUIRE(crc_bytes(find(marlin, "layer.s").bytes) == (groups == 2 ? 0xc733a995u : 0x9451f4ffu));  // S1 / S2

    write_module_dir(td.path / "marlin", marlin, {{"bits", 4}, {"group_size", 128}, {"checkpoint_format", "marlin"}});
    Checkpoint m = Checkpoint::open(td.path / "marlin");
    FormatInfo mi = detect_format(m);
    REQUIRE(mi.format == Format::Marlin);
    QuantizedLinear back = read_marlin(m, "layer", mi);
    REQUIRE(back.codes == d1.codes);
    REQUIRE(back.scales == d1.scales);
    auto gptq_back = write_gptq(back, false);
    for (size_t i = 0; i < src.size(); ++i) {
      INFO(src[i].spec.name);
      REQUIRE(gptq_back[i].spec.name == src[i].spec.name);
      REQUIRE(gptq_back[i].spec.shape == src[i].spec.shape);
      REQUIRE(gptq_back[i].bytes == src[i].bytes);
    }
  }
}

TEST_CASE("2:4 pattern P1/P2 and S3 through mask_24_from_codes and write_marlin24", "[formats][adapters]") {
  // §8 2:4 pattern: two kept values per aligned 4 rows, v != 0, stored as v + 8; pruned = code 8.
  static const int pairs[6][2] = {{0, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 3}};
  QuantizedLinear q = d1_layer(2);
  std::fill(q.codes.begin(), q.codes.end(), uint8_t(8));
  for (int64_t n = 0; n < kN; ++n)
    for (int64_t g = 0; g < kK / 4; ++g)
      for (int p : pairs[(5 * n + 3 * g) % 6]) {
        const int64_t k = 4 * g + p;
        int v = int((3 * n + 5 * k) % 15) - 7;
        if (v == 0) v = 1;
        q.codes[size_t(k * kN + n)] = uint8_t(v + 8);
      }
  auto mask = mask_24_from_codes(q);
  for (int64_t n = 0; n < kN; ++n)
    for (int64_t k = 0; k < kK; ++k)
      REQUIRE((mask[size_t(k * kN + n)] != 0) == (q.codes[size_t(k * kN + n)] != 8));
  auto s24 = write_marlin24(q);
  REQUIRE(crc_bytes(find(s24, "layer.B_24").bytes) == 0x12e3e7ecu);    // P1
  REQUIRE(crc_bytes(find(s24, "layer.B_meta").bytes) == 0x4f9bfbb4u);  // P2
  REQUIRE(crc_bytes(find(s24, "layer.s").bytes) == 0xc5164e67u);       // S3

  // A third non-zero weight in rows 4..7 of column 5 is not 2:4: refused, naming where.
  q.codes[size_t(4 * kN + 5)] = q.codes[size_t(5 * kN + 5)] = q.codes[size_t(6 * kN + 5)] = 3;
  std::string msg;
  try {
    mask_24_from_codes(q);
  } catch (const Error& e) {
    msg = e.what();
  }
  REQUIRE(msg.find("rows 4..7 of column 5") != std::string::npos);
  REQUIRE_THROWS_AS(write_marlin24(q), Error);
}

TEST_CASE("A SparseGPT mask whose kept weight rounds to zero: positions by the 3.2 rule on the values", "[formats][adapters]") {
  // Column 0, rows 0..3: the mask keeps rows 0 and 1, and row 0's code is the zero code (a kept weight
  // that rounded to 0); rows 2..3 are pruned but hold stray codes. The reference packers see the values
  // (0, v, 0, 0): one non-zero at index 1, recorded at positions 1 and 2 (table: 0100 -> 1,2).
  QuantizedLinear q = d1_layer(2);
  std::fill(q.codes.begin(), q.codes.end(), uint8_t(8));
  q.mask.assign(q.codes.size(), 0);
  for (int64_t g = 0; g < kK / 4; ++g)
    for (int64_t n = 0; n < kN; ++n) {
      q.mask[size_t((4 * g) * kN + n)] = q.mask[size_t((4 * g + 1) * kN + n)] = 1;
      const int v = int((g + n) % 14);
      q.codes[size_t((4 * g + 1) * kN + n)] = uint8_t(v < 7 ? v + 1 : v + 2);  // 1..7, 9..15: never 8
      q.codes[size_t((4 * g + 2) * kN + n)] = 3;  // pruned: must not be stored
    }
  // The same values as a dense layer: pruned positions hold the zero code, no mask.
  QuantizedLinear dense = q;
  dense.mask.clear();
  for (size_t i = 0; i < q.codes.size(); ++i)
    if (!q.mask[i]) dense.codes[i] = 8;
  const auto by_rule = write_marlin24(q);
  const auto from_dense = write_marlin24(dense);
  for (const char* t : {"layer.B_24", "layer.B_meta", "layer.s"}) {
    INFO(t);
    CHECK(find(by_rule, t).bytes == find(from_dense, t).bytes);
  }
  // Recorded positions keep the mask's pair (0, 1): other metadata, the same values once unpacked.
  const auto recorded = write_marlin24(q, /*recorded_positions=*/true);
  CHECK(find(recorded, "layer.B_meta").bytes != find(by_rule, "layer.B_meta").bytes);
  std::vector<uint8_t> c1(q.codes.size()), m1(q.codes.size()), c2(q.codes.size()), m2(q.codes.size());
  auto as_i32 = [](const PackedTensor& t) {
    std::vector<int32_t> v(t.bytes.size() / 4);
    std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
    return v;
  };
  auto as_i16 = [](const PackedTensor& t) {
    std::vector<int16_t> v(t.bytes.size() / 2);
    std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
    return v;
  };
  marlin::unpack_24(as_i32(find(by_rule, "layer.B_24")).data(), as_i16(find(by_rule, "layer.B_meta")).data(), kK, kN, 4,
                    c1.data(), m1.data());
  marlin::unpack_24(as_i32(find(recorded, "layer.B_24")).data(), as_i16(find(recorded, "layer.B_meta")).data(), kK, kN,
                    4, c2.data(), m2.data());
  CHECK(c1 == dense.codes);
  CHECK(c2 == dense.codes);
  CHECK(m2 == q.mask);
  CHECK(m1 != q.mask);
}

TEST_CASE("Sparse-Marlin stores fp16 scales: bf16 ones are converted when exact, refused otherwise", "[formats][adapters]") {
  QuantizedLinear q = d1_layer(2);
  std::fill(q.codes.begin(), q.codes.end(), uint8_t(8));  // all pruned: trivially 2:4
  // Scales with 3 significant bits: exact in fp16 and bf16.
  for (size_t i = 0; i < q.scales.size(); ++i) q.scales[i] = float_to_half(0.0078125f * float(1 + i % 7));
  const auto f16 = write_marlin24(q);
  QuantizedLinear b = q;
  b.scale_type = ScaleType::BF16;
  for (auto& s : b.scales) {
    const uint16_t bf = float_to_bf16(half_to_float(s));
    REQUIRE(bf16_to_float(bf) == half_to_float(s));
    s = bf;
  }
  const auto from_bf16 = write_marlin24(b);
  const PackedTensor& s = find(from_bf16, "layer.s");
  CHECK(s.spec.dtype == DType::F16);
  CHECK(s.bytes == find(f16, "layer.s").bytes);
  ModuleDesc d;
  d.prefix = "layer"; d.k = b.k; d.n = b.n; d.bits = b.bits; d.groups = b.groups(); d.scale_type = ScaleType::BF16;
  CHECK(plan_module(TargetFormat::Marlin24, d)[2].dtype == DType::F16);
  b.scales[3] = float_to_bf16(1e-30f);  // far below fp16's subnormals
  std::string msg;
  try {
    write_marlin24(b);
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("layer: Sparse-Marlin stores fp16 scales") != std::string::npos);
  CHECK(msg.find("group 0, column 3") != std::string::npos);
}

TEST_CASE("2:4-sparse GPTQ <-> marlin24 through convert, marlin24 -> marlin keeps the weights", "[formats][convert]") {
  TempDir td("s24");
  synth::Options o;
  o.layers = {{"model.layers.0.mlp.up_proj", 256, 256, true}, {"model.layers.0.mlp.down_proj", 512, 256, false}};
  o.seed = 91;
  auto gen = synth::write_checkpoint(td.path / "dense", o);
  // Rewrite the codes as 2:4 (prune to the zero code 8) and repack the GPTQ source with the packer.
  std::vector<synth::Tensor> ts;
  {
    Checkpoint ck = Checkpoint::open(td.path / "dense");
    for (const auto& name : ck.tensor_names()) {
      const TensorInfo& t = *ck.at(name).info;
      auto d = ck.data(name);
      ts.push_back({{name, t.dtype, t.shape}, std::vector<uint8_t>(d.begin(), d.end())});
    }
  }
  for (auto& [p, q] : gen.layers) {
    for (int64_t g = 0; g < q.k / 4; ++g)
      for (int64_t c = 0; c < q.n; ++c) {
        const int64_t drop = (g + c) % 3;  // prune 2 of 4 (rows drop and drop+1 within the group)
        q.codes[size_t((4 * g + drop) * q.n + c)] = 8;
        q.codes[size_t((4 * g + drop + 1) * q.n + c)] = 8;
      }
    auto qw = gptq::pack_qweight(q.codes.data(), q.k, q.n, 4);
    for (auto& t : ts)
      if (t.spec.name == p + ".qweight") std::memcpy(t.bytes.data(), qw.data(), t.bytes.size());
  }
  {
    std::vector<TensorSpec> plan;
    for (const auto& t : ts) plan.push_back(t.spec);
    CheckpointWriter w(td.path / "src", plan, WriterOptions{0, "model", true});
    for (const auto& t : ts) w.write(t.spec.name, t.bytes);
    w.copy_file(td.path / "dense" / "quantize_config.json", "quantize_config.json");
    w.copy_file(td.path / "dense" / "config.json", "config.json");
    w.commit();
  }
  ConvertOptions co;
  co.to = TargetFormat::Marlin24;
  ConvertReport r = convert_checkpoint(td.path / "src", td.path / "s24", co);
  REQUIRE(r.ok);
  Checkpoint s24 = Checkpoint::open(td.path / "s24");
  REQUIRE(detect_format(s24).format == Format::Marlin24);
  REQUIRE(s24.quantize_config().at("checkpoint_format") == "marlin_24");
  REQUIRE(s24.contains("model.layers.0.mlp.up_proj.B_meta"));
  co.to = TargetFormat::GptqV1;
  REQUIRE(convert_checkpoint(td.path / "s24", td.path / "back", co).ok);
  co.to = TargetFormat::Marlin;
  REQUIRE(convert_checkpoint(td.path / "s24", td.path / "dense_m", co).ok);
  Checkpoint src = Checkpoint::open(td.path / "src"), back = Checkpoint::open(td.path / "back"),
             dm = Checkpoint::open(td.path / "dense_m");
  for (const auto& name : src.tensor_names()) {
    INFO(name);
    auto a = src.data(name), b = back.data(name);
    REQUIRE(a.size() == b.size());
    REQUIRE(std::memcmp(a.data(), b.data(), a.size()) == 0);
  }
  FormatInfo f24 = detect_format(s24), fdm = detect_format(dm);
  for (const auto& [p, q] : gen.layers) {
    INFO(p);
    auto w0 = dequantize(q);
    auto w1 = dequantize(read_module(s24, describe_module(s24, p, f24), f24));
    auto w2 = dequantize(read_module(dm, describe_module(dm, p, fdm), fdm));
    REQUIRE(std::memcmp(w0.data(), w1.data(), w0.size() * 4) == 0);
    REQUIRE(std::memcmp(w0.data(), w2.data(), w0.size() * 4) == 0);
  }
}

TEST_CASE("target configs carry the keys loaders read", "[formats][config]") {
  QuantSummary s;
  s.bits = 4;
  s.group_size = 128;
  s.sym = false;
  s.desc_act = true;
  s.dequantized = {"model.layers.0.mlp.odd"};
  s.overrides = {{"model.layers.3.mlp.down_proj", {8, 64}}};
  s.plain_linears = {"lm_head"};
  const nlohmann::json src_cfg = {{"model_type", "llama"}, {"quantization_config", {{"quant_method", "awq"}}}};
  const nlohmann::json src_q = {{"quant_method", "gptq"}, {"damp_percent", 0.05}, {"checkpoint_format", "gptq"},
                                {"dynamic", {{"-:.*lm_head.*", nlohmann::json::object()}, {"+:.*q_proj", {{"bits", 8}}}}}};

  TargetConfig g = target_config(TargetFormat::GptqV2, src_cfg, src_q, s);
  REQUIRE(g.quantize_config.has_value());
  const auto& q = *g.quantize_config;
  REQUIRE(q.at("checkpoint_format") == "gptq_v2");
  REQUIRE(q.at("quant_method") == "gptq");
  REQUIRE(q.at("sym") == false);
  REQUIRE(q.at("desc_act") == true);
  REQUIRE(q.at("damp_percent") == 0.05);
  REQUIRE_FALSE(q.at("dynamic").contains("-:.*lm_head.*"));    // source rules not carried: the data's own
  REQUIRE_FALSE(q.at("dynamic").contains("+:.*q_proj"));       // source overrides replaced by the data's
  REQUIRE(q.at("dynamic").at("+:^model\\.layers\\.3\\.mlp\\.down_proj$").at("bits") == 8);
  REQUIRE(q.at("dynamic").contains("-:^model\\.layers\\.0\\.mlp\\.odd$"));
  REQUIRE(g.config.at("model_type") == "llama");
  REQUIRE(g.config.at("quantization_config") == q);

  TargetConfig c = target_config(TargetFormat::CompressedTensors, src_cfg, src_q, s);
  REQUIRE_FALSE(c.quantize_config.has_value());
  const auto& cq = c.config.at("quantization_config");
  REQUIRE(cq.at("quant_method") == "compressed-tensors");
  REQUIRE(cq.at("format") == "pack-quantized");
  REQUIRE(cq.at("quantization_status") == "compressed");
  const auto& w = cq.at("config_groups").at("group_0").at("weights");
  REQUIRE(w.at("num_bits") == 4);
  REQUIRE(w.at("symmetric") == false);
  REQUIRE(w.at("strategy") == "group");
  REQUIRE(w.at("actorder") == "group");
  REQUIRE(cq.at("config_groups").at("group_1").at("targets") == nlohmann::json::array({"model.layers.3.mlp.down_proj"}));
  REQUIRE(cq.at("ignore") == nlohmann::json::array({"lm_head", "model.layers.0.mlp.odd"}));

  s.group_size = -1;
  TargetConfig a = target_config(TargetFormat::Awq, src_cfg, src_q, s);
  REQUIRE(a.config.at("quantization_config").at("version") == "gemm");
  REQUIRE(a.config.at("quantization_config").at("zero_point") == true);
  TargetConfig c2 = target_config(TargetFormat::CompressedTensors, src_cfg, src_q, s);
  REQUIRE(c2.config.at("quantization_config").at("config_groups").at("group_0").at("weights").at("strategy") == "channel");

  REQUIRE(target_from_name("gptq_v2") == TargetFormat::GptqV2);
  REQUIRE(target_from_name("compressed-tensors") == TargetFormat::CompressedTensors);
  REQUIRE_FALSE(target_from_name("exl2").has_value());
}

TEST_CASE("quantization tensor leaves: the distinctive ones always, the short ones on request", "[formats]") {
  for (const char* n : {"model.layers.0.mlp.up_proj.qweight", "x.B_24", "x.B_meta", "x.s_24", "x.weight_packed",
                        "x.weight_zero_point", "x.scale_packed", "g_idx"}) {
    CHECK(is_quant_leaf(n, false));
    CHECK(is_quant_leaf(n, true));
  }
  for (const char* n : {"model.layers.0.mlp.up_proj.B", "x.s", "x.scales", "x.meta", "x.perm"}) {
    CHECK_FALSE(is_quant_leaf(n, false));  // also names in some plain models: convert passes them through
    CHECK(is_quant_leaf(n, true));         // verify reports them as leftovers
  }
  for (const char* n : {"model.layers.0.mlp.up_proj.weight", "model.norm.bias", "qweight_x", "x.qweights", ""})
    CHECK_FALSE(is_quant_leaf(n, true));
}
