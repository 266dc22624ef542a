// The 128-byte XOR swizzle of shared-memory tiles of 16-byte chunks, and the ldmatrix lane offsets on it.
#pragma once

#include <cstdint>

namespace astrai {

// Shared-memory tiles of rows of kChunks 16-byte chunks (kChunks >= 8): chunk c of row r is stored at chunk
// c ^ (r % 8). The 8 rows an ldmatrix (or a 16-byte cp.async wave) touches at one logical chunk then fall in
// 8 distinct 16-byte bank groups: no bank conflicts for reads down a column or writes along a row.
template <int kChunks>
__host__ __device__ __forceinline__ constexpr int swizzle(int row, int chunk) {
  static_assert(kChunks >= 8 && (kChunks & (kChunks - 1)) == 0, "rows of 8, 16 or 32 chunks");
  return row * kChunks + (chunk ^ (row & 7));
}

// ldmatrix_x4 row addresses on swizzled tiles of kChunks chunks per row. Every row a lane addresses is congruent
// to the lane mod 8, so logical chunk 2 s + half sits at chunk (2 s) ^ (half ^ (lane & 7)): one byte offset per
// lane and operand, combined with compile-time constants by ldsm_step, gives every address (no XOR per load
// beyond one with a constant). Offsets are from the tile start.
//   A   (row-major, rows row0 + 0..15, k chunks 2 s, 2 s + 1): matrices {rows 0-7, 8-15} x {k lo, k hi}
//   B   from [n][k] rows (K for S = Q K^T): matrices {n 0-7: k lo, k hi; n 8-15: k lo, k hi} = b0, b1 of 2 n-tiles
//   B^T from [k][n] rows (V for O = P V, with .trans): {k lo rows, k hi rows} x {n 0-7, n 8-15}
template <int kChunks>
__host__ __device__ __forceinline__ constexpr uint32_t ldsm_a_offset(int lane, int row0) {
  return uint32_t((row0 + (lane & 15)) * kChunks * 16 + (((lane >> 4) ^ (lane & 7)) << 4));
}
template <int kChunks>
__host__ __device__ __forceinline__ constexpr uint32_t ldsm_b_offset(int lane) {
  return uint32_t(((lane & 7) + ((lane >> 4) << 3)) * kChunks * 16 + ((((lane >> 3) & 1) ^ (lane & 7)) << 4));
}
template <int kChunks>
__host__ __device__ __forceinline__ constexpr uint32_t ldsm_bt_offset(int lane) {
  return uint32_t(((lane & 7) + (((lane >> 3) & 1) << 3)) * kChunks * 16 + (((lane >> 4) ^ (lane & 7)) << 4));
}
// Address offset of chunk pair `step` (chunks 2 step, 2 step + 1) in 16-row block `blk`: the XOR touches bits 5..6
// only (row offsets are multiples of 128 bytes, kChunks >= 8).
template <int kChunks>
__host__ __device__ __forceinline__ constexpr uint32_t ldsm_step(uint32_t lane_offset, int step, int blk) {
  return (lane_offset ^ uint32_t((step % 4) << 5)) + uint32_t((step / 4) * 128 + blk * 16 * kChunks * 16);
}

}  // namespace astrai
