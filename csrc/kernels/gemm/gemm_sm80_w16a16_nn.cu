// Instantiation unit: w16a16 (bf16 x bf16, fp16 x fp16) in layout nn (a [m][k], b [k][n]) on the portable mainloop.
#include "kernels/gemm/sm80_gemm_launch.cuh"
#include "kernels/gemm/sm80_groups.h"

namespace astrai {
namespace gemm {

cudaError_t sm80_launch_w16a16_nn(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream) {
  switch (pair) {
    case GemmPair::kBf16Bf16: return launch_pair<PairBf16Bf16, false, true>(p, recipe, stream);
    case GemmPair::kF16F16: return launch_pair<PairF16F16, false, true>(p, recipe, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace gemm
}  // namespace astrai
