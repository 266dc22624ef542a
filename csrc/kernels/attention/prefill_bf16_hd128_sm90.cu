// sm_90a prefill launcher (head_dim 128, wgmma): when it applies, and the launch. Compiled for every arch of the
// image like the rest of the family; only the sm_90a pass has a kernel body (bf16_prefill_sm90.cuh).
#include <cstdint>

#include "kernels/attention/bf16_prefill_sm90.cuh"
#include "kernels/attention/prefill_dispatch.h"
#include "kernels/common/host/cuda_check.h"
#include "kernels/attention/attention_policy.h"
#include "kernels/common/host/smem_optin.h"
#include "kernels/common/host/tensor_map.h"

namespace astrai {
namespace attention {

static_assert(PrefillSm90Traits::kSmemBytes == kPrefillSm90SmemBytes, "attention_policy.h states the kernel's need");
static_assert(PrefillSm90Traits::kGroupRows == kPrefillSm90MinPageSize, "attention_policy.h states the kernel's need");
static_assert(PrefillSm90Traits::kHeadDim == kPrefillSm90HeadDim, "attention_policy.h states the kernel's need");

namespace {

// One of K / V as a 4-D tensor (head_dim, kv heads, rows, outer; strides in elements) in boxes of 64 columns x
// box_rows rows with the 128-byte swizzle of the kernel's tiles. False where TMA cannot describe it (an address or
// a stride not a multiple of 16 bytes, a zero stride). A dimension of size 1 is never stepped: one kv head (MQA) or
// a ragged call's one sequence gets a valid stride rather than whatever the caller's tensor had there.
bool encode_kv_map(CUtensorMap* map, const void* ptr, int64_t heads, int64_t head_stride, int64_t rows,
                   int64_t row_stride, int64_t outer, int64_t outer_stride, int box_rows) {
  using Tr = PrefillSm90Traits;
  if (heads <= 0 || rows <= 0 || outer <= 0) return false;
  const int64_t strides[3] = {(heads == 1 ? Tr::kHeadDim : head_stride) * 2, row_stride * 2,
                              (outer == 1 ? row_stride : outer_stride) * 2};  // bytes
  const uint64_t dims[4] = {uint64_t(Tr::kHeadDim), uint64_t(heads), uint64_t(rows), uint64_t(outer)};
  const uint32_t box[4] = {64, 1, uint32_t(box_rows), 1};
  return encode_tensor_map_tiled(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, ptr, dims, strides, box,
                                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
}

// The K/V descriptors of a call, enabled where the plan asks for TMA and TMA can describe K and V. Dense: (D, Hkv,
// max_kv_len, batch) in boxes of a whole tile; ragged: one sequence of all the keys; paged: (D, Hkv, page_size,
// num_pages) in boxes of min(page_size, 128) rows, one page each (a page id out of range is a box outside the map:
// zeros).
PrefillSm90KvMaps kv_maps(const PrefillParams& p, bool tma) {
  using Tr = PrefillSm90Traits;
  PrefillSm90KvMaps maps{};
  if (!tma) return maps;
  const bool ragged = !p.paged && p.kv_indptr_ptr != nullptr;
  const int64_t rows = p.paged ? int64_t(1) << p.page_size_log2 : p.max_kv_len;
  const int64_t outer = p.paged ? p.num_pages : ragged ? 1 : p.batch;
  const int box_rows = p.paged ? int(rows < Tr::kBN ? rows : Tr::kBN) : Tr::kBN;
  if (box_rows < Tr::kGroupRows) return maps;  // the kernel takes no smaller pages
  maps.enabled = encode_kv_map(&maps.k, p.k_ptr, p.num_kv_heads, p.k_head_stride, rows, p.k_seq_stride, outer,
                               p.k_batch_stride, box_rows) &&
                 encode_kv_map(&maps.v, p.v_ptr, p.num_kv_heads, p.v_head_stride, rows, p.v_seq_stride, outer,
                               p.v_batch_stride, box_rows);
  return maps;
}

// Persistent: one block per SM (the kernel's shared memory allows no second), at most one per work item.
template <bool kRaggedQ, bool kPaged>
cudaError_t launch_sm90_variant(const PrefillParams& p, bool tma, int64_t sms, cudaStream_t stream) {
  using Tr = PrefillSm90Traits;
  auto* kernel = &prefill_bf16_sm90_kernel<kRaggedQ, kPaged>;
  static std::atomic<uint64_t> smem_set{0};  // the opt-in, once per device
  ASTRAI_CUDA_TRY(allow_smem(kernel, Tr::kSmemBytes, smem_set));
  const int group = p.num_q_heads / p.num_kv_heads;
  const int64_t head_blocks = int64_t(p.num_kv_heads) * (group >> prefill_heads_log2(group));
  const int64_t items = int64_t(p.num_q_tiles) * head_blocks;  // <= INT32_MAX (checked by the launcher)
  const int64_t blocks = items < sms ? items : sms;
  if (blocks <= 0) return cudaSuccess;
  if (p.sched_counter_ptr != nullptr) {
    ASTRAI_CUDA_TRY(cudaMemsetAsync(p.sched_counter_ptr, 0, sizeof(int32_t), stream));
  }
  kernel<<<unsigned(blocks), Tr::kThreads, Tr::kSmemBytes, stream>>>(p, kv_maps(p, tma));
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_prefill_sm90(const PrefillParams& p, bool tma, int sm_count, cudaStream_t stream) {
  const bool ragged_q = p.qo_indptr_ptr != nullptr;
  if (p.paged) {
    return ragged_q ? launch_sm90_variant<true, true>(p, tma, sm_count, stream)
                    : launch_sm90_variant<false, true>(p, tma, sm_count, stream);
  }
  return ragged_q ? launch_sm90_variant<true, false>(p, tma, sm_count, stream)
                  : launch_sm90_variant<false, false>(p, tma, sm_count, stream);
}

}  // namespace attention
}  // namespace astrai
