// Host entry of the attention family: decode planner and launchers, paged KV append (plain C++, no nvcc needed).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/attention/attention_policy.h"
#include "kernels/attention/params.h"

namespace astrai {

// Split lengths are multiples of this many keys (a multiple of every decode block step).
constexpr int32_t kDecodeSplitAlign = 64;
// The planner never makes more splits than this (bounds the workspace and the combine's loop).
constexpr int32_t kDecodeMaxSplits = 1024;

struct DecodePlan {
  int32_t num_splits;  // KV splits per sequence; 1: the decode kernel writes the output directly
  int32_t split_len;   // keys per split (multiple of kDecodeSplitAlign)
};

// Deterministic split rule: a function of (batch, Hkv, Hq/Hkv, max_kv_len, head_dim, paged, sm_count) only,
// never of the data, so a launch is bitwise reproducible and capturable. kv_split_size > 0 fixes the keys per
// split (rounded up to kDecodeSplitAlign): the result then no longer depends on batch or sm_count (batch
// invariance).
DecodePlan attn_decode_plan(int32_t batch, int32_t num_kv_heads, int32_t group_size, int32_t max_kv_len,
                            int32_t head_dim, bool paged, int32_t sm_count, int64_t kv_split_size);

// Launches the split-KV decode on `stream` as `launch` says (attn_decode_choose). With params.num_splits > 1 a
// combine kernel merges the splits' partials (partial_o_ptr, partial_lse_ptr). Returns cudaErrorInvalidValue for
// inconsistent params (unsupported head_dim, head counts, missing workspace) and for a launch the device's code
// cannot take (attn_decode_unfit); never throws. batch == 0: no launch. launch.pdl: the split kernel and the
// combine launch as programmatic dependents of the stream's previous kernel (each waits for it before touching
// memory).
cudaError_t attn_decode_bf16_launch(const DecodeParams& params, const DecodeLaunch& launch, cudaStream_t stream);

struct PrefillPlan {
  int32_t num_q_tiles;       // grid size along the Q schedule (an upper bound for ragged Q: idle tiles exit)
  int64_t workspace_bytes;   // ragged Q: 2 * num_q_tiles int32 (q_tile_to_batch at the start, q_tile_to_index
                             // right after it); then, for every call, one int32 for sched_counter_ptr
};

// Prefill schedule: a function of the shapes only (batch, rows, head counts, head_dim, ragged or not), never of
// qo_indptr's values, so a launch needs no host sync and is CUDA-graph capturable. For ragged Q the launcher
// fills the tile maps on the device from qo_indptr before the main kernel.
PrefillPlan attn_prefill_plan(const PrefillParams& params);

// Launches the prefill (and, for ragged Q, the tile-map kernel) on `stream` on the kernel `launch` names
// (attn_prefill_choose). The caller sets num_q_tiles, the tile-map pointers and sched_counter_ptr from
// attn_prefill_plan (workspace of workspace_bytes; the launcher zeroes the counter with cudaMemsetAsync when the
// kernel uses it). Returns cudaErrorInvalidValue for inconsistent params and for a launch the device cannot run
// (attn_prefill_unfit); never throws. batch == 0 or no rows: no launch.
cudaError_t attn_prefill_bf16_launch(const PrefillParams& params, const PrefillLaunch& launch, cudaStream_t stream);

// Writes N new tokens of K and V into a paged cache in one launch. num_tokens == 0: no launch.
cudaError_t paged_kv_append_bf16_launch(const AppendParams& params, cudaStream_t stream);

}  // namespace astrai
