// Prefill host logic: parameter checks and the tile plan (plain C++, no nvcc needed).
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_policy.h"
#include "kernels/attention/prefill_schedule.h"
#include "kernels/common/host/align.h"

namespace astrai {
namespace attention {

// Shapes the kernels support (what the plan needs).
inline bool prefill_shapes_valid(const PrefillParams& p) {
  if (p.batch < 0 || p.batch > INT32_MAX - 1 || p.q_len < 0 || p.num_q_heads <= 0 || p.num_kv_heads <= 0) return false;
  if (p.num_q_heads % p.num_kv_heads != 0) return false;
  if (!attn_head_dim_supported(p.head_dim)) return false;
  return p.max_kv_len >= 0 && p.max_kv_len <= INT32_MAX - 1024;  // key indices + one tile stay in int32
}

// Blocks per Q tile: one per (kv head, group of HB q heads).
inline int64_t prefill_head_blocks(const PrefillParams& p) {
  const int group = p.num_q_heads / p.num_kv_heads;
  return int64_t(p.num_kv_heads) * (group >> prefill_heads_log2(group));
}

// Q tiles of the grid: exact for dense Q, the bound floor(Tq / R) + B for ragged Q.
inline int64_t prefill_tiles(const PrefillParams& p) {
  const int rows_log2 = prefill_tile_rows_log2(p.head_dim, p.num_q_heads / p.num_kv_heads);
  if (p.qo_indptr_ptr != nullptr) return ragged_tile_bound(p.batch, p.q_len, rows_log2);
  return int64_t(p.batch) * tiles_of(p.q_len, rows_log2);
}

// Everything the launcher checks before a launch (cudaErrorInvalidValue otherwise).
inline bool prefill_params_valid(const PrefillParams& p) {
  if (!prefill_shapes_valid(p)) return false;
  if (p.batch == 0 || p.q_len == 0) return true;  // nothing to launch
  if (p.q_ptr == nullptr || p.k_ptr == nullptr || p.v_ptr == nullptr || p.out_ptr == nullptr) return false;
  if (p.num_q_tiles != prefill_tiles(p) || int64_t(p.num_q_tiles) * prefill_head_blocks(p) > INT32_MAX) return false;
  if (p.qo_indptr_ptr != nullptr && (p.q_tile_to_batch == nullptr || p.q_tile_to_index == nullptr)) return false;
  if (p.paged) {
    if (p.page_table_ptr == nullptr || p.kv_lens_ptr == nullptr || p.kv_indptr_ptr != nullptr) return false;
    if (p.page_size_log2 < 0 || p.page_size_log2 > 7 || p.num_pages < 0) return false;
  }
  if (p.mask_ptr != nullptr && (p.mask_len < 0 || (p.mask_q_stride != 0 && p.mask_q_len < 0))) return false;
  if (!std::isfinite(p.scale_log2)) return false;
  // 16-byte cp.async loads of Q, K, V and 16-byte stores of out.
  if (!aligned16(p.q_ptr) || !aligned16(p.k_ptr) || !aligned16(p.v_ptr) ||
      !aligned16(p.out_ptr)) {
    return false;
  }
  for (int64_t s : {p.q_batch_stride, p.q_seq_stride, p.q_head_stride, p.k_batch_stride, p.k_seq_stride,
                    p.k_head_stride, p.v_batch_stride, p.v_seq_stride, p.v_head_stride, p.out_batch_stride,
                    p.out_seq_stride, p.out_head_stride}) {
    if (!bf16_vec_stride(s)) return false;
  }
  return true;
}

// attn_prefill_plan: shapes only, never the values of qo_indptr (no host sync, graph capturable).
inline PrefillPlan prefill_plan_of(const PrefillParams& p) {
  if (!prefill_shapes_valid(p)) return PrefillPlan{0, 0};
  const int64_t tiles = prefill_tiles(p);
  const int32_t n = int32_t(tiles > INT32_MAX ? INT32_MAX : tiles);  // too many: the launcher rejects the grid
  const bool ragged_q = p.qo_indptr_ptr != nullptr;
  return PrefillPlan{n, ((ragged_q ? 2 * int64_t(n) : 0) + 1) * int64_t(sizeof(int32_t))};
}

}  // namespace attention
}  // namespace astrai
