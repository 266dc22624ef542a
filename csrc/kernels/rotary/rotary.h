// Host entry of the rotary family: the explicit plan of a launch (variant and grid) and the launch of the fused bf16
// q/k rotary kernel; plain C++, no CUDA compiler needed.
#pragma once

#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "kernels/rotary/params.h"

namespace astrai {

// What the plan of a call depends on: its sizes and what its pointers and strides allow (rotary_shape_of).
struct RotaryShape {
  int64_t num_tokens;
  int32_t num_q_heads;
  int32_t num_k_heads;
  int32_t head_dim;
  bool interleaved;
  bool vec_x;       // every q/k base 16-byte aligned and every token/head stride a multiple of 8 elements
  bool vec_cs;      // cos/sin 16-byte aligned with row strides a multiple of 4 elements
  int32_t max_blocks;  // RotaryParams::max_blocks (0: the plan sizes the grid)
};

// The device facts the plan sizes the grid with.
struct RotaryTarget {
  int sm_count;
  int threads_per_sm;
};

// The explicit plan of a launch: the kernel variant and its grid.
struct RotaryLaunch {
  int32_t pairs;    // rotation pairs a thread moves at a time: 8 or 4 (16-byte runs of x; 4: interleaved only) or 1
  bool vec_cs;      // cos/sin read in 16-byte runs (pairs 4 and 8)
  int32_t block_x;  // threads across a head's chunks
  int32_t block_y;  // threads across heads (each takes kHeadUnroll at a time)
  int32_t block_z;  // tokens a block
  int64_t blocks;   // the grid; tokens past it loop
};

RotaryShape rotary_shape_of(const RotaryParams& params);

// The policy: the widest variant the pointers allow; one head a thread while every (token, head, chunk) item
// could be resident at once, else kHeadUnroll; a grid of at most 16 full-occupancy waves (capped by max_blocks).
RotaryLaunch rotary_plan(const RotaryShape& shape, const RotaryTarget& target);

// Why `launch` cannot run a call of `shape`; empty when it can.
std::string rotary_launch_unfit(const RotaryShape& shape, const RotaryLaunch& launch);

// The facts of CUDA device `device` (cached per device).
cudaError_t rotary_device_target(int device, RotaryTarget* target);

// Rotates q (and k when num_k_heads > 0) on `stream` as `launch` says (rotary_plan). Returns the launch status
// (cudaErrorInvalidValue for inconsistent params or a launch they do not allow: rotary_launch_unfit); never
// throws. num_tokens, heads or head_dim of 0: no launch, cudaSuccess.
cudaError_t rotary_bf16_launch(const RotaryParams& params, const RotaryLaunch& launch, cudaStream_t stream);

}  // namespace astrai
