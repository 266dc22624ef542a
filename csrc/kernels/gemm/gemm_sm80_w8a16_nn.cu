// Instantiation unit: w8a16 (bf16 / fp16 x int8) in layout nn (a [m][k], b [k][n]) on the portable mainloop.
#include "kernels/gemm/sm80_gemm_launch.cuh"
#include "kernels/gemm/sm80_groups.h"

namespace astrai {
namespace gemm {

cudaError_t sm80_launch_w8a16_nn(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream) {
  switch (pair) {
    case GemmPair::kBf16S8: return launch_pair<PairBf16S8, false, true>(p, recipe, stream);
    case GemmPair::kF16S8: return launch_pair<PairF16S8, false, true>(p, recipe, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace gemm
}  // namespace astrai
