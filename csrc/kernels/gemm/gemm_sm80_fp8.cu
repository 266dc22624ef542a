// Instantiation unit: fp8 (e4m3 / e5m2 pairs) on the portable mainloop; the mma exists from sm_89 on.
#include "kernels/gemm/sm80_gemm_launch.cuh"
#include "kernels/gemm/sm80_groups.h"

namespace astrai {
namespace gemm {

cudaError_t sm80_launch_fp8(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream) {
  switch (pair) {
    case GemmPair::kE4m3E4m3: return launch_pair<PairE4m3E4m3>(p, recipe, stream);
    case GemmPair::kE5m2E4m3: return launch_pair<PairE5m2E4m3>(p, recipe, stream);
    case GemmPair::kE4m3E5m2: return launch_pair<PairE4m3E5m2>(p, recipe, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t sm80_fp8_code_arch(int* ptx_version) { return code_arch<PairE4m3E4m3>(ptx_version); }

}  // namespace gemm
}  // namespace astrai
