// L2 prefetch of a byte range (a GEMM's weights, ahead of the call that reads them). An experiment for the batch-1
// decode step, where the GEMMs stream their weights and the kernels between them leave DRAM idle: issued on a side
// stream after one GEMM, it fills the L2 with the next one's weights while the norms and attention run.
//
// The kernel only issues the fills: on sm_90+ one cp.async.bulk.prefetch.L2 a piece of up to kL2PrefetchPiece
// bytes, below one prefetch.global.L2 a 128-byte line. Neither waits for the data, so the kernel ends once every
// request is out and the memory system fills the lines after it (a hint: the hardware may drop some).
#include <algorithm>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/common/host/cuda_check.h"
#include "kernels/common/host/device_facts.h"
#include "kernels/gemm/l2_prefetch.h"

namespace astrai {
namespace gemm {  // a named namespace: an anonymous one's mangled names differ between checkouts (SASS digest)

constexpr int kPrefetchThreads = 128;

// Unit u: piece (u % pieces) of the run at the start of period block (u / pieces), clipped to the span.
__global__ void __launch_bounds__(kPrefetchThreads)
    l2_prefetch_kernel(const uint8_t* begin, int64_t span, int64_t run, int64_t period, int64_t pieces,
                       int64_t units) {
  const int64_t stride = int64_t(gridDim.x) * kPrefetchThreads;
  for (int64_t u = int64_t(blockIdx.x) * kPrefetchThreads + threadIdx.x; u < units; u += stride) {
    const int64_t block = pieces == 1 ? u : u / pieces;  // one piece a run (run <= 4 KB, the usual case): no division
    const int64_t piece = u - block * pieces;
    const int64_t at = block * period + piece * kL2PrefetchPiece;
    int64_t size = run - piece * kL2PrefetchPiece;
    size = size < kL2PrefetchPiece ? size : kL2PrefetchPiece;
    size = size < span - at ? size : span - at;
    if (size <= 0) continue;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // begin, run, period and the piece are multiples of 16 bytes (the host's rule), as the instruction needs.
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(begin + at), "r"(uint32_t(size)) : "memory");
#else
    for (int64_t line = 0; line < size; line += 128) {
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(begin + at + line));
    }
#endif
  }
}

}  // namespace gemm

cudaError_t gemm_l2_prefetch_launch(const void* data, int64_t bytes, int64_t run, int64_t period,
                                    cudaStream_t stream) {
  // The 16-byte-aligned bytes inside [data, data + bytes): the prefetch never names an address outside the tensor.
  const uintptr_t first = (reinterpret_cast<uintptr_t>(data) + 15) & ~uintptr_t(15);
  const uintptr_t last = (reinterpret_cast<uintptr_t>(data) + uintptr_t(bytes)) & ~uintptr_t(15);
  if (bytes < 0 || run < 0 || period <= 0 || run > period || run % 16 || period % 16) return cudaErrorInvalidValue;
  if (bytes == 0 || run == 0 || last <= first) return cudaSuccess;
  const int64_t span = int64_t(last - first);
  if (run == period) run = period = kL2PrefetchPiece;  // the whole span: the same bytes in pieces
  const int64_t pieces = (run + kL2PrefetchPiece - 1) / kL2PrefetchPiece;
  const int64_t units = (span + period - 1) / period * pieces;
  DeviceFacts facts{};
  ASTRAI_CUDA_TRY(current_device_facts(&facts));
  using gemm::kPrefetchThreads;
  const int64_t blocks =
      std::min<int64_t>((units + kPrefetchThreads - 1) / kPrefetchThreads, 4 * int64_t(facts.sm_count));
  gemm::l2_prefetch_kernel<<<unsigned(blocks), kPrefetchThreads, 0, stream>>>(reinterpret_cast<const uint8_t*>(first),
                                                                              span, run, period, pieces, units);
  return cudaGetLastError();
}

}  // namespace astrai
