// sm_90a prefill launcher (head_dim 128, wgmma): when it applies, and the launch. Compiled for every arch of the
// image like the rest of the family; only the sm_90a pass has a kernel body (bf16_prefill_sm90.cuh).
#include <atomic>
#include <cstdint>

#include "kernels/attention/bf16_prefill_sm90.cuh"
#include "kernels/attention/prefill_dispatch.h"
#include "kernels/common/host/cuda_check.h"
#include "kernels/common/host/device_facts.h"
#include "kernels/common/host/env_knob.h"
#include "kernels/common/host/tensor_map.h"

namespace astrai {
namespace attention {

namespace {

// The SMs of the current device if it runs this image's sm_90a code (compute capability 9.0, the kernel's code
// built from compute_90a PTX, not JIT-compiled from an older PTX as under the ptx80 / ptx89 images, whose bodies
// are empty, and room for its shared memory), else 0. The kernel check is cached per device (the answer cannot
// change within a process; concurrent first calls compute the same answer), the device's facts by device_facts.
int sm90a_device_sms() {
  int device = 0;
  DeviceFacts facts{};
  if (cudaGetDevice(&device) != cudaSuccess || device_facts(device, &facts) != cudaSuccess) return 0;
  if (facts.cc_major != 9 || facts.cc_minor != 0 || facts.smem_optin_per_block < PrefillSm90Traits::kSmemBytes ||
      facts.sm_count <= 0) {
    return 0;
  }
  constexpr int kMaxDevices = 64;
  static std::atomic<int8_t> sm90a_code[kMaxDevices] = {};  // 0 unknown, 1 no, 2 yes
  const bool cacheable = device < kMaxDevices;
  int8_t known = cacheable ? sm90a_code[device].load(std::memory_order_relaxed) : 0;
  if (known == 0) {
    cudaFuncAttributes attr{};
    known = cudaFuncGetAttributes(&attr, prefill_bf16_sm90_kernel<false, false>) == cudaSuccess &&
                    attr.ptxVersion == 90 && attr.binaryVersion == 90
                ? 2
                : 1;
    if (cacheable) sm90a_code[device].store(known, std::memory_order_relaxed);
  }
  return known == 2 ? facts.sm_count : 0;
}

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

// The K/V descriptors of a call, enabled unless ASTRAI_PREFILL_SM90_TMA=0 (read at each launch) or TMA cannot
// describe K or V. Dense: (D, Hkv, max_kv_len, batch) in boxes of a whole tile; ragged: one sequence of all the
// keys; paged: (D, Hkv, page_size, num_pages) in boxes of min(page_size, 128) rows, one page each (a page id out of
// range is a box outside the map: zeros).
PrefillSm90KvMaps kv_maps(const PrefillParams& p) {
  using Tr = PrefillSm90Traits;
  PrefillSm90KvMaps maps{};
  if (env_knob_off("ASTRAI_PREFILL_SM90_TMA")) return maps;
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
cudaError_t launch_sm90_variant(const PrefillParams& p, cudaStream_t stream) {
  using Tr = PrefillSm90Traits;
  auto* kernel = &prefill_bf16_sm90_kernel<kRaggedQ, kPaged>;
  ASTRAI_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  const int group = p.num_q_heads / p.num_kv_heads;
  const int64_t head_blocks = int64_t(p.num_kv_heads) * (group >> prefill_heads_log2(group));
  const int64_t items = int64_t(p.num_q_tiles) * head_blocks;  // <= INT32_MAX (checked by the launcher)
  const int64_t sms = sm90a_device_sms();
  const int64_t blocks = items < sms ? items : sms;
  if (blocks <= 0) return cudaSuccess;
  if (p.sched_counter_ptr != nullptr) {
    ASTRAI_CUDA_TRY(cudaMemsetAsync(p.sched_counter_ptr, 0, sizeof(int32_t), stream));
  }
  kernel<<<unsigned(blocks), Tr::kThreads, Tr::kSmemBytes, stream>>>(p, kv_maps(p));
  return cudaGetLastError();
}

}  // namespace

bool prefill_sm90_usable(const PrefillParams& p) {
  // A negative scale (allowed, if unusual) would turn the raw-score row max the kernel folds the scale past into
  // a min: the mma.sync kernel serves it.
  if (p.head_dim != 128 || !(p.scale_log2 > 0.f)) return false;
  if (p.paged && (1 << p.page_size_log2) < PrefillSm90Traits::kGroupRows) return false;
  if (env_knob_off("ASTRAI_PREFILL_SM90")) return false;
  return sm90a_device_sms() > 0;
}

cudaError_t launch_prefill_sm90(const PrefillParams& p, cudaStream_t stream) {
  const bool ragged_q = p.qo_indptr_ptr != nullptr;
  if (p.paged) {
    return ragged_q ? launch_sm90_variant<true, true>(p, stream) : launch_sm90_variant<false, true>(p, stream);
  }
  return ragged_q ? launch_sm90_variant<true, false>(p, stream) : launch_sm90_variant<false, false>(p, stream);
}

}  // namespace attention
}  // namespace astrai
