#include "quantizer/calib/bpe.h"

#include <cstddef>
#include <queue>

namespace marlinc::calib {

void bpe_merge(std::vector<int32_t>& ids, const MergeTable& merges) {
  const int n = static_cast<int>(ids.size());
  if (n < 2) return;
  std::vector<int32_t> prev(n), next(n);  // [n] linked list over positions; -1 ends it
  std::vector<uint8_t> alive(n, 1);       // [n]
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    int32_t rank, pos, new_id;
  };
  // Lowest rank first, then leftmost position: the order HF tokenizers' Word::merge_all uses.
  auto worse = [](const Cand& a, const Cand& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
  auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (const auto* m = merges.find(ids[pos], ids[next[pos]])) heap.push({m->rank, pos, m->new_id});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    if (!alive[c.pos] || next[c.pos] < 0) continue;
    // The pair at pos may have changed since this candidate was pushed: re-check it is still this merge.
    const auto* m = merges.find(ids[c.pos], ids[next[c.pos]]);
    if (!m || m->rank != c.rank || m->new_id != c.new_id) continue;
    const int right = next[c.pos];
    ids[c.pos] = c.new_id;
    alive[right] = 0;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  int w = 0;
  for (int i = 0; i >= 0 && i < n; i = next[i]) ids[w++] = ids[i];
  ids.resize(w);
}

void bpe_merge_ref(std::vector<int32_t>& ids, const MergeTable& merges) {
  for (;;) {
    size_t best = ids.size();
    const MergeTable::Merge* bm = nullptr;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const auto* m = merges.find(ids[i], ids[i + 1]);
      if (m && (!bm || m->rank < bm->rank)) {
        bm = m;
        best = i;
      }
    }
    if (!bm) return;
    ids[best] = bm->new_id;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
}

}  // namespace marlinc::calib
