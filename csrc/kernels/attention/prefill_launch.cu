// Prefill launcher: the ragged tile-map kernel and the dispatch to the planned kernel (checks and tile plan:
// prefill_plan.h; the kernel choice: attention_policy.h).
#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/attention/prefill_dispatch.h"
#include "kernels/attention/prefill_plan.h"
#include "kernels/attention/prefill_tile_map.cuh"
#include "kernels/common/host/cuda_check.h"

namespace astrai {

PrefillPlan attn_prefill_plan(const PrefillParams& p) { return attention::prefill_plan_of(p); }

cudaError_t attn_prefill_bf16_launch(const PrefillParams& p, const PrefillLaunch& launch, cudaStream_t stream) {
  if (!attention::prefill_params_valid(p)) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.q_len == 0) return cudaSuccess;
  AttnTarget target{};
  if (launch.kernel != PrefillKernel::kMma) {  // never a kernel the device cannot run (an empty body, no smem)
    int device = 0;
    ASTRAI_CUDA_TRY(cudaGetDevice(&device));
    ASTRAI_CUDA_TRY(attn_device_target(device, &target));
    const int64_t page_size = p.paged ? int64_t(1) << p.page_size_log2 : 0;
    if (!attn_prefill_unfit(p.head_dim, page_size, p.scale_log2 > 0.f, launch, target).empty()) {
      return cudaErrorInvalidValue;
    }
  }
  if (p.qo_indptr_ptr != nullptr) {
    const int rows_log2 = attention::prefill_tile_rows_log2(p.head_dim, p.num_q_heads / p.num_kv_heads);
    attention::prefill_tile_map_kernel<<<1, attention::kMapThreads, 0, stream>>>(
        p.qo_indptr_ptr, p.batch, p.q_len, rows_log2, p.num_q_tiles, p.q_tile_to_batch, p.q_tile_to_index);
    ASTRAI_CUDA_TRY(cudaGetLastError());
  }
  if (launch.kernel == PrefillKernel::kSm90) {
    return attention::launch_prefill_sm90(p, launch.tma, target.sm_count, stream);
  }
  switch (p.head_dim) {
    case 64: return attention::launch_prefill<64>(p, stream);
    case 128: return attention::launch_prefill<128>(p, stream);
    default: return attention::launch_prefill<256>(p, stream);
  }
}

}  // namespace astrai
