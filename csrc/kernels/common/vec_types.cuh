// Global-memory vector loads/stores and bf16 <-> float32 conversion shared by the kernel families.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>

#include "kernels/common/ptx/math.cuh"

namespace astrai {

// The low and the high bf16 of a bf16x2 word (or a lone bf16's bits) as float32: bf16 is the upper half of a
// float32, so widening is a shift or a mask, and exact.
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// N contiguous bf16 held packed in registers between the load and the use, so a thread can keep several
// runs in flight at half the registers of float32. kVec: 16-byte moves (16-byte aligned, N % 8 == 0);
// else 2-byte moves (any alignment).
template <int N, bool kVec>
struct Bf16Run {
  static_assert(!kVec || N % 8 == 0, "a 16-byte load carries 8 bf16");
  static constexpr int kWords = kVec ? N / 8 : N;
  using Word = typename std::conditional<kVec, uint4, unsigned short>::type;
  Word w[kWords];

  // Streaming (evict-first) loads: activations are read once.
  __device__ __forceinline__ void load_streaming(const __nv_bfloat16* src) {
#pragma unroll
    for (int j = 0; j < kWords; ++j) w[j] = __ldcs(reinterpret_cast<const Word*>(src) + j);
  }

  // Element i as float32; i must be a compile-time constant after unrolling.
  __device__ __forceinline__ float get(int i) const {
    if constexpr (kVec) {
      const uint4& v = w[i / 8];
      const int k = (i % 8) / 2;
      const uint32_t word = k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
      return (i % 2 == 0) ? bf16_lo(word) : bf16_hi(word);
    } else {
      return bf16_lo(w[i]);
    }
  }
};

// N float32 -> N contiguous bf16, each rounded once. kVec: 16-byte stores (same rules as the load).
template <int N, bool kVec>
__device__ __forceinline__ void store_bf16(__nv_bfloat16* dst, const float* src) {
  if constexpr (kVec) {
    static_assert(N % 8 == 0, "a 16-byte store carries 8 bf16");
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
      const float* s = src + 8 * j;
      const uint4 v = make_uint4(pack_bf16x2_rn(s[0], s[1]), pack_bf16x2_rn(s[2], s[3]), pack_bf16x2_rn(s[4], s[5]),
                                 pack_bf16x2_rn(s[6], s[7]));
      reinterpret_cast<uint4*>(dst)[j] = v;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = __float2bfloat16_rn(src[i]);
  }
}

// N contiguous float32 through the read-only path. kVec: 16-byte loads (src 16-byte aligned, N % 4 == 0).
template <int N, bool kVec>
__device__ __forceinline__ void load_f32_readonly(const float* src, float* dst) {
  if constexpr (kVec) {
    static_assert(N % 4 == 0, "a 16-byte load carries 4 float32");
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(src) + j);
      dst[4 * j] = v.x;
      dst[4 * j + 1] = v.y;
      dst[4 * j + 2] = v.z;
      dst[4 * j + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = __ldg(src + i);
  }
}

}  // namespace astrai
