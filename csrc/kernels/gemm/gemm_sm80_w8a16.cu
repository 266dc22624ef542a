// Instantiation unit: w8a16 (bf16 / fp16 activations x int8 weights), layout nt: recipes 0, 1 and 3 on the portable
// mainloop, recipe 2 on the weight-stream kernel (sm80_stream.cuh).
#include "kernels/gemm/sm80_gemm_launch.cuh"
#include "kernels/gemm/sm80_groups.h"
#include "kernels/gemm/sm80_stream.cuh"

namespace astrai {
namespace gemm {

cudaError_t sm80_launch_w8a16(const GemmParams& p, GemmPair pair, int recipe, cudaStream_t stream) {
  switch (pair) {
    case GemmPair::kBf16S8:
      return recipe == 2 ? launch_stream<PairBf16S8>(p, stream) : launch_pair<PairBf16S8>(p, recipe, stream);
    case GemmPair::kF16S8:
      return recipe == 2 ? launch_stream<PairF16S8>(p, stream) : launch_pair<PairF16S8>(p, recipe, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace gemm
}  // namespace astrai
