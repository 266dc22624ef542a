// Internal: per-head_dim decode launchers, one instantiation unit each (decode_bf16_hd{64,128,256}.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention/params.h"

namespace astrai {
namespace attention {

// Launches decode_split_kv_kernel<kHeadDim, G, paged> for params already checked by the launcher.
template <int kHeadDim>
cudaError_t launch_decode_split_kv(const DecodeParams& p, cudaStream_t stream);

}  // namespace attention
}  // namespace astrai
