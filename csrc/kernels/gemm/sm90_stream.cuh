// The Hopper weight stream (recipe 6, issue 20): small M in layout nt, every pair, where the GEMM is a read of the
// weights. Same arithmetic as the portable stream kernel (sm80_stream.cuh: swap AB, b's rows on the mma's 16-row
// side, the tokens on its 8-column side, K permuted inside a lane's 16 bytes the same way for both operands), but
// the bytes come by TMA into a shared-memory ring, so a CTA keeps its weights in flight with one issuing thread
// instead of holding them in registers. Measured on the H200 (benchmarks.md "GEMM, the Hopper weight stream"): a few
// percent ahead of the portable kernels for 16-bit, int8 and fp8 weights with 16-bit / 8-bit tokens at M <= 8; for
// w8a16 ahead of the portable weight stream at M <= 8 on wide or large weights only (the built-in plan's rule,
// ops/gemm.py SM90_STREAM_W8A16_*), and behind the leaner portable loop on all of those cells on an H100.
//
// - A CTA owns kRows (64) weight rows and one K slice. Its producer warp (one thread) loads, a stage at a time, two
//   K tiles: for each, the 128 bytes of K of its 64 rows (one 128-byte-swizzled box) and the same K range of the
//   CTA's token rows (8 or 16 rows, one or two boxes; zeros past M, N and K from the maps, so no edge code),
//   completing on the stage's `full` mbarrier (a slice's last stage may hold one tile). Four consumer warps, 16
//   weight rows each, read their 16-byte pieces out of the stage, hand it back (one `empty` arrival a warp) and run
//   the mma.sync cells on registers. w8a16 has eight: two a block of 16 rows, one for each of a stage's K tiles
//   (its warps also expand the int8 weights, so one warp a row block was too few to keep the bytes moving).
// - split_k > 1: the K slices are the CTAs of one cluster (split_k <= 8, the portable cluster size); rank 0 adds the
//   peers' partial sums, read out of their shared memory (DSMEM), in rank order, then stores. Deterministic, one
//   launch, no workspace.
//
// K order of an output: a lane's pieces in stage order within a slice (w8a16: the first and the second K tile of
// every stage summed apart, then added), then the slices in rank order (((s0 + s1) + s2) ...). It depends on (N, K,
// split) only, not on M or on the other rows (batch invariant for a fixed split), but it is neither the mainloop's
// nor the portable stream's order, so the bits differ from recipes 0-5.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>

#include "kernels/common/ptx/arch.cuh"
#include "kernels/common/ptx/cluster.cuh"
#include "kernels/common/ptx/griddep.cuh"
#include "kernels/common/ptx/mbarrier.cuh"
#include "kernels/common/ptx/smem.cuh"
#include "kernels/common/ptx/sync.cuh"
#include "kernels/common/ptx/tma.cuh"
#include "kernels/gemm/params.h"
#include "kernels/gemm/sm80_gemm.cuh"
#include "kernels/gemm/sm80_stream.cuh"

namespace astrai {
namespace gemm {

// The geometry of one (pair, token tiles) kernel: kTokenTiles n8 tiles of tokens (1: M <= 8, 2: blocks of 16 rows).
template <class Pair, int kTokenTiles>
struct Sm90StreamShape {
  static constexpr int kRowWarps = 4;                 // consumer warps along the rows, 16 weight rows each
  static constexpr int kKValues = 128 / Pair::kBBytes;               // K values a K tile (128 bytes of a weight row)
  static constexpr int kActBoxes = kKValues * Pair::kABytes / 128;   // token boxes a K tile: 2 for w8a16, else 1
  // Consumer warps along K: w8a16 (whose warps also expand the weights) splits a stage's two K tiles between two
  // warps of the same rows, their sums added in order at the end; the other pairs read both with one warp.
  static constexpr int kKWarps = kActBoxes == 2 ? 2 : 1;
  static constexpr int kWarps = kRowWarps * kKWarps;  // consumer warps
  static constexpr int kRows = 16 * kRowWarps;        // weight rows of a CTA: one TMA box
  static constexpr int kThreads = 32 * (kWarps + 1);  // + the producer warp
  static constexpr int kTokens = 8 * kTokenTiles;     // token rows of a CTA: one TMA box a 128 bytes of K
  static constexpr int kWBytes = kRows * 128, kActBoxBytes = kTokens * 128;
  static constexpr int kSubBytes = kWBytes + kActBoxes * kActBoxBytes;  // one 128-byte K tile: a multiple of 1024
  // Two K tiles a stage: 256 bytes of each weight row a stage (one box each), 2-4% faster than one on the H200
  // (benchmarks.md: one tile / 72 KB, two / 72 KB, two / 110 KB, two and four / 200 KB timed in one call).
  static constexpr int kSub = 2;
  static constexpr int kStageBytes = kSub * kSubBytes;
  // A lane's 4 sums a token tile: a row warp's for the cluster's reduction, then the K warps' past the first.
  static constexpr int kClusterPartialBytes = kRowWarps * kTokenTiles * 32 * 16;
  static constexpr int kPartialBytes = kClusterPartialBytes * kKWarps;
  // Up to three CTAs a SM (72 KB each of the 227 KB): 2-3 stages, 32-48 KB of weights in flight a CTA.
  static constexpr int kBudget = 72 * 1024;
  static constexpr int kStages = (kBudget - 1024 - kPartialBytes - 256) / kStageBytes;
  static constexpr int kSmemBytes = 1024 /* alignment slack */ + kStages * kStageBytes + kPartialBytes + 16 * kStages;
  static_assert(kStageBytes % 1024 == 0, "stages start on 1024-byte swizzle atoms");
  static_assert(kStages >= 2, "a ring of at least two stages");
  static_assert(kSub % kKWarps == 0, "every K warp reads the same number of a stage's K tiles");
};

// The mma cell of the swapped pair: the weights (b) are the mma's A operand here, the tokens (a) its B operand, which
// matters only where a and b differ in type (the mixed fp8 pairs).
template <class Pair>
struct Sm90StreamMma {
  using type = Pair;
};
template <>
struct Sm90StreamMma<PairE5m2E4m3> {
  using type = PairE4m3E5m2;
};
template <>
struct Sm90StreamMma<PairE4m3E5m2> {
  using type = PairE5m2E4m3;
};

// One 16-byte piece of two weight rows (w: row g, v: row g + 8) against the matching 16 bytes of token g (x), for
// the pairs whose a and b have one width (16-bit: 8 values, mma k16; 8-bit: 16 values, mma k32). mma r takes words
// 2r and 2r + 1 of the piece as its low and high K slots, in a and in b alike.
template <class Pair>
__device__ __forceinline__ void sm90_stream_step(typename Pair::Acc (&acc)[4], const uint4& w, const uint4& v,
                                                 const uint4& x) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w}, vs[4] = {v.x, v.y, v.z, v.w}, xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t a[4] = {ws[2 * r], vs[2 * r], ws[2 * r + 1], vs[2 * r + 1]};
    Sm90StreamMma<Pair>::type::mma(acc, a, xs[2 * r], xs[2 * r + 1]);
  }
}

__device__ __forceinline__ uint4 lds16(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }

// Grid: x = (weight block x token blocks + token block) x split_k + K slice (a cluster: a block's slices), z = batch.
// A weight block's token blocks are neighbours in x, so they run together and its bytes come from DRAM about once;
// with the token blocks in y (a grid row apart, the order until the forty-first session) a weight of more than L2 was
// read once a token block: w16a16 1.05-1.57x slower at M 17-128 (geomean over seven (N, K), H100; docs/benchmarks.md).
// Maps are 3-D (k, rows, batch) with 128-byte boxes of K; a broadcast operand's map has one batch.
template <class Pair, int kTokenTiles>
__global__ void __launch_bounds__(Sm90StreamShape<Pair, kTokenTiles>::kThreads)
    gemm_sm90_stream_kernel(const __grid_constant__ CUtensorMap map_w, const __grid_constant__ CUtensorMap map_x,
                            const __grid_constant__ GemmParams p) {
#if ASTRAI_WGMMA
  using S = Sm90StreamShape<Pair, kTokenTiles>;
  using Acc = typename Pair::Acc;
  extern __shared__ uint8_t smem_raw[];
  // An offset from smem_raw (not an integer round trip) keeps the shared address space: LDS, not generic loads.
  uint8_t* const smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  uint8_t* const partials = smem + S::kStages * S::kStageBytes;
  uint64_t* const full = reinterpret_cast<uint64_t*>(partials + S::kPartialBytes);
  uint64_t* const empty = full + S::kStages;

  const int split = p.split_k;
  const int rank = split > 1 ? int(cluster_ctarank()) : 0;
  const int token_blocks = (p.m + S::kTokens - 1) / S::kTokens, block = int(blockIdx.x) / split;
  const int n0 = block / token_blocks * S::kRows, m0 = block % token_blocks * S::kTokens, bz = int(blockIdx.z);
  const int k_tiles = int((int64_t(p.k) * Pair::kBBytes + 127) / 128);
  const int kt0 = min(k_tiles, rank * p.k_tiles_per_split), kt1 = min(k_tiles, kt0 + p.k_tiles_per_split);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], S::kWarps);  // one arrival a consumer warp
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  // Programmatic dependent launch: every thread waits for the previous kernel before touching global memory.
  wait_prerequisites();

  Acc acc[kTokenTiles][4];
#pragma unroll
  for (int j = 0; j < kTokenTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = Acc(0);

  if (warp == S::kWarps) {  // the producer
    if (lane == 0) {
      const int bw = p.b_batch_stride == 0 ? 0 : bz, bx = p.a_batch_stride == 0 ? 0 : bz;
      for (int kt = kt0, it = 0; kt < kt1; kt += S::kSub, ++it) {
        const int s = it % S::kStages, tiles = min(S::kSub, kt1 - kt);  // a slice's last stage may hold fewer
        mbarrier_wait_sleep(&empty[s], (uint32_t(it / S::kStages) & 1u) ^ 1u);  // a fresh barrier's previous phase counts
        mbarrier_arrive_expect_tx(&full[s], uint32_t(tiles * S::kSubBytes));
        for (int q = 0; q < tiles; ++q) {
          uint8_t* const sub = smem + s * S::kStageBytes + q * S::kSubBytes;
          tma_load_3d(smem_addr(sub), &map_w, &full[s], (kt + q) * S::kKValues, n0, bw);
#pragma unroll
          for (int box = 0; box < S::kActBoxes; ++box)
            tma_load_3d(smem_addr(sub + S::kWBytes + box * S::kActBoxBytes), &map_x, &full[s],
                        (kt + q) * S::kKValues + box * (128 / Pair::kABytes), m0, bx);
        }
      }
    }
  } else {
    // Lane (g, t) reads 16-byte chunks 2t and 2t + 1 of the stage's 128-byte rows: chunk c of row r sits at c ^ (r %
    // 8) (the map's 128-byte swizzle), so the 8 rows of a quarter-warp's read hit 8 distinct chunks. Warp (rw, kw)
    // reads rows 16 rw.. of the stage's K tiles kw, kw + kKWarps, ...
    // The lane's addresses in stage 0 are computed once; the stage loop is unrolled over the ring, so a stage's and a
    // K tile's offsets are immediates of the loads. (The loop this replaced recomputed every address a stage from
    // it % kStages: 228 SASS instructions a stage for w8a16 with one token tile, now 188; 144 of them are loads,
    // expansion, byte permutes and mma.) Same reads, same mma order: same bits.
    const int rw = warp % S::kRowWarps, kw = S::kKWarps > 1 ? warp / S::kRowWarps : 0;
    const uint8_t* const tile0 = smem + kw * S::kSubBytes;
    const uint8_t* w_at[2];                    // row 16 rw + g, chunk 2t + h; row + 8 is 1024 bytes on
    const uint8_t* x_at[2][S::kActBoxes];      // token row g; token tile j is 1024 bytes on
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = 2 * t + h;
      w_at[h] = tile0 + (16 * rw + g) * 128 + ((c ^ g) << 4);
      if constexpr (S::kActBoxes == 1) {
        x_at[h][0] = tile0 + S::kWBytes + g * 128 + ((c ^ g) << 4);
      } else {  // w8a16: the chunk's 16 K values are 32 bytes of token row: chunks 2 (c % 4), + 1 of box c / 4
        const uint8_t* const box = tile0 + S::kWBytes + (c / 4) * S::kActBoxBytes + g * 128;
        x_at[h][0] = box + (((2 * (c % 4)) ^ g) << 4);
        x_at[h][1] = box + (((2 * (c % 4) + 1) ^ g) << 4);
      }
    }
    uint32_t phase = 0;  // of the ring pass
    for (int kt = kt0; kt < kt1; phase ^= 1u) {
#pragma unroll
      for (int s = 0; s < S::kStages; ++s, kt += S::kSub) {
        if (kt >= kt1) break;
        const int tiles = min(S::kSub, kt1 - kt);  // a slice's last stage may hold fewer
        mbarrier_wait_sleep(&full[s], phase);
        if constexpr (S::kKWarps > 1) {
          if (kw >= tiles) {  // a slice's last stage holds no tile of this warp
            __syncwarp();
            if (lane == 0) mbarrier_arrive(&empty[s]);
            continue;
          }
        }
#pragma unroll
        for (int q = kw, qi = 0; qi < S::kSub / S::kKWarps; q += S::kKWarps, ++qi) {
          if (q >= tiles) break;
          const int at = s * S::kStageBytes + qi * S::kKWarps * S::kSubBytes;  // from the lane's stage-0 addresses
          uint4 w[2], v[2], x[kTokenTiles][2][S::kActBoxes];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            w[h] = lds16(w_at[h] + at);
            v[h] = lds16(w_at[h] + at + 8 * 128);
#pragma unroll
            for (int j = 0; j < kTokenTiles; ++j)
#pragma unroll
              for (int box = 0; box < S::kActBoxes; ++box) x[j][h][box] = lds16(x_at[h][box] + at + j * 8 * 128);
          }
          if (q + S::kKWarps >= tiles) {
            __syncwarp();
            if (lane == 0) mbarrier_arrive(&empty[s]);  // the warp's reads of the stage are done
          }
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < kTokenTiles; ++j) {
              if constexpr (S::kActBoxes == 1) {
                sm90_stream_step<Pair>(acc[j], w[h], v[h], x[j][h][0]);
              } else {
                stream_step<Pair>(acc[j], w[h], v[h], x[j][h][0], x[j][h][1]);
              }
            }
        }
      }
    }
  }

  // Past the stream: the next kernel may be scheduled (it waits for this grid before touching what this one writes).
  launch_dependents();

  if constexpr (S::kKWarps > 1) {  // the K warps of a row warp: the first adds the others' sums in order
    if (warp < S::kWarps) {
      const int rw = warp % S::kRowWarps, kw = warp / S::kRowWarps;
      Acc* const part = reinterpret_cast<Acc*>(partials + S::kClusterPartialBytes) + (rw * kTokenTiles * 32 + lane) * 4;
      constexpr int kStride = S::kClusterPartialBytes / int(sizeof(Acc));  // between K warps' blocks
      if (kw > 0) {
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) part[(kw - 1) * kStride + j * 32 * 4 + e] = acc[j][e];
      }
      named_barrier_sync(1, 32 * S::kWarps);
      if (kw == 0) {
        for (int w = 1; w < S::kKWarps; ++w)
#pragma unroll
          for (int j = 0; j < kTokenTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[j][e] += part[(w - 1) * kStride + j * 32 * 4 + e];
      }
    }
  }

  if (split > 1) {  // the cluster's K slices: rank 0 adds the peers' sums in rank order
    uint8_t* const mine = partials + (warp * kTokenTiles * 32 + lane) * 16;
    if (warp < S::kRowWarps) {
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) {
        Acc* const dst = reinterpret_cast<Acc*>(mine + j * 32 * 16);
#pragma unroll
        for (int e = 0; e < 4; ++e) dst[e] = acc[j][e];
      }
    }
    cluster_sync();  // every slice's sums are in its CTA's shared memory
    if (rank == 0 && warp < S::kRowWarps) {
      for (int r = 1; r < split; ++r) {
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j) {
          const uint4 q = ld_shared_cluster16(cluster_map_shared(smem_addr(mine + j * 32 * 16), uint32_t(r)));
          const uint32_t qs[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if constexpr (std::is_same<Acc, float>::value) {
              acc[j][e] += __uint_as_float(qs[e]);
            } else {
              acc[j][e] += int32_t(qs[e]);
            }
          }
        }
      }
    }
    cluster_arrive();  // rank 0 has read the peers: they may exit once this barrier completes
    if (rank != 0) {
      cluster_wait();
      return;
    }
  }

  if (warp < S::kRowWarps) {
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = m0 + 8 * j + 2 * t + (e & 1), col = n0 + 16 * warp + g + 8 * (e >> 1);
        if (row < p.m && col < p.n) store_out<Acc>(p, bz, row, col, acc[j][e], Acc(0), false);
      }
  }
  if (split > 1) cluster_wait();
#endif
}

}  // namespace gemm
}  // namespace astrai
