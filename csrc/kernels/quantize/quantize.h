// Host entry of the quantize family: launchers for fp8/int8 quantization; plain C++, no CUDA compiler needed.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "kernels/quantize/params.h"

namespace astrai {

// The explicit plan of a quantize_launch call: which kernel, its 16-byte variant or not, and its grid.
enum class QuantizeKernel : int32_t {
  kRows = 0,             // row-major out (every scale kind, fp8 or int8)
  kTransposeSmem = 1,    // out_t by the shared-memory tile (no fused fold)
  kTransposeRegs8 = 2,   // out_t by the register transpose, tiles of reg_tile_rows<8>() rows
  kTransposeRegs16 = 3,  // the same with reg_tile_rows<16>() rows (bf16 input only)
};

struct QuantizeLaunch {
  QuantizeKernel kernel;
  bool vec;                 // 16-byte runs of x (and, rows kernel, of out)
  int32_t threads_per_row;  // kRows: block (threads_per_row, 256 / threads_per_row), a power of two in [8, 256]
  int64_t blocks;           // the grid; blocks loop past it
};

// The policy: out_t set: the tiled-transpose kernel (fp8 only; scale kinds kTensor, kRow, kColumn, kFromAmax), the
// register transpose (rows of 16 for large bf16 calls) unless the call needs more than 2^31 of its tiles;
// else the row kernel (every kind, fp8 or int8), threads per row the smallest power of two covering a row in a few
// steps each; the 16-byte variant wherever alignment, strides and cols allow; grids of at most 16 full-occupancy
// waves (persistent where a kernel prefetches). Queries the current device. rows or cols of 0: a plan of no blocks.
cudaError_t quantize_plan(const QuantizeParams& params, QuantizeLaunch* plan);

// Why `plan` cannot run this call; empty when it can.
std::string quantize_launch_unfit(const QuantizeParams& params, const QuantizeLaunch& plan);

// Quantizes x into out (row-major) or out_t (transposed) on `stream` as `plan` says (quantize_plan). Returns the
// launch status (cudaErrorInvalidValue for inconsistent params or a plan they do not allow); never throws. rows or
// cols of 0: no quantize launch, cudaSuccess (with the fused fold, fold_counter_ptr set: the fold of an amax of 0,
// one block). fold_counter_ptr set: the same launch also folds the per-tensor amax into the delayed-scaling ring
// (QuantizeParams::fold); one counter per launch in flight.
cudaError_t quantize_launch(const QuantizeParams& params, const QuantizeLaunch& plan, cudaStream_t stream);

// The explicit plan of the auxiliary launches (amax pass, 128 x 128 blocks, scale layout): their 16-byte variant and
// grid (each by a fixed rule: one thread or block a unit of work, at most 16 full-occupancy waves, then loops).
struct QuantizeGridLaunch {
  bool vec;        // 16-byte runs (the scale layout has none)
  int64_t blocks;  // the grid; blocks loop past it
};

// amax_ptr[0] = max(amax_ptr[0], max |x|) (NaN if x holds one); the caller zeroes amax_ptr first.
cudaError_t quantize_amax_plan(const AmaxParams& params, QuantizeGridLaunch* plan);
cudaError_t quantize_amax_launch(const AmaxParams& params, const QuantizeGridLaunch& plan, cudaStream_t stream);

// The delayed-scaling ring fold (AmaxHistoryParams): one block of a fixed size (nothing to plan), stream-ordered
// after the launch that wrote amax_ptr; graph capturable (the slot lives in device memory).
cudaError_t amax_history_fold_launch(const AmaxHistoryParams& params, cudaStream_t stream);

// 128 x 128 block-scaled fp8 quantization; cols % 128 == 0.
cudaError_t quantize_block128_plan(const BlockQuantParams& params, QuantizeGridLaunch* plan);
cudaError_t quantize_block128_launch(const BlockQuantParams& params, const QuantizeGridLaunch& plan,
                                     cudaStream_t stream);

// Scale factors into the MN-major, TMA-aligned layout, plain float32 or packed UE8M0 int32.
cudaError_t scale_layout_plan(const ScaleLayoutParams& params, QuantizeGridLaunch* plan);
cudaError_t scale_layout_launch(const ScaleLayoutParams& params, const QuantizeGridLaunch& plan, cudaStream_t stream);

// The plan, then the launch of exactly it (each returns the first failing status): what the ops do.
template <class Params, class Plan>
cudaError_t plan_and_launch(cudaError_t (*plan_fn)(const Params&, Plan*),
                            cudaError_t (*launch_fn)(const Params&, const Plan&, cudaStream_t), const Params& params,
                            cudaStream_t stream) {
  Plan plan{};
  const cudaError_t status = plan_fn(params, &plan);
  return status != cudaSuccess ? status : launch_fn(params, plan, stream);
}

namespace quantize_detail {
// Grid size for `blocks_needed` blocks of `threads`: at most kMaxWaves full-occupancy waves (blocks then loop).
cudaError_t grid_for(int64_t blocks_needed, int threads, int max_blocks, int64_t* grid);
// The tiled-transpose part of quantize_plan and quantize_launch (params already validated): variant -1 (by size),
// 0 (shared memory), 8 or 16 (register tiles); persistent: register grids capped at the resident blocks. Tests and
// the launch sweep plan other variants through it.
cudaError_t quantize_transpose_plan(const QuantizeParams& params, int variant, bool persistent, QuantizeLaunch* plan);
// The same with the shipped choice (quantize_transpose.cuh: kTransposeVariant, kRegPersistent).
cudaError_t quantize_transpose_plan(const QuantizeParams& params, QuantizeLaunch* plan);
std::string quantize_transpose_unfit(const QuantizeParams& params, const QuantizeLaunch& plan);
cudaError_t quantize_transpose_launch(const QuantizeParams& params, const QuantizeLaunch& plan, cudaStream_t stream);
}  // namespace quantize_detail

}  // namespace astrai
