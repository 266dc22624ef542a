// What launchers ask of a device (SMs, shared memory, L2, compute capability), queried once per device.
#pragma once

#include <atomic>
#include <mutex>

#include <cuda_runtime_api.h>

#include "kernels/common/host/cuda_check.h"

namespace astrai {

struct DeviceFacts {
  int sm_count;              // multiprocessors
  int max_threads_per_sm;    // resident threads per multiprocessor
  int smem_optin_per_block;  // bytes of shared memory one block may take (with the opt-in attribute)
  int l2_bytes;              // L2 cache size in bytes
  int cc_major;              // compute capability major
  int cc_minor;              // compute capability minor
};

// The facts of device ordinal `device`: queried at its first call and cached for the process (they cannot
// change); thread-safe. A failed query returns its status and caches nothing. Ordinals past the cache's 64
// are queried at each call.
inline cudaError_t device_facts(int device, DeviceFacts* facts) {
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> known[kMaxDevices];
  static DeviceFacts cache[kMaxDevices];
  static std::mutex writer;
  const bool cacheable = device >= 0 && device < kMaxDevices;
  if (cacheable && known[device].load(std::memory_order_acquire)) {
    *facts = cache[device];  // never written again once known
    return cudaSuccess;
  }
  DeviceFacts f{};
  const struct {
    int* value;
    cudaDeviceAttr attr;
  } queries[] = {{&f.sm_count, cudaDevAttrMultiProcessorCount},
                 {&f.max_threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor},
                 {&f.smem_optin_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin},
                 {&f.l2_bytes, cudaDevAttrL2CacheSize},
                 {&f.cc_major, cudaDevAttrComputeCapabilityMajor},
                 {&f.cc_minor, cudaDevAttrComputeCapabilityMinor}};
  for (const auto& q : queries) ASTRAI_CUDA_TRY(cudaDeviceGetAttribute(q.value, q.attr, device));
  if (cacheable) {
    const std::lock_guard<std::mutex> lock(writer);
    if (!known[device].load(std::memory_order_relaxed)) {
      cache[device] = f;
      known[device].store(true, std::memory_order_release);
    }
  }
  *facts = f;
  return cudaSuccess;
}

// The facts of the calling thread's current device.
inline cudaError_t current_device_facts(DeviceFacts* facts) {
  int device = 0;
  ASTRAI_CUDA_TRY(cudaGetDevice(&device));
  return device_facts(device, facts);
}

// Blocks of `kernel` resident on one SM of the current device at `threads` threads and `smem_bytes` of dynamic
// shared memory (cudaOccupancyMaxActiveBlocksPerMultiprocessor), asked once per (kernel, threads, smem, device) and
// kept for the process: the answer cannot change, and the query costs host time a launch does not need (the
// quantize launchers plan persistent grids with it on every call). A full table (past kEntries distinct keys)
// queries at each call.
inline cudaError_t resident_blocks_per_sm(const void* kernel, int threads, size_t smem_bytes, int* blocks) {
  struct Entry {
    const void* kernel;
    int threads;
    size_t smem;
    int device;
    int blocks;
  };
  constexpr int kEntries = 128;
  static Entry table[kEntries];
  static int used = 0;
  static std::mutex guard;
  int device = 0;
  ASTRAI_CUDA_TRY(cudaGetDevice(&device));
  {
    const std::lock_guard<std::mutex> lock(guard);
    for (int i = 0; i < used; ++i) {
      const Entry& e = table[i];
      if (e.kernel == kernel && e.threads == threads && e.smem == smem_bytes && e.device == device) {
        *blocks = e.blocks;
        return cudaSuccess;
      }
    }
  }
  int found = 0;
  ASTRAI_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&found, kernel, threads, smem_bytes));
  const std::lock_guard<std::mutex> lock(guard);
  if (used < kEntries) table[used++] = Entry{kernel, threads, smem_bytes, device, found};
  *blocks = found;
  return cudaSuccess;
}

}  // namespace astrai
