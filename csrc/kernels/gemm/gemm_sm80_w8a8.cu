// Instantiation unit: w8a8 (int8 x int8, s32 accumulators) on the portable mainloop.
#include "kernels/gemm/sm80_gemm_launch.cuh"
#include "kernels/gemm/sm80_groups.h"

namespace astrai {
namespace gemm {

cudaError_t sm80_launch_w8a8(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream) {
  return pair == GemmPair::kS8S8 ? launch_pair<PairS8S8>(p, recipe, stream) : cudaErrorInvalidValue;
}

}  // namespace gemm
}  // namespace astrai
