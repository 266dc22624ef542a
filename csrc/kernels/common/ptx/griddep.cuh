// Programmatic dependent launch (griddepcontrol, sm_90+): overlap a kernel's launch with its predecessor's tail.
#pragma once

namespace astrai {

// The dependent grid may be scheduled once every block of this grid has called launch_dependents (or exited).
// A no-op below sm_90 and when the grid was launched without the programmatic-serialization attribute.
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Blocks until the prerequisite grids have completed and their writes are visible; a no-op below sm_90 and
// without a prerequisite. Loads the compiler treats as constant (__ldg, .nc) may still be hoisted above it.
__device__ __forceinline__ void wait_prerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Asks for the 128-byte line holding `p` in L2 (no register, nothing to wait on). The one global access a kernel
// may make before wait_prerequisites(): L2 is the device's point of coherence, so a line fetched early is updated by
// the prerequisite grid's later writes, and the reads after the wait see them. `p` must lie inside an allocation.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

}  // namespace astrai
