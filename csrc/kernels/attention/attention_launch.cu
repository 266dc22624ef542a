// Attention launchers: decode planner, parameter checks, decode dispatch (decode + combine), paged KV append.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/attention/bf16_decode_combine.cuh"
#include "kernels/attention/bf16_paged_kv_append.cuh"
#include "kernels/attention/decode_dispatch.h"
#include "kernels/common/host/align.h"
#include "kernels/common/host/cuda_check.h"
#include "kernels/common/host/device_facts.h"
#include "kernels/common/host/env_knob.h"

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

// Whether the decode launches (the split kernel of a plan with splits, and the combine) go as programmatic
// dependents of the stream's previous kernel: ASTRAI_DECODE_PDL=0 in the environment (read at each launch) says
// never; otherwise only where this image's code for the current device is sm_90+ (ptxVersion >= 90: it holds the
// griddepcontrol.wait that guards each kernel's first global access; a compute_80 PTX image JIT-compiled for an
// H200 does not). Every kernel of an image is compiled for the same arches, so the combine stands for all of
// them. The image check is cached per device: the answer is fixed for the process.
cudaError_t decode_pdl_enabled(bool* pdl) {
  *pdl = false;
  if (env_knob_off("ASTRAI_DECODE_PDL")) return cudaSuccess;
  static PdlCodeCache known;
  return code_waits_for_grid(attention::decode_combine_kernel, known, pdl);
}

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

cudaError_t attn_decode_bf16_launch(const DecodeParams& p, cudaStream_t stream) {
  if (!decode_params_valid(p)) return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  bool pdl = false;
  ASTRAI_CUDA_TRY(decode_pdl_enabled(&pdl));
  // The decode kernel overlaps its predecessor only in plans with splits (short calls, where the launch is a large
  // share of the time). A one-split plan is a long call where the overlap gained next to nothing for contiguous K/V
  // and slowed paged K/V (docs/benchmarks.md, decode section), so it launches as before (the combine has nothing
  // to follow then).
  ASTRAI_CUDA_TRY(launch_decode_kernel(p, stream, pdl && p.num_splits > 1));
  if (p.num_splits == 1) return cudaSuccess;
  return attention::launch_decode_combine(p, stream, pdl);
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
