// mma.sync tensor-core cells, one warp each: bf16 / fp16 m16n8k16 (sm_80+), s8 m16n8k32 (sm_80+), fp8 m16n8k32
// (sm_89+; the block-scale form on sm_120a).
#pragma once

#include <cstdint>

namespace astrai {

// One cell: d += a b with an m16n8 accumulator. `kind` is the instruction's shape and types after "mma.sync.
// aligned.", `acc` the accumulator's register constraint ("f" fp32, "r" s32); the cell compiles to nothing in
// passes below `min_arch`.
#define ASTRAI_MMA_CELL(name, acc_t, acc, kind, min_arch)                                                        \
  __device__ __forceinline__ void name(acc_t (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {        \
    ASTRAI_MMA_CELL_BODY_##min_arch(acc, kind)                                                                   \
  }
#define ASTRAI_MMA_CELL_ASM(acc, kind)                                                                           \
  asm("mma.sync.aligned." kind " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"              \
      : "+" acc(d[0]), "+" acc(d[1]), "+" acc(d[2]), "+" acc(d[3])                                               \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define ASTRAI_MMA_CELL_BODY_800(acc, kind) ASTRAI_MMA_CELL_ASM(acc, kind)
#else
#define ASTRAI_MMA_CELL_BODY_800(acc, kind)
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define ASTRAI_MMA_CELL_BODY_890(acc, kind) ASTRAI_MMA_CELL_ASM(acc, kind)
#else
#define ASTRAI_MMA_CELL_BODY_890(acc, kind)
#endif

// 16x16 (row-major) A, 16x8 (column-major) B, 16x8 fp32 accumulator. Fragments (g = lane / 4,
// c = 2 (lane % 4)): a = {A[g][c..c+1], A[g+8][c..], A[g][c+8..], A[g+8][c+8..]}, b = {B[c..c+1][g],
// B[c+8..c+9][g]}, d = {D[g][c], D[g][c+1], D[g+8][c], D[g+8][c+1]}.
ASTRAI_MMA_CELL(mma_bf16_16816, float, "f", "m16n8k16.row.col.f32.bf16.bf16.f32", 800)
ASTRAI_MMA_CELL(mma_f16_16816, float, "f", "m16n8k16.row.col.f32.f16.f16.f32", 800)

// 16x32 (row-major) 8-bit A, 32x8 (column-major) B: fragments as the 16-bit cells with 4 bytes per register where
// those have 2: a = {A[g][4t..4t+3], A[g+8][4t..], A[g][4t+16..], A[g+8][4t+16..]}, b = {B[4t..4t+3][g],
// B[4t+16..4t+19][g]} (t = lane % 4); d as there. s8: s32 accumulator with wrapping adds. fp8 (e4m3 / e5m2, A
// and B each either): fp32 accumulator, sm_89 on (the sm_80 pass and the compute_80 PTX compile it to nothing).
ASTRAI_MMA_CELL(mma_s8_16832, int32_t, "r", "m16n8k32.row.col.s32.s8.s8.s32", 800)
ASTRAI_MMA_CELL(mma_e4m3_16832, float, "f", "m16n8k32.row.col.f32.e4m3.e4m3.f32", 890)
ASTRAI_MMA_CELL(mma_e5m2_16832, float, "f", "m16n8k32.row.col.f32.e5m2.e5m2.f32", 890)
ASTRAI_MMA_CELL(mma_e5m2_e4m3_16832, float, "f", "m16n8k32.row.col.f32.e5m2.e4m3.f32", 890)
ASTRAI_MMA_CELL(mma_e4m3_e5m2_16832, float, "f", "m16n8k32.row.col.f32.e4m3.e5m2.f32", 890)

// The fp8 cells a GEMM should call: on sm_120a (RTX 50xx) the plain fp8 mma above decodes at half rate, the
// block-scale form (kind::mxf8f6f4, one UE8M0 scale per row of A / column of B per 32 k) at full rate with the
// same fragments; every scale 0x7F (2^0) makes it the plain product. Every other pass: the plain cell. The scale
// operands are {scale word}, {byte selector, thread selector}: all lanes hold 0x7F7F7F7F, so any selection reads
// a unit scale.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM120_ALL)
#define ASTRAI_MMA_FP8_FULL_RATE(name, types, plain)                                                               \
  __device__ __forceinline__ void name(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {        \
    asm("mma.sync.aligned.kind::mxf8f6f4.block_scale.scale_vec::1X.m16n8k32.row.col.f32." types ".f32.ue8m0 "     \
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}, {%10}, {%11, %11}, {%10}, {%11, %11};\n"  \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                          \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0x7F7F7F7Fu), "n"(0));                \
  }
#else
#define ASTRAI_MMA_FP8_FULL_RATE(name, types, plain)                                                               \
  __device__ __forceinline__ void name(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {        \
    plain(d, a, b0, b1);                                                                                         \
  }
#endif
ASTRAI_MMA_FP8_FULL_RATE(mma_e4m3_16832_full_rate, "e4m3.e4m3", mma_e4m3_16832)
ASTRAI_MMA_FP8_FULL_RATE(mma_e5m2_e4m3_16832_full_rate, "e5m2.e4m3", mma_e5m2_e4m3_16832)
ASTRAI_MMA_FP8_FULL_RATE(mma_e4m3_e5m2_16832_full_rate, "e4m3.e5m2", mma_e4m3_e5m2_16832)
#undef ASTRAI_MMA_FP8_FULL_RATE

#undef ASTRAI_MMA_CELL
#undef ASTRAI_MMA_CELL_ASM
#undef ASTRAI_MMA_CELL_BODY_800
#undef ASTRAI_MMA_CELL_BODY_890

}  // namespace astrai
