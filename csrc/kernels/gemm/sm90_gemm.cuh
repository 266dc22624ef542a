// The Hopper mainloop (issue 20): a persistent, warp-specialized wgmma + TMA GEMM for layout nt (a [m][k], b [n][k],
// both K-major), every operand pair whose wgmma reads both operands from shared memory: bf16, fp16, fp8 (e4m3 / e5m2)
// and s8. One CTA per SM walks the work units (batch, output tile, K slice) in a grouped raster.
//
// - Warpgroup 0 is the producer: one thread streams K tiles (128 bytes of K: 64 16-bit or 128 8-bit values) of a
//   (128 rows) and b (kBN rows) by TMA into a ring of kStages stages (128-byte swizzle, zeros past M, N and K from
//   the tensor maps), each stage's bytes completing on its `full` mbarrier. It runs ahead across units: the next
//   tile's first stages load while the consumers run the epilogue.
// - Warpgroups 1 and 2 are the consumers: each owns 64 rows of the 128-row tile, waits a stage full, runs four wgmma
//   m64n<kBN> over it (32 bytes of K each) and hands the stage back on its `empty` mbarrier (one arrival a
//   warpgroup) once the wgmma that read it have completed, one stage kept in flight (fp8: runs of stages, see
//   sm90_promote_run).
// - Epilogue from the accumulators: store_out's arithmetic (scales, bias, out dtype) with the output type chosen once
//   a tile, or fp32 / s32 partials to the workspace for split_k > 1 (gemm_reduce_kernel sums them in split order).
//   Where TMA can describe the output (map_out, kTmaOut), one thread of each consumer warpgroup stores the staged
//   chunks by TMA and the warpgroup goes on to its next unit while the stores drain.
//
// K order: K tiles in order, 32 bytes of K a wgmma in order; a row's sum does not depend on M or on the other rows,
// but it is not the mma.sync mainloop's order, so the bits differ from recipes 0-3.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>

#include "kernels/common/ptx/arch.cuh"
#include "kernels/common/ptx/async_copy.cuh"
#include "kernels/common/ptx/griddep.cuh"
#include "kernels/common/ptx/mbarrier.cuh"
#include "kernels/common/ptx/smem.cuh"
#include "kernels/common/ptx/sync.cuh"
#include "kernels/common/ptx/tma.cuh"
#include "kernels/common/ptx/wgmma_gemm_sm90.cuh"
#include "kernels/common/ptx/wgmma_sm90.cuh"
#include "kernels/gemm/params.h"
#include "kernels/gemm/sm80_gemm.cuh"

namespace astrai {
namespace gemm {

// The operand pair's wgmma cell, accumulator type and TMA element type (8-bit operands travel as bytes).
template <GemmPair kPair>
struct Sm90Pair;

#define ASTRAI_SM90_PAIR(PAIR, ACC, BYTES, MAPTYPE, CELL, PROMOTE)                                            \
  template <>                                                                                                 \
  struct Sm90Pair<GemmPair::PAIR> {                                                                           \
    using Acc = ACC;                                                                                          \
    static constexpr int kEltBytes = BYTES;                                                                   \
    static constexpr bool kPromote = PROMOTE;                                                                 \
    static constexpr CUtensorMapDataType kMapType = MAPTYPE;                                                  \
    template <int kBN>                                                                                        \
    __device__ __forceinline__ static void mma(Acc (&d)[kBN / 2], uint64_t da, uint64_t db, bool accumulate) { \
      if constexpr (kBN == 128) {                                                                             \
        wgmma_m64n128_##CELL##_ss(d, da, db, accumulate);                                                     \
      } else if constexpr (kBN == 192) {                                                                      \
        wgmma_m64n192_##CELL##_ss(d, da, db, accumulate);                                                     \
      } else {                                                                                                \
        wgmma_m64n256_##CELL##_ss(d, da, db, accumulate);                                                     \
      }                                                                                                       \
    }                                                                                                         \
  };
// kPromote (fp8): Hopper's fp8 wgmma keeps only ~14 bits of the sum it accumulates into d (measured here: K = 16
// already drifted 1e-4 relative; DeepSeek-V3's report says the same of H800), so each stage's 128 products of K
// accumulate into fresh registers (scale-d 0) that are then added to the fp32 accumulators (DeepGEMM's promotion).
ASTRAI_SM90_PAIR(kBf16Bf16, float, 2, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, bf16, false)
ASTRAI_SM90_PAIR(kF16F16, float, 2, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, f16, false)
ASTRAI_SM90_PAIR(kE4m3E4m3, float, 1, CU_TENSOR_MAP_DATA_TYPE_UINT8, e4m3e4m3, true)
ASTRAI_SM90_PAIR(kE5m2E4m3, float, 1, CU_TENSOR_MAP_DATA_TYPE_UINT8, e5m2e4m3, true)
ASTRAI_SM90_PAIR(kE4m3E5m2, float, 1, CU_TENSOR_MAP_DATA_TYPE_UINT8, e4m3e5m2, true)
ASTRAI_SM90_PAIR(kS8S8, int32_t, 1, CU_TENSOR_MAP_DATA_TYPE_UINT8, s8, false)
#undef ASTRAI_SM90_PAIR

// A tile recipe: 128 x kBN output tile (kBN 128, 192 or 256), kStages stages of 128 bytes of K.
template <int kBN_>
struct Sm90Recipe {
  static constexpr int kBM = 128, kBN = kBN_;
  static constexpr int kBKBytes = 128;  // one 128-byte swizzle row of K
  static constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
  static constexpr int kTileBytesA = kBM * kBKBytes, kTileBytesB = kBN * kBKBytes;
  static constexpr int kStageBytes = kTileBytesA + kTileBytesB;
  // Each consumer warpgroup stages its output through 16 KB of shared memory (64 rows x 256 bytes) for coalesced
  // stores; the ring takes what is left of the 227 KB: 6 stages (kBN 128) or 4 (kBN 192, 256).
  static constexpr int kEpilogueBytes = 2 * 64 * 256;
  static constexpr int kStages = (227 * 1024 - kEpilogueBytes - 2048) / kStageBytes;
  // kBN 128 and 192: each consumer's per-row and per-column scales of a tile are copied into shared memory (cp.async)
  // while its mainloop runs, so the epilogue reads them there instead of waiting on global loads; kBN 256's ring
  // leaves no room for them (its epilogue loads them from global memory).
  static constexpr bool kSmemFactors = kBN != 256;
  static constexpr int kFactorFloats = kSmemFactors ? 64 + kBN : 0;  // a consumer's: 64 row scales, kBN column scales
  static constexpr int kSmemBytes = kStages * kStageBytes + kEpilogueBytes + 1024 /* alignment slack */ +
                                    2 * kStages * 8 + 2 * kFactorFloats * 4;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
  static constexpr int kGroupM = 16;  // raster: 16 tiles of M walk N together (L2 reuse of a and b)
};
using Sm90RecipeN128 = Sm90Recipe<128>;
using Sm90RecipeN192 = Sm90Recipe<192>;  // recipe 10: fp8's wide tile, a third tile for the other pairs
using Sm90RecipeN256 = Sm90Recipe<256>;
static_assert(Sm90RecipeN128::kSmemBytes <= 227 * 1024 && Sm90RecipeN192::kSmemBytes <= 227 * 1024 &&
                  Sm90RecipeN256::kSmemBytes <= 227 * 1024,
              "a recipe's shared memory must fit the sm_90 opt-in limit");

// Tile t (batches outermost, then the grouped raster) -> (batch, tile row, tile column).
struct Sm90Tile {
  int bz, m_tile, n_tile;
};
template <class R>
__device__ __forceinline__ Sm90Tile sm90_tile(int t, int tiles_m, int tiles_n) {
  const int per_batch = tiles_m * tiles_n;
  Sm90Tile w;
  w.bz = t / per_batch;
  t %= per_batch;
  const int group = t / (R::kGroupM * tiles_n), first_m = group * R::kGroupM;
  const int rows = min(R::kGroupM, tiles_m - first_m);
  const int local = t - group * R::kGroupM * tiles_n;
  w.m_tile = first_m + local % rows;
  w.n_tile = local / rows;
  return w;
}

// Unit u -> its tile, K slice and K tiles [kt0, kt1). split_k > 0: slices outermost (units = tiles * split_k).
// tail_split > 1 (split_k 0): units below tail_from are whole tiles, then each tile from tail_from on as tail_split
// consecutive slices. `partial`: the sums go to the workspace; `tail`: at ws_tile, the tile's [kBM][kBN] block of
// the tail's workspace.
struct Sm90Unit {
  int bz, m_tile, n_tile, split, kt0, kt1;
  bool partial, tail;
  int64_t ws_tile;
};
template <class R>
__device__ __forceinline__ Sm90Unit sm90_unit(const GemmParams& p, int u, int tiles_m, int tiles_n, int k_tiles) {
  const int tiles = tiles_m * tiles_n * p.batch;
  int t;
  Sm90Unit w;
  w.tail = p.tail_split > 1 && u >= p.tail_from;
  w.ws_tile = 0;
  if (p.tail_split > 1) {
    if (!w.tail) {
      t = u;
      w.split = 0;
    } else {
      const int v = u - p.tail_from;
      t = p.tail_from + v / p.tail_split;
      w.split = v % p.tail_split;
      w.ws_tile = (int64_t(v) * R::kBM) * R::kBN;  // block (t - tail_from) * tail_split + split
    }
    w.partial = w.tail;
  } else {
    w.split = u / tiles;
    t = u % tiles;
    w.partial = p.split_k > 1;
  }
  const Sm90Tile tile = sm90_tile<R>(t, tiles_m, tiles_n);
  w.bz = tile.bz;
  w.m_tile = tile.m_tile;
  w.n_tile = tile.n_tile;
  const bool whole = p.tail_split > 1 && !w.tail;
  w.kt0 = whole ? 0 : w.split * p.k_tiles_per_split;
  w.kt1 = whole ? k_tiles : min(w.kt0 + p.k_tiles_per_split, k_tiles);
  return w;
}

// Byte offset of 16-byte unit u (0-15) of row r (0-63) in a staged chunk, XOR-swizzled by row % 8 so the 8 rows of a
// fragment hit distinct banks. kHalves (the TMA store): two halves of 64 rows x 128 bytes (units 0-7 and 8-15), the
// swizzle within a half: TMA's 128-byte swizzle of a [64][128-byte] box. Else rows of 256 bytes (fewer registers
// for the threads' copy-out: recipe 5 spilled 48 bytes with the halves).
template <bool kHalves>
__device__ __forceinline__ int sm90_staged_unit(int r, int u) {
  if constexpr (kHalves) {
    return (u / 8) * 64 * 128 + r * 128 + (((u % 8) ^ (r & 7)) * 16);
  } else {
    return r * 256 + ((u ^ (r & 7)) * 16);
  }
}

// Stores a consumer warpgroup's 64 rows of a finished tile through `buf` (16 KB of shared memory, this warpgroup's)
// in chunks of 64 rows x 256 bytes (sm90_staged_unit's layout): the threads write their fragments (converted) into
// the chunk, then either (kTma) one thread stores its two halves by TMA (clipped at M and N) and the warpgroup moves
// on, the store reading buf in the background until the next chunk's first barrier, or the threads copy it out a
// 16-byte unit a thread, rows of 256 contiguous bytes (scalar stores where a unit runs past N or is not 16-byte
// aligned in memory).
//
// kPartial: raw accumulators into the split's workspace slice (Out = Acc); Out = int32_t: the raw s32 output.
// Otherwise acc * the a_scale of the row * the b_scale of the column + bias in fp32, then Out (store_out's
// arithmetic, with the output type decided once a tile). acc[4 j + e] is row 16 warp + g + 8 (e / 2) of the 64,
// column 8 j + 2 t + e % 2 of the tile.
// kUniform: no per-row or per-column scale and no bias, so the scales are two numbers read once a tile (the same
// arithmetic: acc * a_scale * b_scale + 0). A tile wholly inside the output whose rows are 16-byte aligned is
// copied out with no per-unit checks. Both keep branches out of the per-element code (ncu: the epilogue's
// divergence barriers were its largest stall).
// factors (R::kSmemFactors, !kUniform): this consumer's 64 row scales then kBN column scales, copied in by
// sm90_load_factors during the mainloop (the caller waited for the copies and synchronized the warpgroup).
template <class Out, bool kPartial, class R, bool kUniform, bool kTma, class Acc>
__device__ __forceinline__ void sm90_store_tile(const GemmParams& p, const Sm90Unit& w, int cw,
                                                const Acc (&acc)[R::kBN / 2], uint8_t* buf, const CUtensorMap* map_out,
                                                const float* factors = nullptr) {
  constexpr bool kRaw = kPartial || std::is_same<Out, int32_t>::value;
  // kBN 192 with a 16-bit output: the last chunk holds one half (64 columns) of the two.
  constexpr int kE = int(sizeof(Out)), kChunkCols = 256 / kE, kPerUnit = 16 / kE;
  constexpr int kChunks = (R::kBN + kChunkCols - 1) / kChunkCols;
  constexpr bool kPartialChunk = R::kBN % kChunkCols != 0;  // the guards below exist only then (recipes 4 / 5's code)
  const int tid = threadIdx.x % 128, warp = tid / 32, g = (tid % 32) / 4, t = tid % 4;
  const int row0 = w.m_tile * R::kBM + cw * 64, col0 = w.n_tile * R::kBN;
  // Where the copy-out goes: (dst_row0, dst_col0) of `out + batch_base` with `row_stride`, rows and columns below
  // (rows_end, cols_end). A tail slice's block is the whole tile: local coordinates, nothing out of bounds.
  Out* out;
  int64_t batch_base, row_stride;
  int dst_row0 = row0, dst_col0 = col0, rows_end = p.m, cols_end = p.n;
  if constexpr (kPartial) {
    out = static_cast<Out*>(p.workspace);
    if (w.tail) {
      batch_base = w.ws_tile;
      row_stride = R::kBN;
      dst_row0 = cw * 64;
      dst_col0 = 0;
      rows_end = R::kBM;
      cols_end = R::kBN;
    } else {
      batch_base = (int64_t(w.bz) * p.split_k + w.split) * p.m * p.n;
      row_stride = p.n;
    }
  } else {
    out = static_cast<Out*>(p.out);
    batch_base = w.bz * p.out_batch_stride;
    row_stride = p.out_row_stride;
  }
  float sa[2] = {1.f, 1.f}, sb_all = 1.f;
  if constexpr (!kRaw && kUniform) {
    sa[0] = sa[1] = p.a_scale ? p.a_scale[0] : 1.f;
    sb_all = p.b_scale ? p.b_scale[0] : 1.f;
  } else if constexpr (!kRaw && R::kSmemFactors) {
#pragma unroll
    for (int h = 0; h < 2; ++h) sa[h] = factors[16 * warp + g + 8 * h];
  } else if constexpr (!kRaw) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 16 * warp + g + 8 * h;
      sa[h] = p.a_scale && row < p.m ? p.a_scale[p.a_scale_per_row ? row : 0] : 1.f;
    }
  }
  const bool whole = dst_row0 + 64 <= rows_end && dst_col0 + R::kBN <= cols_end && (row_stride * kE) % 16 == 0 &&
                     (reinterpret_cast<uintptr_t>(out + batch_base) & 15) == 0;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if constexpr (kTma) {
      if (tid == 0) tma_store_wait<0>();  // the previous chunk's (or tile's) store has read buf
    }
    named_barrier_sync(1 + cw, 128);  // the previous chunk (or tile) has been copied out of buf
    // Per-column factors (scale, bias) of kGroupJ column pairs (8 jj + 2 t + e) at a time, loaded before they are
    // used: independent global loads kept in flight together. Read inside the conversion, one column at a time
    // behind bounds and type branches, their latencies added up (fp8 rowwise ran 20% slower than tensorwise).
    // Groups of 8 pairs keep recipe 5's 128 accumulators from spilling. A column past N reads column N - 1's
    // values and is never stored. Coherent loads (__ldcg): a non-coherent one may be scheduled above
    // griddepcontrol.wait.
    constexpr int kGroupJ = kChunkCols / 8 < 8 ? kChunkCols / 8 : 8;
    static_assert(R::kBN % (8 * kGroupJ) == 0, "a tile's columns end on a whole group");
#pragma unroll
    for (int j0 = 0; j0 < kChunkCols / 8; j0 += kGroupJ) {
      if (kPartialChunk && c * kChunkCols + 8 * j0 >= R::kBN) break;  // past a partial last chunk
      float csb[kGroupJ][2], cbias[kGroupJ][2];
      if constexpr (!kRaw && !kUniform) {
        auto column = [&](int jj, int e) { return min(col0 + c * kChunkCols + 8 * (j0 + jj) + 2 * t + e, p.n - 1); };
        const int step = p.b_scale_per_col ? 1 : 0;
#pragma unroll
        for (int jj = 0; jj < kGroupJ; ++jj) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if constexpr (R::kSmemFactors)
              csb[jj][e] = factors[64 + c * kChunkCols + 8 * (j0 + jj) + 2 * t + e];
            else
              csb[jj][e] = p.b_scale ? __ldcg(p.b_scale + column(jj, e) * step) : 1.f;
            cbias[jj][e] = 0.f;
          }
        }
        // One branch a group on the bias type (the same for the whole grid), not one a column.
        const float* const bias_f32 = static_cast<const float*>(p.bias);
        const __nv_bfloat16* const bias_bf16 = static_cast<const __nv_bfloat16*>(p.bias);
        const __half* const bias_f16 = static_cast<const __half*>(p.bias);
        if (p.bias_dtype == GemmBias::kF32) {
#pragma unroll
          for (int jj = 0; jj < kGroupJ; ++jj)
#pragma unroll
            for (int e = 0; e < 2; ++e) cbias[jj][e] = __ldcg(bias_f32 + column(jj, e));
        } else if (p.bias_dtype == GemmBias::kBf16) {
#pragma unroll
          for (int jj = 0; jj < kGroupJ; ++jj)
#pragma unroll
            for (int e = 0; e < 2; ++e) cbias[jj][e] = __bfloat162float(__ldcg(bias_bf16 + column(jj, e)));
        } else if (p.bias_dtype == GemmBias::kF16) {
#pragma unroll
          for (int jj = 0; jj < kGroupJ; ++jj)
#pragma unroll
            for (int e = 0; e < 2; ++e) cbias[jj][e] = __half2float(__ldcg(bias_f16 + column(jj, e)));
        }
      }
#pragma unroll
      for (int jq = 0; jq < kGroupJ; ++jq) {
        const int jj = j0 + jq, j = c * (kChunkCols / 8) + jj;
        float sb0 = sb_all, sb1 = sb_all, b0 = 0.f, b1 = 0.f;
        if constexpr (!kRaw && !kUniform) {
          sb0 = csb[jq][0];
          sb1 = csb[jq][1];
          b0 = cbias[jq][0];
          b1 = cbias[jq][1];
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = 16 * warp + g + 8 * h;
          const int byte = (8 * jj + 2 * t) * kE, unit = byte / 16;
          Out* dst = reinterpret_cast<Out*>(buf + sm90_staged_unit<kTma>(r, unit) + byte % 16);
          const Acc v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
          if constexpr (kRaw) {
            dst[0] = Out(v0);
            dst[1] = Out(v1);
          } else if constexpr (std::is_same<Out, float>::value) {
            dst[0] = float(v0) * sa[h] * sb0 + b0;
            dst[1] = float(v1) * sa[h] * sb1 + b1;
          } else if constexpr (std::is_same<Out, __half>::value) {
            *reinterpret_cast<__half2*>(dst) =
                __floats2half2_rn(float(v0) * sa[h] * sb0 + b0, float(v1) * sa[h] * sb1 + b1);
          } else {
            *reinterpret_cast<__nv_bfloat162*>(dst) =
                __floats2bfloat162_rn(float(v0) * sa[h] * sb0 + b0, float(v1) * sa[h] * sb1 + b1);
          }
        }
      }
    }
    if constexpr (kTma) {
      fence_proxy_async_smem();         // this thread's writes to buf, visible to the TMA store
      named_barrier_sync(1 + cw, 128);  // the chunk is complete in buf
      if (tid == 0) {
        constexpr int kHalfCols = 128 / kE;
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if (!kPartialChunk || c * kChunkCols + h * kHalfCols < R::kBN)
            tma_store_3d(map_out, smem_addr(buf + h * 64 * 128), col0 + c * kChunkCols + h * kHalfCols, row0, w.bz);
        tma_store_commit();
      }
      continue;
    }
    named_barrier_sync(1 + cw, 128);  // the chunk is complete in buf
#pragma unroll
    for (int i = 0; i < 64 * 16 / 128; ++i) {
      const int q = tid + 128 * i, r = q / 16, u = q % 16;
      if (kPartialChunk && c * kChunkCols + u * kPerUnit >= R::kBN) continue;  // a partial last chunk's empty half
      const int row = dst_row0 + r, col = dst_col0 + c * kChunkCols + u * kPerUnit;
      if (!whole && (row >= rows_end || col >= cols_end)) continue;
      const uint4 v = *reinterpret_cast<const uint4*>(buf + sm90_staged_unit<kTma>(r, u));
      Out* dst = out + batch_base + int64_t(row) * row_stride + col;
      if (whole || (col + kPerUnit <= cols_end && (reinterpret_cast<uintptr_t>(dst) & 15) == 0)) {
        *reinterpret_cast<uint4*>(dst) = v;
      } else {
        const Out* src = reinterpret_cast<const Out*>(&v);
#pragma unroll
        for (int e = 0; e < kPerUnit; ++e)
          if (col + e < cols_end) dst[e] = src[e];
      }
    }
  }
}

// Issues one stage's wgmma (four of 32 bytes of K) of this consumer's 64 rows into d; scale-d 0 on the first where
// !accumulate. The caller commits the group.
template <class P, class R>
__device__ __forceinline__ void sm90_stage_mma(typename P::Acc (&d)[R::kBN / 2], uint32_t stage, int cw,
                                               bool accumulate) {
  constexpr uint32_t kSbo = 1024;  // K-major, 128-byte swizzle: 8-row atoms 1024 bytes apart
  const uint64_t desc_a = wgmma_desc_sw128(stage + cw * 64 * 128, 16, kSbo);
  const uint64_t desc_b = wgmma_desc_sw128(stage + R::kTileBytesA, 16, kSbo);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < R::kBKBytes / 32; ++ks)
    P::template mma<R::kBN>(d, wgmma_desc_sw128_add(desc_a, ks * 32), wgmma_desc_sw128_add(desc_b, ks * 32),
                            accumulate || ks > 0);
}

// Adds a finished stage's promoted sum (fp8) into the fp32 accumulators.
template <class Acc, int kN>
__device__ __forceinline__ void sm90_promote(Acc (&acc)[kN], Acc (&part)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    wgmma_fence_operand(part[i]);
    acc[i] += part[i];
    wgmma_fence_operand(acc[i]);  // the additions stay before the next wgmma into part (else ptxas spills)
  }
}

// fp8: stages a run of the promotion issues before draining the wgmma (sm90_promote_run).
constexpr int kPromoteRun = 4;

// kRun stages from ring position it0, each stage's 128 of K summed alone (wgmma into part0 / part1 in turn, scale-d
// 0) and added to acc in stage order: stage s's wgmma are issued before stage s - 1's sum is added, so the tensor
// cores keep working through the additions; one drain at the end of the run. stage_at(it) waits position it full
// and gives its address; release(it) hands it back.
template <int kS, int kRun, class P, class R, class Acc, class StageAt, class Release>
__device__ __forceinline__ void sm90_promote_run(Acc (&acc)[R::kBN / 2], Acc (&cur)[R::kBN / 2],
                                                 Acc (&prev)[R::kBN / 2], int it0, int cw, StageAt& stage_at,
                                                 Release& release) {
  // Stage kS of the run into cur; prev holds stage kS - 1's sum (kS > 0). The sets swap roles each stage.
  sm90_stage_mma<P, R>(cur, stage_at(it0 + kS), cw, false);
  wgmma_commit();
  if constexpr (kS > 0) {
    wgmma_wait<1>();  // stage kS - 1's wgmma are done
    sm90_promote(acc, prev);
    release(it0 + kS - 1);
  }
  if constexpr (kS + 1 < kRun) {
    sm90_promote_run<kS + 1, kRun, P, R>(acc, prev, cur, it0, cw, stage_at, release);
  } else {
    wgmma_wait<0>();
    sm90_promote(acc, cur);
    release(it0 + kS);
  }
}

// Starts the copies of this consumer's 64 row scales and the tile's kBN column scales into `factors` (cp.async: they
// land while the mainloop runs; the epilogue waits for them). A row past M or a column past N copies the last one
// (never stored); a missing scale is 1.
template <class R>
__device__ __forceinline__ void sm90_load_factors(const GemmParams& p, const Sm90Unit& w, int cw, float* factors) {
  const int tid = threadIdx.x % 128;
  if (tid < 64) {
    const int row = min(w.m_tile * R::kBM + cw * 64 + tid, p.m - 1);
    if (p.a_scale)
      cp_async4(factors + tid, p.a_scale + (p.a_scale_per_row ? row : 0));
    else
      factors[tid] = 1.f;
  }
#pragma unroll
  for (int c = tid; c < R::kBN; c += 128) {
    const int col = min(w.n_tile * R::kBN + c, p.n - 1);
    if (p.b_scale)
      cp_async4(factors + 64 + c, p.b_scale + (p.b_scale_per_col ? col : 0));
    else
      factors[64 + c] = 1.f;
  }
  cp_async_commit();
}

// The whole-tile store of a consumer's rows in the output's type (one branch a tile, not one an element).
template <class R, bool kTma, class Acc>
__device__ __forceinline__ void sm90_store_out(const GemmParams& p, const Sm90Unit& w, int cw,
                                               const Acc (&acc)[R::kBN / 2], uint8_t* buf, const CUtensorMap* map_out,
                                               bool uniform, const float* factors) {
  switch (p.out_dtype) {
    case GemmOut::kBf16:
      uniform ? sm90_store_tile<__nv_bfloat16, false, R, true, kTma>(p, w, cw, acc, buf, map_out)
              : sm90_store_tile<__nv_bfloat16, false, R, false, kTma>(p, w, cw, acc, buf, map_out, factors);
      break;
    case GemmOut::kF16:
      uniform ? sm90_store_tile<__half, false, R, true, kTma>(p, w, cw, acc, buf, map_out)
              : sm90_store_tile<__half, false, R, false, kTma>(p, w, cw, acc, buf, map_out, factors);
      break;
    case GemmOut::kF32:
      uniform ? sm90_store_tile<float, false, R, true, kTma>(p, w, cw, acc, buf, map_out)
              : sm90_store_tile<float, false, R, false, kTma>(p, w, cw, acc, buf, map_out, factors);
      break;
    default: sm90_store_tile<int32_t, false, R, true, kTma>(p, w, cw, acc, buf, map_out); break;
  }
}

// Maps are 3-D (k, rows, batch); a broadcast operand's map has one batch and is always read at batch 0. map_out
// (kTmaOut): the output as (n, m, batch) in boxes of 128 bytes x 64 rows, 128-byte swizzle; else unused. Two
// kernels, not a runtime flag: one with both epilogues spilled (recipe 5, 68 bytes).
template <GemmPair kPair, class R, bool kTmaOut>
__global__ void __launch_bounds__(R::kThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                     const __grid_constant__ CUtensorMap map_out, const __grid_constant__ GemmParams p) {
#if ASTRAI_WGMMA
  using P = Sm90Pair<kPair>;
  using Acc = typename P::Acc;
  // fp8's promotion overlaps a stage's wgmma with the previous stage's additions where two sets of stage sums fit
  // beside the accumulators (kBN 128: 3 x 64 registers; kBN 192 would need 3 x 96).
  constexpr bool kTwoSums = 3 * (R::kBN / 2) <= 192;
  extern __shared__ uint8_t smem_raw[];
  // Stages 1024-byte aligned (the swizzle atoms), then the barriers.
  // An offset from smem_raw, not an integer round trip: the compiler keeps the shared address space, so the
  // epilogue's buffer accesses are STS / LDS (not generic) and do not alias the scale and bias loads.
  uint8_t* const smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  uint8_t* const epilogue_buf = smem + R::kStages * R::kStageBytes;  // 16 KB a consumer warpgroup
  uint64_t* const full = reinterpret_cast<uint64_t*>(epilogue_buf + R::kEpilogueBytes);
  uint64_t* const empty = full + R::kStages;
  float* const factor_buf = reinterpret_cast<float*>(empty + R::kStages);  // R::kFactorFloats a consumer
  const int wg = threadIdx.x / 128;
  const int tiles_m = (p.m + R::kBM - 1) / R::kBM, tiles_n = (p.n + R::kBN - 1) / R::kBN;
  const int tiles = tiles_m * tiles_n * p.batch;
  const int units = p.tail_split > 1 ? p.tail_from + (tiles - p.tail_from) * p.tail_split : tiles * p.split_k;
  const int k_tiles = (p.k * P::kEltBytes + R::kBKBytes - 1) / R::kBKBytes;
  constexpr int kBK = R::kBKBytes / P::kEltBytes;  // K values a stage
  if (threadIdx.x == 0) {
    for (int s = 0; s < R::kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], 2);  // one arrival a consumer warpgroup (its wgmma wait is warpgroup-wide)
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  // Programmatic dependent launch: every thread waits for the previous kernel before touching global memory.
  wait_prerequisites();

  if (wg == 0) {
    setmaxnreg_dec<R::kProducerRegs>();
    if (threadIdx.x == 0) {
      const bool a_bcast = p.a_batch_stride == 0, b_bcast = p.b_batch_stride == 0;
      int it = 0;  // stages issued so far, across units: the ring position
      for (int u = blockIdx.x; u < units; u += gridDim.x) {
        const Sm90Unit w = sm90_unit<R>(p, u, tiles_m, tiles_n, k_tiles);
        for (int kt = w.kt0; kt < w.kt1; ++kt, ++it) {
          const int s = it % R::kStages;
          mbarrier_wait_sleep(&empty[s], (uint32_t(it / R::kStages) & 1u) ^ 1u);  // a fresh barrier's previous phase counts
          uint8_t* const stage = smem + s * R::kStageBytes;
          mbarrier_arrive_expect_tx(&full[s], R::kStageBytes);
          tma_load_3d(smem_addr(stage), &map_a, &full[s], kt * kBK, w.m_tile * R::kBM, a_bcast ? 0 : w.bz);
          tma_load_3d(smem_addr(stage + R::kTileBytesA), &map_b, &full[s], kt * kBK, w.n_tile * R::kBN,
                      b_bcast ? 0 : w.bz);
        }
      }
      launch_dependents();  // every load issued: the next kernel may be scheduled (it waits for this grid)
    }
    return;
  }

  setmaxnreg_inc<R::kConsumerRegs>();
  const int cw = wg - 1;  // this consumer's 64 rows of the tile
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32, g = lane / 4, t = lane % 4;
  Acc acc[R::kBN / 2];
#pragma unroll
  for (int i = 0; i < R::kBN / 2; ++i) acc[i] = Acc(0);
  // A stage goes back to the producer once this warpgroup's wgmma that read it completed: one arrival (thread 0
  // of the warpgroup; wgmma.wait_group completes the warpgroup's whole group).
  const bool signals = threadIdx.x % 128 == 0;
  auto release = [&](int it_done) {
    if (signals) mbarrier_arrive(&empty[it_done % R::kStages]);
  };
  auto stage_at = [&](int it_at) {  // waits ring position it_at full; its shared address
    mbarrier_wait_sleep(&full[it_at % R::kStages], uint32_t(it_at / R::kStages) & 1u);
    return smem_addr(smem + (it_at % R::kStages) * R::kStageBytes);
  };
  // Per-row / per-column scales (not one number a tensor): staged in shared memory where the recipe has room. A
  // tile's last factor reads precede its epilogue's final warpgroup barrier, so the next tile's copies (issued past
  // that barrier) never overwrite factors still being read.
  const bool uniform_call = (!p.a_scale || !p.a_scale_per_row) && (!p.b_scale || !p.b_scale_per_col) &&
                            p.bias_dtype == GemmBias::kNone;
  const bool staged_factors = R::kSmemFactors && !uniform_call && p.out_dtype != GemmOut::kS32;
  float* const factors = factor_buf + cw * R::kFactorFloats;
  int it = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const Sm90Unit w = sm90_unit<R>(p, u, tiles_m, tiles_n, k_tiles);
    const int kt0 = w.kt0, kt1 = w.kt1;
    if (staged_factors && !w.partial) sm90_load_factors<R>(p, w, cw, factors);
    if constexpr (P::kPromote && !kTwoSums) {
      // One set of stage sums (kBN 192: a second does not fit the registers): a stage's wgmma, drained, its stage
      // handed back, its sum added to acc; the other consumer warpgroup's wgmma run meanwhile. (Making the two take
      // turns issuing, by named barriers, timed 2-6% slower on an H100: docs/benchmarks.md.)
#pragma unroll
      for (int i = 0; i < R::kBN / 2; ++i) acc[i] = Acc(0);
      Acc part[R::kBN / 2];
      for (int kt = kt0; kt < kt1; ++kt, ++it) {
        sm90_stage_mma<P, R>(part, stage_at(it), cw, false);
        wgmma_commit();
        wgmma_wait<0>();
        release(it);
        sm90_promote(acc, part);
      }
    } else if constexpr (P::kPromote) {
      // Two sets of stage sums, runs of kPromoteRun stages: a stage's wgmma run while the previous stage's sum is
      // added to acc, and the tensor cores drain once a run (ptxas serializes every wgmma if a group stays in flight
      // across loop iterations, so each run is issued and retired within one iteration). The end of a slice takes
      // runs of 2 and 1.
#pragma unroll
      for (int i = 0; i < R::kBN / 2; ++i) acc[i] = Acc(0);
      Acc part0[R::kBN / 2], part1[R::kBN / 2];
      const int n = kt1 - kt0;
      int i = 0;
      for (; i + kPromoteRun <= n; i += kPromoteRun)
        sm90_promote_run<0, kPromoteRun, P, R>(acc, part0, part1, it + i, cw, stage_at, release);
      for (; i + 2 <= n; i += 2) sm90_promote_run<0, 2, P, R>(acc, part0, part1, it + i, cw, stage_at, release);
      if (i < n) sm90_promote_run<0, 1, P, R>(acc, part0, part1, it + i, cw, stage_at, release);
      it += n > 0 ? n : 0;
    } else {
      for (int kt = kt0; kt < kt1; ++kt, ++it) {
        sm90_stage_mma<P, R>(acc, stage_at(it), cw, kt > kt0);
        wgmma_commit();
        wgmma_wait<1>();  // the previous stage's wgmma are done: hand that stage back
        if (kt > kt0) release(it - 1);
      }
      wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < R::kBN / 2; ++i) wgmma_fence_operand(acc[i]);
    }
    const bool partial = w.partial;
    if (kt1 <= kt0) {  // an empty K slice (split_k past the K tiles, or K = 0): zeros (its own path: no spills)
      if (staged_factors) cp_async_wait<0>();  // this tile's copies, before the next tile's reuse the buffer
      for (int h = 0; h < 2; ++h) {
        const int lrow = cw * 64 + 16 * warp + g + 8 * h, row = w.m_tile * R::kBM + lrow;
        if (row >= p.m && !w.tail) continue;
        for (int j = 0; j < R::kBN / 8; ++j) {
          const int lcol = 8 * j + 2 * t, col = w.n_tile * R::kBN + lcol;
          if (col >= p.n && !w.tail) continue;
          const bool two = col + 1 < p.n;
          if (w.tail) {  // the slice's whole block (the tail's slices are never empty; kept for safety)
            Acc* ws = static_cast<Acc*>(p.workspace) + w.ws_tile + lrow * R::kBN + lcol;
            ws[0] = Acc(0);
            ws[1] = Acc(0);
          } else if (partial) {
            Acc* ws = static_cast<Acc*>(p.workspace) + ((int64_t(w.bz) * p.split_k + w.split) * p.m + row) * p.n + col;
            ws[0] = Acc(0);
            if (two) ws[1] = Acc(0);
          } else {
            store_out<Acc>(p, w.bz, row, col, Acc(0), Acc(0), two);
          }
        }
      }
      continue;
    }
    if (!P::kPromote) release(it - 1);  // the promoted loops hand back every stage themselves

    uint8_t* const buf = epilogue_buf + cw * (R::kEpilogueBytes / 2);
    // Recomputed a tile where the factors are not staged: kBN 256's kernels keep their former code (hoisted there,
    // ptxas scheduled them differently); hoisted for kBN 128, which timed faster that way (docs/benchmarks.md).
    const bool uniform = R::kSmemFactors ? uniform_call
                                         : (!p.a_scale || !p.a_scale_per_row) && (!p.b_scale || !p.b_scale_per_col) &&
                                               p.bias_dtype == GemmBias::kNone;
    if (staged_factors && !partial) {
      cp_async_wait<0>();
      named_barrier_sync(1 + cw, 128);  // every thread's copies landed
    }
    if (partial) {  // raw sums to the workspace, copied out by the threads: the last TMA store must be done with buf
      if (kTmaOut && threadIdx.x % 128 == 0) tma_store_wait<0>();
      sm90_store_tile<Acc, true, R, true, false>(p, w, cw, acc, buf, &map_out);
    } else {
      sm90_store_out<R, kTmaOut>(p, w, cw, acc, buf, &map_out, uniform, factors);
    }
  }
  if (kTmaOut && threadIdx.x % 128 == 0) tma_store_wait<0>();  // buf stays valid until the last store has read it
#endif
}

// The tail's reduction (split_k 0): block x is tail tile tail_from + x, a thread 4 columns of one of its rows: the
// tail_split partials of its block added in slice order (kReduceBatch slices' loads in flight together), then
// store_out's arithmetic (scales, bias, out dtype). Launched as a programmatic dependent where the code is sm_90+:
// it waits for the GEMM's grid before its first read.
constexpr int kTailReduceThreads = 256;
template <class Acc, class R>
__global__ void __launch_bounds__(kTailReduceThreads)
    gemm_sm90_tail_reduce_kernel(const __grid_constant__ GemmParams p) {
#if ASTRAI_WGMMA  // only recipes 4, 5, 7-11 launch it: a stub in the other arches' code
  wait_prerequisites();
  launch_dependents();  // the next call may be scheduled now (it waits for this grid too)
  const int tiles_m = (p.m + R::kBM - 1) / R::kBM, tiles_n = (p.n + R::kBN - 1) / R::kBN;
  const Sm90Tile w = sm90_tile<R>(p.tail_from + int(blockIdx.x), tiles_m, tiles_n);
  const int e = 4 * int(blockIdx.y * kTailReduceThreads + threadIdx.x);  // element of the tile's block
  const int row = w.m_tile * R::kBM + e / R::kBN, col = w.n_tile * R::kBN + e % R::kBN;
  if (row >= p.m || col >= p.n) return;
  constexpr int64_t kBlock = int64_t(R::kBM) * R::kBN;
  const Acc* const ws = static_cast<const Acc*>(p.workspace) + int64_t(blockIdx.x) * p.tail_split * kBlock + e;
  Acc sum[4];
  for (int s0 = 0; s0 < p.tail_split; s0 += kReduceBatch) {
    uint4 q[kReduceBatch];
#pragma unroll
    for (int i = 0; i < kReduceBatch; ++i)
      if (s0 + i < p.tail_split) q[i] = *reinterpret_cast<const uint4*>(ws + (s0 + i) * kBlock);
#pragma unroll
    for (int i = 0; i < kReduceBatch; ++i) {
      if (s0 + i >= p.tail_split) break;
      const Acc v[4] = {acc_from_bits<Acc>(q[i].x), acc_from_bits<Acc>(q[i].y), acc_from_bits<Acc>(q[i].z),
                        acc_from_bits<Acc>(q[i].w)};
#pragma unroll
      for (int e = 0; e < 4; ++e) sum[e] = s0 + i == 0 ? v[e] : sum[e] + v[e];  // slice order
    }
  }
  const int cols = min(4, p.n - col);
  store_out<Acc>(p, w.bz, row, col, sum[0], sum[1], cols > 1);
  if (cols > 2) store_out<Acc>(p, w.bz, row, col + 2, sum[2], sum[3], cols > 3);
#endif
}

}  // namespace gemm
}  // namespace astrai
