// The k-group tree of reduce_kgroups (kernels/marlin_kernel.cuh) as plain C++, so that CPU tests replay it
// (tests/kernels/test_kgroup_tree.cpp): which groups hand their partial sums over at each step, which shared-memory
// slot each writes, and which slots each remaining group adds, in which order.
//
// A step with `active` groups left sums r = RADIX of them into one (r = 2 once fewer than RADIX remain): groups
// q .. active - 1 (q = active / r) write, group w < q adds those of w + q, w + 2q, ..., w + (r - 1) q in that
// order. Group 0 ends up with every group's sums, each added once, in an order fixed by KG and RADIX alone.
#pragma once

#include "kernels/marlin_partition.h"  // MARLINC_PART_HD

namespace marlinc::kernels {

struct KgroupStep { int r, q; };  // groups per sum, and the groups left after the step
MARLINC_PART_HD constexpr KgroupStep kgroup_step(int active, int radix) {
  const int r = active >= radix ? radix : 2;
  return {r, active / r};
}
// The slot group wk (q <= wk < active) writes, and the slot group w (< q) reads as its i-th addend (1 <= i < r).
MARLINC_PART_HD constexpr int kgroup_write_slot(int wk, int q) { return wk - q; }
MARLINC_PART_HD constexpr int kgroup_read_slot(int w, int q, int i) { return w + (i - 1) * q; }
// Slots the tree needs: the first step's writers, the most of any step.
template <int KG, int RADIX = 2>
constexpr int kgroup_red_slots() {
  return KG < 2 ? 0 : KG - kgroup_step(KG, RADIX).q;
}
static_assert(kgroup_red_slots<16>() == 8 && kgroup_red_slots<16, 4>() == 12 && kgroup_red_slots<8, 4>() == 6 &&
                  kgroup_red_slots<4, 4>() == 3 && kgroup_red_slots<2, 4>() == 1,
              "16 groups: 8 writers in steps of two, 12 in steps of four (then 3); 2 groups: one step of two");

}  // namespace marlinc::kernels
