// Host side of the Hopper mainloop (sm90_gemm.cuh): tensor maps, the persistent grid, the split-K reduction.
// gemm_sm90_<group>.cu instantiate it for their pairs, so the translation units compile in parallel.
#pragma once

#include <algorithm>
#include <atomic>

#include <cuda_runtime_api.h>

#include "kernels/common/host/align.h"
#include "kernels/common/host/cuda_check.h"
#include "kernels/common/host/device_facts.h"
#include "kernels/common/host/tensor_map.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/sm80_gemm_launch.cuh"
#include "kernels/gemm/sm90_gemm.cuh"

namespace astrai {
namespace gemm {

// A K-major operand [batch][rows][k] as a 3-D map (k, rows, batch) in boxes of one K tile of box_bytes (128 or 64) x
// box_rows rows, swizzled by the same width, zeros past the edges. A broadcast operand (batch stride 0) gets one
// batch. False where TMA cannot describe it (a base address or stride not a multiple of 16 bytes).
inline bool sm90_k_major_map(CUtensorMap* map, CUtensorMapDataType type, int elt_bytes, const void* base, int rows,
                             int k, int64_t row_stride, int batch, int64_t batch_stride, int box_rows,
                             int box_bytes = 128) {
  const uint64_t dims[3] = {uint64_t(k), uint64_t(rows), uint64_t(batch_stride == 0 ? 1 : batch)};
  // One row: the op leaves its stride 0 (unread); any multiple of 16 bytes describes it.
  const int64_t row_bytes = rows > 1 ? row_stride * elt_bytes : (int64_t(k) * elt_bytes + 15) / 16 * 16;
  const int64_t batch_bytes = batch_stride == 0 ? row_bytes * rows : batch_stride * elt_bytes;
  const int64_t strides[2] = {row_bytes, batch_bytes};
  const uint32_t box[3] = {uint32_t(box_bytes / elt_bytes), uint32_t(box_rows), 1};
  return encode_tensor_map_tiled(map, type, 3, base, dims, strides, box,
                                 box_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
}

// The output [batch][m][n] as a 3-D map (n, m, batch) in boxes of 128 bytes x 64 rows, 128-byte swizzle: the
// epilogue's staged halves (sm90_store_tile). False where TMA cannot describe it (a base address or stride not a
// multiple of 16 bytes, an output type it has no map type for): the threads copy the tiles out then.
inline bool sm90_out_map(CUtensorMap* map, const GemmParams& p) {
  CUtensorMapDataType type;
  int elt_bytes;
  switch (p.out_dtype) {
    case GemmOut::kBf16: type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16; elt_bytes = 2; break;
    case GemmOut::kF16: type = CU_TENSOR_MAP_DATA_TYPE_FLOAT16; elt_bytes = 2; break;
    case GemmOut::kF32: type = CU_TENSOR_MAP_DATA_TYPE_FLOAT32; elt_bytes = 4; break;
    case GemmOut::kS32: type = CU_TENSOR_MAP_DATA_TYPE_INT32; elt_bytes = 4; break;
    default: return false;
  }
  if (p.transpose_out || p.out == nullptr) return false;
  // TMA stores whole 16-byte chunks: a row whose end is not on a 16-byte boundary would have the bytes up to the next
  // boundary overwritten (past the tensor at M = 1, into a padded row's other columns), so such outputs keep the
  // threads' copy-out.
  if (int64_t(p.n) * elt_bytes % 16 != 0) return false;
  const int64_t row_bytes = p.out_row_stride * elt_bytes, batch_bytes = p.out_batch_stride * elt_bytes;
  if (p.m > 1 && row_bytes % 16 != 0) return false;
  if (p.batch > 1 && batch_bytes % 16 != 0) return false;
  const uint64_t dims[3] = {uint64_t(p.n), uint64_t(p.m), uint64_t(p.batch)};
  // A stride the map never steps over (one row, one batch) still has to be a valid one: a row's bytes (a multiple of
  // 16 bytes, above).
  const int64_t one_row = int64_t(p.n) * elt_bytes;
  const int64_t strides[2] = {p.m > 1 ? row_bytes : one_row,
                              p.batch > 1 ? batch_bytes : (p.m > 1 ? row_bytes : one_row) * p.m};
  const uint32_t box[3] = {uint32_t(128 / elt_bytes), 64, 1};
  return encode_tensor_map_tiled(map, type, 3, p.out, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_NONE);
}

// One kernel of (pair, recipe): kTmaOut, its epilogue stores by TMA through map_out.
template <GemmPair kPair, class R, bool kTmaOut>
cudaError_t sm90_launch_kernel(const GemmParams& p, const CUtensorMap& map_a, const CUtensorMap& map_b,
                               const CUtensorMap& map_out, cudaStream_t stream) {
  using P = Sm90Pair<kPair>;
  DeviceFacts facts{};
  ASTRAI_CUDA_TRY(current_device_facts(&facts));
  auto* kernel = &gemm_sm90_kernel<kPair, R, kTmaOut>;
  static std::atomic<uint64_t> smem_set{0};
  ASTRAI_CUDA_TRY(allow_smem(kernel, R::kSmemBytes, smem_set));
  const int64_t tiles = int64_t(ceil_div(p.m, R::kBM)) * ceil_div(p.n, R::kBN) * p.batch;
  GemmParams q = p;
  int64_t units = tiles * p.split_k;
  if (p.split_k == 0) {  // the last wave split (gemm.h), planned for this device's SMs
    const GemmTailPlan t = gemm_sm90_tail_plan(p, R::kBM, R::kBN, 128 / P::kEltBytes, facts.sm_count);
    q.split_k = 1;
    q.k_tiles_per_split = t.k_tiles_per_split;
    q.tail_from = t.tail_from;
    q.tail_split = t.split > 1 ? t.split : 0;
    units = t.split > 1 ? int64_t(t.tail_from) + int64_t(t.tail_tiles) * t.split : tiles;
  }
  const unsigned grid = unsigned(std::min<int64_t>(units, facts.sm_count));
  if (grid == 0) return cudaSuccess;
  // A programmatic dependent except with the last wave split (measured -7% to +5% with it, H200).
  static PdlCodeCache known_gemm;
  bool pdl = false;
  if (q.tail_split <= 1) ASTRAI_CUDA_TRY(gemm_pdl(kernel, known_gemm, &pdl));
  ASTRAI_CUDA_TRY(launch_maybe_dependent(kernel, dim3(grid), dim3(R::kThreads), R::kSmemBytes, stream, pdl, map_a,
                                         map_b, map_out, q));
  if (q.tail_split > 1) {  // as a programmatic dependent, as the GEMM kernel (gemm_pdl)
    constexpr int kBlocksPerTile = R::kBM * R::kBN / (4 * kTailReduceThreads);
    auto* reduce = &gemm_sm90_tail_reduce_kernel<typename P::Acc, R>;
    static PdlCodeCache known;
    ASTRAI_CUDA_TRY(gemm_pdl(reduce, known, &pdl));
    return launch_maybe_dependent(reduce, dim3(unsigned(tiles - q.tail_from), kBlocksPerTile),
                                  dim3(kTailReduceThreads), 0, stream, pdl, q);
  }
  if (q.split_k > 1) return launch_split_reduce<typename P::Acc>(q, stream);
  return cudaSuccess;
}

// The launch of (pair, recipe) for layout nt: cudaErrorNotSupported where the maps cannot describe the operands.
// The TMA-store kernel where a map describes the output, and for split_k > 1 (its units all write the workspace, by
// the threads: the map is never read; the kernel does not spill where the other one does).
template <GemmPair kPair, class R>
cudaError_t sm90_launch_recipe(const GemmParams& p, cudaStream_t stream) {
  using P = Sm90Pair<kPair>;
  CUtensorMap map_a, map_b, map_out{};
  if (!sm90_k_major_map(&map_a, P::kMapType, P::kEltBytes, p.a, p.m, p.k, p.a_row_stride, p.batch, p.a_batch_stride,
                        R::kBM) ||
      !sm90_k_major_map(&map_b, P::kMapType, P::kEltBytes, p.b, p.n, p.k, p.b_row_stride, p.batch, p.b_batch_stride,
                        R::kBN))
    return cudaErrorNotSupported;
  if (p.split_k > 1 || sm90_out_map(&map_out, p))
    return sm90_launch_kernel<kPair, R, true>(p, map_a, map_b, map_out, stream);
  return sm90_launch_kernel<kPair, R, false>(p, map_a, map_b, map_out, stream);
}

// Recipe 4 (128 x 128), 5 (128 x 256) or 10 (128 x 192) of one pair. The fp8 pairs have 4 and 10: their promoted
// accumulators (twice the registers) do not fit a 256-column tile; the others have all three (10 fills the last wave
// where 256-column tiles leave it short, N = 2112).
template <GemmPair kPair>
cudaError_t sm90_launch_pair(const GemmParams& p, int recipe, cudaStream_t stream) {
  if (recipe == kGemmFirstSm90Recipe) return sm90_launch_recipe<kPair, Sm90RecipeN128>(p, stream);
  if constexpr (Sm90Pair<kPair>::kPromote) {
    return recipe == kGemmSm90N192Recipe ? sm90_launch_recipe<kPair, Sm90RecipeN192>(p, stream)
                                            : cudaErrorInvalidValue;
  } else {
    if (recipe == kGemmSm90N192Recipe) return sm90_launch_recipe<kPair, Sm90RecipeN192>(p, stream);
    return recipe == kGemmFirstSm90Recipe + 1 ? sm90_launch_recipe<kPair, Sm90RecipeN256>(p, stream)
                                              : cudaErrorInvalidValue;
  }
}

}  // namespace gemm
}  // namespace astrai
