// Recipes 7, 8, 9 and 11: W8A16 on Hopper's wgmma for layout nt (a [m][k] bf16 / fp16 activations, b [n][k] int8 weights).
// wgmma reads its B operand from shared memory only, and int8 is no wgmma type for a 16-bit product, so the roles
// are swapped: the CTA computes a tile of y^T, the weights are wgmma's A operand, expanded to 16 bits in registers
// (rs form), and the activations its B operand, straight from the TMA's shared memory.
//
// - Warpgroup 0: one producer thread. A stage is 128 weight rows x kBK of K (int8, one box: recipes 7 and 9 128 K
//   with the 128-byte swizzle, recipes 8 and 11 64 K with the 64-byte swizzle) and kTokens token rows x kBK (boxes of
//   64 values, the 128-byte swizzle); zeros past M, N and K. Recipe 9 is recipe 7 with 64 tokens a CTA (m64n64 wgmma):
//   at M <= 64 a 128-token wgmma would spend half its work on rows past M. Recipe 11 (192 tokens) fills the last wave
//   where recipe 8's 256-token tiles leave it short (N = 2112: 17 weight tiles).
// - Warpgroups 1 and 2: each owns 64 weight rows. For each 16 of K a thread needs bytes {2t, 2t+1, 2t+8, 2t+9} of
//   its rows g and g + 8 (the A fragment): one 16-byte shared load a row (the four lanes of a quad read the same
//   chunk), byte permutes, then the exact int8 -> 16-bit expansion. A stage's fragments are built, then its wgmma
//   issued (recipe 8: two of 128 tokens a step, recipe 11 three of 64, the same fragment); stages alternate between two fragment sets so a
//   stage's loads and expansion run while the previous stage's wgmma are in flight.
// - Epilogue: the ring is reused to stage each warpgroup's y^T tile transposed to y's orientation in fp32, then
//   copied out 4 columns of a token a thread, scales and bias folded (store_out's arithmetic), or raw fp32 partials
//   into the split's workspace slice for split_k > 1 (gemm_reduce_kernel sums them in split order).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>

#include "kernels/common/ptx/arch.cuh"
#include "kernels/common/ptx/griddep.cuh"
#include "kernels/common/ptx/mbarrier.cuh"
#include "kernels/common/ptx/smem.cuh"
#include "kernels/common/ptx/sync.cuh"
#include "kernels/common/ptx/tma.cuh"
#include "kernels/common/ptx/wgmma_sm90.cuh"
#include "kernels/gemm/params.h"
#include "kernels/gemm/sm80_gemm.cuh"

namespace astrai {
namespace gemm {

template <int kTokens_>
struct Sm90W8a16Shape {
  static constexpr int kRows = 128;          // weight rows a CTA: the wgmma M side, 64 a consumer warpgroup
  static constexpr int kTokens = kTokens_;   // token rows a CTA: the wgmma N side
  // Tokens a wgmma: 64 or 128 (m64n64, m64n128); recipes 8 and 11 run two of m64n128 / three of m64n64 on the same
  // fragment (measured on an H100: one m64n256 a step 5-8% slower than two m64n128, one m64n192 or two m64n96 slower
  // than three m64n64).
  static constexpr int kWgN = kTokens == 256 ? 128 : kTokens == 192 ? 64 : kTokens;
  static constexpr int kH = kTokens / kWgN;   // wgmma a k16 step, each on the same A fragment
  static constexpr int kAcc = kWgN / 2;       // fp32 accumulators a thread a wgmma
  static constexpr int kBK = kTokens > 128 ? 64 : 128;  // K values a stage
  static constexpr int kSteps = kBK / 16;    // k16 steps a stage
  static constexpr int kWBytes = kRows * kBK;
  static constexpr int kXBoxBytes = kTokens * 128;  // 64 16-bit values of K a token row
  static constexpr int kStageBytes = kWBytes + (kBK / 64) * kXBoxBytes;
  // 192 KB / 192 KB / 192 KB / 200 KB for 64 / 128 / 192 / 256 tokens
  static constexpr int kStages = kTokens == 64 ? 6 : kTokens == 128 ? 4 : kTokens == 192 ? 6 : 5;
  static constexpr int kThreads = 384;
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024 /* alignment slack */ + 2 * kStages * 8;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
  static constexpr int kGroupTokens = 8;  // raster: token tiles that walk the weight tiles together
  static constexpr int kRun = 256 / kBK;  // stages between drains of the wgmma pipe: 256 of K (even: fa, fb alternate)
  // The epilogue stages 2 x kTokens x 64 fp32 in the ring.
  static_assert(2 * kTokens * 64 * 4 <= kStages * kStageBytes, "the epilogue's staging must fit the ring");
};
using Sm90W8a16Tokens128 = Sm90W8a16Shape<128>;  // recipe 7
using Sm90W8a16Tokens256 = Sm90W8a16Shape<256>;  // recipe 8
using Sm90W8a16Tokens64 = Sm90W8a16Shape<64>;    // recipe 9
using Sm90W8a16Tokens192 = Sm90W8a16Shape<192>;  // recipe 11

// The tile order and block shape gemm_sm90_tail_reduce_kernel (sm90_gemm.cuh) needs for a w8a16 shape's last wave
// split: blocks of kTokens token rows x 128 output columns, kGroupTokens token tiles a raster group.
template <class S>
struct Sm90W8a16TailTile {
  static constexpr int kBM = S::kTokens, kBN = S::kRows, kGroupM = S::kGroupTokens;
};

// The A fragments of one stage (kSteps k16 steps) of this thread's rows g and g + 8 of its warp's 16 weight rows:
// a 16-byte shared load a row and step (the quad's four lanes read the same chunk), then one byte permute puts
// bytes 2t and 2t + 1 of the chunk's first 8 bytes in the low bytes of two 16-bit lanes (and one bytes 2t + 8,
// 2t + 9 from the last 8), and the expansion.
template <bool kF16, class S>
__device__ __forceinline__ void sm90_w8a16_fragments(const uint8_t* w_tile, int row, int t,
                                                     uint32_t (&f)[S::kSteps][4]) {
  const uint32_t sel = uint32_t(2 * t) * 0x11u + uint32_t(2 * t + 1) * 0x1100u;
  // The swizzle of 16-byte chunk j of row r: 128-byte rows (recipes 7, 9) at j ^ (r % 8), 64-byte rows (recipe 8) at
  // j ^ ((r / 2) % 4); rows row and row + 8 share it.
  const int swz = S::kBK == 128 ? (row & 7) : ((row >> 1) & 3);
#pragma unroll
  for (int j = 0; j < S::kSteps; ++j) {
    const uint32_t off = uint32_t((j ^ swz) << 4);
    const uint4 v0 = *reinterpret_cast<const uint4*>(w_tile + row * S::kBK + off);
    const uint4 v1 = *reinterpret_cast<const uint4*>(w_tile + (row + 8) * S::kBK + off);
    f[j][0] = s8_lanes_to_16bit<kF16>(__byte_perm(v0.x, v0.y, sel));  // A[g][2t..2t+1]
    f[j][1] = s8_lanes_to_16bit<kF16>(__byte_perm(v1.x, v1.y, sel));  // A[g+8][2t..2t+1]
    f[j][2] = s8_lanes_to_16bit<kF16>(__byte_perm(v0.z, v0.w, sel));  // A[g][2t+8..2t+9]
    f[j][3] = s8_lanes_to_16bit<kF16>(__byte_perm(v1.z, v1.w, sel));  // A[g+8][2t+8..2t+9]
  }
}

// One stage's wgmma: for each k16 step and each kWgN tokens h, acc[h] (64 weights x kWgN tokens) += the step's
// fragment x the step's 16 K of tokens kWgN h .. kWgN h + kWgN - 1; scale-d 0 on a fresh tile.
template <bool kF16, class S>
__device__ __forceinline__ void sm90_w8a16_stage_mma(float (&acc)[S::kH][S::kAcc],
                                                     const uint32_t (&f)[S::kSteps][4], uint32_t x_tile,
                                                     bool accumulate) {
  const uint64_t desc = wgmma_desc_sw128(x_tile, 16, 1024);  // one descriptor, constant offsets (no per-wgmma math)
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < S::kSteps; ++j)
#pragma unroll
    for (int h = 0; h < S::kH; ++h) {
      // Token rows kWgN h.. of box j / 4 (64 K a box), 32 bytes of K a step inside its 128-byte rows.
      const uint32_t at = (j / 4) * S::kXBoxBytes + h * S::kWgN * 128 + (j % 4) * 32;
      if constexpr (S::kWgN == 64) {
        wgmma_m64n64k16_rs<kF16>(acc[h], f[j], wgmma_desc_sw128_add(desc, at), accumulate || j > 0);
      } else {
        wgmma_m64n128k16_rs<kF16>(acc[h], f[j], wgmma_desc_sw128_add(desc, at), accumulate || j > 0);
      }
    }
}

// Copies a consumer's staged tile (kTokens token rows x 64 output columns of fp32, see the kernel's epilogue) out: a
// thread a 16-byte unit (4 columns of one token) at a time, token tok and column col at base + (tok - row0) *
// row_stride + col - col_origin. kPartial: raw sums (a split's workspace slice, or a tail slice's block); otherwise
// store_out's arithmetic (acc * a_scale of the token * b_scale of the column + bias, in fp32), then Out.
template <class Out, bool kPartial, int kTokens>
__device__ __forceinline__ void sm90_w8a16_copy_out(const GemmParams& p, const float* buf, Out* base,
                                                    int64_t row_stride, int row0, int col_origin, int m0, int col0) {
  const int tid = threadIdx.x % 128;
  // A thread copies units tid % 16 of rows tid / 16 + 8 i: the same 4 columns in every row, so their scales and
  // bias are read once.
  const int u = tid % 16, col = col0 + 4 * u;
  if (col >= p.n) return;
  const int cols = min(4, p.n - col), rows = min(kTokens, p.m - m0);
  float sb[4] = {1.f, 1.f, 1.f, 1.f}, bias[4] = {0.f, 0.f, 0.f, 0.f};
  if constexpr (!kPartial) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int c = min(col + e, p.n - 1);  // lanes past N are computed but not stored
      if (p.b_scale) sb[e] = p.b_scale[p.b_scale_per_col ? c : 0];
      if (p.bias_dtype != GemmBias::kNone) bias[e] = bias_at(p, c);
    }
  }
  // Every row's 4 columns start 4-element aligned when the first row's do and the row stride keeps them so.
  const bool vector = cols == 4 && row_stride % 4 == 0 &&
                      (reinterpret_cast<uintptr_t>(base + (col - col_origin)) % (4 * sizeof(Out))) == 0;
#pragma unroll 8
  for (int i = 0; i < kTokens / 8; ++i) {
    const int r = tid / 16 + 8 * i;
    if (r >= rows) break;
    const int tok = m0 + r;
    const float4 v4 = *reinterpret_cast<const float4*>(buf + r * 64 + ((u ^ (((r >> 1) & 3) << 1)) * 4));
    float v[4] = {v4.x, v4.y, v4.z, v4.w};
    if constexpr (!kPartial) {
      const float sa = p.a_scale ? p.a_scale[p.a_scale_per_row ? tok : 0] : 1.f;
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = v[e] * sa * sb[e] + bias[e];
    }
    Out* const dst = base + int64_t(tok - row0) * row_stride + (col - col_origin);
    if (vector) {
      if constexpr (std::is_same<Out, float>::value) {
        *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
      } else if constexpr (std::is_same<Out, __half>::value) {
        const __half2 lo = __floats2half2_rn(v[0], v[1]), hi = __floats2half2_rn(v[2], v[3]);
        *reinterpret_cast<uint2*>(dst) =
            make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
      } else {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]), hi = __floats2bfloat162_rn(v[2], v[3]);
        *reinterpret_cast<uint2*>(dst) =
            make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
      }
    } else {
      for (int e = 0; e < cols; ++e) {
        if constexpr (std::is_same<Out, float>::value) {
          dst[e] = v[e];
        } else if constexpr (std::is_same<Out, __half>::value) {
          dst[e] = __float2half_rn(v[e]);
        } else {
          dst[e] = __float2bfloat16_rn(v[e]);
        }
      }
    }
  }
}

// Grid: x = tiles (blocks of 128 weight rows x blocks of kTokens tokens, grouped raster), z = batch * split_k (slice
// fastest). With the last wave split (p.tail_split > 1, split_k 0 at the op): x = units, z = 1; units below
// p.tail_from are whole tiles t = unit (batches outermost), then each tile from tail_from on as tail_split K slices
// whose fp32 sums go to its blocks of the workspace (gemm_sm90_tail_reduce_kernel adds them in slice order and applies
// the epilogue; same tile order: Sm90W8a16TailTile). p.k_tiles_per_split counts gemm_launch's K tiles of 128.
template <bool kF16, class S>
__global__ void __launch_bounds__(S::kThreads, 1)
    gemm_sm90_w8a16_kernel(const __grid_constant__ CUtensorMap map_w, const __grid_constant__ CUtensorMap map_x,
                           const __grid_constant__ GemmParams p) {
#if ASTRAI_WGMMA
  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + S::kStages * S::kStageBytes);
  uint64_t* const empty = full + S::kStages;
  const int wg = threadIdx.x / 128;
  // Grouped raster: kGroupTokens token tiles walk the weight tiles together, so a weight tile is read from DRAM once
  // for the group (the weights of a large layer do not fit in the L2).
  const int tiles_m = (p.m + S::kTokens - 1) / S::kTokens, tiles_n = (p.n + S::kRows - 1) / S::kRows;
  const int k_tiles = (p.k + S::kBK - 1) / S::kBK;
  const int per_split = p.k_tiles_per_split * (128 / S::kBK);
  int tile = int(blockIdx.x), bz = int(blockIdx.z) / p.split_k, split = int(blockIdx.z) % p.split_k;
  bool tail = false;  // a slice of a tail tile: raw sums into block ws_block of the workspace
  int64_t ws_block = 0;
  if (p.tail_split > 1) {
    const int u = int(blockIdx.x);
    int t = u;
    split = 0;
    if (u >= p.tail_from) {
      const int v = u - p.tail_from;
      t = p.tail_from + v / p.tail_split;
      split = v % p.tail_split;
      tail = true;
      ws_block = int64_t(v) * S::kTokens * S::kRows;
    }
    bz = t / (tiles_m * tiles_n);
    tile = t % (tiles_m * tiles_n);
  }
  const int per_group = S::kGroupTokens * tiles_n;
  const int first_m = (tile / per_group) * S::kGroupTokens, rows = min(S::kGroupTokens, tiles_m - first_m);
  const int local = tile % per_group;
  const int n0 = (local / rows) * S::kRows, m0 = (first_m + local % rows) * S::kTokens;
  const int kt0 = (p.tail_split > 1 && !tail) ? 0 : min(k_tiles, split * per_split);
  const int kt1 = (p.tail_split > 1 && !tail) ? k_tiles : min(k_tiles, kt0 + per_split);
  if (threadIdx.x == 0) {
    for (int s = 0; s < S::kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], 2);  // one arrival a consumer warpgroup
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  // Programmatic dependent launch (where launched so): every thread waits for the previous kernel before touching
  // global memory.
  wait_prerequisites();

  if (wg == 0) {
    setmaxnreg_dec<S::kProducerRegs>();
    if (threadIdx.x == 0) {
      const int zw = p.b_batch_stride == 0 ? 0 : bz, zx = p.a_batch_stride == 0 ? 0 : bz;
      for (int kt = kt0, it = 0; kt < kt1; ++kt, ++it) {
        const int s = it % S::kStages;
        mbarrier_wait_sleep(&empty[s], (uint32_t(it / S::kStages) & 1u) ^ 1u);
        uint8_t* const stage = smem + s * S::kStageBytes;
        mbarrier_arrive_expect_tx(&full[s], S::kStageBytes);
        tma_load_3d(smem_addr(stage), &map_w, &full[s], kt * S::kBK, n0, zw);
#pragma unroll
        for (int b = 0; b < S::kBK / 64; ++b)
          tma_load_3d(smem_addr(stage + S::kWBytes + b * S::kXBoxBytes), &map_x, &full[s], kt * S::kBK + 64 * b, m0,
                      zx);
      }
      launch_dependents();  // every load issued: the next kernel may be scheduled (it waits for this grid)
    }
    return;
  }

  setmaxnreg_inc<S::kConsumerRegs>();
  const int cw = wg - 1;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32, g = lane / 4, t = lane % 4;
  const int row = cw * 64 + 16 * warp + g;  // this thread's first weight row of the tile
  const bool signals = threadIdx.x % 128 == 0;
  constexpr int kH = S::kH, kAcc = S::kAcc;
  float acc[kH][kAcc];
#pragma unroll
  for (int h = 0; h < kH; ++h)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[h][i] = 0.f;
  auto stage_ptr = [&](int it) {  // waits ring position it full
    mbarrier_wait_sleep(&full[it % S::kStages], uint32_t(it / S::kStages) & 1u);
    return smem + (it % S::kStages) * S::kStageBytes;
  };
  auto release = [&](int it) {
    if (signals) mbarrier_arrive(&empty[it % S::kStages]);
  };
  const int n = kt1 - kt0;
  uint32_t fa[S::kSteps][4], fb[S::kSteps][4];  // a stage's fragments: even stages in fa, odd in fb
  if (n > 0) sm90_w8a16_fragments<kF16, S>(stage_ptr(0), row, t, fa);
  // kRun stages an iteration, all wgmma groups retired at its end (a group in flight across iterations makes ptxas
  // serialize every wgmma, C7514). Inside, stage u's wgmma run while stage u + 1's fragments are built into the
  // other set (free once stage u - 1's group has retired); the last builds the next iteration's first.
  for (int i = 0; i < n; i += S::kRun) {
#pragma unroll
    for (int u = 0; u < S::kRun; ++u) {
      if (i + u < n) {
        uint32_t(&f)[S::kSteps][4] = u % 2 == 0 ? fa : fb;
        uint32_t(&next)[S::kSteps][4] = u % 2 == 0 ? fb : fa;
        const uint8_t* const st = smem + ((i + u) % S::kStages) * S::kStageBytes;
        sm90_w8a16_stage_mma<kF16, S>(acc, f, smem_addr(st + S::kWBytes), i + u > 0);
        wgmma_commit();
        if (u > 0) {
          wgmma_wait<1>();  // stage i + u - 1's wgmma done: `next` is free
          release(i + u - 1);
        }
        if (i + u + 1 < n) sm90_w8a16_fragments<kF16, S>(stage_ptr(i + u + 1), row, t, next);
      }
    }
    wgmma_wait<0>();
    release(min(i + S::kRun, n) - 1);
  }
#pragma unroll
  for (int h = 0; h < kH; ++h)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) wgmma_fence_operand(acc[h][i]);

  // Epilogue: both consumers are done with the ring (every stage consumed, no load in flight), so each stages its
  // 64 weight rows x kTokens tokens there as fp32, transposed to y's orientation: buf[token][weight], 256-byte rows,
  // 16-byte units XOR-swizzled by bits 1-2 of the row (the four token rows a warp writes at once hit distinct
  // banks; a quarter warp's read stays inside one half row). Then a 16-byte unit a thread: 4 output columns of one
  // token, scales and bias folded, stored as one vector where the output allows.
  named_barrier_sync(1, 256);
  float* const buf = reinterpret_cast<float*>(smem) + cw * S::kTokens * 64;
#pragma unroll
  for (int h = 0; h < kH; ++h)
#pragma unroll
    for (int j = 0; j < S::kWgN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int wr = 16 * warp + g + 8 * (e / 2), tk = S::kWgN * h + 8 * j + 2 * t + e % 2;
        buf[tk * 64 + (((wr / 4) ^ (((tk >> 1) & 3) << 1)) * 4) + wr % 4] = acc[h][4 * j + e];
      }
  named_barrier_sync(2 + cw, 128);
  const int col0 = n0 + cw * 64;
  if (tail) {  // the tile's [kTokens][128] block, local coordinates
    sm90_w8a16_copy_out<float, true, S::kTokens>(p, buf, static_cast<float*>(p.workspace) + ws_block, S::kRows, m0,
                                                 n0, m0, col0);
  } else if (p.split_k > 1) {
    sm90_w8a16_copy_out<float, true, S::kTokens>(
        p, buf, static_cast<float*>(p.workspace) + (int64_t(bz) * p.split_k + split) * p.m * p.n, p.n, 0, 0, m0, col0);
  } else {
    const int64_t at = int64_t(bz) * p.out_batch_stride;
    switch (p.out_dtype) {  // one branch a tile
      case GemmOut::kBf16:
        sm90_w8a16_copy_out<__nv_bfloat16, false, S::kTokens>(p, buf, static_cast<__nv_bfloat16*>(p.out) + at,
                                                              p.out_row_stride, 0, 0, m0, col0);
        break;
      case GemmOut::kF16:
        sm90_w8a16_copy_out<__half, false, S::kTokens>(p, buf, static_cast<__half*>(p.out) + at, p.out_row_stride, 0,
                                                       0, m0, col0);
        break;
      default:
        sm90_w8a16_copy_out<float, false, S::kTokens>(p, buf, static_cast<float*>(p.out) + at, p.out_row_stride, 0,
                                                      0, m0, col0);
        break;
    }
  }
#endif
}

}  // namespace gemm
}  // namespace astrai
