// Yardsticks for `verify --reference`: what a layer's error against its original weights should be,
// computed from the original alone, so that a checkpoint cannot set how strictly it is checked.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "packer/quantized_linear.h"

namespace marlinc {

// The scheme a naive quantizer applies: the layer's bits, group size (-1: one group over k), zero
// points (sym: fixed at 2^(bits-1)) and 2:4 sparsity.
struct NaiveScheme {
  int bits = 4;
  int group_size = -1;
  bool sym = true;
  bool sparse24 = false;
};

// ‖W − Ŵ‖_F / ‖W‖_F for Ŵ the round-to-nearest of W [n, k] (HF orientation) on min-max grids of
// `s`'s groups of consecutive rows of k (sym: scale 2·absmax/maxq; asym: (max − min)/maxq with a
// rounded zero point), no clipping, and with sparse24 the two largest of every 4 consecutive weights
// of k kept (magnitude 2:4). Scales stay in double: this is a yardstick, not a packing.
// GPTQ's error feedback and SparseGPT's masks trade weight error for output error, so their weight
// error is a small multiple of this; a wrong scale or code pattern across a layer is far above it.
double naive_rtn_error(const float* W /*[n, k]*/, int64_t n, int64_t k, const NaiveScheme& s);

// Median over the layer's (group, column) pairs of the stored scale over the min-max scale of the
// original weights of that group (its rows by q's g_idx, the kept ones under a 2:4 mask): about 1
// for any quantizer of q's grid (clip searches shrink some groups; GPTQ's error feedback moves the
// weights it derives scales from by a little), far from 1 where the scales were scaled or swapped.
// 0 when no group has a non-zero range.
// `kept` [k, n] (1 = kept) or empty: the weights that count (q.mask for a 2:4 layer).
double median_scale_ratio(const float* W /*[n, k]*/, const QuantizedLinear& q, std::span<const uint8_t> kept);

// Distribution of per-weight distances |w − ŵ| / scale, in quantization steps, binned at
// 1/kBinsPerStep up to kMaxSteps (beyond: the last bin): how many of a layer's weights sit further from
// their originals than rounding puts them tells round-to-nearest from error feedback.
class StepHistogram {
 public:
  static constexpr int kBinsPerStep = 64;
  static constexpr int kMaxSteps = 64;
  StepHistogram() : bins_(size_t(kBinsPerStep) * kMaxSteps + 1, 0) {}
  void add(double steps);
  // Fraction of the samples at or above `steps`, rounded down to a bin edge (0 when empty).
  double fraction_above(double steps) const;
  int64_t count() const { return count_; }

 private:
  std::vector<int64_t> bins_;
  int64_t count_ = 0;
};

}  // namespace marlinc
