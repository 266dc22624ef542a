// mbarriers in shared memory: init, arrivals (plain and with an expected transaction count), the phase wait.
#pragma once

#include <cstdint>

#include "kernels/common/ptx/smem.cuh"

namespace astrai {

// Initializes an mbarrier (8 bytes of shared memory, 8-byte aligned) expecting `count` arrivals per phase.
// Publish with a block barrier before any other thread uses it.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
#endif
}

// Makes the mbarrier_init of this thread visible to the async proxy (TMA's completions) and to the cluster; call
// once after the inits, before the block barrier that publishes them.
__device__ __forceinline__ void mbarrier_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// One arrival (release: this thread's earlier shared-memory writes are visible to a thread that waits the phase).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
#endif
}

// One arrival that also expects `bytes` more of asynchronous (TMA) transfer in the current phase (sm_90+).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
#endif
}

// Waits (acquire) until the phase of parity `parity` has completed. try_wait (sm_90+) suspends the thread for a
// while in hardware before it reports "not yet", so the loop does not spin on the barrier.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
#endif
}

// mbarrier_wait with a suspend-time hint: the thread sleeps in hardware until the phase completes (or the hint's
// time passes) instead of re-polling, so waiting warps do not contend with the barrier's other users (a GEMM's
// 256 consumer threads against the TMA's transaction updates and the wgmma's shared-memory reads).
__device__ __forceinline__ void mbarrier_wait_sleep(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr uint32_t kSuspendNs = 10000000;
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity), "r"(kSuspendNs)
      : "memory");
#endif
}

}  // namespace astrai
