// Warp-level tensor-core primitives for sm_80+: ldmatrix (plain and transposed), bf16 m16n8k16 mma with fp32
// accumulators, fast exp2, and the 128-byte XOR swizzle of shared-memory tiles. Off the device pass the bodies are
// empty (the host compiler only parses them), except under ASTRAI_HOST_EMULATION, where a host harness that runs
// the kernels on CPU threads supplies the warp-collective ldmatrix and mma (a developer harness of 2026-11-29, not
// kept in the repository: the hooks stay so that one can be rebuilt).
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>

#if !defined(__CUDA_ARCH__) && defined(ASTRAI_HOST_EMULATION)
void astrai_emu_ldmatrix_x4(uint32_t (&r)[4], uint32_t addr, bool trans);
void astrai_emu_mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
#endif

namespace astrai {
namespace attention {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8, row l % 8. r[i] is matrix i's fragment:
// lane l holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#elif defined(ASTRAI_HOST_EMULATION)
  astrai_emu_ldmatrix_x4(r, addr, false);
#endif
}

// As ldmatrix_x4, each matrix transposed: lane l holds rows 2 (l % 4) and 2 (l % 4) + 1 of column l / 4.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#elif defined(ASTRAI_HOST_EMULATION)
  astrai_emu_ldmatrix_x4(r, addr, true);
#endif
}

// d += a b for a 16x16 (row-major) bf16 A, a 16x8 (column-major) bf16 B and a 16x8 fp32 accumulator.
// Fragments (g = lane / 4, c = 2 (lane % 4)): a = {A[g][c..c+1], A[g+8][c..], A[g][c+8..], A[g+8][c+8..]},
// b = {B[c..c+1][g], B[c+8..c+9][g]}, d = {D[g][c], D[g][c+1], D[g+8][c], D[g+8][c+1]}.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(ASTRAI_HOST_EMULATION)
  astrai_emu_mma_16816(d, a, b0, b1);
#endif
}

// Starts a 4-byte global -> shared copy (cp.async.ca; both 4-byte aligned), grouped and waited on like
// cp_async16 (async_copy.cuh). Off the device pass: a plain copy.
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
#else
  *static_cast<uint32_t*>(dst) = *static_cast<const uint32_t*>(src);
#endif
}

// 2^x with the MUFU approximation (2 ulp); exp2(-inf) = +0, which is how dropped keys vanish.
__device__ __forceinline__ float fast_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

// Two floats rounded to nearest-even into one bf16x2 word, `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2_rn(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

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

}  // namespace attention
}  // namespace astrai
