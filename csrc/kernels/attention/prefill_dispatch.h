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

// Launches the sm_90a wgmma prefill (prefill_bf16_hd128_sm90.cu) for params already checked by the launcher (and,
// for ragged Q, after the tile map was written) on a device of sm_count SMs that can run it (attn_prefill_unfit);
// tma: K/V tiles by TMA where TMA can describe K and V.
cudaError_t launch_prefill_sm90(const PrefillParams& p, bool tma, int sm_count, cudaStream_t stream);

}  // namespace attention
}  // namespace astrai
