// Score mask of the sm_90a bf16 prefill: the keys a row of a score tile may not see (past kv_len, the mask, the
// causal position, invalid pages) set to -inf in a consumer's wgmma accumulator fragment.
#pragma once

#include <cstdint>

#include "kernels/attention/sm90_bf16_prefill_traits.cuh"

namespace astrai {
namespace attention {

// Byte g (a compile-time index after unrolling) of 16 page-flag bytes.
__device__ __forceinline__ uint32_t page_flag(const uint4& f, int g) {
  const uint32_t w = g < 4 ? f.x : g < 8 ? f.y : g < 12 ? f.z : f.w;
  return (w >> (8 * (g % 4))) & 0xffu;
}

// Masked score tiles: a lane holds columns nt * 8 + 2 (lane % 4) + e (e = 0, 1) of its rows, relative to the tile's
// first key n0 (the mma.sync kernel computes the same limits inline, bf16_prefill.cuh). Written without a branch
// per column: with one (short-circuit tests, as there) the masked tiles ran far slower (docs/benchmarks.md).
//
// Row i of the sequence (di = i - row0) keeps columns below the returned limit: kv_len, mask_len, its causal
// position; none past q_len or mask_q_len.
__device__ __forceinline__ int masked_row_limit(const PrefillParams& p, int i, int di, int q_len_b, int kv_len,
                                                int pos0, int n0) {
  const bool has_mask = p.mask_ptr != nullptr;
  int lim = kv_len - n0;
  if (has_mask) lim = min(lim, p.mask_len - n0);
  if (p.is_causal) lim = min(lim, pos0 + di - n0 + 1);
  if (i >= q_len_b || (has_mask && p.mask_q_stride != 0 && i >= p.mask_q_len)) lim = 0;
  return lim;
}
// With a mask: bit 2 nt + e clear where the mask byte of that column (below lim) is zero; kNT <= 16 n-tiles.
template <int kNT>
__device__ __forceinline__ uint32_t mask_row_keep(const PrefillParams& p, int b, int i, int n0, int lim, int lane) {
  static_assert(kNT >= 1 && kNT <= 16, "32 keep bits");
  uint32_t keep = ~0u;
  if (lim > 0) {
    const uint8_t* mrow = p.mask_ptr + (int64_t(b) * p.mask_batch_stride + int64_t(i) * p.mask_q_stride + n0);
    const int c0 = 2 * (lane & 3);
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = min(nt * 8 + c0 + e, lim - 1);  // inside the mask row; columns past lim are dropped anyway
        keep &= ~(uint32_t(mrow[col] == 0) << (2 * nt + e));
      }
  }
  return keep;
}

// One consumer thread's rows of the current item (my_row0 and my_row0 + 8 of the 128 packed rows) for the mask.
// Only the tiles that need it take the mask; one softmax serves every tile (a masked and an unmasked copy of it
// measured slower once the mask lost its branches: docs/benchmarks.md).
template <bool kPaged>
struct PrefillSm90Mask {
  static constexpr int kBN = PrefillSm90Traits::kBN;
  const PrefillParams& p;
  int b, row0, q_len_b, hb_log2;  // the item's Q tile (QTile)
  int kv_len, pos0;               // its keys (TileKeys)
  int my_row0, lane;
  bool has_mask;

  // Drops the keys of tile j that a row may not see (-inf scores). page_bad: byte g nonzero when row group g of
  // the tile lies on an invalid page (paged).
  __device__ __forceinline__ void apply(float (&s)[64], int j, const uint4& page_bad) const {  // s: (64 rows, 128)
    const int n0 = j * kBN;
    uint32_t page_keep = ~0u;  // bits 2 n, 2 n + 1: n-tile n, which is row group n, lies on a valid page
    if constexpr (kPaged) {
      static_assert(PrefillSm90Traits::kGroupRows == 8, "a row group is an n-tile of S");
#pragma unroll
      for (int n = 0; n < 16; ++n) page_keep &= ~(uint32_t(page_flag(page_bad, n) != 0u) * (3u << (2 * n)));
    }
    (void)page_bad;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int di = (my_row0 + 8 * h) >> hb_log2;
      const int i = row0 + di;
      const int row_lim = masked_row_limit(p, i, di, q_len_b, kv_len, pos0, n0);
      // This lane's column 8 n + 2 (lane % 4) + e is kept iff 8 n + e < lim (and its keep bit: a mask, pages).
      const int lim = row_lim - 2 * (lane & 3);
      if (kPaged || has_mask) {
        const uint32_t mask_keep = has_mask ? mask_row_keep<16>(p, b, i, n0, row_lim, lane) : ~0u;
        const uint32_t keep = mask_keep & page_keep;
#pragma unroll
        for (int n = 0; n < 16; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float v = s[4 * n + 2 * h + e];
            s[4 * n + 2 * h + e] = 8 * n + e < lim && ((keep >> (2 * n + e)) & 1u) ? v : prefill_neg_inf();
          }
      } else {
#pragma unroll
        for (int n = 0; n < 16; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float v = s[4 * n + 2 * h + e];
            s[4 * n + 2 * h + e] = 8 * n + e < lim ? v : prefill_neg_inf();
          }
      }
    }
  }
};

}  // namespace attention
}  // namespace astrai
