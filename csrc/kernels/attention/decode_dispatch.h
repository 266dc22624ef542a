// Internal: per-head_dim decode launchers, one instantiation unit each (decode_bf16_hd{64,128,256}.cu).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/attention/params.h"

// Decode build knobs (-D...), here so that the launcher and the standalone test agree on them.
// 1: split plans merge in the decode kernel (the last split block of a (b, kv head)), 0: a combine kernel.
// Off: on the H200 the fused merge (one block pulling every split's partials, plus the counters' memset) was
// slower than the combine kernel at B = 1 (sweep, 2026-11-29: 16.9 vs 11.4 µs at L = 4096, 49.6 vs 39.7 µs at
// 32768) and level at B = 16. With it off the op allocates no counters (split_counters_ptr stays null).
#ifndef ASTRAI_DECODE_FUSED_MERGE
#define ASTRAI_DECODE_FUSED_MERGE 0
#endif

namespace astrai {
namespace attention {

// Launches kernel<<<grid, block, smem_bytes, stream>>>(p); with pdl, as a programmatic dependent of the stream's
// previous kernel (the kernel must then wait with griddepcontrol.wait before touching global memory).
template <class Kernel>
cudaError_t launch_decode_grid(Kernel kernel, dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, bool pdl,
                               const DecodeParams& p) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, p);
}

// Launches decode_split_kv_kernel<kHeadDim, paged, tile> for params already checked by the launcher, the tile
// DecodeDefaultTile<kHeadDim> or, for short splits and small-shared-memory GPUs, DecodeSmallSmemTile<kHeadDim>
// (with num_splits > 1: the zeroed counters of the fused merge, or the combine, are the caller's).
// pdl: launch as a programmatic dependent of the stream's previous kernel (only where the kernel's code for this
// device is sm_90+, so that it holds the griddepcontrol.wait that guards its first global access).
template <int kHeadDim>
cudaError_t launch_decode_split_kv(const DecodeParams& p, cudaStream_t stream, bool pdl = false);

}  // namespace attention
}  // namespace astrai
