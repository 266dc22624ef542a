// sm_90a prefill launcher (head_dim 128, wgmma): when it applies, and the launch. Compiled for every arch of the
// image like the rest of the family; only the sm_90a pass has a kernel body (bf16_prefill_sm90.cuh).
#include <atomic>
#include <cstdint>

#include "kernels/attention/bf16_prefill_sm90.cuh"
#include "kernels/attention/prefill_dispatch.h"
#include "kernels/common/cuda_check.h"
#include "kernels/common/env_knob.h"

namespace astrai {
namespace attention {

namespace {

// The SMs of the current device if it runs this image's sm_90a code (compute capability 9.0, the kernel's code
// built from compute_90a PTX, not JIT-compiled from an older PTX as under the ptx80 / ptx89 images, whose bodies
// are empty, and room for its shared memory), else 0. Cached per device (the answer cannot change within a
// process; concurrent first calls compute the same answer).
int sm90a_device_sms() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices] = {};  // 0 unknown, -1 no, else the SM count
  const bool cacheable = device >= 0 && device < kMaxDevices;
  if (cacheable) {
    const int known = cached[device].load(std::memory_order_relaxed);
    if (known != 0) return known > 0 ? known : 0;
  }
  int sms = 0;
  int major = 0, minor = 0, smem_optin = 0, count = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
      major == 9 && minor == 0 && smem_optin >= PrefillSm90Traits::kSmemBytes && count > 0) {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, prefill_bf16_sm90_kernel<false, false>) == cudaSuccess &&
        attr.ptxVersion == 90 && attr.binaryVersion == 90) {
      sms = count;
    }
  }
  if (cacheable) cached[device].store(sms > 0 ? sms : -1, std::memory_order_relaxed);
  return sms;
}

// cuTensorMapEncodeTiled, reached through the runtime (the image links no driver library); null if the driver
// has none. Looked up once per process.
using TensorMapEncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                          const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                          CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                          CUtensorMapFloatOOBfill);
TensorMapEncodeTiled tensor_map_encoder() {
  static const TensorMapEncodeTiled encoder = []() -> TensorMapEncodeTiled {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // clear a failed lookup's error
      return nullptr;
    }
    return reinterpret_cast<TensorMapEncodeTiled>(fn);
  }();
  return encoder;
}

// One of K / V as a 4-D tensor (head_dim, kv heads, rows, outer; strides in elements) in boxes of 64 columns x
// box_rows rows with the 128-byte swizzle of the kernel's tiles. False where TMA cannot describe it (an address or
// a stride not a multiple of 16 bytes, a zero stride). A dimension of size 1 is never stepped: one kv head (MQA) or
// a ragged call's one sequence gets a valid stride rather than whatever the caller's tensor had there.
bool encode_kv_map(CUtensorMap* map, const void* ptr, int64_t heads, int64_t head_stride, int64_t rows,
                   int64_t row_stride, int64_t outer, int64_t outer_stride, int box_rows) {
  using Tr = PrefillSm90Traits;
  const TensorMapEncodeTiled encode = tensor_map_encoder();
  if (encode == nullptr || reinterpret_cast<uintptr_t>(ptr) % 16 != 0 || heads <= 0 || rows <= 0 || outer <= 0) {
    return false;
  }
  const int64_t strides[3] = {(heads == 1 ? Tr::kHeadDim : head_stride) * 2, row_stride * 2,
                              (outer == 1 ? row_stride : outer_stride) * 2};  // bytes
  for (const int64_t stride : strides) {
    if (stride <= 0 || stride % 16 != 0 || stride >= (int64_t(1) << 40)) return false;
  }
  const cuuint64_t dims[4] = {cuuint64_t(Tr::kHeadDim), cuuint64_t(heads), cuuint64_t(rows), cuuint64_t(outer)};
  const cuuint64_t byte_strides[3] = {cuuint64_t(strides[0]), cuuint64_t(strides[1]), cuuint64_t(strides[2])};
  const cuuint32_t box[4] = {64, 1, cuuint32_t(box_rows), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(ptr), dims, byte_strides, box,
                element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
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
