// Deliberately broken kernels for the sanitizer's negative controls; mode `clean` does the same work correctly.
// Usage: sanitizer_selftest {clean|race|oob|uninit|sync} [--small]. Exit 0 unless a CUDA call fails (2).
// Without compute-sanitizer every mode runs to completion: the faults are ones only the tools see.
#include <cstdio>
#include <cstring>
#include <vector>

#include <cuda_runtime_api.h>

#include "csrc/tests/test_utils.cuh"

namespace {

constexpr int kThreads = 256;  // eight warps: the race crosses warps, which racecheck reports as an error

// Each thread stores its slot in shared memory, then reads its neighbour's slot. `synchronize` false leaves
// out the barrier between the store and the load: a read-after-write hazard across warps.
__global__ void shared_neighbour_sum(const int* in, int* out, bool synchronize) {
  __shared__ int slots[kThreads];
  const int t = threadIdx.x;
  slots[t] = in[t];
  if (synchronize) __syncthreads();
  out[t] = slots[t] + slots[(t + 33) % kThreads];
}

// Writes out[0, count + overrun): overrun > 0 writes past the end of an allocation of `count` ints.
__global__ void fill_with_overrun(int* out, int count, int overrun) {
  const int t = threadIdx.x;
  if (t < count + overrun) out[t] = t;
}

constexpr int kTail = 8;  // ints in the allocation the overrun leaves

// Sums `in`: reading a buffer nobody wrote is what initcheck reports.
__global__ void sum_all(const int* in, int count, int* out) {
  int acc = 0;
  for (int i = 0; i < count; ++i) acc += in[i];
  if (threadIdx.x == 0) *out = acc;
}

// __syncwarp with a mask that leaves out the calling lane (lanes 16..31 call it with mask 0x0000ffff): an
// invalid argument that synccheck reports. `valid` true passes the full mask.
__global__ void warp_sync_mask(int* out, bool valid) {
  const unsigned mask = valid ? 0xffffffffu : 0x0000ffffu;
  out[threadIdx.x] = int(threadIdx.x);
  __syncwarp(mask);
  out[threadIdx.x] += out[threadIdx.x ^ 1];
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  const bool clean = std::strcmp(mode, "clean") == 0;
  const bool known = clean || !std::strcmp(mode, "race") || !std::strcmp(mode, "oob") ||
                     !std::strcmp(mode, "uninit") || !std::strcmp(mode, "sync");
  if (!known) {
    std::fprintf(stderr, "usage: %s {clean|race|oob|uninit|sync} [--small]\n", argv[0]);
    return 2;
  }
  int* in = nullptr;
  int* out = nullptr;
  int* scratch = nullptr;
  int* tail = nullptr;
  TEST_CUDA_CHECK(cudaMalloc(&in, kThreads * sizeof(int)));
  TEST_CUDA_CHECK(cudaMalloc(&out, kThreads * sizeof(int)));
  TEST_CUDA_CHECK(cudaMalloc(&scratch, kThreads * sizeof(int)));
  TEST_CUDA_CHECK(cudaMalloc(&tail, kTail * sizeof(int)));
  std::vector<int> host(kThreads);
  for (int i = 0; i < kThreads; ++i) host[i] = 3 * i + 1;
  TEST_CUDA_CHECK(cudaMemcpy(in, host.data(), kThreads * sizeof(int), cudaMemcpyHostToDevice));
  TEST_CUDA_CHECK(cudaMemset(out, 0, kThreads * sizeof(int)));

  if (clean || !std::strcmp(mode, "race"))
    shared_neighbour_sum<<<1, kThreads>>>(in, out, /*synchronize=*/clean);
  if (clean || !std::strcmp(mode, "oob"))
    fill_with_overrun<<<1, 32>>>(tail, kTail, clean ? 0 : 1);  // oob: one int past the end
  if (clean || !std::strcmp(mode, "uninit")) {
    if (clean) TEST_CUDA_CHECK(cudaMemset(scratch, 0, kThreads * sizeof(int)));
    sum_all<<<1, 32>>>(scratch, kThreads, out);
  }
  if (clean || !std::strcmp(mode, "sync")) warp_sync_mask<<<1, 32>>>(out, /*valid=*/clean);
  TEST_CUDA_CHECK(cudaGetLastError());
  TEST_CUDA_CHECK(cudaDeviceSynchronize());
  TEST_CUDA_CHECK(cudaFree(in));
  TEST_CUDA_CHECK(cudaFree(out));
  TEST_CUDA_CHECK(cudaFree(scratch));
  TEST_CUDA_CHECK(cudaFree(tail));
  std::printf("sanitizer_selftest %s: ran\n", mode);
  return 0;
}
