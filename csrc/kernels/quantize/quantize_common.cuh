// Device helpers of the quantize family: 16-element loads of bf16/fp16/fp32, the saturating fp8/int8 casts
// (torch's rounding and NaN rules), amax as ordered bits, and the multiplier of a dynamic scale.
#pragma once

#include <cfloat>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/common/vec_types.cuh"
#include "kernels/quantize/params.h"

namespace astrai {
namespace quantize {

// Elements one thread moves per step: 16 fp8 bytes = one 16-byte store.
constexpr int kStep = 16;

template <QuantIn kIn>
struct InTraits;
template <>
struct InTraits<QuantIn::kBF16> {
  static constexpr int kBytes = 2;
  __device__ __forceinline__ static float to_float(uint16_t bits) { return bf16_lo(bits); }
};
template <>
struct InTraits<QuantIn::kF16> {
  static constexpr int kBytes = 2;
  __device__ __forceinline__ static float to_float(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
};
template <>
struct InTraits<QuantIn::kF32> {
  static constexpr int kBytes = 4;
};

template <QuantOut kOut>
struct OutTraits {
  static constexpr float kMax = kOut == QuantOut::kE4M3 ? 448.0f : kOut == QuantOut::kE5M2 ? 57344.0f : 127.0f;
};

// N (8 or 16) consecutive elements of x starting at `src` as float32. kVec: 16-byte loads (src 16-byte aligned
// and all N valid); else element loads of the first `count` elements, zeros after them.
template <QuantIn kIn, int N, bool kVec>
__device__ __forceinline__ void load_run(const void* src, int count, float (&v)[N]) {
  if constexpr (kIn == QuantIn::kF32) {
    const float* s = static_cast<const float*>(src);
    if constexpr (kVec) {
      load_f32_readonly<N, true>(s, v);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = i < count ? __ldg(s + i) : 0.0f;
    }
  } else {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    if constexpr (kVec) {
#pragma unroll
      for (int j = 0; j < N / 8; ++j) {
        const uint4 w = __ldg(reinterpret_cast<const uint4*>(s) + j);
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          v[8 * j + 2 * k] = InTraits<kIn>::to_float(uint16_t(words[k] & 0xffffu));
          v[8 * j + 2 * k + 1] = InTraits<kIn>::to_float(uint16_t(words[k] >> 16));
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = i < count ? InTraits<kIn>::to_float(__ldg(s + i)) : 0.0f;
    }
  }
}

// N (default: one 16-element step) consecutive elements of x in their own bits: 32-bit words (two 16-bit
// elements per word, low half first; or one float32). Loads land in these words and are converted where they are used, so a thread can keep more
// steps in flight (and in registers) than as float32.
template <QuantIn kIn, int N = kStep>
struct StepWords {
  static constexpr int kCount = N * (kIn == QuantIn::kF32 ? 4 : 2) / 4;  // 16-element step: 16 or 8
};

// Loads N elements (kVec: 16-byte loads, src 16-byte aligned and all N valid; else element loads of the first
// `count` elements, zero bits after them: +0.0 in every input type, as load_run gives).
template <QuantIn kIn, bool kVec, int N = kStep>
__device__ __forceinline__ void load_step_raw(const void* src, int count, uint32_t (&w)[StepWords<kIn, N>::kCount]) {
  constexpr int kWords = StepWords<kIn, N>::kCount;
  if constexpr (kVec) {
#pragma unroll
    for (int j = 0; j < kWords / 4; ++j) {
      const uint4 q = __ldg(reinterpret_cast<const uint4*>(src) + j);
      w[4 * j] = q.x;
      w[4 * j + 1] = q.y;
      w[4 * j + 2] = q.z;
      w[4 * j + 3] = q.w;
    }
  } else if constexpr (kIn == QuantIn::kF32) {
    const uint32_t* s = static_cast<const uint32_t*>(src);
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = i < count ? __ldg(s + i) : 0u;
  } else {
    const uint16_t* s = static_cast<const uint16_t*>(src);
#pragma unroll
    for (int k = 0; k < kWords; ++k) {
      const uint32_t lo = 2 * k < count ? uint32_t(__ldg(s + 2 * k)) : 0u;
      const uint32_t hi = 2 * k + 1 < count ? uint32_t(__ldg(s + 2 * k + 1)) : 0u;
      w[k] = lo | (hi << 16);
    }
  }
}

// The N elements loaded by load_step_raw, as float32 (the values load_run gives).
template <QuantIn kIn, int N = kStep>
__device__ __forceinline__ void unpack_step(const uint32_t (&w)[StepWords<kIn, N>::kCount], float (&v)[N]) {
  if constexpr (kIn == QuantIn::kF32) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = __uint_as_float(w[i]);
  } else {
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      v[2 * k] = InTraits<kIn>::to_float(uint16_t(w[k] & 0xffffu));
      v[2 * k + 1] = InTraits<kIn>::to_float(uint16_t(w[k] >> 16));
    }
  }
}

// Asks for the line holding `ptr` in L2 (no register result, nothing waits for it).
__device__ __forceinline__ void prefetch_l2(const void* ptr) { asm volatile("prefetch.global.L2 [%0];" ::"l"(ptr)); }

// |v| as ordered bits: for non-negative floats the unsigned order is the float order, and every NaN sorts
// above +inf, so a max over these bits is max |x| and propagates NaN (as torch.amax does).
__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

template <int N>
__device__ __forceinline__ uint32_t run_amax_bits(const float (&v)[N]) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) m = max(m, abs_bits(v[i]));
  return m;
}

// Two floats -> two fp8 bytes (`lo` in the low byte), as torch computes `v.clamp(-max, max).to(fp8)`:
// round to nearest even after the clamp; NaN becomes 0x7f (the sign of a NaN is not kept: torch on CUDA
// produces the same byte, as its float multiply returns the canonical positive NaN).
template <QuantOut kOut>
__device__ __forceinline__ uint32_t fp8x2(float lo, float hi) {
  constexpr float kMax = OutTraits<kOut>::kMax;
  const float cl = fminf(fmaxf(lo, -kMax), kMax);
  const float ch = fminf(fmaxf(hi, -kMax), kMax);
  uint32_t r = __nv_cvt_float2_to_fp8x2(make_float2(cl, ch), __NV_SATFINITE,
                                        kOut == QuantOut::kE4M3 ? __NV_E4M3 : __NV_E5M2);
  if (lo != lo) r = (r & 0xff00u) | 0x7fu;
  if (hi != hi) r = (r & 0x00ffu) | 0x7f00u;
  return r;
}

// One float -> an int8 byte: round half to even after the clamp to [-127, 127]; NaN becomes 0.
__device__ __forceinline__ uint32_t int8_of(float v) {
  const float c = fminf(fmaxf(v, -127.0f), 127.0f);
  const int q = v != v ? 0 : int(rintf(c));
  return uint32_t(q) & 0xffu;
}

// Four consecutive values (already multiplied by the scale) -> one little-endian word of output bytes.
template <QuantOut kOut>
__device__ __forceinline__ uint32_t pack4(float a, float b, float c, float d) {
  if constexpr (kOut == QuantOut::kInt8) {
    return int8_of(a) | (int8_of(b) << 8) | (int8_of(c) << 16) | (int8_of(d) << 24);
  } else {
    return fp8x2<kOut>(a, b) | (fp8x2<kOut>(c, d) << 16);
  }
}

// The multiplier of a dynamic scale from an amax, and its reciprocal (what a GEMM multiplies back):
// mul = qmax / amax rounded once (float32); past FLT_MAX (a subnormal amax) it is FLT_MAX, or 2^127 when rounded
// to a power of two; pow2 rounds it down to a power of two (clears the mantissa); amax of 0, inf or NaN gives
// mul = 1. inv = 1 / mul rounded once.
struct ScalePair {
  float mul;
  float inv;
};

__device__ __forceinline__ ScalePair scale_from_amax(float amax, float qmax, bool pow2) {
  if (!(amax > 0.0f) || !(amax <= FLT_MAX)) return ScalePair{1.0f, 1.0f};
  float mul = qmax / amax;
  if (!(mul <= FLT_MAX)) mul = pow2 ? 1.7014118346046923e38f : FLT_MAX;  // 2^127
  if (pow2) mul = __uint_as_float(__float_as_uint(mul) & 0xff800000u);
  return ScalePair{mul, 1.0f / mul};
}

// ---- the delayed-scaling ring fold ------------------------------------------------------------------------

// Float order as unsigned bits (negative values below positive ones), for a max over any float32 values.
__device__ __forceinline__ uint32_t ordered_bits(float v) {
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float from_ordered_bits(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

constexpr int kFoldThreads = 256;  // the fold kernel's block; the most threads fold_ring_block takes

// The ring fold of AmaxHistoryParams (with `amax` as this step's amax) by the `threads` threads of one block
// (a multiple of 32, at most kFoldThreads; every thread calls it, tid in [0, threads)): every thread takes the
// max over its ring slots, with this step's amax in place of the slot it replaces (nobody reads that slot, so
// thread 0 writes it without a race); a NaN anywhere makes the max NaN, as torch.amax.
__device__ __forceinline__ void fold_ring_block(const AmaxHistoryParams& p, float amax, int tid, int threads) {
  __shared__ uint32_t red_max[kFoldThreads / 32];
  __shared__ int red_nan[kFoldThreads / 32];
  const int64_t len = p.len;
  int64_t slot = *p.pos_ptr % len;
  if (slot < 0) slot += len;
  uint32_t m = 0;  // below every ordered float
  int nan = 0;
  for (int64_t i = tid; i < len; i += threads) {
    const float v = i == slot ? amax : p.ring_ptr[i];
    nan |= v != v;
    m = max(m, ordered_bits(v));
  }
  for (int o = 1; o < 32; o <<= 1) {
    m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    nan |= __shfl_xor_sync(0xffffffffu, nan, o);
  }
  if ((tid & 31) == 0) {
    red_max[tid >> 5] = m;
    red_nan[tid >> 5] = nan;
  }
  __syncthreads();
  if (tid != 0) return;
  for (int w = 0; w < threads / 32; ++w) {
    m = max(m, red_max[w]);
    nan |= red_nan[w];
  }
  const float ring_max = nan ? __uint_as_float(0x7fc00000u) : from_ordered_bits(m);
  p.ring_ptr[slot] = amax;
  *p.pos_ptr = slot + 1 == len ? 0 : slot + 1;
  const float mul = scale_from_amax(ring_max, p.qmax, false).mul;
  const float div = p.margin >= 128 ? __uint_as_float(0x7f800000u) : __uint_as_float(uint32_t(127 + p.margin) << 23);
  const float scale = __fdiv_rn(mul, div);
  *p.scale_ptr = scale;
  if (p.scale_inv_ptr != nullptr) *p.scale_inv_ptr = __fdiv_rn(1.0f, scale);
}

// The per-tensor multiplier scale_ptr[0]. With the fused fold the last block overwrites it in this launch, so it
// is read through L2 (ld.global.cg), not the read-only path; `writer` (one thread of the grid) stores this step's
// 1 / multiplier to step_scale_inv_ptr.
__device__ __forceinline__ float tensor_multiplier(const QuantizeParams& p, bool writer) {
  if (p.fold_counter_ptr == nullptr) return __ldg(p.scale_ptr);
  const float mul = __ldcg(p.scale_ptr);
  if (writer && p.step_scale_inv_ptr != nullptr) *p.step_scale_inv_ptr = __fdiv_rn(1.0f, mul);
  return mul;
}

// Fused delayed scaling (QuantizeParams::fold_counter_ptr): called by every thread of every block (tid: the
// thread's index in its block of kThreads, a multiple of 32 up to kFoldThreads) after the block's atomic max
// into amax_ptr[0]; the last block to get here folds the grid's amax into the ring and resets the counter. The
// fences order each block's atomic max before its ticket, and the tickets before the last block's read.
template <int kThreads>
__device__ __forceinline__ void fold_if_last_block(const QuantizeParams& p, int tid) {
  if (p.fold_counter_ptr == nullptr) return;  // grid-uniform
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(p.fold_counter_ptr, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;  // block-uniform
  __threadfence();
  fold_ring_block(p.fold, __ldcg(p.amax_ptr), tid, kThreads);
  if (tid == 0) *p.fold_counter_ptr = 0u;
}

}  // namespace quantize
}  // namespace astrai
