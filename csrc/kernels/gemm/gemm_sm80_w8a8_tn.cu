// Instantiation unit: w8a8 (int8 x int8, s32 accumulators) in layout tn (a [k][m], b [k][n]) on the portable mainloop.
#include "kernels/gemm/sm80_gemm_launch.cuh"
#include "kernels/gemm/sm80_groups.h"

namespace astrai {
namespace gemm {

cudaError_t sm80_launch_w8a8_tn(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream) {
  switch (pair) {
    case GemmPair::kS8S8: return launch_pair<PairS8S8, true, true>(p, recipe, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace gemm
}  // namespace astrai
