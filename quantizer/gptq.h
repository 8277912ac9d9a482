// GPTQ for one linear layer (spec: gptq.md §1, §2.1, §4): dead columns, relative damping with
// automatic increase, upper Cholesky factor of H⁻¹, blocked lazy updates, symmetric 4/8-bit groups
// fitted on the working copy with scales rounded to the stored type (fp16, or bf16), Marlin's Hessian-weighted clip search,
// column orders (natural / static-group act-order / GAR / dynamic act-order) and SparseGPT 2:4
// jointly with quantization. CPU back end: Eigen + OpenMP over output rows.
//
// Precision: everything that decides a code is double on both back ends (damped Hessian, its
// factorisation, working weights and error feedback, the clip objective, the 2:4 saliency, the
// loss); only the inputs are float and the scales 16-bit. The CPU and CUDA back ends then differ by
// double rounding amplified by H's conditioning (~1e-12 relative) instead of fp32's 1e-6..1e-4, so
// a code can differ only where a value sits that close to a rounding tie.
//
// Orientation: W is the float weight in Hugging Face orientation [n, k] row-major (row = output
// channel); H is the finalized [k, k] Hessian (HessianAccumulator::finalize()). The result's codes
// are [k, n] in the ORIGINAL input order, scales [G, n] fp16 bits (bf16 with bf16_scales), g_idx set only for dynamic
// act-order, mask [k, n] only for 2:4.
#pragma once
#include <Eigen/Dense>
#include <cstdint>
#include <string>
#include <vector>

#include "packer/quantized_linear.h"

namespace marlinc {

struct GptqOptions {
  int bits = 4;            // 4 (uint4b8) or 8 (uint8b128)
  int group_size = 128;    // -1 or a positive divisor of k (Marlin: -1/32/64/128)
  float damp = 0.01f;      // relative: H += damp·mean(diag H)·I (Marlin's script uses 0.10)
  bool auto_damp = true;   // on Cholesky failure add 0.01 while damp < 1; then fall back to RTN
  // Lazy-update block. Groups are fitted inside a block, so with groups the block is rounded down
  // to a multiple of group_size (and raised to group_size when smaller).
  int block = 128;
  enum Order { Natural, StaticActOrder, Gar, DynamicActOrder };
  Order order = Natural;   // DynamicActOrder gives a non-monotone g_idx (GPTQ checkpoints only)
  // Marlin: per row and group, 76 shrink factors 1.00..0.25 minimising ‖(Q(p) − W_g)·U_gg⁻¹‖².
  // Ignored for group_size -1 (Marlin searches only grouped scales). With StaticActOrder the groups
  // are fitted up front, before U's processing-order blocks exist, so the objective is δᵀH_ggδ.
  enum Clip { None, Marlin };

  Clip clip = None;
  bool sparse24 = false;   // SparseGPT 2:4 jointly with quantization (natural order only, k % 4 == 0)
  enum class Device { Cpu, Cuda };
  Device device = Device::Cpu;  // Cuda needs a build with MARLINC_CUDA (gptq_cuda.cu)
  std::string name;        // tensor/module name for errors; copied to QuantizedLinear::name
  bool bf16_scales = false;  // the grid's scales are bf16 (a bf16 model's output), else fp16
};
// --order's spelling: natural, static, gar, dynamic.
std::string order_name(GptqOptions::Order o);

struct GptqStats {
  double loss = 0;            // OBS estimate Σ (w − q)²/d² / 2 over the layer
  double rel_weight_err = 0;  // ‖W − Ŵ‖_F / ‖W‖_F against the input W
  double damp_used = 0;       // relative damping of the factorisation that succeeded
  bool fell_back_to_rtn = false;  // Cholesky kept failing: H⁻¹ := I (plain RTN, unweighted clip)
  double seconds = 0;
  int dead_columns = 0;       // input channels with H_jj == 0 (weights zeroed)
};

// Throws marlinc::Error: BadUsage for options/shape mismatches, BadData for non-finite W or H.
QuantizedLinear gptq_quantize(const float* W /*[n, k]*/, int64_t n, int64_t k, const Eigen::MatrixXf& H /*[k, k]*/,
                              const GptqOptions& opts, GptqStats* stats = nullptr);

// Unblocked scalar reference (immediate full-row OBS updates in HF orientation, literal
// chol → cholesky-inverse → chol-upper factorisation, scalar clip search). The fast path is tested
// against it with tolerances (blocking changes only the rounding of the double sums).
QuantizedLinear gptq_quantize_ref(const float* W /*[n, k]*/, int64_t n, int64_t k, const Eigen::MatrixXf& H,
                                  const GptqOptions& opts, GptqStats* stats = nullptr);

namespace gptq {

using RowMatrixXf = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMatrixXd = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Processing order (perm[p] = original column quantized p-th) for the order option and diag H.
// Natural: identity. StaticActOrder / DynamicActOrder: diag descending (stable). Gar: within each
// natural group by diag descending, groups by their max diag descending (g_idx stays c/g).
std::vector<int32_t> column_order(GptqOptions::Order order, const float* diag, int64_t k, int group_size);

// Upper Cholesky factor U of Hd⁻¹ (Hd⁻¹ = UᵀU), or false when Hd is not numerically positive
// definite. Fast: one Cholesky of the index-reversed Hd and a triangular inverse (by uniqueness of
// the Cholesky factor, U = J·chol(J·Hd·J)⁻¹·J). Ref: chol, cholesky_inverse, chol upper (§1.5).
// Double precision: U decides every code through the error feedback, and the CPU and CUDA back
// ends must agree on it far below a rounding step (fp32 factors differ by 1e-6..1e-4 relative).
bool inverse_cholesky_upper(const Eigen::MatrixXd& Hd, RowMatrixXd& U);
bool inverse_cholesky_upper_ref(const Eigen::MatrixXd& Hd, RowMatrixXd& U);

// The prepared problem shared by both back ends: dead columns handled, order chosen, damping
// retried, U computed (identity on RTN fallback). Everything that decides codes is double; the
// inputs (float W and H) convert exactly.
struct Prepared {
  int64_t n = 0, k = 0;
  int group = 0;                 // effective group length (k for group_size -1)
  int block = 0;                 // effective lazy block
  std::vector<int32_t> perm;     // [k] processing position -> original column
  std::vector<double> Wt;        // [k, n] weights transposed, rows in processing order, dead zeroed
  RowMatrixXd U;                 // [k, k] upper factor of the damped permuted H⁻¹
  std::vector<float> static_scales;  // [G, n] rounded scales (fp16 or bf16), StaticActOrder only (natural groups)
  double damp_used = 0;
  bool fell_back = false;
  int dead = 0;
};
// `ref` selects the reference factorisation.
Prepared prepare(const float* W, int64_t n, int64_t k, const Eigen::MatrixXf& H, const GptqOptions& o, bool ref);

// Validates options against the shape (BadUsage naming o.name and the option).
void check_options(const GptqOptions& o, int64_t n, int64_t k, const Eigen::MatrixXf& H);
// The same for a Hessian of h_rows x h_cols held elsewhere (e.g. on the GPU).
void check_options(const GptqOptions& o, int64_t n, int64_t k, int64_t h_rows, int64_t h_cols);

}  // namespace gptq

}  // namespace marlinc
