// Instantiation unit: the Hopper mainloop (sm90_gemm.cuh) for bf16 x bf16 and fp16 x fp16, recipes 4 and 5.
#include "kernels/common/host/pdl_launch.h"
#include "kernels/gemm/sm80_groups.h"
#include "kernels/gemm/sm90_gemm_launch.cuh"

namespace astrai {
namespace gemm {

cudaError_t sm90_launch_16bit(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream) {
  return pair == GemmPair::kF16F16 ? sm90_launch_pair<GemmPair::kF16F16>(p, recipe, stream)
                                   : sm90_launch_pair<GemmPair::kBf16Bf16>(p, recipe, stream);
}

cudaError_t sm90_code_available(bool* available) {
  // sm_90a code is the code whose ptxVersion is >= 90: the same per-device cached query as the PDL decision (a
  // compute_80 PTX image compiles the kernel to an empty stub), asked once per device, not at every launch.
  static PdlCodeCache known;
  return code_waits_for_grid(&gemm_sm90_kernel<GemmPair::kBf16Bf16, Sm90RecipeN128, false>, known, available);
}

}  // namespace gemm
}  // namespace astrai
