// Attention launch parameters: plain data shared by the bindings, the launchers and the kernels (no torch).
#pragma once

#include <cstdint>

namespace astrai {

// Split-KV decode: one query token per sequence against a KV cache that is contiguous ([B, L, Hkv, D]) or
// paged ([num_pages, page_size, Hkv, D] through a page table). Strides are in elements; head_dim is
// contiguous everywhere. Query head h reads kv head h / (Hq / Hkv) (GQA; MQA is Hkv = 1).
struct DecodeParams {
  const void* q_ptr;                 // q: [B, Hq, D] bf16
  const void* k_ptr;                 // k: contiguous [B, L, Hkv, D] / paged [num_pages, page_size, Hkv, D] bf16
  const void* v_ptr;                 // v: like k (own strides)
  void* out_ptr;                     // out: [B, Hq, D] bf16, written when num_splits == 1 or by the combine
  float* partial_o_ptr;              // workspace: [num_splits, B, Hq, D] float32, normalized per split; null: 1 split
  float* partial_lse_ptr;            // workspace: [num_splits, B, Hq] float32, log2-sum-exp2 of scores; -inf: empty
  const int32_t* kv_lens_ptr;        // kv_lens: [B] int32 keys per sequence; null: every sequence has max_kv_len
  const int32_t* page_table_ptr;     // page_table: [B, max_pages] int32 page ids (paged only)
  const uint8_t* mask_ptr;           // mask: [B, mask_len] bool, true = keep; null: no mask

  int64_t q_batch_stride;            // q: elements between sequences
  int64_t q_head_stride;             // q: elements between heads
  int64_t k_batch_stride;            // k: contiguous: elements between sequences; paged: between pages
  int64_t k_seq_stride;              // k: elements between tokens (within a page when paged)
  int64_t k_head_stride;             // k: elements between kv heads
  int64_t v_batch_stride;            // v: as k
  int64_t v_seq_stride;              // v: as k
  int64_t v_head_stride;             // v: as k
  int64_t out_batch_stride;          // out: elements between sequences
  int64_t out_head_stride;           // out: elements between heads
  int64_t page_table_batch_stride;   // page_table: elements between sequences
  int64_t mask_batch_stride;         // mask: elements between sequences

  int32_t batch;                     // B
  int32_t num_q_heads;               // Hq, a multiple of num_kv_heads
  int32_t num_kv_heads;              // Hkv
  int32_t head_dim;                  // D: 64, 128 or 256
  int32_t max_kv_len;                // keys addressable per sequence: L, or max_pages * page_size; kv_lens clamp to it
  int32_t mask_len;                  // mask columns; keys at or past it are dropped
  int32_t num_pages;                 // paged: pages in the cache; ids outside [0, num_pages) drop their keys
  int32_t page_size_log2;            // paged: log2(page_size), page_size in 1..128
  int32_t num_splits;                // KV splits per sequence (planner output); 1: no combine
  int32_t split_len;                 // keys per split, a multiple of kSplitAlign (planner output)
  float scale_log2;                  // softmax scale * log2(e): scores are kept in the exp2 domain
  bool paged;                        // KV source: paged when true, contiguous when false
};

// Prefill: many query rows per sequence, one kernel body templated on the Q schedule (dense / ragged) and
// the KV source (contiguous / paged). Row i of sequence b (q_len_b rows) sits at key position
// kv_len_b - q_len_b + i (causal aligned to the end: prior context counts). Strides are in elements;
// head_dim is contiguous everywhere. Query head h reads kv head h / (Hq / Hkv).
//   Q schedule  dense:  q/out [B, Lq, Hq, D], q_len_b = q_len for every b (qo_indptr null)
//               ragged: q/out [Tq, Hq, D] packed, rows of b are qo_indptr[b] .. qo_indptr[b+1]-1
//   KV source   contiguous dense:  k/v [B, L, Hkv, D], kv_len_b = kv_lens[b] or L
//               contiguous ragged: k/v [Tkv, Hkv, D], keys of b are kv_indptr[b] .. kv_indptr[b+1]-1
//               paged:             k/v [num_pages, page_size, Hkv, D] through page_table, kv_len_b = kv_lens[b]
// A row that keeps no key (length 0, masked, causal before the first key) is written as zeros.
struct PrefillParams {
  const void* q_ptr;                 // q: bf16, dense [B, Lq, Hq, D] / ragged [Tq, Hq, D]
  const void* k_ptr;                 // k: bf16, see the KV source above
  const void* v_ptr;                 // v: like k (own strides)
  void* out_ptr;                     // out: bf16, shaped like q (own strides)
  const int32_t* qo_indptr_ptr;      // qo_indptr: [B + 1] int32, ragged Q schedule; null: dense
  const int32_t* kv_indptr_ptr;      // kv_indptr: [B + 1] int32, ragged contiguous KV; null: dense or paged
  const int32_t* kv_lens_ptr;        // kv_lens: [B] int32 (paged: required; dense contiguous: optional, null = L)
  const int32_t* page_table_ptr;     // page_table: [B, max_pages] int32 page ids (paged only)
  const uint8_t* mask_ptr;           // mask: bool, true = keep; element (b, i, t) at b*mask_batch_stride +
                                     //   i*mask_q_stride + t (i: row within the sequence); null: no mask
  int32_t* q_tile_to_batch;          // workspace [num_q_tiles]: sequence of each Q tile, -1: idle tile (ragged)
  int32_t* q_tile_to_index;          // workspace [num_q_tiles]: first row of the tile within its sequence
  int32_t* sched_counter_ptr;        // workspace: one int32, the sm_90a kernel's tile counter (the launcher zeroes
                                     //   it first); null: that kernel takes its tiles in a fixed order

  int64_t q_batch_stride;            // q: elements between sequences (dense only)
  int64_t q_seq_stride;              // q: elements between rows (tokens)
  int64_t q_head_stride;             // q: elements between heads
  int64_t k_batch_stride;            // k: dense contiguous: between sequences; paged: between pages; ragged: unused
  int64_t k_seq_stride;              // k: elements between keys (within a page when paged)
  int64_t k_head_stride;             // k: elements between kv heads
  int64_t v_batch_stride;            // v: as k
  int64_t v_seq_stride;              // v: as k
  int64_t v_head_stride;             // v: as k
  int64_t out_batch_stride;          // out: as q
  int64_t out_seq_stride;            // out: as q
  int64_t out_head_stride;           // out: as q
  int64_t page_table_batch_stride;   // page_table: elements between sequences
  int64_t mask_batch_stride;         // mask: elements between sequences
  int64_t mask_q_stride;             // mask: elements between query rows; 0: a [B, M] key mask

  int32_t batch;                     // B
  int32_t num_q_heads;               // Hq, a multiple of num_kv_heads
  int32_t num_kv_heads;              // Hkv
  int32_t head_dim;                  // D: 64, 128 or 256
  int32_t q_len;                     // dense: Lq; ragged: Tq (total rows, bounds qo_indptr)
  int32_t max_kv_len;                // keys addressable per sequence: L, Tkv (ragged) or max_pages * page_size
  int32_t mask_len;                  // mask columns; keys at or past it are dropped
  int32_t mask_q_len;                // mask rows (3-D mask); rows at or past it keep nothing
  int32_t num_pages;                 // paged: pages in the cache; ids outside [0, num_pages) drop their keys
  int32_t page_size_log2;            // paged: log2(page_size), page_size in 1..128
  int32_t num_q_tiles;               // Q tiles in the grid (attn_prefill_plan's output)
  float scale_log2;                  // softmax scale * log2(e): scores are kept in the exp2 domain
  bool is_causal;                    // keys past the row's position are dropped
  bool paged;                        // KV source: paged when true, contiguous when false
};

// Paged KV append: token n of k_new/v_new goes to sequence seq_ids[n] at position positions[n], i.e. page
// page_table[seq, pos >> log2(page_size)], slot pos & (page_size - 1). Tokens whose sequence, position or
// page id is out of range are not written.
struct AppendParams {
  void* k_cache_ptr;                 // k_cache: [num_pages, page_size, Hkv, D] bf16, written
  void* v_cache_ptr;                 // v_cache: like k_cache (own strides)
  const void* k_new_ptr;             // k_new: [N, Hkv, D] bf16
  const void* v_new_ptr;             // v_new: [N, Hkv, D] bf16
  const int32_t* page_table_ptr;     // page_table: [B, max_pages] int32
  const int32_t* seq_ids_ptr;        // seq_ids: [N] int32 row of page_table
  const int32_t* positions_ptr;      // positions: [N] int32 position within the sequence

  int64_t k_cache_page_stride;       // k_cache: elements between pages
  int64_t k_cache_seq_stride;        // k_cache: elements between slots of a page
  int64_t k_cache_head_stride;       // k_cache: elements between kv heads
  int64_t v_cache_page_stride;       // v_cache: as k_cache
  int64_t v_cache_seq_stride;        // v_cache: as k_cache
  int64_t v_cache_head_stride;       // v_cache: as k_cache
  int64_t k_new_token_stride;        // k_new: elements between tokens
  int64_t k_new_head_stride;         // k_new: elements between heads
  int64_t v_new_token_stride;        // v_new: as k_new
  int64_t v_new_head_stride;         // v_new: as k_new
  int64_t page_table_batch_stride;   // page_table: elements between sequences
  int64_t seq_ids_stride;            // seq_ids: elements between tokens
  int64_t positions_stride;          // positions: elements between tokens

  int64_t num_tokens;                // N; 0 launches nothing
  int32_t batch;                     // B: rows of page_table
  int32_t max_pages;                 // page_table columns
  int32_t num_pages;                 // pages in the cache
  int32_t page_size_log2;            // log2(page_size)
  int32_t num_kv_heads;              // Hkv
  int32_t head_dim;                  // D, a multiple of 8
};

}  // namespace astrai
