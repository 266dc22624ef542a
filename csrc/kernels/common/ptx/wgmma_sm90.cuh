// wgmma (sm_90a): warpgroup m64n128k16 bf16 -> fp32 with A from shared memory or registers, the shared-memory
// matrix descriptors (128-byte swizzle) and the fences that order them.
#pragma once

#include <cstdint>

#include "kernels/common/ptx/arch.cuh"

namespace astrai {

// Descriptor of a 128-byte-swizzled shared-memory operand (PTX ISA, "matrix descriptor"): start address,
// leading and stride byte offsets (all >> 4), swizzle mode 1 (128 B) in bits 62-63. The tile's 1024-byte
// swizzle atoms must start 1024-byte aligned (base offset 0). In the 128-byte canonical layouts:
//   K-major  (rows of 64 bf16 along K, 8-row atoms): SBO = bytes between 8-row groups; LBO unused.
//   MN-major (rows of 64 bf16 along MN, one per K index): LBO = bytes between 64-wide MN blocks, SBO = bytes
//            between groups of 8 K indices.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t smem_byte_addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((smem_byte_addr & 0x3ffffu) >> 4) | (uint64_t((lbo >> 4) & 0x3fffu) << 16) |
         (uint64_t((sbo >> 4) & 0x3fffu) << 32) | (uint64_t(1) << 62);
}

// The descriptor of the operand `bytes` further on (a multiple of 16): its start address field is the low 14 bits,
// and shared-memory addresses (< 256 KB, so < 2^14 after >> 4) never carry out of it, so a 32-bit add suffices.
__device__ __forceinline__ uint64_t wgmma_desc_sw128_add(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = uint32_t(desc) + (bytes >> 4), hi = uint32_t(desc >> 32);
  return (uint64_t(hi) << 32) | lo;
}

// Orders this warpgroup's earlier register and shared-memory accesses before the wgmma that follow (needed
// whenever accumulators or register A fragments were written since the last wgmma).
__device__ __forceinline__ void wgmma_fence() {
#if ASTRAI_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if ASTRAI_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most kPending committed wgmma groups of this warpgroup are in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#if ASTRAI_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}
// Keeps the compiler from moving accesses of an accumulator across wgmma issue and wait: the instructions write
// the registers asynchronously, which the asm operands alone do not express.
__device__ __forceinline__ void wgmma_fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void wgmma_fence_operand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void wgmma_fence_operand(int32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// 64 accumulators d[0..63] as read-write asm operands %0..%63 under constraint C ("+f" fp32, "+r" s32).
#define ASTRAI_WGMMA_OPS64(C, d) \
  C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), C(d[8]), C(d[9]), C(d[10]), C(d[11]), \
  C(d[12]), C(d[13]), C(d[14]), C(d[15]), C(d[16]), C(d[17]), C(d[18]), C(d[19]), C(d[20]), C(d[21]), C(d[22]), \
  C(d[23]), C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]), C(d[30]), C(d[31]), C(d[32]), C(d[33]), \
  C(d[34]), C(d[35]), C(d[36]), C(d[37]), C(d[38]), C(d[39]), C(d[40]), C(d[41]), C(d[42]), C(d[43]), C(d[44]), \
  C(d[45]), C(d[46]), C(d[47]), C(d[48]), C(d[49]), C(d[50]), C(d[51]), C(d[52]), C(d[53]), C(d[54]), C(d[55]), \
  C(d[56]), C(d[57]), C(d[58]), C(d[59]), C(d[60]), C(d[61]), C(d[62]), C(d[63])
// The 64 fp32 accumulators of an m64n128 wgmma.
#define ASTRAI_WGMMA_D64(d) ASTRAI_WGMMA_OPS64("+f", d)

// D (64 x 128 fp32, per thread 64 values) = A (64 x 16, shared, K-major) B (16 x 128, shared, K-major) + D if
// accumulate. Accumulator layout: thread (warp w of the warpgroup, lane 4 g + t) holds d[4 n + e] = D[16 w + g +
// 8 (e / 2)][8 n + 2 t + e % 2], n = 0..15.
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                     bool accumulate) {
#if ASTRAI_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : ASTRAI_WGMMA_D64(d)
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)));
#endif
}

// The rs-form m64n128k16 wgmma into fp32 accumulators d from A fragment a (registers) and B descriptor desc_b, d
// kept where accumulate: `types` the A / B type suffix ("bf16.bf16"), `trans_b` B's transpose immediate ("1": B
// MN-major).
#define ASTRAI_WGMMA_M64N128K16_RS(types, trans_b)                                         \
  asm volatile(                                                                             \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                         \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." types " "                              \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "             \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "    \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "    \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "   \
      "{%64, %65, %66, %67}, %68, p, 1, 1, " trans_b ";\n}\n"                               \
      : ASTRAI_WGMMA_D64(d)                                                                 \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)))

// D (64 x 128 fp32) = A (64 x 16 bf16, registers) B (16 x 128, shared, MN-major: rows of N along K) + D if
// accumulate. a holds the mma.sync m16n8k16 A fragment of this warp's 16 rows: {A[g][2t..], A[g+8][2t..],
// A[g][2t+8..], A[g+8][2t+8..]} as bf16x2. The registers must stay unchanged until the group completes.
__device__ __forceinline__ void wgmma_m64n128k16_rs_tnspb(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                                          bool accumulate) {
#if ASTRAI_WGMMA
  ASTRAI_WGMMA_M64N128K16_RS("bf16.bf16", "1");
#endif
}

// D (64 x 128 fp32) = A (64 x 16, registers) B (16 x 128, shared, K-major, 128-byte swizzle) + D if accumulate;
// A and B both bf16 (kF16: both fp16). a holds the mma.sync m16n8k16 A fragment of this warp's 16 rows, as in
// wgmma_m64n128k16_rs_tnspb; the registers must stay unchanged until the group completes.
template <bool kF16>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                                    bool accumulate) {
#if ASTRAI_WGMMA
  if constexpr (kF16) {
    ASTRAI_WGMMA_M64N128K16_RS("f16.f16", "0");
  } else {
    ASTRAI_WGMMA_M64N128K16_RS("bf16.bf16", "0");
  }
#endif
}
#undef ASTRAI_WGMMA_M64N128K16_RS

// The 32 fp32 accumulators of an m64n64 wgmma as read-write asm operands %0..%31.
#define ASTRAI_WGMMA_D32(d)                                                                                         \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),      \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),       \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),      \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define ASTRAI_WGMMA_M64N64K16_RS(types)                                                          \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." types " "                                      \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                    \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "          \
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"                                                \
      : ASTRAI_WGMMA_D32(d)                                                                        \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)))

// D (64 x 64 fp32, per thread 32 values) = A (64 x 16, registers) B (16 x 64, shared, K-major, 128-byte swizzle) + D
// if accumulate; bf16 (kF16: fp16) inputs, A's fragment as in wgmma_m64n128k16_rs. Accumulator layout as the m64n128
// form's, n = 0..7.
template <bool kF16>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                                   bool accumulate) {
#if ASTRAI_WGMMA
  if constexpr (kF16) {
    ASTRAI_WGMMA_M64N64K16_RS("f16.f16");
  } else {
    ASTRAI_WGMMA_M64N64K16_RS("bf16.bf16");
  }
#endif
}
#undef ASTRAI_WGMMA_M64N64K16_RS
#undef ASTRAI_WGMMA_D32

}  // namespace astrai
