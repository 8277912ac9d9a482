// Marlin / Sparse-Marlin tile layouts (spec: ../shared/spec/formats.md §1, §3). Pure functions on
// arrays; each has a scalar `_ref` (closed form, obviously correct) and a fast OpenMP version that
// tests hold bit-exact to it. Codes are unsigned (uint4b8 / uint8b128 / uint4+zp), natural [k, n].
#pragma once
#include <cstdint>
#include <vector>

namespace marlinc::marlin {

// ---- dense weights: codes [k, n] -> B int32 [k/16, n*bits/2]  (4-bit: [k/16, 2n]; 8-bit: [k/16, 4n])
std::vector<int32_t> pack_weights_ref(const uint8_t* codes, int64_t k, int64_t n, int bits);
std::vector<int32_t> pack_weights(const uint8_t* codes, int64_t k, int64_t n, int bits);
std::vector<uint8_t> unpack_weights_ref(const int32_t* B, int64_t k, int64_t n, int bits);
std::vector<uint8_t> unpack_weights(const int32_t* B, int64_t k, int64_t n, int bits);
// The generic path driven by layout::kWeightPerm* (used for 8-bit; kept for 4-bit as a cross-check of
// the 4-bit slab kernels that pack_weights uses).
std::vector<int32_t> pack_weights_table(const uint8_t* codes, int64_t k, int64_t n, int bits);

// ---- fused GPTQ <-> Marlin (vLLM gptq_marlin_repack equivalent, §2.1/§2.2/§2.5): GPTQ qweight
// [k*bits/32, n] -> B without materialising codes. perm (optional, [k]) = act-order sort_indices:
// Marlin row j takes GPTQ row perm[j]. Equal to pack_weights(gather_rows(unpack_qweight(qweight))).
std::vector<int32_t> pack_weights_from_qweight(const int32_t* qweight, int64_t k, int64_t n, int bits,
                                               const int32_t* perm = nullptr);
// Inverse for the trivial order: B -> GPTQ qweight [k*bits/32, n].
std::vector<int32_t> unpack_weights_to_qweight(const int32_t* B, int64_t k, int64_t n, int bits);

// ---- scales [G, n] (raw 16-bit fp16/bf16 words) -> permuted [G, n]; G == 1 uses the per-channel perm.
std::vector<uint16_t> permute_scales(const uint16_t* s, int64_t groups, int64_t n);
std::vector<uint16_t> unpermute_scales(const uint16_t* s, int64_t groups, int64_t n);

// ---- zero points z [G, n] -> int32 [G, n*bits/32] (§1.8)
std::vector<int32_t> pack_zero_points(const uint8_t* z, int64_t groups, int64_t n, int bits);
std::vector<uint8_t> unpack_zero_points(const int32_t* zp, int64_t groups, int64_t n, int bits);
// Step-by-step references (scale_perm, interleave, pack_cols as in §1.8).
std::vector<int32_t> pack_zero_points_ref(const uint8_t* z, int64_t groups, int64_t n, int bits);
std::vector<uint8_t> unpack_zero_points_ref(const int32_t* zp, int64_t groups, int64_t n, int bits);

// ---- Sparse-Marlin 2:4 (§3): codes [k, n] + mask [k, n] (exactly 2 kept per aligned 4 along k)
struct Sparse24 {
  std::vector<int32_t> B24;   // [k/32, 2n] (4-bit) / [k/32, 4n] (8-bit)
  std::vector<int16_t> meta;  // [k/32, 2n]  (same bytes as Sparse-Marlin's [n, k/16])
};
Sparse24 pack_24_ref(const uint8_t* codes, const uint8_t* mask, int64_t k, int64_t n, int bits);
Sparse24 pack_24(const uint8_t* codes, const uint8_t* mask, int64_t k, int64_t n, int bits);
// Inverse: codes [k, n] (pruned positions get the zero code 2^(bits-1)) and mask [k, n].
void unpack_24(const int32_t* B24, const int16_t* meta, int64_t k, int64_t n, int bits,
               uint8_t* codes, uint8_t* mask);
void unpack_24_ref(const int32_t* B24, const int16_t* meta, int64_t k, int64_t n, int bits,
                   uint8_t* codes, uint8_t* mask);
std::vector<uint16_t> permute_scales_24(const uint16_t* s, int64_t groups, int64_t n);
std::vector<uint16_t> unpermute_scales_24(const uint16_t* s, int64_t groups, int64_t n);

}  // namespace marlinc::marlin
