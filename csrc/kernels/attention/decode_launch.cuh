// Internal: the body of the per-head_dim decode launchers (included once by each decode_bf16_hd*.cu).
#pragma once

#include "kernels/attention/bf16_decode_split_kv.cuh"
#include "kernels/attention/decode_dispatch.h"

namespace astrai {
namespace attention {

template <int kHeadDim, int kGroup>
cudaError_t launch_group(const DecodeParams& p, cudaStream_t stream) {
  const int group_size = p.num_q_heads / p.num_kv_heads;
  const int head_groups = (group_size + kGroup - 1) / kGroup;
  const dim3 grid(unsigned(p.num_kv_heads * head_groups), unsigned(p.batch), unsigned(p.num_splits));
  if (p.paged) {
    decode_split_kv_kernel<kHeadDim, kGroup, true><<<grid, kDecodeThreads, 0, stream>>>(p);
  } else {
    decode_split_kv_kernel<kHeadDim, kGroup, false><<<grid, kDecodeThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

template <int kHeadDim>
cudaError_t launch_decode_split_kv(const DecodeParams& p, cudaStream_t stream) {
  // Heads per block: the group size rounded up to a power of two, at most kMaxGroup.
  const int group_size = p.num_q_heads / p.num_kv_heads;
  if (group_size <= 1) return launch_group<kHeadDim, 1>(p, stream);
  if (group_size <= 2) return launch_group<kHeadDim, 2>(p, stream);
  if (group_size <= 4) return launch_group<kHeadDim, 4>(p, stream);
  return launch_group<kHeadDim, 8>(p, stream);
}

}  // namespace attention
}  // namespace astrai
