// Host side of the kernels fed by TMA (kernels/sm90/marlin_wgmma_ws.cuh, marlin_stream.cuh): their three
// tensor maps, encoded per call through the runtime's driver entry point (no -lcuda). Per call, not
// cached: on the H100 host an eager marlin_gemm call costs 4.1-4.6 us on every path, the TMA paths'
// three encodings included, and a per-thread cache of the maps measured the same (docs/PERF.md, twelfth
// session; bench_marlin --host-us). Included by .cu files.
#pragma once
#include "kernels/marlin_launch.h"

namespace marlinc::kernels::detail {

// Box sizes of one stage: B boxes of b_k16 k16 rows x b_n columns, A boxes of a_rows x 64, s boxes of
// s_rows x b_n.
struct TmaBoxes {
  int b_n, b_k16, a_rows, s_rows;
  int a_tail_rows = 0;  // the last row chunk's box (TmaMaps::a_tail); 0: chunks of a_rows throughout
  // > 0: A as the 3D tensor [k / 64, m, 64] instead, one box a_boxes x a_rows x 64 per copy: a stage's activation
  // boxes in one TMA copy, in the same shared-memory layout (the streaming kernel, kernels/sm90/marlin_stream.cuh).
  int a_boxes = 0;
};

// The maps of one call: B as [k / 16, n] 8-byte units, A as [m, k] 16-bit with the 128B swizzle (rows past
// m read as zeros) in boxes of a_rows and of a_tail_rows (or as [k / 64, m, 64], TmaBoxes::a_boxes), s as
// [groups, n] 16-bit. False where the driver lacks the encoder or rejects a map.
bool tma_maps(const void* A, const void* B, const void* s, int m, int n, int k, int groups, const TmaBoxes& box,
              TmaMaps* maps);

}  // namespace marlinc::kernels::detail
