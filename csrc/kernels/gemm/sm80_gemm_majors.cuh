// The portable mainloop for layouts nn, tn and tt: sm80_gemm.cuh's kernel with each operand's major-ness (K-major or
// MN-major) a compile-time parameter. The nt kernel stays gemm_sm80_kernel; a K-major operand here is loaded and
// read as there (interior tiles without bounds checks, edge tiles zero-filled).
//
// MN-major tiles are stored as [k][mn] lines of kMN values, 128-byte swizzled, and read with ldmatrix .trans:
// - 16-bit (w16a16): .trans gives the mma fragment as it is (two consecutive k of one m / n per register).
// - 8-bit (s8, fp8, w8a16's int8 b): a k32 fragment register holds 4 consecutive k of one m / n, and .trans hands
//   out pairs of lines. The loader stores k at line k_line(k) (a bit permutation inside 16 k: k = 4i + 2o + b ->
//   line 8o + 2i + b), so lines 0-7 of a 16-k group hold k = 4i + {0, 1} and lines 8-15 k = 4i + {2, 3}; .trans
//   on them gives thread t k = 4t, 4t + 1 (resp. 4t + 2, 4t + 3) of two adjacent mn, and a prmt of the two
//   registers gives 4 consecutive k of one mn. So the k order is the identity in every layout (the other operand
//   is read as in nt), and a 16-wide mn chunk comes out even mn first (slot c <-> 2c), odd after (slot c <-> 2c +
//   1): the epilogue maps the slots back. One ldmatrix .x4 and four prmt per four fragment registers, reads
//   conflict-free; a byte gather from shared memory would take 4 loads per register.
// - w8a16's 16-bit a, MN-major: stored in k_line order too, so .trans gives k 4t, 4t + 1 and 4t + 2, 4t + 3, the
//   pairs its k16 cells take in nt (the int8 b's runs of 4 k); no prmt.
// The K order of an output row is what sm80_gemm.cuh's kernel uses (tiles in order, 32-byte steps of b in order),
// so batch invariance holds here too.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/gemm/sm80_gemm.cuh"

namespace astrai {
namespace gemm {

// ---- tiles ---------------------------------------------------------------------------------------------
// Byte offset of 16-byte chunk `chunk` of line `line` in a tile of kLines lines of kChunks chunks. Lines of 128
// bytes or more: panels as tile_offset. Shorter lines are packed, 128 / (16 kChunks) to a 128-byte row whose chunks
// are XORed with (row % kChunks): 8 consecutive lines at one chunk then sit in 8 distinct bank groups, and the
// offset grows linearly in steps of 8 lines (what the fragment addressing relies on).
template <int kLines, int kChunks>
__device__ __forceinline__ uint32_t mn_tile_offset(int line, int chunk) {
  static_assert(kChunks >= 1 && (kChunks & (kChunks - 1)) == 0, "lines of 16 * 2^i bytes");
  if constexpr (kChunks >= 8) {
    return tile_offset<kLines>(line, chunk);
  } else {
    const int l = line * kChunks + chunk, row = l >> 3;
    return uint32_t(row * 128 + (((l & 7) ^ (row % kChunks)) << 4));
  }
}

// lambda(k) for 8-bit (and w8a16 a) MN-major tiles: k = 16j + 4i + 2o + b is stored at line 16j + 8o + 2i + b.
__device__ __forceinline__ int k_line(int k) {
  return (k & ~15) | (((k >> 1) & 1) << 3) | (((k >> 2) & 3) << 1) | (k & 1);
}

// A K-major operand's tile: kRows rows (m or n) of kRowBytes bytes of K, as gemm_sm80_kernel loads it.
template <int kRows, int kRowBytes, int kThreads>
struct KMajorTile {
  static constexpr int kCpr = kRowBytes / 16, kRowStep = kThreads / kCpr;
  static constexpr int kIters = (kRows * kCpr + kThreads - 1) / kThreads;
  static_assert(kThreads % kCpr == 0 && kRowStep % 8 == 0, "rows split evenly, in whole swizzle phases");
  const uint8_t* base;  // this batch's operand: the address 0-byte copies name
  const uint8_t* src0;  // this thread's first row and chunk
  int64_t row_bytes, k_bytes;
  uint32_t off0;
  int row0, chunk, rows_left;  // rows_left: rows of the operand from this tile's first

  __device__ __forceinline__ KMajorTile(const uint8_t* base_, int64_t row_bytes_, int64_t k_bytes_, int first_row,
                                        int rows, int tid)
      : base(base_), row_bytes(row_bytes_), k_bytes(k_bytes_), row0(tid / kCpr), chunk(tid % kCpr),
        rows_left(rows - first_row) {
    src0 = base + int64_t(first_row + row0) * row_bytes + chunk * 16;
    off0 = tile_offset<kRows>(row0, chunk);
  }
  // K tile `kt` into the tile at shared address `dst`: zero-filled past the rows and past K. A tile whose rows and
  // K range all lie inside the operand (the common case) copies without bounds checks.
  __device__ __forceinline__ void load(uint32_t dst, int kt) const {
    const int64_t kb = int64_t(kt) * kRowBytes;
    if (rows_left >= kRows && kb + kRowBytes <= k_bytes) {
#pragma unroll
      for (int r = 0; r < kIters; ++r)
        if (kIters * kRowStep == kRows || row0 + r * kRowStep < kRows)
          cp_async16_zfill_bytes(dst + off0 + r * kRowStep * 128, src0 + kb + r * (kRowStep * row_bytes), 16);
      return;
    }
    const int bytes = chunk_bytes(k_bytes - kb - chunk * 16);
#pragma unroll
    for (int r = 0; r < kIters; ++r) {
      const int row = row0 + r * kRowStep;
      if (row < kRows) {
        const bool in = row < rows_left && bytes > 0;
        cp_async16_zfill_bytes(dst + off0 + r * kRowStep * 128, in ? src0 + r * kRowStep * row_bytes + kb : base,
                               in ? bytes : 0);
      }
    }
  }
};

// An MN-major operand's tile: kKTile lines (k; at line k_line(k) when kPermK) of kMN values of kElemBytes bytes.
template <int kMN, int kElemBytes, int kKTile, bool kPermK, int kThreads>
struct MnMajorTile {
  static constexpr int kLineBytes = kMN * kElemBytes, kChunks = kLineBytes / 16;
  static constexpr int kLineStep = kThreads / kChunks;
  static constexpr int kIters = (kKTile * kChunks + kThreads - 1) / kThreads;
  // Bytes from line l to line l + 1 where lines advance linearly (any l, in whole groups of 8 lines).
  static constexpr uint32_t kLinePitch = kChunks >= 8 ? 128 : kChunks * 16;
  static_assert(kLineBytes % 16 == 0 && kThreads % kChunks == 0, "lines of whole chunks, split evenly");
  const uint8_t* base;
  const uint8_t* src0;  // this thread's chunk in line (k) 0 of the operand
  int64_t line_bytes;   // the operand's k stride in bytes
  int k, line0, chunk, bytes;

  __device__ __forceinline__ MnMajorTile(const uint8_t* base_, int64_t line_bytes_, int k_, int first_mn, int mn,
                                         int tid)
      : base(base_), line_bytes(line_bytes_), k(k_), line0(tid / kChunks), chunk(tid % kChunks) {
    const int64_t start = int64_t(first_mn) * kElemBytes + chunk * 16;
    src0 = base + start;
    bytes = chunk_bytes(int64_t(mn) * kElemBytes - start);  // a chunk across the end of the mn range: zeros after it
  }
  __device__ __forceinline__ void load(uint32_t dst, int kt) const {
    if (bytes == 16 && (kt + 1) * kKTile <= k) {  // this thread's chunk inside mn and the whole K tile inside k
      const uint8_t* src = src0 + int64_t(kt) * kKTile * line_bytes;
#pragma unroll
      for (int r = 0; r < kIters; ++r) {
        const int kl = line0 + r * kLineStep;
        if (kIters * kLineStep == kKTile || kl < kKTile)
          cp_async16_zfill_bytes(dst + mn_tile_offset<kKTile, kChunks>(kPermK ? k_line(kl) : kl, chunk),
                                 src + kl * line_bytes, 16);
      }
      return;
    }
#pragma unroll
    for (int r = 0; r < kIters; ++r) {
      const int kl = line0 + r * kLineStep;
      if (kl < kKTile) {
        const int kg = kt * kKTile + kl;
        const bool in = kg < k && bytes > 0;
        const uint32_t off = mn_tile_offset<kKTile, kChunks>(kPermK ? k_line(kl) : kl, chunk);
        cp_async16_zfill_bytes(dst + off, in ? src0 + int64_t(kg) * line_bytes : base, in ? bytes : 0);
      }
    }
  }
};

// Four registers from ldmatrix .trans over lines 0-31 of a k_line-ordered 8-bit tile (one 16-value mn chunk) as
// k32 fragments: lo = 4 consecutive k (0-15 of the step) of the even mn 2c, ... odd mn 2c + 1, hi the same for k
// 16-31.
__device__ __forceinline__ void split_even_odd(const uint32_t (&r)[4], uint32_t& even_lo, uint32_t& odd_lo,
                                               uint32_t& even_hi, uint32_t& odd_hi) {
  even_lo = __byte_perm(r[0], r[1], 0x6420);
  odd_lo = __byte_perm(r[0], r[1], 0x7531);
  even_hi = __byte_perm(r[2], r[3], 0x6420);
  odd_hi = __byte_perm(r[2], r[3], 0x7531);
}

// ---- the kernel ----------------------------------------------------------------------------------------
// As gemm_sm80_kernel, with a MN-major when kAMn (a [k][m]) and b MN-major when kBMn (b [k][n]). The nn instance
// (!kAMn && kBMn) also serves tt by an operand swap: with p.transpose_out its (row, col) is the output's (col, row).
template <class Pair, class R, bool kAMn, bool kBMn>
__global__ void __launch_bounds__(R::kThreads, R::kMinBlocks)
    gemm_sm80_majors_kernel(const __grid_constant__ GemmParams p) {
  using S = Shape<Pair, R>;
  using Acc = typename Pair::Acc;
  constexpr bool kW8A16 = Pair::kKind == Kind::kW8A16;
  constexpr bool kA8 = Pair::kABytes == 1, kB8 = Pair::kBBytes == 1;
  // 8-bit MN-major operands come out of split_even_odd with mn permuted inside 16-value chunks.
  constexpr bool kARowsPermuted = kAMn && kA8, kBColsPermuted = kBMn && kB8;
  constexpr bool kMayTranspose = !kAMn && kBMn;
  using ATile = std::conditional_t<kAMn, MnMajorTile<R::kBM, Pair::kABytes, Pair::kKTile, kA8 || kW8A16, R::kThreads>,
                                   KMajorTile<R::kBM, S::kARowBytes, R::kThreads>>;
  using BTile = std::conditional_t<kBMn, MnMajorTile<R::kBN, Pair::kBBytes, Pair::kKTile, kB8, R::kThreads>,
                                   KMajorTile<R::kBN, 128, R::kThreads>>;
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
  const uint32_t smem_base = smem_addr(smem);

  const ATile a_tile = [&] {
    if constexpr (kAMn) return ATile(a_base, a_row_bytes, p.k, m0, p.m, tid);
    else return ATile(a_base, a_row_bytes, int64_t(p.k) * Pair::kABytes, m0, p.m, tid);
  }();
  const BTile b_tile = [&] {
    if constexpr (kBMn) return BTile(b_base, b_row_bytes, p.k, n0, p.n, tid);
    else return BTile(b_base, b_row_bytes, int64_t(p.k) * Pair::kBBytes, n0, p.n, tid);
  }();
  auto load_tile = [&](int stage, int kt) {
    const uint32_t st = smem_base + stage * S::kStageBytes;
    a_tile.load(st, kt);
    b_tile.load(st + S::kAStageBytes, kt);
  };

  Acc acc[S::kMI][S::kNI][4];
#pragma unroll
  for (int i = 0; i < S::kMI; ++i)
#pragma unroll
    for (int j = 0; j < S::kNI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = Acc(0);

  // Programmatic dependent launch, as gemm_sm80_kernel (no L2 prefetch here): nothing of global memory is touched
  // before the previous kernel has finished.
  wait_prerequisites();

#pragma unroll
  for (int s = 0; s < S::kStages - 1; ++s) {
    if (s < nk) load_tile(s, kt_begin + s);
    cp_async_commit();
  }

  // Fragment addresses of this lane in a stage. K-major: per 32-byte step of b, as gemm_sm80_kernel. MN-major: per
  // m16 tile (a) or n16 pair of tiles (b) at step 0; a step moves whole groups of 8 lines, hence a constant.
  constexpr int kASteps = kW8A16 ? 8 : 4;
  constexpr int kAOffs = kAMn ? S::kMI : kASteps, kBOffs = kBMn ? S::kNI / 2 : 4;
  uint32_t a_frag_off[kAOffs], b_frag_off[kBOffs];
  if constexpr (kBMn) {
    using T = BTile;
#pragma unroll
    for (int jp = 0; jp < S::kNI / 2; ++jp) {
      const int n_first = warp_n * R::kWN + jp * 16;
      if constexpr (kB8) {  // lines 0-31 of the step, one 16-byte chunk of n
        b_frag_off[jp] = mn_tile_offset<Pair::kKTile, T::kChunks>(lane, n_first / 16);
      } else {  // matrices {k 0-7, 8-15} x {n 0-7, 8-15}: b0, b1 of tile 2 jp, then of 2 jp + 1
        const int q = lane >> 3;
        b_frag_off[jp] = mn_tile_offset<Pair::kKTile, T::kChunks>((q & 1) * 8 + (lane & 7), n_first / 8 + (q >> 1));
      }
    }
  } else {
    const int b_row = warp_n * R::kWN + (lane & 7) + ((lane >> 4) << 3);
#pragma unroll
    for (int step = 0; step < 4; ++step) b_frag_off[step] = tile_offset<R::kBN>(b_row, step * 2 + ((lane >> 3) & 1));
  }
  if constexpr (kAMn) {
    using T = ATile;
#pragma unroll
    for (int i = 0; i < S::kMI; ++i) {
      const int m_first = warp_m * R::kWM + i * 16;
      if constexpr (kA8) {
        a_frag_off[i] = mn_tile_offset<Pair::kKTile, T::kChunks>(lane, m_first / 16);
      } else {  // matrices {k 0-7: m 0-7, m 8-15; k 8-15: m 0-7, m 8-15} = a0..a3 (w8a16: k_line order, see top)
        const int q = lane >> 3;
        a_frag_off[i] = mn_tile_offset<Pair::kKTile, T::kChunks>((q >> 1) * 8 + (lane & 7), m_first / 8 + (q & 1));
      }
    }
  } else if constexpr (kW8A16) {
    const int a_row = warp_m * R::kWM + (lane >> 2), t = lane & 3;
#pragma unroll
    for (int q = 0; q < 8; ++q) a_frag_off[q] = tile_offset<R::kBM>(a_row, q * 2 + (t >> 1)) + (t & 1) * 8;
  } else {
    const int a_row = warp_m * R::kWM + (lane & 15);
#pragma unroll
    for (int step = 0; step < 4; ++step) a_frag_off[step] = tile_offset<R::kBM>(a_row, step * 2 + (lane >> 4));
  }

  constexpr int kStepLines = Pair::kKTile / 4;  // k lines per 32-byte step of b
  for (int it = 0; it < nk; ++it) {
    cp_async_wait<S::kStages - 2>();
    __syncthreads();  // tile `it` landed for every thread; stage (it - 1) % kStages is free
    if (it + S::kStages - 1 < nk) load_tile((it + S::kStages - 1) % S::kStages, kt_begin + it + S::kStages - 1);
    cp_async_commit();

    const uint32_t a_st = smem_base + (it % S::kStages) * S::kStageBytes;
    const uint32_t b_st = a_st + S::kAStageBytes;
#pragma unroll
    for (int step = 0; step < 4; ++step) {
      uint32_t b[S::kNI][2];
#pragma unroll
      for (int j = 0; j < S::kNI; j += 2) {
        uint32_t r[4];
        if constexpr (kBMn) {
          ldmatrix_x4_trans(r, b_st + b_frag_off[j / 2] + step * kStepLines * BTile::kLinePitch);
        } else {
          ldmatrix_x4(r, b_st + b_frag_off[step] + j * 8 * 128);
        }
        if constexpr (kBColsPermuted) {
          split_even_odd(r, b[j][0], b[j + 1][0], b[j][1], b[j + 1][1]);  // tiles j, j + 1: even, odd n
        } else {
          b[j][0] = r[0];
          b[j][1] = r[1];
          b[j + 1][0] = r[2];
          b[j + 1][1] = r[3];
        }
      }
      if constexpr (kW8A16) {
        // b: 4 int8 of k (4t .. 4t + 3) per register, in either major; a in the same k order (see sm80_gemm.cuh).
        constexpr bool kF16 = std::is_same<typename Pair::TA, __half>::value;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint32_t bx[S::kNI][2];
#pragma unroll
          for (int j = 0; j < S::kNI; ++j) s8x4_to_16bit<kF16>(b[j][h], bx[j][0], bx[j][1]);
#pragma unroll
          for (int i = 0; i < S::kMI; ++i) {
            uint32_t a[4];
            if constexpr (kAMn) {
              ldmatrix_x4_trans(a, a_st + a_frag_off[i] + (step * kStepLines + h * 16) * ATile::kLinePitch);
            } else {
              const uint32_t at = a_st + a_frag_off[2 * step + h] + i * 16 * 128;  // rows g and g + 8
              uint32_t lo0, hi0, lo1, hi1;
              asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(lo0), "=r"(hi0) : "r"(at));
              asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(lo1), "=r"(hi1) : "r"(at + 8 * 128));
              a[0] = lo0;
              a[1] = lo1;
              a[2] = hi0;
              a[3] = hi1;
            }
#pragma unroll
            for (int j = 0; j < S::kNI; ++j) Pair::mma(acc[i][j], a, bx[j][0], bx[j][1]);
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < S::kMI; ++i) {
          uint32_t a[4];
          if constexpr (kAMn) {
            const uint32_t at = a_st + a_frag_off[i] + step * kStepLines * ATile::kLinePitch;
            if constexpr (kA8) {
              uint32_t r[4];
              ldmatrix_x4_trans(r, at);
              split_even_odd(r, a[0], a[1], a[2], a[3]);  // rows g <-> m 2g, g + 8 <-> m 2g + 1
            } else {
              ldmatrix_x4_trans(a, at);
            }
          } else {
            ldmatrix_x4(a, a_st + a_frag_off[step] + i * 16 * 128);
          }
#pragma unroll
          for (int j = 0; j < S::kNI; ++j) Pair::mma(acc[i][j], a, b[j][0], b[j][1]);
        }
      }
    }
  }
  cp_async_wait<0>();
  launch_dependents();  // past the mainloop: the next kernel may be scheduled (as gemm_sm80_kernel)

  // Epilogue: fragment (i, j) holds slot rows g, g + 8 and slot columns 2t, 2t + 1 of its 16 x 8 block. Slots are
  // the rows / columns themselves, except for 8-bit MN-major operands: row slots g, g + 8 <-> m 2g, 2g + 1 of the
  // 16-row tile; column slots of tiles 2jp, 2jp + 1 <-> even, odd n of the 16 columns of pair jp, so a thread holds
  // columns 4t .. 4t + 3 of each pair (stored as two pairs).
  const int g = lane >> 2, t = lane & 3;
  const bool partial = p.split_k > 1;
  const bool transposed = kMayTranspose && p.transpose_out != 0;
#pragma unroll
  for (int i = 0; i < S::kMI; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + warp_m * R::kWM + i * 16 + (kARowsPermuted ? 2 * g + h : g + 8 * h);
      if (row >= p.m) continue;
#pragma unroll
      for (int j = 0; j < S::kNI; ++j) {
        int col;
        Acc v0, v1;
        if constexpr (kBColsPermuted) {
          const int jp = j / 2, e = j & 1;  // e: the first or the second pair of the thread's 4 columns
          col = n0 + warp_n * R::kWN + jp * 16 + 4 * t + 2 * e;
          v0 = acc[i][2 * jp][2 * h + e];
          v1 = acc[i][2 * jp + 1][2 * h + e];
        } else {
          col = n0 + warp_n * R::kWN + j * 8 + 2 * t;
          v0 = acc[i][j][2 * h];
          v1 = acc[i][j][2 * h + 1];
        }
        if (col >= p.n) continue;
        const bool two = col + 1 < p.n;
        if (transposed) {
          // Kernel (row, col) = output (col, row); p.n / p.m are the output's m / n.
          if (partial) {
            Acc* w = static_cast<Acc*>(p.workspace) + (int64_t(blockIdx.z) * p.n + col) * p.m + row;
            w[0] = v0;
            if (two) w[p.m] = v1;
          } else {
            store_out<Acc>(p, bz, col, row, v0, Acc(0), false);
            if (two) store_out<Acc>(p, bz, col + 1, row, v1, Acc(0), false);
          }
        } else if (partial) {
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

}  // namespace gemm
}  // namespace astrai
