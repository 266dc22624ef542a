// Shared launch sizing of the quantize family.
#include <algorithm>
#include <cstdint>

#include "kernels/common/cuda_check.h"
#include "kernels/quantize/quantize.h"

namespace astrai {
namespace quantize_detail {

// Grid cap in full-occupancy waves; beyond it blocks loop (grid-stride). Several waves keep the last,
// partial wave small.
constexpr int64_t kMaxWaves = 16;

cudaError_t grid_for(int64_t blocks_needed, int threads, int max_blocks, int64_t* grid) {
  int device = 0, sm_count = 0, threads_per_sm = 0;
  ASTRAI_CUDA_TRY(cudaGetDevice(&device));
  ASTRAI_CUDA_TRY(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  ASTRAI_CUDA_TRY(cudaDeviceGetAttribute(&threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  const int64_t per_wave = int64_t(sm_count) * std::max(1, threads_per_sm / threads);
  int64_t g = std::max<int64_t>(1, std::min(blocks_needed, per_wave * kMaxWaves));
  if (max_blocks > 0) g = std::min<int64_t>(g, max_blocks);
  *grid = g;
  return cudaSuccess;
}

}  // namespace quantize_detail
}  // namespace astrai
