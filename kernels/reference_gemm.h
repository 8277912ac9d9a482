// CPU reference for the Marlin W4A16 GEMM (spec: ../shared/spec/formats.md §1.9b): it reads the very
// bytes a kernel consumes (B int32 [k/16, 2n], permuted scales [G, n]), decodes them with the packer's
// inverses, dequantizes w = (q - 8) * s exactly and accumulates in double. Every GPU kernel is checked
// against it, so CPU-only machines can test everything but the CUDA code.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/act_type.h"

namespace marlinc::kernels {

// One W4A16 problem: C[m, n] = A[m, k] · dequant(B, s). group_size is -1 (per-channel), or a divisor
// of k; G = k / group_size scale rows (G == 1 uses the per-channel scale permutation, §1.6).
struct RefGemmProblem {
  const uint16_t* A = nullptr;  // [m, k] raw fp16/bf16 words, row-major
  const int32_t* B = nullptr;   // [k/16, 2n] Marlin-packed uint4b8 codes
  const uint16_t* s = nullptr;  // [G, n] Marlin-permuted fp16/bf16 scales
  int64_t m = 0, n = 0, k = 0;
  int64_t group_size = -1;
  ActType act = ActType::F16;
};

// Number of scale rows G for (k, group_size); throws BadUsage when group_size is not -1 and does not
// divide k (or is not positive).
int64_t ref_num_groups(int64_t k, int64_t group_size);

// Dequantized weights W[k, n] = (q - 8) * s[k / g][n] in float (exact: a 4-bit integer times an
// 11-bit (fp16) or 8-bit (bf16) significand fits float's 24 bits).
std::vector<float> dequantize_ref(const RefGemmProblem& p);

// Scalar reference: per output element, a plain k-ascending double sum of A[r][kk] * W[kk][c] with
// W from the scalar unpackers (marlin::unpack_weights_ref). Obviously correct, slow.
// Returns C [rows.size(), n] (row-major) for the requested rows of A (all rows when rows is empty).
std::vector<double> reference_gemm_ref(const RefGemmProblem& p, const std::vector<int64_t>& rows = {});

// Same sums in the same order (so bit-identical to reference_gemm_ref), OpenMP over column blocks and
// using the fast unpackers: what large GPU tests use (a 8192x57344 layer for a few rows in ~1 s).
std::vector<double> reference_gemm(const RefGemmProblem& p, const std::vector<int64_t>& rows = {});

}  // namespace marlinc::kernels
