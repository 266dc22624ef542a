// Instantiation unit: fp8 (e4m3 / e5m2) in layout tn (a [k][m], b [k][n]) on the portable mainloop (sm_89+ mma).
#include "kernels/gemm/sm80_gemm_launch.cuh"
#include "kernels/gemm/sm80_groups.h"

namespace astrai {
namespace gemm {

cudaError_t sm80_launch_fp8_tn(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream) {
  switch (pair) {
    case GemmPair::kE4m3E4m3: return launch_pair<PairE4m3E4m3, true, true>(p, recipe, stream);
    case GemmPair::kE5m2E4m3: return launch_pair<PairE5m2E4m3, true, true>(p, recipe, stream);
    case GemmPair::kE4m3E5m2: return launch_pair<PairE4m3E5m2, true, true>(p, recipe, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace gemm
}  // namespace astrai
