// CPU replay of whole fused-kernel launches (kernels/marlin_partition.h): every block walks its stripe
// exactly as the kernels do, and the replay checks that every (row chunk, column slice, k tile) is
// computed once, that the blocks sharing a slice agree on its first/last block, that the finisher is one
// of them, that the deposit/finish hand-off cannot deadlock, and that block indices stay inside the
// workspace's locks and partial-tile slots — for the mma.sync tiles and the Hopper kernel's tiles, on
// 1 to 132 SMs.
#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "kernels/marlin_dispatch.h"
#include "kernels/marlin_partition.h"
#include "tests/common.h"

using namespace marlinc::kernels;

namespace {

struct Launch {
  int m, n, k, rows, tn, tk, sms, max_blocks;
  size_t part_floats;     // floats one block deposits
  size_t slot_floats;     // workspace floats per SM for partial tiles
};

struct Seg { int pc, slice, kt0, cnt, first_b, last_b; };

// whole: slices per block of a whole-slice partition (0: stripes).
void replay(const Launch& L, int whole = 0) {
  INFO("m " << L.m << " n " << L.n << " k " << L.k << " rows " << L.rows << " tile " << L.tk << "x" << L.tn << " sms "
            << L.sms << " max_blocks " << L.max_blocks << " whole slices " << whole);
  const int n_tiles = L.n / L.tn, k_tiles = L.k / L.tk;
  const Partition P = marlin_partition(L.m, n_tiles, k_tiles, L.rows, L.max_blocks, whole);
  REQUIRE(P.grid >= 1);
  REQUIRE(P.grid <= L.max_blocks);  // co-residency of the whole launch
  REQUIRE(P.grid <= L.sms * kMaxBlocksPerSm);  // one lock per block
  REQUIRE(size_t(P.grid) * L.part_floats <= size_t(L.sms) * L.slot_floats);  // partial-tile slots

  const int nk = n_tiles * k_tiles;
  std::vector<std::vector<Seg>> segs(size_t(P.grid));
  std::vector<int> covered(size_t(P.par) * nk, 0);
  for (int b = 0; b < P.grid; ++b) {
    const int group = b / P.chunk_blocks, local = b % P.chunk_blocks, base_b = group * P.chunk_blocks;
    for (int pc = group; pc < P.par; pc += P.chunk_groups) {
      int it = local * P.iters;
      const int it_end = std::min(it + P.iters, nk);
      while (it < it_end) {
        const int slice = it / k_tiles, kt0 = it % k_tiles;
        const int cnt = std::min(it_end, (slice + 1) * k_tiles) - it;
        if (cnt < 1) FAIL("empty segment in block " << b);
        segs[size_t(b)].push_back({pc, slice, kt0, cnt, slice_first_block(base_b, slice, k_tiles, P.iters),
                                   slice_last_block(base_b, slice, k_tiles, P.iters)});
        for (int t = 0; t < cnt; ++t) ++covered[size_t(pc) * nk + size_t(slice) * k_tiles + kt0 + t];
        it += cnt;
      }
    }
  }
  const size_t not_once = size_t(std::count_if(covered.begin(), covered.end(), [](int c) { return c != 1; }));
  REQUIRE(not_once == 0);

  // Blocks covering each (chunk, slice), and the bounds every one of them computed.
  std::map<std::pair<int, int>, std::vector<int>> who;
  std::map<std::pair<int, int>, std::pair<int, int>> bounds;
  for (int b = 0; b < P.grid; ++b)
    for (const Seg& s : segs[size_t(b)]) {
      const auto key = std::make_pair(s.pc, s.slice);
      who[key].push_back(b);
      const auto bl = std::make_pair(s.first_b, s.last_b);
      if (bounds.count(key) && bounds[key] != bl) FAIL("blocks disagree on the first/last block of a slice");
      bounds[key] = bl;
    }
  size_t bad_slices = 0;
  for (auto& [key, blocks] : who) {
    std::sort(blocks.begin(), blocks.end());
    const auto [first_b, last_b] = bounds[key];
    // The finisher is the slice's first block; the blocks are contiguous, each once.
    if (blocks.front() != first_b || blocks.back() != last_b || int(blocks.size()) != last_b - first_b + 1)
      ++bad_slices;
  }
  REQUIRE(bad_slices == 0);

  // Early deposits (slice_early_deposit): the Hopper kernel's producer waits for the deposit while the finisher
  // computes the slice's last tiles, so the other block must make it first thing in its stripe, and the finisher
  // must have at least half a slice of tiles more than that to run before it starts the slice.
  if (slice_early_deposit(P.iters, k_tiles, L.rows)) {
    size_t late = 0;
    for (int b = 0; b < P.grid; ++b) {
      int before = 0;  // tiles this block runs before the segment
      for (const Seg& s : segs[size_t(b)]) {
        const int count = s.last_b - s.first_b + 1;
        if (count > 1 && b == s.first_b) {
          const auto& dep = segs[size_t(s.last_b)];
          const bool first_thing = count == 2 && !dep.empty() && dep.front().pc == s.pc && dep.front().slice == s.slice;
          if (!first_thing || 2 * (before - dep.front().cnt) < k_tiles) ++late;
        }
        before += s.cnt;
      }
    }
    REQUIRE(late == 0);
  }
  if (whole > 0) {  // whole slices: none shared
    size_t shared = 0;
    for (const auto& [key, blocks] : who) shared += blocks.size() == 1 ? 0 : 1;
    REQUIRE(shared == 0);
  }

  // The hand-off: a depositor never waits; a finisher waits for count - 1 deposits. Blocks run their
  // segments in order; every block must get through (no cycle of finishers waiting on each other).
  std::map<std::pair<int, int>, int> deposits;
  std::vector<size_t> pos(size_t(P.grid), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int b = 0; b < P.grid; ++b) {
      while (pos[size_t(b)] < segs[size_t(b)].size()) {
        const Seg& s = segs[size_t(b)][pos[size_t(b)]];
        const int count = s.last_b - s.first_b + 1;
        const auto key = std::make_pair(s.pc, s.slice);
        if (count > 1 && b != s.first_b) ++deposits[key];
        else if (count > 1 && deposits[key] != count - 1) break;  // the finisher waits
        ++pos[size_t(b)];
        progress = true;
      }
    }
  }
  int stuck = 0;
  for (int b = 0; b < P.grid; ++b) stuck += pos[size_t(b)] == segs[size_t(b)].size() ? 0 : 1;
  REQUIRE(stuck == 0);
}

// The Hopper kernel's k-split (marlin_split_partition, walked as the kernel does with stream_ranges): every tile of
// every row chunk once, each slice in `split` parts of one block each, consecutive from the slice's first block
// (the spread finish's base_b + slice x split), no part empty or more than iters deep, and the whole launch
// co-resident and inside the workspace's locks and slots.
void replay_split(const Launch& L, int split) {
  INFO("split " << split << " m " << L.m << " n " << L.n << " k " << L.k << " rows " << L.rows << " sms " << L.sms);
  const int n_tiles = L.n / L.tn, k_tiles = L.k / L.tk, nk = n_tiles * k_tiles;
  const Partition P = marlin_split_partition(L.m, n_tiles, k_tiles, L.rows, split);
  REQUIRE(P.grid <= L.max_blocks);
  REQUIRE(size_t(P.grid) * L.part_floats <= size_t(L.sms) * L.slot_floats);
  std::vector<int> covered(size_t(P.par) * nk, 0);
  size_t wrong = 0;
  for (int b = 0; b < P.grid; ++b) {
    const int group = b / P.chunk_blocks, local = b % P.chunk_blocks, base_b = group * P.chunk_blocks;
    const StreamRanges r = stream_ranges(local, P.chunk_blocks, 0, split, P.iters, n_tiles, k_tiles);
    const int slice = r.t0 / k_tiles;
    // One slice per block, its part's place in the slice's blocks, and a part of 1 to iters tiles.
    wrong += r.t1 > r.t0 && r.t1 - r.t0 <= P.iters && (r.t1 - 1) / k_tiles == slice ? 0 : 1;
    wrong += base_b + slice * split + local % split == b ? 0 : 1;
    for (int pc = group; pc < P.par; pc += P.chunk_groups)
      for (int t = r.t0; t < r.t1; ++t) ++covered[size_t(pc) * nk + size_t(t)];
  }
  REQUIRE(wrong == 0);
  REQUIRE(std::count_if(covered.begin(), covered.end(), [](int c) { return c != 1; }) == 0);
}

struct Shape2 { int k, n; };
const Shape2 kLayers[] = {{128, 256}, {1024, 768}, {4096, 6144}, {14336, 4096}, {8192, 10240}, {28672, 8192}};
const int kSms[] = {1, 2, 3, 7, 16, 132};
const int kMs[] = {1, 17, 33, 64, 100, 256, 1000};

}  // namespace

TEST_CASE("partition: mma.sync launches cover every tile once and finish", "[kernels][partition]") {
  const int tiles[3][2] = {{128, 128}, {256, 64}, {64, 128}};  // (thread_n, thread_k)
  for (const Shape2& s : kLayers)
    for (auto& t : tiles) {
      if (s.n % t[0] != 0 || s.k % t[1] != 0) continue;
      for (int mb = 1; mb <= kMaxMBlocks; ++mb)
        for (int sms : kSms)
          for (int bps : {1, 2})
            for (int m : kMs) {
              if (s.k * int64_t(s.n) > (int64_t(1) << 26) && m != 1000 && m != 17) continue;  // keep it quick
              const Launch L{m, s.n, s.k, 16 * mb, t[0], t[1], sms, sms * bps, size_t(16 * mb) * t[0],
                             kMaxBlocksPerSm * kPartFloatsPerBlock};
              replay(L);
            }
    }
}

// MarlinGemm::mma_parts and Auto's shallow-layer rule (kernels/marlin_dispatch.h, mma_auto_parts): the grid cut to
// about `parts` blocks a slice still covers every tile once; one part gives every block whole slices.
TEST_CASE("partition: mma.sync launches with fewer blocks per slice", "[kernels][partition]") {
  const int shallow[][2] = {{896, 896},   {896, 1152},  {1152, 384}, {1536, 1536},
                             {2048, 1024}, {3072, 1024}, {4864, 896}};
  for (auto& kn : shallow)
    for (int tn : {64, 128})
      for (int mb : {1, 2, 4})
        for (int parts : {1, 2, 3, 4, 7})
          for (int sms : {3, 132})
            for (int m : {1, 16, 33, 64, 100}) {
              if (kn[1] % tn != 0) continue;
              const int k_tiles = kn[0] / 128, n_tiles = kn[1] / tn, rows = 16 * mb, all = sms * 2;
              const int blocks = mma_parts_blocks(m, n_tiles, k_tiles, rows, all, parts);
              const Launch L{m, kn[1], kn[0], rows, tn, 128, sms, blocks, size_t(rows) * tn,
                             kMaxBlocksPerSm * kPartFloatsPerBlock};
              replay(L);
              const Partition P = marlin_partition(m, n_tiles, k_tiles, rows, blocks);
              INFO("parts " << parts << " blocks " << blocks << " of " << all << " iters " << P.iters);
              if (blocks < all) CHECK(P.iters >= (k_tiles + parts - 1) / parts);  // the cap bound: stripes no shorter
              if (parts == 1 && blocks < all) CHECK(P.iters % k_tiles == 0);  // whole slices, none shared
              // As many parts as k tiles or more: the plain stripes (the GPU tests' kPlainStripes).
              const Partition plain = marlin_partition(m, n_tiles, k_tiles, rows, all);
              const Partition wide = marlin_partition(m, n_tiles, k_tiles, rows,
                                                      mma_parts_blocks(m, n_tiles, k_tiles, rows, all, k_tiles + parts));
              CHECK(wide.iters == plain.iters);
              CHECK(wide.grid == plain.grid);
              CHECK(wide.chunk_blocks == plain.chunk_blocks);
            }
}

TEST_CASE("partition: Hopper kernel launches stay inside the workspace and finish", "[kernels][partition]") {
  for (const Shape2& s : kLayers) {
    if (s.n % kWgmmaTileN != 0 || s.k % kWgmmaTileK != 0) continue;
    for (int tile : {8, 16, 32, 48, 64, 128, kWgmmaWideRows, -128, 144, 176, 208, 240})  // -128: 128 x 128; fit tiles
      for (int occ : {1, 2, 3})
        for (int sms : kSms)
          for (int m : kMs) {
            if (s.k * int64_t(s.n) > (int64_t(1) << 26) && m != 1000 && m != 17) continue;
            const int rows = tile < 0 ? -tile : tile, tn = tile < 0 ? kWgmmaWideTileN : wgmma_tile_n(rows);
            const Launch L{m, s.n, s.k, rows, tn, kWgmmaTileK, sms, sms * wgmma_blocks_per_sm(occ, rows, tn),
                           size_t(tn) * rows, kWgmmaPartFloats};
            replay(L);
            // Whole slices, as the launcher asks for them and with 1-3 slices per block wherever the grid
            // fits the blocks (no slice shared: nothing deposited or waited for).
            const int picked = wgmma_whole_slices(m, s.n, rows, L.max_blocks, tn);
            if (picked > 0) replay(L, picked);
            const int64_t par = (m + rows - 1) / rows, slices = s.n / tn;
            for (int each = 1; each <= 3; ++each)
              if (par * ((slices + each - 1) / each) <= L.max_blocks) replay(L, each);
            // The k-split where the launcher takes it (the tiles with a split form).
            if (wgmma_split_tile(rows, tn) && picked == 0) {
              const Partition P = marlin_partition(m, s.n / tn, s.k / kWgmmaTileK, rows, L.max_blocks);
              const int split = wgmma_split_parts(P.par, s.n / tn, s.k / kWgmmaTileK, L.max_blocks, P.iters);
              if (split > 0) replay_split(L, split);
            }
          }
  }
  // The Llama-3-8B and 70B layers at the benchmark's large m on an H100's 132 SMs, in whole slices where
  // wgmma_whole_slices takes them and in stripes otherwise (also where the launcher takes the pair form): among
  // them stripes of 1.2 to 3.4 slices, where slice_early_deposit decides whether the deposit comes early.
  const Shape2 llama[] = {{4096, 6144}, {4096, 4096}, {4096, 28672}, {14336, 4096},
                          {8192, 10240}, {8192, 8192}, {8192, 57344}, {28672, 8192}};
  for (const Shape2& s : llama)
    for (int m : {128, 256, 512, 1024})
      for (int rows : {128, kWgmmaWideRows}) {
        const int sms = 132, tn = wgmma_tile_n(rows);
        const Launch L{m, s.n, s.k, rows, tn, kWgmmaTileK, sms, sms, size_t(tn) * rows, kWgmmaPartFloats};
        replay(L, wgmma_whole_slices(m, s.n, rows, sms));
      }
  // The slot bound itself: 128-row tiles fill a whole SM's slots, so one block per SM whatever the
  // occupancy; 32-row tiles would fit four but the locks allow two.
  REQUIRE(wgmma_blocks_per_sm(2, 128) == 1);
  REQUIRE(wgmma_blocks_per_sm(4, 32) == kMaxBlocksPerSm);
  REQUIRE(wgmma_blocks_per_sm(1, 64) == 1);
  REQUIRE(wgmma_blocks_per_sm(2, kWgmmaWideRows) == 1);  // 256 x 128: the same 32768 floats as 128 x 256
}

// The producer form's last-chunk box (tma_tail_rows): where m ends inside a row chunk, the whole chunks before it
// and the tail box's rows are exactly m, and the box never exceeds a chunk; where m fills its chunks there is no
// tail box (the kernel then takes the full map everywhere).
TEST_CASE("partition: the last row chunk's activation box holds exactly the rows before m", "[kernels][partition]") {
  for (int rows : {8, 16, 32, 48, 64, 128, 144, 160, 176, 192, 208, 224, 240, kWgmmaWideRows})
    for (int m = 1; m <= 3 * rows + 1; ++m) {
      const Partition P = marlin_partition(m, 4, 8, rows, 132);
      const int tail = tma_tail_rows(m, rows);
      INFO("rows " << rows << " m " << m);
      REQUIRE(tail >= 0);
      REQUIRE(tail < rows);
      if (m % rows == 0) REQUIRE(tail == 0);
      else REQUIRE((P.par - 1) * rows + tail == m);
    }
}

// The spread finish's shares (spread_share_begin): for any number of live 8-token row groups (1 to 32: up to the
// 256-row tiles) and of blocks on a slice, every group has exactly one owner, g * parts / live, the shares are
// contiguous and differ by at most one group, and spread_owners counts the blocks that own one (the counter's
// re-arm waits for exactly that many).
TEST_CASE("partition: the k-split's shares cover every live row group once", "[kernels][partition]") {
  for (int parts = kSpreadMinParts; parts <= 132; ++parts)
    for (int live = 1; live <= 32; ++live) {
      INFO("parts " << parts << " live " << live);
      REQUIRE(spread_share_begin(0, live, parts) == 0);
      REQUIRE(spread_share_begin(parts, live, parts) == live);
      int owners = 0, smallest = live, largest = 0;
      for (int i = 0; i < parts; ++i) {
        const int g0 = spread_share_begin(i, live, parts), g1 = spread_share_begin(i + 1, live, parts);
        REQUIRE(g0 <= g1);
        for (int g = g0; g < g1; ++g) REQUIRE(g * parts / live == i);
        owners += g1 > g0 ? 1 : 0;
        if (g1 > g0) smallest = std::min(smallest, g1 - g0), largest = std::max(largest, g1 - g0);
      }
      REQUIRE(owners == spread_owners(live, parts));
      REQUIRE(largest - smallest <= 1);
    }
}

// Which launches take the k-split (wgmma_split_parts; 132 SMs, 64-row tiles, one row chunk): four parts or more a
// slice, and the longest part's tiles beyond the stripes' cheaper than the partials the stripes' finisher reads.
TEST_CASE("partition: the Hopper kernel's k-split plan", "[kernels][partition]") {
  auto split_of = [](int k, int n) {
    const Partition P = marlin_partition(64, n / kWgmmaTileN, k / kWgmmaTileK, 64, 132);
    return wgmma_split_parts(P.par, n / kWgmmaTileN, k / kWgmmaTileK, 132, P.iters);
  };
  REQUIRE(split_of(4096, 4096) == 8);    // 8B o: 16 slices of 64 tiles; the stripes (8 tiles) cut the same parts
  REQUIRE(split_of(14336, 4096) == 8);   // 8B down: 28 tiles a part
  REQUIRE(split_of(4096, 6144) == 5);    // 8B q/k/v: 24 slices; parts of 12-13 tiles against stripes of 12
  REQUIRE(split_of(3072, 3072) == 11);   // Llama-3.2-3B o: 12 slices of 48 in parts of 4-5, stripes of 5
  REQUIRE(split_of(28672, 8192) == 0);   // 70B down: 32 slices of 448 in parts of 112 against stripes of 109
  REQUIRE(split_of(27648, 5120) == 0);   // Qwen2.5-32B down: 20 slices of 432 in parts of 72 against 66
  REQUIRE(split_of(18944, 3584) == 9);   // Qwen2.5-7B down: 14 slices of 296 in parts of 33 against 32
  REQUIRE(split_of(5120, 7168) == 4);    // Qwen2.5-32B q/k/v: 28 slices of 80 in parts of 20, stripes of 17
  REQUIRE(split_of(8192, 10240) == 0);   // 70B q/k/v: parts of 43 against stripes of 39 whose finisher reads 2-3
  REQUIRE(split_of(4096, 8704) == 0);    // 34 slices of 64 in parts of 22 against stripes of 17
  REQUIRE(split_of(4096, 28672) == 0);   // 8B gate/up: 112 slices, one block each
  REQUIRE(split_of(3072, 16384) == 0);   // 64 slices: two parts each
  // Where the parts are as deep as the stripes: four parts or more, one row chunk.
  REQUIRE(wgmma_split_parts(1, 16, 64, 64, 16) == 4);
  REQUIRE(wgmma_split_parts(1, 16, 48, 48, 16) == 0);  // three parts
  REQUIRE(wgmma_split_parts(2, 16, 64, 128, 16) == 0);  // two row chunks
}
