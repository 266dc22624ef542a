// Attention launchers: decode planner, parameter checks, decode + combine dispatch, paged KV append.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/attention/bf16_decode_combine.cuh"
#include "kernels/attention/bf16_paged_kv_append.cuh"
#include "kernels/attention/decode_dispatch.h"
#include "kernels/common/cuda_check.h"

namespace astrai {
namespace {

// Resident decode blocks per SM the auto planner aims for (4 x 128 threads): enough warps and loads in
// flight to cover DRAM latency when one sequence must fill the GPU.
constexpr int64_t kTargetBlocksPerSm = 4;
// Fewest keys per split the auto planner makes: below it the partials and the combine cost more than
// the extra parallelism brings.
constexpr int64_t kMinSplitLen = 128;

template <typename T>
T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }
bool vec_stride(int64_t s) { return s % 8 == 0; }

bool decode_params_valid(const DecodeParams& p) {
  if (p.batch < 0 || p.batch > 65535 || p.num_kv_heads <= 0 || p.num_q_heads <= 0) return false;
  if (p.num_q_heads % p.num_kv_heads != 0) return false;
  if (int64_t(p.batch) * p.num_q_heads > INT32_MAX) return false;  // combine grid: one block per row
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) return false;
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
    if (!vec_stride(s)) return false;
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
    if (!vec_stride(s)) return false;
  }
  return true;
}

cudaError_t sm_count_of_current_device(int* sm_count) {
  int device = 0;
  ASTRAI_CUDA_TRY(cudaGetDevice(&device));
  return cudaDeviceGetAttribute(sm_count, cudaDevAttrMultiProcessorCount, device);
}

}  // namespace

DecodePlan attn_decode_plan(int32_t batch, int32_t num_kv_heads, int32_t group_size, int32_t max_kv_len,
                            int32_t sm_count, int64_t kv_split_size) {
  constexpr int64_t align = kDecodeSplitAlign;
  const int64_t len = std::max<int64_t>(max_kv_len, 1);
  int64_t splits;
  if (kv_split_size > 0) {
    splits = ceil_div<int64_t>(len, ceil_div<int64_t>(kv_split_size, align) * align);
  } else {
    const int64_t head_groups = ceil_div<int64_t>(std::max(group_size, 1), attention::kMaxGroup);
    const int64_t blocks = std::max<int64_t>(int64_t(batch) * std::max(num_kv_heads, 1) * head_groups, 1);
    const int64_t want = ceil_div<int64_t>(int64_t(std::max(sm_count, 1)) * kTargetBlocksPerSm, blocks);
    splits = std::min(want, ceil_div(len, kMinSplitLen));
  }
  splits = std::max<int64_t>(1, std::min<int64_t>(splits, kDecodeMaxSplits));
  const int64_t split_len = ceil_div(ceil_div(len, splits), align) * align;
  return DecodePlan{int32_t(ceil_div(len, split_len)), int32_t(split_len)};
}

cudaError_t attn_decode_bf16_launch(const DecodeParams& p, cudaStream_t stream) {
  if (!decode_params_valid(p)) return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  cudaError_t status = cudaSuccess;
  switch (p.head_dim) {
    case 64: status = attention::launch_decode_split_kv<64>(p, stream); break;
    case 128: status = attention::launch_decode_split_kv<128>(p, stream); break;
    default: status = attention::launch_decode_split_kv<256>(p, stream); break;
  }
  if (status != cudaSuccess || p.num_splits == 1) return status;
  // One block per (b, q head) row: kCombineLanes split lanes x D/8 chunks (64..256 threads).
  const int64_t rows = int64_t(p.batch) * p.num_q_heads;
  attention::decode_combine_kernel<<<unsigned(rows), (p.head_dim / 8) * attention::kCombineLanes, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t paged_kv_append_bf16_launch(const AppendParams& p, cudaStream_t stream) {
  if (!append_params_valid(p)) return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  int sm_count = 0;
  ASTRAI_CUDA_TRY(sm_count_of_current_device(&sm_count));
  const int64_t items = p.num_tokens * p.num_kv_heads * (p.head_dim / 8);
  const int64_t blocks = std::min<int64_t>(ceil_div<int64_t>(items, 256), int64_t(std::max(sm_count, 1)) * 16);
  attention::paged_kv_append_kernel<<<unsigned(blocks), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace astrai
