// Internal: the body of the per-head_dim decode launchers (included once by each decode_bf16_hd*.cu, and by
// the decode sweep, which instantiates other tiles).
#pragma once

#include <type_traits>

#include "kernels/attention/attention.h"
#include "kernels/attention/bf16_decode_split_kv.cuh"
#include "kernels/attention/decode_dispatch.h"
#include "kernels/common/host/cuda_check.h"
#include "kernels/common/host/device_facts.h"
#include "kernels/common/host/pdl_launch.h"
#include "kernels/common/host/smem_optin.h"

namespace astrai {
namespace attention {

// Launches decode_split_kv_kernel<kHeadDim, paged, Tile> for params already checked. pdl: as a programmatic
// dependent of the stream's previous kernel (see launch_decode_split_kv).
template <int kHeadDim, class Tile>
cudaError_t launch_decode_tile(const DecodeParams& p, cudaStream_t stream, bool pdl = false) {
  using Traits = DecodeTraits<kHeadDim, Tile>;
  const int group_size = p.num_q_heads / p.num_kv_heads;
  const int head_groups = (group_size + kMaxGroup - 1) / kMaxGroup;
  const dim3 grid(unsigned(p.num_kv_heads * head_groups), unsigned(p.batch), unsigned(p.num_splits));
  auto kernel = p.paged ? decode_split_kv_kernel<kHeadDim, true, Tile> : decode_split_kv_kernel<kHeadDim, false, Tile>;
  // The 48 KB default limit counts static shared memory too (the kernel's few reduction words): a 48 KB ring
  // already needs the opt-in, once per device and kernel (paged or not).
  if constexpr (Traits::kSmemBytes + 1024 > 48 * 1024) {
    static std::atomic<uint64_t> smem_set[2];
    ASTRAI_CUDA_TRY(allow_smem(kernel, Traits::kSmemBytes, smem_set[p.paged ? 1 : 0]));
  }
  return launch_maybe_dependent(kernel, grid, dim3(unsigned(Traits::kThreads)), Traits::kSmemBytes, stream, pdl, p);
}

// Whether a block of the current device may take `bytes` of dynamic shared memory (plus the decode kernel's
// few static words).
inline cudaError_t decode_smem_fits(int bytes, bool* fits) {
  DeviceFacts facts{};
  ASTRAI_CUDA_TRY(current_device_facts(&facts));
  *fits = bytes + 1024 <= facts.smem_optin_per_block;
  return cudaSuccess;
}

template <int kHeadDim>
cudaError_t launch_decode_split_kv(const DecodeParams& p, cudaStream_t stream, bool pdl) {
  using Tile = typename DecodeDefaultTile<kHeadDim>::type;
  using Small = typename DecodeSmallSmemTile<kHeadDim>::type;
  static_assert(DecodeTraits<kHeadDim, Small>::kSmemBytes + 1024 <= 99 * 1024, "the fallback fits sm_89 / sm_120");
  if constexpr (!std::is_same<Tile, Small>::value) {
    // Splits shorter than one tile per warp of the default tile would leave warps idle: the smaller tile takes
    // them (docs/benchmarks.md, decode section). A function of the plan only, so contiguous and paged K/V, and
    // every batch on a fixed split, still share the tile.
    if (p.split_len < Tile::kWarps * Tile::kTileKeys) return launch_decode_tile<kHeadDim, Small>(p, stream, pdl);
    bool fits = false;
    ASTRAI_CUDA_TRY(decode_smem_fits(DecodeTraits<kHeadDim, Tile>::kSmemBytes, &fits));
    if (!fits) return launch_decode_tile<kHeadDim, Small>(p, stream, pdl);
  }
  return launch_decode_tile<kHeadDim, Tile>(p, stream, pdl);
}

}  // namespace attention
}  // namespace astrai
