// 128 x 128 block-scaled fp8 quantization (weights) and the scale-factor layout conversion (MN-major,
// TMA-aligned; plain float32 or packed UE8M0).
#pragma once

#include <cstdint>

#include "kernels/quantize/params.h"
#include "kernels/quantize/quantize_common.cuh"

namespace astrai {
namespace quantize {

constexpr int kBlockEdge = 128;        // rows and columns of one scale block
constexpr int kBlockThreads = 256;
constexpr int kBlockRowPasses = kBlockEdge / (kBlockThreads / (kBlockEdge / kStep));  // 4

// One thread block per 128 x 128 tile (grid-stride): thread t owns the 16 columns 16 * (t % 8) of rows
// t / 8 + 32 * i (i < 4), kept in registers between the tile's amax and the cast.
template <QuantIn kIn, QuantOut kOut, bool kVec>
__global__ void __launch_bounds__(kBlockThreads) quantize_block128_kernel(const __grid_constant__ BlockQuantParams p) {
  constexpr int kInBytes = kIn == QuantIn::kF32 ? 4 : 2;
  constexpr int kRowThreads = kBlockEdge / kStep;             // 8 threads across a tile row
  constexpr int kRowsPerPass = kBlockThreads / kRowThreads;  // 32
  __shared__ uint32_t red[kBlockThreads / 32];
  const int tid = int(threadIdx.x);
  const int lane = tid & 31;
  const int cg = tid % kRowThreads;
  const int rg = tid / kRowThreads;
  const int64_t tiles_m = (p.rows + kBlockEdge - 1) / kBlockEdge;
  const int64_t tiles_n = p.cols / kBlockEdge;
  const char* x = static_cast<const char*>(p.x_ptr);
  uint8_t* out = static_cast<uint8_t*>(p.out_ptr);

  for (int64_t tile = blockIdx.x; tile < tiles_m * tiles_n; tile += gridDim.x) {
    const int64_t tm = tile / tiles_n;
    const int64_t tn = tile - tm * tiles_n;
    const int64_t col = tn * kBlockEdge + cg * kStep;
    float v[kBlockRowPasses][kStep];  // (rows of this thread, 16 columns)
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < kBlockRowPasses; ++i) {
      const int64_t row = tm * kBlockEdge + rg + i * kRowsPerPass;
      if (row < p.rows) {
        load_run<kIn, kStep, kVec>(x + (row * p.x_row_stride + col) * kInBytes, kStep, v[i]);
        m = max(m, run_amax_bits(v[i]));
      } else {
#pragma unroll
        for (int j = 0; j < kStep; ++j) v[i][j] = 0.0f;
      }
    }
    for (int o = 1; o < 32; o <<= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    __syncthreads();  // the previous tile's readers are done with red
    if (lane == 0) red[tid >> 5] = m;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kBlockThreads / 32; ++w) m = max(m, red[w]);
    const ScalePair s = scale_from_amax(__uint_as_float(m), p.qmax, p.pow2_scale);
    if (tid == 0) p.scale_inv_ptr[tm * p.scale_inv_row_stride + tn * p.scale_inv_col_stride] = s.inv;
#pragma unroll
    for (int i = 0; i < kBlockRowPasses; ++i) {
      const int64_t row = tm * kBlockEdge + rg + i * kRowsPerPass;
      if (row >= p.rows) continue;
      uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        w[k] = pack4<kOut>(v[i][4 * k] * s.mul, v[i][4 * k + 1] * s.mul, v[i][4 * k + 2] * s.mul,
                           v[i][4 * k + 3] * s.mul);
      }
      uint8_t* dst = out + row * p.cols + col;
      if constexpr (kVec) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
#pragma unroll
        for (int q = 0; q < kStep; ++q) dst[q] = uint8_t(w[q >> 2] >> (8 * (q & 3)));
      }
    }
  }
}

// One thread per output element of the MN-major, TMA-aligned layout (grid-stride).
__global__ void __launch_bounds__(256) scale_layout_kernel(const __grid_constant__ ScaleLayoutParams p) {
  const int64_t aligned_mn = (p.mn + 3) / 4 * 4;
  const int64_t out_k = p.packed ? (p.sf_k + 3) / 4 : p.sf_k;
  const int64_t total = aligned_mn * out_k;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = idx / aligned_mn;
    const int64_t i = idx - k * aligned_mn;
    if (p.packed) {
      uint32_t word = 0;
      if (i < p.mn) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t kk = 4 * k + j;
          if (kk < p.sf_k) {
            const uint32_t bits = __float_as_uint(__ldg(p.sf_ptr + i * p.sf_mn_stride + kk * p.sf_k_stride));
            word |= ((bits >> 23) & 0xffu) << (8 * j);
          }
        }
      }
      static_cast<uint32_t*>(p.out_ptr)[idx] = word;
    } else {
      static_cast<float*>(p.out_ptr)[idx] = i < p.mn ? __ldg(p.sf_ptr + i * p.sf_mn_stride + k * p.sf_k_stride) : 0.0f;
    }
  }
}

}  // namespace quantize
}  // namespace astrai
