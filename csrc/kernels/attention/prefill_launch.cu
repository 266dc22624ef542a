// Prefill launcher: the ragged tile-map kernel and the per-head_dim dispatch (checks and plan: prefill_plan.h).
#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/attention/prefill_dispatch.h"
#include "kernels/attention/prefill_plan.h"
#include "kernels/attention/prefill_tile_map.cuh"
#include "kernels/common/host/cuda_check.h"

namespace astrai {

PrefillPlan attn_prefill_plan(const PrefillParams& p) { return attention::prefill_plan_of(p); }

cudaError_t attn_prefill_bf16_launch(const PrefillParams& p, cudaStream_t stream) {
  if (!attention::prefill_params_valid(p)) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.q_len == 0) return cudaSuccess;
  if (p.qo_indptr_ptr != nullptr) {
    const int rows_log2 = attention::prefill_tile_rows_log2(p.head_dim, p.num_q_heads / p.num_kv_heads);
    attention::prefill_tile_map_kernel<<<1, attention::kMapThreads, 0, stream>>>(
        p.qo_indptr_ptr, p.batch, p.q_len, rows_log2, p.num_q_tiles, p.q_tile_to_batch, p.q_tile_to_index);
    ASTRAI_CUDA_TRY(cudaGetLastError());
  }
  switch (p.head_dim) {
    case 64: return attention::launch_prefill<64>(p, stream);
    case 128:
      return attention::prefill_sm90_usable(p) ? attention::launch_prefill_sm90(p, stream)
                                               : attention::launch_prefill<128>(p, stream);
    default: return attention::launch_prefill<256>(p, stream);
  }
}

}  // namespace astrai
