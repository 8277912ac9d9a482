// Argument checks shared by the packer's layout functions. Each throws marlinc::Error naming the
// function, the offending value and the layout rule, so adapters can prefix the tensor name.
#pragma once
#include <cstdint>
#include <string>

#include "checkpoint/error.h"

namespace marlinc::packcheck {

inline void bits_4_or_8(const char* fn, int bits) {
  if (bits != 4 && bits != 8)
    bad_usage(std::string(fn) + ": bits=" + std::to_string(bits) + " unsupported (Marlin packs 4- or 8-bit codes)");
}
inline void bits_248(const char* fn, int bits) {
  if (bits != 2 && bits != 4 && bits != 8)
    bad_usage(std::string(fn) + ": bits=" + std::to_string(bits) + " unsupported (32-bit words hold 2-, 4- or 8-bit codes)");
}
inline void positive(const char* fn, const char* what, int64_t v) {
  if (v <= 0) bad_data(std::string(fn) + ": " + what + "=" + std::to_string(v) + " must be positive");
}
inline void multiple(const char* fn, const char* what, int64_t v, int64_t m, const char* rule) {
  if (v <= 0 || v % m != 0)
    bad_data(std::string(fn) + ": " + what + "=" + std::to_string(v) + " must be a positive multiple of " +
             std::to_string(m) + " (" + rule + ")");
}

// Codes must fit in `bits`: an out-of-range code would spill into its neighbours' nibbles (spec §9.10).
// Fast OR-reduction first; the slow scan only runs to name the first offender.
inline void codes_fit(const char* fn, const uint8_t* codes, int64_t rows, int64_t cols, int bits,
                      const char* what = "code") {
  const int64_t total = rows * cols;
  unsigned acc = 0;
#pragma omp parallel for reduction(| : acc) schedule(static)
  for (long long i = 0; i < total; ++i) acc |= codes[i];
  if ((acc >> bits) == 0) return;
  const int maxq = (1 << bits) - 1;
  for (int64_t i = 0; i < total; ++i)
    if (codes[i] > maxq)
      bad_data(std::string(fn) + ": " + what + " " + std::to_string(codes[i]) + " at (" + std::to_string(i / cols) +
               ", " + std::to_string(i % cols) + ") exceeds " + std::to_string(maxq) + " (" + std::to_string(bits) +
               "-bit codes are 0.." + std::to_string(maxq) + ")");
}

}  // namespace marlinc::packcheck
