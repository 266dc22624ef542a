// Attention launchers: decode planner, parameter checks, decode dispatch (decode + combine), paged KV append; the
// device facts the policy plans with and the process's policy switches.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/attention/bf16_decode_combine.cuh"
#include "kernels/attention/bf16_paged_kv_append.cuh"
#include "kernels/attention/decode_dispatch.h"
#include "kernels/common/host/align.h"
#include "kernels/common/host/cuda_check.h"
#include "kernels/common/host/device_facts.h"

namespace astrai {
namespace {

// Split planner: one wave of blocks at a target count per SM (DecodeDefaultTile: the tile and its target per
// head_dim), chosen per head_dim from a sweep of every split size from 64 keys to L (csrc/tools/decode_merge_sweep.cu;
// docs/benchmarks.md, decode section): more splits, or smaller blocks at several per SM, add merge work and partial
// traffic, and a one-split plan needs no combine at all. Paged K/V at head_dim 64 takes splits of at least
// kDecodePagedMinSplit keys (shorter paged splits were slower) unless that leaves fewer blocks than the contiguous
// plan (short sequences).
// At head_dim 64 contiguous and paged K/V may take different splits for the same shapes, and then agree within
// accuracy, not bitwise (a fixed kv_split_size gives both the same plan).
constexpr int64_t kDecodePagedMinSplit = 128;  // keys, paged K/V at head_dim 64

bool decode_params_valid(const DecodeParams& p) {
  if (p.batch < 0 || p.batch > 65535 || p.num_kv_heads <= 0 || p.num_q_heads <= 0) return false;
  if (p.num_q_heads % p.num_kv_heads != 0) return false;
  if (int64_t(p.batch) * p.num_q_heads > INT32_MAX) return false;  // combine grid: one block per row
  if (!attn_head_dim_supported(p.head_dim)) return false;
  if (p.max_kv_len < 0 || p.num_splits < 1 || p.num_splits > kDecodeMaxSplits || p.split_len <= 0) return false;
  if (int64_t(p.num_splits) * p.split_len < p.max_kv_len) return false;  // every key belongs to a split
  if (p.q_ptr == nullptr || p.k_ptr == nullptr || p.v_ptr == nullptr || p.out_ptr == nullptr) return false;
  if (p.num_splits > 1 && (p.partial_o_ptr == nullptr || p.partial_lse_ptr == nullptr)) return false;
  if (p.paged) {
    if (p.page_table_ptr == nullptr || p.page_size_log2 < 0 || p.page_size_log2 > 7 || p.num_pages < 0) return false;
    if (p.kv_lens_ptr == nullptr) return false;
  }
  if (p.mask_ptr != nullptr && p.mask_len < 0) return false;
  // 16-byte loads and stores of q, K, V, out and the partials.
  if (!aligned16(p.q_ptr) || !aligned16(p.k_ptr) || !aligned16(p.v_ptr) || !aligned16(p.out_ptr)) return false;
  if (p.partial_o_ptr != nullptr && !aligned16(p.partial_o_ptr)) return false;
  for (int64_t s : {p.q_batch_stride, p.q_head_stride, p.k_batch_stride, p.k_seq_stride, p.k_head_stride,
                    p.v_batch_stride, p.v_seq_stride, p.v_head_stride, p.out_batch_stride, p.out_head_stride}) {
    if (!bf16_vec_stride(s)) return false;
  }
  return true;
}

bool append_params_valid(const AppendParams& p) {
  if (p.num_tokens < 0 || p.batch < 0 || p.max_pages < 0 || p.num_pages < 0) return false;
  if (p.num_kv_heads <= 0 || p.head_dim <= 0 || p.head_dim % 8 != 0) return false;
  if (p.page_size_log2 < 0 || p.page_size_log2 > 7) return false;
  if (p.num_tokens == 0) return true;
  if (!p.k_cache_ptr || !p.v_cache_ptr || !p.k_new_ptr || !p.v_new_ptr || !p.page_table_ptr || !p.seq_ids_ptr ||
      !p.positions_ptr) {
    return false;
  }
  if (!aligned16(p.k_cache_ptr) || !aligned16(p.v_cache_ptr) || !aligned16(p.k_new_ptr) || !aligned16(p.v_new_ptr)) {
    return false;
  }
  for (int64_t s : {p.k_cache_page_stride, p.k_cache_seq_stride, p.k_cache_head_stride, p.v_cache_page_stride,
                    p.v_cache_seq_stride, p.v_cache_head_stride, p.k_new_token_stride, p.k_new_head_stride,
                    p.v_new_token_stride, p.v_new_head_stride}) {
    if (!bf16_vec_stride(s)) return false;
  }
  return true;
}

// The PTX and SASS arch of this image's attention code for each device (every kernel of an image is built for the
// same arches, so the combine stands for all of them): fixed for the process, cached per device (0: unknown).
constexpr int kTargetMaxDevices = 64;
std::atomic<int32_t> g_code_arches[kTargetMaxDevices];  // ptxVersion * 1000 + binaryVersion

cudaError_t code_arches(int device, int* ptx, int* binary) {
  const bool cacheable = device >= 0 && device < kTargetMaxDevices;
  int32_t known = cacheable ? g_code_arches[device].load(std::memory_order_relaxed) : 0;
  if (known == 0) {
    int current = 0;
    ASTRAI_CUDA_TRY(cudaGetDevice(&current));
    if (current != device) ASTRAI_CUDA_TRY(cudaSetDevice(device));
    cudaFuncAttributes attr{};
    const cudaError_t status = cudaFuncGetAttributes(&attr, attention::decode_combine_kernel);
    if (current != device) ASTRAI_CUDA_TRY(cudaSetDevice(current));
    ASTRAI_CUDA_TRY(status);
    known = int32_t(attr.ptxVersion) * 1000 + int32_t(attr.binaryVersion);
    if (cacheable) g_code_arches[device].store(known, std::memory_order_relaxed);
  }
  *ptx = known / 1000;
  *binary = known % 1000;
  return cudaSuccess;
}

// AttnPolicy as bits (1 decode_pdl, 2 prefill_sm90, 4 prefill_tma): every switch on until the policy says.
std::atomic<uint32_t> g_policy{7u};

template <int kHeadDim>
DecodePlan plan_decode_splits(int32_t batch, int32_t num_kv_heads, int32_t group_size, int32_t max_kv_len,
                              bool paged, int32_t sm_count, int64_t kv_split_size) {
  using Tile = attention::DecodeDefaultTile<kHeadDim>;
  constexpr int64_t align = kDecodeSplitAlign;
  const int64_t len = std::max<int64_t>(max_kv_len, 1);
  int64_t splits = 1;
  if (kv_split_size > 0) {
    splits = ceil_div<int64_t>(len, ceil_div<int64_t>(kv_split_size, align) * align);
  } else {
    // As many splits as keep B * Hkv * head groups * splits within one wave of the target blocks per SM.
    const int64_t group = std::max(group_size, 1);
    const int64_t head_groups = ceil_div<int64_t>(group, attention::kMaxGroup);
    const int64_t blocks = std::max<int64_t>(int64_t(std::max(batch, 1)) * std::max(num_kv_heads, 1) * head_groups, 1);
    // Splits that fill one wave of per_sm blocks per SM (at most one per kDecodeSplitAlign keys); the clamp
    // below makes it at least 1.
    auto wave_splits = [&](int64_t per_sm) {
      return std::min<int64_t>(int64_t(std::max(sm_count, 1)) * per_sm / blocks, ceil_div(len, align));
    };
    if (paged && Tile::kPagedWaveBlocksPerSm > Tile::kWaveBlocksPerSm) {
      splits = std::max(std::min(wave_splits(Tile::kPagedWaveBlocksPerSm), ceil_div(len, kDecodePagedMinSplit)),
                        wave_splits(Tile::kWaveBlocksPerSm));
    } else {
      splits = wave_splits(Tile::kWaveBlocksPerSm);
    }
  }
  splits = std::max<int64_t>(1, std::min<int64_t>(splits, kDecodeMaxSplits));
  const int64_t split_len = ceil_div(ceil_div(len, splits), align) * align;
  return DecodePlan{int32_t(ceil_div(len, split_len)), int32_t(split_len)};
}

}  // namespace

DecodePlan attn_decode_plan(int32_t batch, int32_t num_kv_heads, int32_t group_size, int32_t max_kv_len,
                            int32_t head_dim, bool paged, int32_t sm_count, int64_t kv_split_size) {
  switch (head_dim) {
    case 64: return plan_decode_splits<64>(batch, num_kv_heads, group_size, max_kv_len, paged, sm_count, kv_split_size);
    case 128: return plan_decode_splits<128>(batch, num_kv_heads, group_size, max_kv_len, paged, sm_count, kv_split_size);
    default: return plan_decode_splits<256>(batch, num_kv_heads, group_size, max_kv_len, paged, sm_count, kv_split_size);
  }
}

namespace {

cudaError_t launch_decode_kernel(const DecodeParams& p, cudaStream_t stream, bool pdl) {
  switch (p.head_dim) {
    case 64: return attention::launch_decode_split_kv<64>(p, stream, pdl);
    case 128: return attention::launch_decode_split_kv<128>(p, stream, pdl);
    default: return attention::launch_decode_split_kv<256>(p, stream, pdl);
  }
}

}  // namespace

cudaError_t attn_device_target(int device, AttnTarget* target) {
  DeviceFacts facts{};
  ASTRAI_CUDA_TRY(device_facts(device, &facts));
  AttnTarget t{};
  t.cc = facts.cc_major * 10 + facts.cc_minor;
  t.sm_count = facts.sm_count;
  t.smem_optin = facts.smem_optin_per_block;
  ASTRAI_CUDA_TRY(code_arches(device, &t.code_arch, &t.binary_arch));
  *target = t;
  return cudaSuccess;
}

void attn_set_policy(const AttnPolicy& policy) {
  g_policy.store((policy.decode_pdl ? 1u : 0u) | (policy.prefill_sm90 ? 2u : 0u) | (policy.prefill_tma ? 4u : 0u),
                 std::memory_order_relaxed);
}

AttnPolicy attn_policy() {
  const uint32_t bits = g_policy.load(std::memory_order_relaxed);
  AttnPolicy policy;
  policy.decode_pdl = (bits & 1u) != 0;
  policy.prefill_sm90 = (bits & 2u) != 0;
  policy.prefill_tma = (bits & 4u) != 0;
  return policy;
}

cudaError_t attn_decode_bf16_launch(const DecodeParams& p, const DecodeLaunch& launch, cudaStream_t stream) {
  if (!decode_params_valid(p)) return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  if (launch.pdl) {  // never a dependent launch of code that does not wait for its predecessor
    int device = 0;
    AttnTarget target{};
    ASTRAI_CUDA_TRY(cudaGetDevice(&device));
    ASTRAI_CUDA_TRY(attn_device_target(device, &target));
    if (!attn_decode_unfit(launch, target).empty()) return cudaErrorInvalidValue;
  }
  ASTRAI_CUDA_TRY(launch_decode_kernel(p, stream, launch.pdl));
  if (p.num_splits == 1) return cudaSuccess;
  return attention::launch_decode_combine(p, stream, launch.pdl);
}

cudaError_t paged_kv_append_bf16_launch(const AppendParams& p, cudaStream_t stream) {
  if (!append_params_valid(p)) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  DeviceFacts facts{};
  ASTRAI_CUDA_TRY(current_device_facts(&facts));
  const int64_t items = p.num_tokens * p.num_kv_heads * (p.head_dim / 8);
  const int64_t blocks = std::min<int64_t>(ceil_div<int64_t>(items, 256), int64_t(std::max(facts.sm_count, 1)) * 16);
  attention::paged_kv_append_kernel<<<unsigned(blocks), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace astrai
