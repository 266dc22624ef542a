// sm_90a prefill launcher (head_dim 128, wgmma): when it applies, and the launch. Compiled for every arch of the
// image like the rest of the family; only the sm_90a pass has a kernel body (bf16_prefill_sm90.cuh).
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/attention/bf16_prefill_sm90.cuh"
#include "kernels/attention/prefill_dispatch.h"
#include "kernels/common/cuda_check.h"

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
  kernel<<<unsigned(blocks), Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

bool prefill_sm90_usable(const PrefillParams& p) {
  // A negative scale (allowed, if unusual) would turn the raw-score row max the kernel folds the scale past into
  // a min: the mma.sync kernel serves it.
  if (p.head_dim != 128 || !(p.scale_log2 > 0.f)) return false;
  if (p.paged && (1 << p.page_size_log2) < PrefillSm90Traits::kGroupRows) return false;
  const char* knob = std::getenv("ASTRAI_PREFILL_SM90");
  if (knob != nullptr && std::strcmp(knob, "0") == 0) return false;
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
