// Shared-memory addresses as the 32-bit offsets the PTX shared-state space takes.
#pragma once

#include <cstdint>

namespace astrai {

// A generic pointer into shared memory as its shared-window address (the operand of ldmatrix, cp.async,
// mbarrier and TMA instructions).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

}  // namespace astrai
