// Integer and pointer arithmetic of launch shapes and vector-access checks.
#pragma once

#include <cstdint>

namespace astrai {

// Whether ptr is 16-byte aligned (the kernels' 16-byte vector loads and stores, cp.async, TMA bases).
inline bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

// Whether a stride of s bf16 elements keeps 16-byte vectors aligned.
inline bool bf16_vec_stride(int64_t s) { return s % 8 == 0; }

// ceil(a / b) for a >= 0, b > 0.
template <typename T>
constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

}  // namespace astrai
