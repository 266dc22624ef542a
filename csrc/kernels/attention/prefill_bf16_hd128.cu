// Prefill instantiations for head_dim 128 (dense / ragged Q, contiguous / paged KV).
#include "kernels/attention/prefill_launch.cuh"

namespace astrai {
namespace attention {
template cudaError_t launch_prefill<128>(const PrefillParams& p, cudaStream_t stream);
}  // namespace attention
}  // namespace astrai
