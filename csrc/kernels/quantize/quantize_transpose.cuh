// Transposed (layout 1) and dual (layout 2) fp8 quantization: a 128 x 64 tile of x is cast in registers,
// transposed through shared memory as 4-byte words, and written to out_t [cols, rows] with 16-byte stores.
#pragma once

#include <cstdint>

#include "kernels/quantize/params.h"
#include "kernels/quantize/quantize_common.cuh"

namespace astrai {
namespace quantize {

constexpr int kTileRows = 128;  // TM: rows of x per tile = bytes of one out_t row segment (8 x 16 bytes)
constexpr int kTileCols = 64;   // TN: columns of x per tile = rows of out_t per tile
constexpr int kTransposeThreads = 256;
// Raster order of the tiles: bands of kTransposeBandTiles tile rows, walked column by column (tm fastest in a
// band). The tiles in flight at once (a contiguous range of tile indices, ~400 on an H100/H200) then cover
// about 16 tile rows x 25 tile columns: each out_t row receives 16 x 128 = 2 KB of contiguous bytes and each
// x row gives 25 x 128 = 3.2 KB. Row-major order (band of 1) wrote 128 bytes per out_t row, 64 KB apart at
// M = 65536: a DRAM page opened per 128 bytes written, which made the transposed write cost as much as both
// layouts together. 4 x fewer bytes per out_t row than per x row would be balanced by bytes; the sweep
// (csrc/tools/quantize_launch_sweep.cu) measured the band widths.
constexpr int kTransposeBandTiles = 16;

// Tile (tm, tn) of linear tile index `tile` in the banded raster order above.
template <int kBandTiles>
__host__ __device__ __forceinline__ void transpose_tile_coords(int64_t tile, int64_t tiles_m, int64_t tiles_n, int64_t* tm,
                                                      int64_t* tn) {
  const int64_t band = tile / (int64_t(kBandTiles) * tiles_n);
  const int64_t band_m0 = band * kBandTiles;
  const int64_t band_rows = tiles_m - band_m0 < kBandTiles ? tiles_m - band_m0 : kBandTiles;  // last band: fewer
  const int64_t idx = tile - band_m0 * tiles_n;
  const int64_t col = idx / band_rows;
  *tm = band_m0 + (idx - col * band_rows);
  *tn = col;
}

// Grid of the transposed kernel for `tiles` tiles and `resident` blocks resident at once: the fewest blocks
// that still take the same number of rounds (tiles per block) as a full resident grid, so that no round is a
// nearly empty tail: 4096 x 4096 (2048 tiles, 396 resident blocks on 132 SMs) runs 6 rounds of 342 blocks
// rather than 5 of 396 and one of 68.
inline int64_t transpose_grid(int64_t tiles, int64_t resident) {
  if (resident < 1) resident = 1;
  const int64_t rounds = (tiles + resident - 1) / resident;
  return rounds < 1 ? 1 : (tiles + rounds - 1) / rounds;
}

// Thread (warp w, lane l) loads rows 4*mg .. 4*mg+3 and columns 8*ng .. 8*ng+7 of the tile, where
//   ng = 2*(w % 4) + (l & 1)      (0..7)
//   mg = 16*(w / 4) + (l >> 1)    (0..31)
// For each of its 8 columns it packs the 4 row bytes into one word and stores it in shared memory at row n of
// the transposed tile, word mg. Rows of the transposed tile are 128 bytes (32 words, one bank cycle); the
// 16-byte chunk index is XORed with 4 on rows whose bit 3 is set, so the two column groups of a warp (8 rows
// apart) land in opposite bank halves: the word stores are conflict-free and the 16-byte reads stay whole.
__device__ __forceinline__ int swizzled_word(int n, int mg) {
  const int chunk = (mg >> 2) ^ (((n >> 3) & 1) << 2);
  return n * (kTileRows / 4) + chunk * 4 + (mg & 3);
}

// kVec: 16-byte loads (x 16-byte aligned, row stride and cols multiples of 8 elements); else element loads.
// Blocks loop over tiles (the launcher sizes a persistent grid), each prefetching its next tile's loads.
// Register cap: 3 blocks per SM for bf16 (78 registers, no spills with -Xptxas -v); 2 for fp16 / fp32.
// Supported multipliers: kTensor, kRow (per row of x), kColumn (per column of x), kFromAmax.
// kBandTiles: the raster band (kTransposeBandTiles; other values for the sweep). Every order writes the same
// bytes: each tile is computed alone, and the fused amax is an atomic max.
template <QuantIn kIn, QuantOut kOut, bool kVec, int kBandTiles = kTransposeBandTiles>
__global__ void __launch_bounds__(kTransposeThreads, kIn == QuantIn::kBF16 ? 3 : 2) quantize_transpose_kernel(const __grid_constant__ QuantizeParams p) {
  static_assert(kBandTiles >= 1, "the raster band holds at least one tile row");
  static_assert(kOut != QuantOut::kInt8, "the transposed layouts are fp8 only");
  constexpr int kInBytes = kIn == QuantIn::kF32 ? 4 : 2;
  __shared__ __align__(16) uint32_t tile_t[kTileCols * kTileRows / 4];  // [TN, TM bytes] swizzled
  __shared__ uint32_t red[kTransposeThreads / 32];

  const int tid = int(threadIdx.x);
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int ng = 2 * (warp & 3) + (lane & 1);
  const int mg = 16 * (warp >> 2) + (lane >> 1);
  const int64_t rows = p.rows, cols = p.cols;
  const int64_t tiles_m = (rows + kTileRows - 1) / kTileRows;
  const int64_t tiles_n = (cols + kTileCols - 1) / kTileCols;
  const char* x = static_cast<const char*>(p.x_ptr);
  uint8_t* out = static_cast<uint8_t*>(p.out_ptr);
  uint8_t* out_t = static_cast<uint8_t*>(p.out_t_ptr);
  const QuantScale kind = p.scale_kind;
  const bool vec_out = (cols & 7) == 0 && (reinterpret_cast<uintptr_t>(out) & 7) == 0;
  const bool vec_out_t = (rows & 15) == 0 && (reinterpret_cast<uintptr_t>(out_t) & 15) == 0;

  float mul_tensor = 1.0f;
  if (kind == QuantScale::kTensor) mul_tensor = __ldg(p.scale_ptr);
  if (kind == QuantScale::kFromAmax) {
    const ScalePair s = scale_from_amax(__ldg(p.amax_in_ptr), p.qmax, p.pow2_scale);
    mul_tensor = s.mul;
    if (blockIdx.x == 0 && tid == 0 && p.scale_inv_ptr != nullptr) p.scale_inv_ptr[0] = s.inv;
  }

  // Loads tile `tile`'s 4 rows x 8 columns of this thread in x's own bits (zero outside x).
  constexpr int kRunWords = StepWords<kIn, 8>::kCount;
  const int64_t tiles = tiles_m * tiles_n;
  auto load_tile = [&](int64_t tm, int64_t tn, uint32_t (&w)[4][kRunWords]) {
    const int64_t m0 = tm * kTileRows + 4 * mg;
    const int64_t n0 = tn * kTileCols + 8 * ng;
    const int ncount = int(cols - n0 < 8 ? (cols - n0 > 0 ? cols - n0 : 0) : 8);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t m = m0 + i;
      if (m < rows && ncount > 0) {
        const char* src = x + (m * p.x_row_stride + n0) * kInBytes;
        if (kVec && ncount == 8) load_step_raw<kIn, kVec, 8>(src, 8, w[i]);
        else load_step_raw<kIn, false, 8>(src, ncount, w[i]);
      } else {
#pragma unroll
        for (int k = 0; k < kRunWords; ++k) w[i][k] = 0u;
      }
    }
  };

  uint32_t tensor_amax = 0;
  // Software pipeline: the next tile's loads are issued before this tile's cast, shared-memory transpose and
  // stores, so a block keeps two tiles of loads in flight across its barriers.
  uint32_t next[4][kRunWords];
  int64_t next_tm = 0, next_tn = 0;
  transpose_tile_coords<kBandTiles>(int64_t(blockIdx.x), tiles_m, tiles_n, &next_tm, &next_tn);
  if (int64_t(blockIdx.x) < tiles) load_tile(next_tm, next_tn, next);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t tm = next_tm;
    const int64_t tn = next_tn;
    const int64_t m0 = tm * kTileRows + 4 * mg;  // first of this thread's 4 rows
    const int64_t n0 = tn * kTileCols + 8 * ng;  // first of this thread's 8 columns
    const int ncount = int(cols - n0 < 8 ? (cols - n0 > 0 ? cols - n0 : 0) : 8);

    float v[4][8];  // (rows, cols) of x
#pragma unroll
    for (int i = 0; i < 4; ++i) unpack_step<kIn, 8>(next[i], v[i]);
    if (tile + gridDim.x < tiles) {
      transpose_tile_coords<kBandTiles>(tile + gridDim.x, tiles_m, tiles_n, &next_tm, &next_tn);
      load_tile(next_tm, next_tn, next);
    }

    // Fused amax.
    uint32_t ra[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      ra[i] = run_amax_bits(v[i]);
      tensor_amax = max(tensor_amax, ra[i]);
    }
    if (p.amax_kind == QuantAmax::kRow) {
      // Lanes l and l ^ 1 hold the two column groups of one row in this warp; 4 warps share each row of the tile.
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t r = max(ra[i], __shfl_xor_sync(0xffffffffu, ra[i], 1));
        if ((lane & 1) == 0 && m0 + i < rows && r != 0) {
          atomicMax(reinterpret_cast<unsigned int*>(p.amax_ptr) + (m0 + i), r);
        }
      }
    }

    // Cast.
    float cmul[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      cmul[j] = (kind == QuantScale::kColumn && j < ncount) ? __ldg(p.scale_ptr + n0 + j) : 1.0f;
    }
    uint32_t b[4][2];  // (rows, 8 bytes as 2 words)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t m = m0 + i;
      const float rmul = kind == QuantScale::kRow ? (m < rows ? __ldg(p.scale_ptr + m) : 0.0f)
                         : kind == QuantScale::kColumn ? 1.0f
                                                       : mul_tensor;
      float y[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = v[i][j] * (kind == QuantScale::kColumn ? cmul[j] : rmul);
      b[i][0] = pack4<kOut>(y[0], y[1], y[2], y[3]);
      b[i][1] = pack4<kOut>(y[4], y[5], y[6], y[7]);
    }

    // Dual: the row-major output straight from registers.
    if (out != nullptr) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t m = m0 + i;
        if (m >= rows || ncount == 0) continue;
        uint8_t* dst = out + m * cols + n0;
        if (vec_out && ncount == 8) {
          *reinterpret_cast<uint2*>(dst) = make_uint2(b[i][0], b[i][1]);
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            if (j < ncount) dst[j] = uint8_t(b[i][j >> 2] >> (8 * (j & 3)));
          }
        }
      }
    }

    if (out_t != nullptr) {
      // Column j of this thread: the bytes of rows m0..m0+3, little-endian, one word.
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int sh = 8 * (j & 3);
        const int k = j >> 2;
        const uint32_t word = ((b[0][k] >> sh) & 0xffu) | (((b[1][k] >> sh) & 0xffu) << 8) |
                              (((b[2][k] >> sh) & 0xffu) << 16) | (((b[3][k] >> sh) & 0xffu) << 24);
        tile_t[swizzled_word(8 * ng + j, mg)] = word;
      }
      __syncthreads();
      // out_t rows n (64 per tile), 8 chunks of 16 bytes each: 2 passes of 256 threads.
#pragma unroll
      for (int pass = 0; pass < 2; ++pass) {
        const int idx = pass * kTransposeThreads + tid;
        const int r = idx >> 3;     // row of the transposed tile
        const int chunk = idx & 7;  // 16-byte chunk of that row
        const int64_t n = tn * kTileCols + r;
        const int64_t m_first = tm * kTileRows + chunk * 16;
        if (n < cols && m_first < rows) {
          const uint4 w = *reinterpret_cast<const uint4*>(&tile_t[swizzled_word(r, chunk * 4)]);
          uint8_t* dst = out_t + n * rows + m_first;
          if (vec_out_t && m_first + 16 <= rows) {
            *reinterpret_cast<uint4*>(dst) = w;
          } else {
            const uint32_t words[4] = {w.x, w.y, w.z, w.w};
            const int count = int(rows - m_first < 16 ? rows - m_first : 16);
#pragma unroll
            for (int q = 0; q < 16; ++q) {
              if (q < count) dst[q] = uint8_t(words[q >> 2] >> (8 * (q & 3)));
            }
          }
        }
      }
      __syncthreads();  // the next tile overwrites tile_t
    }
  }

  if (p.amax_kind == QuantAmax::kTensor) {
    uint32_t m = tensor_amax;
    for (int o = 1; o < 32; o <<= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) red[warp] = m;
    __syncthreads();
    if (tid == 0) {
      for (int w = 0; w < kTransposeThreads / 32; ++w) m = max(m, red[w]);
      if (m != 0) atomicMax(reinterpret_cast<unsigned int*>(p.amax_ptr), m);
    }
  }
}


// ---- register transpose (no shared memory, no barriers) -------------------------------------------------
// Each thread loads kR rows x 8 columns of x with all kR loads issued before any use, and casts the 4 rows of
// one column into one word (pack4 down a column): that word is already out_t's byte order, so the transpose
// costs no byte shuffles, no shared memory and no barrier. kLanes adjacent lanes read 8 kLanes consecutive
// columns of a row (production: 8 lanes, one 128-byte line of bf16); lanes k and k + kLanes hold consecutive
// kR-row runs, so one store instruction writes (32 / kLanes) x kR contiguous bytes of each of kLanes out_t rows
// (production: 4 runs x 16 = 64 bytes). A block of 4 warps covers 32 kLanes columns. The element casts are
// those of quantize_transpose_kernel: same bytes.
constexpr int kRegThreads = 128;
constexpr int kRegLanes = 8;
template <int kR>
constexpr int reg_tile_rows() { return (32 / kRegLanes) * kR; }
constexpr int kRegTileCols = (kRegThreads / 32) * 8 * kRegLanes;
// Production choice of the transposed kernel: 0 = quantize_transpose_kernel (shared-memory tile), 8 or 16 =
// quantize_transpose_regs_kernel with kR = 8 / 16 (kR = 16 for bf16 only: it spills for fp16 / fp32), -1 = by
// size: kR = 16 when its grid is at least kRegWavesFor16 resident waves, else kR = 8 (twice the tiles: a
// smaller last wave). Register caps (no spills, sm_90a -Xptxas -v): bf16 kR = 8: 6 blocks/SM (<= 85);
// otherwise 4 (<= 128). kRegPersistent: grid of resident blocks looping over tiles, else one block per tile.
// The register kernel beats the shared-memory tile at both sizes swept, kR = 16 wins on large grids only, and
// resident grids lose (csrc/tools/quantize_launch_sweep.cu; docs/benchmarks.md, quantize section).
constexpr int kTransposeVariant = -1;
constexpr bool kRegPersistent = false;
constexpr int kRegWavesFor16 = 4;

template <QuantIn kIn, int kR>
constexpr int reg_min_blocks() { return kIn == QuantIn::kBF16 && kR == 8 ? 6 : 4; }

// Sweep parameters (production: the defaults; the launcher's tile sizes assume them): kTmFastest orders the tiles
// down the rows of x first (production walks x's rows); kWarps warps per block; kMinBlocks the register cap;
// kLanes lanes per row of x (8 columns each): a warp covers 32 / kLanes runs of kR rows x 8 kLanes columns;
// kFold: the fused delayed-scaling fold (QuantizeParams::fold_counter_ptr), a separate instantiation (the
// shared-memory kernel has none).
template <QuantIn kIn, QuantOut kOut, bool kVec, int kR, bool kTmFastest = false, int kWarps = kRegThreads / 32,
          int kMinBlocks = reg_min_blocks<kIn, kR>(), int kLanes = kRegLanes, bool kFold = false>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    quantize_transpose_regs_kernel(const __grid_constant__ QuantizeParams p) {
  static_assert(kLanes == 2 || kLanes == 4 || kLanes == 8, "lanes per row of x: 2, 4 or 8");
  constexpr int kTileN = kWarps * 8 * kLanes;  // columns of x per tile
  static_assert(kR == 4 || kR == 8 || kR == 16, "kR rows per thread: 4, 8 or 16 (4-, 8- or 16-byte out_t stores)");
  static_assert(kOut != QuantOut::kInt8, "the transposed layouts are fp8 only");
  constexpr int kInBytes = kIn == QuantIn::kF32 ? 4 : 2;
  constexpr int kW = StepWords<kIn, 8>::kCount;  // words of one 8-element run
  constexpr int kQ = kR / 4;                      // out_t words per column
  constexpr int kTileM = (32 / kLanes) * kR;  // rows of x per tile
  __shared__ uint32_t red[kWarps];

  const int tid = int(threadIdx.x);
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int half = lane & (kLanes - 1);  // which 8 columns of the warp's 8 kLanes
  const int pair = lane / kLanes;        // which kR-row run of the tile
  const int64_t rows = p.rows, cols = p.cols;
  const uint32_t tiles_n = uint32_t((cols + kTileN - 1) / kTileN);
  const uint32_t tiles = uint32_t((rows + kTileM - 1) / kTileM) * tiles_n;  // < 2^31: the launcher checks
  const char* x = static_cast<const char*>(p.x_ptr);
  uint8_t* out = static_cast<uint8_t*>(p.out_ptr);
  uint8_t* out_t = static_cast<uint8_t*>(p.out_t_ptr);
  const QuantScale kind = p.scale_kind;
  const int64_t x_stride_bytes = p.x_row_stride * kInBytes;
  const bool vec_out = (cols & 7) == 0 && (reinterpret_cast<uintptr_t>(out) & 7) == 0;
  // out_t run of kR bytes: one kR-byte store (rows % kR == 0), kQ word stores (rows % 4 == 0), else bytes.
  const uintptr_t out_t_addr = reinterpret_cast<uintptr_t>(out_t);
  const int out_t_mode = (rows % kR == 0 && out_t_addr % kR == 0) ? 2 : (rows % 4 == 0 && out_t_addr % 4 == 0) ? 1 : 0;

  float mul_tensor = 1.0f;
  if (kind == QuantScale::kTensor) {
    if constexpr (kFold) mul_tensor = tensor_multiplier(p, blockIdx.x == 0 && tid == 0);
    else mul_tensor = __ldg(p.scale_ptr);
  }
  if (kind == QuantScale::kFromAmax) {
    const ScalePair s = scale_from_amax(__ldg(p.amax_in_ptr), p.qmax, p.pow2_scale);
    mul_tensor = s.mul;
    if (blockIdx.x == 0 && tid == 0 && p.scale_inv_ptr != nullptr) p.scale_inv_ptr[0] = s.inv;
  }

  uint32_t tensor_amax = 0;
  for (uint32_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    uint32_t tm, tn;
    if constexpr (kTmFastest) {
      const uint32_t tiles_m = tiles / tiles_n;
      tm = tile % tiles_m;
      tn = tile / tiles_m;
    } else {
      tm = tile / tiles_n;
      tn = tile - tm * tiles_n;
    }
    const int64_t m0 = int64_t(tm) * kTileM + pair * kR;                 // first of this thread's kR rows
    const int64_t n0 = int64_t(tn) * kTileN + warp * 8 * kLanes + half * 8;  // first of its 8 columns
    const int ncount = int(cols - n0 < 8 ? (cols - n0 > 0 ? cols - n0 : 0) : 8);
    const int mcount = int(rows - m0 < kR ? (rows - m0 > 0 ? rows - m0 : 0) : kR);

    // All kR loads before any use: kR x 16 bytes in flight per thread.
    uint32_t raw[kR][kW];  // (rows, 8 elements in x's bits)
    const char* src = x + (m0 * p.x_row_stride + n0) * kInBytes;
    if (kVec && ncount == 8 && mcount == kR) {
#pragma unroll
      for (int i = 0; i < kR; ++i) load_step_raw<kIn, true, 8>(src + i * x_stride_bytes, 8, raw[i]);
    } else {
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        if (i < mcount && ncount > 0) {
          if (kVec && ncount == 8) load_step_raw<kIn, kVec, 8>(src + i * x_stride_bytes, 8, raw[i]);
          else load_step_raw<kIn, false, 8>(src + i * x_stride_bytes, ncount, raw[i]);
        } else {
#pragma unroll
          for (int k = 0; k < kW; ++k) raw[i][k] = 0u;
        }
      }
    }
    float v[kR][8];  // (rows, cols) of x; the compiler keeps only what is live
#pragma unroll
    for (int i = 0; i < kR; ++i) unpack_step<kIn, 8>(raw[i], v[i]);

    // Fused amax (zeros outside x change nothing).
    if (p.amax_kind != QuantAmax::kNone) {
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        const uint32_t ra = run_amax_bits(v[i]);
        tensor_amax = max(tensor_amax, ra);
        if (p.amax_kind == QuantAmax::kRow) {
          // The kLanes adjacent lanes of a run hold the 8-column parts of one row in this warp.
          uint32_t r = ra;
#pragma unroll
          for (int o = 1; o < kLanes; o <<= 1) r = max(r, __shfl_xor_sync(0xffffffffu, r, o));
          if (half == 0 && i < mcount && r != 0) atomicMax(reinterpret_cast<unsigned int*>(p.amax_ptr) + (m0 + i), r);
        }
      }
    }

    // Cast down columns: cw[j][q] = rows 4q..4q+3 of column j, little-endian (out_t's byte order).
    float cmul[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) cmul[j] = (kind == QuantScale::kColumn && j < ncount) ? __ldg(p.scale_ptr + n0 + j) : 1.0f;
    float rmul[kR];
#pragma unroll
    for (int i = 0; i < kR; ++i) {
      rmul[i] = kind == QuantScale::kRow ? (i < mcount ? __ldg(p.scale_ptr + m0 + i) : 0.0f)
                : kind == QuantScale::kColumn ? 1.0f
                                              : mul_tensor;
    }
    uint32_t cw[8][kQ];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        float y[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) y[t] = v[4 * q + t][j] * (kind == QuantScale::kColumn ? cmul[j] : rmul[4 * q + t]);
        cw[j][q] = pack4<kOut>(y[0], y[1], y[2], y[3]);
      }
    }

    if (out_t != nullptr && mcount > 0) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (j >= ncount) continue;
        uint8_t* dst = out_t + (n0 + j) * rows + m0;
        if (out_t_mode == 2 && mcount == kR) {
          if constexpr (kR == 16) *reinterpret_cast<uint4*>(dst) = make_uint4(cw[j][0], cw[j][1], cw[j][2], cw[j][3]);
          else if constexpr (kR == 8) *reinterpret_cast<uint2*>(dst) = make_uint2(cw[j][0], cw[j][1]);
          else *reinterpret_cast<uint32_t*>(dst) = cw[j][0];
        } else if (out_t_mode >= 1) {
#pragma unroll
          for (int q = 0; q < kQ; ++q) {
            if (4 * q < mcount) reinterpret_cast<uint32_t*>(dst)[q] = cw[j][q];
          }
        } else {
#pragma unroll
          for (int r = 0; r < kR; ++r) {
            if (r < mcount) dst[r] = uint8_t(cw[j][r >> 2] >> (8 * (r & 3)));
          }
        }
      }
    }

    // Dual: row 4q+t is byte t of cw[0..7][q] (a 4 x 4 byte transpose per word, three byte_perms).
    if (out != nullptr && ncount > 0) {
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const int i = 4 * q + t;
          if (i >= mcount) continue;
          const uint32_t sel = uint32_t(t) | (uint32_t(t + 4) << 4);
          const uint32_t lo = __byte_perm(__byte_perm(cw[0][q], cw[1][q], sel), __byte_perm(cw[2][q], cw[3][q], sel), 0x5410);
          const uint32_t hi = __byte_perm(__byte_perm(cw[4][q], cw[5][q], sel), __byte_perm(cw[6][q], cw[7][q], sel), 0x5410);
          uint8_t* dst = out + (m0 + i) * cols + n0;
          if (vec_out && ncount == 8) {
            *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
          } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              if (j < ncount) dst[j] = uint8_t((j < 4 ? lo : hi) >> (8 * (j & 3)));
            }
          }
        }
      }
    }
  }

  if (p.amax_kind == QuantAmax::kTensor) {
    uint32_t m = tensor_amax;
    for (int o = 1; o < 32; o <<= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) red[warp] = m;
    __syncthreads();
    if (tid == 0) {
      for (int w = 0; w < kWarps; ++w) m = max(m, red[w]);
      if (m != 0) atomicMax(reinterpret_cast<unsigned int*>(p.amax_ptr), m);
    }
    if constexpr (kFold) fold_if_last_block<kWarps * 32>(p, tid);
  }
}

}  // namespace quantize

}  // namespace astrai
