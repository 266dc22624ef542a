// Scalar conversions on the special-function and conversion units: fast exp2, two floats into one bf16x2 word.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>

namespace astrai {

// 2^x with the MUFU approximation (2 ulp, denormals flushed); exp2(-inf) = +0, which is how dropped keys vanish.
__device__ __forceinline__ float fast_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

// Two floats rounded to nearest-even into one bf16x2 word, `lo` in the low half (one cvt.rn.bf16x2.f32). The
// word is the cvt's own register: taking it apart into 16-bit halves and back gives ptxas other code.
__device__ __forceinline__ uint32_t pack_bf16x2_rn(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace astrai
