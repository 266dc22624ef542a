// Instantiation unit: the Hopper mainloop (sm90_gemm.cuh) for int8 x int8 (s32 accumulators), recipes 4 and 5.
#include "kernels/gemm/sm80_groups.h"
#include "kernels/gemm/sm90_gemm_launch.cuh"

namespace astrai {
namespace gemm {

cudaError_t sm90_launch_s8(const GemmParams& p, int recipe, cudaStream_t stream) {
  return sm90_launch_pair<GemmPair::kS8S8>(p, recipe, stream);
}

}  // namespace gemm
}  // namespace astrai
