// Thread-block clusters (sm_90+): the CTA's rank, the cluster-wide barrier and reads of a peer CTA's shared memory.
#pragma once

#include <cstdint>

#include "kernels/common/ptx/smem.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ASTRAI_CLUSTER_ASM(...) asm volatile(__VA_ARGS__)
#else
#define ASTRAI_CLUSTER_ASM(...) ((void)0)
#endif

namespace astrai {

// This CTA's rank in its cluster (0 without a cluster launch).
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r = 0;
  ASTRAI_CLUSTER_ASM("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster arrives (release: its shared-memory writes are visible to the peers
// after their wait) and waits (acquire). All threads of a warp call it together (.aligned).
__device__ __forceinline__ void cluster_sync() {
  ASTRAI_CLUSTER_ASM("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive() {
  ASTRAI_CLUSTER_ASM("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  ASTRAI_CLUSTER_ASM("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The address in CTA `rank`'s shared memory of the variable this CTA has at shared address `addr`.
__device__ __forceinline__ uint32_t cluster_map_shared(uint32_t addr, uint32_t rank) {
  uint32_t r = addr;
  ASTRAI_CLUSTER_ASM("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}

// 16 bytes at a peer's shared address (from cluster_map_shared).
__device__ __forceinline__ uint4 ld_shared_cluster16(uint32_t addr) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  ASTRAI_CLUSTER_ASM("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(addr)
                     : "memory");
  return v;
}

}  // namespace astrai

#undef ASTRAI_CLUSTER_ASM
