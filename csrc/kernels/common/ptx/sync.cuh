// Block-level synchronization beyond __syncthreads: named barriers, register reallocation, the async-proxy fence.
#pragma once

#include "kernels/common/ptx/arch.cuh"

namespace astrai {

// Named barriers (ids 1..15; 0 is __syncthreads): sync waits for `count` arrivals including this warp's, arrive
// counts this warp without waiting.
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Register reallocation between warpgroups (sm_90a; the kernel needs a register cap at entry:
// __launch_bounds__(n, 1)).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
#if ASTRAI_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
#if ASTRAI_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// Shared memory written by ordinary stores or cp.async and read next by the async proxy (wgmma, a TMA store): each writing
// thread fences after its writes land, before the barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async_smem() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

}  // namespace astrai
