// The GEMM family's launch parameters: one POD the binding fills and the launcher passes by value.
#pragma once

#include <cstdint>

namespace astrai {

// Operand dtype pairs (a, b): the kernel each one runs (csrc/kernels/gemm/sm80_traits.cuh).
enum class GemmPair : int32_t {
  kBf16Bf16 = 0,   // w16a16
  kF16F16 = 1,     // w16a16
  kBf16S8 = 2,     // w8a16: int8 weight expanded to bf16 in registers
  kF16S8 = 3,      // w8a16, fp16 activation
  kS8S8 = 4,       // w8a8: s32 accumulators
  kE4m3E4m3 = 5,   // fp8 (sm_89+)
  kE5m2E4m3 = 6,   // fp8, e5m2 activation (gradients)
  kE4m3E5m2 = 7,   // fp8, e5m2 weight
};

enum class GemmOut : int32_t { kBf16 = 0, kF16 = 1, kF32 = 2, kS32 = 3 };

// How a and b are stored (the op's `layout` int): first letter a, second b; "n" = a [m][k] / b [k][n], "t" = a
// [k][m] / b [n][k]. An operand is K-major (K contiguous: nt's a and b) or MN-major (M or N contiguous).
enum class GemmLayout : int32_t { kNT = 0, kNN = 1, kTN = 2, kTT = 3 };
enum class GemmBias : int32_t { kNone = 0, kBf16 = 1, kF16 = 2, kF32 = 3 };

// y[b][m][n] = out(acc * a_scale[m] * b_scale[n] + bias[n]), acc = sum_k a[b][m][k] b[b][n][k] with a and b stored
// as `layout` says. Strides in elements; a batch stride of 0 broadcasts that operand.
struct GemmParams {
  const void* a;          // [batch][m][k] (layout nt, nn) or [batch][k][m] (tn, tt), stored-row stride a_row_stride
  const void* b;          // [batch][n][k] (nt, tt) or [batch][k][n] (nn, tn), stored-row stride b_row_stride
  void* out;              // [batch][m][n], row stride out_row_stride, unit column stride
  void* workspace;        // split_k > 1: [batch * split_k][m][n] fp32 (s32 for kS8S8) partials, else null
  const float* a_scale;   // null, 1 value, or m values (a_scale_per_row)
  const float* b_scale;   // null, 1 value, or n values (b_scale_per_col)
  const void* bias;       // null or n values of bias_dtype
  int64_t a_row_stride, a_batch_stride;
  int64_t b_row_stride, b_batch_stride;
  int64_t out_row_stride, out_batch_stride;
  int32_t m, n, k, batch;
  int32_t split_k;             // >= 1: K-tile slices reduced by gemm_reduce in a fixed order; 0 (recipes 4, 5, 7-11):
                               // the tiles past the last whole wave split along K (tail_from / tail_split)
  int32_t k_tiles_per_split;   // ceil(k_tiles / split_k) (split_k 0: / tail_split), set by the launcher
  // split_k 0, set by the launcher (gemm_sm90_tail_plan): units below tail_from are whole tiles; each tile from
  // tail_from on runs as tail_split K slices whose partials gemm_sm90_tail_reduce_kernel sums in slice order.
  // tail_split 0: no such split.
  int32_t tail_from;
  int32_t tail_split;
  int32_t a_scale_per_row;     // 1: a_scale has m values
  int32_t b_scale_per_col;     // 1: b_scale has n values
  GemmOut out_dtype;
  GemmBias bias_dtype;
  GemmLayout layout;
  // 1: the launcher swapped a and b (with their strides, m and n) to run y^T = b a on the "nn" kernel; the kernel
  // stores its (row, col) at the output's (col, row). Scales, bias and the out strides keep y's orientation.
  int32_t transpose_out;
};

}  // namespace astrai
