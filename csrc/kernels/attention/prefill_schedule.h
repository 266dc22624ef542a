// Prefill tile schedule: block shapes per head_dim, GQA head packing and the ragged tile map, shared by the
// launcher, the kernels and the host tests (plain C++; __host__ __device__ under nvcc).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ASTRAI_HD __host__ __device__ __forceinline__
#else
#define ASTRAI_HD inline
#endif

namespace astrai {
namespace attention {

// Warps per prefill block; a block packs at most this many q heads of one kv head (HB <= warps, so that a warp
// never needs rows of more heads than the block holds K/V for).
constexpr int kPrefillWarps = 4;
constexpr int kPrefillThreads = kPrefillWarps * 32;
constexpr int kPrefillMaxHeadsLog2 = 2;  // HB <= 4

// Packed rows per block (BM): 128 (4 warps x 32 rows) for head_dim 64 and 128; 64 (4 warps x 16 rows) for 256,
// whose 16 x 256 output accumulator already takes 128 registers per thread.
ASTRAI_HD constexpr int prefill_block_rows(int head_dim) { return head_dim == 256 ? 64 : 128; }

// log2 of HB, the q heads of one kv head a block packs: the largest power of two that divides the group size
// G = Hq / Hkv, at most kPrefillWarps. A divisor, so no block carries idle heads (G = 6 packs 2 heads x 3 blocks).
ASTRAI_HD constexpr int prefill_heads_log2(int group_size) {
  int l = 0;
  while (l < kPrefillMaxHeadsLog2 && group_size > 0 && (group_size >> (l + 1)) << (l + 1) == group_size) ++l;
  return l;
}

ASTRAI_HD constexpr int ilog2_exact(int v) {  // v a power of two
  int l = 0;
  while ((1 << l) < v) ++l;
  return l;
}

// Sequence rows per Q tile, log2: a tile holds BM packed rows = (BM / HB) sequence rows x HB heads, the heads of
// one row adjacent (packed row m is sequence row m >> hb_log2, head m & (HB - 1)).
ASTRAI_HD int prefill_tile_rows_log2(int head_dim, int group_size) {
  return ilog2_exact(prefill_block_rows(head_dim)) - prefill_heads_log2(group_size);
}

// Rows [lo, lo + len) of sequence b in a packed (ragged) tensor of `total` rows, from indptr[b] and indptr[b + 1]
// read as they come: both clamped to [0, total], and a decreasing pair is an empty sequence. Whatever the
// values, the rows stay inside [0, total).
struct RowRange {
  int32_t lo;
  int32_t len;
};
ASTRAI_HD RowRange clamp_indptr(int32_t begin, int32_t end, int32_t total) {
  const int32_t lo = begin < 0 ? 0 : (begin > total ? total : begin);
  const int32_t hi = end < 0 ? 0 : (end > total ? total : end);
  return RowRange{lo, hi > lo ? hi - lo : 0};
}

// Q tiles of a sequence of `len` rows.
ASTRAI_HD int32_t tiles_of(int32_t len, int rows_log2) {
  return int32_t((int64_t(len) + (int64_t(1) << rows_log2) - 1) >> rows_log2);
}

// Ragged Q tile map, in order: the tiles of sequence 0, then 1, ...; inside a sequence the last (heaviest under
// causal) tile first. Entry i is (sequence, first row of the tile within it); entries at or past the sum of the
// tiles are idle (-1, 0), and a sum past num_q_tiles (only for inconsistent indptr) drops the excess tiles.
// `first` holds each sequence's first entry (an exclusive prefix sum of its tiles), non-decreasing: entry i
// belongs to the last sequence k with first[k] <= i (sequences without tiles share their successor's `first`).
ASTRAI_HD int last_le(const int64_t* first, int count, int64_t i) {
  int lo = 0, hi = count;  // invariant: first[lo] <= i (first[0] == 0 <= i), answer in [lo, hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (first[mid] <= i) lo = mid; else hi = mid;
  }
  return lo;
}

// Maximum Q tiles of a ragged batch of B sequences and Tq rows: sum ceil(len_b / R) <= floor(Tq / R) + B.
ASTRAI_HD int64_t ragged_tile_bound(int32_t batch, int32_t total_rows, int rows_log2) {
  return (int64_t(total_rows) >> rows_log2) + batch;
}

}  // namespace attention
}  // namespace astrai
