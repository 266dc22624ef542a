// Rotary embedding launch parameters: plain data shared by the binding, the launcher and the kernel.
#pragma once

#include <cstdint>

namespace astrai {

// Strides are in elements; the last (head_dim) axis of every tensor is contiguous.
struct RotaryParams {
  const void* q_ptr;               // q in: [num_tokens, num_q_heads, head_dim] bf16
  void* q_out_ptr;                 // q out: [num_tokens, num_q_heads, head_dim] bf16; may equal q_ptr (in place)
  const void* k_ptr;               // k in: [num_tokens, num_k_heads, head_dim] bf16; null when num_k_heads == 0
  void* k_out_ptr;                 // k out: [num_tokens, num_k_heads, head_dim] bf16; may equal k_ptr (in place)
  const float* cos_ptr;            // cos: [num_rows, head_dim / 2] float32
  const float* sin_ptr;            // sin: [num_rows, head_dim / 2] float32
  const void* positions_ptr;       // positions: [num_tokens] int32/int64 row of cos/sin; null: row = token index

  int64_t q_token_stride;          // q in: elements between consecutive tokens
  int64_t q_head_stride;           // q in: elements between consecutive heads
  int64_t q_out_token_stride;      // q out: elements between consecutive tokens
  int64_t q_out_head_stride;       // q out: elements between consecutive heads
  int64_t k_token_stride;          // k in: elements between consecutive tokens
  int64_t k_head_stride;           // k in: elements between consecutive heads
  int64_t k_out_token_stride;      // k out: elements between consecutive tokens
  int64_t k_out_head_stride;       // k out: elements between consecutive heads
  int64_t cos_row_stride;          // cos: elements between consecutive rows
  int64_t sin_row_stride;          // sin: elements between consecutive rows
  int64_t positions_token_stride;  // positions: elements between consecutive tokens

  int64_t num_tokens;              // T; 0 launches nothing
  int64_t num_rows;                // rows of cos/sin: max_pos with positions, T without
  int32_t num_q_heads;             // Hq
  int32_t num_k_heads;             // Hk; 0 when there is no k
  int32_t head_dim;                // D, even; pairs per head = D / 2
  int32_t max_blocks;              // 0: the launcher sizes the grid; > 0 caps it (tests use it to run the token loop)
  bool positions_int64;            // positions dtype: int64 when true, int32 when false
  bool interleaved;                // pairing: GPT-J (2i, 2i+1) when true, NeoX (i, i + D/2) when false
};

}  // namespace astrai
