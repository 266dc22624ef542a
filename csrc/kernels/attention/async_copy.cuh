// Thin wrapper over cp.async (sm_80+): 16-byte global -> shared copies that bypass the registers, grouped
// and waited on per thread. Off the device pass (host parse, CPU emulation) the copy is a plain load/store
// and the group operations are no-ops, so the kernels keep one source.
#pragma once

#include <cstdint>

namespace astrai {
namespace attention {

// Starts a 16-byte copy src -> dst (both 16-byte aligned); visible to this thread after a wait that
// covers its group.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t saddr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(saddr), "l"(src) : "memory");
#else
  *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
#endif
}

// Closes the group of copies this thread started since the last commit (an empty group is fine).
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

}  // namespace attention
}  // namespace astrai
