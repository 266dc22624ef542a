// Launcher of the transposed fp8 quantize kernels (layouts 1 and 2): shared-memory tile or register transpose.
#include <cstdint>

#include "kernels/common/host/align.h"
#include "kernels/common/host/cuda_check.h"
#include "kernels/common/host/device_facts.h"
#include "kernels/quantize/quantize.h"
#include "kernels/quantize/quantize_transpose.cuh"

namespace astrai {
namespace {

using quantize::kTileCols;
using quantize::kTileRows;
using quantize::kTransposeThreads;

template <QuantIn kIn, QuantOut kOut, bool kVec>
cudaError_t launch_smem(const QuantizeParams& p, cudaStream_t stream) {
  const int64_t tiles = ((p.rows + kTileRows - 1) / kTileRows) * ((p.cols + kTileCols - 1) / kTileCols);
  int64_t grid = 0;
  ASTRAI_CUDA_TRY(quantize_detail::grid_for(tiles, kTransposeThreads, p.max_blocks, &grid));
  // Persistent grid: at most the blocks that are resident at once (each prefetches its next tile while it
  // transposes and stores this one, which pays only when a block has several tiles). Not balanced with
  // quantize::transpose_grid, which was slower (docs/benchmarks.md, quantize section).
  DeviceFacts facts{};
  ASTRAI_CUDA_TRY(current_device_facts(&facts));
  const int sm_count = facts.sm_count;
  int resident = 0;
  ASTRAI_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &resident, reinterpret_cast<const void*>(&quantize::quantize_transpose_kernel<kIn, kOut, kVec>), kTransposeThreads, 0));
  if (resident > 0 && grid > int64_t(resident) * sm_count) grid = int64_t(resident) * sm_count;
  quantize::quantize_transpose_kernel<kIn, kOut, kVec><<<dim3(unsigned(grid)), dim3(kTransposeThreads), 0, stream>>>(p);
  return cudaGetLastError();
}

// One block per reg_tile_rows<kR>() x kRegTileCols tile (persistent: at most the resident blocks, looping over tiles).
template <QuantIn kIn, QuantOut kOut, bool kVec, int kR>
cudaError_t launch_regs(const QuantizeParams& p, bool persistent, cudaStream_t stream) {
  using quantize::kRegLanes;
  using quantize::kRegThreads;
  using quantize::reg_min_blocks;
  // The fused fold (fold_counter_ptr) is its own instantiation.
  const auto kernel = p.fold_counter_ptr != nullptr
                          ? &quantize::quantize_transpose_regs_kernel<kIn, kOut, kVec, kR, false, kRegThreads / 32,
                                                                      reg_min_blocks<kIn, kR>(), kRegLanes, true>
                          : &quantize::quantize_transpose_regs_kernel<kIn, kOut, kVec, kR>;
  const int64_t tile_rows = quantize::reg_tile_rows<kR>();
  const int64_t tiles = ((p.rows + tile_rows - 1) / tile_rows) * ((p.cols + quantize::kRegTileCols - 1) / quantize::kRegTileCols);
  int64_t grid = 0;
  ASTRAI_CUDA_TRY(quantize_detail::grid_for(tiles, quantize::kRegThreads, p.max_blocks, &grid));
  if (persistent) {
    DeviceFacts facts{};
    ASTRAI_CUDA_TRY(current_device_facts(&facts));
    const int sm_count = facts.sm_count;
    int resident = 0;
    ASTRAI_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, reinterpret_cast<const void*>(kernel),
                                                                  quantize::kRegThreads, 0));
    if (resident > 0 && grid > int64_t(resident) * sm_count) grid = int64_t(resident) * sm_count;
  }
  kernel<<<dim3(unsigned(grid)), dim3(quantize::kRegThreads), 0, stream>>>(p);
  return cudaGetLastError();
}

template <QuantIn kIn, QuantOut kOut, bool kVec>
cudaError_t launch(const QuantizeParams& p, cudaStream_t stream, int variant, bool persistent) {
  // The register kernel indexes tiles in 32 bits (its smallest tile: kR = 8); kR = 16 spills for fp16 / fp32.
  const int64_t tile_rows8 = quantize::reg_tile_rows<8>();
  const int64_t tiles_n = (p.cols + quantize::kRegTileCols - 1) / quantize::kRegTileCols;
  const int64_t reg_tiles = ((p.rows + tile_rows8 - 1) / tile_rows8) * tiles_n;
  if (variant == 0 || reg_tiles >= (int64_t(1) << 31)) {
    // The shared-memory kernel has no fused fold (and 2^31 register tiles of 8192 elements exceed any memory).
    if (p.fold_counter_ptr != nullptr) return cudaErrorInvalidValue;
    return launch_smem<kIn, kOut, kVec>(p, stream);
  }
  if constexpr (kIn == QuantIn::kBF16) {
    if (variant < 0) {
      // By size: kR = 16 once its grid fills kRegWavesFor16 waves of resident blocks.
      DeviceFacts facts{};
      ASTRAI_CUDA_TRY(current_device_facts(&facts));
      const int sm_count = facts.sm_count;
      const int64_t tile_rows16 = quantize::reg_tile_rows<16>();
      const int64_t tiles16 = ((p.rows + tile_rows16 - 1) / tile_rows16) * tiles_n;
      const int64_t wave16 = int64_t(sm_count) * quantize::reg_min_blocks<kIn, 16>();
      variant = tiles16 >= quantize::kRegWavesFor16 * wave16 ? 16 : 8;
    }
    if (variant == 16) return launch_regs<kIn, kOut, kVec, 16>(p, persistent, stream);
  }
  return launch_regs<kIn, kOut, kVec, 8>(p, persistent, stream);
}

template <QuantIn kIn, QuantOut kOut>
cudaError_t launch_vec(const QuantizeParams& p, cudaStream_t stream, int variant, bool persistent) {
  // 16-byte loads of 8-element runs: x 16-byte aligned, row stride and cols multiples of 8 elements.
  const bool vec = aligned16(p.x_ptr) && p.x_row_stride % 8 == 0 && p.cols % 8 == 0;
  return vec ? launch<kIn, kOut, true>(p, stream, variant, persistent)
             : launch<kIn, kOut, false>(p, stream, variant, persistent);
}

template <QuantIn kIn>
cudaError_t launch_out(const QuantizeParams& p, cudaStream_t stream, int variant, bool persistent) {
  switch (p.out_type) {
    case QuantOut::kE4M3: return launch_vec<kIn, QuantOut::kE4M3>(p, stream, variant, persistent);
    case QuantOut::kE5M2: return launch_vec<kIn, QuantOut::kE5M2>(p, stream, variant, persistent);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

namespace quantize_detail {

cudaError_t quantize_transpose_launch_variant(const QuantizeParams& p, cudaStream_t stream, int variant, bool persistent) {
  switch (p.in_type) {
    case QuantIn::kBF16: return launch_out<QuantIn::kBF16>(p, stream, variant, persistent);
    case QuantIn::kF16: return launch_out<QuantIn::kF16>(p, stream, variant, persistent);
    case QuantIn::kF32: return launch_out<QuantIn::kF32>(p, stream, variant, persistent);
  }
  return cudaErrorInvalidValue;
}

cudaError_t quantize_transpose_launch(const QuantizeParams& p, cudaStream_t stream) {
  return quantize_transpose_launch_variant(p, stream, quantize::kTransposeVariant, quantize::kRegPersistent);
}

}  // namespace quantize_detail
}  // namespace astrai
