// The ragged Q tile map, built on the device from qo_indptr before the prefill kernel (no host sync).
#pragma once

#include <cstdint>

#include "kernels/attention/prefill_schedule.h"

namespace astrai {
namespace attention {

// One block builds the whole map: sequences in chunks of kMapThreads, an exclusive scan of their tile counts,
// then every entry of the chunk finds its sequence by binary search (no thread loops over a long sequence).
constexpr int kMapThreads = 512;

// q_tile_to_batch / q_tile_to_index for a ragged Q schedule (see prefill_schedule.h for the order). Every one of
// the num_q_tiles entries is written, so a reused workspace never leaks stale tiles.
__global__ void __launch_bounds__(kMapThreads)
    prefill_tile_map_kernel(const int32_t* __restrict__ qo_indptr, int32_t batch, int32_t total_rows, int rows_log2,
                            int32_t num_q_tiles, int32_t* __restrict__ to_batch, int32_t* __restrict__ to_index) {
  __shared__ int64_t s_first[kMapThreads];   // first map entry of each sequence of the chunk, from the chunk start
  __shared__ int32_t s_tiles[kMapThreads];   // tiles of each sequence of the chunk
  __shared__ int64_t s_warp[kMapThreads / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int64_t carry = 0;  // entries taken by earlier chunks
  for (int32_t c0 = 0; c0 < batch; c0 += kMapThreads) {
    const int32_t b = c0 + tid;
    int32_t n = 0;
    if (b < batch) n = tiles_of(clamp_indptr(qo_indptr[b], qo_indptr[b + 1], total_rows).len, rows_log2);
    int64_t x = n;  // inclusive scan: warps, then the warp totals
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const int64_t y = __shfl_up_sync(0xffffffffu, x, off);
      if (lane >= off) x += y;
    }
    if (lane == 31) s_warp[warp] = x;
    __syncthreads();
    if (warp == 0) {
      int64_t w = lane < kMapThreads / 32 ? s_warp[lane] : 0;
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const int64_t y = __shfl_up_sync(0xffffffffu, w, off);
        if (lane >= off) w += y;
      }
      if (lane < kMapThreads / 32) s_warp[lane] = w;
    }
    __syncthreads();
    s_first[tid] = x - n + (warp > 0 ? s_warp[warp - 1] : 0);
    s_tiles[tid] = n;
    const int64_t chunk_tiles = s_warp[kMapThreads / 32 - 1];
    __syncthreads();
    const int count = min(kMapThreads, batch - c0);
    for (int64_t i = tid; i < chunk_tiles && carry + i < num_q_tiles; i += kMapThreads) {
      const int k = last_le(s_first, count, i);
      const int64_t local = i - s_first[k];  // 0: the sequence's last tile
      to_batch[carry + i] = c0 + k;
      to_index[carry + i] = int32_t((s_tiles[k] - 1 - local) << rows_log2);
    }
    carry += chunk_tiles;
    __syncthreads();  // the next chunk overwrites s_first / s_tiles
  }
  for (int64_t i = carry + tid; i < num_q_tiles; i += kMapThreads) {
    to_batch[i] = -1;
    to_index[i] = 0;
  }
}

}  // namespace attention
}  // namespace astrai
