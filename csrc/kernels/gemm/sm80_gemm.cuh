// The portable GEMM mainloop (mma.sync, sm_80 / sm_89 / sm_120a; sm_90a runs it too): multistage cp.async rings
// of 128-byte-swizzled K tiles, ldmatrix fragments, one mma cell per dtype pair, an epilogue that folds the scales
// and the bias. Operands are K-contiguous ("nt"): a [m][k], b [n][k].
//
// One K tile is 128 bytes of a b row (64 16-bit or 128 8-bit values) and the same K range of an a row (128 or 256
// bytes: w8a16's a is bf16 / fp16). A warp walks a tile in 32-byte steps of b, in order, whatever the recipe: the
// K summation order of a row depends on the split only, never on the CTA tile (batch invariance, contracts.md).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/common/host/align.h"
#include "kernels/common/ptx/async_copy.cuh"
#include "kernels/common/ptx/griddep.cuh"
#include "kernels/common/ptx/ldmatrix.cuh"
#include "kernels/common/ptx/mma_sm80.cuh"
#include "kernels/common/ptx/smem.cuh"
#include "kernels/gemm/params.h"

namespace astrai {
namespace gemm {

// ---- dtype pairs ---------------------------------------------------------------------------------------
enum class Kind { k16, k8, kW8A16 };

template <class TA_, class TB_, Kind kKind_, class Acc_, class Mma>
struct PairTraits {
  using TA = TA_;
  using TB = TB_;
  using Acc = Acc_;
  static constexpr Kind kKind = kKind_;
  static constexpr int kABytes = sizeof(TA_);
  static constexpr int kBBytes = sizeof(TB_);
  static constexpr int kKTile = 128 / kBBytes;  // K values per tile
  __device__ __forceinline__ static void mma(Acc (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    Mma::run(d, a, b0, b1);
  }
};

#define ASTRAI_GEMM_MMA(tag, fn, acc_t)                                                                       \
  struct tag {                                                                                               \
    __device__ __forceinline__ static void run(acc_t (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) { \
      fn(d, a, b0, b1);                                                                                      \
    }                                                                                                        \
  };
ASTRAI_GEMM_MMA(MmaBf16, mma_bf16_16816, float)
ASTRAI_GEMM_MMA(MmaF16, mma_f16_16816, float)
ASTRAI_GEMM_MMA(MmaS8, mma_s8_16832, int32_t)
ASTRAI_GEMM_MMA(MmaE4m3, mma_e4m3_16832_full_rate, float)  // the block-scale form on sm_120a
ASTRAI_GEMM_MMA(MmaE5m2E4m3, mma_e5m2_e4m3_16832_full_rate, float)
ASTRAI_GEMM_MMA(MmaE4m3E5m2, mma_e4m3_e5m2_16832_full_rate, float)
#undef ASTRAI_GEMM_MMA

using PairBf16Bf16 = PairTraits<__nv_bfloat16, __nv_bfloat16, Kind::k16, float, MmaBf16>;
using PairF16F16 = PairTraits<__half, __half, Kind::k16, float, MmaF16>;
using PairBf16S8 = PairTraits<__nv_bfloat16, int8_t, Kind::kW8A16, float, MmaBf16>;
using PairF16S8 = PairTraits<__half, int8_t, Kind::kW8A16, float, MmaF16>;
using PairS8S8 = PairTraits<int8_t, int8_t, Kind::k8, int32_t, MmaS8>;
using PairE4m3E4m3 = PairTraits<uint8_t, uint8_t, Kind::k8, float, MmaE4m3>;
using PairE5m2E4m3 = PairTraits<uint8_t, uint8_t, Kind::k8, float, MmaE5m2E4m3>;
using PairE4m3E5m2 = PairTraits<uint8_t, uint8_t, Kind::k8, float, MmaE4m3E5m2>;

// ---- tile recipes --------------------------------------------------------------------------------------
// CTA tile kBM x kBN, warp tile kWM x kWN (kWM a multiple of 16, kWN of 16), at most kMaxStages stages; the
// stage count is what fits kSmemKB (default 96 KB: the sm_89 / sm_120a opt-in limit is 99 KB, so the recipe runs
// everywhere; a larger budget limits the recipe to devices that have it). kMinBlocks_ < 0: two resident CTAs per
// SM at >= 256 threads (registers <= 128 per thread), so one's copies run under the other's mma.
template <int kBM_, int kBN_, int kWM_, int kWN_, int kMaxStages_, int kMinBlocks_ = -1, int kSmemKB_ = 96>
struct Recipe {
  static constexpr int kBM = kBM_, kBN = kBN_, kWM = kWM_, kWN = kWN_;
  static constexpr int kWarpsN = kBN / kWN;
  static constexpr int kWarps = (kBM / kWM) * kWarpsN;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMaxStages = kMaxStages_;
  static constexpr int kMinBlocks = kMinBlocks_ >= 0 ? kMinBlocks_ : (kThreads >= 256 ? 2 : 1);
  static constexpr int kSmemBudget = kSmemKB_ * 1024;
};
using RecipeM128N128 = Recipe<128, 128, 64, 32, 4>;  // id 0: large M
using RecipeM64N128 = Recipe<64, 128, 64, 32, 4>;    // id 1: mid M
using RecipeM16N64 = Recipe<16, 64, 16, 16, 4>;      // id 2: small M, the weight stream (with split_k)
// id 3: large M where recipe 0's grid leaves a short last wave (N = 2112: 17 columns of tiles): half the tile,
// three CTAs a SM (<= 85 registers; 3 stages of 24 KB, w8a16 2 of 40 KB, in 80 KB).
using RecipeM128N64 = Recipe<128, 64, 32, 32, 4, 3, 80>;

template <class Pair, class R>
struct Shape {
  static constexpr int kARowBytes = Pair::kKTile * Pair::kABytes;  // 128 or 256
  static constexpr int kAPanels = kARowBytes / 128;
  static constexpr int kAStageBytes = R::kBM * kARowBytes;
  static constexpr int kBStageBytes = R::kBN * 128;
  static constexpr int kStageBytes = kAStageBytes + kBStageBytes;
  static constexpr int kFitStages = R::kSmemBudget / kStageBytes;
  static constexpr int kStages = kFitStages < R::kMaxStages ? kFitStages : R::kMaxStages;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static constexpr int kMI = R::kWM / 16;  // m16 fragments per warp
  static constexpr int kNI = R::kWN / 8;   // n8 fragments per warp (even: ldmatrix takes two at a time)
  static_assert(kStages >= 2, "a recipe needs two stages");
  static_assert(kNI % 2 == 0, "warp N tile: a multiple of 16");
};

// Byte offset of 16-byte chunk `chunk` (of a row's 8 * panels) of row `row` in a tile of `rows` rows: panels of
// 128-byte rows, chunk c of a row stored at c ^ (row % 8) (ldmatrix reads 8 rows of one chunk conflict-free).
template <int kRows>
__device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
  return uint32_t(((chunk >> 3) * kRows + row) * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

// lop3 with a lookup table of 0x6A: per bit, (b, c) = (0, 0) -> 0, (0, 1) -> 1, (1, 0) -> a, (1, 1) -> ~a. With b and
// c constants this keeps, inverts or sets each bit of a in one instruction (written as `(a & m) | k`, the compiler
// emits two).
template <uint32_t b, uint32_t c>
__device__ __forceinline__ uint32_t lop3_keep_flip_set(uint32_t a) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;\n" : "=r"(d) : "r"(a), "n"(b), "n"(c));
  return d;
}

// The low bytes of the two 16-bit lanes of u (int8; the high bytes are ignored) -> two bf16 / fp16 values, exact
// for -128..127. fp16: 0x64 over the byte with its top bit inverted is 1024 + (byte + 128); minus 1152. bf16 (7
// mantissa bits): 0x43 over the low 7 bits is 128 + those bits, 0x43 over the top bit alone 128 or 256; their
// difference is the signed byte (low7 - 128 * sign).
template <bool kF16>
__device__ __forceinline__ uint32_t s8_lanes_to_16bit(uint32_t u) {
  if constexpr (kF16) {
    const uint32_t x = lop3_keep_flip_set<0x00FF00FFu, 0x64806480u>(u);
    const uint32_t bias = 0xE480E480u;  // -1152, -1152
    const __half2 r = __hadd2(*reinterpret_cast<const __half2*>(&x), *reinterpret_cast<const __half2*>(&bias));
    return *reinterpret_cast<const uint32_t*>(&r);
  } else {
    const uint32_t x = lop3_keep_flip_set<0x007F007Fu, 0x43004300u>(u),
                   y = lop3_keep_flip_set<0x00800080u, 0x43004300u>(u);
    const __nv_bfloat162 r =
        __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&x), *reinterpret_cast<const __nv_bfloat162*>(&y));
    return *reinterpret_cast<const uint32_t*>(&r);
  }
}

// Four int8 (one register) as four bf16 / fp16 values (bytes 0, 1 in lo; 2, 3 in hi), exact: one byte permute a
// pair, then s8_lanes_to_16bit.
template <bool kF16>
__device__ __forceinline__ void s8x4_to_16bit(uint32_t u, uint32_t& lo, uint32_t& hi) {
  lo = s8_lanes_to_16bit<kF16>(__byte_perm(u, 0, 0x4140));
  hi = s8_lanes_to_16bit<kF16>(__byte_perm(u, 0, 0x4342));
}

// ---- epilogue ------------------------------------------------------------------------------------------
__device__ __forceinline__ float bias_at(const GemmParams& p, int col) {
  switch (p.bias_dtype) {
    case GemmBias::kBf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p.bias)[col]);
    case GemmBias::kF16: return __half2float(static_cast<const __half*>(p.bias)[col]);
    case GemmBias::kF32: return static_cast<const float*>(p.bias)[col];
    default: return 0.f;
  }
}

// Stores out[row][col] (and col + 1 when `two`) of batch `bz`: acc * scales + bias in fp32, then the output type;
// raw s32 for GemmOut::kS32. `two` needs col + 1 < n.
template <class Acc>
__device__ __forceinline__ void store_out(const GemmParams& p, int64_t bz, int row, int col, Acc v0, Acc v1,
                                          bool two) {
  const int64_t off = bz * p.out_batch_stride + int64_t(row) * p.out_row_stride + col;
  if (p.out_dtype == GemmOut::kS32) {
    int32_t* o = static_cast<int32_t*>(p.out) + off;
    if (two && (off & 1) == 0) {
      *reinterpret_cast<int2*>(o) = make_int2(int32_t(v0), int32_t(v1));
    } else {
      o[0] = int32_t(v0);
      if (two) o[1] = int32_t(v1);
    }
    return;
  }
  const float sa = p.a_scale ? p.a_scale[p.a_scale_per_row ? row : 0] : 1.f;
  float f0 = float(v0) * sa, f1 = float(v1) * sa;
  if (p.b_scale) {
    f0 *= p.b_scale[p.b_scale_per_col ? col : 0];
    if (two) f1 *= p.b_scale[p.b_scale_per_col ? col + 1 : 0];
  }
  if (p.bias_dtype != GemmBias::kNone) {
    f0 += bias_at(p, col);
    if (two) f1 += bias_at(p, col + 1);
  }
  const bool pair_store = two && (off & 1) == 0;
  switch (p.out_dtype) {
    case GemmOut::kBf16: {
      __nv_bfloat16* o = static_cast<__nv_bfloat16*>(p.out) + off;
      if (pair_store) {
        *reinterpret_cast<__nv_bfloat162*>(o) = __floats2bfloat162_rn(f0, f1);
      } else {
        o[0] = __float2bfloat16_rn(f0);
        if (two) o[1] = __float2bfloat16_rn(f1);
      }
      break;
    }
    case GemmOut::kF16: {
      __half* o = static_cast<__half*>(p.out) + off;
      if (pair_store) {
        *reinterpret_cast<__half2*>(o) = __floats2half2_rn(f0, f1);
      } else {
        o[0] = __float2half_rn(f0);
        if (two) o[1] = __float2half_rn(f1);
      }
      break;
    }
    default: {
      float* o = static_cast<float*>(p.out) + off;
      if (pair_store) {
        *reinterpret_cast<float2*>(o) = make_float2(f0, f1);
      } else {
        o[0] = f0;
        if (two) o[1] = f1;
      }
    }
  }
}

// Bytes of a 16-byte chunk that lie before the end of a row, `left` bytes ahead of the chunk's start.
__device__ __forceinline__ int chunk_bytes(int64_t left) { return left >= 16 ? 16 : left > 0 ? int(left) : 0; }

// ---- the kernel ----------------------------------------------------------------------------------------
// Grid: x = n tiles, y = m tiles, z = batch * split_k. A split writes raw accumulators into its workspace slice
// (gemm_reduce folds them); without a split the epilogue stores the output.
template <class Pair, class R>
__global__ void __launch_bounds__(R::kThreads, R::kMinBlocks) gemm_sm80_kernel(const __grid_constant__ GemmParams p) {
  using S = Shape<Pair, R>;
  using Acc = typename Pair::Acc;
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / R::kWarpsN, warp_n = warp % R::kWarpsN;
  const int m0 = blockIdx.y * R::kBM, n0 = blockIdx.x * R::kBN;
  const int split = blockIdx.z % p.split_k;
  const int64_t bz = blockIdx.z / p.split_k;

  const int k_tiles = ceil_div(p.k, Pair::kKTile);
  const int kt_begin = split * p.k_tiles_per_split;
  const int kt_end = min(k_tiles, kt_begin + p.k_tiles_per_split);
  const int nk = max(0, kt_end - kt_begin);

  const uint8_t* a_base = static_cast<const uint8_t*>(p.a) + bz * p.a_batch_stride * Pair::kABytes;
  const uint8_t* b_base = static_cast<const uint8_t*>(p.b) + bz * p.b_batch_stride * Pair::kBBytes;
  const int64_t a_row_bytes = p.a_row_stride * Pair::kABytes, b_row_bytes = p.b_row_stride * Pair::kBBytes;
  const int64_t a_k_bytes = int64_t(p.k) * Pair::kABytes, b_k_bytes = int64_t(p.k) * Pair::kBBytes;
  const uint32_t smem_base = smem_addr(smem);

  // Copies K tile `kt` into stage `stage`: 16-byte chunks, zero-filled past m, n and k. Thread `tid` copies chunk
  // tid % chunks-per-row of rows tid / chunks-per-row + r * (threads / chunks-per-row): its column, its first
  // row's address and its smem offset are fixed for the whole loop (only the K offset and the row step vary).
  constexpr int kACpr = S::kAPanels * 8, kARowStep = R::kThreads / kACpr;
  constexpr int kAIters = (R::kBM * kACpr + R::kThreads - 1) / R::kThreads;
  constexpr int kBRowStep = R::kThreads / 8, kBIters = (R::kBN * 8 + R::kThreads - 1) / R::kThreads;
  static_assert(R::kThreads % kACpr == 0 && kARowStep % 8 == 0 && kBRowStep % 8 == 0,
                "rows split evenly over the threads, in steps of whole swizzle phases");
  const int a_row0 = tid / kACpr, a_chunk = tid % kACpr, b_row0 = tid >> 3, b_chunk = tid & 7;
  const uint8_t* const a_src0 = a_base + int64_t(m0 + a_row0) * a_row_bytes + a_chunk * 16;
  const uint8_t* const b_src0 = b_base + int64_t(n0 + b_row0) * b_row_bytes + b_chunk * 16;
  const uint32_t a_off0 = tile_offset<R::kBM>(a_row0, a_chunk), b_off0 = tile_offset<R::kBN>(b_row0, b_chunk);
  // An operand tile whose rows all lie inside m (a) or n (b) copies the K tiles that lie wholly inside k without
  // bounds checks (one address add per chunk); edge tiles and the tile cut by k take the zero-filling path. Per
  // operand: at M = 1 the weight tile (b) still takes the fast path.
  const bool a_inside = m0 + R::kBM <= p.m, b_inside = n0 + R::kBN <= p.n;
  const int kt_inside = p.k / Pair::kKTile;
  const int64_t a_row_step = kARowStep * a_row_bytes, b_row_step = kBRowStep * b_row_bytes;
  constexpr bool kAEven = kAIters * kARowStep == R::kBM, kBEven = kBIters * kBRowStep == R::kBN;
  auto load_tile = [&](int stage, int kt) {
    const uint32_t a_dst = smem_base + stage * S::kStageBytes + a_off0;
    const uint32_t b_dst = smem_base + stage * S::kStageBytes + S::kAStageBytes + b_off0;
    const int64_t a_kb = int64_t(kt) * S::kARowBytes, b_kb = int64_t(kt) * 128;
    const bool k_inside = kt < kt_inside;
    if (a_inside && k_inside) {
#pragma unroll
      for (int r = 0; r < kAIters; ++r)
        if (kAEven || a_row0 + r * kARowStep < R::kBM)
          cp_async16_zfill_bytes(a_dst + r * kARowStep * 128, a_src0 + a_kb + r * a_row_step, 16);
    } else {
      const int a_bytes = chunk_bytes(a_k_bytes - a_kb - a_chunk * 16);
#pragma unroll
      for (int r = 0; r < kAIters; ++r) {
        const int row = a_row0 + r * kARowStep;
        if (row < R::kBM) {
          const bool in = m0 + row < p.m && a_bytes > 0;
          // Row step a multiple of 8 rows: the swizzle phase, hence the offset's form, repeats.
          cp_async16_zfill_bytes(a_dst + r * kARowStep * 128,
                                 in ? a_src0 + r * kARowStep * a_row_bytes + a_kb : a_base, in ? a_bytes : 0);
        }
      }
    }
    if (b_inside && k_inside) {
#pragma unroll
      for (int r = 0; r < kBIters; ++r)
        if (kBEven || b_row0 + r * kBRowStep < R::kBN)
          cp_async16_zfill_bytes(b_dst + r * kBRowStep * 128, b_src0 + b_kb + r * b_row_step, 16);
    } else {
      const int b_bytes = chunk_bytes(b_k_bytes - b_kb - b_chunk * 16);
#pragma unroll
      for (int r = 0; r < kBIters; ++r) {
        const int row = b_row0 + r * kBRowStep;
        if (row < R::kBN) {
          const bool in = n0 + row < p.n && b_bytes > 0;
          cp_async16_zfill_bytes(b_dst + r * kBRowStep * 128,
                                 in ? b_src0 + r * kBRowStep * b_row_bytes + b_kb : b_base, in ? b_bytes : 0);
        }
      }
    }
  };

  Acc acc[S::kMI][S::kNI][4];
#pragma unroll
  for (int i = 0; i < S::kMI; ++i)
#pragma unroll
    for (int j = 0; j < S::kNI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = Acc(0);

  // Programmatic dependent launch (sm_90+ code): this CTA's first b tiles (the weights) go into L2 while the previous
  // kernel finishes, then it waits for that kernel: nothing else of global memory before. 1-6% less time at M = 16
  // (recipe 2, H200); the weight streams measured a loss with it and do not prefetch.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (b_inside && b_chunk == 0) {  // one thread a 128-byte row of a tile
#pragma unroll
    for (int s = 0; s < S::kStages - 1; ++s) {
      const int kt = kt_begin + s;
      if (s < nk && kt < kt_inside)
#pragma unroll
        for (int r = 0; r < kBIters; ++r)
          if (kBEven || b_row0 + r * kBRowStep < R::kBN) prefetch_l2(b_src0 + int64_t(kt) * 128 + r * b_row_step);
    }
  }
#endif
  wait_prerequisites();

#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (s < nk) load_tile(s, kt_begin + s);
    cp_async_commit();
  }

  // This lane's fragment addresses in a stage, per 32-byte step of b (fixed for the loop: the rows a lane reads
  // are congruent mod 8 across fragments, so only the step moves the swizzled column).
  constexpr int kASteps = Pair::kKind == Kind::kW8A16 ? 8 : 4;
  uint32_t a_frag_off[kASteps], b_frag_off[4];
  {
    const int b_row = warp_n * R::kWN + (lane & 7) + ((lane >> 4) << 3);
#pragma unroll
    for (int step = 0; step < 4; ++step) b_frag_off[step] = tile_offset<R::kBN>(b_row, step * 2 + ((lane >> 3) & 1));
    if constexpr (Pair::kKind == Kind::kW8A16) {
      // a's 8-byte runs: k 4t .. 4t + 3 of each 16 b values (row g; g + 8 is 8 rows on).
      const int a_row = warp_m * R::kWM + (lane >> 2), t = lane & 3;
#pragma unroll
      for (int q = 0; q < 8; ++q) a_frag_off[q] = tile_offset<R::kBM>(a_row, q * 2 + (t >> 1)) + (t & 1) * 8;
    } else {
      const int a_row = warp_m * R::kWM + (lane & 15);
#pragma unroll
      for (int step = 0; step < 4; ++step) a_frag_off[step] = tile_offset<R::kBM>(a_row, step * 2 + (lane >> 4));
    }
  }

  for (int it = 0; it < nk; ++it) {
    cp_async_wait<S::kStages - 2>();
    __syncthreads();  // tile `it` landed for every thread; stage (it - 1) % kStages is free
    if (it + S::kStages - 1 < nk) load_tile((it + S::kStages - 1) % S::kStages, kt_begin + it + S::kStages - 1);
    cp_async_commit();

    const uint32_t a_st = smem_base + (it % S::kStages) * S::kStageBytes;
    const uint32_t b_st = a_st + S::kAStageBytes;
#pragma unroll
    for (int step = 0; step < 4; ++step) {  // 32 bytes of each b row
      uint32_t b[S::kNI][2];
#pragma unroll
      for (int j = 0; j < S::kNI; j += 2) {
        uint32_t r[4];
        ldmatrix_x4(r, b_st + b_frag_off[step] + j * 8 * 128);
        b[j][0] = r[0];
        b[j][1] = r[1];
        b[j + 1][0] = r[2];
        b[j + 1][1] = r[3];
      }
      if constexpr (Pair::kKind == Kind::kW8A16) {
        // b holds 4 int8 of k (4t .. 4t + 3) per register: mma 0 takes the first 16 k of the step, mma 1 the
        // rest, with a's k in the same order (two 4-value runs per thread, 8-byte loads).
        constexpr bool kF16 = std::is_same<typename Pair::TA, __half>::value;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t bx[S::kNI][2];
#pragma unroll
          for (int j = 0; j < S::kNI; ++j) s8x4_to_16bit<kF16>(b[j][h], bx[j][0], bx[j][1]);
#pragma unroll
          for (int i = 0; i < S::kMI; ++i) {
            const uint32_t at = a_st + a_frag_off[2 * step + h] + i * 16 * 128;  // rows g and g + 8
            uint32_t lo0, hi0, lo1, hi1;
            asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(lo0), "=r"(hi0) : "r"(at));
            asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(lo1), "=r"(hi1) : "r"(at + 8 * 128));
            const uint32_t a[4] = {lo0, lo1, hi0, hi1};
#pragma unroll
            for (int j = 0; j < S::kNI; ++j) Pair::mma(acc[i][j], a, bx[j][0], bx[j][1]);
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < S::kMI; ++i) {
          uint32_t a[4];
          ldmatrix_x4(a, a_st + a_frag_off[step] + i * 16 * 128);
#pragma unroll
          for (int j = 0; j < S::kNI; ++j) Pair::mma(acc[i][j], a, b[j][0], b[j][1]);
        }
      }
    }
  }
  cp_async_wait<0>();
  // The next kernel (a split's reduction, the next call) may be scheduled once every CTA is past its mainloop (it
  // waits for this grid before touching what this one writes). Not earlier: dependents launched at the start sat
  // beside this grid's CTAs and, call after call, ran ahead of it (20% slower on some weight streams, H200).
  launch_dependents();

  // Epilogue: fragment (i, j) holds rows g, g + 8 and columns 2t, 2t + 1 of its 16 x 8 block.
  const int g = lane >> 2, t = lane & 3;
  const bool partial = p.split_k > 1;
#pragma unroll
  for (int i = 0; i < S::kMI; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + warp_m * R::kWM + i * 16 + g + 8 * h;
      if (row >= p.m) continue;
#pragma unroll
      for (int j = 0; j < S::kNI; ++j) {
        const int col = n0 + warp_n * R::kWN + j * 8 + 2 * t;
        if (col >= p.n) continue;
        const bool two = col + 1 < p.n;
        const Acc v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
        if (partial) {
          Acc* w = static_cast<Acc*>(p.workspace) + (int64_t(blockIdx.z) * p.m + row) * p.n + col;
          w[0] = v0;
          if (two) w[1] = v1;
        } else {
          store_out<Acc>(p, bz, row, col, v0, v1, two);
        }
      }
    }
  }
}

// Sums the split_k partials of each output element in split order, then the epilogue. A thread takes 4 columns of
// a row (one 16-byte load a split where N is a multiple of 4), a block kReduceCols threads along N x kReduceRows
// rows; grid y and z walk the rows and batches past 65535 in strides. No 64-bit division (the one-thread-an-element
// version's three cost more than its loads). Launched as a programmatic dependent of the kernel that wrote the
// partials where the image's code allows (sm80_gemm_launch.cuh): it waits for that grid before its first read.
constexpr int kReduceCols = 64, kReduceRows = 4, kReduceBatch = 4;
template <class Acc>
__device__ __forceinline__ Acc acc_from_bits(uint32_t u) {
  if constexpr (std::is_same<Acc, float>::value) {
    return __uint_as_float(u);
  } else {
    return Acc(int32_t(u));
  }
}
template <class Acc>
__global__ void __launch_bounds__(kReduceCols * kReduceRows) gemm_reduce_kernel(const __grid_constant__ GemmParams p) {
  wait_prerequisites();
  launch_dependents();  // the next call may be scheduled now (it waits for this grid too)
  const int col = 4 * int(blockIdx.x * kReduceCols + threadIdx.x);
  if (col >= p.n) return;
  const int cols = min(4, p.n - col);
  const int64_t mn = int64_t(p.m) * p.n;
  const bool vector = p.n % 4 == 0 && (reinterpret_cast<uintptr_t>(p.workspace) & 15) == 0;
  for (int bz = int(blockIdx.z); bz < p.batch; bz += int(gridDim.z)) {
    const Acc* const base = static_cast<const Acc*>(p.workspace) + int64_t(bz) * p.split_k * mn;
    for (int row = int(blockIdx.y) * kReduceRows + int(threadIdx.y); row < p.m; row += int(gridDim.y) * kReduceRows) {
      const Acc* w = base + int64_t(row) * p.n + col;
      Acc sum[4] = {Acc(0), Acc(0), Acc(0), Acc(0)};
      // kReduceBatch splits' loads issued together (a thread's loads in flight), then added in split order.
      for (int s0 = 0; s0 < p.split_k; s0 += kReduceBatch) {
        Acc v[kReduceBatch][4];
#pragma unroll
        for (int i = 0; i < kReduceBatch; ++i) {
          if (s0 + i >= p.split_k) break;
          const Acc* const ws = w + int64_t(s0 + i) * mn;
          if (vector) {
            const uint4 q = *reinterpret_cast<const uint4*>(ws);
            v[i][0] = acc_from_bits<Acc>(q.x);
            v[i][1] = acc_from_bits<Acc>(q.y);
            v[i][2] = acc_from_bits<Acc>(q.z);
            v[i][3] = acc_from_bits<Acc>(q.w);
          } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) v[i][e] = e < cols ? ws[e] : Acc(0);
          }
        }
#pragma unroll
        for (int i = 0; i < kReduceBatch; ++i) {
          if (s0 + i >= p.split_k) break;
#pragma unroll
          for (int e = 0; e < 4; ++e) sum[e] = s0 + i == 0 ? v[i][e] : sum[e] + v[i][e];  // split order
        }
      }
      store_out<Acc>(p, bz, row, col, sum[0], sum[1], cols > 1);
      if (cols > 2) store_out<Acc>(p, bz, row, col + 2, sum[2], sum[3], cols > 3);
    }
  }
}

}  // namespace gemm
}  // namespace astrai
