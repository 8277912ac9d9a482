// Dispatch over formats: describe/read a module by its source format, and the target rules, plans
// and writers by target. The per-format code lives in gptq_adapter.cpp, marlin_adapter.cpp,
// ct_adapter.cpp.
#include <algorithm>
#include <set>

#include "checkpoint/half.h"
#include "packer/adapters.h"
#include "packer/formats/common.h"

namespace marlinc {

using fmt::tname;

ModuleDesc describe_module(const Checkpoint& ck, const std::string& prefix, const FormatInfo& fi) {
  switch (fi.format) {
    case Format::GptqV1:
    case Format::GptqV2: return describe_gptq(ck, prefix, fi);
    case Format::Marlin: return describe_marlin(ck, prefix);
    case Format::Marlin24: return describe_marlin24(ck, prefix);
    case Format::Awq: return describe_awq(ck, prefix, fi);
    case Format::CompressedTensorsPack: return describe_compressed_tensors(ck, prefix, fi);
    case Format::CompressedTensorsMarlin24: return describe_ct_marlin24(ck, prefix);
    default: break;
  }
  bad_data(ck.source().string() + ": " + prefix + ": no adapter reads format " + format_name(fi.format));
}

void check_module_neighbours(const Checkpoint& ck, const ModuleDesc& d) {
  if (auto b = ck.find(d.prefix + ".bias")) {
    const TensorInfo& t = *b->info;
    const bool float_type = t.dtype == DType::F16 || t.dtype == DType::BF16 || t.dtype == DType::F32;
    if (t.shape.size() != 1 || t.shape[0] != d.n || !float_type)
      bad_data(ck.source().string() + ": " + t.name + ": " + std::string(dtype_name(t.dtype)) + " " +
               fmt::shape_str(t.shape) + ", but the quantized module's bias holds one float per output column (n = " +
               std::to_string(d.n) + ")");
  }
  if (ck.contains(d.prefix + ".weight"))
    bad_data(ck.source().string() + ": " + d.prefix + ".weight: a plain weight beside the module's quantized tensors "
             "(a layer is either quantized or plain)");
}

std::vector<ModuleDesc> describe_modules(const Checkpoint& ck, const FormatInfo& fi) {
  std::vector<ModuleDesc> out;
  for (const auto& p : quantized_modules(ck, fi.format)) {
    out.push_back(describe_module(ck, p, fi));
    check_module_neighbours(ck, out.back());
  }
  return out;
}

QuantizedLinear read_module(const Checkpoint& ck, const ModuleDesc& d, const FormatInfo& fi) {
  switch (d.format) {
    case Format::GptqV1:
    case Format::GptqV2: return read_gptq(ck, d.prefix, fi);
    case Format::Marlin: return read_marlin(ck, d.prefix, fi);
    case Format::Marlin24: return read_marlin24(ck, d.prefix, fi);
    case Format::Awq: return read_awq(ck, d.prefix, fi);
    case Format::CompressedTensorsPack: return read_compressed_tensors(ck, d.prefix, fi);
    case Format::CompressedTensorsMarlin24: return read_ct_marlin24(ck, d.prefix, fi);
    default: break;
  }
  bad_data(d.prefix + ": no adapter reads format " + format_name(d.format));
}

std::string target_rule(TargetFormat t, const ModuleDesc& d) {
  const int pf = 32 / d.bits;  // codes per int32 word
  const int group = d.groups == 1 ? -1 : d.group_size;
  auto kn = [&] { return " (k = " + std::to_string(d.k) + ", n = " + std::to_string(d.n) + ")"; };
  switch (t) {
    case TargetFormat::Marlin: {
      MarlinRuleCheck c = marlin_compatible(d.k, d.n, group, d.bits, false);
      if (!c.ok) return c.rule;
      if (!d.sym && d.bits != 4)
        return "Marlin zero points exist for 4-bit codes only (vLLM type uint4); this layer is " +
               std::to_string(d.bits) + "-bit asymmetric";
      return "";
    }
    case TargetFormat::Marlin24: {
      MarlinRuleCheck c = marlin_compatible(d.k, d.n, group, d.bits, true);
      if (!c.ok) return c.rule;
      if (!d.sym) return "Sparse-Marlin stores symmetric codes only; this layer has zero points";
      if (d.act_order) return "Sparse-Marlin has no act-order (g_idx); re-quantize with static groups";
      return "";
    }
    case TargetFormat::GptqV1:
    case TargetFormat::GptqV2:
      if (d.k % pf != 0) return "GPTQ qweight packs " + std::to_string(pf) + " rows per int32: k % " + std::to_string(pf) + " == 0" + kn();
      if (d.n % pf != 0) return "GPTQ qzeros pack " + std::to_string(pf) + " columns per int32: n % " + std::to_string(pf) + " == 0" + kn();
      if (t == TargetFormat::GptqV1 && !d.sym && d.min_zero == 0)
        return "GPTQ v1 stores zero - 1, so a zero point of 0 overflows (formats.md §4.3); use --to gptq_v2";
      return "";
    case TargetFormat::CompressedTensors:
      if (!d.sym && d.n % pf != 0)
        return "compressed-tensors weight_zero_point packs " + std::to_string(pf) + " rows of n per int32: n % " +
               std::to_string(pf) + " == 0" + kn();
      return "";
    case TargetFormat::Awq:
      if (d.bits != 4) return "AWQ GEMM packs 4-bit codes only; this layer is " + std::to_string(d.bits) + "-bit";
      if (d.n % 8 != 0) return "AWQ packs 8 columns per int32: n % 8 == 0" + kn();
      if (d.act_order) return "AWQ has no g_idx (act-order); use --to gptq or marlin";
      return "";
  }
  return "";
}

bool is_quant_leaf(const std::string& tensor_name, bool short_names) {
  static const std::set<std::string> kDistinct = {
      "qweight",       "qzeros",       "g_idx",        "B_24",         "B_meta",            "s_24",
      "weight_packed", "weight_scale", "weight_shape", "weight_g_idx", "weight_zero_point", "scale_packed"};
  static const std::set<std::string> kShort = {"B", "s", "scales", "meta", "perm"};
  const std::string leaf = split_tensor_name(tensor_name).leaf;
  return kDistinct.count(leaf) > 0 || (short_names && kShort.count(leaf) > 0);
}

std::string target_rule_tp(TargetFormat t, const ModuleDesc& d, int tp, const TpHeads& heads) {
  if (tp <= 1) return "";
  const std::string at = "tensor parallel " + std::to_string(tp) + ": ";
  const TpShard s = tp_shard(d.prefix, d.k, d.n, tp, heads);
  if (!s.error.empty()) return at + s.error;
  ModuleDesc part = d;
  part.k = s.k, part.n = s.n;
  if (d.groups > 1) {  // each rank holds whole groups of its k rows (vLLM refuses a split group)
    if (s.k % d.group_size != 0)
      return at + "group size " + std::to_string(d.group_size) + " does not divide one rank's k = " + std::to_string(s.k) +
             " (" + std::to_string(d.k) + " / " + std::to_string(tp) + ", row-parallel)";
    part.groups = s.k / d.group_size;
  }
  const std::string rule = target_rule(t, part);
  return rule.empty() ? "" : at + "one rank's " + tp_split_name(s.split) + "-parallel part: " + rule;
}

namespace {

// Whether the module stores zero points / g_idx in target t under the checkpoint-wide layout.
bool stores_zero_points(TargetFormat t, bool sym, int bits, ModuleLayout l) {
  return !sym || (l.zero_points && (t == TargetFormat::CompressedTensors || (t == TargetFormat::Marlin && bits == 4)));
}
bool stores_g_idx(TargetFormat t, bool act_order, ModuleLayout l) {
  return act_order || (l.g_idx && (t == TargetFormat::CompressedTensors || t == TargetFormat::Marlin));
}

}  // namespace

std::vector<TensorSpec> plan_module(TargetFormat t, const ModuleDesc& d, ModuleLayout layout) {
  const DType sd = fmt::dtype_of(d.scale_type);
  const bool zp = stores_zero_points(t, d.sym, d.bits, layout), gi = stores_g_idx(t, d.act_order, layout);
  const int64_t G = d.groups, k = d.k, n = d.n, b = d.bits;
  const std::string& p = d.prefix;
  switch (t) {
    case TargetFormat::Marlin: {
      std::vector<TensorSpec> v = {{tname(p, "B"), DType::I32, {k / 16, n * b / 2}}, {tname(p, "s"), sd, {G, n}}};
      if (zp) v.push_back({tname(p, "qzeros"), DType::I32, {G, n * b / 32}});
      if (gi) {
        v.push_back({tname(p, "g_idx"), DType::I32, {k}});
        v.push_back({tname(p, "perm"), DType::I32, {k}});
      }
      return v;
    }
    case TargetFormat::Marlin24:  // fp16 scales whatever the source's (write_marlin24)
      return {{tname(p, "B_24"), DType::I32, {k / 32, n * b / 2}},
              {tname(p, "B_meta"), DType::I16, {k / 32, 2 * n}},
              {tname(p, "s"), DType::F16, {G, n}}};
    case TargetFormat::GptqV1:
    case TargetFormat::GptqV2:
      return {{tname(p, "qweight"), DType::I32, {k * b / 32, n}},
              {tname(p, "qzeros"), DType::I32, {G, n * b / 32}},
              {tname(p, "scales"), sd, {G, n}},
              {tname(p, "g_idx"), DType::I32, {k}}};
    case TargetFormat::CompressedTensors: {
      const int64_t pf = 32 / b;
      std::vector<TensorSpec> v = {{tname(p, "weight_packed"), DType::I32, {n, (k + pf - 1) / pf}},
                                   {tname(p, "weight_scale"), sd, {n, G}},
                                   {tname(p, "weight_shape"), DType::I64, {2}}};
      if (zp) v.push_back({tname(p, "weight_zero_point"), DType::I32, {(n + pf - 1) / pf, G}});
      if (gi) v.push_back({tname(p, "weight_g_idx"), DType::I32, {k}});
      return v;
    }
    case TargetFormat::Awq:
      return {{tname(p, "qweight"), DType::I32, {k, n * b / 32}},
              {tname(p, "qzeros"), DType::I32, {G, n * b / 32}},
              {tname(p, "scales"), sd, {G, n}}};
  }
  return {};
}

std::vector<PackedTensor> write_module(TargetFormat t, const QuantizedLinear& q, ModuleLayout layout) {
  if (t == TargetFormat::Marlin24) return write_marlin24(q, layout.recorded_24_positions);
  // Dense targets store every weight: pruned 2:4 positions become the zero code, which dequantizes to 0.
  const QuantizedLinear* src = &q;
  QuantizedLinear dense;
  if (!q.mask.empty()) {
    dense = q;
    dense.mask.clear();
    for (int64_t r = 0; r < q.k; ++r)
      for (int64_t c = 0; c < q.n; ++c)
        if (!q.mask[size_t(r * q.n + c)]) dense.codes[size_t(r * q.n + c)] = uint8_t(q.zero_of(r, c));
    src = &dense;
  }
  // A symmetric module in an asymmetric output: its zero points, all 2^(bits-1), are stored explicitly.
  if (q.sym && stores_zero_points(t, true, q.bits, layout)) {
    if (src != &dense) dense = q, src = &dense;
    dense.sym = false;
    dense.zeros.assign(size_t(q.groups() * q.n), uint8_t(1u << (q.bits - 1)));
  }
  const bool force_g_idx = stores_g_idx(t, false, layout);
  switch (t) {
    case TargetFormat::Marlin: return write_marlin(*src, force_g_idx);
    case TargetFormat::GptqV1: return write_gptq(*src, false);
    case TargetFormat::GptqV2: return write_gptq(*src, true);
    case TargetFormat::CompressedTensors: return write_compressed_tensors(*src, force_g_idx);
    case TargetFormat::Awq: return write_awq(*src);
    case TargetFormat::Marlin24: break;
  }
  return {};
}

TensorSpec dequantized_spec(const ModuleDesc& d) {
  return {tname(d.prefix, "weight"), fmt::dtype_of(d.scale_type), {d.n, d.k}};
}

PackedTensor write_dequantized(const QuantizedLinear& q) {
  std::vector<uint16_t> w(size_t(q.n * q.k));  // [n, k], HF nn.Linear orientation
  const bool bf = q.scale_type == ScaleType::BF16;
#pragma omp parallel for schedule(static)
  for (long long c = 0; c < q.n; ++c)
    for (int64_t r = 0; r < q.k; ++r) {
      const float v = q.weight(r, c);  // (q - z) * s: exact in fp32 (<= 8-bit code x 11-bit mantissa)
      w[size_t(c * q.k + r)] = float_to_word16(v, bf);
    }
  return fmt::make_tensor(tname(q.name, "weight"), fmt::dtype_of(q.scale_type), {q.n, q.k}, w);
}

}  // namespace marlinc
