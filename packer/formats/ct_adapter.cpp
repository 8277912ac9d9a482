// compressed-tensors pack-quantized adapter (formats.md §6.1): HF orientation [n, k], so scales and
// zero points are transposed relative to GPTQ; `weight_shape` carries the unpadded [n, k].
#include <algorithm>
#include <optional>

#include "packer/formats/common.h"
#include "packer/gptq.h"

namespace marlinc {

using fmt::need;
using fmt::need_scales;
using fmt::tname;

ModuleDesc describe_compressed_tensors(const Checkpoint& ck, const std::string& prefix, const FormatInfo& fi) {
  ModuleDesc d;
  d.prefix = prefix;
  d.format = Format::CompressedTensorsPack;
  const std::string f = "compressed-tensors pack-quantized";
  const TensorInfo& wp = need(ck, tname(prefix, "weight_packed"), DType::I32, 2, f);
  const TensorInfo& ws = need_scales(ck, tname(prefix, "weight_scale"), 2, f);
  d.n = wp.shape[0];
  d.groups = ws.shape[1];
  d.bits = fi.bits > 0 ? fi.bits : 4;
  d.tensors = {wp.name, ws.name};
  const std::string shape_name = tname(prefix, "weight_shape");
  std::optional<int64_t> true_k;
  if (auto r = ck.find(shape_name)) {
    const TensorInfo& t = *r->info;
    if ((t.dtype == DType::I64 || t.dtype == DType::I32) && t.numel() == 2)
      true_k = t.dtype == DType::I64 ? fmt::copy_as<int64_t>(ck, shape_name)[1] : fmt::copy_as<int32_t>(ck, shape_name)[1];
  }
  // A module of another scheme (mixed bit widths) has its own width, which its shapes fix.
  if (true_k) d.bits = ct_module_bits(*true_k, wp.shape[1], d.bits);
  if (d.bits != 4 && d.bits != 8)
    bad_data(wp.name + ": " + std::to_string(d.bits) + "-bit compressed-tensors; only 4- and 8-bit layers convert");
  const int64_t pf = 32 / d.bits;
  if (auto r = ck.find(shape_name)) {
    const TensorInfo& t = *r->info;
    if ((t.dtype != DType::I64 && t.dtype != DType::I32) || t.numel() != 2)
      bad_data(shape_name + ": dtype " + std::string(dtype_name(t.dtype)) + " shape " + fmt::shape_str(t.shape) +
               ", expected two I64 (or I32) values [n, k]");
    int64_t v[2];
    if (t.dtype == DType::I64) {
      auto s = fmt::copy_as<int64_t>(ck, shape_name);
      v[0] = s[0], v[1] = s[1];
    } else {
      auto s = fmt::copy_as<int32_t>(ck, shape_name);
      v[0] = s[0], v[1] = s[1];
    }
    if (v[0] != d.n || (v[1] + pf - 1) / pf != wp.shape[1])
      bad_data(shape_name + ": [" + std::to_string(v[0]) + ", " + std::to_string(v[1]) + "] does not match " + wp.name +
               " " + fmt::shape_str(wp.shape) + " (expected [n, ceil(k/" + std::to_string(pf) + ")])");
    d.k = v[1];
    d.tensors.push_back(shape_name);
  } else {
    d.k = wp.shape[1] * pf;
  }
  if (ws.shape[0] != d.n)
    bad_data(ws.name + ": shape " + fmt::shape_str(ws.shape) + ", expected [n = " + std::to_string(d.n) + ", G]");
  d.group_size = fmt::group_size_from_rows(d.k, d.groups, ws.name);
  d.scale_type = fmt::scale_type_of(ws.dtype);
  const std::string zname = tname(prefix, "weight_zero_point");
  if (ck.contains(zname)) {
    const TensorInfo& zt = need(ck, zname, DType::I32, 2, f);
    if (zt.shape[0] != (d.n + pf - 1) / pf || zt.shape[1] != d.groups)
      bad_data(zname + ": shape " + fmt::shape_str(zt.shape) + ", expected [ceil(n/" + std::to_string(pf) + "), G] = [" +
               std::to_string((d.n + pf - 1) / pf) + ", " + std::to_string(d.groups) + "]");
    auto zp = fmt::copy_as<int32_t>(ck, zname);
    auto z = ct::unpack_zero_point(zp.data(), d.groups, d.n, d.bits);
    d.sym = fmt::all_mid(z, d.bits);
    if (!d.sym) d.min_zero = *std::min_element(z.begin(), z.end());
    d.tensors.push_back(zname);
  }
  const std::string gname = tname(prefix, "weight_g_idx");
  if (ck.contains(gname)) fmt::describe_g_idx(ck, need(ck, gname, DType::I32, 1, f), d);
  d.stored_bytes = fmt::tensor_bytes(ck, d.tensors);
  return d;
}

QuantizedLinear read_compressed_tensors(const Checkpoint& ck, const std::string& prefix, const FormatInfo& fi) {
  ModuleDesc d = describe_compressed_tensors(ck, prefix, fi);
  QuantizedLinear q = fmt::layer_of(d);
  fmt::TensorData<int32_t> wp(ck, tname(prefix, "weight_packed"));  // [n, ceil(k/pf)]
  q.codes = ct::unpack_weight(wp.data(), d.k, d.n, d.bits);
  auto ws = fmt::copy_as<uint16_t>(ck, tname(prefix, "weight_scale"));  // [n, G]
  q.scales = fmt::transpose(ws.data(), d.n, d.groups);                   // [G, n]
  if (!d.sym) {
    auto zp = fmt::copy_as<int32_t>(ck, tname(prefix, "weight_zero_point"));  // [ceil(n/pf), G]
    q.sym = false;
    q.zeros = ct::unpack_zero_point(zp.data(), d.groups, d.n, d.bits);
  }
  if (d.act_order) q.g_idx = fmt::copy_as<int32_t>(ck, tname(prefix, "weight_g_idx"));
  // Codes come from unpacking (in range by construction), sizes from describe_*, g_idx and zero points
  // were range-checked there: the O(k*n) QuantizedLinear::validate() is skipped on this hot path.
  return q;
}

std::vector<PackedTensor> write_compressed_tensors(const QuantizedLinear& q, bool force_g_idx) {
  const int64_t G = q.groups(), pf = 32 / q.bits;
  std::vector<PackedTensor> out;
  out.push_back(fmt::make_tensor(tname(q.name, "weight_packed"), DType::I32, {q.n, (q.k + pf - 1) / pf},
                                 ct::pack_weight(q.codes.data(), q.k, q.n, q.bits)));
  out.push_back(fmt::make_tensor(tname(q.name, "weight_scale"), fmt::dtype_of(q.scale_type), {q.n, G},
                                 fmt::transpose(q.scales.data(), G, q.n)));
  out.push_back(fmt::make_tensor(tname(q.name, "weight_shape"), DType::I64, {2}, std::vector<int64_t>{q.n, q.k}));
  if (!q.sym)
    out.push_back(fmt::make_tensor(tname(q.name, "weight_zero_point"), DType::I32, {(q.n + pf - 1) / pf, G},
                                   ct::pack_zero_point(q.zeros.data(), G, q.n, q.bits)));
  if (!q.trivial_g_idx() || force_g_idx)
    out.push_back(fmt::make_tensor(tname(q.name, "weight_g_idx"), DType::I32, {q.k},
                                   q.g_idx.empty() ? gptq::trivial_g_idx(q.k, q.group_size) : q.g_idx));
  return out;
}

}  // namespace marlinc
