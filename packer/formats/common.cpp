#include "packer/formats/common.h"

#include <algorithm>

#include "packer/gptq.h"

namespace marlinc::fmt {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? sep : "") + parts[i];
  return s;
}

const TensorInfo& need(const Checkpoint& ck, const std::string& name, DType dt, size_t rank, const std::string& fmt) {
  auto r = ck.find(name);
  if (!r) bad_data(ck.source().string() + ": " + name + ": missing; the " + fmt + " format needs it");
  const TensorInfo& t = *r->info;
  if (t.dtype != dt)
    bad_data(name + ": dtype " + std::string(dtype_name(t.dtype)) + ", the " + fmt + " format stores it as " +
             std::string(dtype_name(dt)));
  if (t.shape.size() != rank)
    bad_data(name + ": shape " + shape_str(t.shape) + " has rank " + std::to_string(t.shape.size()) + ", the " + fmt +
             " format needs rank " + std::to_string(rank));
  return t;
}

const TensorInfo& need_scales(const Checkpoint& ck, const std::string& name, size_t rank, const std::string& fmt) {
  auto r = ck.find(name);
  if (!r) bad_data(ck.source().string() + ": " + name + ": missing; the " + fmt + " format needs it");
  const TensorInfo& t = *r->info;
  if (t.dtype != DType::F16 && t.dtype != DType::BF16)
    bad_data(name + ": scales of dtype " + std::string(dtype_name(t.dtype)) + "; only F16 and BF16 scales are supported");
  if (t.shape.size() != rank)
    bad_data(name + ": shape " + shape_str(t.shape) + " has rank " + std::to_string(t.shape.size()) + ", the " + fmt +
             " format needs rank " + std::to_string(rank));
  return t;
}

ScaleType scale_type_of(DType dt) {
  if (dt == DType::BF16) return ScaleType::BF16;
  if (dt == DType::F16) return ScaleType::F16;
  bad_data("scale dtype " + std::string(dtype_name(dt)) + " is neither F16 nor BF16");
}

DType dtype_of(ScaleType st) { return st == ScaleType::BF16 ? DType::BF16 : DType::F16; }

uint64_t tensor_bytes(const Checkpoint& ck, const std::vector<std::string>& names) {
  uint64_t b = 0;
  for (const auto& nm : names) b += ck.at(nm).info->nbytes();
  return b;
}

int group_size_from_rows(int64_t k, int64_t groups, const std::string& what) {
  if (groups <= 0) bad_data(what + ": scales have no rows");
  if (groups == 1) return -1;
  if (k % groups != 0)
    bad_data(what + ": " + std::to_string(groups) + " scale rows do not divide k = " + std::to_string(k) +
             " into equal groups");
  return int(k / groups);
}

std::vector<uint8_t> real_zeros(const QuantizedLinear& q) {
  if (!q.sym) return q.zeros;
  return std::vector<uint8_t>(size_t(q.groups() * q.n), uint8_t(1u << (q.bits - 1)));
}

bool all_mid(const std::vector<uint8_t>& z, int bits) {
  const uint8_t mid = uint8_t(1u << (bits - 1));
  return std::all_of(z.begin(), z.end(), [&](uint8_t v) { return v == mid; });
}

QuantizedLinear layer_of(const ModuleDesc& d) {
  return QuantizedLinear{.name = d.prefix, .k = d.k, .n = d.n, .bits = d.bits, .group_size = d.group_size,
                         .sym = true, .codes = {}, .scales = {}, .scale_type = d.scale_type, .zeros = {},
                         .g_idx = {}, .mask = {}};
}

void describe_g_idx(const Checkpoint& ck, const TensorInfo& g, ModuleDesc& d) {
  if (g.shape[0] != d.k)
    bad_data(g.name + ": " + std::to_string(g.shape[0]) + " entries, expected k = " + std::to_string(d.k));
  auto gi = copy_as<int32_t>(ck, g.name);
  try {
    gptq::validate_g_idx(gi.data(), d.k, d.groups);
  } catch (const Error& e) {
    bad_data(g.name + ": " + e.what());
  }
  d.act_order = !gptq::is_trivial_g_idx(gi.data(), d.k, d.group_size);
  d.tensors.push_back(g.name);
}

}  // namespace marlinc::fmt
