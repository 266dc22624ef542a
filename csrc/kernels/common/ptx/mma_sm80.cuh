// mma.sync tensor-core cells, one warp each: bf16 m16n8k16 (sm_80+), s8 m16n8k32 (sm_80+), fp8 m16n8k32 (sm_89+).
#pragma once

#include <cstdint>

namespace astrai {

// d += a b for a 16x16 (row-major) bf16 A, a 16x8 (column-major) bf16 B and a 16x8 fp32 accumulator.
// Fragments (g = lane / 4, c = 2 (lane % 4)): a = {A[g][c..c+1], A[g+8][c..], A[g][c+8..], A[g+8][c+8..]},
// b = {B[c..c+1][g], B[c+8..c+9][g]}, d = {D[g][c], D[g][c+1], D[g+8][c], D[g+8][c+1]}.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// d += a b for a 16x32 (row-major) s8 A, a 32x8 (column-major) s8 B and a 16x8 s32 accumulator (wrapping adds).
// Fragments as mma_bf16_16816 with 4 bytes per register where bf16 has 2: a = {A[g][4t..4t+3], A[g+8][4t..],
// A[g][4t+16..], A[g+8][4t+16..]}, b = {B[4t..4t+3][g], B[4t+16..4t+19][g]} (t = lane % 4); d as there.
__device__ __forceinline__ void mma_s8_16832(int32_t (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// d += a b for fp8 A (16x32, row-major) and B (32x8, column-major) of the formats kA / kB ("e4m3" or "e5m2")
// and a 16x8 fp32 accumulator; fragments as mma_s8_16832. The fp8 mma.sync shapes exist from sm_89 on: the
// sm_80 pass and the compute_80 PTX compile this to nothing.
#define ASTRAI_MMA_FP8_16832(name, kA, kB)                                                                        \
  __device__ __forceinline__ void name(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {         \
    ASTRAI_MMA_FP8_16832_BODY(kA, kB)                                                                             \
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define ASTRAI_MMA_FP8_16832_BODY(kA, kB)                                                                         \
  asm("mma.sync.aligned.m16n8k32.row.col.f32." kA "." kB ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "    \
      "{%0, %1, %2, %3};\n"                                                                                       \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                            \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
#define ASTRAI_MMA_FP8_16832_BODY(kA, kB)
#endif
ASTRAI_MMA_FP8_16832(mma_e4m3_16832, "e4m3", "e4m3")
ASTRAI_MMA_FP8_16832(mma_e5m2_16832, "e5m2", "e5m2")
#undef ASTRAI_MMA_FP8_16832
#undef ASTRAI_MMA_FP8_16832_BODY

}  // namespace astrai
