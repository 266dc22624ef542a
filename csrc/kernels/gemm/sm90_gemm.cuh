// The Hopper mainloop (issue 20, first cut, not yet run on a GPU): w16a16 bf16 in layout nt, one 128 x 128 output
// tile per CTA, warp-specialized. Warpgroup 0 is the producer: one thread streams K tiles of 64 values of a (128
// rows) and b (128 rows) by TMA into a ring of kStages stages (128-byte swizzle, zeros past M, N and K from the
// tensor maps), each stage's bytes completing on its `full` mbarrier. Warpgroups 1 and 2 are the consumers: each
// owns 64 rows of the tile, waits a stage full, runs four wgmma m64n128k16 over it from shared memory, and hands
// the stage back on its `empty` mbarrier (every consumer thread arrives) once the wgmma that read it have completed (one stage kept in flight).
// The epilogue folds the scales and the bias (store_out) from the fp32 accumulators.
//
// K order: K tiles in order, 16 values a wgmma in order: a row's sum does not depend on M, but it is not the
// mma.sync mainloop's order, so the bits differ from recipes 0-3.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "kernels/common/ptx/arch.cuh"
#include "kernels/common/ptx/mbarrier.cuh"
#include "kernels/common/ptx/smem.cuh"
#include "kernels/common/ptx/sync.cuh"
#include "kernels/common/ptx/tma.cuh"
#include "kernels/common/ptx/wgmma_sm90.cuh"
#include "kernels/gemm/params.h"
#include "kernels/gemm/sm80_gemm.cuh"

namespace astrai {
namespace gemm {

struct Sm90Recipe {
  static constexpr int kBM = 128, kBN = 128, kBK = 64;  // kBK: 64 bf16 = one 128-byte swizzle row
  static constexpr int kStages = 6;
  static constexpr int kThreads = 384;                 // producer warpgroup + two consumer warpgroups
  static constexpr int kTileBytesA = kBM * kBK * 2, kTileBytesB = kBN * kBK * 2;
  static constexpr int kStageBytes = kTileBytesA + kTileBytesB;
  static constexpr int kSmemBytes = kStages * kStageBytes + 1024 /* alignment slack */ + 2 * kStages * 8;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
};

template <class R>
__global__ void __launch_bounds__(R::kThreads, 1)
    gemm_sm90_w16a16_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                            const __grid_constant__ GemmParams p) {
#if ASTRAI_WGMMA
  extern __shared__ uint8_t smem_raw[];
  // Stages 1024-byte aligned (the swizzle atoms), then the barriers.
  uint8_t* const smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + R::kStages * R::kStageBytes);
  uint64_t* const empty = full + R::kStages;
  const int wg = threadIdx.x / 128;
  const int m0 = blockIdx.y * R::kBM, n0 = blockIdx.x * R::kBN;
  const int k_tiles = (p.k + R::kBK - 1) / R::kBK;
  if (threadIdx.x == 0) {
    for (int s = 0; s < R::kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], 2 * 128);  // every consumer thread (as the attention kernel's rings)
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    setmaxnreg_dec<R::kProducerRegs>();
    if (threadIdx.x == 0) {
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int s = kt % R::kStages;
        const uint32_t phase = uint32_t(kt / R::kStages) & 1u;
        mbarrier_wait(&empty[s], phase ^ 1u);  // a fresh barrier's "previous" phase counts as complete
        uint8_t* const stage = smem + s * R::kStageBytes;
        mbarrier_arrive_expect_tx(&full[s], R::kStageBytes);
        tma_load_2d(smem_addr(stage), &map_a, &full[s], kt * R::kBK, m0);
        tma_load_2d(smem_addr(stage + R::kTileBytesA), &map_b, &full[s], kt * R::kBK, n0);
      }
    }
    return;
  }

  setmaxnreg_inc<R::kConsumerRegs>();
  const int cw = wg - 1;  // this consumer's 64 rows of the tile
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  // K-major, 128-byte swizzle: 8-row atoms 1024 bytes apart (SBO); a k16 step is 32 bytes into the row.
  constexpr uint32_t kSbo = 1024;
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % R::kStages;
    mbarrier_wait(&full[s], uint32_t(kt / R::kStages) & 1u);
    const uint32_t stage = smem_addr(smem + s * R::kStageBytes);
    const uint64_t desc_a = wgmma_desc_sw128(stage + cw * 64 * 128, 16, kSbo);
    const uint64_t desc_b = wgmma_desc_sw128(stage + R::kTileBytesA, 16, kSbo);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < R::kBK / 16; ++ks)
      wgmma_m64n128k16_ss(acc, wgmma_desc_sw128_add(desc_a, ks * 32), wgmma_desc_sw128_add(desc_b, ks * 32), true);
    wgmma_commit();
    wgmma_wait<1>();  // the previous stage's wgmma are done: hand that stage back
    if (kt > 0) mbarrier_arrive(&empty[(kt - 1) % R::kStages]);
  }
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 64; ++i) wgmma_fence_operand(acc[i]);

  // acc[4 j + e]: row 16 w + g + 8 (e / 2) of this consumer's 64, column 8 j + 2 t + e % 2.
  const int lane = threadIdx.x % 32, w = (threadIdx.x % 128) / 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = m0 + cw * 64 + 16 * w + g + 8 * h, col = n0 + 8 * j + 2 * t;
      if (row < p.m && col < p.n)
        store_out<float>(p, 0, row, col, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1], col + 1 < p.n);
    }
#endif
}

}  // namespace gemm
}  // namespace astrai
