// Epilogue of the sm_90a bf16 prefill: a consumer's O / l rounded to bf16 and stored from registers, 16 bytes per
// thread and store.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "kernels/attention/sm90_bf16_prefill_traits.cuh"

namespace astrai {
namespace attention {

// A 4 x 4 transpose over the lanes of a quad: lane q's v[e] becomes lane e's v[q] (q = lane % 4). Two exchanges:
// the off-diagonal 2 x 2 blocks between lanes q and q ^ 2, then the corners of each block between q and q ^ 1.
__device__ __forceinline__ void quad_transpose4(uint32_t (&v)[4], int q) {
  const bool upper = (q & 2) != 0;
  uint32_t a = upper ? v[0] : v[2], b = upper ? v[1] : v[3];
  a = __shfl_xor_sync(0xffffffffu, a, 2);
  b = __shfl_xor_sync(0xffffffffu, b, 2);
  if (upper) {
    v[0] = a;
    v[1] = b;
  } else {
    v[2] = a;
    v[3] = b;
  }
  const bool odd = (q & 1) != 0;
  a = odd ? v[0] : v[1];
  b = odd ? v[2] : v[3];
  a = __shfl_xor_sync(0xffffffffu, a, 1);
  b = __shfl_xor_sync(0xffffffffu, b, 1);
  if (odd) {
    v[0] = a;
    v[2] = b;
  } else {
    v[1] = a;
    v[3] = b;
  }
}

// Rows my_row0 and my_row0 + 8 of work item w's Q tile: O / l (row_sum: this thread's partial sums of l). Shared
// memory stays the producer's: the next item's Q and tiles land meanwhile. A quad holds column pairs 8 n + 2 q
// (lane q) of one row; transposed within the quad (quad_transpose4), lane q holds the 8 columns of n = 4 k + q, so
// each lane stores 16 bytes at a time (4-byte stores of the pairs were the slow part of the epilogue). cols: the
// caller's scratch for one store (held in the caller's frame, the transposition compiles as it did inline).
template <bool kRaggedQ>
__device__ __forceinline__ void prefill_sm90_store_o(const PrefillParams& p, int64_t w, const float (&acc_o)[64],
                                                     const float (&row_sum)[2], int my_row0, int lane,
                                                     uint32_t (&cols)[4]) {
  using bf16 = __nv_bfloat16;
  // acc_o: (64 rows, 128) fragment, acc_o[4 n + e] = O[row + 8 (e / 2)][8 n + 2 (lane % 4) + e % 2]
  // Recomputed: not held across the mainloop.
  const QTile qt = locate_q_tile<PrefillSm90Traits::kBM, kRaggedQ>(p, unsigned(w));
  const int q4 = lane & 3;
  bf16* out = static_cast<bf16*>(p.out_ptr) +
              (kRaggedQ ? int64_t(qt.seq_lo) * p.out_seq_stride : int64_t(qt.b) * p.out_batch_stride) + 8 * q4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = row_sum[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;  // a row that kept no key: zeros
    const int m = my_row0 + 8 * h;
    const int i = qt.row0 + (m >> qt.hb_log2);
    const int hq = qt.qh0 + (m & ((1 << qt.hb_log2) - 1));
    bf16* const dst = out + (int64_t(i) * p.out_seq_stride + int64_t(hq) * p.out_head_stride);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      // cols: column pairs 8 (4 k + e) + 2 q4 for e = 0..3; after the transpose, 8 (4 k + q4) + 2 e
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = 4 * k + e;
        cols[e] = pack_bf16x2_rn(acc_o[4 * n + 2 * h] * inv, acc_o[4 * n + 2 * h + 1] * inv);
      }
      quad_transpose4(cols, q4);  // every lane: the shuffles need the whole warp
      if (i < qt.q_len) *reinterpret_cast<uint4*>(dst + 32 * k) = make_uint4(cols[0], cols[1], cols[2], cols[3]);
    }
  }
}

}  // namespace attention
}  // namespace astrai
