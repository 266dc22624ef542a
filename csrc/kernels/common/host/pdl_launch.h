// Programmatic dependent launch (PDL) from the host: whether a kernel's code can take it, and the launch itself.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/common/host/cuda_check.h"

namespace astrai {

// One call site's per-device ptxVersion of a kernel's code (cudaFuncAttributes::ptxVersion + 1; 0 not asked yet).
constexpr int kPdlMaxDevices = 64;
using PdlCodeCache = std::atomic<int16_t>[kPdlMaxDevices];

// The ptxVersion of `kernel`'s code for the current device (80 for the compute_80 PTX JIT-compiled there). Fixed per
// device for the process, so it is asked once per device and kept in the caller's `known`.
template <class Kernel>
cudaError_t code_ptx_version(Kernel kernel, PdlCodeCache& known, int* version) {
  int device = 0;
  ASTRAI_CUDA_TRY(cudaGetDevice(&device));
  const bool cacheable = device >= 0 && device < kPdlMaxDevices;
  const int cached = cacheable ? known[device].load(std::memory_order_relaxed) : 0;
  if (cached > 0) {
    *version = cached - 1;
    return cudaSuccess;
  }
  cudaFuncAttributes attr{};
  ASTRAI_CUDA_TRY(cudaFuncGetAttributes(&attr, kernel));
  if (cacheable) known[device].store(int16_t(attr.ptxVersion + 1), std::memory_order_relaxed);
  *version = attr.ptxVersion;
  return cudaSuccess;
}

// Whether `kernel`'s code for the current device is sm_90+ (ptxVersion >= 90): only such code holds the
// griddepcontrol.wait that makes a programmatic dependent launch safe (a compute_80 PTX image JIT-compiled for an
// H200 does not). Devices past the cache's range never take it.
template <class Kernel>
cudaError_t code_waits_for_grid(Kernel kernel, PdlCodeCache& known, bool* yes) {
  *yes = false;
  int device = 0, version = 0;
  ASTRAI_CUDA_TRY(cudaGetDevice(&device));
  if (device < 0 || device >= kPdlMaxDevices) return cudaSuccess;
  ASTRAI_CUDA_TRY(code_ptx_version(kernel, known, &version));
  *yes = version >= 90;
  return cudaSuccess;
}

// kernel<<<grid, block, smem_bytes, stream>>>(args...); with pdl, as a programmatic dependent of the stream's
// previous kernel (the kernel must then wait with griddepcontrol.wait before touching global memory).
template <class Kernel, class... Args>
cudaError_t launch_maybe_dependent(Kernel kernel, dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                                   bool pdl, const Args&... args) {
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
  return cudaLaunchKernelEx(&config, kernel, args...);
}

}  // namespace astrai
