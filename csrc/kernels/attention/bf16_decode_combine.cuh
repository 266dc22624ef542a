// Log-sum-exp merge of split-KV decode partials into the bf16 output (included by the launcher only).
#pragma once

#include "kernels/attention/bf16_decode_split_kv.cuh"

namespace astrai {
namespace attention {

// Split lanes per output row: the splits of one (b, q head) are spread over this many threads so that
// batch 1, whose many splits are the whole point, merges in a few memory round trips rather than one
// per split.
constexpr int kCombineLanes = 8;

// grid: B * Hq rows; block: (D / 8) * kCombineLanes threads. Thread (j, c) folds splits j, j + 8, ... of
// dims [8c, 8c + 8) into an online state; the kCombineLanes states then merge in lane order. The order
// is fixed by the shapes, so results are deterministic. Empty splits (lse -inf) contribute exact zeros.
__global__ void __launch_bounds__(256) decode_combine_kernel(const __grid_constant__ DecodeParams p) {
  using bf16 = __nv_bfloat16;
  __shared__ __align__(16) float sm_o[kCombineLanes][32][8];  // per split lane, per chunk: o
  __shared__ float sm_m[kCombineLanes][32];                    // per split lane, per chunk: max lse
  __shared__ float sm_s[kCombineLanes][32];                    // per split lane, per chunk: sum of weights

  const int chunks = p.head_dim / 8;
  const int c = int(threadIdx.x) % chunks;
  const int j = int(threadIdx.x) / chunks;
  const int64_t row = blockIdx.x;  // b * Hq + qh
  const int64_t rows = int64_t(p.batch) * p.num_q_heads;

  float mx = neg_inf(), sum = 0.f, o[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll 2
  for (int s = j; s < p.num_splits; s += kCombineLanes) {
    const float lse = p.partial_lse_ptr[s * rows + row];
    const float4* src = reinterpret_cast<const float4*>(p.partial_o_ptr + (s * rows + row) * p.head_dim + 8 * c);
    const float4 a = src[0], b = src[1];
    if (lse == neg_inf()) continue;  // an empty split
    const float m_new = fmaxf(mx, lse);
    const float keep = exp2f(mx - m_new);  // 0 while the state is empty
    const float w = exp2f(lse - m_new);
    sum = fmaf(sum, keep, w);
    o[0] = fmaf(o[0], keep, w * a.x); o[1] = fmaf(o[1], keep, w * a.y);
    o[2] = fmaf(o[2], keep, w * a.z); o[3] = fmaf(o[3], keep, w * a.w);
    o[4] = fmaf(o[4], keep, w * b.x); o[5] = fmaf(o[5], keep, w * b.y);
    o[6] = fmaf(o[6], keep, w * b.z); o[7] = fmaf(o[7], keep, w * b.w);
    mx = m_new;
  }
  sm_m[j][c] = mx;
  sm_s[j][c] = sum;
  float4* dst = reinterpret_cast<float4*>(&sm_o[j][c][0]);
  dst[0] = make_float4(o[0], o[1], o[2], o[3]);
  dst[1] = make_float4(o[4], o[5], o[6], o[7]);
  __syncthreads();

  if (j != 0) return;
  float m_all = neg_inf();
#pragma unroll
  for (int i = 0; i < kCombineLanes; ++i) m_all = fmaxf(m_all, sm_m[i][c]);
  float total = 0.f, out[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  if (m_all != neg_inf()) {
#pragma unroll
    for (int i = 0; i < kCombineLanes; ++i) {
      const float w = exp2f(sm_m[i][c] - m_all);  // 0 for a lane that saw no split
      total = fmaf(sm_s[i][c], w, total);
#pragma unroll
      for (int e = 0; e < 8; ++e) out[e] = fmaf(sm_o[i][c][e], w, out[e]);
    }
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
#pragma unroll
  for (int e = 0; e < 8; ++e) out[e] *= inv;
  const int64_t b = row / p.num_q_heads;
  const int64_t qh = row % p.num_q_heads;
  store8_bf16(static_cast<bf16*>(p.out_ptr) + (b * p.out_batch_stride + qh * p.out_head_stride + 8 * c), out);
}

}  // namespace attention
}  // namespace astrai
