// Instantiation unit: the Hopper mainloop (sm90_gemm.cuh) for bf16 x bf16 and fp16 x fp16, recipes 4 and 5.
#include "kernels/gemm/sm80_groups.h"
#include "kernels/gemm/sm90_gemm_launch.cuh"

namespace astrai {
namespace gemm {

cudaError_t sm90_launch_16bit(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream) {
  return pair == GemmPair::kF16F16 ? sm90_launch_pair<GemmPair::kF16F16>(p, recipe, stream)
                                   : sm90_launch_pair<GemmPair::kBf16Bf16>(p, recipe, stream);
}

cudaError_t sm90_code_available(bool* available) {
  int ptx = 0;
  ASTRAI_CUDA_TRY(sm90_code_arch(&ptx));
  *available = ptx >= 90;
  return cudaSuccess;
}

}  // namespace gemm
}  // namespace astrai
