// Hessian accumulation for GPTQ from calibration activations of variable length (spec: gptq.md
// §1.2, §3.6): samples are added one at a time, unpadded, as X [t, k] (t tokens of one sample);
// the accumulator keeps the un-normalised fp32 sum Σ x xᵀ and the token count, and finalize()
// normalises once: H = (2 / N_tokens)·Σ x xᵀ. Layers that read the same input (q/k/v, gate/up)
// share one accumulator: the caller simply passes the same finalized H to each of them.
#pragma once
#include <Eigen/Dense>
#include <cstdint>
#include <filesystem>

namespace marlinc {

class HessianAccumulator {
 public:
  explicit HessianAccumulator(int64_t k);

  // Adds t tokens X [t, k] row-major (one sample; t may be 0). Throws BadUsage on non-finite input
  // (a NaN would silently poison every later layer's quantization).
  void add(const float* X, int64_t t);
  // Same for fp16 / bf16 activations (raw 16-bit words); converted to fp32 before the product.
  void add_f16(const uint16_t* X, int64_t t);
  void add_bf16(const uint16_t* X, int64_t t);

  int64_t k() const { return k_; }
  int64_t tokens() const { return tokens_; }
  int64_t samples() const { return samples_; }
  // Un-normalised Σ x xᵀ [k, k] (both triangles filled).
  Eigen::MatrixXf sum() const;
  // H = (2/N_tokens)·Σ x xᵀ [k, k]. Throws BadUsage when no token was added.
  Eigen::MatrixXf finalize() const;

  // Binary file: header (magic "MLCHESS1", version, dtype f32, k, tokens, samples, FNV-1a 64 of the
  // payload) then the un-normalised sum [k, k] f32 little-endian, so accumulation can resume after
  // a load. Errors name the file and the rule broken (BadData for a bad file, Io for the OS).
  void save(const std::filesystem::path& path) const;
  static HessianAccumulator load(const std::filesystem::path& path);

 private:
  void add_rows(const float* X, int64_t t);
  int64_t k_ = 0;
  int64_t tokens_ = 0;
  int64_t samples_ = 0;
  Eigen::MatrixXf sum_;  // [k, k] lower triangle accumulated; the upper is mirrored on read
};

// Reference: H = (2/N)·XᵀX in double for a concatenation of all samples X [N, k] (tests).
Eigen::MatrixXd hessian_ref(const float* X, int64_t N, int64_t k);

}  // namespace marlinc
