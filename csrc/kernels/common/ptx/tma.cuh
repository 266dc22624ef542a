// TMA (sm_90+): tiled bulk tensor copies between global memory (through a CUtensorMap) and shared memory.
#pragma once

#include <cstdint>

#include "kernels/common/ptx/smem.cuh"

// The map is a __grid_constant__ kernel parameter (or in global memory); coordinates are in elements, innermost
// first. Loads land in shared memory laid out as the map says (swizzle included) and complete their bytes on an
// mbarrier (mbarrier_arrive_expect_tx); a box partly outside the tensor is filled with zeros.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ASTRAI_TMA_ASM(...) asm volatile(__VA_ARGS__)
#else
#define ASTRAI_TMA_ASM(...) ((void)0)
#endif

namespace astrai {

__device__ __forceinline__ uint64_t tma_map_addr(const void* map) { return reinterpret_cast<uint64_t>(map); }

__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, uint64_t* bar, int c0, int c1) {
  ASTRAI_TMA_ASM(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];\n" ::"r"(dst),
      "l"(tma_map_addr(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}

__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, uint64_t* bar, int c0, int c1, int c2) {
  ASTRAI_TMA_ASM(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(tma_map_addr(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_addr(bar))
      : "memory");
}

__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void* map, uint64_t* bar, int c0, int c1, int c2,
                                            int c3) {
  ASTRAI_TMA_ASM(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6];\n" ::"r"(dst),
      "l"(tma_map_addr(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
      : "memory");
}

// Stores the box at the coordinates from shared memory at src (the async proxy reads it: fence_proxy_async_smem
// after the writes that filled it); the part outside the tensor is not written. Tracked per thread in bulk groups.
__device__ __forceinline__ void tma_store_2d(const void* map, uint32_t src, int c0, int c1) {
  ASTRAI_TMA_ASM("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                     tma_map_addr(map)),
                 "r"(c0), "r"(c1), "r"(src)
                 : "memory");
}

__device__ __forceinline__ void tma_store_3d(const void* map, uint32_t src, int c0, int c1, int c2) {
  ASTRAI_TMA_ASM("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                     tma_map_addr(map)),
                 "r"(c0), "r"(c1), "r"(c2), "r"(src)
                 : "memory");
}

// Closes this thread's bulk group of the stores issued since the last commit.
__device__ __forceinline__ void tma_store_commit() { ASTRAI_TMA_ASM("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until at most kPending of this thread's store groups still read their shared memory (.read: the source
// may be overwritten then; the global writes may still be in flight, and are complete at kernel exit).
template <int kPending>
__device__ __forceinline__ void tma_store_wait() {
  ASTRAI_TMA_ASM("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Asks for the box at the coordinates in L2, with no shared-memory destination and nothing to wait on.
__device__ __forceinline__ void tma_prefetch_2d(const void* map, int c0, int c1) {
  ASTRAI_TMA_ASM("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];\n" ::"l"(tma_map_addr(map)),
                 "r"(c0), "r"(c1)
                 : "memory");
}

__device__ __forceinline__ void tma_prefetch_3d(const void* map, int c0, int c1, int c2) {
  ASTRAI_TMA_ASM("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];\n" ::"l"(tma_map_addr(map)),
                 "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}

}  // namespace astrai

#undef ASTRAI_TMA_ASM
