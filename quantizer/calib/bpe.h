// The BPE merge loop shared by the tokenizer.json readers: symbols in a linked list, candidate pairs in
// a priority queue ordered by (merge rank, position), stale entries skipped when popped. O(n log n) in
// the word length, so a whole document can be one "word" (SentencePiece-style files have no
// pre-tokenizer). bpe_merge_ref is the obvious O(n^2) rescan it is tested against.
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace marlinc::calib {

struct MergeTable {
  struct Merge {
    int32_t rank;    // position in the file's merges list: lower merges first
    int32_t new_id;  // id of the concatenated piece
  };
  std::unordered_map<uint64_t, Merge> pairs;  // key: (left id << 32) | right id
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Merge* find(int32_t a, int32_t b) const {
    auto it = pairs.find(key(a, b));
    return it == pairs.end() ? nullptr : &it->second;
  }
};

// Applies the merges to a word given as its initial symbol ids, in place: repeatedly the adjacent pair
// with the lowest rank (leftmost among equal ranks) is replaced by its merged id.
void bpe_merge(std::vector<int32_t>& ids, const MergeTable& merges);
void bpe_merge_ref(std::vector<int32_t>& ids, const MergeTable& merges);

}  // namespace marlinc::calib
