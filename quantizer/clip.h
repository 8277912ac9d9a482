// Clip (shrink-factor) searches for symmetric group scales (spec: gptq.md §2.1, §2.2, §2.9).
// Every candidate scale is rounded to the scale type (fp16, or bf16 with `bf16`) before it is
// evaluated, so the chosen scale is exactly the one the packed file will hold. Ties keep the larger shrink factor (strict improvement wins),
// as in Marlin's `find_params`.
#pragma once
#include <cstdint>

namespace marlinc::quant {

// Unweighted Lp search on one row-group x[i·stride], i < len (RTN path, GPTQ's `mse` option):
// candidate p = 1 − i/grid, i < candidates, error Σ|Q_p(x) − x|^norm. Returns the rounded scale.
// Scalar on purpose: callers parallelise over rows.
float lp_clip_scale(const float* x, int64_t len, int64_t stride, int bits, float norm, int grid,
                    int candidates, bool bf16);

// Shape of the weighting matrix M of the Hessian-weighted search.
enum class Tri { Upper, Lower, Dense };

// Hessian-weighted search over a group of g input columns for `cols` output rows held TRANSPOSED:
// X [g, cols] row-major with row stride ld (X[t·ld + r] = weight of output row r, input column t).
// Per output row r the objective of candidate p is ‖Mᵀ·δ_r‖² with δ_r = Q_p(X[:, r]) − X[:, r] and
// M [g, g] row-major: M = U_gg⁻¹ (upper) gives Marlin's Schur-complement objective ‖δ·U_gg⁻¹‖²,
// M = chol(H_gg) (lower) the plain block objective δᵀH_ggδ. Writes the rounded scales to
// scales[cols]. Batched: all candidates are evaluated with one triangular GEMM per candidate batch.
// Everything in double: the objective decides the scale, and the CUDA back end must reach the same
// decision (near-ties between candidates would otherwise split on summation order).
void weighted_clip_scales(const double* X, int64_t g, int64_t cols, int64_t ld, const double* M, Tri tri,
                          int bits, int grid, int candidates, bool bf16, float* scales);

// Scalar reference of weighted_clip_scales for one output row x[t·stride] (dense M, double).
float weighted_clip_scale_ref(const double* x, int64_t g, int64_t stride, const double* M, int bits,
                              int grid, int candidates, bool bf16);

}  // namespace marlinc::quant
