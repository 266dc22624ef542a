// Internal: the body of the per-head_dim prefill launchers (included once by each prefill_bf16_hd*.cu).
#pragma once

#include "kernels/attention/bf16_prefill.cuh"
#include "kernels/attention/prefill_dispatch.h"
#include "kernels/common/host/cuda_check.h"
#include "kernels/common/host/smem_optin.h"

namespace astrai {
namespace attention {

template <int kHeadDim, bool kRaggedQ, bool kPaged, bool kPageGroups = false>
cudaError_t launch_prefill_variant(const PrefillParams& p, cudaStream_t stream) {
  constexpr int kSmem = PrefillTraits<kHeadDim>::kSmemBytes;
  auto* kernel = &prefill_bf16_kernel<kHeadDim, kRaggedQ, kPaged, kPageGroups>;
  // Above 48 KB of dynamic shared memory a kernel must opt in, once per device.
  static std::atomic<uint64_t> smem_set{0};
  ASTRAI_CUDA_TRY(allow_smem(kernel, kSmem, smem_set));
  const int group = p.num_q_heads / p.num_kv_heads;
  const int64_t head_blocks = int64_t(p.num_kv_heads) * (group >> prefill_heads_log2(group));
  const int64_t blocks = int64_t(p.num_q_tiles) * head_blocks;  // <= INT32_MAX (checked by the launcher)
  kernel<<<unsigned(blocks), kPrefillThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

template <int kHeadDim>
cudaError_t launch_prefill(const PrefillParams& p, cudaStream_t stream) {
  const bool ragged_q = p.qo_indptr_ptr != nullptr;
  if (!p.paged) {
    return ragged_q ? launch_prefill_variant<kHeadDim, true, false>(p, stream)
                    : launch_prefill_variant<kHeadDim, false, false>(p, stream);
  }
  // Pages of at least a thread's row group: one page id per thread and tile (prefill_bf16_kernel).
  if ((1 << p.page_size_log2) >= PrefillTraits<kHeadDim, true>::kGroupRows) {
    return ragged_q ? launch_prefill_variant<kHeadDim, true, true, true>(p, stream)
                    : launch_prefill_variant<kHeadDim, false, true, true>(p, stream);
  }
  return ragged_q ? launch_prefill_variant<kHeadDim, true, true>(p, stream)
                  : launch_prefill_variant<kHeadDim, false, true>(p, stream);
}

}  // namespace attention
}  // namespace astrai
