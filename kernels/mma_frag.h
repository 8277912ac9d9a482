// Where the streaming kernel's swapped products sit (kernels/sm90/marlin_stream.cuh, SWAP): plain C++, so that
// the lane arithmetic is checked on machines without a GPU (tests/kernels/test_marlin_dispatch.cpp).
//
// mma.m16n8k16 C fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"): lane L holds register r at row
// L / 4 + 8 (r / 2), column 2 (L % 4) + r % 2.
// - The 16-token form multiplies activations (rows: tokens) by weights (columns: an n8 tile a of the 64-column
//   block): acc[a] register r is token L / 4 + 8 (r / 2), column 8 a + 2 (L % 4) + r % 2.
// - SWAP multiplies weights (rows: 16 columns 16 j ...) by activations (columns: 8 tokens): c[j] register r is
//   column 16 j + L / 4 + 8 (r / 2), token 2 (L % 4) + r % 2.
#pragma once

#include "kernels/marlin_partition.h"  // MARLINC_PART_HD

namespace marlinc::kernels {

struct FragSource { int lane, reg; };

// The lane and the register of c[a / 2] that hold element e (0, 1) of acc[a] in lane `lane`: token g = lane / 4,
// column 8 a + 2 t + e (t = lane % 4), i.e. row 8 (a % 2) + 2 t + e of c[a / 2]'s 16 columns.
MARLINC_PART_HD constexpr FragSource swapped_frag_source(int lane, int a, int e) {
  const int g = lane >> 2, t = lane & 3;
  return {4 * (2 * t + e) + (g >> 1), 2 * (a & 1) + (g & 1)};
}

}  // namespace marlinc::kernels
