// The opt-in to more than 48 KB of dynamic shared memory: an attribute of a kernel on each device, set once per
// device and kept (a cudaFuncSetAttribute at every launch took a driver call on every decode step).
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/common/host/cuda_check.h"

namespace astrai {

// Allows `kernel` `bytes` of dynamic shared memory on the current device unless bit d of `done` says device d has it
// (devices past 63 set it at every call).
template <class Kernel>
cudaError_t allow_smem(Kernel kernel, int bytes, std::atomic<uint64_t>& done) {
  int device = 0;
  ASTRAI_CUDA_TRY(cudaGetDevice(&device));
  const uint64_t bit = device >= 0 && device < 64 ? (uint64_t(1) << device) : 0;
  if (bit && (done.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  ASTRAI_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.fetch_or(bit, std::memory_order_acq_rel);
  return cudaSuccess;
}

}  // namespace astrai
