// Fused rotary embedding on bf16 q/k: cos/sin lookup (optionally through positions) and rotation, one launch.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "kernels/common/vec_types.cuh"
#include "kernels/rotary/params.h"

namespace astrai {
namespace rotary {

// Heads one thread rotates per pass of its head loop; their loads are all issued before the first store.
// 2 on sm_90: 64 registers (NeoX, 16-byte variant), so 1024 threads x 64 bytes of x in flight per SM;
// 4 needs 88 registers and leaves about as many bytes in flight in fewer, longer blocks (worse tail).
constexpr int kHeadUnroll = 2;
// Block size bound: keeps the register budget at >= 128 per thread so nothing spills.
constexpr int kMaxBlockThreads = 512;

// Work layout. A "chunk" is kPairs consecutive pairs of one head; all heads of one token share the
// chunk's kPairs cos/sin values, which a thread loads once into registers and reuses for every head it owns.
//   threadIdx.x: chunk of the head   (loops when head_dim / 2 / kPairs > blockDim.x)
//   threadIdx.y: head, q heads first, then k heads (loops over kHeadUnroll * blockDim.y)
//   threadIdx.z, blockIdx.x: token   (grid-stride loop, so any T works with any grid)
// kPairs == 1 is the scalar variant (2-byte loads, any alignment); kPairs in {4, 8} moves x with
// 16-byte loads and stores. kVecCs: cos/sin with 16-byte loads as well.
template <bool kInterleaved, int kPairs, bool kVecCs>
__global__ void __launch_bounds__(kMaxBlockThreads) rotary_bf16_kernel(const __grid_constant__ RotaryParams p) {
  constexpr bool kVecX = kPairs > 1;
  static_assert(kPairs == 1 || (kPairs % 4 == 0 && (kInterleaved || kPairs % 8 == 0)),
                "16-byte x moves need 8 elements per run: NeoX runs are kPairs long, GPT-J runs 2 * kPairs");
  static_assert(!kVecCs || kPairs % 4 == 0, "16-byte cos/sin loads need 4 pairs per chunk");
  using bf16 = __nv_bfloat16;

  const bf16* q_in = static_cast<const bf16*>(p.q_ptr);
  bf16* q_out = static_cast<bf16*>(p.q_out_ptr);
  const bf16* k_in = static_cast<const bf16*>(p.k_ptr);
  bf16* k_out = static_cast<bf16*>(p.k_out_ptr);
  const int half = p.head_dim >> 1;
  const int chunks = half / kPairs;
  const int num_q_heads = p.num_q_heads;
  const int num_heads = num_q_heads + p.num_k_heads;
  const int head_step = kHeadUnroll * int(blockDim.y);
  const int64_t token_step = int64_t(gridDim.x) * blockDim.z;
  const float nan = __int_as_float(0x7fffffff);

  for (int64_t t = int64_t(blockIdx.x) * blockDim.z + threadIdx.z; t < p.num_tokens; t += token_step) {
    int64_t row = t;
    if (p.positions_ptr != nullptr) {
      const int64_t at = t * p.positions_token_stride;
      row = p.positions_int64 ? __ldg(static_cast<const long long*>(p.positions_ptr) + at)
                              : int64_t(__ldg(static_cast<const int*>(p.positions_ptr) + at));
    }
    // Out-of-range rows are never read: their cos/sin become NaN, so every output of the token is NaN.
    const bool valid = row >= 0 && row < p.num_rows;
    const int64_t q_in_tok = t * p.q_token_stride;
    const int64_t q_out_tok = t * p.q_out_token_stride;
    const int64_t k_in_tok = t * p.k_token_stride;
    const int64_t k_out_tok = t * p.k_out_token_stride;

    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
      const int pair0 = c * kPairs;
      float cs[kPairs], sn[kPairs];  // (kPairs,)
      if (valid) {
        load_f32_readonly<kPairs, kVecCs>(p.cos_ptr + row * p.cos_row_stride + pair0, cs);
        load_f32_readonly<kPairs, kVecCs>(p.sin_ptr + row * p.sin_row_stride + pair0, sn);
      } else {
#pragma unroll
        for (int i = 0; i < kPairs; ++i) cs[i] = sn[i] = nan;
      }
      // GPT-J: the chunk is one run of 2 * kPairs elements (x0, x1 interleaved).
      // NeoX: two runs of kPairs elements, x0 at pair0 and x1 at pair0 + D/2.
      const int off0 = kInterleaved ? 2 * pair0 : pair0;
      const int off1 = pair0 + half;

      for (int h0 = threadIdx.y; h0 < num_heads; h0 += head_step) {
        using Run = Bf16Run<kInterleaved ? 2 * kPairs : kPairs, kVecX>;
        Run xa[kHeadUnroll], xb[kHeadUnroll];  // GPT-J: xa is the chunk; NeoX: xa = x0 run, xb = x1 run
#pragma unroll
        for (int u = 0; u < kHeadUnroll; ++u) {
          const int h = h0 + u * int(blockDim.y);
          if (h < num_heads) {
            const bool is_q = h < num_q_heads;
            const bf16* src = is_q ? q_in + (q_in_tok + h * p.q_head_stride)
                                   : k_in + (k_in_tok + (h - num_q_heads) * p.k_head_stride);
            xa[u].load_streaming(src + off0);
            if constexpr (!kInterleaved) xb[u].load_streaming(src + off1);
          }
        }
#pragma unroll
        for (int u = 0; u < kHeadUnroll; ++u) {
          const int h = h0 + u * int(blockDim.y);
          if (h < num_heads) {
            float y[2 * kPairs];  // same layout as the loaded runs
#pragma unroll
            for (int i = 0; i < kPairs; ++i) {
              const int i0 = kInterleaved ? 2 * i : i;
              const int i1 = kInterleaved ? 2 * i + 1 : kPairs + i;
              const float a = kInterleaved ? xa[u].get(2 * i) : xa[u].get(i);
              const float b = kInterleaved ? xa[u].get(2 * i + 1) : xb[u].get(i);
              y[i0] = a * cs[i] - b * sn[i];
              y[i1] = b * cs[i] + a * sn[i];
            }
            const bool is_q = h < num_q_heads;
            bf16* dst = is_q ? q_out + (q_out_tok + h * p.q_out_head_stride)
                             : k_out + (k_out_tok + (h - num_q_heads) * p.k_out_head_stride);
            if constexpr (kInterleaved) {
              store_bf16<2 * kPairs, kVecX>(dst + off0, y);
            } else {
              store_bf16<kPairs, kVecX>(dst + off0, y);
              store_bf16<kPairs, kVecX>(dst + off1, y + kPairs);
            }
          }
        }
      }
    }
  }
}

}  // namespace rotary
}  // namespace astrai
