// Encoding of the TMA kernels' tensor maps (kernels/tma_maps.h).
#include "kernels/tma_maps.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace marlinc::kernels::detail {
namespace {

// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda), looked up once.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

// A row-major 2D tensor [outer, inner] of `esize`-byte elements, boxes of [box_outer, box_inner].
bool encode_2d(CUtensorMap* map, CUtensorMapDataType dt, size_t esize, const void* base, uint64_t inner,
               uint64_t outer, uint32_t box_inner, uint32_t box_outer, CUtensorMapSwizzle swizzle) {
  const EncodeTiledFn enc = encode_tiled();
  if (!enc) return false;
  const cuuint64_t dims[2] = {inner, outer}, strides[1] = {inner * esize};
  const cuuint32_t box[2] = {box_inner, box_outer}, elem[2] = {1, 1};
  return enc(map, dt, 2, const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// A [m, k] 16-bit as the 3D tensor [k / 64, m, 64] (strides 128 B and k x 2 B), 128B swizzle, boxes of
// [boxes, rows, 64]: a box's 64-wide pieces land one after another, rows x 128 B each. With rows a multiple of 8 every
// piece starts a 1 KB swizzle atom, so the layout is that of `boxes` 2D boxes of [rows, 64] side by side.
bool encode_a3d(CUtensorMap* map, const void* A, int m, int k, uint32_t rows, uint32_t boxes) {
  const EncodeTiledFn enc = encode_tiled();
  if (!enc || k % 64 != 0 || rows % 8 != 0) return false;
  const cuuint64_t dims[3] = {64, uint64_t(m), uint64_t(k / 64)}, strides[2] = {uint64_t(k) * 2, 128};
  const cuuint32_t box[3] = {64, rows, boxes}, elem[3] = {1, 1, 1};
  return enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void*>(A), dims, strides, box, elem,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

bool tma_maps(const void* A, const void* B, const void* s, int m, int n, int k, int groups, const TmaBoxes& box,
              TmaMaps* maps) {
  auto a_map = [&](CUtensorMap* map, int rows) {
    if (box.a_boxes > 0) return encode_a3d(map, A, m, k, uint32_t(rows), uint32_t(box.a_boxes));
    return encode_2d(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, A, uint64_t(k), uint64_t(m), 64, uint32_t(rows),
                     CU_TENSOR_MAP_SWIZZLE_128B);
  };
  if (!encode_2d(&maps->b, CU_TENSOR_MAP_DATA_TYPE_UINT64, 8, B, uint64_t(n), uint64_t(k / 16), uint32_t(box.b_n),
                 uint32_t(box.b_k16), CU_TENSOR_MAP_SWIZZLE_NONE) ||
      !a_map(&maps->a, box.a_rows) ||
      !encode_2d(&maps->s, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, s, uint64_t(n), uint64_t(groups), uint32_t(box.b_n),
                 uint32_t(box.s_rows), CU_TENSOR_MAP_SWIZZLE_NONE))
    return false;
  if (box.a_tail_rows <= 0) {
    maps->a_tail = maps->a;
    return true;
  }
  return a_map(&maps->a_tail, box.a_tail_rows);
}

}  // namespace marlinc::kernels::detail
