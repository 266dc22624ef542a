// Attention launch policy: the explicit plan each launch takes, the device facts plans depend on, and the rules
// (stated once, here) for which plans this image can run on a device. Plain C++: the launchers, the binding and
// the tensor-free planning ops (attn_can_implement, attn_plan) share it; the launchers choose nothing.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "kernels/attention/params.h"

namespace astrai {

// The head_dims the attention kernels are compiled for.
inline bool attn_head_dim_supported(int64_t head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

// The sm_90a wgmma prefill's needs (checked against its traits in prefill_bf16_hd128_sm90.cu).
constexpr int kPrefillSm90HeadDim = 128;
constexpr int kPrefillSm90SmemBytes = 230704;  // bytes of shared memory a block takes: one block per SM
constexpr int kPrefillSm90MinPageSize = 8;     // keys per page: it copies 8-row groups from one page id

// The device a launch targets, as the plans need it.
struct AttnTarget {
  int cc;           // compute capability, major * 10 + minor
  int code_arch;    // the PTX arch of this image's attention code for the device (cudaFuncAttributes::ptxVersion:
                    // 90 for the sm_90a build, 80 for compute_80 PTX JIT-compiled on the device); 0: none
  int binary_arch;  // the SASS arch that code runs as (binaryVersion)
  int sm_count;     // multiprocessors
  int smem_optin;   // bytes of shared memory one block may take (opt-in)
};

// The process's policy switches (attn_set_policy), read by the binding when it plans a call.
struct AttnPolicy {
  bool decode_pdl = true;    // decode plans with splits launch as programmatic dependents where the code waits
  bool prefill_sm90 = true;  // the sm_90a wgmma prefill wherever it can run
  bool prefill_tma = true;   // its K/V tiles by TMA wherever TMA can describe them
};

// How a decode launches; its split plan (num_splits, split_len: attn_decode_plan) travels in DecodeParams.
struct DecodeLaunch {
  bool pdl;  // the split kernel and the combine launch as programmatic dependents of the previous kernel
};

enum class PrefillKernel : int32_t { kMma = 0, kSm90 = 1 };

struct PrefillLaunch {
  PrefillKernel kernel;  // kMma: the portable mma.sync kernel (every arch); kSm90: the sm_90a wgmma kernel
  bool tma;              // kSm90: K/V tiles by TMA where TMA can describe K and V (else cp.async); same bits
};

// The paged kernels' page size: a power of two (a position's page and slot are a shift and a mask) of at most 128.
inline constexpr int64_t kAttnMaxPageSize = 128;
inline bool attn_page_size_supported(int64_t page_size) {
  return page_size >= 1 && page_size <= kAttnMaxPageSize && (page_size & (page_size - 1)) == 0;
}
inline std::string attn_page_size_rule(int64_t page_size) {
  return "must be a power of two in [1, " + std::to_string(kAttnMaxPageSize) + "], got " + std::to_string(page_size);
}

// Why the attention kernels cannot take these shapes (head_dim, head counts, page size; page_size 0: contiguous
// K/V); empty when they can.
inline std::string attn_shapes_unsupported(int64_t head_dim, int64_t num_q_heads, int64_t num_kv_heads,
                                           int64_t page_size) {
  if (!attn_head_dim_supported(head_dim)) {
    return "head_dim must be 64, 128 or 256, got " + std::to_string(head_dim);
  }
  if (num_kv_heads < 1 || num_q_heads < 1 || num_q_heads % num_kv_heads != 0) {
    return "q heads (" + std::to_string(num_q_heads) + ") must be a positive multiple of kv heads (" +
           std::to_string(num_kv_heads) + ")";
  }
  if (page_size != 0 && !attn_page_size_supported(page_size)) return "page_size " + attn_page_size_rule(page_size);
  return std::string();
}

// paged_kv_append copies rows in 16-byte pieces: any positive multiple of 8 bf16 values.
inline bool attn_append_head_dim_supported(int64_t head_dim) { return head_dim > 0 && head_dim % 8 == 0; }

// Why paged_kv_append cannot write K/V rows of this head_dim into pages of this size; empty when it can.
inline std::string attn_append_shapes_unsupported(int64_t head_dim, int64_t page_size) {
  if (!attn_append_head_dim_supported(head_dim)) {
    return "head_dim must be a positive multiple of 8, got " + std::to_string(head_dim);
  }
  if (!attn_page_size_supported(page_size)) return "page_size " + attn_page_size_rule(page_size);
  return std::string();
}

// Why `launch` cannot run a decode on `target`; empty when it can. A programmatic dependent launch is safe only
// where the code waits for its predecessor (griddepcontrol.wait, in code built for sm_90 or later).
inline std::string attn_decode_unfit(const DecodeLaunch& launch, const AttnTarget& target) {
  if (launch.pdl && target.code_arch < 90) {
    return "a programmatic dependent launch needs code built for sm_90 or later; this image's attention code "
           "for the device is compute_" + std::to_string(target.code_arch);
  }
  return std::string();
}

// The decode launch the policy picks for a planned call (p.num_splits set).
inline DecodeLaunch attn_decode_choose(const DecodeParams& p, const AttnPolicy& policy, const AttnTarget& target) {
  // The overlap goes to plans with splits only (short calls, where the launch is a large share of the time): a
  // one-split plan is a long call where it gained next to nothing for contiguous K/V and slowed paged K/V
  // (docs/benchmarks.md, decode section).
  DecodeLaunch launch{policy.decode_pdl && p.num_splits > 1};
  if (!attn_decode_unfit(launch, target).empty()) launch.pdl = false;
  return launch;
}

// Why `launch` cannot run a prefill of these shapes on `target`; empty when it can. scale_positive: the
// softmax scale is > 0 (the sm_90a kernel folds the scale past its raw-score row max, which a negative scale would
// turn into a min).
inline std::string attn_prefill_unfit(int64_t head_dim, int64_t page_size, bool scale_positive,
                                      const PrefillLaunch& launch, const AttnTarget& target) {
  if (launch.kernel == PrefillKernel::kMma) return std::string();
  if (launch.kernel != PrefillKernel::kSm90) return "prefill kernel must be 0 (mma) or 1 (sm90)";
  if (head_dim != kPrefillSm90HeadDim) {
    return "the sm90 prefill kernel takes head_dim 128, got " + std::to_string(head_dim);
  }
  if (!scale_positive) return "the sm90 prefill kernel takes a positive softmax scale";
  if (page_size != 0 && page_size < kPrefillSm90MinPageSize) {
    return "the sm90 prefill kernel takes pages of at least 8 keys, got " + std::to_string(page_size);
  }
  if (target.cc != 90) {
    return "the sm90 prefill kernel runs on compute capability 9.0, the device is " + std::to_string(target.cc / 10) +
           "." + std::to_string(target.cc % 10);
  }
  if (target.code_arch != 90 || target.binary_arch != 90) {
    return "the image in use has no sm_90a code for the device (its attention code is compute_" +
           std::to_string(target.code_arch) + "), so the sm90 prefill kernel is empty there";
  }
  if (target.smem_optin < kPrefillSm90SmemBytes) {
    return "the sm90 prefill kernel needs " + std::to_string(kPrefillSm90SmemBytes) +
           " bytes of shared memory a block, the device allows " + std::to_string(target.smem_optin);
  }
  if (target.sm_count <= 0) return "the device reports no multiprocessors";
  return std::string();
}

// The prefill launch the policy picks for a call: the sm_90a kernel wherever the policy allows it and it can run,
// else the mma.sync kernel (every arch).
inline PrefillLaunch attn_prefill_choose(int64_t head_dim, int64_t page_size, bool scale_positive,
                                         const AttnPolicy& policy, const AttnTarget& target) {
  const PrefillLaunch sm90{PrefillKernel::kSm90, policy.prefill_tma};
  if (policy.prefill_sm90 && attn_prefill_unfit(head_dim, page_size, scale_positive, sm90, target).empty()) {
    return sm90;
  }
  return PrefillLaunch{PrefillKernel::kMma, false};
}

// The device facts of ordinal `device` with this image's attention code (queried once per device).
cudaError_t attn_device_target(int device, AttnTarget* target);

// The process-wide policy: set by the Python policy (astrai.extension.attention_plan), read by the binding.
void attn_set_policy(const AttnPolicy& policy);
AttnPolicy attn_policy();

}  // namespace astrai
