// Host entry of the quantize family: launchers for fp8/int8 quantization; plain C++, no CUDA compiler needed.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/quantize/params.h"

namespace astrai {

// Quantizes x into out (row-major) and/or out_t (transposed) on `stream`. out_t set: the tiled-transpose
// kernel (fp8 only; scale kinds kTensor, kRow, kColumn, kFromAmax); else the row kernel (every kind, fp8 or
// int8). Picks the 16-byte or the element variant from alignment, strides and cols. Returns the launch status
// (cudaErrorInvalidValue for inconsistent params); never throws. rows or cols of 0: no launch, cudaSuccess
// (with the fused fold, fold_counter_ptr set: the fold of an amax of 0, one block).
// fold_counter_ptr set: the same launch also folds the per-tensor amax into the delayed-scaling ring
// (QuantizeParams::fold); one counter per launch in flight.
cudaError_t quantize_launch(const QuantizeParams& params, cudaStream_t stream);

// amax_ptr[0] = max(amax_ptr[0], max |x|) (NaN if x holds one); the caller zeroes amax_ptr first.
cudaError_t quantize_amax_launch(const AmaxParams& params, cudaStream_t stream);

// The delayed-scaling ring fold (AmaxHistoryParams): one block, stream-ordered after the launch that wrote
// amax_ptr; graph capturable (the slot lives in device memory).
cudaError_t amax_history_fold_launch(const AmaxHistoryParams& params, cudaStream_t stream);

// 128 x 128 block-scaled fp8 quantization; cols % 128 == 0.
cudaError_t quantize_block128_launch(const BlockQuantParams& params, cudaStream_t stream);

// Scale factors into the MN-major, TMA-aligned layout, plain float32 or packed UE8M0 int32.
cudaError_t scale_layout_launch(const ScaleLayoutParams& params, cudaStream_t stream);

namespace quantize_detail {
// Grid size for `blocks_needed` blocks of `threads`: at most kMaxWaves full-occupancy waves (blocks then loop).
cudaError_t grid_for(int64_t blocks_needed, int threads, int max_blocks, int64_t* grid);
// The tiled-transpose part of quantize_launch (params already validated).
cudaError_t quantize_transpose_launch(const QuantizeParams& params, cudaStream_t stream);
}  // namespace quantize_detail

}  // namespace astrai
