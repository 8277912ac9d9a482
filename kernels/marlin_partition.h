// The work split of one fused-kernel launch (both the mma.sync and the Hopper kernel), and the stripe
// bookkeeping every block derives from it. Plain C++ shared by the host launcher (kernels/marlin.cu),
// the kernels and a CPU replay of whole launches (tests/kernels/test_marlin_partition.cpp).
//
// par row chunks of `rows` rows; each chunk's n_tiles x k_tiles tiles (column slice major) are cut into
// stripes of `iters` consecutive tiles, one per block of a group of chunk_blocks blocks; chunk_groups
// groups. When every chunk gets a group (par <= max_blocks), the groups run the same stripes side by
// side and all but one read each weight tile from L2. Otherwise a block owns whole chunks (whole slices,
// no cross-block reduction) and walks them in turn. All blocks of a launch must be co-resident (a
// slice's finisher waits for the other blocks' deposits): grid <= max_blocks.
#pragma once
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define MARLINC_PART_HD __host__ __device__
#else
#define MARLINC_PART_HD
#endif

namespace marlinc::kernels {

// Rows of A per 16-row "m block"; an mma.sync thread block computes MB of them (MB = 1..4, 16..64 rows).
constexpr int kMaxMBlocks = 4;
// Widest mma.sync tile the workspace's fp32 partial-tile slots are sized for (thread_n = 256).
constexpr int kMaxThreadN = 256;
// At most this many co-resident blocks per SM are launched; the stripe reduction needs all blocks of
// one launch resident at once, and the workspace has one lock + partial-tile slot per block.
constexpr int kMaxBlocksPerSm = 2;
// fp32 floats of one block's partial-tile slot in the workspace (the mma.sync kernel's largest tile).
constexpr size_t kPartFloatsPerBlock = size_t(kMaxMBlocks) * 16 * kMaxThreadN;

// The Hopper (sm_90a, wgmma) kernel, kernels/sm90/: 256-column x 64-deep tiles and 8 to 128 token
// rows per tile, or 128-column ones of 128 to 256 rows (below). Its partial tiles take up to two mma.sync
// slots, so the workspace's kWgmmaPartFloats per SM bound its blocks per SM, as do the kMaxBlocksPerSm locks.
constexpr int kWgmmaTileN = 256;
constexpr int kWgmmaTileK = 64;
// The wide token tile: 256 rows over 128 columns (two packed 64-wide tiles), one m64n256 wgmma per warpgroup and
// k16 step, so that each expanded weight fragment feeds 256 tokens instead of 128 (kernels/sm90/wgmma_layout.h,
// kFeat128). Same partial-tile size as 128 x 256. Measured level with 128 x 256 (docs/PERF.md, thirty-first
// session), so only forced (MarlinGemm::wgmma_rows = 256). The same 128-column layout also serves 128-row tiles
// (128 x 128: Auto on narrow layers, kernels/marlin_dispatch.h, wgmma_prefer_128x128), half the partial tile.
constexpr int kWgmmaWideRows = 256;
constexpr int kWgmmaWideTileN = 128;
// Fit tiles: 128-column tiles of 144 to 240 rows in steps of 16 (the wide tile's layout, fewer tokens), so that m
// splits into row chunks with fewer rows past m than 128-row chunks leave (kernels/marlin_dispatch.h, wgmma_fit_rows).
constexpr int kWgmmaFitMinRows = 144, kWgmmaFitStep = 16;
MARLINC_PART_HD constexpr bool wgmma_fit_tile(int rows) {
  return rows >= kWgmmaFitMinRows && rows < kWgmmaWideRows && rows % kWgmmaFitStep == 0;
}
// 128 x 192 tiles (three consumer warpgroups; kernels/sm90/wgmma_layout.h, kFeat192) for layers with n % 192 == 0
// (kernels/marlin_dispatch.h, wgmma_prefer_192).
constexpr int kWgmmaTriTileN = 192;
// Tiles of more than 128 rows (the wide and the fit tiles) are 128 columns wide, the others 256.
MARLINC_PART_HD constexpr int wgmma_tile_n(int rows) { return rows > 128 ? kWgmmaWideTileN : kWgmmaTileN; }
constexpr size_t kWgmmaPartFloats = kMaxBlocksPerSm * kPartFloatsPerBlock;
static_assert(size_t(kWgmmaWideRows) * kWgmmaWideTileN <= kWgmmaPartFloats, "a wide tile's partial fits its slot");
inline int wgmma_blocks_per_sm(int occupancy, int rows, int tn = 0) {
  const int slots = int(kWgmmaPartFloats / (size_t(tn > 0 ? tn : wgmma_tile_n(rows)) * size_t(rows)));
  int b = occupancy < slots ? occupancy : slots;
  return b < kMaxBlocksPerSm ? b : kMaxBlocksPerSm;
}

struct Partition { int par, iters, chunk_blocks, chunk_groups, grid; };

inline int ceil_div_int(int64_t a, int64_t b) { return int((a + b - 1) / b); }

// Caller guarantees par * n_tiles * k_tiles fits an int (marlin.cu checks against INT_MAX / 2).
// whole_slices > 0 (where every chunk gets a group): each block of a group owns that many consecutive
// column slices for the whole depth (the group's last block fewer), so no slice is shared; the caller
// keeps the grid within max_blocks (kernels/marlin_dispatch.h, wgmma_whole_slices).
inline Partition marlin_partition(int m, int n_tiles, int k_tiles, int rows, int max_blocks, int whole_slices = 0) {
  Partition P{};
  P.par = ceil_div_int(m, rows);
  const int64_t nk = int64_t(n_tiles) * k_tiles;
  if (P.par <= max_blocks) {
    P.iters = whole_slices > 0 ? whole_slices * k_tiles : ceil_div_int(nk, max_blocks / P.par);
    P.chunk_blocks = ceil_div_int(nk, P.iters);
    P.chunk_groups = P.par;
  } else {
    P.iters = int(nk);
    P.chunk_blocks = 1;
    P.chunk_groups = max_blocks;
  }
  P.grid = P.chunk_groups * P.chunk_blocks;
  return P;
}

// The mma.sync kernel's grid for stripes of ceil(k_tiles / parts) tiles, so that about `parts` blocks share each column
// slice of a row chunk (parts = 1: every block owns whole slices and no block deposits a partial tile), at most
// max_blocks. MarlinGemm::mma_parts forces it; Auto takes it on small layers (kernels/marlin_dispatch.h).
inline int mma_parts_blocks(int m, int n_tiles, int k_tiles, int rows, int max_blocks, int parts) {
  const int64_t par = ceil_div_int(m, rows), iters = ceil_div_int(k_tiles, parts);
  const int64_t blocks = par * ceil_div_int(int64_t(n_tiles) * k_tiles, iters);
  return blocks < max_blocks ? int(blocks) : max_blocks;
}

// The first and last block (of the group starting at base_b) whose stripes touch column slice `slice`
// of a row chunk. The first one reaches the slice at the end of its stripe, so it is the finisher: it
// waits for the others' fp32 deposits, adds them in block order and writes C.
MARLINC_PART_HD inline int slice_first_block(int base_b, int slice, int k_tiles, int iters) {
  return base_b + (slice * k_tiles) / iters;
}
MARLINC_PART_HD inline int slice_last_block(int base_b, int slice, int k_tiles, int iters) {
  return base_b + ((slice + 1) * k_tiles - 1) / iters;
}

// Where a stripe is at least kEarlyDepositStripePct / 100 slices long, a shared slice has two blocks: the
// finisher reaches it at the end of its stripe, the other block at the start of its own, and deposits it after
// at most k_tiles tiles, when the finisher has at least iters - k_tiles tiles to go before it starts the slice.
// The Hopper kernel's warp-specialized form then has its producer fetch the deposit into the ring behind the
// slice's last tile (kernels/sm90/marlin_wgmma_ws.cuh), so that the finisher adds it from shared memory instead
// of reading it from L2 after its products, when every other block is at its end too. The margin, half a slice
// of tiles, covers blocks that start a few tiles apart and the depositor's stores. Only on kEarlyDepositRows-row
// tiles. H100 (docs/PERF.md, twenty-eighth session), same call, four runs each: 8B gate/up at m = 512 181.4 ->
// 176.0 us, 70B q/k/v at 1024 254.0 -> 244.9, 70B gate/up at 128 195.2 -> 190.9, the others level; on the 64-row
// tile 70B gate/up at m = 64 read 113.0 -> 116.9 (and slower in two more calls), so that tile keeps the read.
constexpr int kEarlyDepositStripePct = 150;
constexpr int kEarlyDepositRows = 128;
MARLINC_PART_HD inline bool slice_early_deposit(int iters, int k_tiles, int rows) {
  return rows == kEarlyDepositRows && int64_t(iters) * 100 >= int64_t(k_tiles) * kEarlyDepositStripePct;
}

// The Hopper kernel's k-split (its producer form): every row chunk's slices in `split` parts of k_tiles / split tiles
// (rounded as the streaming kernel's parts: marlin_dispatch.h, stream_ranges), one block each, and all of a slice's
// blocks finish it together (the spread finish): each deposits its partial tile, and each adds up and writes a share
// of the tile's 8-token row groups. In stripes, the slice's first block reads every other block's partial tile alone,
// at the 90-130 GB/s one SM's L2 reads reach: 5 µs of a 12.5 µs call on 8B o (4096 x 4096, 64 KB partials of eight
// blocks a slice) at m = 64 (H200, docs/PERF.md, fortieth session, call 1). Stripes that cross slices cannot spread
// their finish: a block that ends in a slice would wait for its first block, whose stripe starts with a deposit of
// its own and ends 2-4 µs after the others' (twenty-ninth session).
// The split's parts may be deeper than the stripes (blocks x parts fit the SMs less well). It is taken where each
// slice gets kSpreadMinParts parts or more and the extra tiles of its longest part cost less than the partial tiles
// the stripes' finisher reads beyond one: a tile's products take about kSplitTilePerReadPct % of one partial tile's
// read (both scale with the tile's area). Call 1's timeline: 0.41 µs per tile and 0.73 µs per 64 KB partial on
// 4096 x 4096 at m = 64, 0.41 and 0.50 on 3072 x 3072. Calls 3-7: split, 8B q/k/v (parts of 13 tiles against stripes
// of 12 whose finisher reads five or six partials) 13.6 -> 11.2 µs at m = 33-64 and 5120 x 7168 (20 against 17, four
// or five partials) 15.9 -> 15.1; 70B q/k/v (three parts of 43 against 39, two or three partials) 0.1-1.5 µs slower,
// and 70B down (112 against 109, four partials) and 5120 x 27648 (72 against 66, six or seven) level within the runs'
// spread, which 80% leaves out and 60% took in.
// Only one row chunk: call 4 timed the two-chunk splits slower where the cuts were the same as the stripes' (Llama-3.2-1B
// o and down at m = 256 in four parts: 10.1 -> 10.7 and 18.5 -> 20.3 µs), and three parts slower on Llama-3.2-3B's
// q/k/v (3072 x 5120) at m = 128-200 (12.8 -> 13.8 µs at 128), where four parts or more gained on every layer.
constexpr int kSpreadMinParts = 4;
constexpr int kSplitTilePerReadPct = 80;
MARLINC_PART_HD constexpr int wgmma_split_parts(int par, int n_tiles, int k_tiles, int max_blocks, int stripe_iters) {
  if (par != 1 || n_tiles > max_blocks || stripe_iters < 1) return 0;
  const int fit = max_blocks / n_tiles, split = fit < k_tiles ? fit : k_tiles;
  if (split < kSpreadMinParts) return 0;
  const int64_t most = (k_tiles + split - 1) / split;  // tiles of the split's longest part
  // (most - iters) tile costs against (k_tiles / iters - 2) partial reads, both sides times iters x 100
  const int64_t extra = (most - stripe_iters) * kSplitTilePerReadPct * stripe_iters;
  return extra < 100 * (int64_t(k_tiles) - 2 * int64_t(stripe_iters)) ? split : 0;
}
// The tiles built with a split form (kernels/marlin.cu, kWsSplitTable, checked against this): 32, 48, 64 and 128 x 256,
// 128 x 128 and the fit tiles; not the wide tile (only forced) or 128 x 192 (Auto takes it where every block owns a
// whole slice).
MARLINC_PART_HD constexpr bool wgmma_split_tile(int rows, int tn) {
  return tn == kWgmmaTileN ? rows == 32 || rows == 48 || rows == 64 || rows == 128
                           : tn == kWgmmaWideTileN && (rows == 128 || wgmma_fit_tile(rows));
}
// The split's partition: each row chunk its own group of n_tiles x split blocks; iters is the longest part.
inline Partition marlin_split_partition(int m, int n_tiles, int k_tiles, int rows, int split) {
  Partition P{};
  P.par = ceil_div_int(m, rows);
  P.iters = ceil_div_int(k_tiles, split);
  P.chunk_blocks = n_tiles * split;
  P.chunk_groups = P.par;
  P.grid = P.par * P.chunk_blocks;
  return P;
}
// Participant i's share of the `live` row groups (those with a token below m) among `parts` participants:
// groups [spread_share_begin(i), spread_share_begin(i + 1)). Group g goes to participant g * parts / live, so
// shares differ by at most one group and min(live, parts) participants own one.
MARLINC_PART_HD constexpr int spread_share_begin(int i, int live, int parts) { return (i * live + parts - 1) / parts; }
MARLINC_PART_HD constexpr int spread_owners(int live, int parts) { return live < parts ? live : parts; }

// Rows of the last row chunk where m is not a whole number of `rows`-row chunks, else 0. The Hopper kernel's
// producer form loads that chunk's activations through a second tensor map whose box holds exactly these rows
// (TmaMaps::a_tail, kernels/sm90/marlin_wgmma_ws.cuh) instead of a full box that the TMA unit zero-fills past m.
// With the full box that chunk's blocks ran their products 30-50% slower than the other chunks' on 128 x 128
// tiles (8B o at m = 320, per-block timeline). H100 (docs/PERF.md, thirty-second session), same call, three runs
// each: 8B o at m = 300 35.1-35.6 -> 22.7-24.0 us, 8B q/k/v at 200 32.2-33.0 -> 22.6-24.0, 70B q/k/v at 100
// 39.0-40.0 -> 35.6-38.7; the 128 x 256 layers level. The rows past m are zeroed in shared memory once: left as
// earlier stages had them, the 128 x 256 layers at m = 200-300 ran 3-7% slower (at the power cap, products of
// zeros cost less).
MARLINC_PART_HD constexpr int tma_tail_rows(int m, int rows) { return rows > 0 ? m % rows : 0; }

}  // namespace marlinc::kernels
