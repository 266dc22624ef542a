// Paged KV append: new K/V tokens of a batch of sequences into their pages, one launch (launcher only).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "kernels/attention/params.h"
#include "kernels/common/ptx/griddep.cuh"

namespace astrai {
namespace attention {

// One thread per 16-byte run (8 dims) of one (token, kv head), K and V both; grid-stride.
__global__ void __launch_bounds__(256) paged_kv_append_kernel(const __grid_constant__ AppendParams p) {
  using bf16 = __nv_bfloat16;
  // A decode launched next as a programmatic dependent (ASTRAI_DECODE_PDL) may be scheduled now: it waits for
  // this grid's completion before reading the cache.
  launch_dependents();
  const int chunks = p.head_dim / 8;
  const int64_t items = p.num_tokens * p.num_kv_heads * chunks;
  const int64_t positions_end = int64_t(p.max_pages) << p.page_size_log2;
  for (int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; item < items;
       item += int64_t(gridDim.x) * blockDim.x) {
    const int c = int(item % chunks) * 8;
    const int64_t nh = item / chunks;
    const int h = int(nh % p.num_kv_heads);
    const int64_t n = nh / p.num_kv_heads;
    const int seq = __ldg(p.seq_ids_ptr + n * p.seq_ids_stride);
    const int pos = __ldg(p.positions_ptr + n * p.positions_stride);
    if (seq < 0 || seq >= p.batch || pos < 0 || int64_t(pos) >= positions_end) continue;
    const int page = __ldg(p.page_table_ptr + int64_t(seq) * p.page_table_batch_stride + (pos >> p.page_size_log2));
    if (page < 0 || page >= p.num_pages) continue;
    const int64_t slot = pos & ((1 << p.page_size_log2) - 1);
    const uint4 kv = __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.k_new_ptr) +
                                                          (n * p.k_new_token_stride + h * p.k_new_head_stride + c)));
    const uint4 vv = __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.v_new_ptr) +
                                                          (n * p.v_new_token_stride + h * p.v_new_head_stride + c)));
    const int64_t k_at = page * p.k_cache_page_stride + slot * p.k_cache_seq_stride + h * p.k_cache_head_stride + c;
    const int64_t v_at = page * p.v_cache_page_stride + slot * p.v_cache_seq_stride + h * p.v_cache_head_stride + c;
    *reinterpret_cast<uint4*>(static_cast<bf16*>(p.k_cache_ptr) + k_at) = kv;
    *reinterpret_cast<uint4*>(static_cast<bf16*>(p.v_cache_ptr) + v_at) = vv;
  }
}

}  // namespace attention
}  // namespace astrai
