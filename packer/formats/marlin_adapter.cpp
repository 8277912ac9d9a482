// Dense Marlin (`<p>.B`, `<p>.s`; formats.md §1) and Sparse-Marlin 2:4 (`<p>.B_24`, `<p>.B_meta`,
// `<p>.s`; §3) adapters, plus compressed-tensors marlin-24 (§6.2, read only). marlinc extensions to
// the dense format (docs/FORMATS.md): `<p>.qzeros` (Marlin zero-point layout, §1.8) for asymmetric
// layers and `<p>.g_idx` (sorted) + `<p>.perm` for act-order layers, the way vLLM holds them in memory.
#include <algorithm>

#include "checkpoint/half.h"
#include "packer/formats/common.h"
#include "packer/gptq.h"
#include "packer/marlin.h"

namespace marlinc {

using fmt::need;
using fmt::need_scales;
using fmt::tname;

namespace {

// Bits from the packed width: 4-bit packs 8 codes per word ([k/16, 2n]), 8-bit 4 ([k/16, 4n]).
int bits_from_width(int64_t cols, int64_t n, const std::string& tensor) {
  if (cols == 2 * n) return 4;
  if (cols == 4 * n) return 8;
  bad_data(tensor + ": " + std::to_string(cols) + " columns fit neither 4-bit (2n = " + std::to_string(2 * n) +
           ") nor 8-bit (4n = " + std::to_string(4 * n) + ") packing for n = " + std::to_string(n) + " from the scales");
}

// Validates that perm is a permutation of 0..k-1 and sorted_g is non-decreasing; throws naming the tensor.
void check_act_order(const std::vector<int32_t>& perm, const std::vector<int32_t>& sorted_g, int64_t k,
                     const std::string& prefix) {
  std::vector<uint8_t> seen(size_t(k), 0);
  for (int64_t j = 0; j < k; ++j) {
    int32_t r = perm[size_t(j)];
    if (r < 0 || r >= k || seen[size_t(r)])
      bad_data(tname(prefix, "perm") + ": entry " + std::to_string(j) + " = " + std::to_string(r) +
               " is out of range or repeated (must be a permutation of 0.." + std::to_string(k - 1) + ")");
    seen[size_t(r)] = 1;
    if (j > 0 && sorted_g[size_t(j)] < sorted_g[size_t(j - 1)])
      bad_data(tname(prefix, "g_idx") + ": not sorted at entry " + std::to_string(j) +
               " (the Marlin act-order extension stores g_idx in the permuted, non-decreasing order)");
  }
}

struct MarlinTensors {
  std::string B, s, zp, g_idx, perm;
};

}  // namespace

// ---- dense Marlin ---------------------------------------------------------------------------------

ModuleDesc describe_marlin(const Checkpoint& ck, const std::string& prefix) {
  ModuleDesc d;
  d.prefix = prefix;
  d.format = Format::Marlin;
  const TensorInfo& B = need(ck, tname(prefix, "B"), DType::I32, 2, "marlin");
  const TensorInfo& s = need_scales(ck, tname(prefix, "s"), 2, "marlin");
  d.n = s.shape[1];
  d.groups = s.shape[0];
  d.k = 16 * B.shape[0];
  d.bits = bits_from_width(B.shape[1], d.n, B.name);
  d.group_size = fmt::group_size_from_rows(d.k, d.groups, s.name);
  d.scale_type = fmt::scale_type_of(s.dtype);
  d.tensors = {B.name, s.name};
  if (auto z = ck.find(tname(prefix, "qzeros"))) {
    const TensorInfo& zi = need(ck, z->info->name, DType::I32, 2, "marlin zero-point");
    if (zi.shape[0] != d.groups || zi.shape[1] * 32 != d.n * d.bits)
      bad_data(zi.name + ": shape " + fmt::shape_str(zi.shape) + ", the Marlin zero-point layout needs [" +
               std::to_string(d.groups) + ", " + std::to_string(d.n * d.bits / 32) + "]");
    auto packed = fmt::copy_as<int32_t>(ck, zi.name);
    auto z8 = marlin::unpack_zero_points(packed.data(), d.groups, d.n, d.bits);
    d.sym = fmt::all_mid(z8, d.bits);
    if (!d.sym) d.min_zero = *std::min_element(z8.begin(), z8.end());  // GPTQ v1 cannot store 0 (§4.3)
    d.tensors.push_back(zi.name);
  }
  const bool has_g = ck.contains(tname(prefix, "g_idx")), has_p = ck.contains(tname(prefix, "perm"));
  if (has_g != has_p)
    bad_data(prefix + ": marlin act-order extension needs both " + tname(prefix, "g_idx") + " and " +
             tname(prefix, "perm") + "; found only " + (has_g ? "g_idx" : "perm"));
  if (has_g) {
    const TensorInfo& g = need(ck, tname(prefix, "g_idx"), DType::I32, 1, "marlin act-order");
    const TensorInfo& p = need(ck, tname(prefix, "perm"), DType::I32, 1, "marlin act-order");
    if (g.shape[0] != d.k || p.shape[0] != d.k)
      bad_data(prefix + ": g_idx/perm hold " + std::to_string(g.shape[0]) + "/" + std::to_string(p.shape[0]) +
               " entries, expected k = " + std::to_string(d.k));
    auto perm = fmt::copy_as<int32_t>(ck, p.name);
    for (int64_t j = 0; j < d.k && !d.act_order; ++j) d.act_order = perm[size_t(j)] != j;
    if (!d.act_order) {
      auto gs = fmt::copy_as<int32_t>(ck, g.name);
      for (int64_t j = 0; j < d.k && !d.act_order; ++j)
        d.act_order = gs[size_t(j)] != (d.group_size <= 0 ? 0 : j / d.group_size);
    }
    d.tensors.push_back(g.name);
    d.tensors.push_back(p.name);
  }
  d.stored_bytes = fmt::tensor_bytes(ck, d.tensors);
  return d;
}

QuantizedLinear read_marlin(const Checkpoint& ck, const std::string& prefix, const FormatInfo&) {
  ModuleDesc d = describe_marlin(ck, prefix);
  QuantizedLinear q = fmt::layer_of(d);
  fmt::TensorData<int32_t> B(ck, tname(prefix, "B"));  // [k/16, n*bits/2]
  q.codes = marlin::unpack_weights(B.data(), d.k, d.n, d.bits);
  auto s = fmt::copy_as<uint16_t>(ck, tname(prefix, "s"));  // [G, n] permuted
  q.scales = marlin::unpermute_scales(s.data(), d.groups, d.n);
  if (ck.contains(tname(prefix, "qzeros"))) {
    auto zp = fmt::copy_as<int32_t>(ck, tname(prefix, "qzeros"));  // [G, n*bits/32]
    auto z = marlin::unpack_zero_points(zp.data(), d.groups, d.n, d.bits);
    if (!fmt::all_mid(z, d.bits)) {
      q.sym = false;
      q.zeros = std::move(z);
    }
  }
  if (ck.contains(tname(prefix, "perm"))) {
    auto perm = fmt::copy_as<int32_t>(ck, tname(prefix, "perm"));   // [k]
    auto gs = fmt::copy_as<int32_t>(ck, tname(prefix, "g_idx"));    // [k] sorted
    check_act_order(perm, gs, d.k, prefix);
    std::vector<uint8_t> codes(q.codes.size());
    q.g_idx.assign(size_t(d.k), 0);
    for (int64_t j = 0; j < d.k; ++j) {
      const int64_t r = perm[size_t(j)];
      std::copy_n(q.codes.begin() + j * d.n, d.n, codes.begin() + r * d.n);
      q.g_idx[size_t(r)] = gs[size_t(j)];
    }
    q.codes = std::move(codes);
    gptq::validate_g_idx(q.g_idx.data(), d.k, d.groups);
    if (q.trivial_g_idx()) q.g_idx.clear();
  }
  // Codes come from unpacking (in range by construction), sizes from describe_*, g_idx and zero points
  // were range-checked there: the O(k*n) QuantizedLinear::validate() is skipped on this hot path.
  return q;
}

std::vector<PackedTensor> write_marlin(const QuantizedLinear& q, bool force_g_idx) {
  const int64_t G = q.groups();
  std::vector<PackedTensor> out;
  const bool act = !q.trivial_g_idx() || force_g_idx;
  std::vector<int32_t> B;  // [k/16, n*bits/2]
  std::vector<int32_t> perm, sorted_g;
  if (act) {
    // Rows sorted by group (stable) so each group is contiguous along k, as the kernel needs (§2.2).
    const std::vector<int32_t> g = q.g_idx.empty() ? gptq::trivial_g_idx(q.k, q.group_size) : q.g_idx;
    gptq::ActOrder ao = gptq::act_order_sort(g.data(), q.k);
    perm = std::move(ao.sort_indices);
    sorted_g = std::move(ao.g_idx_sorted);
    std::vector<uint8_t> codes = gptq::gather_rows(q.codes.data(), q.k, q.n, perm.data());  // [k, n] Marlin row order
    B = marlin::pack_weights(codes.data(), q.k, q.n, q.bits);
  } else {
    B = marlin::pack_weights(q.codes.data(), q.k, q.n, q.bits);
  }
  out.push_back(fmt::make_tensor(tname(q.name, "B"), DType::I32, {q.k / 16, q.n * q.bits / 2}, B));
  out.push_back(fmt::make_tensor(tname(q.name, "s"), fmt::dtype_of(q.scale_type), {G, q.n},
                                 marlin::permute_scales(q.scales.data(), G, q.n)));
  if (!q.sym) {
    auto zp = marlin::pack_zero_points(q.zeros.data(), G, q.n, q.bits);  // [G, n*bits/32]
    out.push_back(fmt::make_tensor(tname(q.name, "qzeros"), DType::I32, {G, q.n * q.bits / 32}, zp));
  }
  if (act) {
    out.push_back(fmt::make_tensor(tname(q.name, "g_idx"), DType::I32, {q.k}, sorted_g));
    out.push_back(fmt::make_tensor(tname(q.name, "perm"), DType::I32, {q.k}, perm));
  }
  return out;
}

// ---- Sparse-Marlin 2:4 ----------------------------------------------------------------------------

namespace {

struct Names24 {
  std::string B, meta, s;
  Format format;
};

Names24 names_24(const Checkpoint& ck, const std::string& prefix, bool ct) {
  if (ct) return {tname(prefix, "weight_packed"), tname(prefix, "meta"), tname(prefix, "scale_packed"),
                  Format::CompressedTensorsMarlin24};
  return {tname(prefix, "B_24"), marlin24_stored_name(ck, tname(prefix, "B_meta")),
          marlin24_stored_name(ck, tname(prefix, "s")), Format::Marlin24};
}

ModuleDesc describe_24(const Checkpoint& ck, const std::string& prefix, bool ct) {
  Names24 nm = names_24(ck, prefix, ct);
  const std::string f = ct ? "compressed-tensors marlin-24" : "marlin24";
  ModuleDesc d;
  d.prefix = prefix;
  d.format = nm.format;
  d.sparse24 = true;
  const TensorInfo& B = need(ck, nm.B, DType::I32, 2, f);
  const TensorInfo& m = need(ck, nm.meta, DType::I16, 2, f);
  const TensorInfo& s = need_scales(ck, nm.s, 2, f);
  d.n = s.shape[1];
  d.groups = s.shape[0];
  d.k = 32 * B.shape[0];
  d.bits = bits_from_width(B.shape[1], d.n, B.name);
  // vLLM / compressed-tensors store [k/32, 2n]; the original Sparse-Marlin Layer_2_4 keeps the same
  // bytes in a buffer declared [n, k/16] (formats.md §3.7). Both are row-major views of one array.
  const bool vllm_view = m.shape[0] == B.shape[0] && m.shape[1] == 2 * d.n;
  const bool ist_view = !ct && m.shape[0] == d.n && m.shape[1] == d.k / 16;
  if (!vllm_view && !ist_view)
    bad_data(m.name + ": shape " + fmt::shape_str(m.shape) + ", the 2:4 metadata needs [k/32, 2n] = [" +
             std::to_string(B.shape[0]) + ", " + std::to_string(2 * d.n) + "]" +
             (ct ? std::string() : " (or the original packer's [n, k/16] = [" + std::to_string(d.n) + ", " +
                                       std::to_string(d.k / 16) + "])"));
  d.group_size = fmt::group_size_from_rows(d.k, d.groups, s.name);
  d.scale_type = fmt::scale_type_of(s.dtype);
  d.tensors = {B.name, m.name, s.name};
  d.stored_bytes = fmt::tensor_bytes(ck, d.tensors);
  return d;
}

QuantizedLinear read_24(const Checkpoint& ck, const std::string& prefix, bool ct) {
  ModuleDesc d = describe_24(ck, prefix, ct);
  Names24 nm = names_24(ck, prefix, ct);
  QuantizedLinear q = fmt::layer_of(d);
  auto B = fmt::copy_as<int32_t>(ck, nm.B);     // [k/32, n*bits/2]
  auto meta = fmt::copy_as<int16_t>(ck, nm.meta);  // [k/32, 2n] (or its [n, k/16] view)
  q.codes.resize(size_t(d.k * d.n));
  q.mask.resize(size_t(d.k * d.n));
  marlin::unpack_24(B.data(), meta.data(), d.k, d.n, d.bits, q.codes.data(), q.mask.data());
  auto s = fmt::copy_as<uint16_t>(ck, nm.s);  // [G, n]
  // compressed-tensors' Marlin24Compressor permutes grouped scales only when 128 < k/2 (it passes k/2
  // as size_k, §6.2), so for k <= 256 its grouped scales are stored unpermuted.
  if (ct && d.groups > 1 && d.k / 2 <= 128) q.scales = s;
  else q.scales = marlin::unpermute_scales_24(s.data(), d.groups, d.n);
  q.validate();
  return q;
}

}  // namespace

ModuleDesc describe_marlin24(const Checkpoint& ck, const std::string& prefix) { return describe_24(ck, prefix, false); }
ModuleDesc describe_ct_marlin24(const Checkpoint& ck, const std::string& prefix) { return describe_24(ck, prefix, true); }

QuantizedLinear read_marlin24(const Checkpoint& ck, const std::string& prefix, const FormatInfo&) {
  return read_24(ck, prefix, false);
}
QuantizedLinear read_ct_marlin24(const Checkpoint& ck, const std::string& prefix, const FormatInfo&) {
  return read_24(ck, prefix, true);
}

std::vector<uint8_t> mask_24_from_codes(const QuantizedLinear& q) {
  if (!q.sym)
    bad_data(q.name + ": Sparse-Marlin stores symmetric codes only (uint4b8/uint8b128); this layer has zero points");
  if (q.k % 4 != 0) bad_data(q.name + ": 2:4 sparsity needs k % 4 == 0 (k = " + std::to_string(q.k) + ")");
  const int mid = 1 << (q.bits - 1);
  std::vector<uint8_t> mask(q.codes.size(), 0);  // [k, n]
  for (int64_t g = 0; g < q.k / 4; ++g)
    for (int64_t c = 0; c < q.n; ++c) {
      bool m[4];
      int nz = 0;
      for (int t = 0; t < 4; ++t) nz += (m[t] = q.codes[size_t((4 * g + t) * q.n + c)] != mid);
      if (nz > 2)
        bad_data(q.name + ": rows " + std::to_string(4 * g) + ".." + std::to_string(4 * g + 3) + " of column " +
                 std::to_string(c) + " hold " + std::to_string(nz) +
                 " non-zero weights; Sparse-Marlin keeps at most 2 of every 4 along k, so converting would drop "
                 "weights. Prune and re-quantize with `marlinc quantize --format marlin24` instead");
      // §3.2 selection, so that groups with fewer than two non-zeros record the reference positions.
      const bool b0 = !m[0] && m[1], b1 = !m[0] && !m[1];
      const bool b2 = (m[0] && m[1]) || (!m[0] && !m[1]) || m[3], b3 = (!m[0] && m[1]) || !m[1];
      const int idx0 = int(b0) | (int(b1) << 1), idx1 = int(b2) | (int(b3) << 1);
      mask[size_t((4 * g + idx0) * q.n + c)] = 1;
      mask[size_t((4 * g + idx1) * q.n + c)] = 1;
    }
  return mask;
}

std::vector<PackedTensor> write_marlin24(const QuantizedLinear& q, bool recorded_positions) {
  if (!q.trivial_g_idx())
    bad_data(q.name + ": Sparse-Marlin has no act-order (non-trivial g_idx); re-quantize with static groups");
  if (!q.sym) bad_data(q.name + ": Sparse-Marlin stores symmetric codes only; this layer has zero points");
  // The values the file holds: pruned positions are the zero code, so the §3.2 rule sees only kept
  // weights (and may record a pruned position where a kept weight rounded to zero).
  const QuantizedLinear* v = &q;
  QuantizedLinear zeroed;
  if (!q.mask.empty() && !recorded_positions) {
    zeroed = q;
    zeroed.mask.clear();
    const uint8_t mid = uint8_t(1u << (q.bits - 1));
    for (size_t i = 0; i < q.codes.size(); ++i)
      if (!q.mask[i]) zeroed.codes[i] = mid;
    v = &zeroed;
  }
  const std::vector<uint8_t> mask = v->mask.empty() ? mask_24_from_codes(*v) : v->mask;
  marlin::Sparse24 sp = marlin::pack_24(v->codes.data(), mask.data(), q.k, q.n, q.bits);
  const int64_t G = q.groups();
  std::vector<PackedTensor> out;
  out.push_back(fmt::make_tensor(tname(q.name, "B_24"), DType::I32, {q.k / 32, q.n * q.bits / 2}, sp.B24));
  out.push_back(fmt::make_tensor(tname(q.name, "B_meta"), DType::I16, {q.k / 32, 2 * q.n}, sp.meta));
  // The Sparse-Marlin kernels (IST, vLLM gptq_marlin_24, compressed-tensors marlin-24) take fp16 only
  // (formats.md §9.3): bf16 scales are stored as fp16 when that is exact, else refused.
  std::vector<uint16_t> s16 = q.scales;  // [G, n]
  if (q.scale_type == ScaleType::BF16)
    for (size_t i = 0; i < s16.size(); ++i) {
      const float v = bf16_to_float(q.scales[i]);
      s16[i] = float_to_half(v);
      if (half_to_float(s16[i]) != v)
        bad_data(q.name + ": Sparse-Marlin stores fp16 scales; the bf16 scale " + std::to_string(v) + " at group " +
                 std::to_string(i / size_t(q.n)) + ", column " + std::to_string(i % size_t(q.n)) +
                 " has no exact fp16 value (re-quantize from the fp16 model, or convert to marlin)");
    }
  out.push_back(fmt::make_tensor(tname(q.name, "s"), DType::F16, {G, q.n}, marlin::permute_scales_24(s16.data(), G, q.n)));
  return out;
}

}  // namespace marlinc
