// Internal: per-head_dim prefill launchers, one instantiation unit each (prefill_bf16_hd{64,128,256}.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention/params.h"

namespace astrai {
namespace attention {

// Launches prefill_bf16_kernel<kHeadDim, ragged Q, paged> for params already checked by the launcher (and, for
// ragged Q, after the tile map was written on the same stream).
template <int kHeadDim>
cudaError_t launch_prefill(const PrefillParams& p, cudaStream_t stream);

// The sm_90a wgmma prefill (prefill_bf16_hd128_sm90.cu) applies: head_dim 128, contiguous K/V or pages of >= 8
// keys, a device that runs this image's sm_90a code, and ASTRAI_PREFILL_SM90 unset or not "0".
bool prefill_sm90_usable(const PrefillParams& p);
// Launches it for params already checked by the launcher (and, for ragged Q, after the tile map was written).
cudaError_t launch_prefill_sm90(const PrefillParams& p, cudaStream_t stream);

}  // namespace attention
}  // namespace astrai
