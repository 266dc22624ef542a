// Shared launch sizing of the quantize family.
#include <algorithm>
#include <cstdint>

#include "kernels/common/host/cuda_check.h"
#include "kernels/common/host/device_facts.h"
#include "kernels/quantize/quantize.h"

namespace astrai {
namespace quantize_detail {

// Grid cap in full-occupancy waves; beyond it blocks loop (grid-stride). Several waves keep the last,
// partial wave small.
constexpr int64_t kMaxWaves = 16;

cudaError_t grid_for(int64_t blocks_needed, int threads, int max_blocks, int64_t* grid) {
  DeviceFacts facts{};
  ASTRAI_CUDA_TRY(current_device_facts(&facts));
  const int64_t per_wave = int64_t(facts.sm_count) * std::max(1, facts.max_threads_per_sm / threads);
  int64_t g = std::max<int64_t>(1, std::min(blocks_needed, per_wave * kMaxWaves));
  if (max_blocks > 0) g = std::min<int64_t>(g, max_blocks);
  *grid = g;
  return cudaSuccess;
}

}  // namespace quantize_detail
}  // namespace astrai
