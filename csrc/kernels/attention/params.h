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
