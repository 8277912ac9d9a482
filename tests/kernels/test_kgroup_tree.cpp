// The k-group tree of reduce_kgroups (kernels/kgroup_tree.h), replayed on the CPU: every group's sums reach group
// 0 exactly once, through slots inside the reserved area that no two writers of a step share, and each reader
// takes the slot its addend's writer filled. A wrong slot or step formula loses or doubles a warp's products.
#include <cstdint>
#include <vector>

#include "kernels/kgroup_tree.h"
#include "tests/common.h"

using namespace marlinc::kernels;

namespace {

// Replays the tree for kg groups: each group starts with the bit of its own id; returns group 0's sum as a count
// per id (1 each when correct). `slots`: the area reserved (kgroup_red_slots); `steps`: the steps taken.
std::vector<int> replay(int kg, int radix, int slots, int* steps, bool* slots_ok) {
  std::vector<std::vector<int>> sums(size_t(kg), std::vector<int>(size_t(kg), 0));
  for (int w = 0; w < kg; ++w) sums[size_t(w)][size_t(w)] = 1;
  *steps = 0;
  *slots_ok = true;
  for (int active = kg; active > 1; active = kgroup_step(active, radix).q) {
    const KgroupStep st = kgroup_step(active, radix);
    std::vector<int> writer(size_t(slots), -1);
    for (int wk = st.q; wk < active; ++wk) {
      const int s = kgroup_write_slot(wk, st.q);
      if (s < 0 || s >= slots || writer[size_t(s)] != -1) {
        *slots_ok = false;
        continue;
      }
      writer[size_t(s)] = wk;
    }
    for (int w = 0; w < st.q; ++w)
      for (int i = 1; i < st.r; ++i) {
        const int s = kgroup_read_slot(w, st.q, i);
        if (s < 0 || s >= slots || writer[size_t(s)] != w + i * st.q) {
          *slots_ok = false;
          continue;
        }
        for (int id = 0; id < kg; ++id) sums[size_t(w)][size_t(id)] += sums[size_t(w + i * st.q)][size_t(id)];
      }
    ++*steps;
  }
  return sums[0];
}

}  // namespace

TEST_CASE("kgroup tree: every group's sums reach group 0 once, through distinct slots", "[kernels][kgroup]") {
  struct Case { int kg, radix, slots, steps; };
  // Slots from kgroup_red_slots; steps: log2(kg) in twos, two for 16 and 8 groups in fours, one for 4.
  const Case cases[] = {{2, 2, kgroup_red_slots<2>(), 1},      {4, 2, kgroup_red_slots<4>(), 2},
                        {8, 2, kgroup_red_slots<8>(), 3},      {16, 2, kgroup_red_slots<16>(), 4},
                        {2, 4, kgroup_red_slots<2, 4>(), 1},   {4, 4, kgroup_red_slots<4, 4>(), 1},
                        {8, 4, kgroup_red_slots<8, 4>(), 2},   {16, 4, kgroup_red_slots<16, 4>(), 2}};
  for (const Case& c : cases) {
    INFO("groups " << c.kg << ", radix " << c.radix);
    int steps = 0;
    bool slots_ok = false;
    const std::vector<int> got = replay(c.kg, c.radix, c.slots, &steps, &slots_ok);
    REQUIRE(slots_ok);
    REQUIRE(steps == c.steps);
    for (int id = 0; id < c.kg; ++id) {
      INFO("group " << id);
      REQUIRE(got[size_t(id)] == 1);
    }
  }
  // One slot fewer than reserved makes some writer fall outside: the replay notices.
  int steps = 0;
  bool slots_ok = true;
  replay(16, 4, kgroup_red_slots<16, 4>() - 1, &steps, &slots_ok);
  REQUIRE_FALSE(slots_ok);
}
