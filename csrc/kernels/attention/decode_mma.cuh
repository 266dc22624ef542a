// Warp-level PTX the split-KV decode uses (sm_80+): the tensor-core primitives shared with the prefill
// (mma_bf16_sm80.cuh) under the decode's names, and the programmatic-dependent-launch controls of sm_90.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "kernels/attention/mma_bf16_sm80.cuh"

namespace astrai {
namespace attention {
namespace decode_ptx {

// The shared sm_80 primitives (mma_bf16_sm80.cuh) under the names the decode kernel uses.
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return smem_addr(p); }
using attention::ldmatrix_x4;
using attention::ldmatrix_x4_trans;

// d += A B (bf16 m16n8k16, fp32 accumulators), A's fragment passed as four registers.
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
  const uint32_t a[4] = {a0, a1, a2, a3};
  mma_bf16_16816(d, a, b0, b1);
}

// 2^x on the MUFU; exp2(-inf) = +0, which is how dropped keys vanish.
__device__ __forceinline__ float exp2_approx(float x) { return fast_exp2(x); }

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
