// Quantize family launch parameters: plain data shared by the binding, the launchers and the kernels.
#pragma once

#include <cstdint>

namespace astrai {

// Element types of x (the input).
enum class QuantIn : int32_t { kBF16 = 0, kF16 = 1, kF32 = 2 };
// Element types of the quantized output.
enum class QuantOut : int32_t { kE4M3 = 0, kE5M2 = 1, kInt8 = 2 };

// Where the multiplier of element (m, n) comes from.
enum class QuantScale : int32_t {
  kTensor = 0,         // scale_ptr[0]
  kRow = 1,            // scale_ptr[m]
  kColumn = 2,         // scale_ptr[n]
  kFromAmax = 3,       // computed from amax_in_ptr[0] (dynamic per tensor, second pass)
  kDynamicRow = 4,     // computed from the row's amax, in the same pass
  kDynamicGroup = 5,   // computed from the amax of each 1 x group_cols group of a row, in the same pass
};

// Fused amax of x (before scaling) written beside the quantized output.
enum class QuantAmax : int32_t { kNone = 0, kTensor = 1, kRow = 2 };

// The delayed-scaling ring fold (one step): ring[slot] = amax_ptr[0] with slot = pos_ptr[0] mod len, pos advanced
// to the next slot; then the multiplier of the next step from the ring's max m (torch.amax: NaN if the ring holds
// one): scale = s(m) / 2^margin, s(m) = qmax / m rounded once (FLT_MAX past it), 1 when m is 0, inf or NaN; the
// division by 2^margin rounds once (0 for margin >= 128). Everything stays on the device: no host sync.
struct AmaxHistoryParams {
  float* ring_ptr;         // [len] float32 amax history
  int64_t* pos_ptr;        // [1]: the slot of this step's amax; written back as (slot + 1) mod len
  const float* amax_ptr;   // [1]: this step's amax
  float* scale_ptr;        // [1] out: the multiplier of the next step
  float* scale_inv_ptr;    // [1] out: 1 / scale rounded once; null: not written
  int64_t len;             // ring length, >= 1
  float qmax;              // the format's largest finite magnitude
  int32_t margin;          // >= 0
};

// x is [rows, cols] with a contiguous last axis; outputs are dense. Strides are in elements.
struct QuantizeParams {
  const void* x_ptr;            // x: [rows, cols] bf16 / fp16 / fp32
  void* out_ptr;                // out: [rows, cols] fp8 / int8, row stride cols; null: not written
  void* out_t_ptr;              // out_t: [cols, rows] fp8, row stride rows; null: not written
  const float* scale_ptr;       // static multiplier: [1] / [rows] / [cols] by scale kind; null when dynamic
  const float* amax_in_ptr;     // kFromAmax: the per-tensor amax of x ([1]), written by quantize_amax_launch
  float* amax_ptr;              // fused amax out: [1] (atomic max; the caller zeroes it) or [rows]; null: none
  float* scale_inv_ptr;         // dynamic kinds: 1 / multiplier, [1] / [rows] / [rows, groups]; null: none
  int64_t x_row_stride;         // x: elements between consecutive rows (>= cols)
  int64_t scale_inv_row_stride;  // scale_inv [rows, groups]: elements between rows (group kind)
  int64_t scale_inv_group_stride;  // scale_inv [rows, groups]: elements between groups (group kind)
  int64_t rows;                 // M; 0 launches nothing
  int64_t cols;                 // N; 0 launches nothing
  float qmax;                   // the format's largest finite magnitude: 448, 57344 or 127
  int32_t group_cols;           // kDynamicGroup: elements per group (128)
  int32_t max_blocks;           // 0: the launcher sizes the grid; > 0 caps it (tests run the row loop)
  QuantIn in_type;              // x's element type
  QuantOut out_type;            // out / out_t element type
  QuantScale scale_kind;        // multiplier source
  QuantAmax amax_kind;          // fused amax
  bool pow2_scale;              // dynamic kinds: round the multiplier down to a power of two
  // Delayed scaling fused into the launch (fold_counter_ptr non-null; per-tensor multiplier kTensor and per-tensor
  // amax only): the last block to finish folds amax_ptr[0] into the ring `fold` (its amax_ptr is unused) and
  // overwrites scale_ptr[0] (fold.scale_ptr, the same address) with the next step's multiplier. fold_counter_ptr
  // is a uint32 that is 0 before the launch, and the last block sets it back to 0 (so one counter must not serve
  // two launches in flight at once). step_scale_inv_ptr (optional): 1 / this step's multiplier, rounded once (the
  // dequantization scale of this step's output, bitwise the fold's scale_inv of the previous step).
  AmaxHistoryParams fold;
  uint32_t* fold_counter_ptr;
  float* step_scale_inv_ptr;
};

// Per-tensor amax of x (dynamic per-tensor quantization, first pass): amax_ptr[0] = max |x|, NaN if any x
// is NaN. amax_ptr is atomically maxed into: the caller zeroes it.
struct AmaxParams {
  const void* x_ptr;     // x: [rows, cols]
  float* amax_ptr;       // [1]
  int64_t x_row_stride;  // x: elements between consecutive rows
  int64_t rows, cols;
  int32_t max_blocks;    // 0: the launcher sizes the grid
  QuantIn in_type;
};

// 128 x 128 block quantization (weights): one multiplier per [block_rows, block_cols] tile, from its amax.
struct BlockQuantParams {
  const void* x_ptr;             // x: [rows, cols]
  void* out_ptr;                 // out: [rows, cols] fp8, row stride cols
  float* scale_inv_ptr;          // [ceil(rows / block_rows), cols / block_cols]
  int64_t x_row_stride;          // x: elements between consecutive rows
  int64_t scale_inv_row_stride;  // scale_inv: elements between block rows
  int64_t scale_inv_col_stride;  // scale_inv: elements between block columns
  int64_t rows, cols;            // cols % 128 == 0
  float qmax;                    // 448 or 57344
  QuantIn in_type;
  QuantOut out_type;             // kE4M3 or kE5M2
  bool pow2_scale;
};

// Scale factors [mn, sf_k] (any strides) -> MN-major, TMA-aligned: element (i, k) at i + k * align(mn, 4).
// packed: int32 [mn, ceil(sf_k / 4)], byte j of word (i, k) is the biased exponent of sf[i, 4k + j] (zero past
// sf_k); plain: float32 [mn, sf_k]. Padding rows [mn, align(mn, 4)) are written as zero.
struct ScaleLayoutParams {
  const float* sf_ptr;     // sf: [mn, sf_k] float32
  void* out_ptr;           // packed: int32, plain: float32; align(mn, 4) * (packed ? ceil(sf_k/4) : sf_k) elements
  int64_t sf_mn_stride;    // sf: elements between rows
  int64_t sf_k_stride;     // sf: elements between columns
  int64_t mn, sf_k;
  bool packed;
};

}  // namespace astrai
