// GPTQ, AWQ (GEMM) and compressed-tensors pack-quantized layouts (spec: ../shared/spec/formats.md §4,
// §5, §6.1). Pure functions on integer codes: no scales arithmetic, no rounding. Codes are unsigned
// (uint4b8 / uint8b128 / uint4 + zero point) in natural [k, n] order (k = input features).
// Every layout has an `_ref` (closed form per element) where a fast path exists; tests hold them
// bit-exact. All functions throw marlinc::Error naming the function, the value and the rule broken.
#pragma once
#include <cstdint>
#include <vector>

namespace marlinc::gptq {

// ---- qweight: codes [k, n] -> int32 [k*bits/32, n]; row k at bits bits*(k % (32/bits)) of word
// k/(32/bits) (LSB first, §4.2). bits in {2, 4, 8}; k must be a multiple of 32/bits.
std::vector<int32_t> pack_qweight_ref(const uint8_t* codes, int64_t k, int64_t n, int bits);
std::vector<int32_t> pack_qweight(const uint8_t* codes, int64_t k, int64_t n, int bits);
std::vector<uint8_t> unpack_qweight_ref(const int32_t* qweight, int64_t k, int64_t n, int bits);
std::vector<uint8_t> unpack_qweight(const int32_t* qweight, int64_t k, int64_t n, int bits);

// ---- qzeros: real zero points z [G, n] -> int32 [G, n*bits/32], column n at bits bits*(n % pf) of
// word n/pf (no interleave, §4.2). V1 ("gptq") stores z - 1, V2 ("gptq_v2") stores z (§4.3).
enum class ZeroFormat { V1, V2 };
// Throws BadData for z == 0 with V1 (z - 1 underflows and would corrupt neighbouring columns, §9.1).
std::vector<int32_t> pack_qzeros(const uint8_t* z, int64_t groups, int64_t n, int bits, ZeroFormat fmt);
// Throws BadData for a V1 stored value of 2^bits - 1 (would mean z = 2^bits: an underflowed asym file).
std::vector<uint8_t> unpack_qzeros(const int32_t* qzeros, int64_t groups, int64_t n, int bits, ZeroFormat fmt);
// The qzeros of a symmetric layer: every field 2^(bits-1) (V2) or 2^(bits-1) - 1 (V1),
// e.g. 4-bit words 0x88888888 / 0x77777777.
std::vector<int32_t> sym_qzeros(int64_t groups, int64_t n, int bits, ZeroFormat fmt);
// Per-word v1 <-> v2 conversion: +/- 0x11111111 (4-bit), 0x01010101 (8-bit), 0x55555555 (2-bit), as
// GPTQModel does. Throws BadData (naming the word) where a field would overflow/underflow, since the
// carry would silently change the neighbouring column.
std::vector<int32_t> qzeros_v1_to_v2(const int32_t* qzeros, int64_t count, int bits);
std::vector<int32_t> qzeros_v2_to_v1(const int32_t* qzeros, int64_t count, int bits);

// What a file's qzeros say, whatever its config label claims (§4.3 pitfall: mislabeled files exist).
enum class QzerosKind {
  SymV1,                // every field 2^(bits-1) - 1 (4-bit: all 7)
  SymV2,                // every field 2^(bits-1)     (4-bit: all 8)
  AsymmetricOrUnknown,  // anything else: real zero points (or empty input)
};
QzerosKind detect_qzeros(const int32_t* qzeros, int64_t groups, int64_t n, int bits);
const char* to_string(QzerosKind kind);

// ---- g_idx (§4.4) ----------------------------------------------------------------------------------
// g_idx[k] = k / group_size (all 0 for group_size -1).
std::vector<int32_t> trivial_g_idx(int64_t k, int group_size);
bool is_trivial_g_idx(const int32_t* g_idx, int64_t k, int group_size);
// Throws BadData naming the row when g_idx[r] is outside [0, groups).
void validate_g_idx(const int32_t* g_idx, int64_t k, int64_t groups);
// Act-order: Marlin row j takes original row sort_indices[j]. The sort is STABLE (ties keep row order)
// so the output is deterministic; g_idx_sorted = g_idx[sort_indices] is non-decreasing (§2.2).
struct ActOrder {
  std::vector<int32_t> sort_indices;  // [k]
  std::vector<int32_t> g_idx_sorted;  // [k]
};
ActOrder act_order_sort(const int32_t* g_idx, int64_t k);
// Inverse permutation: inv[perm[j]] = j. Throws BadData unless perm is a permutation of 0..k-1.
std::vector<int32_t> invert_permutation(const int32_t* perm, int64_t k);
// out[j, :] = in[perm[j], :] for a [k, n] byte matrix (perm must be a permutation of 0..k-1).
std::vector<uint8_t> gather_rows(const uint8_t* in, int64_t k, int64_t n, const int32_t* perm);

}  // namespace marlinc::gptq

namespace marlinc::awq {

// AutoAWQ GEMM packs along n with order_map [0,2,4,6,1,3,5,7] (4-bit): slot i of word w holds column
// 8w + order_map[i], i.e. column n is in word n/8 at slot [0,4,1,5,2,6,3,7][n % 8] (§5). 8-bit uses
// [0,2,1,3] (vLLM awq_pack; not pinned in the spec). Same packing for qweight [k, n/8] and qzeros [G, n/8].
std::vector<int32_t> pack_cols_ref(const uint8_t* v, int64_t rows, int64_t n, int bits);
std::vector<int32_t> pack_cols(const uint8_t* v, int64_t rows, int64_t n, int bits);
std::vector<uint8_t> unpack_cols_ref(const int32_t* packed, int64_t rows, int64_t n, int bits);
std::vector<uint8_t> unpack_cols(const int32_t* packed, int64_t rows, int64_t n, int bits);
// Named forms: qweight codes [k, n] -> [k, n*bits/32]; qzeros (real zeros, no -1) [G, n] -> [G, n*bits/32].
inline std::vector<int32_t> pack_qweight(const uint8_t* codes, int64_t k, int64_t n, int bits) {
  return pack_cols(codes, k, n, bits);
}
inline std::vector<uint8_t> unpack_qweight(const int32_t* qweight, int64_t k, int64_t n, int bits) {
  return unpack_cols(qweight, k, n, bits);
}
inline std::vector<int32_t> pack_qzeros(const uint8_t* z, int64_t groups, int64_t n, int bits) {
  return pack_cols(z, groups, n, bits);
}
inline std::vector<uint8_t> unpack_qzeros(const int32_t* qzeros, int64_t groups, int64_t n, int bits) {
  return unpack_cols(qzeros, groups, n, bits);
}

}  // namespace marlinc::awq

namespace marlinc::ct {

// compressed-tensors pack-quantized (§6.1), HF orientation. weight_packed int32 [n, ceil(k/pf)]:
// element (o, i) (output o, input i) at word i/pf, bits bits*(i % pf); the last word of a row is
// zero-padded. Input/output codes are our [k, n] (unsigned = signed + 2^(bits-1)).
std::vector<int32_t> pack_weight_ref(const uint8_t* codes, int64_t k, int64_t n, int bits);
std::vector<int32_t> pack_weight(const uint8_t* codes, int64_t k, int64_t n, int bits);
std::vector<uint8_t> unpack_weight_ref(const int32_t* packed, int64_t k, int64_t n, int bits);
std::vector<uint8_t> unpack_weight(const int32_t* packed, int64_t k, int64_t n, int bits);
// weight_zero_point int32 [ceil(n/pf), G], packed along n (dim 0): zero of (g, o) at word (o/pf, g),
// bits bits*(o % pf); stored value zp_signed + 2^(bits-1) = our unsigned zero z [G, n].
std::vector<int32_t> pack_zero_point(const uint8_t* z, int64_t groups, int64_t n, int bits);
std::vector<uint8_t> unpack_zero_point(const int32_t* packed, int64_t groups, int64_t n, int bits);

}  // namespace marlinc::ct
