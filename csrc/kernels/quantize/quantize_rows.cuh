// Row-major quantization (layout 0): static multipliers (per tensor, row, column, or from a per-tensor amax),
// dynamic per row in one pass, dynamic 1 x 128 groups; optional fused amax; fp8 e4m3/e5m2 or int8 out.
#pragma once

#include <cstdint>

#include "kernels/quantize/params.h"
#include "kernels/quantize/quantize_common.cuh"

namespace astrai {
namespace quantize {

constexpr int kRowsBlockThreads = 256;
constexpr int kRowsMaxWarps = kRowsBlockThreads / 32;
// Steps (16 elements) of a row a thread keeps in registers, in x's own bits, between the amax and the cast of
// dynamic per-row quantization; later steps of longer rows are read again (from L1/L2: the row was just read).
// The launcher picks the fewest threads per row that hold the row this way: two warps for N = 4096 (16-bit x,
// 4 steps = 32 words = 128 bytes per thread, 4 blocks per SM) or one warp for N = 2048 float32 (4 steps = 64
// words, 2 blocks). 4 steps beat 8 (one warp, 2 blocks per SM) and 2 (four warps): docs/benchmarks.md, quantize
// section.
constexpr int row_cache_steps(QuantIn /*in*/) { return 4; }
// Threads that share one 1 x 128 group (8 x 16 elements): consecutive lanes.
constexpr int kGroupLanes = 8;
// Steps per loop iteration of the static and group paths, all loaded (in x's own bits) before the first
// store: 4 x 32 bytes of bf16 in flight per thread.
constexpr int kUnroll = 4;

// Work layout:
//   threadIdx.x: step of the row (16 consecutive elements), looping by blockDim.x (a power of two, 8..256;
//                the launcher picks the smallest that covers the row in kUnroll steps per thread)
//   threadIdx.y, blockIdx.x: row (grid-stride loop; the trip count is uniform across the block, so the
//   shuffles and barriers below are reached by every thread)
// kVec: 16-byte loads and stores (x 16-byte aligned, row stride and cols multiples of 16 bytes/elements);
// else element moves, any alignment and any cols.
// kMode selects the code the kernel carries (registers): per-tensor / per-row / from-amax multipliers, dynamic
// per row, 1 x 128 groups, or per-column multipliers.
enum class RowsMode : int { kStatic = 0, kDynamicRow = 1, kGroup = 2, kColumn = 3 };

// Blocks per SM the compiler must fit (its register cap: 2 -> 128, 4 -> 64 per thread). 4 where the code fits
// 64 registers (bf16, 16-byte moves; static, group and dynamic-row multipliers; sm_80 and sm_120 spill a few
// bytes there): 1024 threads x 128 bytes of loads in flight per SM; 2 elsewhere.
// The same on every arch: it is a template argument, and a host pass that names an instantiation some device
// pass did not build is undefined (a per-arch choice fails these launches with cudaErrorInvalidDeviceFunction).
constexpr bool kRowsFourBlocks = true;
template <QuantIn kIn, bool kVec, RowsMode kMode>
constexpr int rows_min_blocks() {
  return kRowsFourBlocks && kIn == QuantIn::kBF16 && kVec &&
                 (kMode == RowsMode::kStatic || kMode == RowsMode::kGroup || kMode == RowsMode::kDynamicRow)
             ? 4
             : 2;
}

// Dynamic rows: while a warp reduces, casts and stores its row, the row of its next grid-stride iteration is
// prefetched into L2, so DRAM keeps streaming between a warp's load and store phases (with the register cache
// holding one row per warp, 2 x 8 warps per SM, 4096 x 4096 bf16 is only ~2 rows per warp: without it, the
// loads of the second row waited for the first row's stores). Off: the prefetch with its persistent grid was
// slower at both sizes swept (docs/benchmarks.md, quantize section); kept for the sweep.
template <RowsMode kMode>
constexpr bool rows_prefetch_default() {
  return false;
}

// kMinBlocks, kPrefetch, kCache: the register cap, the prefetch above and the steps a thread caches for dynamic
// rows (other values for the sweep, csrc/tools/quantize_launch_sweep.cu). kFold: the fused delayed-scaling fold
// (QuantizeParams::fold_counter_ptr; static per-tensor multiplier only), a separate instantiation so that the
// kernels without it keep their register allocation.
template <QuantIn kIn, QuantOut kOut, bool kVec, RowsMode kMode, int kMinBlocks = rows_min_blocks<kIn, kVec, kMode>(),
          bool kPrefetch = rows_prefetch_default<kMode>(), int kCache = row_cache_steps(kIn), bool kFold = false>
__global__ void __launch_bounds__(kRowsBlockThreads, kMinBlocks) quantize_rows_kernel(const __grid_constant__ QuantizeParams p) {
  constexpr int kInBytes = kIn == QuantIn::kF32 ? 4 : 2;
  const int tpr = int(blockDim.x);  // threads per row
  const int tx = int(threadIdx.x);
  const int ty = int(threadIdx.y);
  const int tid = ty * tpr + tx;
  const int lane = tid & 31;
  const int64_t cols = p.cols;
  const int64_t steps = (cols + kStep - 1) / kStep;
  const int64_t row_step = int64_t(gridDim.x) * blockDim.y;
  const QuantScale kind = kMode == RowsMode::kDynamicRow ? QuantScale::kDynamicRow
                          : kMode == RowsMode::kGroup    ? QuantScale::kDynamicGroup
                          : kMode == RowsMode::kColumn   ? QuantScale::kColumn
                                                         : p.scale_kind;
  const char* x = static_cast<const char*>(p.x_ptr);
  uint8_t* out = static_cast<uint8_t*>(p.out_ptr);
  __shared__ uint32_t red[kRowsMaxWarps];

  // Max over the tpr threads of one row (every thread of the block calls it).
  auto row_max = [&](uint32_t v) -> uint32_t {
    const int width = tpr < 32 ? tpr : 32;
    for (int o = 1; o < width; o <<= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (tpr > 32) {
      __syncthreads();  // the previous row's readers are done with red
      if (lane == 0) red[tid >> 5] = v;
      __syncthreads();
      const int warps_per_row = tpr >> 5;
      v = 0;
      for (int w = 0; w < warps_per_row; ++w) v = max(v, red[ty * warps_per_row + w]);
    }
    return v;
  };

  float mul_tensor = 1.0f;  // kTensor / kFromAmax: one multiplier for everything
  if (kind == QuantScale::kTensor) {
    if constexpr (kFold) mul_tensor = tensor_multiplier(p, blockIdx.x == 0 && tid == 0);
    else mul_tensor = __ldg(p.scale_ptr);
  }
  if (kind == QuantScale::kFromAmax) {
    const ScalePair s = scale_from_amax(__ldg(p.amax_in_ptr), p.qmax, p.pow2_scale);
    mul_tensor = s.mul;
    if (blockIdx.x == 0 && tid == 0 && p.scale_inv_ptr != nullptr) p.scale_inv_ptr[0] = s.inv;
  }

  uint32_t tensor_amax = 0;
  for (int64_t row0 = int64_t(blockIdx.x) * blockDim.y; row0 < p.rows; row0 += row_step) {
    const int64_t row = row0 + ty;
    const bool valid = row < p.rows;
    const char* x_row = x + row * p.x_row_stride * kInBytes;
    uint8_t* out_row = out + row * cols;

    // Converts one step (v already loaded) with multiplier(s) and stores it.
    auto emit = [&](int64_t c, float (&v)[kStep], const float* muls, float mul) {
      const int count = int(cols - c * kStep < kStep ? cols - c * kStep : kStep);
      float y[kStep];
#pragma unroll
      for (int i = 0; i < kStep; ++i) y[i] = v[i] * (muls ? muls[i] : mul);
      uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = pack4<kOut>(y[4 * k], y[4 * k + 1], y[4 * k + 2], y[4 * k + 3]);
      uint8_t* dst = out_row + c * kStep;
      if constexpr (kVec) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
#pragma unroll
        for (int i = 0; i < kStep; ++i) {
          if (i < count) dst[i] = uint8_t(w[i >> 2] >> (8 * (i & 3)));
        }
      }
    };
    auto load = [&](int64_t c, float (&v)[kStep]) {
      const int count = int(cols - c * kStep < kStep ? cols - c * kStep : kStep);
      load_run<kIn, kStep, kVec>(x_row + c * kStep * kInBytes, count, v);
    };

    if constexpr (kMode == RowsMode::kDynamicRow) {
      // Pass 1: amax of the row; the first kCache steps of each thread are loaded together and kept in
      // registers as x's bits.
      constexpr int kWords = StepWords<kIn>::kCount;
      uint32_t cache[kCache][kWords];
#pragma unroll
      for (int s = 0; s < kCache; ++s) {
        const int64_t c = tx + int64_t(s) * tpr;
        if (valid && c < steps) {
          const int count = int(cols - c * kStep < kStep ? cols - c * kStep : kStep);
          load_step_raw<kIn, kVec>(x_row + c * kStep * kInBytes, count, cache[s]);
        } else {
#pragma unroll
          for (int k = 0; k < kWords; ++k) cache[s][k] = 0u;  // +0.0: no effect on the amax, never stored
        }
      }
      if constexpr (kPrefetch) {
        const int64_t next = row + row_step;
        if (next < p.rows) {
          const char* next_row = x + next * p.x_row_stride * kInBytes;
          for (int64_t c = tx; c < steps; c += tpr) prefetch_l2(next_row + c * kStep * kInBytes);
        }
      }
      uint32_t m = 0;
#pragma unroll
      for (int s = 0; s < kCache; ++s) {
        float v[kStep];
        unpack_step<kIn>(cache[s], v);
        m = max(m, run_amax_bits(v));
      }
      for (int64_t c = tx + int64_t(kCache) * tpr; valid && c < steps; c += tpr) {
        float v[kStep];
        load(c, v);
        m = max(m, run_amax_bits(v));
      }
      m = row_max(m);
      tensor_amax = max(tensor_amax, m);
      const ScalePair s = scale_from_amax(__uint_as_float(m), p.qmax, p.pow2_scale);
      if (valid && tx == 0) {
        if (p.scale_inv_ptr != nullptr) p.scale_inv_ptr[row] = s.inv;
        if (p.amax_kind == QuantAmax::kRow) p.amax_ptr[row] = __uint_as_float(m);
      }
      // Pass 2: cast. The empty asm makes the words opaque, so the compiler converts them again here rather
      // than keeping pass 1's float32 values (twice the registers) alive across the reduction.
#pragma unroll
      for (int k = 0; k < kCache; ++k) {
#pragma unroll
        for (int q = 0; q < kWords; ++q) asm volatile("" : "+r"(cache[k][q]));
      }
#pragma unroll
      for (int k = 0; k < kCache; ++k) {
        const int64_t c = tx + int64_t(k) * tpr;
        if (valid && c < steps) {
          float v[kStep];
          unpack_step<kIn>(cache[k], v);
          emit(c, v, nullptr, s.mul);
        }
      }
      for (int64_t c = tx + int64_t(kCache) * tpr; valid && c < steps; c += tpr) {
        float v[kStep];
        load(c, v);
        emit(c, v, nullptr, s.mul);
      }
      continue;
    } else {

    const float mul_row = kind == QuantScale::kRow && valid ? __ldg(p.scale_ptr + row) : mul_tensor;
    uint32_t m = 0;
    // kUnroll steps per iteration, all loads issued before the first store. The loop runs the same number
    // of times in every thread of the block (group shuffles need full warps).
    for (int64_t base = 0; base < steps; base += int64_t(kUnroll) * tpr) {
      constexpr int kWords = StepWords<kIn>::kCount;
      uint32_t raw[kUnroll][kWords];
      bool act[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = base + tx + int64_t(u) * tpr;
        act[u] = valid && c < steps;
        if (act[u]) {
          const int count = int(cols - c * kStep < kStep ? cols - c * kStep : kStep);
          load_step_raw<kIn, kVec>(x_row + c * kStep * kInBytes, count, raw[u]);
        } else {
#pragma unroll
          for (int k = 0; k < kWords; ++k) raw[u][k] = 0u;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = base + tx + int64_t(u) * tpr;
        float v[kStep];
        unpack_step<kIn>(raw[u], v);
        const uint32_t step_amax = run_amax_bits(v);
        m = max(m, step_amax);
        if constexpr (kMode == RowsMode::kGroup) {
          // group_cols == 128: 8 consecutive lanes hold one group (tpr is a multiple of 8).
          uint32_t g = step_amax;
#pragma unroll
          for (int o = 1; o < kGroupLanes; o <<= 1) g = max(g, __shfl_xor_sync(0xffffffffu, g, o));
          const ScalePair s = scale_from_amax(__uint_as_float(g), p.qmax, p.pow2_scale);
          if (act[u]) {
            if ((c & (kGroupLanes - 1)) == 0) {
              p.scale_inv_ptr[row * p.scale_inv_row_stride + (c / kGroupLanes) * p.scale_inv_group_stride] = s.inv;
            }
            emit(c, v, nullptr, s.mul);
          }
        } else if (act[u]) {
          if constexpr (kMode == RowsMode::kColumn) {
            float muls[kStep];
            const int count = int(cols - c * kStep < kStep ? cols - c * kStep : kStep);
#pragma unroll
            for (int i = 0; i < kStep; ++i) muls[i] = i < count ? __ldg(p.scale_ptr + c * kStep + i) : 0.0f;
            emit(c, v, muls, 1.0f);
          } else {
            emit(c, v, nullptr, mul_row);
          }
        }
      }
    }
    tensor_amax = max(tensor_amax, m);
    if (p.amax_kind == QuantAmax::kRow) {
      m = row_max(m);
      if (valid && tx == 0) p.amax_ptr[row] = __uint_as_float(m);
    }
    }  // static kinds and groups
  }

  if (p.amax_kind == QuantAmax::kTensor) {
    uint32_t v = tensor_amax;
    for (int o = 1; o < 32; o <<= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) red[tid >> 5] = v;
    __syncthreads();
    if (tid == 0) {
      const int warps = int(blockDim.x * blockDim.y) >> 5;
      for (int w = 0; w < warps; ++w) v = max(v, red[w]);
      if (v != 0) atomicMax(reinterpret_cast<unsigned int*>(p.amax_ptr), v);
    }
    if constexpr (kFold) fold_if_last_block<kRowsBlockThreads>(p, tid);
  }
}

// Per-tensor amax of x (first pass of dynamic per-tensor quantization): grid-stride over 16-element steps.
template <QuantIn kIn, bool kVec>
__global__ void __launch_bounds__(kRowsBlockThreads) amax_kernel(const __grid_constant__ AmaxParams p) {
  constexpr int kInBytes = kIn == QuantIn::kF32 ? 4 : 2;
  const int64_t steps = (p.cols + kStep - 1) / kStep;
  const int64_t total = steps * p.rows;
  const char* x = static_cast<const char*>(p.x_ptr);
  uint32_t m = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / steps;
    const int64_t c = i - row * steps;
    const int count = int(p.cols - c * kStep < kStep ? p.cols - c * kStep : kStep);
    float v[kStep];
    load_run<kIn, kStep, kVec>(x + (row * p.x_row_stride + c * kStep) * kInBytes, count, v);
    m = max(m, run_amax_bits(v));
  }
  __shared__ uint32_t red[kRowsMaxWarps];
  for (int o = 1; o < 32; o <<= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  const int lane = int(threadIdx.x) & 31;
  if (lane == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 0; w < int(blockDim.x >> 5); ++w) m = max(m, red[w]);
    if (m != 0) atomicMax(reinterpret_cast<unsigned int*>(p.amax_ptr), m);
  }
}

// step_scale_inv_ptr of an empty fused launch: 1 / the multiplier, rounded once (as tensor_multiplier writes it).
template <int kUnused = 0>
__global__ void step_scale_inv_kernel(const float* scale_ptr, float* step_scale_inv_ptr) {
  if (threadIdx.x == 0) *step_scale_inv_ptr = __fdiv_rn(1.0f, *scale_ptr);
}

// The ring fold of AmaxHistoryParams as one launch of one block (fold_ring_block). A template (of nothing) so
// that every .cu including this header may define it, like the other kernels here.
template <int kThreads = kFoldThreads>
__global__ void __launch_bounds__(kThreads) amax_history_fold_kernel(const __grid_constant__ AmaxHistoryParams p) {
  fold_ring_block(p, *p.amax_ptr, int(threadIdx.x), kThreads);
}

}  // namespace quantize
}  // namespace astrai
