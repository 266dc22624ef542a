// Internal: per-head_dim decode launchers, one instantiation unit each (decode_bf16_hd{64,128,256}.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention/params.h"

namespace astrai {
namespace attention {

// Launches decode_split_kv_kernel<kHeadDim, paged, tile> for params already checked by the launcher, the tile
// DecodeDefaultTile<kHeadDim> or, for short splits and small-shared-memory GPUs, DecodeSmallSmemTile<kHeadDim>
// (with num_splits > 1: the combine is the caller's).
// pdl: launch as a programmatic dependent of the stream's previous kernel (only where the kernel's code for this
// device is sm_90+, so that it holds the griddepcontrol.wait that guards its first global access).
template <int kHeadDim>
cudaError_t launch_decode_split_kv(const DecodeParams& p, cudaStream_t stream, bool pdl = false);

// Launches the combine of a plan with splits for params already checked (bf16_decode_combine.cuh, compiled
// once, with the launcher); pdl: as a programmatic dependent of the previous launch on `stream` (the decode
// kernel). Only when the combine was compiled for sm_90+ (it then waits with griddepcontrol.wait); a compute_80
// PTX image JIT-compiled for an H200 has no wait and must not use it.
cudaError_t launch_decode_combine(const DecodeParams& p, cudaStream_t stream, bool pdl);

}  // namespace attention
}  // namespace astrai
