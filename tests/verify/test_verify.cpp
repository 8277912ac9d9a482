// marlinc verify: a clean checkpoint passes, and each corruption from the issue is caught and named.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/error.h"
#include "checkpoint/half.h"
#include "checkpoint/writer.h"
#include "packer/adapters.h"
#include "tests/common.h"
#include "verify/verify.h"

using namespace marlinc;
namespace fs = std::filesystem;

namespace {

struct Layer {
  std::string name;
  int64_t n, k;  // HF weight [n, k]
};
const std::vector<Layer> kLayers = {{"model.layers.0.self_attn.q_proj", 256, 256},
                                    {"model.layers.0.self_attn.k_proj", 256, 256},
                                    {"model.layers.0.self_attn.v_proj", 256, 256},
                                    {"model.layers.0.mlp.down_proj", 256, 512}};

std::vector<float> random_weights(const Layer& l, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 0.02f);
  std::vector<float> w(size_t(l.n * l.k));
  for (auto& x : w) x = half_to_float(float_to_half(d(rng)));  // exactly representable in fp16
  return w;
}

// Round-to-nearest symmetric 4-bit with group 128 (2:4: keep the 2 largest of every 4 along k first).
QuantizedLinear rtn(const Layer& l, const std::vector<float>& w, bool sparse24) {
  QuantizedLinear q;
  q.name = l.name; q.k = l.k; q.n = l.n; q.bits = 4; q.group_size = 128;
  q.codes.assign(size_t(l.k * l.n), 8);
  q.scales.resize(size_t(q.groups() * l.n));
  if (sparse24) q.mask.assign(size_t(l.k * l.n), 0);
  for (int64_t c = 0; c < l.n; ++c) {
    if (sparse24)
      for (int64_t g = 0; g < l.k / 4; ++g) {
        int idx[4] = {0, 1, 2, 3};
        std::sort(idx, idx + 4, [&](int a, int b) {
          return std::fabs(w[size_t(c * l.k + 4 * g + a)]) > std::fabs(w[size_t(c * l.k + 4 * g + b)]);
        });
        q.mask[size_t((4 * g + idx[0]) * l.n + c)] = q.mask[size_t((4 * g + idx[1]) * l.n + c)] = 1;
      }
    for (int64_t g = 0; g < q.groups(); ++g) {
      float amax = 0;
      for (int64_t r = g * 128; r < (g + 1) * 128; ++r) amax = std::max(amax, std::fabs(w[size_t(c * l.k + r)]));
      uint16_t s16 = float_to_half(amax / 7.5f);
      q.scales[size_t(g * l.n + c)] = s16;
      float s = half_to_float(s16);
      for (int64_t r = g * 128; r < (g + 1) * 128; ++r) {
        if (sparse24 && !q.mask[size_t(r * l.n + c)]) continue;
        float code = std::nearbyint(w[size_t(c * l.k + r)] / s) + 8;
        code = std::clamp(code, sparse24 ? 1.f : 0.f, 15.f);
        if (sparse24 && code == 8) code = w[size_t(c * l.k + r)] >= 0 ? 9 : 7;  // a kept weight stays non-zero
        q.codes[size_t(r * l.n + c)] = uint8_t(code);
      }
    }
  }
  return q;
}

void write_reference(const fs::path& dir) {
  std::vector<TensorSpec> plan;
  for (auto& l : kLayers) plan.push_back({l.name + ".weight", DType::F16, {l.n, l.k}});
  CheckpointWriter w(dir, plan);
  for (size_t i = 0; i < kLayers.size(); ++i) {
    auto f = random_weights(kLayers[i], 100 + i);
    std::vector<uint16_t> h(f.size());
    float_to_half_n(f.data(), h.data(), f.size());
    w.write(kLayers[i].name + ".weight", {reinterpret_cast<const uint8_t*>(h.data()), h.size() * 2});
  }
  w.add_file("config.json", "{\"architectures\": [\"LlamaForCausalLM\"]}\n");
  w.commit();
}

// bf16_scales: the scales stored as bf16 (a bf16 model's output), times scale_factor.
// edit: changes the packed modules before they are written (shapes included).
void write_quantized(const fs::path& dir, TargetFormat t, WriterOptions opts = {}, bool bf16_scales = false,
                     float scale_factor = 1.f,
                     const std::function<void(std::vector<std::vector<PackedTensor>>&)>& edit = {}) {
  const bool sparse = t == TargetFormat::Marlin24;
  std::vector<std::vector<PackedTensor>> mods;
  std::vector<TensorSpec> plan;
  for (size_t i = 0; i < kLayers.size(); ++i) {
    QuantizedLinear q = rtn(kLayers[i], random_weights(kLayers[i], 100 + i), sparse);
    if (bf16_scales) {
      for (auto& s : q.scales) s = float_to_bf16(half_to_float(s) * scale_factor);
      q.scale_type = ScaleType::BF16;
    }
    mods.push_back(write_module(t, q));
  }
  if (edit) edit(mods);
  for (auto& m : mods)
    for (auto& p : m) plan.push_back(p.spec);
  CheckpointWriter w(dir, plan, opts);
  for (auto& m : mods)
    for (auto& p : m) w.write(p.spec.name, p.bytes);
  QuantSummary s;
  TargetConfig cfg = target_config(t, nlohmann::json{{"architectures", {"LlamaForCausalLM"}}}, nlohmann::json::object(), s);
  w.add_file("config.json", cfg.config.dump(2) + "\n");
  if (cfg.quantize_config) w.add_file("quantize_config.json", cfg.quantize_config->dump(2) + "\n");
  w.commit();
}

// Patches bytes of one tensor in place (the file is rewritten with the same length).
void patch_tensor(const fs::path& dir, const std::string& name, const std::function<void(uint8_t*, size_t)>& edit) {
  uint64_t offset = 0, len = 0;
  fs::path file;
  {
    Checkpoint ck = Checkpoint::open(dir);
    auto r = ck.at(name);
    file = r.file->path();
    std::span<const uint8_t> d = r.file->data(*r.info);
    std::ifstream in(file, std::ios::binary);
    uint64_t hlen = 0;
    in.read(reinterpret_cast<char*>(&hlen), 8);
    offset = 8 + hlen + r.info->begin;
    len = d.size();
  }
  std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
  std::vector<uint8_t> buf(len);
  f.seekg(std::streamoff(offset));
  f.read(reinterpret_cast<char*>(buf.data()), std::streamsize(len));
  edit(buf.data(), len);
  f.seekp(std::streamoff(offset));
  f.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(len));
}

// Rewrites the quantization keys of config.json / quantize_config.json wherever they stand.
void edit_quant_configs(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  for (const char* f : {"config.json", "quantize_config.json"}) {
    fs::path p = dir / f;
    if (!fs::exists(p)) continue;
    std::ifstream in(p);
    nlohmann::json j = nlohmann::json::parse(in);
    if (f == std::string("quantize_config.json")) edit(j);
    else if (j.contains("quantization_config")) edit(j["quantization_config"]);
    std::ofstream(p) << j.dump(2);
  }
}

const LayerReport* layer(const VerifyReport& r, const std::string& name) {
  for (auto& l : r.layers)
    if (l.name == name) return &l;
  return nullptr;
}
std::string failed_checks(const LayerReport& l) {
  std::string s;
  for (auto& c : l.checks)
    if (!c.ok) s += c.name + ": " + c.detail + "\n";
  return s;
}

}  // namespace

TEST_CASE("a clean Marlin checkpoint verifies, with and without the reference", "[verify]") {
  test::TempDir tmp("verify-clean");
  write_reference(tmp.path / "fp");
  write_quantized(tmp.path / "q", TargetFormat::Marlin);
  VerifyOptions opt;
  VerifyReport r = verify_checkpoint(tmp.path / "q", opt);
  INFO(r.certificate().dump(1));
  CHECK(r.ok());
  REQUIRE(r.layers.size() == kLayers.size());
  CHECK(r.format == "marlin");
  opt.reference = tmp.path / "fp";
  VerifyReport rr = verify_checkpoint(tmp.path / "q", opt);
  INFO(rr.certificate().dump(1));
  CHECK(rr.ok());
  for (auto& l : rr.layers) {
    CHECK(l.output_rel_err > 0);
    CHECK(l.output_rel_err < 0.2);  // 4-bit RTN on Gaussian weights: about 0.1
  }
  // The certificate re-checks clean, and names a tensor whose bytes change.
  nlohmann::json cert = rr.certificate();
  CHECK(check_certificate(tmp.path / "q", cert).empty());
  patch_tensor(tmp.path / "q", "model.layers.0.mlp.down_proj.s", [](uint8_t* p, size_t) { p[0] ^= 1; });
  auto problems = check_certificate(tmp.path / "q", cert);
  REQUIRE(!problems.empty());
  bool named = false;
  for (auto& p : problems) named |= p.find("model.layers.0.mlp.down_proj.s") != std::string::npos;
  CHECK(named);
}

TEST_CASE("bf16 scales run the bf16 kernel's numerics: bf16 activations, their gate, no fp16 overflow", "[verify]") {
  // A bf16 model's Marlin output (bf16 scales) runs the bf16 kernel, whose weights (q - 8) * s and
  // outputs are bf16. Scales 2^18 times larger give weights of std ~5000 and outputs of std ~50000 over
  // 256-512 deep sums, many past fp16's 65504, which bf16 holds (fp16 numerics would give inf there).
  test::TempDir tmp("verify-bf16");
  for (float factor : {1.f, 4096.f * 64.f}) {
    write_quantized(tmp.path / "q", TargetFormat::Marlin, {}, true, factor);
    VerifyOptions opt;
    opt.force_cpu = true;
    VerifyReport r = verify_checkpoint(tmp.path / "q", opt);
    INFO("scale factor " << factor << "\n" << r.certificate().dump(1));
    CHECK(r.ok());
    double worst = 0;
    for (const auto& l : r.layers) {
      CHECK(l.activations == "bf16");
      for (const auto& a : l.arith) {
        CHECK(a.finite);
        worst = std::max(worst, a.mean_rel_err);
      }
      for (const auto& c : l.checks)
        if (c.name == "arithmetic") CHECK(c.detail.find("bf16 activations") != std::string::npos);
    }
    // Above fp16's gate (bf16 rounds at 2^-9, not 2^-12) and within bf16's.
    CHECK(worst > VerifyTolerances{}.arith_mean_rel_dense);  // measured 2.1e-3: fp16's gate would fail it
    CHECK(worst <= VerifyTolerances{}.arith_mean_rel_bf16);
    const nlohmann::json cert = r.certificate();
    CHECK(cert["tolerances"]["arith_mean_rel_bf16"] == VerifyTolerances{}.arith_mean_rel_bf16);
    CHECK(cert["layers"][0]["activations"] == "bf16");
    fs::remove_all(tmp.path / "q");
  }
  // The fp16 checkpoint keeps fp16 activations.
  write_quantized(tmp.path / "q16", TargetFormat::Marlin);
  VerifyOptions opt;
  opt.force_cpu = true;
  VerifyReport r16 = verify_checkpoint(tmp.path / "q16", opt);
  CHECK(r16.ok());
  for (const auto& l : r16.layers) CHECK(l.activations == "fp16");
}

TEST_CASE("a flipped high bit in B is caught against the reference and named", "[verify]") {
  test::TempDir tmp("verify-bitflip");
  write_reference(tmp.path / "fp");
  write_quantized(tmp.path / "q", TargetFormat::Marlin);
  // Bit 3 of nibble 0 of word 77: the code moves by 8 steps.
  patch_tensor(tmp.path / "q", "model.layers.0.self_attn.k_proj.B", [](uint8_t* p, size_t) { p[4 * 77] ^= 0x08; });
  VerifyOptions opt;
  opt.reference = tmp.path / "fp";
  VerifyReport r = verify_checkpoint(tmp.path / "q", opt);
  CHECK(!r.ok());
  const LayerReport* l = layer(r, "model.layers.0.self_attn.k_proj");
  REQUIRE(l);
  CHECK(!l->ok());
  CHECK(failed_checks(*l).find("quantization steps") != std::string::npos);
  CHECK(layer(r, "model.layers.0.self_attn.q_proj")->ok());
}

TEST_CASE("the step gate holds in layers that round to nearest, whatever the config says", "[verify]") {
  // GPTQ's error feedback moves many weights a step or more by design, a few several; a layer that
  // rounds to nearest moves almost none. Which kind a layer is comes from its data: a config saying
  // damp_percent (a GPTQ tool's key) does not lift the gate from a round-to-nearest layer, and a layer
  // with a tenth of its codes moved by one (simulated error feedback) is reported, not gated.
  test::TempDir tmp("verify-gptq-tool");
  write_reference(tmp.path / "fp");
  write_quantized(tmp.path / "q", TargetFormat::GptqV1);
  const std::string qw = "model.layers.0.self_attn.k_proj.qweight";
  patch_tensor(tmp.path / "q", qw, [](uint8_t* p, size_t) { p[4 * 77] ^= 0x08; });
  edit_quant_configs(tmp.path / "q", [](nlohmann::json& q) { q["damp_percent"] = 0.01; });
  VerifyOptions opt;
  opt.reference = tmp.path / "fp";
  auto reference_check = [&] {
    const VerifyReport r = verify_checkpoint(tmp.path / "q", opt);
    const LayerReport* l = layer(r, "model.layers.0.self_attn.k_proj");
    REQUIRE(l);
    for (const auto& c : l->checks)
      if (c.name == "reference") return std::pair{c, l->far_fraction};
    FAIL("no reference check");
    return std::pair{CheckResult{}, 0.0};
  };
  const auto [gated, near_fraction] = reference_check();
  INFO(gated.detail);
  CHECK(!gated.ok);
  CHECK(gated.detail.find("quantization steps") != std::string::npos);
  CHECK(near_fraction < 0.02);
  patch_tensor(tmp.path / "q", qw, [](uint8_t* p, size_t bytes) {
    for (size_t w = 0; w < bytes / 4; w += 10) p[4 * w] ^= 0x11, p[4 * w + 1] ^= 0x11, p[4 * w + 2] ^= 0x11, p[4 * w + 3] ^= 0x11;
  });
  const auto [reported, far_fraction] = reference_check();
  INFO(reported.detail);
  CHECK(reported.ok);
  CHECK(reported.detail.find("steps not gated") != std::string::npos);
  CHECK(far_fraction > 0.05);
}

TEST_CASE("swapped scale columns are caught against the reference and named", "[verify]") {
  test::TempDir tmp("verify-scales");
  write_reference(tmp.path / "fp");
  write_quantized(tmp.path / "q", TargetFormat::Marlin);
  // Swap stored columns 0 and 5 of row 0 of the permuted scales, then make them differ for sure by
  // also doubling one (a swap of equal scales would be harmless).
  patch_tensor(tmp.path / "q", "model.layers.0.self_attn.v_proj.s", [](uint8_t* p, size_t) {
    uint16_t* s = reinterpret_cast<uint16_t*>(p);
    std::swap(s[0], s[5]);
    s[0] = float_to_half(half_to_float(s[0]) * 3.f);
  });
  VerifyOptions opt;
  opt.reference = tmp.path / "fp";
  VerifyReport r = verify_checkpoint(tmp.path / "q", opt);
  const LayerReport* l = layer(r, "model.layers.0.self_attn.v_proj");
  REQUIRE(l);
  INFO(failed_checks(*l));
  CHECK(!l->ok());
  CHECK(failed_checks(*l).find("reference") != std::string::npos);
}

TEST_CASE("a 2:4 metadata nibble with its positions swapped fails the structure check", "[verify]") {
  test::TempDir tmp("verify-meta");
  write_quantized(tmp.path / "q", TargetFormat::Marlin24);
  REQUIRE(verify_checkpoint(tmp.path / "q", {}).ok());
  // Nibble idx0 | idx1 << 2 with idx0 < idx1: swapping the two 2-bit fields makes positions decrease.
  patch_tensor(tmp.path / "q", "model.layers.0.mlp.down_proj.B_meta", [](uint8_t* p, size_t) {
    uint8_t nib = p[10] & 0xf;
    uint8_t swapped = uint8_t(((nib & 3) << 2) | (nib >> 2));
    p[10] = uint8_t((p[10] & 0xf0) | swapped);
  });
  VerifyReport r = verify_checkpoint(tmp.path / "q", {});
  const LayerReport* l = layer(r, "model.layers.0.mlp.down_proj");
  REQUIRE(l);
  INFO(failed_checks(*l));
  CHECK(!l->ok());
  CHECK(failed_checks(*l).find("structure") != std::string::npos);
}

TEST_CASE("a wrong group size in the config fails verification", "[verify]") {
  test::TempDir tmp("verify-group");
  write_quantized(tmp.path / "q", TargetFormat::GptqV1);
  REQUIRE(verify_checkpoint(tmp.path / "q", {}).ok());
  edit_quant_configs(tmp.path / "q", [](nlohmann::json& q) { q["group_size"] = 64; });
  VerifyReport r = verify_checkpoint(tmp.path / "q", {});
  CHECK(!r.ok());
  std::string all;
  for (auto& l : r.layers) all += failed_checks(l);
  for (auto& p : r.global_problems) all += p + "\n";
  INFO(all);
  CHECK(all.find("group") != std::string::npos);
}

TEST_CASE("GPTQ v2 zero points labelled v1 fail verification", "[verify]") {
  test::TempDir tmp("verify-v2");
  write_quantized(tmp.path / "q", TargetFormat::GptqV2);
  REQUIRE(verify_checkpoint(tmp.path / "q", {}).ok());
  edit_quant_configs(tmp.path / "q", [](nlohmann::json& q) { q["checkpoint_format"] = "gptq"; });
  VerifyReport r = verify_checkpoint(tmp.path / "q", {});
  CHECK(!r.ok());
  std::string all;
  for (auto& p : r.global_problems) all += p + "\n";
  INFO(all);
  CHECK(all.find("v2") != std::string::npos);
}

namespace {

// One quantization-config edit on a freshly written checkpoint that verified: verify must fail, and its
// problems must contain `expect`.
struct ConfigEdit { TargetFormat fmt; const char* key; nlohmann::json value; std::string expect; };
void check_config_edit_fails(const ConfigEdit& c) {
  test::TempDir tmp("verify-config-edit");
  write_quantized(tmp.path / "q", c.fmt);
  REQUIRE(verify_checkpoint(tmp.path / "q", {}).ok());
  edit_quant_configs(tmp.path / "q", [&](nlohmann::json& q) { q[c.key] = c.value; });
  const VerifyReport r = verify_checkpoint(tmp.path / "q", {});
  std::string all;
  for (auto& p : r.global_problems) all += p + "\n";
  INFO(c.key << " = " << c.value.dump() << ": " << all);
  CHECK(!r.ok());
  CHECK(all.find(c.expect) != std::string::npos);
}

}  // namespace

// A known key with the wrong JSON type used to read as absent: the tensors' values were taken and the
// checkpoint certified, although loaders that trust the config fail on it.
TEST_CASE("a quantization-config key of the wrong type fails verification, naming the key", "[verify]") {
  const std::vector<ConfigEdit> cases = {
      {TargetFormat::GptqV1, "bits", "4", "config key bits"},
      {TargetFormat::GptqV1, "sym", 1, "config key sym"},
      {TargetFormat::GptqV1, "desc_act", "false", "config key desc_act"},
      {TargetFormat::GptqV1, "group_size", 1.5, "config key group_size"},
      {TargetFormat::Marlin, "checkpoint_format", 7, "config key checkpoint_format"},
      {TargetFormat::GptqV1, "quant_method", nlohmann::json::object(), "config key quant_method"}};
  for (const ConfigEdit& c : cases) check_config_edit_fails(c);
}

// Right-typed but impossible values used to read as the tensors' own ("bits": 0 fell back to 4 bits).
TEST_CASE("an out-of-range quantization-config value fails verification, naming the key", "[verify]") {
  const std::vector<ConfigEdit> cases = {
      {TargetFormat::GptqV1, "bits", 0, "config key bits"},
      {TargetFormat::GptqV1, "bits", int64_t(1) << 62, "config key bits"},
      {TargetFormat::GptqV1, "bits", 5, "config key bits"},
      {TargetFormat::GptqV1, "group_size", 0, "config key group_size"},
      {TargetFormat::GptqV1, "group_size", -7, "config key group_size"},
      {TargetFormat::GptqV1, "group_size", uint64_t(1) << 63, "config key group_size"},
      {TargetFormat::Marlin, "bits", 8, "config says bits 8"}};
  for (const ConfigEdit& c : cases) check_config_edit_fails(c);
}

TEST_CASE("a missing shard is an error naming the shard", "[verify]") {
  test::TempDir tmp("verify-shard");
  WriterOptions opts;
  opts.max_shard_bytes = 64 * 1024;
  write_quantized(tmp.path / "q", TargetFormat::Marlin, opts);
  REQUIRE(verify_checkpoint(tmp.path / "q", {}).ok());
  fs::path victim;
  for (auto& e : fs::directory_iterator(tmp.path / "q"))
    if (e.path().filename().string().find("-00002-of-") != std::string::npos) victim = e.path();
  REQUIRE(!victim.empty());
  fs::remove(victim);
  try {
    verify_checkpoint(tmp.path / "q", {});
    FAIL("verify accepted a checkpoint with a missing shard");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find(victim.filename().string()) != std::string::npos);
  }
}

// Loaders pick their kernel from the label: a label naming another format fails.
TEST_CASE("a format label that names another format fails verification", "[verify]") {
  const std::vector<ConfigEdit> cases = {
      {TargetFormat::Marlin, "checkpoint_format", "marlin_24", "config label"},
      {TargetFormat::Marlin24, "checkpoint_format", "marlin", "config label"},
      {TargetFormat::GptqV1, "checkpoint_format", "marlin", "config label"},
      {TargetFormat::Marlin, "quant_method", "awq", "config label"}};
  for (const ConfigEdit& c : cases) check_config_edit_fails(c);
}

TEST_CASE("config.json and quantize_config.json disagreeing on bits fails verification", "[verify]") {
  test::TempDir tmp("verify-two-configs");
  write_quantized(tmp.path / "q", TargetFormat::GptqV1);
  {  // only config.json changes: transformers and vLLM read it, the GPTQ tools read quantize_config.json
    std::ifstream in(tmp.path / "q" / "config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["quantization_config"]["bits"] = 8;
    std::ofstream(tmp.path / "q" / "config.json") << j.dump(2);
  }
  const VerifyReport r = verify_checkpoint(tmp.path / "q", {});
  std::string all;
  for (auto& p : r.global_problems) all += p + "\n";
  INFO(all);
  CHECK(!r.ok());
  CHECK(all.find("quantize_config.json says bits = 4 but config.json:quantization_config says 8") != std::string::npos);
}

TEST_CASE("a certificate of a failed verification, or of fewer config files, does not re-check ok", "[verify]") {
  test::TempDir tmp("verify-cert-fail");
  write_quantized(tmp.path / "q", TargetFormat::Marlin);
  const nlohmann::json good = verify_checkpoint(tmp.path / "q", {}).certificate();
  REQUIRE(check_certificate(tmp.path / "q", good).empty());
  // A config file that appears later changes how loaders read the tensors.
  std::ofstream(tmp.path / "q" / "quant_config.json") << R"({"bits": 8})";
  auto added = check_certificate(tmp.path / "q", good);
  REQUIRE(added.size() == 1);
  CHECK(added[0].find("quant_config.json was added") != std::string::npos);
  // Certified while failing: re-checking the same files must not say ok.
  const VerifyReport bad = verify_checkpoint(tmp.path / "q", {});
  REQUIRE(!bad.ok());
  auto again = check_certificate(tmp.path / "q", bad.certificate());
  REQUIRE(again.size() == 1);
  CHECK(again[0].find("records a failed verification") != std::string::npos);
}

TEST_CASE("one module that cannot be read fails alone, naming its tensor, while the others are still checked", "[verify]") {
  test::TempDir tmp("verify-one-bad");
  write_quantized(tmp.path / "q", TargetFormat::GptqV1);
  patch_tensor(tmp.path / "q", "model.layers.0.self_attn.k_proj.g_idx", [](uint8_t* p, size_t) { p[0] = 9; });
  const VerifyReport r = verify_checkpoint(tmp.path / "q", {});
  REQUIRE(r.layers.size() == kLayers.size());
  const LayerReport* k = layer(r, "model.layers.0.self_attn.k_proj");
  REQUIRE(k != nullptr);
  CHECK(!k->ok());
  CHECK(failed_checks(*k).find("model.layers.0.self_attn.k_proj.g_idx") != std::string::npos);
  for (auto& l : r.layers)
    if (l.name != k->name) CHECK(l.ok());
}

TEST_CASE("GPTQ modules with wrong shapes fail alone and do not turn the checkpoint into AWQ", "[verify]") {
  // Found by a docs audit: a module's wrong qzeros (or qweight) shape stopped the whole run with one
  // error, no layer table and no certificate; a qweight of AWQ's width in the first module made the
  // format AWQ.
  test::TempDir tmp("verify-bad-shapes");
  auto narrow = [](PackedTensor& t, int64_t cols) {  // keep the first `cols` columns of a 2-D int32 tensor
    const int64_t rows = t.spec.shape[0], old = t.spec.shape[1];
    std::vector<uint8_t> b(size_t(rows * cols * 4));
    for (int64_t r = 0; r < rows; ++r) std::memcpy(b.data() + r * cols * 4, t.bytes.data() + r * old * 4, size_t(cols * 4));
    t.bytes = std::move(b);
    t.spec.shape[1] = cols;
  };
  write_quantized(tmp.path / "q", TargetFormat::GptqV1, {}, false, 1.f, [&](std::vector<std::vector<PackedTensor>>& mods) {
    for (auto& t : mods[1])
      if (t.spec.name == "model.layers.0.self_attn.k_proj.qzeros") narrow(t, 1);
    for (auto& t : mods[3])
      if (t.spec.name == "model.layers.0.mlp.down_proj.qweight") narrow(t, t.spec.shape[1] / 8);
  });
  const VerifyReport r = verify_checkpoint(tmp.path / "q", {});
  CHECK(r.format == "gptq-v1");
  REQUIRE(r.layers.size() == kLayers.size());
  for (const char* bad : {"model.layers.0.self_attn.k_proj", "model.layers.0.mlp.down_proj"}) {
    const LayerReport* l = layer(r, bad);
    REQUIRE(l != nullptr);
    CHECK(!l->ok());
    CHECK(failed_checks(*l).find(std::string(bad) + (l->name.find("k_proj") != std::string::npos ? ".qzeros" : ".qweight")) !=
          std::string::npos);
  }
  for (auto& l : r.layers)
    if (l.name.find("k_proj") == std::string::npos && l.name.find("down_proj") == std::string::npos) CHECK(l.ok());
}

TEST_CASE("act-order g_idx under a config that says desc_act false fails verification", "[verify]") {
  test::TempDir tmp("verify-desc-act");
  write_quantized(tmp.path / "q", TargetFormat::GptqV1);
  // Swap two rows' groups in one g_idx: a valid act-order g_idx (the codes stay as they are).
  patch_tensor(tmp.path / "q", "model.layers.0.mlp.down_proj.g_idx", [](uint8_t* p, size_t) {
    int32_t a, b;
    std::memcpy(&a, p, 4);
    std::memcpy(&b, p + 4 * 200, 4);
    std::memcpy(p, &b, 4);
    std::memcpy(p + 4 * 200, &a, 4);
  });
  const VerifyReport r = verify_checkpoint(tmp.path / "q", {});
  CHECK(!r.ok());
  const LayerReport* d = layer(r, "model.layers.0.mlp.down_proj");
  REQUIRE(d != nullptr);
  CHECK(failed_checks(*d).find("config says no act-order") != std::string::npos);
}

TEST_CASE("a reference with a NaN fails that layer by name, and reference errors repeat to the digit", "[verify]") {
  test::TempDir tmp("verify-nan-ref");
  write_reference(tmp.path / "fp");
  write_quantized(tmp.path / "q", TargetFormat::Marlin);
  VerifyOptions opt;
  opt.reference = tmp.path / "fp";
  const VerifyReport a = verify_checkpoint(tmp.path / "q", opt), b = verify_checkpoint(tmp.path / "q", opt);
  REQUIRE(a.layers.size() == b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) CHECK(a.layers[i].output_rel_err == b.layers[i].output_rel_err);
  CHECK(a.certificate().at("options").at("reference") == (tmp.path / "fp").string());
  patch_tensor(tmp.path / "fp", "model.layers.0.self_attn.q_proj.weight", [](uint8_t* p, size_t) {
    const uint16_t nan = 0x7e00;
    std::memcpy(p + 2 * 5, &nan, 2);
  });
  const VerifyReport r = verify_checkpoint(tmp.path / "q", opt);
  const LayerReport* q = layer(r, "model.layers.0.self_attn.q_proj");
  REQUIRE(q != nullptr);
  CHECK(!q->ok());
  CHECK(failed_checks(*q).find("model.layers.0.self_attn.q_proj.weight[0, 5] is not finite") != std::string::npos);
}

TEST_CASE("the original packer's Sparse-Marlin golden file verifies as it is (root-level meta and s_24)", "[verify][golden]") {
  MARLINC_REQUIRE_SHARED();
  const VerifyReport r = verify_checkpoint(test::shared_dir() / "golden" / "marlin24_k256_n256_g128.safetensors", {});
  INFO(r.certificate().dump(1));
  CHECK(r.ok());
  REQUIRE(r.layers.size() == 1);
}

// Against the reference, whatever the file says of itself: every scale of one layer scaled up shows
// in the whole-layer error against a naive round-to-nearest's and in the scales against the original
// groups' min-max scales; the clean layers sit near both yardsticks.
TEST_CASE("scaled scales fail against the naive round-to-nearest and the min-max scales", "[verify]") {
  test::TempDir tmp("verify-scaled");
  write_reference(tmp.path / "fp");
  write_quantized(tmp.path / "q", TargetFormat::Marlin);
  VerifyOptions opt;
  opt.reference = tmp.path / "fp";
  const VerifyReport clean = verify_checkpoint(tmp.path / "q", opt);
  REQUIRE(clean.ok());
  for (const auto& l : clean.layers) {
    // Plain margins: Catch2 v2 and v3 spell Approx differently.
    CHECK(std::abs(l.weight_rel_err / l.naive_rel_err - 1.0) <= 0.05);  // the test's RTN is the naive one
    CHECK(std::abs(l.scale_ratio - 1.0) <= 0.01);
    CHECK(l.far_fraction < 0.02);
  }
  for (float factor : {2.f, 1.4f}) {
    const fs::path q = tmp.path / std::to_string(int(factor * 10));
    write_quantized(q, TargetFormat::Marlin);
    patch_tensor(q, "model.layers.0.mlp.down_proj.s", [&](uint8_t* p, size_t bytes) {
      uint16_t* s = reinterpret_cast<uint16_t*>(p);
      for (size_t i = 0; i < bytes / 2; ++i) s[i] = float_to_half(half_to_float(s[i]) * factor);
    });
    const VerifyReport r = verify_checkpoint(q, opt);
    const LayerReport* d = layer(r, "model.layers.0.mlp.down_proj");
    REQUIRE(d);
    INFO("x" << factor << ": " << failed_checks(*d));
    CHECK(!d->ok());
    CHECK(failed_checks(*d).find("min-max scales") != std::string::npos);
    if (factor == 2.f) CHECK(failed_checks(*d).find("naive round-to-nearest") != std::string::npos);
    CHECK(layer(r, "model.layers.0.self_attn.q_proj")->ok());
  }
}

TEST_CASE("a negative scale fails the structure check, without the reference", "[verify]") {
  test::TempDir tmp("verify-negative");
  write_quantized(tmp.path / "q", TargetFormat::Marlin);
  patch_tensor(tmp.path / "q", "model.layers.0.self_attn.v_proj.s", [](uint8_t* p, size_t) { p[2 * 3 + 1] ^= 0x80; });
  const VerifyReport r = verify_checkpoint(tmp.path / "q", {});
  const LayerReport* v = layer(r, "model.layers.0.self_attn.v_proj");
  REQUIRE(v);
  CHECK(failed_checks(*v).find("is negative") != std::string::npos);
  CHECK(!r.ok());
}

// Checkpoint-wide: a reference tensor with no counterpart, a pass-through tensor that changed, a stray
// *.safetensors beside the checkpoint's file, a directory without a quantization config.
TEST_CASE("missing or changed tensors and stray files and a missing config are problems", "[verify]") {
  test::TempDir tmp("verify-global");
  write_quantized(tmp.path / "q", TargetFormat::Marlin);
  // A reference with one more linear (absent from q) and a norm weight that q holds changed.
  std::vector<TensorSpec> plan;
  for (auto& l : kLayers) plan.push_back({l.name + ".weight", DType::F16, {l.n, l.k}});
  plan.push_back({"model.layers.1.self_attn.q_proj.weight", DType::F16, {256, 256}});
  plan.push_back({"model.norm.weight", DType::F16, {256}});
  {
    CheckpointWriter w(tmp.path / "fp", plan);
    for (size_t i = 0; i < kLayers.size(); ++i) {
      auto f = random_weights(kLayers[i], 100 + i);
      std::vector<uint16_t> h(f.size());
      float_to_half_n(f.data(), h.data(), f.size());
      w.write(kLayers[i].name + ".weight", {reinterpret_cast<const uint8_t*>(h.data()), h.size() * 2});
    }
    std::vector<uint16_t> extra(256 * 256, float_to_half(0.01f)), norm(256, float_to_half(1.f));
    w.write("model.layers.1.self_attn.q_proj.weight", {reinterpret_cast<const uint8_t*>(extra.data()), extra.size() * 2});
    w.write("model.norm.weight", {reinterpret_cast<const uint8_t*>(norm.data()), norm.size() * 2});
    w.add_file("config.json", "{\"architectures\": [\"LlamaForCausalLM\"]}\n");
    w.commit();
  }
  VerifyOptions opt;
  opt.reference = tmp.path / "fp";
  auto problems = [&] {
    std::string all;
    for (const auto& p : verify_checkpoint(tmp.path / "q", opt).global_problems) all += p + "\n";
    return all;
  };
  std::string p = problems();
  INFO(p);
  CHECK(p.find("reference tensor model.layers.1.self_attn.q_proj.weight is missing") != std::string::npos);
  CHECK(p.find("reference tensor model.norm.weight is missing") != std::string::npos);
  CHECK(p.find("stray file") == std::string::npos);
  CHECK(p.find("no quantization config") == std::string::npos);
  fs::copy_file(tmp.path / "q" / "model.safetensors", tmp.path / "q" / "extra.safetensors");
  fs::remove(tmp.path / "q" / "quantize_config.json");
  {
    std::ofstream(tmp.path / "q" / "config.json") << "{\"architectures\": [\"LlamaForCausalLM\"]}\n";
  }
  p = problems();
  CHECK(p.find("stray file extra.safetensors") != std::string::npos);
  CHECK(p.find("no quantization config") != std::string::npos);
}

TEST_CASE("act-order groups must hold group_size rows each", "[verify]") {
  test::TempDir tmp("verify-gidx-rows");
  write_quantized(tmp.path / "q", TargetFormat::GptqV1);
  patch_tensor(tmp.path / "q", "model.layers.0.mlp.down_proj.g_idx", [](uint8_t* p, size_t bytes) { std::memset(p, 0, bytes); });
  edit_quant_configs(tmp.path / "q", [](nlohmann::json& q) { q["desc_act"] = true; });
  const VerifyReport r = verify_checkpoint(tmp.path / "q", {});
  const LayerReport* d = layer(r, "model.layers.0.mlp.down_proj");
  REQUIRE(d);
  CHECK(failed_checks(*d).find("g_idx gives group 0 512 rows, not group_size 128") != std::string::npos);
  // A valid act-order g_idx (rows 0 and 200 trade groups) under a config without desc_act, which loaders
  // read as false: a problem. With desc_act true it verifies.
  write_quantized(tmp.path / "a", TargetFormat::GptqV1);
  patch_tensor(tmp.path / "a", "model.layers.0.mlp.down_proj.g_idx", [](uint8_t* p, size_t) {
    const int32_t one = 1, zero = 0;
    std::memcpy(p, &one, 4);
    std::memcpy(p + 4 * 200, &zero, 4);
  });
  edit_quant_configs(tmp.path / "a", [](nlohmann::json& q) { q.erase("desc_act"); });
  std::string all;
  for (const auto& p : verify_checkpoint(tmp.path / "a", {}).global_problems) all += p + "\n";
  INFO(all);
  CHECK(all.find("config has no desc_act but g_idx is not k // group_size") != std::string::npos);
  edit_quant_configs(tmp.path / "a", [](nlohmann::json& q) { q["desc_act"] = true; });
  CHECK(verify_checkpoint(tmp.path / "a", {}).ok());
}

// Config keys that send loaders elsewhere than the tensors: each is a problem; desc_act over a trivial
// g_idx (GPTQ's static groups) is not.
TEST_CASE("config labels and skip rules and act-order keys that disagree with the tensors", "[verify]") {
  test::TempDir tmp("verify-labels");
  struct Case {
    TargetFormat t;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;  // nullptr: verifies
  };
  const std::vector<Case> cases = {
      {TargetFormat::GptqV1, [](nlohmann::json& q) { q["quant_method"] = "bitsandbytes"; }, "config label"},
      {TargetFormat::GptqV1, [](nlohmann::json& q) { q["quant_method"] = "marlin"; }, "config label"},
      {TargetFormat::Awq, [](nlohmann::json& q) { q["version"] = "gemv"; }, "AWQ version \"gemv\""},
      {TargetFormat::Awq, [](nlohmann::json& q) { q["quant_method"] = "gptq"; }, "config label"},
      {TargetFormat::Marlin, [](nlohmann::json& q) { q["dynamic"] = {{"-:.*q_proj", nlohmann::json::object()}}; },
       "skips quantizing model.layers.0.self_attn.q_proj"},
      {TargetFormat::CompressedTensors, [](nlohmann::json& q) { q["ignore"] = {"model.layers.0.mlp.down_proj"}; },
       "leaves model.layers.0.mlp.down_proj unquantized"},
      {TargetFormat::CompressedTensors, [](nlohmann::json& q) { q["format"] = "marlin-24"; }, "config label"},
      {TargetFormat::GptqV1, [](nlohmann::json& q) { q["desc_act"] = true; }, nullptr},
  };
  int i = 0;
  for (const Case& c : cases) {
    const fs::path q = tmp.path / std::to_string(i++);
    write_quantized(q, c.t);
    edit_quant_configs(q, c.edit);
    const VerifyReport r = verify_checkpoint(q, {});
    std::string all;
    for (const auto& p : r.global_problems) all += p + "\n";
    INFO("case " << i << ": " << all);
    if (!c.expect) {
      CHECK(r.ok());
      continue;
    }
    CHECK(!r.ok());
    CHECK(all.find(c.expect) != std::string::npos);
  }
}
