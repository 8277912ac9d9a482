// GPTQ (v1 / v2; formats.md §4) and AutoAWQ GEMM (§5) adapters. In a symmetric checkpoint GPTQ's
// zero-point convention is decided per module from the qzeros themselves (all 2^(b-1)-1 = v1, all
// 2^(b-1) = v2), because mislabeled files exist (§4.3); in an asymmetric one every module follows the
// checkpoint's detected format.
#include <algorithm>

#include "packer/formats/common.h"
#include "packer/gptq.h"

namespace marlinc {

using fmt::need;
using fmt::need_scales;
using fmt::tname;

namespace {

bool valid_bits(int b) { return b == 4 || b == 8; }

// Zero points of a GPTQ module. In a symmetric checkpoint the kind comes from the data (uniform
// 2^(b-1)-1 is v1, 2^(b-1) is v2) and the zeros are decoded with the matching convention; in an
// asymmetric one a uniform field is ambiguous (v2's 8 is v1's 9), so the checkpoint's format decides.
struct GptqZeros {
  Format format;              // GptqV1 / GptqV2 as the data (or, for asymmetric data, the checkpoint) says
  std::vector<uint8_t> z;     // [G, n] real zero points
  std::string note;
};

GptqZeros gptq_zeros(const Checkpoint& ck, const std::string& name, int64_t G, int64_t n, int bits, Format ckfmt,
                     bool guess_kind) {
  auto qz = fmt::copy_as<int32_t>(ck, name);  // [G, n*bits/32]
  GptqZeros out;
  const gptq::QzerosKind kind =
      guess_kind ? gptq::detect_qzeros(qz.data(), G, n, bits) : gptq::QzerosKind::AsymmetricOrUnknown;
  if (kind == gptq::QzerosKind::SymV1 || kind == gptq::QzerosKind::SymV2) {
    out.format = kind == gptq::QzerosKind::SymV1 ? Format::GptqV1 : Format::GptqV2;
    out.z.assign(size_t(G * n), uint8_t(1u << (bits - 1)));
    if (out.format != ckfmt)
      out.note = "qzeros hold " + format_name(out.format) + " values although the checkpoint reads as " +
                 format_name(ckfmt) + "; decoded as " + format_name(out.format);
    return out;
  }
  out.format = ckfmt;
  try {
    out.z = gptq::unpack_qzeros(qz.data(), G, n, bits,
                                ckfmt == Format::GptqV2 ? gptq::ZeroFormat::V2 : gptq::ZeroFormat::V1);
  } catch (const Error& e) {
    bad_data(name + ": " + e.what());
  }
  return out;
}

}  // namespace

// ---- GPTQ -----------------------------------------------------------------------------------------

ModuleDesc describe_gptq(const Checkpoint& ck, const std::string& prefix, const FormatInfo& fi) {
  ModuleDesc d;
  d.prefix = prefix;
  const TensorInfo& qw = need(ck, tname(prefix, "qweight"), DType::I32, 2, "gptq");
  const TensorInfo& s = need_scales(ck, tname(prefix, "scales"), 2, "gptq");
  const TensorInfo& qz = need(ck, tname(prefix, "qzeros"), DType::I32, 2, "gptq");
  d.n = s.shape[1];
  d.groups = s.shape[0];
  if (qw.shape[1] != d.n)
    bad_data(qw.name + ": shape " + fmt::shape_str(qw.shape) + " but its scales say n = " + std::to_string(d.n) +
             " (GPTQ qweight is [k*bits/32, n])");
  const std::string gname = tname(prefix, "g_idx");
  const TensorInfo* g = ck.contains(gname) ? &need(ck, gname, DType::I32, 1, "gptq") : nullptr;
  if (g && g->shape[0] > 0 && (32 * qw.shape[0]) % g->shape[0] == 0) d.bits = int(32 * qw.shape[0] / g->shape[0]);
  else d.bits = fi.bits > 0 ? fi.bits : 4;
  if (!valid_bits(d.bits))
    bad_data(qw.name + ": " + std::to_string(d.bits) + "-bit GPTQ; only 4- and 8-bit layers convert (Marlin's widths)");
  d.k = qw.shape[0] * 32 / d.bits;
  if (qz.shape[0] != d.groups || qz.shape[1] * 32 != d.n * d.bits)
    bad_data(qz.name + ": shape " + fmt::shape_str(qz.shape) + ", expected [" + std::to_string(d.groups) + ", " +
             std::to_string(d.n * d.bits / 32) + "] for " + std::to_string(d.bits) + "-bit zeros of n = " + std::to_string(d.n));
  d.group_size = fmt::group_size_from_rows(d.k, d.groups, s.name);
  d.scale_type = fmt::scale_type_of(s.dtype);
  GptqZeros z = gptq_zeros(ck, qz.name, d.groups, d.n, d.bits, fi.format == Format::GptqV2 ? Format::GptqV2 : Format::GptqV1,
                           fi.sym);
  d.format = z.format;
  if (!z.note.empty()) d.notes.push_back(z.note);
  d.sym = fmt::all_mid(z.z, d.bits);
  if (!d.sym) d.min_zero = *std::min_element(z.z.begin(), z.z.end());
  d.tensors = {qw.name, qz.name, s.name};
  if (g) fmt::describe_g_idx(ck, *g, d);
  d.stored_bytes = fmt::tensor_bytes(ck, d.tensors);
  return d;
}

QuantizedLinear read_gptq(const Checkpoint& ck, const std::string& prefix, const FormatInfo& fi) {
  ModuleDesc d = describe_gptq(ck, prefix, fi);
  QuantizedLinear q = fmt::layer_of(d);
  fmt::TensorData<int32_t> qw(ck, tname(prefix, "qweight"));  // [k*bits/32, n]
  q.codes = gptq::unpack_qweight(qw.data(), d.k, d.n, d.bits);
  q.scales = fmt::copy_as<uint16_t>(ck, tname(prefix, "scales"));  // [G, n]
  if (!d.sym) {
    q.sym = false;
    q.zeros = gptq_zeros(ck, tname(prefix, "qzeros"), d.groups, d.n, d.bits, d.format, false).z;  // d.format decided
  }
  if (d.act_order) q.g_idx = fmt::copy_as<int32_t>(ck, tname(prefix, "g_idx"));
  // Codes come from unpacking (in range by construction), sizes from describe_*, g_idx and zero points
  // were range-checked there: the O(k*n) QuantizedLinear::validate() is skipped on this hot path.
  return q;
}

std::vector<PackedTensor> write_gptq(const QuantizedLinear& q, bool v2) {
  const int64_t G = q.groups();
  const auto zf = v2 ? gptq::ZeroFormat::V2 : gptq::ZeroFormat::V1;
  std::vector<PackedTensor> out;
  out.push_back(fmt::make_tensor(tname(q.name, "qweight"), DType::I32, {q.k * q.bits / 32, q.n},
                                 gptq::pack_qweight(q.codes.data(), q.k, q.n, q.bits)));
  std::vector<int32_t> qz;  // [G, n*bits/32]
  try {
    qz = q.sym ? gptq::sym_qzeros(G, q.n, q.bits, zf) : gptq::pack_qzeros(q.zeros.data(), G, q.n, q.bits, zf);
  } catch (const Error& e) {
    bad_data(q.name + ": " + e.what() + (v2 ? "" : "; write --to gptq_v2 instead"));
  }
  out.push_back(fmt::make_tensor(tname(q.name, "qzeros"), DType::I32, {G, q.n * q.bits / 32}, qz));
  out.push_back(fmt::make_tensor(tname(q.name, "scales"), fmt::dtype_of(q.scale_type), {G, q.n}, q.scales));
  // GPTQModel/AutoGPTQ always write g_idx; the trivial one is row // group_size (all 0 per-channel).
  out.push_back(fmt::make_tensor(tname(q.name, "g_idx"), DType::I32, {q.k},
                                 q.g_idx.empty() ? gptq::trivial_g_idx(q.k, q.group_size) : q.g_idx));
  return out;
}

// ---- AWQ (GEMM) -----------------------------------------------------------------------------------

ModuleDesc describe_awq(const Checkpoint& ck, const std::string& prefix, const FormatInfo& fi) {
  ModuleDesc d;
  d.prefix = prefix;
  d.format = Format::Awq;
  const TensorInfo& qw = need(ck, tname(prefix, "qweight"), DType::I32, 2, "awq");
  const TensorInfo& s = need_scales(ck, tname(prefix, "scales"), 2, "awq");
  const TensorInfo& qz = need(ck, tname(prefix, "qzeros"), DType::I32, 2, "awq");
  d.n = s.shape[1];
  d.groups = s.shape[0];
  d.k = qw.shape[0];
  d.bits = fi.bits > 0 ? fi.bits : 4;
  if (d.bits != 4)
    bad_data(qw.name + ": " + std::to_string(d.bits) + "-bit AWQ; the AWQ GEMM layout is pinned for 4-bit only");
  if (qw.shape[1] * 8 != d.n || qz.shape[0] != d.groups || qz.shape[1] * 8 != d.n)
    bad_data(prefix + ": AWQ shapes qweight " + fmt::shape_str(qw.shape) + ", qzeros " + fmt::shape_str(qz.shape) +
             ", scales " + fmt::shape_str(s.shape) + " are inconsistent (need [k, n/8], [G, n/8], [G, n])");
  d.group_size = fmt::group_size_from_rows(d.k, d.groups, s.name);
  d.scale_type = fmt::scale_type_of(s.dtype);
  auto qzv = fmt::copy_as<int32_t>(ck, qz.name);
  auto z = awq::unpack_qzeros(qzv.data(), d.groups, d.n, d.bits);
  d.sym = fmt::all_mid(z, d.bits);
  if (!d.sym) d.min_zero = *std::min_element(z.begin(), z.end());
  d.tensors = {qw.name, qz.name, s.name};
  d.stored_bytes = fmt::tensor_bytes(ck, d.tensors);
  return d;
}

QuantizedLinear read_awq(const Checkpoint& ck, const std::string& prefix, const FormatInfo& fi) {
  ModuleDesc d = describe_awq(ck, prefix, fi);
  QuantizedLinear q = fmt::layer_of(d);
  fmt::TensorData<int32_t> qw(ck, tname(prefix, "qweight"));  // [k, n/8]
  q.codes = awq::unpack_qweight(qw.data(), d.k, d.n, d.bits);
  q.scales = fmt::copy_as<uint16_t>(ck, tname(prefix, "scales"));
  if (!d.sym) {
    auto qz = fmt::copy_as<int32_t>(ck, tname(prefix, "qzeros"));  // [G, n/8]
    q.sym = false;
    q.zeros = awq::unpack_qzeros(qz.data(), d.groups, d.n, d.bits);
  }
  // Codes come from unpacking (in range by construction), sizes from describe_*, g_idx and zero points
  // were range-checked there: the O(k*n) QuantizedLinear::validate() is skipped on this hot path.
  return q;
}

std::vector<PackedTensor> write_awq(const QuantizedLinear& q) {
  if (!q.trivial_g_idx()) bad_data(q.name + ": AWQ has no g_idx (act-order); write --to gptq or marlin instead");
  const int64_t G = q.groups();
  const std::vector<uint8_t> z = fmt::real_zeros(q);  // AWQ stores real zeros (8 for a symmetric layer)
  std::vector<PackedTensor> out;
  out.push_back(fmt::make_tensor(tname(q.name, "qweight"), DType::I32, {q.k, q.n * q.bits / 32},
                                 awq::pack_qweight(q.codes.data(), q.k, q.n, q.bits)));
  out.push_back(fmt::make_tensor(tname(q.name, "qzeros"), DType::I32, {G, q.n * q.bits / 32},
                                 awq::pack_qzeros(z.data(), G, q.n, q.bits)));
  out.push_back(fmt::make_tensor(tname(q.name, "scales"), fmt::dtype_of(q.scale_type), {G, q.n}, q.scales));
  return out;
}

}  // namespace marlinc
