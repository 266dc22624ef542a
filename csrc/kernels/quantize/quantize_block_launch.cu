// Plans and launchers of the 128 x 128 block quantize kernel and the scale-factor layout conversion.
#include <climits>
#include <cstdint>

#include "kernels/common/host/align.h"
#include "kernels/common/host/cuda_check.h"
#include "kernels/quantize/quantize.h"
#include "kernels/quantize/quantize_block.cuh"

namespace astrai {
namespace {

using quantize::kBlockEdge;
using quantize::kBlockThreads;

template <QuantIn kIn, QuantOut kOut, bool kVec>
cudaError_t launch(const BlockQuantParams& p, const QuantizeGridLaunch& l, cudaStream_t stream) {
  quantize::quantize_block128_kernel<kIn, kOut, kVec><<<dim3(unsigned(l.blocks)), dim3(kBlockThreads), 0, stream>>>(p);
  return cudaGetLastError();
}

template <QuantIn kIn, QuantOut kOut>
cudaError_t launch_vec(const BlockQuantParams& p, const QuantizeGridLaunch& l, cudaStream_t stream) {
  return l.vec ? launch<kIn, kOut, true>(p, l, stream) : launch<kIn, kOut, false>(p, l, stream);
}

template <QuantIn kIn>
cudaError_t launch_out(const BlockQuantParams& p, const QuantizeGridLaunch& l, cudaStream_t stream) {
  switch (p.out_type) {
    case QuantOut::kE4M3: return launch_vec<kIn, QuantOut::kE4M3>(p, l, stream);
    case QuantOut::kE5M2: return launch_vec<kIn, QuantOut::kE5M2>(p, l, stream);
    default: return cudaErrorInvalidValue;
  }
}

bool block_params_valid(const BlockQuantParams& p) {
  return p.rows >= 0 && p.cols >= 0 && p.cols % kBlockEdge == 0 && p.x_ptr != nullptr && p.out_ptr != nullptr &&
         p.scale_inv_ptr != nullptr && p.qmax > 0.0f;
}

// 16-byte moves: x and out 16-byte aligned, rows of x starting 16-byte aligned.
bool block_vec_allowed(const BlockQuantParams& p) {
  const int bytes = p.in_type == QuantIn::kF32 ? 4 : 2;
  return aligned16(p.x_ptr) && (p.x_row_stride * bytes) % 16 == 0 && aligned16(p.out_ptr);
}

bool grid_launch_fits(const QuantizeGridLaunch& l) { return l.blocks >= 1 && l.blocks <= INT32_MAX; }

}  // namespace

cudaError_t quantize_block128_plan(const BlockQuantParams& p, QuantizeGridLaunch* plan) {
  *plan = QuantizeGridLaunch{false, 0};
  if (!block_params_valid(p)) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  // One block a 128 x 128 tile, grid-stride past 16 full-occupancy waves.
  const int64_t tiles = ((p.rows + kBlockEdge - 1) / kBlockEdge) * (p.cols / kBlockEdge);
  int64_t grid = 0;
  ASTRAI_CUDA_TRY(quantize_detail::grid_for(tiles, kBlockThreads, 0, &grid));
  *plan = QuantizeGridLaunch{block_vec_allowed(p), grid};
  return cudaSuccess;
}

cudaError_t quantize_block128_launch(const BlockQuantParams& p, const QuantizeGridLaunch& l, cudaStream_t stream) {
  if (!block_params_valid(p)) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  if (!grid_launch_fits(l) || (l.vec && !block_vec_allowed(p))) return cudaErrorInvalidValue;
  switch (p.in_type) {
    case QuantIn::kBF16: return launch_out<QuantIn::kBF16>(p, l, stream);
    case QuantIn::kF16: return launch_out<QuantIn::kF16>(p, l, stream);
    case QuantIn::kF32: return launch_out<QuantIn::kF32>(p, l, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t scale_layout_plan(const ScaleLayoutParams& p, QuantizeGridLaunch* plan) {
  *plan = QuantizeGridLaunch{false, 0};
  if (p.mn < 0 || p.sf_k < 0 || p.sf_ptr == nullptr || p.out_ptr == nullptr) return cudaErrorInvalidValue;
  if (p.mn == 0 || p.sf_k == 0) return cudaSuccess;
  // One thread an output word (rows padded to 4), 256 a block, grid-stride past 16 full-occupancy waves.
  const int64_t total = (p.mn + 3) / 4 * 4 * (p.packed ? (p.sf_k + 3) / 4 : p.sf_k);
  int64_t grid = 0;
  ASTRAI_CUDA_TRY(quantize_detail::grid_for((total + 255) / 256, 256, 0, &grid));
  *plan = QuantizeGridLaunch{false, grid};
  return cudaSuccess;
}

cudaError_t scale_layout_launch(const ScaleLayoutParams& p, const QuantizeGridLaunch& l, cudaStream_t stream) {
  if (p.mn < 0 || p.sf_k < 0 || p.sf_ptr == nullptr || p.out_ptr == nullptr) return cudaErrorInvalidValue;
  if (p.mn == 0 || p.sf_k == 0) return cudaSuccess;
  if (!grid_launch_fits(l) || l.vec) return cudaErrorInvalidValue;  // the layout kernel has no 16-byte variant
  quantize::scale_layout_kernel<<<dim3(unsigned(l.blocks)), dim3(256), 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace astrai
