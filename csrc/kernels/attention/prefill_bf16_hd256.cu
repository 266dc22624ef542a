// Prefill instantiations for head_dim 256 (dense / ragged Q, contiguous / paged KV).
#include "kernels/attention/prefill_launch.cuh"

namespace astrai {
namespace attention {
template cudaError_t launch_prefill<256>(const PrefillParams& p, cudaStream_t stream);
}  // namespace attention
}  // namespace astrai
