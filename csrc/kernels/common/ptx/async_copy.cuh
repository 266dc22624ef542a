// cp.async (sm_80+): global -> shared copies that bypass the registers, grouped and waited on per thread.
#pragma once

#include <cstdint>

#include "kernels/common/ptx/smem.cuh"

namespace astrai {

// Starts a 16-byte copy src -> dst (both 16-byte aligned; .cg: cached in L2 only); visible to this thread after
// a wait that covers its group.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
#endif
}

// Starts a 4-byte copy (cp.async.ca: .cg takes 16 bytes only; both 4-byte aligned), grouped like cp_async16.
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
#endif
}

// 16-byte copy to the shared address dst of the first `bytes` (0..16) bytes at src, zeros after them (the
// runtime-size zero-fill form: a row's tail, or nothing past a tile's edge; src must be a mapped address).
__device__ __forceinline__ void cp_async16_zfill_bytes(uint32_t dst, const void* src, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
#endif
}

// As cp_async16_zfill_bytes with all 16 bytes when `valid`, none (zeros, src not read) otherwise.
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, bool valid) {
  cp_async16_zfill_bytes(dst, src, valid ? 16 : 0);
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

// One arrival on the mbarrier once every cp.async this thread issued before it has landed (noinc: the arrival
// is counted in the barrier's init count, not added to it).
__device__ __forceinline__ void cp_async_mbarrier_arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
#endif
}

}  // namespace astrai
