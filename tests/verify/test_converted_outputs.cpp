// convert's outputs as loaders and `verify` read them (here because they need marlinc_verify): the
// checkpoint-wide group size when some layers have one scale row, zero-point Marlin checkpoints that
// verify, the original Sparse-Marlin metadata view, GPTQ zero points in asymmetric checkpoints, zero
// points of 0 from a Marlin source, and the unquantized linears a GPTQ-family config names.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "checkpoint/checkpoint.h"
#include "checkpoint/error.h"
#include "checkpoint/format.h"
#include "packer/adapters.h"
#include "packer/formats/convert.h"
#include "packer/gptq.h"
#include "tests/common.h"
#include "tests/formats/synth_checkpoint.h"
#include "verify/verify.h"

namespace fs = std::filesystem;
using namespace marlinc;
using marlinc::test::TempDir;

namespace {

ConvertReport run(const fs::path& in, const fs::path& out, TargetFormat to, bool keep = false) {
  ConvertOptions o;
  o.to = to;
  o.keep_incompatible = keep;
  return convert_checkpoint(in, out, o);
}

// Copies checkpoint `src` to `dst` with the bytes of the tensors in `replace` swapped (same dtype and
// shape) and the config files kept.
void copy_with(const fs::path& src, const fs::path& dst, const std::map<std::string, std::vector<uint8_t>>& replace) {
  Checkpoint ck = Checkpoint::open(src);
  std::vector<TensorSpec> plan;
  for (const auto& name : ck.tensor_names()) {
    const TensorInfo& t = *ck.at(name).info;
    plan.push_back({name, t.dtype, t.shape});
  }
  CheckpointWriter w(dst, plan, WriterOptions{0, "model", true});
  for (const auto& name : ck.tensor_names()) {
    auto it = replace.find(name);
    if (it == replace.end()) {
      w.write(name, ck.data(name));
    } else {
      REQUIRE(it->second.size() == ck.data(name).size());
      w.write(name, it->second);
    }
  }
  for (const char* f : {"config.json", "quantize_config.json"})
    if (fs::exists(src / f)) w.copy_file(src / f, f);
  w.commit();
}

// The message of the error converting `in` to `to` throws ("" when it succeeds).
std::string convert_error(const fs::path& in, const fs::path& out, TargetFormat to) {
  try {
    run(in, out, to);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Copies checkpoint `src` to `dst` without the tensor `dropped` (none where empty) and with `added` (zeros) where
// given, the config files kept.
void copy_edited(const fs::path& src, const fs::path& dst, const std::string& dropped, const TensorSpec* added) {
  Checkpoint ck = Checkpoint::open(src);
  std::vector<TensorSpec> plan;
  for (const auto& name : ck.tensor_names())
    if (name != dropped) plan.push_back({name, ck.at(name).info->dtype, ck.at(name).info->shape});
  if (added) plan.push_back(*added);
  CheckpointWriter w(dst, plan);
  for (const auto& name : ck.tensor_names())
    if (name != dropped) w.write(name, ck.data(name));
  if (added) {
    size_t bytes = dtype_size(added->dtype);
    for (int64_t d : added->shape) bytes *= size_t(d);
    w.write(added->name, std::vector<uint8_t>(bytes, 0));
  }
  for (const char* f : {"config.json", "quantize_config.json"})
    if (fs::exists(src / f)) w.copy_file(src / f, f);
  w.commit();
}

// One checkpoint from two: every tensor of `a`, the tensors of `b` that `a` lacks (its modules), and
// a's quantize_config.json with `dynamic` set.
void merge(const fs::path& a_dir, const fs::path& b_dir, const fs::path& dst, const nlohmann::json& dynamic) {
  Checkpoint a = Checkpoint::open(a_dir), b = Checkpoint::open(b_dir);
  std::vector<TensorSpec> plan;
  std::vector<std::pair<const Checkpoint*, std::string>> from;
  for (const Checkpoint* c : {&a, &b})
    for (const auto& name : c->tensor_names()) {
      if (c == &b && a.contains(name)) continue;
      const TensorInfo& t = *c->at(name).info;
      plan.push_back({name, t.dtype, t.shape});
      from.push_back({c, name});
    }
  CheckpointWriter w(dst, plan);
  for (const auto& [c, name] : from) w.write(name, c->data(name));
  nlohmann::json qc = a.quantize_config();
  qc["dynamic"] = dynamic;
  w.add_file("quantize_config.json", qc.dump(2));
  w.commit();
}

// An asymmetric two-layer source of `kind` (up_proj and down_proj, 256 x 256).
synth::Options asym_pair(synth::Kind kind, uint64_t seed) {
  synth::Options o;
  o.kind = kind;
  o.sym = false;
  o.seed = seed;
  o.layers = {{"model.layers.0.mlp.up_proj", 256, 256}, {"model.layers.0.mlp.down_proj", 256, 256}};
  return o;
}

// Tensor `name` holds the same bytes in both checkpoints.
void check_same_bytes(const Checkpoint& a, const Checkpoint& b, const std::string& name) {
  INFO(name);
  auto x = a.data(name), y = b.data(name);
  REQUIRE(x.size() == y.size());
  CHECK(std::memcmp(x.data(), y.data(), x.size()) == 0);
}

// Module `p` dequantizes to the same floats in both checkpoints.
void check_same_weights(const Checkpoint& a, const Checkpoint& b, const std::string& p) {
  INFO(p);
  const FormatInfo fa = detect_format(a), fb = detect_format(b);
  auto w0 = dequantize(read_module(a, describe_module(a, p, fa), fa));
  auto w1 = dequantize(read_module(b, describe_module(b, p, fb), fb));
  REQUIRE(w0.size() == w1.size());
  CHECK(std::memcmp(w0.data(), w1.data(), w0.size() * sizeof(float)) == 0);
}

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

TEST_CASE("layers with one scale row do not pull a grouped checkpoint's group_size to -1", "[formats][convert]") {
  TempDir td("onerow");
  synth::Options o;
  // Three layers with k == 128 == group size (one scale row) and one with four groups.
  o.layers = {{"model.layers.0.mlp.up_proj", 128, 256}, {"model.layers.0.mlp.gate_proj", 128, 256},
              {"model.layers.0.self_attn.o_proj", 128, 256}, {"model.layers.0.mlp.down_proj", 512, 256}};
  o.hidden = 128;
  o.seed = 201;
  synth::write_checkpoint(td.path / "src", o);
  for (TargetFormat to : {TargetFormat::Marlin, TargetFormat::GptqV2, TargetFormat::CompressedTensors}) {
    INFO(target_name(to));
    const fs::path out = td.path / target_name(to);
    REQUIRE(run(td.path / "src", out, to).ok);
    Checkpoint ck = Checkpoint::open(out);
    const auto& q = ck.config().at("quantization_config");
    if (to == TargetFormat::CompressedTensors) {
      REQUIRE(q.at("config_groups").size() == 1);
      CHECK(q.at("config_groups").at("group_0").at("weights").at("group_size") == 128);
    } else {
      CHECK(q.at("group_size") == 128);
      CHECK_FALSE(q.contains("dynamic"));
    }
    // A loader sizing every layer's scales from the top-level group size finds what is stored.
    FormatInfo fi = detect_format(ck);
    CHECK(fi.group_size == 128);
    for (const auto& d : describe_modules(ck, fi)) CHECK(d.groups == (d.k + 127) / 128);
    VerifyOptions vo;
    vo.force_cpu = true;
    VerifyReport vr = verify_checkpoint(out, vo);
    INFO(vr.certificate().dump(1));
    CHECK(vr.ok());
  }
  // Only one-row layers: the source's group size (128) wins the tie with -1.
  TempDir td2("onerow2");
  o.layers.pop_back();
  synth::write_checkpoint(td2.path / "src", o);
  REQUIRE(run(td2.path / "src", td2.path / "m", TargetFormat::Marlin).ok);
  CHECK(Checkpoint::open(td2.path / "m").quantize_config().at("group_size") == 128);
}

TEST_CASE("asymmetric checkpoints converted to Marlin verify: the config's sym=false is read", "[formats][convert][verify]") {
  for (auto kind : {synth::Kind::Awq, synth::Kind::GptqV2}) {
    INFO("kind " << int(kind));
    TempDir td("zpverify");
    synth::Options o;
    o.kind = kind;
    o.sym = false;
    o.seed = 211 + uint64_t(kind);
    synth::write_checkpoint(td.path / "src", o);
    REQUIRE(run(td.path / "src", td.path / "m", TargetFormat::Marlin).ok);
    Checkpoint m = Checkpoint::open(td.path / "m");
    REQUIRE(m.quantize_config().at("sym") == false);
    CHECK_FALSE(detect_format(m).sym);
    VerifyOptions vo;
    vo.force_cpu = true;
    VerifyReport vr = verify_checkpoint(td.path / "m", vo);
    INFO(vr.certificate().dump(1));
    CHECK(vr.ok());
    // The reverse is still caught: a config that says sym=true over real zero points.
    fs::path qc = td.path / "m" / "quantize_config.json";
    nlohmann::json j = m.quantize_config();
    j["sym"] = true;
    std::ofstream(qc) << j.dump(2);
    fs::remove(td.path / "m" / "config.json");
    VerifyReport bad = verify_checkpoint(td.path / "m", vo);
    CHECK_FALSE(bad.ok());
  }
}

TEST_CASE("asymmetric GPTQ: uniform zero points decode by the checkpoint's convention, not by guessing", "[formats][convert]") {
  // v1 stores z - 1. A module whose real zero points are all 9 stores 8 everywhere, which in a symmetric
  // checkpoint would read as v2's symmetric 8; in an asymmetric v1 checkpoint it is 9.
  TempDir td("asymv1");
  auto gen = synth::write_checkpoint(td.path / "src0", asym_pair(synth::Kind::GptqV1, 221));
  const std::string p = "model.layers.0.mlp.up_proj";
  const QuantizedLinear& q = gen.layers.at(p);
  std::vector<uint8_t> nine(size_t(q.groups() * q.n), 9);
  copy_with(td.path / "src0", td.path / "src",
            {{p + ".qzeros", bytes_of(gptq::pack_qzeros(nine.data(), q.groups(), q.n, 4, gptq::ZeroFormat::V1))}});
  Checkpoint src = Checkpoint::open(td.path / "src");
  FormatInfo fi = detect_format(src);
  REQUIRE_FALSE(fi.sym);
  ModuleDesc d = describe_module(src, p, fi);
  CHECK(d.format == Format::GptqV1);
  CHECK_FALSE(d.sym);
  QuantizedLinear r = read_module(src, d, fi);
  REQUIRE_FALSE(r.sym);
  CHECK(r.zeros == nine);
  // Through Marlin and back to v1: the stored zeros come back byte for byte.
  REQUIRE(run(td.path / "src", td.path / "m", TargetFormat::Marlin).ok);
  REQUIRE(run(td.path / "m", td.path / "back", TargetFormat::GptqV1).ok);
  check_same_bytes(src, Checkpoint::open(td.path / "back"), p + ".qzeros");
}

TEST_CASE("a Marlin source with a zero point of 0 is refused for GPTQ v1 before writing", "[formats][convert]") {
  TempDir td("z0");
  auto gen = synth::write_checkpoint(td.path / "src0", asym_pair(synth::Kind::Awq, 231));
  const std::string p = "model.layers.0.mlp.up_proj";
  QuantizedLinear q = gen.layers.at(p);
  q.zeros[5] = 0;
  copy_with(td.path / "src0", td.path / "src",
            {{p + ".qzeros", bytes_of(awq::pack_qzeros(q.zeros.data(), q.groups(), q.n, 4))}});
  REQUIRE(run(td.path / "src", td.path / "m", TargetFormat::Marlin).ok);
  ConvertReport r = run(td.path / "m", td.path / "v1", TargetFormat::GptqV1);
  CHECK_FALSE(r.ok);
  REQUIRE(r.incompatible.size() == 1);
  CHECK(r.incompatible[0].prefix == p);
  CHECK(r.incompatible[0].rule.find("zero point of 0") != std::string::npos);
  CHECK_FALSE(fs::exists(td.path / "v1"));
  // --keep-incompatible keeps that layer as plain weights; v2 holds it.
  CHECK(run(td.path / "m", td.path / "v1k", TargetFormat::GptqV1, true).ok);
  CHECK(run(td.path / "m", td.path / "v2", TargetFormat::GptqV2).ok);
}

TEST_CASE("the original Sparse-Marlin meta view [n, k/16] reads, converts and verifies", "[formats][convert][golden]") {
  MARLINC_REQUIRE_SHARED();
  const fs::path golden = test::shared_dir() / "golden" / "marlin24_k256_n256_g128.safetensors";
  REQUIRE(fs::exists(golden));
  Checkpoint g = Checkpoint::open(golden);
  REQUIRE(g.at("meta").info->shape == std::vector<int64_t>{256, 16});  // the original packer's buffer
  TempDir td("meta");
  const std::string p = "model.layers.0.mlp.down_proj";
  for (bool ist_view : {true, false}) {
    INFO("meta view " << (ist_view ? "[n, k/16]" : "[k/32, 2n]"));
    const fs::path src = td.path / (ist_view ? "ist" : "vllm");
    const std::vector<int64_t> mshape = ist_view ? std::vector<int64_t>{256, 16} : std::vector<int64_t>{8, 512};
    std::vector<TensorSpec> plan = {{p + ".B_24", DType::I32, g.at("B_24").info->shape},
                                    {p + ".meta", DType::I16, mshape},
                                    {p + ".s_24", DType::F16, g.at("s_24").info->shape}};
    CheckpointWriter w(src, plan);
    w.write(p + ".B_24", g.data("B_24"));
    w.write(p + ".meta", g.data("meta"));
    w.write(p + ".s_24", g.data("s_24"));
    w.add_file("quantize_config.json",
               R"({"bits": 4, "group_size": 128, "desc_act": false, "sym": true, "checkpoint_format": "marlin_24"})");
    w.commit();
    Checkpoint ck = Checkpoint::open(src);
    FormatInfo fi = detect_format(ck);
    REQUIRE(fi.format == Format::Marlin24);
    QuantizedLinear q = read_module(ck, describe_module(ck, p, fi), fi);
    // The mask and the kept codes are the golden file's (signed q = code - 8).
    auto gq = g.data("q"), gm = g.data("mask");
    REQUIRE(gq.size() == q.codes.size());
    REQUIRE(q.mask.size() == q.codes.size());
    size_t bad = 0;
    for (size_t i = 0; i < q.codes.size(); ++i)
      bad += q.mask[i] != gm[i] || (gm[i] && int(q.codes[i]) - 8 != int(int8_t(gq[i])));
    CHECK(bad == 0);
    VerifyOptions vo;
    vo.force_cpu = true;
    VerifyReport vr = verify_checkpoint(src, vo);
    INFO(vr.certificate().dump(1));
    CHECK(vr.ok());
    REQUIRE(run(src, td.path / (ist_view ? "ist_gptq" : "vllm_gptq"), TargetFormat::GptqV1).ok);
  }
  // Both views give the same GPTQ bytes.
  Checkpoint a = Checkpoint::open(td.path / "ist_gptq"), b = Checkpoint::open(td.path / "vllm_gptq");
  for (const auto& name : a.tensor_names()) check_same_bytes(a, b, name);
}

TEST_CASE("GPTQ-family, AWQ and compressed-tensors configs name the linears left unquantized", "[formats][config]") {
  QuantSummary s;
  s.plain_linears = {"lm_head", "model.layers.0.mlp.gate"};
  s.dequantized = {"model.layers.1.mlp.odd_proj"};
  TargetConfig g = target_config(TargetFormat::GptqV1, nlohmann::json::object(), nlohmann::json::object(), s);
  const auto& dyn = g.config.at("quantization_config").at("dynamic");
  CHECK(dyn.contains("-:^model\\.layers\\.0\\.mlp\\.gate$"));
  CHECK(dyn.contains("-:^model\\.layers\\.1\\.mlp\\.odd_proj$"));
  CHECK_FALSE(dyn.contains("-:^lm_head$"));  // lm_head has its own switch in GPTQ loaders
  TargetConfig c = target_config(TargetFormat::CompressedTensors, nlohmann::json::object(), nlohmann::json::object(), s);
  CHECK(c.config.at("quantization_config").at("ignore") ==
        nlohmann::json({"lm_head", "model.layers.0.mlp.gate", "model.layers.1.mlp.odd_proj"}));
  TargetConfig a = target_config(TargetFormat::Awq, nlohmann::json::object(), nlohmann::json::object(), s);
  CHECK(a.config.at("quantization_config").at("modules_to_not_convert") ==
        nlohmann::json({"lm_head", "model.layers.0.mlp.gate", "model.layers.1.mlp.odd_proj"}));
}

TEST_CASE("asymmetric act-order outputs store zero points and g_idx in every module, as their config says",
          "[formats][convert]") {
  TempDir td("uniform");
  synth::Options o = asym_pair(synth::Kind::GptqV2, 241);
  o.act_order = true;
  auto gen = synth::write_checkpoint(td.path / "src0", o);
  // up_proj: zero points all 8 (symmetric values) and the trivial g_idx; down_proj keeps both.
  const std::string p = "model.layers.0.mlp.up_proj";
  const QuantizedLinear& q = gen.layers.at(p);
  std::vector<uint8_t> eight(size_t(q.groups() * q.n), 8);
  copy_with(td.path / "src0", td.path / "src",
            {{p + ".qzeros", bytes_of(gptq::pack_qzeros(eight.data(), q.groups(), q.n, 4, gptq::ZeroFormat::V2))},
             {p + ".g_idx", bytes_of(gptq::trivial_g_idx(q.k, q.group_size))}});
  Checkpoint src = Checkpoint::open(td.path / "src");
  const ModuleDesc d = describe_module(src, p, detect_format(src));
  REQUIRE(d.sym);
  REQUIRE_FALSE(d.act_order);
  for (TargetFormat to : {TargetFormat::CompressedTensors, TargetFormat::Marlin}) {
    INFO(target_name(to));
    const fs::path out = td.path / target_name(to);
    const ConvertReport r = run(td.path / "src", out, to);
    REQUIRE(r.ok);
    Checkpoint ck = Checkpoint::open(out);
    const bool ct = to == TargetFormat::CompressedTensors;
    bool warned = false;  // compressed-tensors >= 0.20 refuses actorder "group"
    for (const auto& n : r.notes) warned |= n.find("compressed-tensors 0.20") != std::string::npos;
    CHECK(warned == ct);
    for (const auto& [name, _] : gen.layers) {
      INFO(name);
      CHECK(ck.contains(name + (ct ? ".weight_zero_point" : ".qzeros")));
      CHECK(ck.contains(name + (ct ? ".weight_g_idx" : ".g_idx")));
      if (!ct) CHECK(ck.contains(name + ".perm"));
    }
    // Same weights as the source, module by module, and the output verifies.
    CHECK_FALSE(detect_format(ck).sym);
    for (const auto& [name, _] : gen.layers) check_same_weights(src, ck, name);
    VerifyOptions vo;
    vo.force_cpu = true;
    VerifyReport vr = verify_checkpoint(out, vo);
    INFO(vr.certificate().dump(1));
    CHECK(vr.ok());
  }
}

// A group size the config's `dynamic` rules give some modules is no cause for a note, and survives conversion.
TEST_CASE("mixed group sizes (GPTQModel dynamic overrides) raise no note and convert", "[formats][convert]") {
  TempDir td("mixedgroups");
  synth::Options a, b;
  a.seed = 297;
  a.layers = {{"model.layers.0.self_attn.q_proj", 256, 256}};
  b = a;
  b.group = 64;
  b.seed = 298;
  b.layers = {{"model.layers.0.mlp.down_proj", 512, 256}};
  synth::write_checkpoint(td.path / "a", a);
  synth::write_checkpoint(td.path / "b", b);
  merge(td.path / "a", td.path / "b", td.path / "src",
        {{"+:^model\\.layers\\.0\\.mlp\\.down_proj$", {{"group_size", 64}}}});
  const FormatInfo fi = detect_format(Checkpoint::open(td.path / "src"));
  CHECK(fi.group_size == 128);
  CHECK(fi.other_groups == std::set<int>{64});
  INFO(nlohmann::json(fi.notes).dump());
  CHECK(fi.notes.empty());
  REQUIRE(run(td.path / "src", td.path / "m", TargetFormat::Marlin).ok);
  const FormatInfo fm = detect_format(Checkpoint::open(td.path / "m"));
  INFO(nlohmann::json(fm.notes).dump());
  CHECK(fm.notes.empty());
}

TEST_CASE("mixed bit widths (GPTQModel dynamic overrides) convert, read back and verify in every target",
          "[formats][convert]") {
  TempDir td("mixedbits");
  synth::Options o4, o8;
  o4.seed = 251;
  o4.layers = {{"model.layers.0.self_attn.q_proj", 256, 256}, {"model.layers.0.self_attn.o_proj", 256, 256}};
  o8 = o4;
  o8.bits = 8;
  o8.seed = 252;
  o8.layers = {{"model.layers.0.mlp.down_proj", 512, 256}};
  synth::write_checkpoint(td.path / "four", o4);
  synth::write_checkpoint(td.path / "eight", o8);
  merge(td.path / "four", td.path / "eight", td.path / "src",
        {{"+:^model\\.layers\\.0\\.mlp\\.down_proj$", {{"bits", 8}}}});
  Checkpoint src = Checkpoint::open(td.path / "src");
  FormatInfo fs0 = detect_format(src);
  CHECK(fs0.bits == 4);
  CHECK(fs0.other_bits == std::set<int>{8});
  INFO(fs0.notes.size());
  CHECK(fs0.notes.empty());
  for (TargetFormat to : {TargetFormat::CompressedTensors, TargetFormat::GptqV2, TargetFormat::Marlin}) {
    INFO(target_name(to));
    const fs::path out = td.path / target_name(to);
    REQUIRE(run(td.path / "src", out, to).ok);
    Checkpoint ck = Checkpoint::open(out);
    FormatInfo fo = detect_format(ck);
    CHECK(fo.notes.empty());
    for (const auto& d : describe_modules(ck, fo)) {
      INFO(d.prefix);
      CHECK(d.bits == (d.prefix.find("down_proj") != std::string::npos ? 8 : 4));
      check_same_weights(src, ck, d.prefix);
    }
    VerifyOptions vo;
    vo.force_cpu = true;
    VerifyReport vr = verify_checkpoint(out, vo);
    INFO(vr.certificate().dump(1));
    CHECK(vr.ok());
    // And back to GPTQ v1: the source's tensors byte for byte.
    REQUIRE(run(out, td.path / (target_name(to) + "-back"), TargetFormat::GptqV1).ok);
    Checkpoint back = Checkpoint::open(td.path / (target_name(to) + "-back"));
    for (const auto& name : src.tensor_names()) check_same_bytes(src, back, name);
  }
}

TEST_CASE("AWQ and marlin_24 hold one scheme: a module of another group size is incompatible there", "[formats][convert]") {
  // A per-channel module in a group-128 checkpoint (both fit AWQ and Sparse-Marlin one by one).
  TempDir td("awqgroups");
  synth::Options a, b;
  a.kind = b.kind = synth::Kind::GptqV1;
  a.seed = 261;
  a.layers = {{"model.layers.0.self_attn.q_proj", 256, 256}, {"model.layers.0.self_attn.o_proj", 256, 256}};
  b.seed = 262;
  b.group = -1;
  b.layers = {{"model.layers.0.mlp.down_proj", 512, 256}};
  synth::write_checkpoint(td.path / "g128", a);
  synth::write_checkpoint(td.path / "gch", b);
  const std::string odd = "model.layers.0.mlp.down_proj";
  merge(td.path / "g128", td.path / "gch", td.path / "src", {{"+:^model\\.layers\\.0\\.mlp\\.down_proj$", {{"group_size", -1}}}});
  for (TargetFormat to : {TargetFormat::Awq, TargetFormat::Marlin24}) {
    INFO(target_name(to));
    ConvertReport r = run(td.path / "src", td.path / target_name(to), to);
    CHECK_FALSE(r.ok);
    bool named = false;
    for (const auto& m : r.incompatible)
      named |= m.prefix == odd && m.rule.find("one bit width and group size per checkpoint") != std::string::npos;
    CHECK(named);
  }
  // --keep-incompatible: the odd module stays a plain weight and the AWQ config says so.
  REQUIRE(run(td.path / "src", td.path / "awq", TargetFormat::Awq, true).ok);
  Checkpoint ck = Checkpoint::open(td.path / "awq");
  CHECK(ck.contains(odd + ".weight"));
  const auto& q = ck.config().at("quantization_config");
  CHECK(q.at("group_size") == 128);
  CHECK(q.at("modules_to_not_convert") == nlohmann::json({"lm_head", odd}));
  // Targets with per-module overrides take it as it is.
  CHECK(run(td.path / "src", td.path / "gptq", TargetFormat::GptqV2).ok);
}

TEST_CASE("convert refuses a module that lacks a companion tensor instead of passing its pieces through",
          "[formats][convert]") {
  TempDir td("orphan");
  synth::Options o;
  o.kind = synth::Kind::CompressedTensors;
  o.seed = 271;
  o.layers = {{"model.layers.0.mlp.up_proj", 256, 256}, {"model.layers.0.mlp.down_proj", 256, 256}};
  synth::write_checkpoint(td.path / "full", o);
  REQUIRE(run(td.path / "full", td.path / "marlin", TargetFormat::Marlin).ok);
  // `from` without the tensor `dropped`, converted to GPTQ: refused, naming the module's other tensor, nothing written.
  int n = 0;
  auto check_refused = [&](const fs::path& from, const std::string& dropped, const std::string& named) {
    const fs::path src = td.path / ("src" + std::to_string(n)), out = td.path / ("out" + std::to_string(n++));
    copy_edited(from, src, dropped, nullptr);
    const std::string msg = convert_error(src, out, TargetFormat::GptqV1);
    INFO(dropped << ": " << msg);
    CHECK(msg.find(named) != std::string::npos);
    CHECK(msg.find("no complete") != std::string::npos);
    CHECK_FALSE(fs::exists(out));
  };
  check_refused(td.path / "full", "model.layers.0.mlp.up_proj.weight_packed", "model.layers.0.mlp.up_proj.weight_s");
  // Marlin's short leaves: a B without its s, an s without its B.
  check_refused(td.path / "marlin", "model.layers.0.mlp.up_proj.s", "model.layers.0.mlp.up_proj.B");
  check_refused(td.path / "marlin", "model.layers.0.mlp.down_proj.B", "model.layers.0.mlp.down_proj.s");
}

// A quantized module with a bias that is not one float per output column, or with a plain weight beside its
// quantized tensors: convert refuses it naming the tensor, verify fails that layer's structure check.
TEST_CASE("a quantized module's bias of the wrong shape or a plain weight beside it is refused", "[formats][convert]") {
  TempDir td("neighbours");
  synth::Options o;
  o.seed = 277;
  o.layers = {{"model.layers.0.mlp.up_proj", 256, 256}};
  synth::write_checkpoint(td.path / "full", o);
  const std::string p = "model.layers.0.mlp.up_proj";
  int n = 0;
  auto check = [&](const std::string& extra, DType dt, std::vector<int64_t> shape, const std::string& rule) {
    const fs::path src = td.path / ("src" + std::to_string(n)), out = td.path / ("out" + std::to_string(n++));
    const TensorSpec added{extra, dt, shape};
    copy_edited(td.path / "full", src, "", &added);
    const std::string msg = convert_error(src, out, TargetFormat::Marlin);
    INFO(extra << ": " << msg);
    CHECK(msg.find(extra) != std::string::npos);
    CHECK(msg.find(rule) != std::string::npos);
    CHECK_FALSE(fs::exists(out));
    VerifyOptions vo;
    vo.force_cpu = true;
    const VerifyReport vr = verify_checkpoint(src, vo);
    CHECK_FALSE(vr.ok());
    bool named = false;
    for (const auto& L : vr.layers)
      for (const auto& c : L.checks) named |= L.name == p && !c.ok && c.detail.find(rule) != std::string::npos;
    CHECK(named);
  };
  check(p + ".bias", DType::F16, {100}, "one float per output column (n = 256)");
  check(p + ".bias", DType::I32, {256}, "one float per output column");
  check(p + ".bias", DType::F16, {1, 256}, "one float per output column");
  check(p + ".weight", DType::F16, {256, 256}, "a plain weight beside the module's quantized tensors");
}

// A config whose bits disagree with the tensors: the tensors decide, and the report says so.
TEST_CASE("convert notes a config bit width the tensors do not have", "[formats][convert]") {
  TempDir td("bits-note");
  synth::Options o;
  o.seed = 283;
  o.layers = {{"model.layers.0.mlp.up_proj", 256, 256}, {"model.layers.0.mlp.down_proj", 256, 256}};
  synth::write_checkpoint(td.path / "src", o);
  for (const char* f : {"quantize_config.json", "config.json"}) {
    const fs::path p = td.path / "src" / f;
    if (!fs::exists(p)) continue;
    nlohmann::json j = nlohmann::json::parse(std::ifstream(p));
    if (j.contains("quantization_config")) j["quantization_config"]["bits"] = 3;
    else if (j.contains("bits")) j["bits"] = 3;
    std::ofstream(p) << j.dump(2);
  }
  const ConvertReport rep = run(td.path / "src", td.path / "m", TargetFormat::Marlin);
  REQUIRE(rep.ok);
  bool noted = false;
  for (const auto& n : rep.notes)
    noted |= n == "the config says bits = 3 but the tensors hold 4-bit codes, which the conversion keeps (2 modules)";
  INFO(nlohmann::json(rep.notes).dump());
  CHECK(noted);
  CHECK(Checkpoint::open(td.path / "m").quantize_config().at("bits") == 4);
}

// Layers with one scale row, from a GPTQ checkpoint whose group size is their depth (256): per-channel is the same
// layer. A Marlin config says -1, which its loaders accept (they take -1, 32, 64, 128); a GPTQ one keeps 256.
TEST_CASE("one-row layers 256 deep convert to a Marlin config of group -1 and a GPTQ one of 256",
          "[formats][convert]") {
  TempDir td("g256");
  synth::Options o;
  o.seed = 293;
  o.group = 256;
  o.layers = {{"model.layers.0.mlp.up_proj", 256, 256}, {"model.layers.0.mlp.down_proj", 256, 512}};
  synth::write_checkpoint(td.path / "src", o);
  REQUIRE(run(td.path / "src", td.path / "m", TargetFormat::Marlin).ok);
  const Checkpoint m = Checkpoint::open(td.path / "m");
  CHECK(m.quantize_config().at("group_size") == -1);
  CHECK_FALSE(m.quantize_config().contains("dynamic"));
  REQUIRE(run(td.path / "src", td.path / "g", TargetFormat::GptqV1).ok);
  CHECK(Checkpoint::open(td.path / "g").quantize_config().at("group_size") == 256);
  VerifyOptions vo;
  vo.force_cpu = true;
  CHECK(verify_checkpoint(td.path / "m", vo).ok());
}

TEST_CASE("convert keeps the source's quantization record, so verify --reference still reads GPTQ weights as GPTQ",
          "[formats][convert]") {
  TempDir td("record");
  synth::Options o;
  o.seed = 281;
  o.layers = {{"model.layers.0.mlp.up_proj", 256, 256}};
  synth::write_checkpoint(td.path / "src0", o);
  {  // the record `marlinc quantize --method gptq` writes
    Checkpoint ck = Checkpoint::open(td.path / "src0");
    nlohmann::json qc = ck.quantize_config();
    qc["marlinc"] = {{"method", "gptq"}, {"clip", "marlin"}, {"damp", 0.01}};
    copy_with(td.path / "src0", td.path / "src", {});
    std::ofstream(td.path / "src" / "quantize_config.json") << qc.dump(2);
  }
  for (TargetFormat to : {TargetFormat::Marlin, TargetFormat::CompressedTensors, TargetFormat::GptqV2}) {
    INFO(target_name(to));
    REQUIRE(run(td.path / "src", td.path / target_name(to), to).ok);
    const nlohmann::json q = Checkpoint::open(td.path / target_name(to)).quantize_config();
    REQUIRE(q.contains("marlinc"));
    CHECK(q.at("marlinc").at("method") == "gptq");
    CHECK(q.at("marlinc").at("clip") == "marlin");
  }
}

TEST_CASE("keep_incompatible cannot leave plain layers in a marlin_24 output", "[formats][convert]") {
  TempDir td("keep24");
  synth::Options o;
  o.seed = 291;
  o.layers = {{"model.layers.0.mlp.up_proj", 256, 256}, {"model.layers.0.mlp.odd_proj", 256, 64}};  // n % 256
  synth::write_checkpoint(td.path / "src", o);
  std::string msg;
  try {
    run(td.path / "src", td.path / "out", TargetFormat::Marlin24, true);
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK(msg.find("model.layers.0.mlp.odd_proj: --keep-incompatible would leave it as plain weights") == 0);
  CHECK_FALSE(fs::exists(td.path / "out"));
}
