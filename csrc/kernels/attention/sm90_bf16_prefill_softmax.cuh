// Online softmax of the sm_90a bf16 prefill: per consumer thread, the running max and sum of its two rows, a
// score tile turned into exp2 weights in place, and the factor O takes before the tile's P V.
#pragma once

#include <cstdint>

#include "kernels/attention/sm90_bf16_prefill_traits.cuh"

namespace astrai {
namespace attention {

// op(t[0], ..., t[15]) as a balanced tree (4 levels of independent operations instead of a chain of 15).
template <typename Op>
__device__ __forceinline__ float tree_reduce16(const float (&t)[16], Op op) {
  float u[8];
#pragma unroll
  for (int n = 0; n < 8; ++n) u[n] = op(t[n], t[n + 8]);
#pragma unroll
  for (int n = 0; n < 4; ++n) u[n] = op(u[n], u[n + 4]);
  return op(op(u[0], u[2]), op(u[1], u[3]));
}

// A consumer thread's rows h = 0, 1 are its packed rows my_row0 + 8 h (a quad of lanes shares each row):
// row_max[h] (kept unscaled) and row_sum[h] (this thread's part of l) over the keys so far.
__device__ __forceinline__ void prefill_sm90_softmax_reset(float (&row_max)[2], float (&row_sum)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_max[h] = prefill_neg_inf();
    row_sum[h] = 0.f;
  }
}

// Scores of a tile to exp2 weights in place (online max, then exp2(s scale - max scale) in one FFMA each: the
// scale is positive here, so the max of the raw scores is the max of the scaled ones), the running sums updated;
// alpha: the factor O must take before this tile's P V. Returns whether some row max of this thread grew.
__device__ __forceinline__ bool prefill_sm90_softmax(float (&s)[64], float (&alpha)[2], float (&row_max)[2],
                                                     float (&row_sum)[2], float scale) {  // s: (64 rows, 128)
  // Reductions as trees: with two warps per scheduler, serial chains of 32 dependent max / add would leave the
  // issue slots idle for their latency.
  bool moved = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float t[16];
#pragma unroll
    for (int n = 0; n < 16; ++n) t[n] = fmaxf(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]);
    float mx = fmaxf(row_max[h], tree_reduce16(t, [](float a, float b) { return fmaxf(a, b); }));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // Nothing kept yet: exp2(-inf scale - 0) = 0, not NaN.
    const float neg_m = mx == prefill_neg_inf() ? 0.f : -mx * scale;
    const bool grew = mx != row_max[h];
    alpha[h] = grew ? fast_exp2(fmaf(row_max[h], scale, neg_m)) : 1.f;
    moved |= grew;
    row_max[h] = mx;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      s[4 * n + 2 * h] = fast_exp2(fmaf(s[4 * n + 2 * h], scale, neg_m));
      s[4 * n + 2 * h + 1] = fast_exp2(fmaf(s[4 * n + 2 * h + 1], scale, neg_m));
      t[n] = s[4 * n + 2 * h] + s[4 * n + 2 * h + 1];
    }
    row_sum[h] = row_sum[h] * alpha[h] + tree_reduce16(t, [](float a, float b) { return a + b; });
  }
  return moved;
}

}  // namespace attention
}  // namespace astrai
