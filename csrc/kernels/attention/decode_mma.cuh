// Warp-level PTX the split-KV decode uses (sm_80+): ldmatrix, bf16 m16n8k16 mma, MUFU exp2, and the
// programmatic-dependent-launch controls of sm_90. Off the device pass the bodies are empty (host parse only).
// Kept in their own namespace so that the prefill's primitives of the same purpose never collide.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

namespace astrai {
namespace attention {
namespace decode_ptx {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8. r[i] is matrix i's
// fragment: lane l holds its row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (low half first).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

// As ldmatrix_x4 with each matrix transposed: lane l holds rows 2 (l % 4) and 2 (l % 4) + 1 of column l / 4.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

// d += A B: A 16x16 bf16 row-major, B 16x8 bf16 column-major, d 16x8 fp32. With g = lane / 4, c = 2 (lane % 4):
// a = {A[g][c..c+1], A[g+8][c..c+1], A[g][c+8..c+9], A[g+8][c+8..c+9]}, b = {B[c..c+1][g], B[c+8..c+9][g]},
// d = {D[g][c], D[g][c+1], D[g+8][c], D[g+8][c+1]}.
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// 2^x on the MUFU (relative error ~2^-22); exp2(-inf) = +0, which is how dropped keys vanish.
__device__ __forceinline__ float exp2_approx(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return x;
#endif
}

// Programmatic dependent launch (sm_90+): the dependent grid (the combine) may be scheduled once every block
// of this grid has called launch_dependents; wait_prerequisites blocks until the prerequisite grids have
// completed and their writes are visible. No-ops below sm_90 (the host never asks for PDL there).
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_prerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace decode_ptx
}  // namespace attention
}  // namespace astrai
