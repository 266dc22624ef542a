// Launchers of the 128 x 128 block quantize kernel and the scale-factor layout conversion.
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
cudaError_t launch(const BlockQuantParams& p, cudaStream_t stream) {
  const int64_t tiles = ((p.rows + kBlockEdge - 1) / kBlockEdge) * (p.cols / kBlockEdge);
  int64_t grid = 0;
  ASTRAI_CUDA_TRY(quantize_detail::grid_for(tiles, kBlockThreads, 0, &grid));
  quantize::quantize_block128_kernel<kIn, kOut, kVec><<<dim3(unsigned(grid)), dim3(kBlockThreads), 0, stream>>>(p);
  return cudaGetLastError();
}

template <QuantIn kIn, QuantOut kOut>
cudaError_t launch_vec(const BlockQuantParams& p, cudaStream_t stream) {
  const int bytes = p.in_type == QuantIn::kF32 ? 4 : 2;
  const bool vec = aligned16(p.x_ptr) && (p.x_row_stride * bytes) % 16 == 0 &&
                   aligned16(p.out_ptr);
  return vec ? launch<kIn, kOut, true>(p, stream) : launch<kIn, kOut, false>(p, stream);
}

template <QuantIn kIn>
cudaError_t launch_out(const BlockQuantParams& p, cudaStream_t stream) {
  switch (p.out_type) {
    case QuantOut::kE4M3: return launch_vec<kIn, QuantOut::kE4M3>(p, stream);
    case QuantOut::kE5M2: return launch_vec<kIn, QuantOut::kE5M2>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t quantize_block128_launch(const BlockQuantParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.cols < 0 || p.cols % kBlockEdge != 0 || p.x_ptr == nullptr || p.out_ptr == nullptr ||
      p.scale_inv_ptr == nullptr || !(p.qmax > 0.0f)) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  switch (p.in_type) {
    case QuantIn::kBF16: return launch_out<QuantIn::kBF16>(p, stream);
    case QuantIn::kF16: return launch_out<QuantIn::kF16>(p, stream);
    case QuantIn::kF32: return launch_out<QuantIn::kF32>(p, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t scale_layout_launch(const ScaleLayoutParams& p, cudaStream_t stream) {
  if (p.mn < 0 || p.sf_k < 0 || p.sf_ptr == nullptr || p.out_ptr == nullptr) return cudaErrorInvalidValue;
  if (p.mn == 0 || p.sf_k == 0) return cudaSuccess;
  const int64_t total = (p.mn + 3) / 4 * 4 * (p.packed ? (p.sf_k + 3) / 4 : p.sf_k);
  int64_t grid = 0;
  ASTRAI_CUDA_TRY(quantize_detail::grid_for((total + 255) / 256, 256, 0, &grid));
  quantize::scale_layout_kernel<<<dim3(unsigned(grid)), dim3(256), 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace astrai
