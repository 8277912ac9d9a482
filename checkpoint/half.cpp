#include "checkpoint/half.h"

namespace marlinc {

// Chunks below this stay single-threaded: spawning threads costs more than converting.
static constexpr size_t kParallelMin = 1 << 16;

#define MARLINC_BULK(NAME, IN, OUT, FN)                                        \
  void NAME(const IN* in, OUT* out, size_t n) {                                \
    _Pragma("omp parallel for schedule(static) if (n >= kParallelMin)")        \
    for (long long i = 0; i < (long long)n; ++i) out[i] = FN(in[i]);          \
  }
MARLINC_BULK(half_to_float_n, uint16_t, float, half_to_float)
MARLINC_BULK(float_to_half_n, float, uint16_t, float_to_half)
MARLINC_BULK(bf16_to_float_n, uint16_t, float, bf16_to_float)
MARLINC_BULK(float_to_bf16_n, float, uint16_t, float_to_bf16)
#undef MARLINC_BULK

}  // namespace marlinc
