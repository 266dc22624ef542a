// Plan and launcher of the transposed fp8 quantize kernels (layouts 1 and 2): shared-memory tile or register
// transpose, the variant and grid picked by quantize_transpose_plan, launched as planned.
#include <cstdint>
#include <string>

#include "kernels/common/host/align.h"
#include "kernels/common/host/cuda_check.h"
#include "kernels/common/host/device_facts.h"
#include "kernels/quantize/quantize.h"
#include "kernels/quantize/quantize_dispatch.h"
#include "kernels/quantize/quantize_transpose.cuh"

namespace astrai {
namespace {

using quantize::kTileCols;
using quantize::kTileRows;
using quantize::kTransposeThreads;

template <QuantIn kIn, QuantOut kOut, bool kVec, int kR>
auto regs_kernel(const QuantizeParams& p) {
  using quantize::kRegLanes;
  using quantize::kRegThreads;
  using quantize::reg_min_blocks;
  // The fused fold (fold_counter_ptr) is its own instantiation.
  return p.fold_counter_ptr != nullptr
             ? &quantize::quantize_transpose_regs_kernel<kIn, kOut, kVec, kR, false, kRegThreads / 32,
                                                         reg_min_blocks<kIn, kR>(), kRegLanes, true>
             : &quantize::quantize_transpose_regs_kernel<kIn, kOut, kVec, kR>;
}

int64_t smem_tiles(const QuantizeParams& p) {
  return ((p.rows + kTileRows - 1) / kTileRows) * ((p.cols + kTileCols - 1) / kTileCols);
}

template <int kR>
int64_t reg_tiles(const QuantizeParams& p) {
  const int64_t tile_rows = quantize::reg_tile_rows<kR>();
  return ((p.rows + tile_rows - 1) / tile_rows) * ((p.cols + quantize::kRegTileCols - 1) / quantize::kRegTileCols);
}

// Blocks of the smem kernel: one a tile, capped at the resident blocks (persistent: each prefetches its next tile
// while it transposes and stores this one, which pays only when a block has several tiles; not balanced with
// quantize::transpose_grid, which was slower: docs/benchmarks.md, quantize section).
template <QuantIn kIn, QuantOut kOut, bool kVec>
cudaError_t plan_smem(const QuantizeParams& p, QuantizeLaunch* plan) {
  int64_t grid = 0;
  ASTRAI_CUDA_TRY(quantize_detail::grid_for(smem_tiles(p), kTransposeThreads, p.max_blocks, &grid));
  DeviceFacts facts{};
  ASTRAI_CUDA_TRY(current_device_facts(&facts));
  int resident = 0;
  ASTRAI_CUDA_TRY(resident_blocks_per_sm(
      reinterpret_cast<const void*>(&quantize::quantize_transpose_kernel<kIn, kOut, kVec>), kTransposeThreads, 0,
      &resident));
  if (resident > 0 && grid > int64_t(resident) * facts.sm_count) grid = int64_t(resident) * facts.sm_count;
  *plan = QuantizeLaunch{QuantizeKernel::kTransposeSmem, kVec, 0, grid};
  return cudaSuccess;
}

// One block per reg_tile_rows<kR>() x kRegTileCols tile (persistent: at most the resident blocks, looping over tiles).
template <QuantIn kIn, QuantOut kOut, bool kVec, int kR>
cudaError_t plan_regs(const QuantizeParams& p, bool persistent, QuantizeLaunch* plan) {
  int64_t grid = 0;
  ASTRAI_CUDA_TRY(quantize_detail::grid_for(reg_tiles<kR>(p), quantize::kRegThreads, p.max_blocks, &grid));
  if (persistent) {
    DeviceFacts facts{};
    ASTRAI_CUDA_TRY(current_device_facts(&facts));
    int resident = 0;
    ASTRAI_CUDA_TRY(resident_blocks_per_sm(reinterpret_cast<const void*>(regs_kernel<kIn, kOut, kVec, kR>(p)),
                                           quantize::kRegThreads, 0, &resident));
    if (resident > 0 && grid > int64_t(resident) * facts.sm_count) grid = int64_t(resident) * facts.sm_count;
  }
  *plan = QuantizeLaunch{kR == 16 ? QuantizeKernel::kTransposeRegs16 : QuantizeKernel::kTransposeRegs8, kVec, 0, grid};
  return cudaSuccess;
}

template <QuantIn kIn, QuantOut kOut, bool kVec>
cudaError_t plan(const QuantizeParams& p, int variant, bool persistent, QuantizeLaunch* out) {
  // The register kernel indexes tiles in 32 bits (its smallest tile: kR = 8); kR = 16 spills for fp16 / fp32.
  if (variant == 0 || reg_tiles<8>(p) >= (int64_t(1) << 31)) {
    // The shared-memory kernel has no fused fold (and 2^31 register tiles of 8192 elements exceed any memory).
    if (p.fold_counter_ptr != nullptr) return cudaErrorInvalidValue;
    return plan_smem<kIn, kOut, kVec>(p, out);
  }
  if constexpr (kIn == QuantIn::kBF16) {
    if (variant < 0) {
      // By size: kR = 16 once its grid fills kRegWavesFor16 waves of resident blocks.
      DeviceFacts facts{};
      ASTRAI_CUDA_TRY(current_device_facts(&facts));
      const int64_t wave16 = int64_t(facts.sm_count) * quantize::reg_min_blocks<kIn, 16>();
      variant = reg_tiles<16>(p) >= quantize::kRegWavesFor16 * wave16 ? 16 : 8;
    }
    if (variant == 16) return plan_regs<kIn, kOut, kVec, 16>(p, persistent, out);
  }
  return plan_regs<kIn, kOut, kVec, 8>(p, persistent, out);
}

template <QuantIn kIn, QuantOut kOut, bool kVec>
cudaError_t launch(const QuantizeParams& p, const QuantizeLaunch& l, cudaStream_t stream) {
  const dim3 grid(unsigned(l.blocks));
  if (l.kernel == QuantizeKernel::kTransposeSmem) {
    quantize::quantize_transpose_kernel<kIn, kOut, kVec><<<grid, dim3(kTransposeThreads), 0, stream>>>(p);
  } else if (l.kernel == QuantizeKernel::kTransposeRegs16) {
    if constexpr (kIn == QuantIn::kBF16) {
      regs_kernel<kIn, kOut, kVec, 16>(p)<<<grid, dim3(quantize::kRegThreads), 0, stream>>>(p);
    }
  } else {
    regs_kernel<kIn, kOut, kVec, 8>(p)<<<grid, dim3(quantize::kRegThreads), 0, stream>>>(p);
  }
  return cudaGetLastError();
}

// 16-byte loads of 8-element runs: x 16-byte aligned, row stride and cols multiples of 8 elements.
bool transpose_vec_allowed(const QuantizeParams& p) {
  return aligned16(p.x_ptr) && p.x_row_stride % 8 == 0 && p.cols % 8 == 0;
}

}  // namespace

namespace quantize_detail {

cudaError_t quantize_transpose_plan(const QuantizeParams& p, int variant, bool persistent, QuantizeLaunch* out) {
  return with_types<false>(p, transpose_vec_allowed(p), [&](auto in, auto o, auto vec) {
    return plan<decltype(in)::value, decltype(o)::value, decltype(vec)::value>(p, variant, persistent, out);
  });
}

cudaError_t quantize_transpose_plan(const QuantizeParams& p, QuantizeLaunch* out) {
  return quantize_transpose_plan(p, quantize::kTransposeVariant, quantize::kRegPersistent, out);
}

std::string quantize_transpose_unfit(const QuantizeParams& p, const QuantizeLaunch& l) {
  if (p.out_t_ptr == nullptr) return "a transpose kernel needs a transposed output (out_t)";
  if (l.vec && !transpose_vec_allowed(p)) {
    return "vec needs x 16-byte aligned with its row stride and cols multiples of 8 elements";
  }
  switch (l.kernel) {
    case QuantizeKernel::kTransposeSmem:
      if (p.fold_counter_ptr != nullptr) return "the shared-memory transpose has no fused fold";
      return std::string();
    case QuantizeKernel::kTransposeRegs16:
      if (p.in_type != QuantIn::kBF16) return "the 16-row register transpose takes bf16 input only";
      [[fallthrough]];
    case QuantizeKernel::kTransposeRegs8:
      if (reg_tiles<8>(p) >= (int64_t(1) << 31)) return "the register transpose indexes at most 2^31 tiles";
      return std::string();
    default:
      return "kernel must be 0 (rows), 1 (transpose smem), 2 (transpose regs 8) or 3 (transpose regs 16), got " +
             std::to_string(int(l.kernel));
  }
}

cudaError_t quantize_transpose_launch(const QuantizeParams& p, const QuantizeLaunch& l, cudaStream_t stream) {
  return with_types<false>(p, l.vec, [&](auto in, auto o, auto vec) {
    return launch<decltype(in)::value, decltype(o)::value, decltype(vec)::value>(p, l, stream);
  });
}

}  // namespace quantize_detail
}  // namespace astrai
