// Host entry of the rotary family: launch the fused bf16 q/k rotary kernel; plain C++, no CUDA compiler needed.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/rotary/params.h"

namespace astrai {

// Rotates q (and k when num_k_heads > 0) on `stream`, picking the 16-byte or the scalar variant from the
// pointers' alignment, the strides and head_dim. Returns the launch status (cudaErrorInvalidValue for
// inconsistent params); never throws. num_tokens, heads or head_dim of 0: no launch, cudaSuccess.
cudaError_t rotary_bf16_launch(const RotaryParams& params, cudaStream_t stream);

}  // namespace astrai
