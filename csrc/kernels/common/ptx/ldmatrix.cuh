// ldmatrix (sm_80+): four 8x8 b16 matrices from shared memory into the mma.sync fragment layout.
#pragma once

#include <cstdint>

namespace astrai {

// ldmatrix_x4: four 8x8 b16 matrices; lane l gives the row address of matrix l / 8, row l % 8. r[i] is matrix
// i's fragment: lane l holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1.
// ldmatrix_x4_trans: the same, each matrix transposed: lane l holds rows 2 (l % 4) and 2 (l % 4) + 1 of column
// l / 4.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define ASTRAI_LDMATRIX_X4(name, shape)                                                       \
  __device__ __forceinline__ void name(uint32_t (&r)[4], uint32_t addr) {                     \
    asm volatile("ldmatrix.sync.aligned." shape ".shared.b16 {%0, %1, %2, %3}, [%4];\n"       \
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                             \
                 : "r"(addr));                                                                \
  }
#else
#define ASTRAI_LDMATRIX_X4(name, shape) \
  __device__ __forceinline__ void name(uint32_t (&)[4], uint32_t) {}
#endif
ASTRAI_LDMATRIX_X4(ldmatrix_x4, "m8n8.x4")
ASTRAI_LDMATRIX_X4(ldmatrix_x4_trans, "m8n8.x4.trans")
#undef ASTRAI_LDMATRIX_X4

}  // namespace astrai
