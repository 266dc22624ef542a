// Decode instantiations for head_dim 64 (q heads per block 1, 2, 4, 8; contiguous and paged KV).
#include "kernels/attention/decode_launch.cuh"

namespace astrai {
namespace attention {
template cudaError_t launch_decode_split_kv<64>(const DecodeParams& p, cudaStream_t stream);
}  // namespace attention
}  // namespace astrai
