// Helpers shared by the GPTQ back ends (CPU fast path, scalar reference, CUDA); not a public API.
#pragma once
#include <algorithm>
#include <vector>

#include "quantizer/gptq.h"

namespace marlinc::gptq {

// Effective group length (k for per-channel) and lazy-update block: with groups the block is a
// multiple of the group (raised to it when smaller); with 2:4 a multiple of 4.
inline int effective_group(const GptqOptions& o, int64_t k) { return o.group_size <= 0 ? int(k) : o.group_size; }
inline int effective_block(const GptqOptions& o) {
  if (o.group_size > 0) return o.block < o.group_size ? o.group_size : o.block - o.block % o.group_size;
  return o.sparse24 ? std::max(4, o.block - o.block % 4) : o.block;
}

// True when scales are fitted during the loop at processing-order group boundaries.
inline bool dynamic_groups(const GptqOptions& o) { return o.order != GptqOptions::StaticActOrder; }

// Row of the [G, n] scale tensor used by processing position p.
inline int64_t scale_row(const GptqOptions& o, const Prepared& P, int64_t p) {
  if (o.group_size <= 0) return 0;
  return o.order == GptqOptions::DynamicActOrder ? p / P.group : P.perm[size_t(p)] / P.group;
}

// U_gg⁻¹ [g, g] row-major (upper) for every processing-order group: the weighting of Marlin's clip
// objective. Empty when the clip search does not run in the loop.
std::vector<RowMatrixXd> clip_weights(const GptqOptions& o, const Prepared& P);

// Weighting of the static-group clip search for natural group gi: chol(H_gg + damp_abs·I) lower,
// [g, g] row-major, with zero (dead) diagonals set to 1 first; identity on failure or RTN fallback.
// Double, like every weighting: the same host function serves the CUDA back end.
RowMatrixXd static_clip_weight(const Eigen::MatrixXf& H, int64_t gi, int64_t g, double damp_abs, bool fell_back);

// Empty QuantizedLinear of the right shape for the options (codes/scales/mask/g_idx sized).
QuantizedLinear make_result(const GptqOptions& o, const Prepared& P);

// Fills stats (everything except the loss) once the codes are final.
void finish_stats(const float* W, const QuantizedLinear& q, const Prepared& P, double loss, double seconds,
                  GptqStats* stats);

// Saliency order of one 2:4 group: the 2 positions (of 4) with the smallest w²/d² are pruned; ties
// prune the lower index first. Returns a 4-bit mask of PRUNED positions. Double (working weights and
// U are), so that both back ends order near-equal saliencies alike.
inline unsigned prune_24(const double w[4], const double d[4]) {
  double s[4];
  for (int t = 0; t < 4; ++t) s[t] = (w[t] * w[t]) / (d[t] * d[t]);
  unsigned pruned = 0;
  for (int rep = 0; rep < 2; ++rep) {
    int best = -1;
    for (int t = 0; t < 4; ++t)
      if (!(pruned >> t & 1u) && (best < 0 || s[t] < s[best])) best = t;
    pruned |= 1u << best;
  }
  return pruned;
}

}  // namespace marlinc::gptq
