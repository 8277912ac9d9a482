// `marlinc verify`: certify every quantized layer of a checkpoint (Marlin, Marlin-24, GPTQ, ...).
// Per layer: structure (tensors, dtypes, shapes, config agreement, finite non-zero scales, valid 2:4
// metadata, g_idx), layout (unpack -> repack reproduces the stored bytes), arithmetic (a GEMM on the
// packed weights against a float64 reference), and optionally the error against the original
// FP16/BF16 weights. The result is a report and a JSON certificate.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace marlinc {

// Gates, named so the certificate can record them. Mean relative error is the original tests' measure:
// mean|C - C_ref| / mean|C_ref| (IST marlin test.py gates dense at 1e-3, Sparse-Marlin at 2e-3).
struct VerifyTolerances {
  double arith_mean_rel_dense = 1e-3;
  double arith_mean_rel_24 = 2e-3;
  // Layers with bf16 scales run the bf16 kernel: bf16 keeps 8 significant bits, so the scaled weight
  // and the output each round at 2^-9 relative (fp16: 2^-12). The kernel tests' bf16 gate
  // (tests/gpu/test_marlin.cpp, kTolBF16).
  double arith_mean_rel_bf16 = 4e-3;
  // A layer whose error against the reference is this many times its peers' median is an outlier.
  double outlier_factor = 4.0;
  // Against the reference, whatever made the checkpoint: the weight error at most this many times a naive
  // round-to-nearest's on the same scheme (measured on the sample's outputs: RTN with the clip search
  // 0.84-0.92x, GPTQ 1.2-1.7x, SparseGPT 2:4 1.2-1.6x; every scale doubled gives 9x), and the median
  // stored scale within this range of the original groups' min-max scales (measured 0.81-1.0: the clip
  // searches shrink; tools that take a group's scale from weights GPTQ already moved widen it a little;
  // every scale x1.4 after a clip search, or x1.3 without one, leaves it).
  double max_error_vs_naive = 3.0;
  double scale_ratio_min = 0.5, scale_ratio_max = 1.25;
};

struct VerifyOptions {
  std::optional<std::filesystem::path> reference;  // FP16/BF16 checkpoint the layers came from
  std::vector<int> batch_sizes = {1, 13, 67};      // 1, one not a multiple of 16, one > 64
  uint64_t seed = 0;                               // activations are drawn from this seed
  bool force_cpu = false;                          // skip the GPU kernel even when one is present
  VerifyTolerances tol;
};

struct CheckResult {
  std::string name;  // "structure", "layout", "arithmetic", "reference"
  bool ok = true;
  std::string detail;
};

struct ArithSample {
  int m = 0;
  double mean_rel_err = 0, max_rel_err = 0;
  bool finite = true;
};

struct LayerReport {
  std::string name;
  int64_t k = 0, n = 0;
  int bits = 0, group_size = 0;
  bool sparse24 = false, act_order = false;
  std::vector<std::pair<std::string, std::string>> tensor_sha256;  // tensor name -> hash of its bytes
  std::vector<CheckResult> checks;
  std::vector<ArithSample> arith;
  std::string activations;  // "fp16" or "bf16": the kernel the arithmetic check ran (the scales' type)
  double weight_rel_err = -1, output_rel_err = -1;  // against --reference; -1 when not run
  // Against --reference (-1 when not run): a naive round-to-nearest's error of the original weights on the
  // layer's scheme, the median stored / min-max scale (reference_error.h), and the fraction of kept weights
  // more than verify.cpp's kNearStep steps from their originals.
  double naive_rel_err = -1, scale_ratio = -1, far_fraction = -1;
  bool outlier = false;
  double seconds = 0;
  bool ok() const;
};

struct VerifyReport {
  std::string checkpoint;
  std::string format;          // detected format name
  std::string backend;         // "cuda:<gpu name>" or "cpu (kernel-emulating reference GEMM)"
  std::vector<std::string> format_notes;
  std::vector<std::pair<std::string, std::string>> files;  // file name -> sha256
  std::vector<std::string> global_problems;  // unexpected tensors, config disagreements, ...
  std::vector<LayerReport> layers;
  VerifyTolerances tol;
  // The options the numbers depend on: the activations' seed and the reference checkpoint ("" = none).
  uint64_t seed = 0;
  std::string reference;
  bool ok() const;
  nlohmann::json certificate() const;  // everything above plus tool version, build and date
};

using LayerCallback = std::function<void(const LayerReport&, size_t index, size_t total)>;

// Throws marlinc::Error only when the checkpoint cannot be opened at all; every per-layer problem is
// recorded in the report instead, so one bad layer does not hide the others.
VerifyReport verify_checkpoint(const std::filesystem::path& dir, const VerifyOptions& opt,
                               const LayerCallback& on_layer = {});

// Quick re-check against a certificate: file hashes, the layer list and every tensor's hash.
// Returns the problems found (empty = the directory still matches the certificate).
std::vector<std::string> check_certificate(const std::filesystem::path& dir, const nlohmann::json& cert);

}  // namespace marlinc
