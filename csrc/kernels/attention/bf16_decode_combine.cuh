// Log-sum-exp merge of split-KV decode partials into the bf16 output (included by the launcher only).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention/attention.h"
#include "kernels/attention/bf16_decode_split_kv.cuh"
#include "kernels/attention/decode_dispatch.h"
#include "kernels/common/host/pdl_launch.h"
#include "kernels/common/ptx/griddep.cuh"
#include "kernels/common/ptx/math.cuh"
#include "kernels/common/vec_types.cuh"

namespace astrai {
namespace attention {

// Split lanes per output row: the splits of one (b, q head) are spread over this many threads so that
// batch 1, whose many splits are the whole point, merges in a few memory round trips rather than one
// per split.
constexpr int kCombineLanes = 8;
// Splits per split lane whose partials load before the weights are known (registers: 8 floats each); the
// planner's B = 1 plans at head_dim 128 have 16 splits, two per lane.
constexpr int kCombinePrefetch = 4;

// grid: B * Hq rows; block: (D / 8) * kCombineLanes threads. Launched as a programmatic dependent of the
// decode kernel where the device, this image and the ASTRAI_DECODE_PDL knob allow it: the launch and the
// block's start then overlap the decode's tail. Three passes, each with independent loads (two memory round
// trips at up to kCombineLanes * kCombinePrefetch splits, a few more beyond):
//   1. the row's lse of every split into shared memory, and their max;
//   2. weights w_s = exp2(lse_s - max) (0 for empty splits);
//   3. thread (j, c) sums w_s o_s over splits j, j + kCombineLanes, ... for dims [8c, 8c + 8) (the first
//      kCombinePrefetch of them loaded before pass 1); the kCombineLanes sums then merge in lane order.
// Every order is fixed by the shapes, so results are deterministic and batch invariant.
__global__ void __launch_bounds__(256) decode_combine_kernel(const __grid_constant__ DecodeParams p) {
  using bf16 = __nv_bfloat16;
  __shared__ float sm_w[kDecodeMaxSplits];                     // per split: lse, then weight
  __shared__ __align__(16) float sm_o[kCombineLanes][32][8];  // per split lane, per chunk: weighted o
  __shared__ float sm_s[kCombineLanes][32];                    // per split lane, per chunk: sum of weights
  __shared__ float sm_red[8];                                  // per warp: max lse

  const int chunks = p.head_dim / 8;
  const int c = int(threadIdx.x) % chunks;
  const int j = int(threadIdx.x) / chunks;
  const int tid = threadIdx.x;
  const int threads = chunks * kCombineLanes;
  const int64_t row = blockIdx.x;  // b * Hq + qh
  const int64_t rows = int64_t(p.batch) * p.num_q_heads;
  const int n = p.num_splits;

  launch_dependents();  // the next call's decode may be scheduled now (it waits for this grid too)
  wait_prerequisites();

  // The o chunks of this thread's first kCombinePrefetch splits load now, alongside the lse pass, rather than
  // one memory round trip after it.
  float4 pre[kCombinePrefetch][2];  // (kCombinePrefetch, 2): dims 8c..8c+3, 8c+4..8c+7 of split j + i kCombineLanes
#pragma unroll
  for (int i = 0; i < kCombinePrefetch; ++i) {
    const int s = j + i * kCombineLanes;
    if (s < n) {
      const float4* src = reinterpret_cast<const float4*>(p.partial_o_ptr + (s * rows + row) * p.head_dim + 8 * c);
      pre[i][0] = src[0];
      pre[i][1] = src[1];
    }
  }

  float mx = neg_inf();
  for (int s = tid; s < n; s += threads) {
    const float lse = p.partial_lse_ptr[s * rows + row];
    sm_w[s] = lse;
    mx = fmaxf(mx, lse);
  }
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (tid % 32 == 0) sm_red[tid / 32] = mx;
  __syncthreads();
  mx = sm_red[0];
  for (int w = 1; w < threads / 32; ++w) mx = fmaxf(mx, sm_red[w]);
  // Each thread rewrites only the entries it wrote above.
  for (int s = tid; s < n; s += threads) sm_w[s] = mx == neg_inf() ? 0.f : fast_exp2(sm_w[s] - mx);
  __syncthreads();

  float sum = 0.f, o[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  // Splits j, j + kCombineLanes, ... in order; an empty split (or one whose weight underflows) adds nothing.
  auto add = [&](float w, const float4& a, const float4& b) {
    sum += w;
    o[0] = fmaf(w, a.x, o[0]); o[1] = fmaf(w, a.y, o[1]); o[2] = fmaf(w, a.z, o[2]); o[3] = fmaf(w, a.w, o[3]);
    o[4] = fmaf(w, b.x, o[4]); o[5] = fmaf(w, b.y, o[5]); o[6] = fmaf(w, b.z, o[6]); o[7] = fmaf(w, b.w, o[7]);
  };
#pragma unroll
  for (int i = 0; i < kCombinePrefetch; ++i) {
    const int s = j + i * kCombineLanes;
    if (s < n && sm_w[s] != 0.f) add(sm_w[s], pre[i][0], pre[i][1]);
  }
#pragma unroll 4
  for (int s = j + kCombinePrefetch * kCombineLanes; s < n; s += kCombineLanes) {
    const float w = sm_w[s];
    if (w == 0.f) continue;
    const float4* src = reinterpret_cast<const float4*>(p.partial_o_ptr + (s * rows + row) * p.head_dim + 8 * c);
    add(w, src[0], src[1]);
  }
  sm_s[j][c] = sum;
  float4* dst = reinterpret_cast<float4*>(&sm_o[j][c][0]);
  dst[0] = make_float4(o[0], o[1], o[2], o[3]);
  dst[1] = make_float4(o[4], o[5], o[6], o[7]);
  __syncthreads();

  if (j != 0) return;
  float total = 0.f, out[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < kCombineLanes; ++i) {
    total += sm_s[i][c];
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] += sm_o[i][c][e];
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
#pragma unroll
  for (int e = 0; e < 8; ++e) out[e] *= inv;
  const int64_t b = row / p.num_q_heads;
  const int64_t qh = row % p.num_q_heads;
  store_bf16<8, true>(static_cast<bf16*>(p.out_ptr) + (b * p.out_batch_stride + qh * p.out_head_stride + 8 * c), out);
}

cudaError_t launch_decode_combine(const DecodeParams& p, cudaStream_t stream, bool pdl) {
  // One block per (b, q head) row: kCombineLanes split lanes x D/8 chunks (64..256 threads).
  const int64_t rows = int64_t(p.batch) * p.num_q_heads;
  const dim3 block(unsigned((p.head_dim / 8) * kCombineLanes));
  return launch_maybe_dependent(decode_combine_kernel, dim3(unsigned(rows)), block, 0, stream, pdl, p);
}

}  // namespace attention
}  // namespace astrai
