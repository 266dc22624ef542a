// Instantiation unit: the Hopper mainloop (sm90_gemm.cuh) for the fp8 pairs (e4m3 / e5m2), recipes 4 and 10.
#include "kernels/gemm/sm80_groups.h"
#include "kernels/gemm/sm90_gemm_launch.cuh"

namespace astrai {
namespace gemm {

cudaError_t sm90_launch_fp8(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream) {
  switch (pair) {
    case GemmPair::kE5m2E4m3: return sm90_launch_pair<GemmPair::kE5m2E4m3>(p, recipe, stream);
    case GemmPair::kE4m3E5m2: return sm90_launch_pair<GemmPair::kE4m3E5m2>(p, recipe, stream);
    default: return sm90_launch_pair<GemmPair::kE4m3E4m3>(p, recipe, stream);
  }
}

}  // namespace gemm
}  // namespace astrai
